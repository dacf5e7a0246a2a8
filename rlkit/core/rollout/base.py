"""One rollout interface, two engines: token ids in, token ids and log-probs out."""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterable, Sequence

import torch


@dataclass
class Sampling:
    n: int = 1
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    seed: int = 0  # makes a call reproducible: sample j of prompt i uses seed + i * n + j (request_seed)
    greedy: bool = False
    ignore_eos: bool = False  # always generate max_tokens (benchmarks: fixed shapes)
    log_probs: bool = True  # return each sampled token's log-prob (vLLM: a real cost at large batches)
    # With log_probs, only the requests whose seed is a multiple of this return them: a check step's share of the
    # samples (`check_stride`, set by rlkit.core.rollout.stages); 1: every request.
    log_prob_every: int = 1
    # Each prompt's own first seed, instead of seed + i * n: an agent episode's turn keeps its seed whichever
    # other episodes share the call (rlkit.core.agents.turns).
    prompt_seeds: Sequence[int] | None = None


def request_seed(sampling: Sampling, prompt_index: int, sample_index: int) -> int:
    """The seed of sample `sample_index` (of n) of prompt `prompt_index` of a call."""
    if sampling.prompt_seeds is not None:
        return sampling.prompt_seeds[prompt_index] + sample_index
    return sampling.seed + prompt_index * sampling.n + sample_index


# A check step's log-probs (the weight-sync check) come from about this many samples, or all of a smaller batch.
CHECK_SAMPLES = 32


def check_stride(samples: int) -> int:
    """Sampling.log_prob_every for a check step of `samples` samples (single-turn): one request in this many,
    by seed, returns log-probs, about CHECK_SAMPLES of them; every one when there are fewer than twice that."""
    return max(1, samples // CHECK_SAMPLES)


def returns_log_probs(sampling: Sampling, seed: int) -> bool:
    """Whether the request seeded `seed` (request_seed) returns its sampled tokens' log-probs."""
    return sampling.log_probs and seed % sampling.log_prob_every == 0


@dataclass
class RolloutSample:
    prompt_index: int  # position of the prompt in the call's list
    token_ids: list[int]  # response tokens, ending with EOS when the model stopped
    log_probs: list[float]  # engine's log-prob of each response token (after temperature); [] if not asked
    finished: bool  # stopped by EOS (False: cut at max_tokens)


def limits_per_prompt(prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None) -> list[int]:
    """Each prompt's most new tokens, checked against the call's (see RolloutEngine.generate)."""
    if token_limits is None:
        return [sampling.max_tokens] * len(prompts)
    if len(token_limits) != len(prompts) or not all(0 < k <= sampling.max_tokens for k in token_limits):
        raise ValueError(f"token_limits must give each of the {len(prompts)} prompts 1..{sampling.max_tokens}")
    return list(token_limits)


class RolloutEngine(ABC):
    """Holds a full copy of the policy's weights for generation; `load_weights` keeps it in sync."""

    honors_seeds: bool = True  # Sampling.seed makes a call reproducible (False: SGLang on a CPU)

    @abstractmethod
    def generate(
        self, prompts: list[list[int]], sampling: Sampling, token_limits: Sequence[int] | None = None
    ) -> list[RolloutSample]:
        """len(prompts) * n samples, prompt-major (prompt 0's n samples first).

        token_limits: each prompt's own most new tokens (at most sampling.max_tokens; None: that for every
        prompt). An agent's turns ask for what is left of each conversation's budget in one call: one limit for
        all would take a long conversation past the engine's context (vLLM and SGLang refuse such a request)."""

    @abstractmethod
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the weights with HF-named full tensors (the training policy's)."""

    @abstractmethod
    def score(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        """Log-probs (temperature 1) of each sequence's tokens after the first `prompt_len`."""

    def start_parts(self) -> dict[str, float]:
        """Seconds of the parts of this engine's start that it reported (`rollout_engine_<part>`,
        rlkit.core.rollout.engine_start); empty where it reported none."""
        return {}

    # Whether `sleep(discard_weights=True)` frees the weights without keeping a copy (vLLM with sleep mode).
    discards_weights = False

    def sleep(self, discard_weights: bool = False) -> None:
        """The end of a rollout: free device memory until the next (no-op where unsupported), and forget any
        cache of this rollout's prefixes. `discard_weights`: the caller loads every weight again before the
        engine next computes, so an engine that `discards_weights` keeps no copy of them."""

    def wake_up(self, weights_only: bool = False) -> None:
        """Take device memory back: the weights alone (enough for a weight sync), or everything."""
