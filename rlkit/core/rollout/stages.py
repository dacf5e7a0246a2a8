"""The rollout's stages: prompts -> generate -> score -> group filter.

Each stage knows nothing of the rollout mode; the schedulers (rlkit.core.rollout.source: `SyncScheduler`,
rlkit.core.rollout.async_source: `AsyncScheduler`) decide when each runs and with which policy version.
  - `Prompts`: the data position; which prompt rows the next step or round takes.
  - `Generate`: the sampling settings of a step/round, calls submitted to the rollout workers (`generate`, or
    `agent_episodes` with an agent loop: a single-turn completion is a one-turn episode) and their results
    collected into trajectories, stamped with the policy version that generated them.
  - `Score`: verifier scores from the reward functions or the reward model (an environment's own reward
    first), DAPO's overlong shaping, agent metrics; ReMax's greedy baseline scored onto its batch.
  - `group_filter`: DAPO's dynamic sampling, rounds of scored groups until enough have signal.
`RolloutStages` holds one of each, built from the run's config and workers (`build`); each stage gets only the
sections and values it reads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Callable

import torch

from rlkit.core.agents.report import episode_metrics
from rlkit.core.algos.dapo import groups_with_signal, overlong_penalty
from rlkit.core.algos.phase_plan import PhasePlan, phase_plan
from rlkit.core.batch import Batch, build_batch
from rlkit.core.rewards.worker_pool import Outcome, RewardError
from rlkit.core.rollout.base import Sampling, check_stride
from rlkit.core.rollout.dynamic_sampling import GroupCollector, group_rows
from rlkit.core.rollout.generator import Generator
from rlkit.core.rollout.trajectory import Trajectory
from rlkit.core.rollout.worker import RolloutWorker
from rlkit.core.train.scoring import Scoring

if TYPE_CHECKING:
    from rlkit.core.algos.algorithm import Algorithm
    from rlkit.core.controller.placement import Placement
    from rlkit.core.data.dataset import PromptRow, PromptSampler
    from rlkit.core.rewards.scoring import RewardScorer
    from rlkit.recipes.agent_schema import AgentConfig
    from rlkit.recipes.reward_schema import RewardConfig
    from rlkit.recipes.rollout_schema import RolloutConfig
    from rlkit.recipes.schema import RLConfig


class Prompts:
    """The data position: each call to `take` is the next data.train_batch_size prompt rows."""

    def __init__(self, rows: list[PromptRow], sampler: PromptSampler) -> None:
        self.rows, self.sampler = rows, sampler

    def take(self) -> list[PromptRow]:
        return [self.rows[i] for i in self.sampler.next_batch()]

    def state_dict(self) -> dict[str, Any]:
        return {"sampler": self.sampler.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state["sampler"])


@dataclass
class Generation:
    """Generate calls submitted to the rollout workers, and what turns their results into trajectories."""

    prompts: list[PromptRow]
    parts: list[list[int]]  # per rollout rank: the positions (in `prompts`) of the prompts it generates
    refs: list[Any]  # per rollout rank: the call's Ray ObjectRef
    policy_version: int  # the policy the engines hold when the calls run
    episodes: bool  # agent_episodes calls (they return trajectories), else generate (samples)
    scored: bool = False  # scored as they finish: generate_scored's (samples, outcomes), or episodes with outcomes


class Generate:
    """Prompts to trajectories on the rollout workers: `submit` starts the calls, `trajectories` turns their
    results into trajectories; calling the stage does both, waiting for the workers."""

    def __init__(
        self,
        rollout: RolloutConfig,
        algorithm: Algorithm,
        placement: Placement,
        *,
        max_response_length: int,
        seed: int,
        log_prob_check_step: Callable[[int], bool],
        scored: bool = False,
    ) -> None:
        """`seed`: trainer.seed; `log_prob_check_step(step)`: whether the engine also returns the sampled tokens'
        log-probs at that step for the weight-sync check (RLConfig.log_prob_check_step); `scored`: the rollout
        workers score responses as they finish (`scores_while_generating`)."""
        self.rollout, self.algorithm, self.placement, self.scored = rollout, algorithm, placement, scored
        self.max_response_length, self.seed, self.log_prob_check_step = max_response_length, seed, log_prob_check_step

    def __call__(self, prompts: list[PromptRow], sampling: Sampling, policy_version: int) -> list[Trajectory]:
        """Spread prompts over the rollout workers; each samples `sampling.n` responses (or episodes) per prompt.

        Returns trajectories in prompt-major order (group by group); group = the prompt's position.
        """
        generation = self.submit(prompts, sampling, policy_version)
        return self.trajectories(generation, self.placement.rollout.collect(generation.refs, "generate"))

    def sampling(
        self, step: int, *, round_index: int = 0, greedy: bool = False, n: int | None = None, stream: int = 0
    ) -> Sampling:
        """The step's sampling settings; `seed` is the stream's base, each rank and sample derive theirs.

        Streams keep seeds apart: training rounds by round_index, other users (validation) by `stream`.
        """
        rollout = self.rollout
        log_probs = self.algorithm.rollout_log_probs or (not greedy and self.log_prob_check_step(step))
        # Extra dynamic-sampling rounds draw from seed ranges no plausible step count reaches.
        seed = self.seed * 1_000_003 + step + round_index * 10_000_019 + stream * 100_000_007
        return Sampling(
            n=1 if greedy else (n or rollout.n),
            max_tokens=self.max_response_length,
            temperature=rollout.temperature,
            top_p=rollout.top_p,
            top_k=rollout.top_k,
            seed=seed,
            greedy=greedy,
            ignore_eos=rollout.ignore_eos,
            log_probs=log_probs,
        )

    def submit(
        self, prompts: list[PromptRow], sampling: Sampling, policy_version: int, *, timed: bool = False
    ) -> Generation:
        """Start the rollout workers' calls on their shares of the prompts, without waiting: `generate` (or
        `generate_scored`, its responses scored as they finish), or `agent_episodes` (multi-turn, rlkit.core.agents;
        scored as each ends with `scored`) when rollout.agent.loop is set. `policy_version`: the
        policy the engines will hold when the calls run. `timed`: through the worker's `timed` call, which also
        returns how long the worker sat idle before it and then ran it."""
        world = self.placement.rollout_size
        parts = [list(range(len(prompts)))[r::world] for r in range(world)]
        episodes, scored = self.rollout.agent.loop != "single_turn", self.scored
        if sampling.log_probs and not self.algorithm.rollout_log_probs and not episodes:
            # A check step's log-probs (the weight-sync check) from a share of the samples: vLLM returns them at a
            # cost per request and token (docs/benchmarks.md). An agent episode's turns return them all or none.
            sampling = replace(sampling, log_prob_every=check_stride(len(prompts) * sampling.n))
        method = Generator.agent_episodes if episodes else Generator.generate_scored if scored else Generator.generate
        per_rank = []
        for rank, part in enumerate(parts):
            rows, rank_sampling = [prompts[i] for i in part], _rank_sampling(sampling, rank)
            if episodes:
                per_rank.append((rows, part, rank_sampling, scored))
            else:
                per_rank.append((rows if scored else [row.prompt_token_ids for row in rows], rank_sampling))
        if timed:
            method, per_rank = RolloutWorker.timed, [(method, *args) for args in per_rank]
        refs = self.placement.rollout.submit(method, per_rank=per_rank)
        return Generation(prompts, parts, refs, policy_version, episodes, scored)

    def trajectories(self, generation: Generation, results: list[Any]) -> list[Trajectory]:
        """The rollout workers' results (per rank: samples, or episodes) as trajectories in prompt-major order."""
        version = generation.policy_version
        if generation.episodes:  # the agent loop already numbered their groups by prompt position
            trajectories = [replace(t, policy_version=version) for rank_part in results for t in rank_part]
        else:
            parts, prompts = generation.parts, generation.prompts
            # generate_scored: (samples, outcomes) per rank; generate: samples, to be scored after
            scored = results if generation.scored else [(samples, [None] * len(samples)) for samples in results]
            trajectories = [
                Trajectory.single_turn(
                    prompts[part[s.prompt_index]], part[s.prompt_index], s, policy_version=version, reward_outcome=o
                )
                for part, (rank_samples, outcomes) in zip(parts, scored)
                for s, o in zip(rank_samples, outcomes, strict=True)
            ]
        trajectories.sort(key=lambda t: t.group)  # prompt-major order, group by group (a stable sort)
        return trajectories


class Score:
    """Trajectories to a scored batch: `verifier_scores`, and `scores` with DAPO's overlong shaping when on."""

    def __init__(
        self,
        reward: RewardConfig,
        agent: AgentConfig,
        tokenizer: Any,
        scorer: RewardScorer,
        placement: Placement,
        *,
        reward_model: bool,
        max_response_length: int,
        components: tuple[str, ...] = (),
    ) -> None:
        """`reward_model`: the reward model scores (reward_model.path is set), on the training ranks. `components`:
        the reward function's dict keys the estimator reads (gdpo), into `reward_components` [B,K]."""
        self.reward, self.agent, self.tokenizer, self.scorer, self.placement = (
            reward,
            agent,
            tokenizer,
            scorer,
            placement,
        )
        self.use_reward_model, self.max_response_length = reward_model, max_response_length
        self.pad_id = tokenizer.pad_token_id or 0
        self.components = components

    def __call__(
        self, batch: Batch, outcomes: list[Outcome | None] | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        """`verifier_scores` from the reward functions (or the reward model, when reward_model.path
        is set); `scores` adds DAPO's overlong shaping when on. `outcomes`: the batch's rows' reward calls
        already run in the rollout workers (Trajectory.reward_outcome); used when every row has one."""
        env_rewards = batch.meta["env_reward"]  # an environment's own score replaces the reward function's
        components: dict[str, torch.Tensor] = {}
        if all(r is not None for r in env_rewards):
            verifier, metrics = torch.tensor(env_rewards, dtype=torch.float32), {}
        else:
            if self.use_reward_model:
                verifier, metrics = self.reward_model_scores(batch), {}
            else:
                verifier, metrics, components = self.rule_scores(batch, outcomes)
            verifier = torch.tensor([v if r is None else r for r, v in zip(env_rewards, verifier.tolist())])
        overlong = self.reward.overlong_buffer
        if not overlong.enable:
            return {"scores": verifier, "verifier_scores": verifier, **components}, metrics
        penalty = overlong_penalty(
            batch["response_mask"].sum(-1),
            max_response_length=self.max_response_length,
            buffer_length=overlong.length,
            penalty_factor=overlong.penalty_factor,
        )
        metrics["reward/overlong_penalty"] = float(penalty.mean())
        return {"scores": verifier + penalty, "verifier_scores": verifier, **components}, metrics

    def batch(self, trajectories: list[Trajectory]) -> Batch:
        return build_batch(trajectories, pad_id=self.pad_id)

    def episode_metrics(self, trajectories: list[Trajectory], step: int) -> dict[str, float]:
        """Agent metrics of multi-turn episodes (none for single-turn completions)."""
        if self.agent.loop == "single_turn":
            return {}
        return episode_metrics(trajectories, self.agent, f"step {step}")

    def reward_model_scores(self, batch: Batch) -> torch.Tensor:
        parts = torch.arange(len(batch)).tensor_split(self.placement.train.size)
        per_rank = [(batch.select(p.tolist()),) for p in parts]
        results = self.placement.train.call(Scoring.reward_model_scores, per_rank=per_rank, phase="reward model")
        return torch.cat(results)

    @property
    def keys(self) -> tuple[str, ...]:
        """The batch keys a scored batch gets."""
        return ("scores", "verifier_scores", *(["reward_components"] if self.components else []))

    def rule_scores(
        self, batch: Batch, outcomes: list[Outcome | None] | None = None
    ) -> tuple[torch.Tensor, dict[str, float], dict[str, torch.Tensor]]:
        """The reward functions' scores and metrics, and with `components` their `reward_components` [B,K]: a row
        whose call failed (scored 0) has components 0; a row that scored without one of them is a RewardError.
        `outcomes`: every row's call already run (in the rollout workers; with reward.on_error=raise up to the first
        failed one, which raises here), else they run here."""
        meta = batch.meta
        ran = [o for o in outcomes or [] if o is not None]
        failed = any(o.error is not None for o in ran)
        if outcomes and (len(ran) == len(outcomes) or (failed and self.reward.on_error == "raise")):
            scored = self.scorer.collect(outcomes, meta["data_source"], meta["extra_info"])
        else:
            texts = self.decode_responses(batch)
            scored = self.scorer.score(texts, meta["data_source"], meta["ground_truth"], meta["extra_info"])
        scores, metrics = torch.tensor(scored.scores, dtype=torch.float32), dict(scored.metrics)
        if not self.components:
            return scores, metrics, {}
        rows = []
        for row, (details, failed) in enumerate(zip(scored.details, scored.failed, strict=True)):
            missing = [key for key in self.components if key not in details]
            if missing and not failed:
                raise RewardError(
                    f"row {row} (data_source {batch.meta['data_source'][row]!r}): the reward function returned no "
                    f"{', '.join(map(repr, missing))} (returned keys: {sorted(details)}); algorithm.gdpo_reward_keys "
                    "names keys of the dict it returns besides 'score': return them on every row, or fix the keys"
                )
            rows.append([details.get(key, 0.0) for key in self.components])
        return scores, metrics, {"reward_components": torch.tensor(rows, dtype=torch.float32)}

    def decode_responses(self, batch: Batch) -> list[str]:
        """The policy's own tokens of each response (a multi-turn episode's tool/environment tokens are not its
        answer)."""
        policy = batch["response_mask"] > 0
        return self.tokenizer.batch_decode(
            [ids[mask].tolist() for ids, mask in zip(batch["responses"], policy)], skip_special_tokens=True
        )

    def baseline(self, batch: Batch, greedy_trajectories: list[Trajectory]) -> dict[str, float]:
        """ReMax: the greedy responses (one per group, in group order) scored; each sample's baseline is its
        prompt's score, in `baseline_scores`."""
        groups = group_rows(batch["group_ids"])
        greedy = self.batch(greedy_trajectories)
        greedy_scores = self(greedy, [t.reward_outcome for t in greedy_trajectories])[0]["scores"]  # in prompt order
        baseline = torch.zeros(len(batch))
        for score, rows in zip(greedy_scores, groups):
            baseline[rows] = score
        batch["baseline_scores"] = baseline
        return {"remax/baseline_score_mean": float(greedy_scores.mean()), "rollout/greedy_samples": float(len(greedy))}


# One round of train_batch_size prompt groups, scored: (trajectories, their batch, reward and agent metrics).
ScoredRound = tuple[list[Trajectory], Batch, dict[str, float]]


def group_filter(
    scored_round: Callable[[int], ScoredRound],
    *,
    target: int,
    max_rounds: int,
    pad_id: int,
    keys: tuple[str, ...] = ("scores", "verifier_scores"),
) -> tuple[Batch, dict[str, float]]:
    """DAPO's dynamic sampling: groups whose verifier scores are all equal are dropped and round after round
    (`scored_round(round_index)`) is scored until `target` groups have signal or `max_rounds` ran out
    (rlkit.core.rollout.dynamic_sampling). The kept groups are the batch's groups 0..target-1, in order, with
    the scoring's `keys`."""
    collector: GroupCollector[Trajectory] = GroupCollector(target)
    sampled_scores = []
    for round_index in range(max_rounds):
        trajectories, batch, metrics = scored_round(round_index)
        sampled_scores.append(batch["scores"])
        signal = groups_with_signal(batch["verifier_scores"], batch["group_ids"])
        collector.add(trajectories, batch["group_ids"], {k: batch[k] for k in keys}, signal)
        if collector.full:
            break
    groups, scores, dapo_metrics = collector.take()
    kept = [Trajectory(**{**vars(t), "group": g}) for g, group in enumerate(groups) for t in group]
    sampled = torch.cat(sampled_scores)
    metrics.update(dapo_metrics)
    metrics.update({"rollout/samples": float(len(sampled)), "dapo/reward_mean_sampled": float(sampled.mean())})
    return build_batch(kept, pad_id=pad_id).update(scores), metrics


@dataclass
class RolloutStages:
    """The run's stages, and what of the algorithm decides which of them a step runs."""

    prompts: Prompts
    generate: Generate
    score: Score
    algorithm: Algorithm
    plan: PhasePlan
    train_batch_size: int  # the prompt groups of a step's batch (data.train_batch_size)

    @classmethod
    def build(
        cls,
        config: RLConfig,
        algorithm: Algorithm,
        rows: list[PromptRow],
        sampler: PromptSampler,
        tokenizer: Any,
        scorer: RewardScorer,
        placement: Placement,
    ) -> RolloutStages:
        return cls(
            Prompts(rows, sampler),
            Generate(
                config.rollout,
                algorithm,
                placement,
                max_response_length=config.data.max_response_length,
                seed=config.trainer.seed,
                log_prob_check_step=config.log_prob_check_step,
                scored=scores_while_generating(config),
            ),
            Score(
                config.reward,
                config.rollout.agent,
                tokenizer,
                scorer,
                placement,
                reward_model=bool(config.reward_model.path),
                max_response_length=config.data.max_response_length,
                components=algorithm.reward_components,
            ),
            algorithm,
            phase_plan(algorithm),
            config.data.train_batch_size,
        )

    @property
    def greedy_baseline(self) -> bool:
        return "gen_baseline" in self.plan


def scores_while_generating(config: RLConfig) -> bool:
    """Whether the rollout workers score responses as they finish (reward.while_generating) rather than the
    controller after the rollout: reward functions rather than a reward model, and agent episodes (they end at
    different turns on any engine) or single-turn samples of a streaming engine."""
    rollout = config.rollout
    finish_apart = rollout.agent.loop != "single_turn" or rollout.streams
    return config.reward.while_generating and finish_apart and not config.reward_model.path


def _rank_sampling(sampling: Sampling, rank: int) -> Sampling:
    """Each rank's own seed range: samples differ across ranks and repeat exactly on a re-run."""
    return Sampling(**{**vars(sampling), "seed": sampling.seed * 1009 + rank})
