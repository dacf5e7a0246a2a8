"""The controller: one process that holds the RL dataflow as plain Python.

`Controller.step` reads like the dataflow in DESIGN.md; workers (Ray actors) do the heavy
passes, the controller does the cheap, visible math (rewards -> advantages).
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import torch

from rlkit.core.algos.advantages import AdvantageInputs, compute_advantages
from rlkit.core.algos.kl import AdaptiveKLController, FixedKLController, apply_kl_penalty, kl_estimate
from rlkit.core.batch import Batch
from rlkit.core.data.dataset import PromptRow, PromptSampler, load_prompt_dataset
from rlkit.core.rewards.scoring import RewardScorer
from rlkit.core.rollout.base import RolloutSample, Sampling
from rlkit.core.run import RunDir, prepare_data_files, resolve_model_path
from rlkit.core.tracking import Tracker
from rlkit.core.placement import Placement
from rlkit.core.worker_group import init_ray
from rlkit.recipes.schema import RLConfig


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> float:
    return float((values * mask).sum() / mask.sum().clamp(min=1))


class Controller:
    def __init__(self, config: RLConfig, run: RunDir) -> None:
        from transformers import AutoTokenizer

        self.config, self.run = config, run
        self.model_path = resolve_model_path(config.model.path)
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_path)
        files = prepare_data_files(config, run.path)
        self.rows: list[PromptRow] = load_prompt_dataset(
            files, self.tokenizer, max_prompt_length=config.data.max_prompt_length,
            overlong=config.data.overlong_prompts)
        self.sampler = PromptSampler(len(self.rows), config.data.train_batch_size, seed=config.trainer.seed,
                                     shuffle=config.data.shuffle)
        self.kl_ctrl = (AdaptiveKLController(config.algorithm.kl_ctrl.kl_coef, config.algorithm.kl_ctrl.target_kl,
                                             config.algorithm.kl_ctrl.horizon)
                        if config.algorithm.kl_ctrl.type == "adaptive"
                        else FixedKLController(config.algorithm.kl_ctrl.kl_coef))
        self.scorer = RewardScorer(config.reward)
        init_ray(config)
        self.placement = Placement(config, self.model_path)
        self.workers = self.placement.train
        self.setup_info = self.placement.setup()

    # -- the step -----------------------------------------------------------------------
    def step(self, step: int) -> dict[str, Any]:
        cfg, timing = self.config, {}
        with timed(timing, "step"):
            prompts = [self.rows[i] for i in self.sampler.next_batch()]
            with timed(timing, "gen"):
                batch = self.generate(prompts, step)
            with timed(timing, "reward"):
                batch["scores"] = self.score(batch)
            with timed(timing, "old_log_prob"):
                batch.update(self.old_log_probs(batch))
            if cfg.needs_reference:
                with timed(timing, "ref"):
                    batch["ref_log_probs"] = self.log_probs(batch, "ref")["log_probs"]
            with timed(timing, "adv"):
                batch.update(self.advantages(batch))
            with timed(timing, "update_actor"):
                update_metrics = self.update_actor(batch)
            with timed(timing, "sync"):
                sync_metrics = self.placement.sync_weights()
        return {**self.batch_metrics(batch), **update_metrics, **sync_metrics,
                **{f"timing/{k}": v for k, v in timing.items()}, **self.throughput(batch, timing["step"])}

    # -- phases -------------------------------------------------------------------------
    def generate(self, prompts: list[PromptRow], step: int) -> Batch:
        """Spread prompts over the workers; each samples rollout.n responses with its own engine."""
        cfg, world = self.config, self.placement.rollout_size
        parts = [list(range(len(prompts)))[r::world] for r in range(world)]
        per_rank = []
        for rank, part in enumerate(parts):
            sampling = Sampling(n=cfg.rollout.n, max_tokens=cfg.data.max_response_length,
                                temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p,
                                top_k=cfg.rollout.top_k, seed=(cfg.trainer.seed * 1_000_003 + step) * 1009 + rank,
                                ignore_eos=cfg.rollout.ignore_eos)
            per_rank.append(([prompts[i].prompt_token_ids for i in part], sampling))
        results = self.placement.rollout.call("generate", per_rank=per_rank, phase="generate")
        samples: list[tuple[PromptRow, int, RolloutSample]] = []
        for part, rank_samples in zip(parts, results):
            samples += [(prompts[part[s.prompt_index]], part[s.prompt_index], s) for s in rank_samples]
        samples.sort(key=lambda item: item[1])  # prompt-major order, group by group
        return build_batch(samples, pad_id=self.tokenizer.pad_token_id or 0)

    def score(self, batch: Batch) -> torch.Tensor:
        texts = self.tokenizer.batch_decode(batch["responses"].masked_fill(batch["response_mask"] == 0, 0).tolist(),
                                            skip_special_tokens=True)
        scored = self.scorer.score(texts, batch.meta["data_source"], batch.meta["ground_truth"],
                                   batch.meta["extra_info"])
        self._reward_metrics = scored.metrics
        return torch.tensor(scored.scores, dtype=torch.float32)

    def log_probs(self, batch: Batch, which: str) -> dict[str, torch.Tensor]:
        shards = batch.chunk(self.config.world_size)
        results = self.workers.call("compute_log_probs", per_rank=[(s, which) for s in shards], phase=f"{which} log-probs")
        return {k: torch.cat([r[k] for r in results]) for k in results[0]}

    def old_log_probs(self, batch: Batch) -> dict[str, torch.Tensor]:
        if self.config.actor.recompute_old_log_probs:
            out = self.log_probs(batch, "actor")
            return {"old_log_probs": out["log_probs"], "entropy": out["entropy"]}
        return {"old_log_probs": batch["rollout_log_probs"]}

    def advantages(self, batch: Batch) -> dict[str, torch.Tensor]:
        cfg, mask = self.config.algorithm, batch["response_mask"]
        last = (mask.sum(-1).long() - 1).clamp(min=0)
        token_rewards = torch.zeros_like(mask, dtype=torch.float32)
        token_rewards[torch.arange(len(batch)), last] = batch["scores"]
        out: dict[str, torch.Tensor] = {}
        if cfg.use_kl_in_reward:
            token_rewards, kl = apply_kl_penalty(token_rewards, batch["old_log_probs"], batch["ref_log_probs"], mask,
                                                 coef=self.kl_ctrl.value, kind=cfg.kl_penalty)
            self.kl_ctrl.update(float(kl), len(batch))
        adv, returns = compute_advantages(
            cfg.adv_estimator, AdvantageInputs(token_rewards, mask, batch["group_ids"]),
            gamma=cfg.gamma, lam=cfg.lam, norm_adv_by_std=cfg.norm_adv_by_std)
        out.update(token_rewards=token_rewards, advantages=adv, returns=returns)
        return out

    def update_actor(self, batch: Batch) -> dict[str, float]:
        """Mini-batches of whole prompt groups, each split evenly over the workers."""
        cfg, world = self.config, self.config.world_size
        per_minibatch = cfg.actor.mini_batch_size * cfg.rollout.n
        keys = ["input_ids", "attention_mask", "position_ids", "responses", "response_mask", "old_log_probs",
                "advantages"] + (["ref_log_probs"] if cfg.actor.use_kl_loss else [])
        slim = Batch({k: batch[k] for k in keys})
        shards: list[list[Batch]] = [[] for _ in range(world)]
        norms = []
        for _ in range(cfg.actor.ppo_epochs):
            for mb in slim.chunk(len(batch) // per_minibatch):
                mask = mb["response_mask"]
                norms.append({"num_tokens": float(mask.sum()), "num_seqs": float((mask.sum(-1) > 0).sum())})
                for rank, shard in enumerate(mb.chunk(world)):
                    shards[rank].append(shard)
        return self.workers.call("update_actor", per_rank=[(shards[r], norms) for r in range(world)],
                                 phase="update_actor")[0]

    # -- metrics ------------------------------------------------------------------------
    def batch_metrics(self, batch: Batch) -> dict[str, float]:
        mask, scores = batch["response_mask"], batch["scores"]
        lengths = mask.sum(-1)
        metrics = {
            "reward/mean": float(scores.mean()), "reward/std": float(scores.std()) if len(scores) > 1 else 0.0,
            "reward/max": float(scores.max()), "reward/min": float(scores.min()),
            "response/length_mean": float(lengths.mean()), "response/length_max": float(lengths.max()),
            "response/clip_frac": float((~batch["finished"]).float().mean()),
            "adv/mean": masked_mean(batch["advantages"], mask),
            "prompt/length_mean": float(batch["attention_mask"].sum(-1).float().mean() - lengths.mean()),
            **self._reward_metrics,
        }
        if "entropy" in batch:
            metrics["actor/entropy"] = masked_mean(batch["entropy"], mask)
        if self.config.actor.recompute_old_log_probs:
            metrics["rollout/log_prob_diff"] = masked_mean((batch["rollout_log_probs"] - batch["old_log_probs"]).abs(), mask)
        if "ref_log_probs" in batch:
            metrics["actor/kl_ref"] = masked_mean(kl_estimate(batch["old_log_probs"], batch["ref_log_probs"], "k1"), mask)
            metrics["actor/kl_coef"] = self.kl_ctrl.value
        return metrics

    def throughput(self, batch: Batch, seconds: float) -> dict[str, float]:
        tokens = float(batch["attention_mask"].sum())
        return {"perf/tokens_per_s": tokens / seconds, "perf/tokens_per_s_per_device": tokens / seconds / self.config.world_size,
                "perf/response_tokens": float(batch["response_mask"].sum())}

    def close(self) -> None:
        import ray

        self.scorer.close()
        self.placement.shutdown()
        ray.shutdown()


def build_batch(samples: list[tuple[PromptRow, int, RolloutSample]], pad_id: int) -> Batch:
    """Pad prompts left and responses right into the Batch layout (see rlkit.core.batch)."""
    width_p = max(len(row.prompt_token_ids) for row, _, _ in samples)
    width_r = max(max(len(s.token_ids) for _, _, s in samples), 1)
    n = len(samples)
    input_ids = torch.full((n, width_p + width_r), pad_id, dtype=torch.long)
    attention = torch.zeros((n, width_p + width_r), dtype=torch.long)
    rollout_lp = torch.zeros((n, width_r))
    for i, (row, _, sample) in enumerate(samples):
        p, r = row.prompt_token_ids, sample.token_ids
        input_ids[i, width_p - len(p):width_p] = torch.tensor(p)
        input_ids[i, width_p:width_p + len(r)] = torch.tensor(r, dtype=torch.long)
        attention[i, width_p - len(p):width_p + len(r)] = 1
        rollout_lp[i, :len(r)] = torch.tensor(sample.log_probs)
    position_ids = (attention.cumsum(-1) - 1).clamp(min=0)
    return Batch(
        tensors={"input_ids": input_ids, "attention_mask": attention, "position_ids": position_ids,
                 "responses": input_ids[:, width_p:].clone(), "response_mask": attention[:, width_p:].float(),
                 "rollout_log_probs": rollout_lp,
                 "group_ids": torch.tensor([index for _, index, _ in samples]),
                 "finished": torch.tensor([s.finished for _, _, s in samples])},
        meta={"data_source": [row.data_source for row, _, _ in samples],
              "ground_truth": [row.ground_truth for row, _, _ in samples],
              "extra_info": [row.extra_info for row, _, _ in samples]},
    )


@contextmanager
def timed(timing: dict[str, float], name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    timing[name] = time.perf_counter() - start


def train_run(config: RLConfig, run_id: str | None = None) -> Path:
    """Create the run directory, train config.trainer.total_steps steps, return the run dir."""
    run = RunDir.create(config, run_id)
    controller = Controller(config, run)
    tracker = Tracker(run.path, config.trainer.logger, total_steps=config.trainer.total_steps, start_step=0,
                      project=config.trainer.project_name, name=config.trainer.experiment_name or run.run_id,
                      config=config.model_dump(mode="json"))
    try:
        for step in range(1, config.trainer.total_steps + 1):
            tracker.log(controller.step(step), step)
    finally:
        tracker.close()
        controller.close()
    return run.path
