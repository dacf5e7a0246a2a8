"""Run the hand-computed cases against the registered functions, and find registered names without a case.

Each case's inputs become float64 tensors, so the comparison sees the formula, not float32 rounding; the
largest absolute difference over its expected outputs must be at most CASE_TOLERANCE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from rlkit.core.algos.advantages import AdvantageInputs, compute_advantages
from rlkit.core.algos.kl import kl_estimate
from rlkit.core.algos.losses import AGG_MODES, aggregate_loss, policy_loss
from rlkit.core.algos.parity.cases import ADVANTAGE, ADVANTAGE_CASES, AGGREGATION, KL, POLICY_LOSS, Case
from rlkit.core.algos.parity.loss_cases import AGGREGATION_CASES, KL_CASES, POLICY_LOSS_CASES
from rlkit.core.registrations import ADV_ESTIMATORS, KL_ESTIMATORS, POLICY_LOSSES

CASE_TOLERANCE = 1e-6  # float64 against numbers worked exactly: anything above is a wrong formula
CASES: tuple[Case, ...] = ADVANTAGE_CASES + POLICY_LOSS_CASES + KL_CASES + AGGREGATION_CASES
_MASKS = ("response_mask",)
WORKED_HERE = "worked in rlkit/core/algos/parity/"  # a case no test had the numbers of


@dataclass(frozen=True)
class Result:
    """One checked item: `difference` the largest |computed - expected| (None when it could not be computed),
    `status` ok, differs, lacks (the reference has no counterpart) or missing (a registered name without a case);
    `note` says where the numbers come from, or why (a difference by design, the exception that stopped it)."""

    kind: str
    name: str
    status: str
    difference: float | None = None
    tolerance: float | None = None
    note: str = ""

    @property
    def failed(self) -> bool:
        return self.status in ("differs", "missing")


def registered() -> dict[str, list[str]]:
    """Every name `rlkit algos check` must cover, by kind (aggregation modes are a tuple, not a registry)."""
    return {
        ADVANTAGE: ADV_ESTIMATORS.names(),
        POLICY_LOSS: POLICY_LOSSES.names(),
        KL: KL_ESTIMATORS.names(),
        AGGREGATION: list(AGG_MODES),
    }


def missing_cases(cases: tuple[Case, ...] = CASES) -> list[Result]:
    """A failed Result per registered name no case covers: a new loss or estimator needs its hand-worked batch."""
    covered = {(case.kind, case.name) for case in cases}
    where = "no hand-computed case in rlkit/core/algos/parity/ (cases.py, loss_cases.py)"
    return [
        Result(kind, name, "missing", note=where)
        for kind, names in registered().items()
        for name in names
        if (kind, name) not in covered
    ]


def _tensor(values: object) -> Tensor:
    return torch.tensor(values, dtype=torch.float64)


def _tensors(inputs: dict[str, object]) -> dict[str, Tensor]:
    """Masks and group ids as integers, every other input as float64."""
    out = {}
    for key, values in inputs.items():
        out[key] = torch.tensor(values) if key in (*_MASKS, "group_ids") else _tensor(values)
    return out


def outputs(case: Case) -> dict[str, Tensor]:
    """The registered function's outputs on the case's batch, named as in `case.expected`."""
    inputs = _tensors(case.inputs)
    if case.kind == ADVANTAGE:
        advantages, returns = compute_advantages(case.name, AdvantageInputs(**inputs), **case.options)
        return {"advantages": advantages, "returns": returns}
    if case.kind == AGGREGATION:
        return {"value": aggregate_loss(inputs["per_token_loss"], inputs["response_mask"], case.name, **case.options)}
    log_probs = inputs.pop("log_probs").requires_grad_(True)
    if case.kind == POLICY_LOSS:
        value, _ = policy_loss(case.name, log_probs, **inputs, **case.options)
        key = "loss"
    else:
        value, key = kl_estimate(log_probs, inputs["ref_log_probs"], case.name), "value"
    (grad,) = torch.autograd.grad(value.sum(), log_probs)
    return {key: value.detach(), "grad": grad}


def run_case(case: Case) -> Result:
    """The case's largest difference from its hand-worked numbers; an exception is a failed check, with its text."""
    try:
        got = outputs(case)
        difference = max(float((got[key] - _tensor(want)).abs().max()) for key, want in case.expected.items())
    except Exception as exc:  # a case that cannot run is a failed check, reported, not a crash of the command
        return Result(case.kind, case.name, "differs", None, CASE_TOLERANCE, f"{type(exc).__name__}: {exc}")
    status = "ok" if difference <= CASE_TOLERANCE else "differs"
    return Result(case.kind, case.name, status, difference, CASE_TOLERANCE, case.source or WORKED_HERE)


def check_cases(only: list[str] | None = None, cases: tuple[Case, ...] = CASES) -> list[Result]:
    """The cases (those of the names in `only`, when given), then a failed Result per registered name without one."""
    chosen = [case for case in cases if not only or case.name in only]
    missing = [r for r in missing_cases(cases) if not only or r.name in only]
    return [run_case(case) for case in chosen] + missing
