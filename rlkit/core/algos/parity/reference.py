"""rlkit's registered functions against verl's (`verl.trainer.ppo.core_algos`, read at commit 1dda039b) on
seeded random batches: each advantage estimator, policy loss, KL estimator and aggregation mode by verl's
registry names (`get_adv_estimator_fn`, `get_policy_loss_fn`, `kl_penalty`, `agg_loss`).

verl's policy losses return the aggregated scalar, so a loss is compared as rlkit's per-token loss aggregated
by rlkit's aggregate_loss, value and gradient with respect to log_probs. Batches are float64: what is left is
the formulas' difference, not float32 rounding (verl computes group statistics in the input dtype, rlkit in
float64). The options that differ in name are mapped (rlkit's is_clip_low is verl's clip_ratio_low, ...);
what differs by design (docs/algorithms.md) is reported as such, not as a failure.
"""

from __future__ import annotations

import dataclasses
import importlib
from types import ModuleType
from typing import Any, Callable

import torch
from torch import Tensor

from rlkit.core.algos.advantages import AdvantageInputs, compute_advantages
from rlkit.core.algos.kl import kl_estimate
from rlkit.core.algos.losses import aggregate_loss, policy_loss
from rlkit.core.algos.parity.cases import ADVANTAGE, AGGREGATION, KL, POLICY_LOSS
from rlkit.core.algos.parity.check import Result, registered

VERL_MODULE = "verl.trainer.ppo.core_algos"
REFERENCE_TOLERANCE = 1e-6  # float64: verl's 1e-8 epsilons (masked means, OTB's denominator) stay far below it
SEED = 0
B, R, GROUP = 8, 6, 4  # two groups of four samples, responses of 1..6 tokens

# rlkit name -> verl's registry name, where they differ.
VERL_NAMES = {(POLICY_LOSS, "gmpo"): "geo_mean"}
TOKEN_MEAN, SEQ_MEAN = "token-mean", "seq-mean-token-mean"


@dataclasses.dataclass(frozen=True)
class LossSetting:
    """One loss's options in rlkit's names (`ours`) and verl's (ActorConfig fields, PolicyLossConfig fields), and
    the aggregation mode it is compared under: seq-mean-token-mean where verl forces it (gspo, sapo) or ignores
    it (geo_mean: a mean over sequences), else verl's default token-mean."""

    ours: dict[str, Any]
    actor: dict[str, Any]
    section: dict[str, Any] = dataclasses.field(default_factory=dict)
    mode: str = TOKEN_MEAN


_CLIP = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.28}
_GMPO = LossSetting(
    {"log_clip_low": 0.2, "log_clip_high": 0.2}, {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2}, mode=SEQ_MEAN
)
_COV_BOUNDS = {"clip_cov_ratio": 1.0, "clip_cov_lb": 0.0, "clip_cov_ub": 1e9}
LOSS_SETTINGS = {
    # A dual-clip cap of 1.25, not 3, so that the random ratios (about e^+-0.3) reach it.
    "vanilla": LossSetting({**_CLIP, "clip_ratio_c": 1.25}, {**_CLIP, "clip_ratio_c": 1.25}),
    "gspo": LossSetting({**_CLIP, "clip_ratio_c": None}, _CLIP, mode=SEQ_MEAN),
    "cispo": LossSetting({"is_clip_low": 0.2, "is_clip_high": 0.28}, _CLIP),
    # Every token of positive covariance that the clip leaves alone is restrained (ratio 1): no random draw.
    "clip_cov": LossSetting({**_CLIP, "clip_ratio_c": None, **_COV_BOUNDS}, _CLIP, _COV_BOUNDS),
    "kl_cov": LossSetting({"kl_cov_ratio": 0.25, "ppo_kl_coef": 1.0}, {}, {"kl_cov_ratio": 0.25, "ppo_kl_coef": 1.0}),
    # A ratio cap of 1.5 so that the random ratios reach it; verl reads it from clip_ratio_c.
    "dppo_tv": LossSetting(
        {"clip_divergence_low": 0.15, "clip_divergence_high": 0.15, "ratio_cap": 1.5},
        {"clip_ratio_low": 0.15, "clip_ratio_high": 0.15, "clip_ratio_c": 1.5},
    ),
    "dppo_kl": LossSetting(
        {"clip_divergence_low": 0.05, "clip_divergence_high": 0.05, "ratio_cap": 1.5},
        {"clip_ratio_low": 0.05, "clip_ratio_high": 0.05, "clip_ratio_c": 1.5},
    ),
    "gmpo": _GMPO,
    "geo_mean": _GMPO,
    "gpg": LossSetting({}, {}),
    "sapo": LossSetting({"tau_pos": 1.0, "tau_neg": 1.05}, {"tau_pos": 1.0, "tau_neg": 1.05}, mode=SEQ_MEAN),
}
# Outputs left out of the verdict, and why (docs/algorithms.md, "Policy losses", notes).
BY_DESIGN = {
    (POLICY_LOSS, "clip_cov"): (
        "loss",
        "the value is left out (rlkit detaches the restrained tokens, keeping their loss; verl multiplies it by 0), "
        "the gradient compared",
    ),
}
# verl's argument names for each estimator, as its compute_advantage passes them.
ADV_ARGUMENTS = {
    "gae": ("token_level_rewards", "values", "response_mask", "gamma", "lam"),
    "grpo": ("token_level_rewards", "response_mask", "index", "epsilon", "norm_adv_by_std_in_grpo"),
    "rloo": ("token_level_rewards", "response_mask", "index", "config"),
    "remax": ("token_level_rewards", "reward_baselines", "response_mask", "config"),
    "reinforce_plus_plus": ("token_level_rewards", "response_mask", "config"),
    "reinforce_plus_plus_baseline": ("token_level_rewards", "response_mask", "index", "config"),
    "grpo_passk": ("token_level_rewards", "response_mask", "index", "epsilon", "config"),
    "opo": ("token_level_rewards", "response_mask", "index", "config"),
    "optimal_token_baseline": ("token_level_rewards", "response_mask", "index", "old_log_probs", "sum_pi_squared"),
    "tir_optimal_token_baseline": (
        "token_level_rewards",
        "response_mask",
        "index",
        "old_log_probs",
        "sum_pi_squared",
    ),
    # verl reads the components from non_tensor_batch by config.gdpo_reward_keys, on each response's last token
    # (batch's attention_mask past the prompts).
    "gdpo": ("token_level_rewards", "response_mask", "index", "epsilon", "config", "non_tensor_batch", "batch"),
}
GDPO_KEYS, GDPO_WEIGHTS = ["accuracy", "format"], [1.0, 0.5]
GAMMA, LAM, EPSILON = 0.9, 0.95, 1e-6


class _AlgoSettings(dict):
    """verl's estimators read their settings as `config.gamma` or `config.get("norm_adv_by_std_in_grpo")`."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError:
            raise AttributeError(key) from None


def load_verl() -> ModuleType | None:
    """verl's core_algos, or None where verl is not installed."""
    try:
        return importlib.import_module(VERL_MODULE)
    except ImportError:
        return None


def random_batch(seed: int = SEED) -> dict[str, Tensor]:
    """Seeded float64 tensors every item reads: right-padded responses (padding 0), a score on each last token."""
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(1, R + 1, (B,), generator=gen)
    mask = (torch.arange(R) < lengths.unsqueeze(-1)).double()
    scores = torch.randn(B, generator=gen, dtype=torch.float64)
    rewards = torch.zeros(B, R, dtype=torch.float64)
    rewards[torch.arange(B), lengths - 1] = scores
    probs = torch.rand(B, R, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    old_probs = (probs * torch.exp(0.3 * torch.randn(B, R, generator=gen, dtype=torch.float64))).clamp(max=0.99)
    # A distribution with the sampled token at probability p has sum_v pi_v^2 in [p^2 + (1-p)^2 / (V-1), p^2 + (1-p)^2].
    spread = torch.rand(B, R, generator=gen, dtype=torch.float64)
    return {
        "mask": mask,
        "group_ids": torch.arange(B) // GROUP,
        "rewards": rewards * mask,
        "values": torch.randn(B, R, generator=gen, dtype=torch.float64) * mask,
        "baselines": torch.randn(B, generator=gen, dtype=torch.float64),
        "log_probs": probs.log(),
        "old_log_probs": old_probs.log(),
        "sum_pi_squared": old_probs**2 + (1 - old_probs) ** 2 * spread,
        "advantages": torch.randn(B, generator=gen, dtype=torch.float64).unsqueeze(-1) * mask,
        "ref_log_probs": probs.log() + 0.5 * torch.randn(B, R, generator=gen, dtype=torch.float64),
        "per_token_loss": torch.randn(B, R, generator=gen, dtype=torch.float64),
        "reward_components": torch.randint(0, 3, (B, len(GDPO_KEYS)), generator=gen).double() / 2,
    }


def _masked_max(a: Tensor, b: Tensor, mask: Tensor) -> float:
    return float(torch.where(mask.bool(), (a - b).abs(), 0.0).max())


def _advantages(verl: ModuleType, name: str, x: dict[str, Tensor]) -> dict[str, float]:
    fn = verl.get_adv_estimator_fn(name)
    inputs = AdvantageInputs(
        x["rewards"],
        x["mask"],
        x["group_ids"],
        x["values"],
        x["baselines"],
        old_log_probs=x["old_log_probs"],
        sum_pi_squared=x["sum_pi_squared"],
        reward_components=x["reward_components"],
    )
    ours = compute_advantages(name, inputs, gamma=GAMMA, lam=LAM, eps=EPSILON, gdpo_reward_weights=GDPO_WEIGHTS)
    settings = {"gamma": GAMMA, "lam": LAM, "norm_adv_by_std_in_grpo": True}
    gdpo = {"gdpo_reward_keys": GDPO_KEYS, "gdpo_reward_weights": GDPO_WEIGHTS}
    available = {
        "token_level_rewards": x["rewards"],
        "values": x["values"],
        "response_mask": x["mask"],
        "gamma": GAMMA,
        "lam": LAM,
        "index": x["group_ids"].numpy(),
        "epsilon": EPSILON,
        "norm_adv_by_std_in_grpo": True,
        "config": _AlgoSettings(**settings, **gdpo),
        "non_tensor_batch": {key: x["reward_components"][:, k].numpy() for k, key in enumerate(GDPO_KEYS)},
        "batch": {  # verl's integer token tensors
            "prompts": torch.zeros(B, 1, dtype=torch.long),
            "attention_mask": torch.cat([torch.ones(B, 1), x["mask"]], -1).long(),
        },
        "reward_baselines": x["baselines"],
        "old_log_probs": x["old_log_probs"],
        "sum_pi_squared": x["sum_pi_squared"],
    }
    theirs = fn(**{key: available[key] for key in ADV_ARGUMENTS[name]})
    # verl leaves padding as it falls (gae's returns carry V there): compare on valid tokens only.
    return {out: _masked_max(a, b, x["mask"]) for out, a, b in zip(("advantages", "returns"), ours, theirs)}


def _actor_config(verl: ModuleType, fields: dict, loss_fields: dict) -> Any:
    """verl's ActorConfig with the fields a loss reads; its policy_loss section built from its own default class."""
    defaults = {f.name: f for f in dataclasses.fields(verl.ActorConfig)}
    section = defaults["policy_loss"].default_factory(**loss_fields)
    required = {"strategy": "fsdp", "rollout_n": 1, "ppo_micro_batch_size_per_gpu": 1, "clip_ratio": 0.2}
    return verl.ActorConfig(
        **{key: value for key, value in required.items() if key in defaults},
        **fields,
        policy_loss=section,
        global_batch_info={},
    )


def _gradient(loss: Tensor, log_probs: Tensor) -> Tensor:
    (grad,) = torch.autograd.grad(loss, log_probs)
    return grad


def _policy_loss(verl: ModuleType, name: str, x: dict[str, Tensor]) -> dict[str, float]:
    fn = verl.get_policy_loss_fn(VERL_NAMES.get((POLICY_LOSS, name), name))
    setting = LOSS_SETTINGS[name]
    log_probs = x["log_probs"].clone().requires_grad_(True)
    per_token, _ = policy_loss(name, log_probs, x["old_log_probs"], x["advantages"], x["mask"], **setting.ours)
    ours = aggregate_loss(per_token, x["mask"], setting.mode)
    their_log_probs = x["log_probs"].clone().requires_grad_(True)
    config = _actor_config(verl, setting.actor, setting.section)
    theirs, _ = fn(x["old_log_probs"], their_log_probs, x["advantages"], x["mask"], setting.mode, config)
    return {
        "loss": float((ours - theirs).detach().abs()),
        "grad": _masked_max(_gradient(ours, log_probs), _gradient(theirs, their_log_probs), x["mask"]),
    }


def _kl(verl: ModuleType, name: str, x: dict[str, Tensor]) -> dict[str, float]:
    ours_in, theirs_in = (x["log_probs"].clone().requires_grad_(True) for _ in range(2))
    ours = kl_estimate(ours_in, x["ref_log_probs"], name)
    theirs = verl.kl_penalty(theirs_in, x["ref_log_probs"], name)
    grads = (_gradient(ours.sum(), ours_in), _gradient(theirs.sum(), theirs_in))
    return {"value": float((ours - theirs).detach().abs().max()), "grad": float((grads[0] - grads[1]).abs().max())}


def _aggregation(verl: ModuleType, mode: str, x: dict[str, Tensor]) -> dict[str, float]:
    ours = aggregate_loss(x["per_token_loss"], x["mask"], mode)
    return {"value": float((ours - verl.agg_loss(x["per_token_loss"], x["mask"], mode)).abs())}


_COMPARE: dict[str, Callable[[ModuleType, str, dict[str, Tensor]], dict[str, float]]] = {
    ADVANTAGE: _advantages,
    POLICY_LOSS: _policy_loss,
    KL: _kl,
    AGGREGATION: _aggregation,
}
_MAPPED = {ADVANTAGE: ADV_ARGUMENTS, POLICY_LOSS: LOSS_SETTINGS}


def _lookup_error(verl: ModuleType, kind: str, name: str) -> bool:
    """Whether verl has no counterpart: its registries raise ValueError for an unknown name; kl_penalty
    raises NotImplementedError and agg_loss ValueError when called with one (tried on a 1x1 batch)."""
    verl_name = VERL_NAMES.get((kind, name), name)
    one = torch.zeros(1, 1, dtype=torch.float64)
    probes = {
        ADVANTAGE: lambda: verl.get_adv_estimator_fn(verl_name),
        POLICY_LOSS: lambda: verl.get_policy_loss_fn(verl_name),
        KL: lambda: verl.kl_penalty(one, one, verl_name),
        AGGREGATION: lambda: verl.agg_loss(one, torch.ones_like(one), verl_name),
    }
    try:
        probes[kind]()
    except (ValueError, NotImplementedError, KeyError):
        return True
    return False


def compare_item(verl: ModuleType, kind: str, name: str, batch: dict[str, Tensor]) -> Result:
    """One item against verl: ok or differs by its largest difference, lacks where verl has no counterpart."""
    verl_name = VERL_NAMES.get((kind, name), name)
    alias = f" (verl: {verl_name})" if verl_name != name else ""
    if kind in _MAPPED and name not in _MAPPED[kind]:
        return Result(kind, name, "lacks", note="no argument mapping to verl in rlkit/core/algos/parity/reference.py")
    if _lookup_error(verl, kind, name):
        return Result(kind, name, "lacks", note=f"verl has no {kind} {verl_name!r}")
    try:
        differences = _COMPARE[kind](verl, name, batch)
    except Exception as exc:  # a reference that cannot run on the batch is reported, not a crash of the command
        return Result(kind, name, "differs", None, REFERENCE_TOLERANCE, f"{type(exc).__name__}: {exc}{alias}")
    skipped, why = BY_DESIGN.get((kind, name), (None, ""))
    compared = {out: diff for out, diff in differences.items() if out != skipped}
    largest = max(compared.values())
    status = "ok" if largest <= REFERENCE_TOLERANCE else "differs"
    note = f"by design: {why}; value difference {differences[skipped]:.2e}" if skipped else ""
    return Result(kind, name, status, largest, REFERENCE_TOLERANCE, f"{note}{alias}".strip())


def compare(verl: ModuleType, only: list[str] | None = None, seed: int = SEED) -> list[Result]:
    """Every registered item (those named in `only`, when given) against verl on one seeded random batch."""
    batch = random_batch(seed)
    return [
        compare_item(verl, kind, name, batch)
        for kind, names in registered().items()
        for name in names
        if not only or name in only
    ]
