"""Python's bytecode kept between runs where the environment keeps none (PYTHONDONTWRITEBYTECODE).

Where PYTHONDONTWRITEBYTECODE is set (container images often set it) and the installed packages carry no .pyc (uv,
for one, installs without them unless asked), every Python process compiles the source of each module it imports,
every time. A run pays that in each of its processes, and rlkit's import their stack one after another: the command,
the Ray worker that holds the model, each vLLM engine process. On a lent H100 whose image is built so (2026-12-07,
py-spy over a GRPO run's start, every process), compiling source took 43 s of CPU time: ~6 s of the command's,
~13 s of the worker's and ~9 s of each of the two engine processes', most of it torch's own modules.

So the `rlkit` command, where Python writes no bytecode, keeps it in a folder of its own, `$RLKIT_CACHE/pycache`
(Python's PYTHONPYCACHEPREFIX), apart from the installed packages, whose folders stay as the image built them: its own
process from that point on, and every process it starts (Ray's workers, vLLM's engine processes, the reward
workers), through the two variables in its environment. The first run compiles into the folder; later ones read it.
Python checks each cached file against its source, as in __pycache__. A PYTHONPYCACHEPREFIX already set is left
alone, and `RLKIT_BYTECODE_CACHE=0` leaves Python as configured. Deleting the folder costs one run's compiling.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import MutableMapping

SWITCH = "RLKIT_BYTECODE_CACHE"  # "0": leave Python's bytecode setting as it is


def cache_root() -> Path:
    """$RLKIT_CACHE, ~/.cache/rlkit unless set: the compile caches, the tiny model, the bytecode."""
    return Path(os.environ.get("RLKIT_CACHE", Path.home() / ".cache" / "rlkit"))


def bytecode_folder() -> Path:
    return cache_root() / "pycache"


def keep_bytecode(environ: MutableMapping[str, str] = os.environ) -> Path | None:
    """Keep the bytecode of this process (from now on) and of the processes it starts in `bytecode_folder()`, where
    Python would write none; returns the folder, or None where Python's own setting stands (module docstring).

    This process: only where it writes no bytecode (PYTHONDONTWRITEBYTECODE or -B) and has no prefix. Its children:
    only where the environment tells them to write none; a child of a `-B` process writes its own __pycache__.
    """
    if environ.get(SWITCH) == "0" or environ.get("PYTHONPYCACHEPREFIX") or sys.pycache_prefix:
        return None
    folder = bytecode_folder()
    kept = False
    if sys.dont_write_bytecode:
        sys.pycache_prefix, sys.dont_write_bytecode = str(folder), False
        kept = True
    if environ.get("PYTHONDONTWRITEBYTECODE"):
        environ["PYTHONPYCACHEPREFIX"], environ["PYTHONDONTWRITEBYTECODE"] = str(folder), ""  # empty: off
        kept = True
    return folder if kept else None
