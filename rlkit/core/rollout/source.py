"""Where the learner's batches come from: prompts -> trajectories -> scores.

The controller asks a rollout source for the next step's batch and does not care how it was
made. `SyncRolloutSource` generates it now, with the current policy: prompts from the data
sampler, rollout.n samples each on the rollout workers, scores from the reward functions (or
the reward model), DAPO's dynamic sampling and overlong shaping, ReMax's greedy baseline. The asynchronous
source (rlkit.core.rollout.async_source: generation on other devices while the learner
trains) implements the same protocol.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Iterator, Protocol

import torch

from rlkit.core.agents.report import episode_metrics
from rlkit.core.algos.dapo import groups_with_signal, overlong_penalty
from rlkit.core.algos.phase_plan import phase_plan
from rlkit.core.batch import Batch, build_batch
from rlkit.core.rollout.base import Sampling
from rlkit.core.rollout.dynamic_sampling import GroupCollector, group_rows
from rlkit.core.rollout.generator import Generator
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.rollout.worker import RolloutWorker
from rlkit.core.train.scoring import Scoring

if TYPE_CHECKING:
    from rlkit.core.algos.algorithm import Algorithm
    from rlkit.core.cluster.placement import Placement
    from rlkit.core.data.dataset import PromptRow, PromptSampler
    from rlkit.core.rewards.scoring import RewardScorer
    from rlkit.recipes.schema import RLConfig


class RolloutSource(Protocol):
    def next_batch(self, step: int, timing: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        """The step's scored batch (prompt-major, rollout.n samples per group) and its rollout metrics;
        phase times are added to `timing`."""

    def sync_weights(self, step: int) -> dict[str, float]:
        """After step `step`'s update: the rollout engines get its weights (policy version `step`); sync metrics."""

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint must hold to continue exactly (the data position)."""

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@dataclass
class Generation:
    """Generate calls submitted to the rollout workers, and what turns their results into trajectories."""

    prompts: list[PromptRow]
    parts: list[list[int]]  # per rollout rank: the positions (in `prompts`) of the prompts it generates
    refs: list[Any]  # per rollout rank: the call's Ray ObjectRef
    policy_version: int  # the policy the engines hold when the calls run
    episodes: bool  # agent_episodes calls (they return trajectories), else generate (samples)


class SyncRolloutSource:
    """Generates each step's batch on demand with the policy as it is now."""

    def __init__(
        self,
        config: RLConfig,
        algorithm: Algorithm,
        rows: list[PromptRow],
        sampler: PromptSampler,
        tokenizer: Any,
        scorer: RewardScorer,
        placement: Placement,
    ) -> None:
        self.config, self.algorithm, self.rows, self.sampler = config, algorithm, rows, sampler
        self.tokenizer, self.scorer, self.placement = tokenizer, scorer, placement
        self.pad_id = tokenizer.pad_token_id or 0
        self.policy_version = 0  # the last completed step: its weights are the engines' (0: the base model)
        self.plan = phase_plan(algorithm)

    def sync_weights(self, step: int) -> dict[str, float]:
        metrics = self.placement.sync_weights()
        self.policy_version = step
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])

    # -- the step's batch ---------------------------------------------------------------
    def next_batch(self, step: int, timing: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        # The policy at step `step` is the weights after step - 1: its version, also when that step left them
        # as they were (critic warm-up, no sync), so versions count steps and staleness never exceeds the schedule.
        self.policy_version = step - 1
        batch, metrics = self.sample(step, timing)  # gen + reward, over several rounds with dynamic sampling
        if "gen_baseline" in self.plan:  # an extra, greedy rollout (ReMax)
            with timed(timing, "gen_baseline"):
                metrics.update(self.greedy_baseline(batch, step))
        return batch, metrics

    def sample(self, step: int, timing: dict[str, float]) -> tuple[Batch, dict[str, float]]:
        """Generate and score data.train_batch_size prompts' groups of rollout.n samples.

        With dynamic sampling (DAPO), groups whose verifier scores are all equal are dropped and
        more prompts are sampled, round after round, until the batch is full (rlkit.core.rollout.dynamic_sampling).
        """
        cfg = self.config
        if not self.algorithm.group_filter:
            _, batch, metrics = self.sample_round(step, 0, timing)
            return batch, {**metrics, "rollout/samples": float(len(batch))}
        collector: GroupCollector[Trajectory] = GroupCollector(cfg.data.train_batch_size)
        sampled_scores = []
        for round_index in range(self.plan.gen_rounds):
            trajectories, batch, metrics = self.sample_round(step, round_index, timing)
            sampled_scores.append(batch["scores"])
            signal = groups_with_signal(batch["verifier_scores"], batch["group_ids"])
            collector.add(
                trajectories, batch["group_ids"], {k: batch[k] for k in ("scores", "verifier_scores")}, signal
            )
            if collector.full:
                break
        groups, scores, dapo_metrics = collector.take()
        # Renumber: the kept groups are the batch's groups 0..train_batch_size-1, in order.
        kept = [Trajectory(**{**vars(t), "group": g}) for g, group in enumerate(groups) for t in group]
        sampled = torch.cat(sampled_scores)
        metrics.update(dapo_metrics)
        metrics.update({"rollout/samples": float(len(sampled)), "dapo/reward_mean_sampled": float(sampled.mean())})
        return build_batch(kept, pad_id=self.pad_id).update(scores), metrics

    def sample_round(
        self, step: int, round_index: int, timing: dict[str, float]
    ) -> tuple[list[Trajectory], Batch, dict[str, float]]:
        """One round's train_batch_size prompt groups, scored: (trajectories, their batch, reward and agent metrics)."""
        trajectories = self.round_trajectories(step, round_index, timing)
        batch = build_batch(trajectories, pad_id=self.pad_id)
        with timed(timing, "reward"):
            scores, metrics = self.score(batch)
        if self.config.rollout.agent.loop != "single_turn":
            metrics.update(episode_metrics(trajectories, self.config.rollout.agent, f"step {step}"))
        return trajectories, batch.update(scores), metrics

    def round_trajectories(self, step: int, round_index: int, timing: dict[str, float]) -> list[Trajectory]:
        """The next train_batch_size prompts, generated now with the current policy."""
        prompts = [self.rows[i] for i in self.sampler.next_batch()]
        with timed(timing, "gen"):
            return self.generate(prompts, self.sampling(step, round_index=round_index))

    # -- generation ---------------------------------------------------------------------
    def sampling(
        self, step: int, *, round_index: int = 0, greedy: bool = False, n: int | None = None, stream: int = 0
    ) -> Sampling:
        """The step's sampling settings; `seed` is the stream's base, each rank and sample derive theirs.

        Streams keep seeds apart: training rounds by round_index, other users (validation) by `stream`.
        """
        cfg = self.config
        log_probs = self.algorithm.rollout_log_probs or (not greedy and cfg.log_prob_check_step(step))
        # Extra dynamic-sampling rounds draw from seed ranges no plausible step count reaches.
        seed = cfg.trainer.seed * 1_000_003 + step + round_index * 10_000_019 + stream * 100_000_007
        return Sampling(
            n=1 if greedy else (n or cfg.rollout.n),
            max_tokens=cfg.data.max_response_length,
            temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p,
            top_k=cfg.rollout.top_k,
            seed=seed,
            greedy=greedy,
            ignore_eos=cfg.rollout.ignore_eos,
            log_probs=log_probs,
        )

    def generate(self, prompts: list[PromptRow], sampling: Sampling) -> list[Trajectory]:
        """Spread prompts over the rollout workers; each samples `sampling.n` responses (or episodes) per prompt.

        Returns trajectories in prompt-major order (group by group); group = the prompt's position.
        """
        generation = self.submit_generation(prompts, sampling)
        return self.trajectories(generation, self.placement.rollout.collect(generation.refs, "generate"))

    def submit_generation(self, prompts: list[PromptRow], sampling: Sampling, *, timed: bool = False) -> Generation:
        """Start the rollout workers' calls on their shares of the prompts, without waiting: `generate`, or
        `agent_episodes` (multi-turn, rlkit.core.agents) when rollout.agent.loop is set. `timed`: through the
        worker's `timed` call, which also returns how long the worker sat idle before it and then ran it."""
        world = self.placement.rollout_size
        parts = [list(range(len(prompts)))[r::world] for r in range(world)]
        episodes = self.config.rollout.agent.loop != "single_turn"
        method = Generator.agent_episodes if episodes else Generator.generate
        per_rank = [
            (([prompts[i] for i in part], part) if episodes else ([prompts[i].prompt_token_ids for i in part],))
            + (_rank_sampling(sampling, rank),)
            for rank, part in enumerate(parts)
        ]
        if timed:
            method, per_rank = RolloutWorker.timed, [(method, *args) for args in per_rank]
        return Generation(
            prompts, parts, self.placement.rollout.submit(method, per_rank=per_rank), self.policy_version, episodes
        )

    def trajectories(self, generation: Generation, results: list[Any]) -> list[Trajectory]:
        """The rollout workers' results (per rank: samples, or episodes) as trajectories in prompt-major order."""
        version = generation.policy_version
        if generation.episodes:  # the agent loop already numbered their groups by prompt position
            trajectories = [replace(t, policy_version=version) for rank_part in results for t in rank_part]
        else:
            parts, prompts = generation.parts, generation.prompts
            trajectories = [
                Trajectory.single_turn(prompts[part[s.prompt_index]], part[s.prompt_index], s, policy_version=version)
                for part, rank_samples in zip(parts, results)
                for s in rank_samples
            ]
        trajectories.sort(key=lambda t: t.group)  # prompt-major order, group by group (a stable sort)
        return trajectories

    # -- rewards ------------------------------------------------------------------------
    def score(self, batch: Batch) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """`verifier_scores` from the reward functions (or the reward model, when reward_model.path
        is set); `scores` adds DAPO's overlong shaping when on."""
        env_rewards = batch.meta["env_reward"]  # an environment's own score replaces the reward function's
        if all(r is not None for r in env_rewards):
            verifier, metrics = torch.tensor(env_rewards, dtype=torch.float32), {}
        else:
            verifier, metrics = (
                (self.reward_model_scores(batch), {}) if self.config.reward_model.path else self.rule_scores(batch)
            )
            verifier = torch.tensor([v if r is None else r for r, v in zip(env_rewards, verifier.tolist())])
        overlong = self.config.reward.overlong_buffer
        if not overlong.enable:
            return {"scores": verifier, "verifier_scores": verifier}, metrics
        penalty = overlong_penalty(
            batch["response_mask"].sum(-1),
            max_response_length=self.config.data.max_response_length,
            buffer_length=overlong.length,
            penalty_factor=overlong.penalty_factor,
        )
        metrics["reward/overlong_penalty"] = float(penalty.mean())
        return {"scores": verifier + penalty, "verifier_scores": verifier}, metrics

    def reward_model_scores(self, batch: Batch) -> torch.Tensor:
        parts = torch.arange(len(batch)).tensor_split(self.config.world_size)
        per_rank = [(batch.select(p.tolist()),) for p in parts]
        results = self.placement.train.call(Scoring.reward_model_scores, per_rank=per_rank, phase="reward model")
        return torch.cat(results)

    def rule_scores(self, batch: Batch) -> tuple[torch.Tensor, dict[str, float]]:
        texts = self.decode_responses(batch)
        scored = self.scorer.score(
            texts, batch.meta["data_source"], batch.meta["ground_truth"], batch.meta["extra_info"]
        )
        return torch.tensor(scored.scores, dtype=torch.float32), dict(scored.metrics)

    def decode_responses(self, batch: Batch) -> list[str]:
        """The policy's own tokens of each response (a multi-turn episode's tool/environment tokens are not its
        answer)."""
        policy = batch["response_mask"] > 0
        return self.tokenizer.batch_decode(
            [ids[mask].tolist() for ids, mask in zip(batch["responses"], policy)], skip_special_tokens=True
        )

    def greedy_baseline(self, batch: Batch, step: int) -> dict[str, float]:
        """ReMax: one greedy response per prompt, generated now."""
        prompts = [self.rows[batch.meta["row_index"][rows[0]]] for rows in group_rows(batch["group_ids"])]
        return self.apply_baseline(batch, self.generate(prompts, self.sampling(step, greedy=True)))

    def apply_baseline(self, batch: Batch, greedy_trajectories: list[Trajectory]) -> dict[str, float]:
        """ReMax: the greedy responses (one per group, in group order) scored; each sample's baseline is its
        prompt's score."""
        groups = group_rows(batch["group_ids"])
        greedy = build_batch(greedy_trajectories, pad_id=self.pad_id)
        greedy_scores = self.score(greedy)[0]["scores"]  # one per prompt, in prompt order
        baseline = torch.zeros(len(batch))
        for score, rows in zip(greedy_scores, groups):
            baseline[rows] = score
        batch["baseline_scores"] = baseline
        return {"remax/baseline_score_mean": float(greedy_scores.mean()), "rollout/greedy_samples": float(len(greedy))}


def _rank_sampling(sampling: Sampling, rank: int) -> Sampling:
    """Each rank's own seed range: samples differ across ranks and repeat exactly on a re-run."""
    return Sampling(**{**vars(sampling), "seed": sampling.seed * 1009 + rank})


@contextmanager
def timed(timing: dict[str, float], name: str) -> Iterator[None]:
    """Add the block's wall time to timing[name] (a phase may run several times in a step)."""
    start = time.perf_counter()
    yield
    timing[name] = timing.get(name, 0.0) + time.perf_counter() - start
