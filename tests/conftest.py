"""Shared fixtures: the tiny offline model, built once per session, and env for in-process vLLM."""

from __future__ import annotations

import gc
import importlib.util
import os
import sys
import traceback
from pathlib import Path
from typing import Iterator

import pytest
from click.testing import Result
from ray_head import RayHead, use_session_token

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes a share of all RAM
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
use_session_token()  # before anything imports Ray

REPO = Path(__file__).resolve().parents[1]
STUBS = Path(__file__).resolve().parent / "stubs"
SHARED = REPO.parent / "shared"
GSM8K = SHARED / "data" / "gsm8k"


def require_gsm8k() -> Path:
    """The real GSM8K jsonl files where the development machines and CI keep them; elsewhere (a user's
    fresh clone) the test is skipped."""
    if not GSM8K.is_dir():
        pytest.skip(f"the real GSM8K files are not at {GSM8K}")
    return GSM8K


@pytest.fixture(scope="module", autouse=True)
def _heap_frozen() -> None:
    """What is alive when a test file starts (torch, transformers, Ray, rlkit and, once imported, vLLM: about a
    million objects the collector tracks) lives on: frozen (gc.freeze), a full collection no longer walks it
    (0.4 s of CPU each, 0.002-0.02 s frozen; 243 fast tests in one process spent 10.1 of their 30.6 s of CPU in
    full collections, 2.2 s frozen). Again at each file: an in-process vLLM engine freezes the heap at its start
    and unfreezes all of it, ours too, when it is collected. Frozen still, the collection here walks the rest."""
    gc.collect()  # the garbage first, so that only live objects are frozen
    gc.freeze()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    from rlkit.core.tiny import build_tiny_qwen2

    return build_tiny_qwen2(tmp_path_factory.mktemp("tiny") / "tiny-qwen2")


@pytest.fixture(scope="session")
def ray_head() -> Iterator[RayHead]:
    """The shared Ray head (tests/ray_head.py), started by the first test that needs it."""
    head = RayHead()
    try:
        yield head
    finally:
        head.stop()


def _shared_ray(node) -> bool:
    return any(mark.name == "shared_ray" for mark in node.own_markers)


@pytest.fixture(scope="module", autouse=True)
def _shared_ray_for_module(request) -> Iterator[None]:
    """A module marked `shared_ray` (pytestmark) attaches its runs to the shared head, module fixtures too."""
    if not _shared_ray(request.node):
        yield
        return
    head = request.getfixturevalue("ray_head")
    head.check_alive()
    with pytest.MonkeyPatch.context() as patch:
        for key, value in head.env.items():
            patch.setenv(key, value)
        yield


@pytest.fixture(autouse=True)
def _shared_ray_for_test(request, monkeypatch) -> Iterator[None]:
    """A test marked `shared_ray` (itself or its module) attaches to the shared head; after it, the head
    must be idle again (every actor of its runs gone), so no test inherits another's leftovers."""
    if request.node.get_closest_marker("shared_ray") is None:
        yield
        return
    head = request.getfixturevalue("ray_head")
    head.check_alive()
    for key, value in head.env.items():
        monkeypatch.setenv(key, value)
    yield
    head.wait_idle()


@pytest.fixture
def sglang_env(monkeypatch) -> Iterator[None]:
    """SGLang importable for this test, or the test skipped. Where no torchvision is installed (`make
    venv`: PyPI's are CUDA builds, which fail next to CPU torch), SGLang imports the stand-in in
    tests/stubs instead: on sys.path here and on PYTHONPATH for the processes the test starts (SGLang's
    scheduler, a CLI run), and for this test only. transformers decides once per process whether
    torchvision exists: it decides before the stand-in is there, so in this process only SGLang sees it."""
    pytest.importorskip("sglang", reason="SGLang is not installed (docs/compatibility.md)")
    if importlib.util.find_spec("torchvision") is not None:
        yield
        return
    import transformers.image_utils  # noqa: F401  (its torchvision check, made without the stand-in)

    monkeypatch.syspath_prepend(str(STUBS))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(STUBS), os.environ.get("PYTHONPATH")])))
    yield
    for name in [name for name in sys.modules if name.split(".")[0] == "torchvision"]:
        del sys.modules[name]


@pytest.fixture(autouse=True)
def _isolated_cache(tmp_path_factory, monkeypatch):
    """'rlkit:tiny-qwen2' is built into a per-session cache, never the user's ~/.cache."""
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path_factory.getbasetemp() / "rlkit-cache"))


def run_cli_in_process(*args: str, exit_code: int = 0) -> Result:
    """`rlkit ARGS` through the real Typer app (rlkit.cli.main.app: its parsing, recipe loading and exit codes)
    in this process. For commands whose workers are objects in the CLI's process anyway (trainer.workers=
    in_process, eval, replay), where a subprocess adds only its imports and engine start-up (~15-25 s).
    Asserts the exit code; returns the result: .stdout, .stderr, and .output (both, interleaved).
    The environment is put back afterwards, as a subprocess would leave it: `rlkit eval` sets the workers'
    variables (VLLM_LOGGING_LEVEL, ...) in its own process, and later tests must not inherit them."""
    from typer.testing import CliRunner

    from rlkit.cli.main import app

    saved = dict(os.environ)
    try:
        result = CliRunner().invoke(app, list(args))
    finally:
        for key in os.environ.keys() - saved.keys():
            del os.environ[key]
        os.environ.update(saved)
    crashed = result.exc_info is not None and not isinstance(result.exception, SystemExit)  # not an exit code
    crash = "".join(traceback.format_exception(*result.exc_info)) if crashed else ""
    assert result.exit_code == exit_code, (args, result.output[-4000:], crash[-4000:])
    return result


def release_vllm() -> None:
    """Free what the end of a process would after a vLLM engine ran in it (the engine, and the torch.distributed
    world vLLM set up, which would make the next in-process run refuse to start): what an in-process run does
    when it closes (rlkit.core.cluster.local_group.release_engines)."""
    from rlkit.core.cluster.local_group import release_engines

    release_engines()


def invoke(register, *args: str):
    """Run CLI args against a fresh Typer app that holds only the commands `register` adds."""
    import typer
    from typer.testing import CliRunner

    app = typer.Typer()
    register(app)
    return CliRunner().invoke(app, list(args))


# The files whose tests take longest together (minutes on 2 cores, from the times README and the commits give:
# the agent runs ~3, the asynchronous combinations ~3, warm start 2.6, resume 2, DPO 1.7, chaos 1.6, the
# asynchronous Ray run 1.4, the learning bench 1.1), started first: `make test` hands a worker a whole file
# (--dist loadfile), so no worker begins one of them near the end.
LONGEST = (
    "test_tool_learning_e2e.py",
    "test_agent_e2e.py",
    "test_async_combos_e2e.py",
    "test_warm_start_e2e.py",
    "test_resume_e2e.py",
    "test_dpo_e2e.py",
    "test_chaos_resume.py",
    "test_async_e2e.py",
    "test_learning_bench.py",
    "test_placement.py",
)


def pytest_collection_modifyitems(config, items) -> None:
    """The longest files first, then the other slow tests (in their file order), then the fast ones: with
    `make test`'s two workers, each taking a file at a time, the minutes-long files start early and the files
    of seconds-long tests even out the end."""

    def order(item) -> tuple[bool, int]:
        name = item.path.name
        return item.get_closest_marker("slow") is None, LONGEST.index(name) if name in LONGEST else len(LONGEST)

    items.sort(key=order)
