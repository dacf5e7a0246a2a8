"""Validation: the policy scored on held-out prompts before training, every trainer.val_freq steps
and after the last step.

One `Evaluator` serves the run loop (episodes spread over the workers' engines, `workers_episodes`)
and `rlkit eval` (one engine in this process, `engine_episodes`; rlkit.core.controller.offline_eval).
It needs two callables, so where generation and scoring live can change without touching it:
  generate(prompt rows, Sampling) -> episodes (Trajectory), prompt-major, group = the row's position
  score(decoded responses, their prompt rows) -> one score each (the run's rule/function reward)
An episode is what training samples (rlkit.core.agents.worker.run_episodes): one completion, or
with rollout.agent.loop a whole multi-turn episode (same loop, environment or tools, turn and
token limits). It is scored as training scores it: the environment's own reward where it gave
one (0 when it failed), else the reward function on the policy's tokens.
Every prompt gets one greedy episode (mean@1) and, with trainer.val_n >= 2, that many samples
(mean@n, pass@k, maj@n: rlkit.core.rewards.metrics). Sample j of validation prompt p at step s
has the seed `val_seed(trainer.seed, s) + p * val_n + j` however the prompts are spread over
engines, so `rlkit eval` of step s's checkpoint draws the same samples as the run did. (An agent
episode's later turns draw by their place among its engine's running episodes: the same split
over engines, as in a re-run, a resumed run or `rlkit eval` of a one-engine run, draws them again.)
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

from rlkit.core.agents.report import episode_metrics
from rlkit.core.agents.tool_env import prompt_tools
from rlkit.core.agents.worker import build_agent_loop, run_episodes
from rlkit.core.data.dataset import PromptRow, load_prompt_dataset
from rlkit.core.rewards.metrics import RowOutcome, validation_metrics
from rlkit.core.rewards.registry import answer_fn_for
from rlkit.core.rewards.scoring import RULE_OPTIONS, RewardScorer
from rlkit.core.rollout.base import Sampling
from rlkit.core.rollout.generator import Generator
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.state.run_dir import prepare_val_files
from rlkit.recipes.agent_schema import AgentConfig
from rlkit.recipes.reward_schema import RewardConfig
from rlkit.recipes.schema import RLConfig, TrainerConfig

if TYPE_CHECKING:  # only the run loop generates on worker groups, only `rlkit eval` on an engine here
    from rlkit.core.cluster.backend import Group
    from rlkit.core.rollout.base import RolloutEngine

GenerateFn = Callable[[list[PromptRow], Sampling], list[Trajectory]]
ScoreFn = Callable[[list[str], list[PromptRow]], list[float]]
VALIDATION_DIR = "validation"  # RUN/validation/step_<N>.jsonl: every episode of step N's validation
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
        return cls(
            n=trainer.val_n,
            max_tokens=config.data.max_response_length,
            temperature=trainer.val_temperature or rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            seed=trainer.seed,
        )

    def sampling(self, step: int, *, greedy: bool) -> Sampling:
        return Sampling(
            n=1 if greedy else self.n,
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            seed=val_seed(self.seed, step),
            greedy=greedy,
            log_probs=False,
        )


class Evaluator:
    """Runs, scores and summarises the validation prompts' episodes at one step; see the module docstring."""

    def __init__(
        self,
        rows: list[PromptRow],
        tokenizer: Any,
        settings: ValSettings,
        generate: GenerateFn,
        score: ScoreFn,
        reward: RewardConfig,
        agent: AgentConfig,
    ) -> None:
        self.rows, self.tokenizer, self.settings = rows, tokenizer, settings
        self.generate, self.score, self.agent = generate, score, agent
        self.answer_fns = {source: answer_extractor(source, reward) for source in {r.data_source for r in rows}}

    def run(self, step: int, generations: Path | None = None) -> dict[str, float]:
        """`val/...` metrics of the policy the engines hold; every episode is written to `generations`."""
        settings = self.settings
        greedy = self.generate(self.rows, settings.sampling(step, greedy=True))
        sampled = self.generate(self.rows, settings.sampling(step, greedy=False)) if settings.n else []
        episodes = greedy + sampled
        texts = self.tokenizer.batch_decode([e.policy_ids for e in episodes], skip_special_tokens=True)
        scores = self.scores(episodes, texts)
        outcomes = []
        for p, row in enumerate(self.rows):
            mine = range(len(greedy) + p * settings.n, len(greedy) + (p + 1) * settings.n)
            extract = self.answer_fns[row.data_source]
            outcomes.append(
                RowOutcome(
                    row.data_source,
                    scores[p],
                    len(greedy[p].response_ids),
                    greedy[p].finished,
                    sample_scores=[scores[i] for i in mine],
                    sample_answers=[extract(texts[i]) for i in mine] if extract else None,
                )
            )
        metrics = validation_metrics(outcomes, settings.n)
        if self.agent.loop != "single_turn":  # as training reports its episodes (and stops above the error rate)
            agent = episode_metrics(episodes, self.agent, f"step {step}'s validation")
            metrics.update({f"val/{key}": value for key, value in agent.items()})
        if generations is not None:
            write_generations(
                generations,
                [self._record(step, k, e, texts[k], scores[k], len(greedy)) for k, e in enumerate(episodes)],
            )
        return metrics

    def scores(self, episodes: list[Trajectory], texts: list[str]) -> list[float]:
        """As training scores episodes: the environment's reward where it gave one (0 for a failed
        episode), else the reward function on the policy's own tokens (`texts`)."""
        unscored = [k for k, e in enumerate(episodes) if e.reward is None]
        by_function = self.score([texts[k] for k in unscored], [episodes[k].row for k in unscored]) if unscored else []
        scores = [e.reward for e in episodes]
        for k, score in zip(unscored, by_function):
            scores[k] = score
        return scores  # type: ignore[return-value]  (every None is filled above)

    def _record(
        self, step: int, k: int, episode: Trajectory, text: str, score: float, num_greedy: int
    ) -> dict[str, Any]:
        row = self.rows[episode.group]
        extract = self.answer_fns[row.data_source]
        record = {
            "step": step,
            "row": episode.group,
            "data_source": row.data_source,
            "kind": "greedy" if k < num_greedy else "sample",
            "sample": 0 if k < num_greedy else (k - num_greedy) % self.settings.n,
            "prompt": self.tokenizer.decode(episode.prompt_ids),
            "response": text,
            "ground_truth": row.ground_truth,
            "score": score,
            "answer": extract(text) if extract else None,
            "length": len(episode.response_ids),
            "finished": episode.finished,
        }
        if self.agent.loop != "single_turn":
            record.update(
                turns=episode.info.get("turns"),
                finish_reason=episode.finish_reason,
                env_error=episode.info.get("env_error"),
                conversation=self.conversation(episode),
            )
        return record

    def conversation(self, episode: Trajectory) -> list[dict[str, str]]:
        """The episode after its prompt, as written: runs of the policy's tokens and of the environment's
        (tool answers, chat-template markers), each decoded whole."""
        runs: list[tuple[int, list[int]]] = []
        for token, mask in zip(episode.response_ids, episode.loss_mask):
            if runs and runs[-1][0] == mask:
                runs[-1][1].append(token)
            else:
                runs.append((mask, [token]))
        return [{"from": "policy" if mask else "environment", "text": self.tokenizer.decode(ids)} for mask, ids in runs]


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


def workers_episodes(group: Group) -> GenerateFn:
    """Episodes over a worker group's engines (`validation_episodes`: the workers' RNG states are left
    as they were): contiguous slices of the rows, one per rank, each with the seed that keeps sample j
    of row p on seed + p * n + j."""

    def generate(rows: list[PromptRow], sampling: Sampling) -> list[Trajectory]:
        world = group.size
        bounds = [(len(rows) * r // world, len(rows) * (r + 1) // world) for r in range(world)]
        per_rank = [
            (rows[a:b], list(range(a, b)), replace(sampling, seed=sampling.seed + a * sampling.n)) for a, b in bounds
        ]
        results = group.call(Generator.validation_episodes, per_rank=per_rank, phase="validation")
        return [episode for part in results for episode in part]

    return generate


def engine_episodes(engine: RolloutEngine, config: RLConfig, tokenizer: Any) -> GenerateFn:
    """Episodes on one engine in this process (`rlkit eval`), with the run's agent loop (rollout.agent)."""
    agent = config.rollout.agent
    loop = None if agent.loop == "single_turn" else build_agent_loop(agent, config.data, tokenizer)

    def generate(rows: list[PromptRow], sampling: Sampling) -> list[Trajectory]:
        return run_episodes(engine, loop, rows, list(range(len(rows))), sampling)

    return generate


def validation_rows(files: list[str], config: RLConfig, tokenizer: Any) -> list[PromptRow]:
    """The validation prompts, tokenized as the training prompts are (with the tools of rollout.agent)."""
    data = config.data
    return load_prompt_dataset(
        files,
        tokenizer,
        max_prompt_length=data.max_prompt_length,
        overlong=data.overlong_prompts,
        tools=prompt_tools(config.rollout.agent),
    )


def scorer_score(scorer: RewardScorer) -> ScoreFn:
    """Scoring with the run's rule/function reward (a reward model is a training signal, not a test)."""

    def score(texts: list[str], rows: list[PromptRow]) -> list[float]:
        return scorer.score(
            texts, [r.data_source for r in rows], [r.ground_truth for r in rows], [r.extra_info for r in rows]
        ).scores

    return score


def training_evaluator(
    config: RLConfig, run_path: Path, tokenizer: Any, scorer: RewardScorer, rollout: Group
) -> Evaluator | None:
    """The run's validation over its rollout workers, or None when it has no validation prompts."""
    files = prepare_val_files(config, run_path)
    if not files:
        if config.trainer.val_freq:
            logger.warning(
                "trainer.val_freq=%d, but there is no data.val_files: no validation", config.trainer.val_freq
            )
        return None
    return Evaluator(
        validation_rows(files, config, tokenizer),
        tokenizer,
        ValSettings.from_config(config),
        workers_episodes(rollout),
        scorer_score(scorer),
        config.reward,
        config.rollout.agent,
    )
