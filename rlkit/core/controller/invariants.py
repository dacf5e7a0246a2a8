"""Step-1 invariants: facts that hold at the first step of every correct run, checked before it goes on.

At step 1 of a fresh run the reference is the initial policy, so the KL between them is 0;
the engine samples with the weights the trainer holds, so their log-probs agree to float
precision (step 1 is always a log-prob check step); and a prompt decoded and encoded again
gives back its token ids. A violation means a bug in the setup (weights loaded differently,
a chat template that does not round-trip, an engine computing something else), found in the
first minute instead of after a day of training. trainer.invariants: error stops the run
with the invariant's name, warn logs it, off skips the checks.
"""

from __future__ import annotations

import copy
import logging
from typing import Any, Sequence

from rlkit.core.cluster.failures import TROUBLESHOOTING, RunFailure
from rlkit.core.data.dataset import PromptRow, PromptSampler
from rlkit.recipes.schema import RLConfig

logger = logging.getLogger("rlkit")
KL_TO_REFERENCE = "KL to the reference is 0 at step 1"
LOG_PROB_GAP = "rollout-vs-trainer log-prob gap at step 1"
PROMPT_ROUND_TRIP = "prompts survive a tokenizer round trip"


class InvariantViolation(RunFailure):
    """A step-1 invariant does not hold (trainer.invariants=error)."""


def check_prompts(config: RLConfig, tokenizer: Any, rows: Sequence[PromptRow], sampler: PromptSampler) -> None:
    """Before step 1: every prompt of the first batch decodes and re-encodes to its own token ids."""
    if config.trainer.invariants == "off":
        return
    first_batch = copy.deepcopy(sampler).next_batch()  # the sampler itself stays where it is
    for index in first_batch:
        problem = round_trip_problem(tokenizer, rows[index].prompt_token_ids)
        if problem:
            _violated(config, PROMPT_ROUND_TRIP, f"the prompt of row {rows[index].index} {problem}; the engine "
                      "gets these ids, but anything that decodes and re-encodes the text (a reward, a multi-turn "
                      "environment, another tool) sees other tokens. Check the chat template and the data's "
                      "'prompt' column")
            return


def round_trip_problem(tokenizer: Any, ids: list[int]) -> str | None:
    """None when decode -> encode gives `ids` back, else where it differs (in words)."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    again = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if again == list(ids):
        return None
    at = next((i for i, (a, b) in enumerate(zip(ids, again)) if a != b), min(len(ids), len(again)))
    return (f"re-encodes to other token ids: {len(ids)} tokens became {len(again)}, first difference at token "
            f"{at}: {list(ids[at:at + 3])} -> {again[at:at + 3]} (text {text[:60]!r})")


def check_step(config: RLConfig, step: int, metrics: dict[str, float]) -> None:
    """After step 1: the KL to the reference and the rollout-vs-trainer gap, each under trainer.invariant_tolerance."""
    trainer = config.trainer
    if trainer.invariants == "off" or step != 1:
        return
    tolerance = trainer.invariant_tolerance
    kl = metrics.get("actor/kl_ref")
    if config.needs_reference and kl is not None and abs(kl) > tolerance:
        _violated(config, KL_TO_REFERENCE, f"actor/kl_ref={kl:.4g} at step 1, where the reference is the initial "
                  f"policy (|KL| <= trainer.invariant_tolerance={tolerance:g} expected): actor and reference load "
                  "or compute differently (model.path, dtype, a model whose forward is not deterministic)")
    gap = metrics.get("rollout/log_prob_diff")
    if gap is not None and exact_sampling(config) and gap > tolerance:
        _violated(config, LOG_PROB_GAP, f"rollout/log_prob_diff={gap:.4g} nats per token at step 1 "
                  f"(<= trainer.invariant_tolerance={tolerance:g} expected): the engine samples from another "
                  "distribution than the trainer computes (weights, dtype, temperature, or an engine bug)")


def exact_sampling(config: RLConfig) -> bool:
    """The engine samples from the trainer's distribution (top-p/top-k truncate it by design)."""
    return config.rollout.top_p >= 1.0 and config.rollout.top_k <= 0


def _violated(config: RLConfig, name: str, detail: str) -> None:
    message = f"step-1 invariant '{name}' broken: {detail}"
    if config.trainer.invariants == "warn":
        logger.warning("%s (trainer.invariants=warn: going on)", message)
        return
    raise InvariantViolation(f"{message}. To train anyway, set trainer.invariants=warn ({TROUBLESHOOTING})")
