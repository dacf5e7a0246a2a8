"""The estimators' needs table (rlkit/core/algos/needs.py) agrees with their code, and nothing outside
rlkit/core/algos/ tests an estimator's, a loss's or an algorithm's name: the rest of rlkit asks the Algorithm
(rlkit/core/algos/algorithm.py) or the table."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from rlkit.core.algos.advantages import ADV_ESTIMATORS
from rlkit.core.algos.losses import POLICY_LOSSES
from rlkit.core.algos.needs import ESTIMATOR_NEEDS, estimator_needs, estimators_that

RLKIT = Path(__file__).resolve().parents[1] / "rlkit"


def test_the_table_names_every_registered_estimator():
    assert sorted(ESTIMATOR_NEEDS) == ADV_ESTIMATORS.names()


def test_options_are_the_keyword_only_parameters_each_estimator_reads():
    for name, needs in ESTIMATOR_NEEDS.items():
        parameters = inspect.signature(ADV_ESTIMATORS.get(name)).parameters.values()
        read = {p.name for p in parameters if p.kind is inspect.Parameter.KEYWORD_ONLY} - {"eps"}  # eps: no key
        assert set(needs.options) == read, name


def test_what_the_steps_ask():
    assert estimators_that("critic") == ["gae"]
    assert estimators_that("greedy_baseline") == ["remax"]
    assert estimators_that("gamma") == ["gae", "reinforce_plus_plus"]
    assert estimator_needs("grpo").groups and not estimator_needs("gae").groups
    assert estimator_needs("no-such-estimator") == estimator_needs("reinforce_plus_plus").__class__()


# What rlkit/core/algos/ names: estimators, policy losses, and the algorithms whose parts are switches
# (dapo: the group filter; ppo: the critic). Outside algos/ code asks the Algorithm, never the name.
ALGORITHM_NAMES = sorted({*ESTIMATOR_NEEDS, *POLICY_LOSSES.names(), "dapo", "ppo"})


def name_comparisons(text: str) -> list[tuple[int, str]]:
    """Lines of `text` that compare with an algorithm's name: `== "remax"`, `"gae" !=`, `in ("gae", ...)`,
    or `adv_estimator ==` / `policy_loss in`."""
    names = "|".join(map(re.escape, ALGORITHM_NAMES))
    quoted = rf"[\"']({names})[\"']"
    pattern = re.compile(
        rf"(==|!=)\s*{quoted}|{quoted}\s*(==|!=)|\bin\s*[(\[{{][^)\]}}]*{quoted}"
        rf"|(adv_estimator|policy_loss)\s*(==|!=|in\b|not in\b)"
    )
    return [(number, line.strip()) for number, line in enumerate(text.splitlines(), 1) if pattern.search(line)]


def test_the_scan_sees_each_way_of_testing_a_name():
    code = """
        if name == "remax": pass
        if "gae" != name: pass
        if name in ("grpo", "rloo"): pass
        if loss not in {"cispo"}: pass
        if config.actor.policy_loss == other: pass
        if algorithm.adv_estimator in names: pass
        if algorithm.greedy_baseline: pass
        recipe = "dapo"
        if recipe == "dapo-demo": pass
    """
    assert [number for number, _ in name_comparisons(code)] == [2, 3, 4, 5, 6, 7]


def test_no_algorithm_name_is_tested_outside_algos():
    found = [f"{path.relative_to(RLKIT)}:{number}: {line}"
             for path in RLKIT.rglob("*.py") if "algos" not in path.relative_to(RLKIT).parts[:2]
             for number, line in name_comparisons(path.read_text())]
    assert not found, "ask rlkit.core.algos.algorithm.Algorithm instead:\n" + "\n".join(found)


def test_the_schema_reads_the_table_without_loading_torch():
    import subprocess
    import sys

    code = "import sys, rlkit.recipes.loader; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
