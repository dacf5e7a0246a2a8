"""The `rlkit` command keeps Python's bytecode where the environment keeps none (rlkit.core.bytecode)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.core import bytecode


@pytest.fixture
def python_writes_none(monkeypatch, tmp_path):
    """This process as one started with PYTHONDONTWRITEBYTECODE=1, RLKIT_CACHE in tmp_path (sys restored after)."""
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setenv("RLKIT_CACHE", str(tmp_path / "cache"))
    return {"PYTHONDONTWRITEBYTECODE": "1"}


def test_where_python_writes_no_bytecode_this_process_and_its_children_keep_it_in_rlkits_cache(python_writes_none,
                                                                                                tmp_path):
    environ = python_writes_none
    folder = bytecode.keep_bytecode(environ)
    assert folder == tmp_path / "cache" / "pycache"
    assert (sys.pycache_prefix, sys.dont_write_bytecode) == (str(folder), False)
    assert environ == {"PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(folder)}  # empty: off


@pytest.mark.parametrize("setting", [{"RLKIT_BYTECODE_CACHE": "0"}, {"PYTHONPYCACHEPREFIX": "/mine"}])
def test_the_switch_or_a_prefix_already_set_leaves_python_as_configured(python_writes_none, setting):
    environ = {**python_writes_none, **setting}
    assert bytecode.keep_bytecode(environ) is None
    assert (sys.pycache_prefix, sys.dont_write_bytecode) == (None, True)
    assert environ == {**python_writes_none, **setting}


def test_python_writing_bytecode_is_left_alone(monkeypatch):
    monkeypatch.setattr(sys, "dont_write_bytecode", False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    environ: dict[str, str] = {}
    assert bytecode.keep_bytecode(environ) is None
    assert sys.pycache_prefix is None and environ == {}


def test_a_dash_b_process_keeps_its_own_but_leaves_its_childrens_environment(python_writes_none):
    environ: dict[str, str] = {}  # `python -B`: the flag without the variable; children write their __pycache__
    assert bytecode.keep_bytecode(environ) is not None
    assert sys.dont_write_bytecode is False and environ == {}


def test_a_process_and_the_process_it_starts_write_their_bytecode_into_the_cache_not_beside_the_source(tmp_path):
    """Real processes: one started with PYTHONDONTWRITEBYTECODE=1 switches, imports a module and starts a child that
    imports another; both modules' .pyc are in the cache folder, mirroring their paths, and no __pycache__ is written
    beside them. A third process, started as the first's child would be, finds the cached file (its stamp unchanged:
    read, not written again)."""
    source = tmp_path / "src"
    source.mkdir()
    (source / "first_mod.py").write_text("X = 1\n")
    (source / "child_mod.py").write_text("Y = 2\n")
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "RLKIT_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(source), str(Path(__file__).resolve().parents[1])])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    env.pop("RLKIT_BYTECODE_CACHE", None)
    program = (
        "import subprocess, sys\n"
        "from rlkit.core.bytecode import keep_bytecode\n"
        "keep_bytecode()\n"
        "import first_mod\n"
        "subprocess.run([sys.executable, '-c', 'import child_mod'], check=True)\n"
    )
    subprocess.run([sys.executable, "-c", program], env=env, check=True, timeout=120)
    folder = tmp_path / "cache" / "pycache"
    cached = {p.name.split(".")[0]: p for p in folder.rglob("*.pyc") if p.name.startswith(("first_mod", "child_mod"))}
    assert set(cached) == {"first_mod", "child_mod"}
    assert all(str(p.parent).endswith(str(source)) for p in cached.values())  # the source's path under the folder
    assert not (source / "__pycache__").exists()
    stamp = cached["child_mod"].stat().st_mtime_ns
    child_env = {**env, "PYTHONDONTWRITEBYTECODE": "", "PYTHONPYCACHEPREFIX": str(folder)}
    subprocess.run([sys.executable, "-c", "import child_mod"], env=child_env, check=True, timeout=60)
    assert cached["child_mod"].stat().st_mtime_ns == stamp
