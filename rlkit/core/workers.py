"""The policy worker: one per device, a Ray actor holding its FSDP2 shard of the actor (and
reference), and a rollout engine in the same process that is synced after every update."""

from __future__ import annotations

import os
import random
import socket
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rlkit.core import checkpoint_shards, fsdp
from rlkit.core.algos.kl import kl_estimate
from rlkit.core.algos.losses import aggregate_loss, entropy_from_logits, policy_loss
from rlkit.core.batch import Batch
from rlkit.core.phases import PhaseReporter
from rlkit.core.rewards.reward_model import RewardModel
from rlkit.core.rollout.base import RolloutSample, Sampling, make_engine
from rlkit.core.run import resolve_model_path
from rlkit.recipes.schema import RLConfig


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("", 0))
        return sock.getsockname()[1]


class PolicyWorker(PhaseReporter):
    """Rank `rank` of the training group. Method names are the controller's phases."""

    def __init__(self, config: RLConfig, model_path: str, rank: int, world_size: int) -> None:
        self.config, self.model_path, self.rank, self.world_size = config, model_path, rank, world_size
        self.use_cuda = config.trainer.device == "cuda" or (config.trainer.device == "auto" and torch.cuda.is_available())
        self.device = torch.device("cuda", 0) if self.use_cuda else torch.device("cpu")
        if not self.use_cuda:
            torch.set_num_threads(config.trainer.cpu_threads_per_worker)
        self.phase = "starting"

    # -- set-up -------------------------------------------------------------------------
    def address(self) -> tuple[str, int]:
        return socket.gethostbyname(socket.gethostname()), _free_port()

    def node_info(self) -> dict[str, Any]:
        return {"rank": self.rank, "pid": os.getpid(), "host": socket.gethostname(), "phase": self.phase}

    def setup(self, master_addr: str, master_port: int) -> dict[str, Any]:
        self.phase = "setup/process-group"
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank),
                          WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")
        if self.use_cuda:
            torch.cuda.set_device(self.device)
        dist.init_process_group("nccl" if self.use_cuda else "gloo", rank=self.rank, world_size=self.world_size)
        self._seed(self.config.trainer.seed)
        cfg = self.config
        self.phase = "setup/load-models"
        self.actor = fsdp.load_sharded_model(self.model_path, device=self.device, compute_dtype=cfg.model.dtype,
                                             gradient_checkpointing=cfg.model.gradient_checkpointing)
        self.optimizer = torch.optim.AdamW(self.actor.parameters(), lr=cfg.actor.lr, betas=cfg.actor.betas,
                                           weight_decay=cfg.actor.weight_decay)
        updates_per_step = cfg.data.train_batch_size // cfg.actor.mini_batch_size * cfg.actor.ppo_epochs
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, fsdp.lr_lambda(
            cfg.actor.warmup_steps, (cfg.trainer.total_steps - cfg.critic.warmup_steps) * updates_per_step,
            cfg.actor.lr_schedule))  # critic warm-up steps do not update the actor
        # The reference is always the base model on disk, so a resumed run keeps the original anchor.
        self.ref = fsdp.load_sharded_model(self.model_path, device=self.device, compute_dtype=cfg.model.dtype) \
            if cfg.needs_reference else None
        if self.ref is not None:
            self.ref.eval().requires_grad_(False)
        self.reward_model = RewardModel(
            resolve_model_path(cfg.reward_model.path), device=self.device, max_length=cfg.reward_model.max_length,
            micro_batch_size=cfg.reward_model.micro_batch_size) if cfg.reward_model.path else None
        self.phase = "setup/rollout-engine"
        self.engine = make_engine(
            cfg.rollout.name, self.model_path, dtype=cfg.model.dtype, seed=cfg.trainer.seed + self.rank,
            max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length, device=self.device,
            gpu_memory_utilization=cfg.rollout.gpu_memory_utilization, enforce_eager=cfg.rollout.enforce_eager,
            max_num_seqs=cfg.rollout.max_num_seqs)
        self.phase = "idle"
        return {"rank": self.rank, "shards": fsdp.shard_numels(self.actor)}

    def _seed(self, seed: int) -> None:
        random.seed(seed + self.rank)
        np.random.seed(seed + self.rank)
        torch.manual_seed(seed + self.rank)

    # -- rollout ------------------------------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[RolloutSample]:
        self.phase = "generate"
        self.engine.wake_up()
        samples = self.engine.generate(prompts, sampling)
        self.engine.sleep()
        self.phase = "idle"
        return samples

    def sync_weights(self) -> dict[str, float]:
        """Stream full tensors from the FSDP2 shards into the engine, one parameter at a time."""
        self.phase = "sync_weights"
        start, moved = time.perf_counter(), 0
        self.engine.wake_up()

        def weights():
            nonlocal moved
            for name, tensor in fsdp.full_state_items(self.actor):
                moved += tensor.numel() * tensor.element_size()
                yield name, tensor

        self.engine.load_weights(weights())
        self.engine.sleep()
        self.phase = "idle"
        return {"sync/bytes": float(moved), "sync/seconds": time.perf_counter() - start}

    # -- passes over a batch ------------------------------------------------------------
    @torch.no_grad()
    def reward_model_scores(self, batch: Batch) -> torch.Tensor:
        """The reward model's score of each (prompt + response) in this worker's shard."""
        self.phase = "reward_model"
        mask = batch["attention_mask"].bool()
        sequences = [ids[row_mask].tolist() for ids, row_mask in zip(batch["input_ids"], mask)]
        scores = self.reward_model.score(sequences).float().cpu()
        self.phase = "idle"
        return scores


    @torch.no_grad()
    def compute_log_probs(self, batch: Batch, which: str = "actor") -> dict[str, torch.Tensor]:
        """Per-token log-probs (and entropy, for the actor) of the batch's responses."""
        self.phase = f"log_probs/{which}"
        model = self.actor if which == "actor" else self.ref
        log_probs = torch.zeros(batch["responses"].shape)
        entropy = torch.zeros(batch["responses"].shape)
        row = 0
        for mb in fsdp.split_micro_batches(batch, self.config.actor.micro_batch_tokens):
            trimmed, width = fsdp.trim_padding(mb.to(self.device))
            logits = fsdp.response_logits(model, trimmed, width)
            r = logits.shape[1]
            log_probs[row:row + len(mb), :r] = fsdp.token_log_probs(logits, trimmed["responses"],
                                                                    self.config.rollout.temperature).cpu()
            if which == "actor":
                entropy[row:row + len(mb), :r] = entropy_from_logits(logits.float()).cpu()
            row += len(mb)
        mask = batch["response_mask"]
        self.phase = "idle"
        return {"log_probs": log_probs * mask, "entropy": entropy * mask}

    def update_actor(self, minibatches: list[Batch], norms: list[dict[str, float]]) -> dict[str, float]:
        """One optimizer step per mini-batch; `norms` are the whole mini-batch's token/sequence counts.

        Metrics are token-weighted over every rank's micro-batches (one all-reduce at the end),
        so each worker returns the same global numbers.
        """
        self.phase = "update_actor"
        self.actor.train()
        sums: dict[str, torch.Tensor] = {}
        for minibatch, norm in zip(minibatches, norms):
            self.optimizer.zero_grad(set_to_none=True)
            for mb in fsdp.split_micro_batches(minibatch, self.config.actor.micro_batch_tokens):
                for key, value in self._micro_step(mb, norm).items():
                    sums[key] = sums.get(key, 0.0) + value
            grad_norm = torch.nn.utils.clip_grad_norm_(self.actor.parameters(), self.config.actor.grad_clip)
            grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm
            sums["grad_norm"] = sums.get("grad_norm", 0.0) + grad_norm.detach().float().cpu() / self.world_size
            self.optimizer.step()
            self.scheduler.step()
        keys = sorted(sums)
        packed = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64) for k in keys])
        dist.all_reduce(packed)
        totals = dict(zip(keys, packed.tolist()))
        tokens = totals.pop("tokens")
        out = {f"actor/{k}": v / len(minibatches) for k, v in totals.items() if k in ("grad_norm", "pg_loss", "kl_loss")}
        out.update({f"actor/{k}": v / tokens for k, v in totals.items() if f"actor/{k}" not in out})
        out["actor/lr"] = self.scheduler.get_last_lr()[0]
        self.phase = "idle"
        return out

    def _micro_step(self, mb: Batch, norm: dict[str, float]) -> dict[str, torch.Tensor]:
        """Forward/backward of one micro-batch; returns sums to aggregate across micro-batches and ranks."""
        cfg = self.config.actor
        trimmed, width = fsdp.trim_padding(mb.to(self.device))
        logits = fsdp.response_logits(self.actor, trimmed, width)
        mask = trimmed["response_mask"].float()
        log_probs = fsdp.token_log_probs(logits, trimmed["responses"], self.config.rollout.temperature)
        per_token, pg_metrics = policy_loss(
            cfg.policy_loss, log_probs, trimmed["old_log_probs"], trimmed["advantages"], mask,
            clip_ratio_low=cfg.clip_ratio_low, clip_ratio_high=cfg.clip_ratio_high, clip_ratio_c=cfg.clip_ratio_c)
        agg = dict(global_num_tokens=norm["num_tokens"], global_num_seqs=norm["num_seqs"],
                   norm_length=self.config.data.max_response_length)
        loss = aggregate_loss(per_token, mask, cfg.loss_agg_mode, **agg)
        tokens = mask.sum().detach().cpu()
        sums = {"pg_loss": loss.detach().cpu(), "tokens": tokens}
        sums.update({k: torch.as_tensor(v).detach().cpu() * tokens for k, v in pg_metrics.items()})
        if cfg.entropy_coeff > 0:
            entropy = entropy_from_logits(logits.float())
            loss = loss - cfg.entropy_coeff * aggregate_loss(entropy, mask, cfg.loss_agg_mode, **agg)
        if cfg.use_kl_loss:
            kl_loss = aggregate_loss(kl_estimate(log_probs, trimmed["ref_log_probs"], cfg.kl_loss_type), mask,
                                     cfg.loss_agg_mode, **agg)
            loss = loss + cfg.kl_loss_coef * kl_loss
            sums["kl_loss"] = kl_loss.detach().cpu()
        # FSDP2 averages gradients over ranks; the normalisers are already global, so undo it.
        (loss * self.world_size).backward()
        return sums

    # -- checkpoints (collective: every rank calls with the same folder) -----------------
    def save_checkpoint(self, folder: str) -> None:
        self.phase = "save_checkpoint"
        checkpoint_shards.save_shards(folder, self.rank, model=self.actor, optimizer=self.optimizer,
                                      scheduler=self.scheduler)
        self.phase = "idle"

    def load_checkpoint(self, folder: str) -> None:
        """The actor, its optimizer, LR schedule and RNG; the reference stays the base model."""
        self.phase = "load_checkpoint"
        checkpoint_shards.load_shards(folder, self.rank, model=self.actor, optimizer=self.optimizer,
                                      scheduler=self.scheduler)
        self.phase = "idle"

    # -- test and debugging hooks -------------------------------------------------------
    @torch.no_grad()
    def policy_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The actor's full logits for `input_ids` (for checking exported weights)."""
        self.actor.eval()
        return self.actor(input_ids=input_ids.to(self.device), use_cache=False).logits.float().cpu()

    def engine_log_probs(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        """The engine's log-probs of given continuations (for checking the weight sync)."""
        return self.engine.score(sequences, prompt_len)
