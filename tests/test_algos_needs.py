"""The estimators' needs table (rlkit/core/algos/needs.py) agrees with their code, and nothing outside
rlkit/core/algos/ tests an estimator's name: the rest of rlkit asks the table."""

from __future__ import annotations

import inspect
import re
from pathlib import Path

from rlkit.core.algos.advantages import ADV_ESTIMATORS
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


def test_no_estimator_name_is_tested_outside_algos():
    names = "|".join(map(re.escape, ESTIMATOR_NEEDS))
    pattern = re.compile(rf"adv_estimator\s*(==|!=|in\b|not in\b)|==\s*[\"']({names})[\"']|[\"']({names})[\"']\s*==")
    found = [f"{path.relative_to(RLKIT)}:{number}: {line.strip()}"
             for path in RLKIT.rglob("*.py") if "algos" not in path.relative_to(RLKIT).parts[:2]
             for number, line in enumerate(path.read_text().splitlines(), 1) if pattern.search(line)]
    assert not found, "ask rlkit.core.algos.needs instead:\n" + "\n".join(found)


def test_the_schema_reads_the_table_without_loading_torch():
    import subprocess
    import sys

    code = "import sys, rlkit.recipes.loader; print('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
