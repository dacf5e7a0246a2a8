"""Step-1 invariants: facts that hold at the first step of every correct run, checked before it goes on.

At step 1 of a fresh run the reference is the initial policy, so the KL between them is 0;
the engine samples with the weights the trainer holds, so their log-probs agree to float
precision (step 1 is always a log-prob check step); and a prompt's token ids decode to the text
they were encoded from (no character lost) and encode again to themselves. A violation means a
bug in the setup (weights loaded differently, a chat template that does not round-trip, a
tokenizer that cannot encode the data's characters, an engine computing something else), found
in the first minute instead of after a day of training. trainer.invariants: error stops the run
with the invariant's name, warn logs it, off skips the checks.
"""

from __future__ import annotations

import copy
import difflib
import logging
import unicodedata
from typing import Any, Sequence

from rlkit.core.algos.algorithm import Algorithm
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
    """Before step 1: every prompt of the first batch keeps its text in its token ids (they decode to the
    rendered prompt, where it is known), and decodes and re-encodes to its own token ids."""
    if config.trainer.invariants == "off":
        return
    first_batch = copy.deepcopy(sampler).next_batch()  # the sampler itself stays where it is
    for index in first_batch:
        row = rows[index]
        lost = row.prompt_text is not None and lost_text_problem(tokenizer, row.prompt_text, row.prompt_token_ids)
        if lost:
            _violated(
                config,
                PROMPT_ROUND_TRIP,
                f"the prompt of row {row.index} {lost}. The tokenizer of model.path "
                "cannot encode them (no byte fallback, no such token): use a tokenizer that can, or clean "
                "those characters out of the data's 'prompt' column",
            )
            return
        problem = round_trip_problem(tokenizer, row.prompt_token_ids)
        if problem:
            _violated(
                config,
                PROMPT_ROUND_TRIP,
                f"the prompt of row {row.index} {problem}; the engine "
                "gets these ids, but anything that decodes and re-encodes the text (a reward, a multi-turn "
                "environment, another tool) sees other tokens. Check the chat template and the data's "
                "'prompt' column",
            )
            return


def _visible(text: str) -> tuple[str, list[int]]:
    """`text` as a tokenizer may legitimately give it back: NFKC-normalised (normalizers such as
    SentencePiece's nmt_nfkc apply it) and without whitespace (decoders add or drop spaces: a prefix
    space, spaces around punctuation, between WordPiece tokens); and where each kept character is in
    the NFKC-normalised text."""
    normal = unicodedata.normalize("NFKC", text)
    at = [i for i, c in enumerate(normal) if not c.isspace()]
    return "".join(normal[i] for i in at), at


def lost_text_problem(tokenizer: Any, text: str, ids: list[int]) -> str | None:
    """None when the ids decode to `text` (the rendered prompt they were encoded from), up to what
    _visible forgives; else the characters the encoding lost, in words. The round trip cannot see
    these: a character encoded as nothing (or as an unknown token) decodes and re-encodes the same way."""
    (want, at), (got, _) = _visible(text), _visible(tokenizer.decode(ids, skip_special_tokens=False))
    if want == got:
        return None
    lost: list[str] = []
    first: tuple[int, str] | None = None  # where the first loss is in the text, what the ids have there
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, want, got, autojunk=False).get_opcodes():
        if tag in ("delete", "replace"):
            first = first or (at[i1], got[j1:j2])
            lost.extend(c for c in want[i1:i2] if c not in lost)
    if first is None:  # characters only added (an unusual decoder): the round trip judges those ids
        return None
    normal = unicodedata.normalize("NFKC", text)
    start, became = first
    return (
        f"has characters that its token ids lost: {''.join(lost[:10])!r}{' and more' if len(lost) > 10 else ''} "
        f"(the first at character {start} of its rendered text {normal[max(0, start - 20) : start + 10]!r}, where "
        f"the ids decode as {repr(became) if became else 'nothing'}), so the policy never sees them"
    )


def round_trip_problem(tokenizer: Any, ids: list[int]) -> str | None:
    """None when decode -> encode gives `ids` back, else where it differs (in words)."""
    text = tokenizer.decode(ids, skip_special_tokens=False)
    again = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if again == list(ids):
        return None
    at = next((i for i, (a, b) in enumerate(zip(ids, again)) if a != b), min(len(ids), len(again)))
    return (
        f"re-encodes to other token ids: {len(ids)} tokens became {len(again)}, first difference at token "
        f"{at}: {list(ids[at : at + 3])} -> {again[at : at + 3]} (text {text[:60]!r})"
    )


def check_step(config: RLConfig, step: int, metrics: dict[str, float]) -> None:
    """After step 1: the KL to the reference and the rollout-vs-trainer gap, each under trainer.invariant_tolerance."""
    trainer = config.trainer
    if trainer.invariants == "off" or step != 1:
        return
    tolerance = trainer.invariant_tolerance
    kl = metrics.get("actor/kl_ref")
    if Algorithm.from_config(config).reference and kl is not None and abs(kl) > tolerance:
        _violated(
            config,
            KL_TO_REFERENCE,
            f"actor/kl_ref={kl:.4g} at step 1, where the reference is the initial "
            f"policy (|KL| <= trainer.invariant_tolerance={tolerance:g} expected): actor and reference load "
            "or compute differently (model.path, dtype, a model whose forward is not deterministic)",
        )
    gap = metrics.get("rollout/log_prob_diff")
    if gap is not None and exact_sampling(config) and gap > tolerance:
        _violated(
            config,
            LOG_PROB_GAP,
            f"rollout/log_prob_diff={gap:.4g} nats per token at step 1 "
            f"(<= trainer.invariant_tolerance={tolerance:g} expected): the engine samples from another "
            "distribution than the trainer computes (weights, dtype, temperature, or an engine bug)",
        )


def exact_sampling(config: RLConfig) -> bool:
    """The engine samples from the trainer's distribution (top-p/top-k truncate it by design)."""
    return config.rollout.top_p >= 1.0 and config.rollout.top_k <= 0


def _violated(config: RLConfig, name: str, detail: str) -> None:
    message = f"step-1 invariant '{name}' broken: {detail}"
    if config.trainer.invariants == "warn":
        logger.warning("%s (trainer.invariants=warn: going on)", message)
        return
    raise InvariantViolation(f"{message}. To train anyway, set trainer.invariants=warn ({TROUBLESHOOTING})")
