"""`rlkit algos check` in-process: the hand-computed cases pass, a registered name without a case fails by
name, a wrong formula fails, and the comparison with a reference runs through a stand-in for verl's
core_algos built here (functions with verl's signatures), so the path is pinned without verl installed."""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import types

import pytest
import torch
from conftest import invoke

from rlkit.cli import algos_cmds
from rlkit.core.algos.parity.check import CASES, check_cases, registered
from rlkit.core.algos.parity.loss_cases import GPG
from rlkit.core.algos.parity.reference import VERL_MODULE
from rlkit.core.registrations import POLICY_LOSSES


def check(*args: str):
    return invoke(algos_cmds.register, "algos", "check", *args)


def report(*args: str) -> tuple[int, dict]:
    result = check(*args, "--json")
    return result.exit_code, json.loads(result.stdout)


@pytest.fixture
def no_verl(monkeypatch: pytest.MonkeyPatch) -> None:
    """verl not importable, whether or not this machine has it (None in sys.modules fails the import)."""
    monkeypatch.setitem(sys.modules, VERL_MODULE, None)


def test_every_hand_computed_case_passes_and_auto_says_no_reference_is_installed(no_verl) -> None:
    code, out = report()
    assert code == 0, [r for r in out["cases"] if r["status"] != "ok"]
    assert out["ok"] and out["reference"].startswith("no reference installed") and out["compared"] == []
    checked = {(r["kind"], r["name"]) for r in out["cases"]}
    assert checked == {(kind, name) for kind, names in registered().items() for name in names}
    assert all(r["status"] == "ok" and r["difference"] <= r["tolerance"] for r in out["cases"])


def test_the_table_names_each_item_and_the_verdict(no_verl) -> None:
    result = check("--only", "grpo", "--only", "k3+")
    assert result.exit_code == 0
    assert "grpo" in result.stdout and "k3+" in result.stdout and "vanilla" not in result.stdout
    assert "all passed: 2 cases" in result.stdout


def test_a_registered_name_without_a_case_fails_by_name(no_verl, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(POLICY_LOSSES._items, "my_loss", "rlkit.core.algos.gpg:gpg")
    code, out = report("--reference", "none")
    assert code == 1 and not out["ok"]
    failed = [r for r in out["cases"] if r["status"] != "ok"]
    assert [(r["kind"], r["name"], r["status"]) for r in failed] == [("policy loss", "my_loss", "missing")]
    assert "no hand-computed case" in failed[0]["note"]


def test_a_case_whose_numbers_differ_fails() -> None:
    # gpg's loss on its first token is ln 2 = .693147: expecting .7 is a difference of .006853.
    wrong = dataclasses.replace(GPG, expected={"loss": [[0.7, 2 * math.log(0.25), 0.0]]})
    (result,) = check_cases(["gpg"], cases=(*[c for c in CASES if c.name != "gpg"], wrong))
    assert result.status == "differs" and result.failed
    assert result.difference == pytest.approx(0.7 - 0.693147, abs=1e-6)


def test_user_mistakes_exit_2_without_a_traceback(no_verl) -> None:
    unknown = check("--only", "grpoo")
    assert unknown.exit_code == 2 and "not a registered name" in unknown.stderr
    assert check("--reference", "verl").exit_code == 2
    trl = check("--reference", "trl")
    assert trl.exit_code == 2 and "GRPOTrainer" in trl.stderr
    assert check("--reference", "bogus").exit_code == 2
    assert "Traceback" not in unknown.output + trl.output


# ---------------------------------------------------------------- a stand-in for verl's core_algos


@dataclasses.dataclass
class StandInPolicyLossConfig:
    clip_cov_ratio: float = 2e-4


@dataclasses.dataclass
class StandInActorConfig:
    """The fields verl's losses read, with verl's defaults; `get` as verl's BaseConfig has."""

    clip_ratio: float = 0.2
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float = 3.0
    policy_loss: StandInPolicyLossConfig = dataclasses.field(default_factory=StandInPolicyLossConfig)
    global_batch_info: dict = dataclasses.field(default_factory=dict)

    def get(self, key: str, default: object = None) -> object:
        return getattr(self, key, default)


def stand_in_verl(clip: bool = True) -> types.ModuleType:
    """grpo, vanilla (PPO's clip with dual clip; without any clip when `clip` is False: a wrong formula), k1/k2
    and two aggregation modes, written from the formulas in docs/algorithms.md; every other name unknown."""

    def agg_loss(loss_mat, loss_mask, loss_agg_mode, **_):
        if loss_agg_mode == "token-mean":
            return (loss_mat * loss_mask).sum() / loss_mask.sum()
        if loss_agg_mode == "seq-mean-token-mean":
            return ((loss_mat * loss_mask).sum(-1) / loss_mask.sum(-1)).mean()
        raise ValueError(f"Invalid loss_agg_mode: {loss_agg_mode}")

    def grpo(token_level_rewards, response_mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=True, config=None):
        scores = token_level_rewards.sum(-1)
        advantages = torch.empty_like(scores)
        for group in set(index.tolist()):
            members = torch.from_numpy(index == group)
            advantages[members] = (scores[members] - scores[members].mean()) / (scores[members].std() + epsilon)
        advantages = advantages.unsqueeze(-1) * response_mask
        return advantages, advantages

    def vanilla(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean", config=None,
                rollout_is_weights=None):
        ratio = torch.exp(log_prob - old_log_prob)
        if not clip:
            return agg_loss(-advantages * ratio, response_mask, loss_agg_mode), {}
        bounded = ratio.clamp(1 - config.clip_ratio_low, 1 + config.clip_ratio_high)
        loss = torch.maximum(-advantages * ratio, -advantages * bounded)
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * config.clip_ratio_c), loss)
        return agg_loss(loss, response_mask, loss_agg_mode), {}

    def kl_penalty(logprob, ref_logprob, kl_penalty):
        if kl_penalty in ("k1", "kl"):
            return logprob - ref_logprob
        if kl_penalty in ("k2", "mse"):
            return 0.5 * (logprob - ref_logprob) ** 2
        raise NotImplementedError

    def registry(kind: str, entries: dict):
        def get(name):
            if name not in entries:
                raise ValueError(f"unknown {kind} {name}")
            return entries[name]

        return get

    module = types.ModuleType(VERL_MODULE)
    module.ActorConfig = StandInActorConfig
    module.agg_loss = agg_loss
    module.kl_penalty = kl_penalty
    module.get_adv_estimator_fn = registry("estimator", {"grpo": grpo})
    module.get_policy_loss_fn = registry("loss", {"vanilla": vanilla})
    return module


def with_reference(monkeypatch: pytest.MonkeyPatch, module: types.ModuleType) -> None:
    monkeypatch.setitem(sys.modules, VERL_MODULE, module)


def test_the_reference_path_compares_what_the_stand_in_has_and_marks_what_it_lacks(monkeypatch) -> None:
    with_reference(monkeypatch, stand_in_verl())
    code, out = report()
    assert code == 0 and out["ok"] and out["reference"] == "verl"
    status = {(r["kind"], r["name"]): r for r in out["compared"]}
    compared = [key for key, r in status.items() if r["status"] == "ok"]
    assert sorted(compared) == sorted(
        [("advantage estimator", "grpo"), ("policy loss", "vanilla"), ("kl estimator", "k1"), ("kl estimator", "kl"),
         ("kl estimator", "k2"), ("kl estimator", "mse"), ("loss aggregation", "token-mean"),
         ("loss aggregation", "seq-mean-token-mean")]
    )
    assert all(status[key]["difference"] <= 1e-6 for key in compared)
    lacks = status[("policy loss", "gmpo")]
    assert lacks["status"] == "lacks" and "'geo_mean'" in lacks["note"]  # looked up by verl's name
    assert {r["status"] for r in out["compared"]} == {"ok", "lacks"}


def test_a_reference_that_differs_fails_the_check_by_name(monkeypatch) -> None:
    with_reference(monkeypatch, stand_in_verl(clip=False))
    code, out = report("--reference", "verl", "--only", "vanilla")
    assert code == 1 and not out["ok"]
    ((name, status, difference),) = [(r["name"], r["status"], r["difference"]) for r in out["compared"]]
    assert (name, status) == ("vanilla", "differs") and difference > 1e-3
    assert [r["status"] for r in out["cases"]] == ["ok"]  # the hand-computed case still passes
