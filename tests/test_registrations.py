"""Registrations in one place (rlkit/core/registrations.py): every registry and its built-in names are
listed there, each as 'module:attribute', imported on the name's first lookup. Knowing a name imports
nothing; looking one up does not depend on which modules were imported before."""

from __future__ import annotations

import importlib
import re
import subprocess
import sys
from pathlib import Path

import pytest

from rlkit.core import registrations
from rlkit.core.registry import Registry

RLKIT = Path(registrations.__file__).parents[1]
REGISTRIES = {name: value for name, value in vars(registrations).items() if isinstance(value, Registry)}


def run(code: str) -> str:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()


def test_every_registry_lives_in_the_registrations_module():
    assert sorted(REGISTRIES) == ["ADV_ESTIMATORS", "ANSWER_FNS", "BUILTIN_TOOLS", "DATASET_BUILDERS", "ENGINES",
                                  "ENVIRONMENTS", "KL_ESTIMATORS", "POLICY_LOSSES", "REWARD_FNS"]
    # No other module builds a registry or adds to one as a side effect of being imported.
    for path in RLKIT.rglob("*.py"):
        if path.name in ("registrations.py", "registry.py"):
            continue
        text = path.read_text()
        assert "Registry(" not in text, path
        assert not re.search(r"^@[A-Z_]+\.register\(", text, flags=re.M), path


@pytest.mark.parametrize("registry", sorted(REGISTRIES))
def test_every_built_in_name_resolves_to_the_function_its_line_names(registry):
    table = REGISTRIES[registry]
    for name, where in dict(table._items).items():
        module, _, attribute = where.partition(":") if isinstance(where, str) else (where.__module__, "", "")
        fn = table.get(name)
        assert callable(fn) and fn is getattr(importlib.import_module(module), attribute or fn.__name__), name
        assert fn.__module__ == module, name  # defined where the line says, not re-exported


def test_the_built_in_names():
    assert registrations.KL_ESTIMATORS.names() == ["abs", "k1", "k1+", "k2", "k3", "k3+", "kl", "low_var_kl",
                                                   "low_var_kl+", "mse"]
    assert registrations.KL_ESTIMATORS.get("kl") is registrations.KL_ESTIMATORS.get("k1")  # an alias
    assert registrations.POLICY_LOSSES.names() == ["cispo", "clip_cov", "dppo_kl", "dppo_tv", "geo_mean", "gmpo",
                                                   "gpg", "gspo", "kl_cov", "sapo", "vanilla"]
    assert registrations.POLICY_LOSSES.get("geo_mean") is registrations.POLICY_LOSSES.get("gmpo")  # verl's name
    assert registrations.ENGINES.names() == ["hf", "sglang", "vllm"]
    assert registrations.BUILTIN_TOOLS.names() == ["calculator", "lookup", "python"]
    assert registrations.DATASET_BUILDERS.names() == ["arithmetic", "gsm8k", "gsm8k-pairs", "humaneval", "math",
                                                      "reasoning-gym", "synthetic", "tool-arithmetic", "verifiers"]
    assert registrations.ENVIRONMENTS.names() == []


def test_knowing_the_names_imports_nothing():
    code = ("import sys; from rlkit.core.registrations import ADV_ESTIMATORS, ENGINES, REWARD_FNS; "
            "known = 'grpo' in ADV_ESTIMATORS and 'vllm' in ENGINES and 'gsm8k' in REWARD_FNS; "
            "print(known, sorted(m for m in sys.modules if m.startswith('rlkit')), 'torch' in sys.modules)")
    assert run(code) == "True ['rlkit', 'rlkit.core', 'rlkit.core.registrations', 'rlkit.core.registry'] False"


def test_a_lookup_does_not_depend_on_what_was_imported_before():
    # In a fresh process, with none of the defining modules imported: the reward, the answer extractor, the tool.
    code = ("from rlkit.core.rewards.registry import answer_fn_for, reward_fn_for; "
            "from rlkit.core.registrations import BUILTIN_TOOLS; "
            "print(reward_fn_for('openai/gsm8k')('so #### 72', '72', {})['score'], "
            "answer_fn_for('synthetic/echo')(' 12 '), BUILTIN_TOOLS.get('lookup')(None).__name__)")
    assert run(code) == "1.0 12 lookup"


def test_an_unknown_name_fails_with_the_closest_known_one():
    with pytest.raises(KeyError, match=r"unknown policy loss 'gpso' .*did you mean 'gspo'\?"):
        registrations.POLICY_LOSSES.get("gpso")
