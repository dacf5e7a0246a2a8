"""Validation: the policy scored on held-out prompts before training, every trainer.val_freq steps
and after the last step.

One `Evaluator` serves the run loop (generation spread over the workers' engines,
`workers_generate`) and `rlkit eval` (one engine in this process, rlkit.core.controller.offline_eval).
It needs two callables, so where generation and scoring live can change without touching it:
  generate(prompt token ids, Sampling) -> samples, prompt-major (the engine contract)
  score(decoded responses, their prompt rows) -> one score each (the run's rule/function reward)
Every prompt gets one greedy response (mean@1) and, with trainer.val_n >= 2, that many samples
(mean@n, pass@k, maj@n: rlkit.core.rewards.metrics). Sample j of validation prompt p at step s
has the seed `val_seed(trainer.seed, s) + p * val_n + j` however the prompts are spread over
engines, so `rlkit eval` of step s's checkpoint draws the same samples as the run did.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import os
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

from rlkit.core.controller.run_dir import prepare_val_files
from rlkit.core.data.dataset import PromptRow, load_prompt_dataset
from rlkit.core.rewards.metrics import RowOutcome, validation_metrics
from rlkit.core.rewards.registry import answer_fn_for
from rlkit.core.rewards.scoring import RULE_OPTIONS, RewardScorer
from rlkit.core.rollout.base import RolloutSample, Sampling
from rlkit.recipes.reward_schema import RewardConfig
from rlkit.recipes.schema import RLConfig, TrainerConfig

if TYPE_CHECKING:  # only the run loop generates on worker groups
    from rlkit.core.cluster.worker_group import WorkerGroup

GenerateFn = Callable[[list[list[int]], Sampling], list[RolloutSample]]
ScoreFn = Callable[[list[str], list[PromptRow]], list[float]]
VALIDATION_DIR = "validation"  # RUN/validation/step_<N>.jsonl: every response of step N's validation
# Validation seeds live far above the training streams (seed * 1_000_003 + step, times 1009), and
# leave 2**24 seeds per step for prompts x samples.
_VAL_SEED_BASE = 1 << 60
logger = logging.getLogger(__name__)


def val_seed(seed: int, step: int) -> int:
    """The first seed of step `step`'s validation samples: a stream of its own, apart from training's."""
    return _VAL_SEED_BASE + (seed * 1_000_003 + step) * (1 << 24)


def validation_due(step: int, trainer: TrainerConfig) -> bool:
    """After step `step`: every trainer.val_freq steps, and after the last step."""
    return step == trainer.total_steps or (trainer.val_freq > 0 and step % trainer.val_freq == 0)


def generations_path(run_path: Path, step: int) -> Path:
    return Path(run_path) / VALIDATION_DIR / f"step_{step:08d}.jsonl"


def discard_generations_after(run_path: Path, step: int) -> None:
    """Before resuming from `step`: the killed run's later validations are redone (or never reached)."""
    for path in (Path(run_path) / VALIDATION_DIR).glob("step_*.jsonl"):
        if int(path.stem.removeprefix("step_")) > step:
            path.unlink()


@dataclass(frozen=True)
class ValSettings:
    """What validation generates: max_tokens per response, n samples (0: greedy only) and how they are drawn."""

    n: int
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int

    @classmethod
    def from_config(cls, config: RLConfig) -> ValSettings:
        trainer, rollout = config.trainer, config.rollout
        return cls(n=trainer.val_n, max_tokens=config.data.max_response_length,
                   temperature=trainer.val_temperature or rollout.temperature, top_p=rollout.top_p,
                   top_k=rollout.top_k, seed=trainer.seed)

    def sampling(self, step: int, *, greedy: bool) -> Sampling:
        return Sampling(n=1 if greedy else self.n, max_tokens=self.max_tokens, temperature=self.temperature,
                        top_p=self.top_p, top_k=self.top_k, seed=val_seed(self.seed, step), greedy=greedy,
                        log_probs=False)


class Evaluator:
    """Generates, scores and summarises the validation prompts at one step; see the module docstring."""

    def __init__(self, rows: list[PromptRow], tokenizer: Any, settings: ValSettings, generate: GenerateFn,
                 score: ScoreFn, reward: RewardConfig) -> None:
        self.rows, self.tokenizer, self.settings = rows, tokenizer, settings
        self.generate, self.score = generate, score
        self.answer_fns = {source: answer_extractor(source, reward) for source in {r.data_source for r in rows}}

    def run(self, step: int, generations: Path | None = None) -> dict[str, float]:
        """`val/...` metrics of the policy the engines hold; every response is written to `generations`."""
        settings, prompts = self.settings, [row.prompt_token_ids for row in self.rows]
        greedy = self.generate(prompts, settings.sampling(step, greedy=True))
        sampled = self.generate(prompts, settings.sampling(step, greedy=False)) if settings.n else []
        samples = greedy + sampled
        texts = self.tokenizer.batch_decode([s.token_ids for s in samples], skip_special_tokens=True)
        scores = self.score(texts, [self.rows[s.prompt_index] for s in samples])
        outcomes = []
        for p, row in enumerate(self.rows):
            mine = range(len(greedy) + p * settings.n, len(greedy) + (p + 1) * settings.n)
            extract = self.answer_fns[row.data_source]
            outcomes.append(RowOutcome(
                row.data_source, scores[p], len(greedy[p].token_ids), greedy[p].finished,
                sample_scores=[scores[i] for i in mine],
                sample_answers=[extract(texts[i]) for i in mine] if extract else None))
        if generations is not None:
            write_generations(generations, [self._record(step, k, s, texts[k], scores[k], len(greedy))
                                            for k, s in enumerate(samples)])
        return validation_metrics(outcomes, settings.n)

    def _record(self, step: int, k: int, sample: RolloutSample, text: str, score: float,
                num_greedy: int) -> dict[str, Any]:
        row = self.rows[sample.prompt_index]
        extract = self.answer_fns[row.data_source]
        return {"step": step, "row": sample.prompt_index, "data_source": row.data_source,
                "kind": "greedy" if k < num_greedy else "sample",
                "sample": 0 if k < num_greedy else (k - num_greedy) % self.settings.n,
                "prompt": self.tokenizer.decode(row.prompt_token_ids), "response": text,
                "ground_truth": row.ground_truth, "score": score,
                "answer": extract(text) if extract else None,
                "length": len(sample.token_ids), "finished": sample.finished}


def validate(evaluator: Evaluator, run_path: Path, step: int) -> dict[str, float]:
    """The run loop's validation after step `step` (0: before training), timed, its responses in
    RUN/validation/step_<N>.jsonl."""
    start = time.perf_counter()
    metrics = evaluator.run(step, generations_path(run_path, step))
    return {**metrics, "timing/val": time.perf_counter() - start}


def answer_extractor(data_source: str, reward: RewardConfig) -> Callable[[str], str | None] | None:
    """The data_source's answer extractor with the reward options it declares (reward.gsm8k_method)."""
    fn = answer_fn_for(data_source)
    if fn is None:
        return None
    declared = inspect.signature(fn).parameters
    return functools.partial(fn, **{k: getattr(reward, k) for k in RULE_OPTIONS if k in declared})


def write_generations(path: Path, records: list[dict[str, Any]]) -> None:
    """One JSON line per response, written whole or not at all."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")
    os.replace(tmp, path)


def workers_generate(group: WorkerGroup) -> GenerateFn:
    """Generation over a worker group's engines: contiguous slices of the prompts, one per rank,
    each with the seed that keeps sample j of prompt p on seed + p * n + j; the workers' RNG
    states are left as they were."""

    def generate(prompts: list[list[int]], sampling: Sampling) -> list[RolloutSample]:
        world = len(group.actors)
        bounds = [(len(prompts) * r // world, len(prompts) * (r + 1) // world) for r in range(world)]
        per_rank = [(prompts[a:b], replace(sampling, seed=sampling.seed + a * sampling.n)) for a, b in bounds]
        results = group.call("generate_keeping_rng", per_rank=per_rank, phase="validation generate")
        return [replace(s, prompt_index=a + s.prompt_index) for (a, _), part in zip(bounds, results) for s in part]

    return generate


def scorer_score(scorer: RewardScorer) -> ScoreFn:
    """Scoring with the run's rule/function reward (a reward model is a training signal, not a test)."""

    def score(texts: list[str], rows: list[PromptRow]) -> list[float]:
        return scorer.score(texts, [r.data_source for r in rows], [r.ground_truth for r in rows],
                            [r.extra_info for r in rows]).scores

    return score


def training_evaluator(config: RLConfig, run_path: Path, tokenizer: Any, scorer: RewardScorer,
                       rollout: WorkerGroup) -> Evaluator | None:
    """The run's validation over its rollout workers, or None when it has no validation prompts."""
    files = prepare_val_files(config, run_path)
    if not files:
        if config.trainer.val_freq:
            logger.warning("trainer.val_freq=%d, but there is no data.val_files: no validation",
                           config.trainer.val_freq)
        return None
    rows = load_prompt_dataset(files, tokenizer, max_prompt_length=config.data.max_prompt_length,
                               overlong=config.data.overlong_prompts)
    return Evaluator(rows, tokenizer, ValSettings.from_config(config), workers_generate(rollout),
                     scorer_score(scorer), config.reward)
