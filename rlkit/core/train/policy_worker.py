"""The policy worker: one per device, a Ray actor holding its FSDP2 shard of the actor (and
reference), and a rollout engine in the same process that is synced after every update."""

from __future__ import annotations

import functools
import os
import random
import socket
import time
from contextlib import nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rlkit.core.agents.worker import AgentEpisodes
from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.kl import kl_estimate
from rlkit.core.algos.losses import aggregate_loss, rollout_importance_weights
from rlkit.core.algos.update_inputs import UpdateInputs
from rlkit.core.batch import Batch
from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.cluster.phases import in_phase
from rlkit.core.cluster.weight_transfer import TensorSpec, TransferGroup, WeightSender
from rlkit.core.rewards.reward_model import RewardModel
from rlkit.core.rollout.base import RolloutSample, Sampling
from rlkit.core.rollout.engines import make_engine
from rlkit.core.rollout.sync_check import SyncProbe
from rlkit.core.state import shards as checkpoint_shards
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.train import fast_paths, fsdp, packing
from rlkit.core.train.learner import micro_batches, optimize
from rlkit.core.train.logprobs import selected_log_probs
from rlkit.core.train.model import build_policy
from rlkit.core.train.offline_worker import OfflineUpdates


class PolicyWorker(DeviceWorker, AgentEpisodes, OfflineUpdates):
    """Rank `rank` of the training group. Method names are the controller's phases (`agent_episodes`:
    multi-turn rollout, rlkit.core.agents.worker; `update_offline`: objective sft,
    rlkit.core.train.offline_worker)."""

    # -- set-up -------------------------------------------------------------------------
    @functools.cached_property
    def algorithm(self) -> Algorithm:
        """What the update computes: the policy loss with its options, resolved once, and its terms."""
        return Algorithm.from_config(self.config)

    def node_info(self) -> dict[str, Any]:
        import ray

        return {
            "rank": self.rank,
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "phase": self.phase,
            "node_id": ray.get_runtime_context().get_node_id(),
        }

    def setup(self, master_addr: str, master_port: int, with_engine: bool = True) -> dict[str, Any]:
        """Load the models and start the rollout engine (`with_engine=False`: `rlkit replay` and offline
        objectives only update)."""
        self.join_process_group(master_addr, master_port)
        self._seed(self.config.trainer.seed)
        cfg = self.config
        with self.reporting("setup/load-models"):
            self.dtype = fsdp.compute_dtype(cfg.model.dtype, self.device)
            self.model = build_policy(cfg, self.model_path, self.device)
            self.reward_model = (
                RewardModel(
                    resolve_model_path(cfg.reward_model.path),
                    device=self.device,
                    max_length=cfg.reward_model.max_length,
                    micro_batch_size=cfg.reward_model.micro_batch_size,
                )
                if cfg.reward_model.path
                else None
            )
            # Sized before the engine takes its share: during the update the engine sleeps.
            self.fast_paths = fast_paths.resolve(cfg, self.device.type, sized=self._size_micro_batches())
        with self.reporting("setup/rollout-engine"):
            # Split placement: rollout workers on other devices hold the engine (rlkit.core.cluster.placement).
            self.engine = (
                make_engine(
                    cfg,
                    self.model_path,
                    device=self.device,
                    dtype=self.dtype,
                    seed=cfg.trainer.seed + self.rank,
                    sleep_mode=True,
                )
                if cfg.rollout.placement == "colocated" and with_engine
                else None
            )
            self.sync_probe = SyncProbe()
        return {"rank": self.rank, "shards": fsdp.shard_numels(self.model.module), "fast_paths": self.fast_paths}

    def _size_micro_batches(self) -> tuple[int, float] | None:
        """actor.micro_batch_tokens=auto on a GPU: (the budget all ranks agree on, this rank's free GiB)."""
        cfg = self.config
        if cfg.actor.micro_batch_tokens != "auto" or not self.use_cuda:
            return None
        free, total = torch.cuda.mem_get_info(self.device)
        module = self.model.module
        numels = fsdp.shard_numels(module)
        trainable = sum(numels[name][0] for name, param in module.named_parameters() if param.requires_grad)
        per_token = fast_paths.activation_bytes_per_token(
            module.config, fsdp.DTYPES[self.dtype].itemsize, cfg.model.gradient_checkpointing
        )
        tokens = fast_paths.auto_micro_batch_tokens(
            free_bytes=free,
            total_bytes=total,
            trainable_params=trainable,
            critic_params=sum(local for local, _ in numels.values()) if self.algorithm.critic else 0,  # same shape
            bytes_per_token=per_token,
            longest_sequence=(cfg.data.max_prompt_length + cfg.data.max_response_length) * cfg.micro_batch_group,
        )
        agreed = torch.tensor([tokens], device=packing.collective_device())
        dist.all_reduce(agreed, op=dist.ReduceOp.MIN)  # one budget for the run, the tightest rank's
        return int(agreed.item()), free / (1 << 30)

    def _seed(self, seed: int) -> None:
        random.seed(seed + self.rank)
        np.random.seed(seed + self.rank)
        torch.manual_seed(seed + self.rank)

    # -- rollout ------------------------------------------------------------------------
    @in_phase("generate")
    def generate(self, prompts: list[list[int]], sampling: Sampling) -> list[RolloutSample]:
        self.wake_engine()
        samples = self.engine.generate(prompts, sampling)
        self.sync_probe.record(prompts, samples)
        self.engine.sleep()
        return samples

    @in_phase("sync_weights")
    def sync_weights(self) -> dict[str, float]:
        """Stream full tensors from the FSDP2 shards into the engine, one parameter at a time."""
        start, moved = time.perf_counter(), 0
        # A checked sync scores a sequence before and after loading: the whole engine must be awake.
        self.wake_engine(weights_only=not self.sync_probe.pending)

        def weights():
            nonlocal moved
            for name, tensor in self.model.engine_weights():
                moved += tensor.numel() * tensor.element_size()
                yield name, tensor

        checked = self.sync_probe.load(self.engine, weights(), fsdp.DTYPES[self.dtype])
        # The engine stays awake (weights only, no KV cache) until the next rollout's generate.
        return {"sync/bytes": float(moved), "sync/seconds": time.perf_counter() - start, **checked}

    @in_phase("export_weights")
    def export_weights(self, bucket_bytes: int) -> list | None:
        """Split placement: full tensors in the rollout dtype, in object-store buckets (rank 0 returns their refs).

        Every rank must take part (gathering a full tensor is a collective); rollout workers
        then fetch the buckets straight from the object store.
        """
        import ray

        refs, bucket, size = [], [], 0
        for name, tensor in self.model.engine_weights():
            if self.rank == 0:
                bucket.append((name, tensor.to(fsdp.DTYPES[self.dtype]).cpu()))
                size += bucket[-1][1].numel() * bucket[-1][1].element_size()
                if size >= bucket_bytes:
                    refs.append(ray.put(bucket))
                    bucket, size = [], 0
        if bucket:
            refs.append(ray.put(bucket))
        return refs if self.rank == 0 else None

    # -- weights to the rollout workers over a collective (split placement) -------------
    def weight_specs(self) -> list[TensorSpec]:
        """Every weight's name and full shape, in the order send_weights gathers them (no collective)."""
        return [TensorSpec(name, shape) for name, shape in self.model.engine_weight_shapes()]

    def join_weight_transfer(
        self, host: str, port: int, world_size: int, specs: list[TensorSpec], bucket_bytes: int
    ) -> None:
        """Rank 0 joins the rollout workers' transfer group (as its rank 0); the other ranks only help gather."""
        if self.rank == 0:
            timeouts = self.config.trainer.phase_timeout_s, self.config.rollout.weight_sync_timeout_s
            group = TransferGroup(
                host, port, 0, world_size, self.device, handshake_timeout_s=timeouts[0], transfer_timeout_s=timeouts[1]
            )
            self.weight_sender = WeightSender(group, specs, fsdp.DTYPES[self.dtype], bucket_bytes)

    @in_phase("send_weights")
    def send_weights(self) -> None:
        """Gather the full tensors (every rank); rank 0 stages them and broadcasts them in the background."""
        items = self.model.engine_weights()
        if self.rank == 0:
            self.weight_sender.send(items)
        else:
            for _ in items:  # each gather is a collective: every rank takes part
                pass

    # -- passes over a batch ------------------------------------------------------------
    @torch.no_grad()
    @in_phase("reward_model")
    def reward_model_scores(self, batch: Batch) -> torch.Tensor:
        """The reward model's score of each (prompt + response) in this worker's shard."""
        mask = batch["attention_mask"].bool()
        sequences = [ids[row_mask].tolist() for ids, row_mask in zip(batch["input_ids"], mask)]
        scores = self.reward_model.score(sequences).float().cpu()
        return scores

    @torch.no_grad()
    def compute_log_probs(self, batch: Batch, which: str = "actor") -> dict[str, torch.Tensor]:
        """Per-token log-probs (and entropy, for the actor) of the batch's responses."""
        with self.reporting(f"log_probs/{which}"):
            self.model.module.eval()  # the update switches it back to train()
            log_probs = torch.zeros(batch["responses"].shape)
            entropy = torch.zeros(batch["responses"].shape)
            with self.model.reference() if which == "ref" else nullcontext(self.model.module) as model:
                for rows in micro_batches(batch, self.fast_paths.micro_batch_tokens):
                    packed = packing.pack(batch.select(rows)).to(self.device)
                    logits = fsdp.packed_outputs(model, packed)
                    lp, ent = selected_log_probs(
                        logits, packed.targets, self.config.log_prob_temperature, with_entropy=which == "actor"
                    )
                    log_probs[rows] = packed.scatter(lp).cpu()
                    entropy[rows] = packed.scatter(ent).cpu()
            mask = batch["response_mask"]
        return {"log_probs": log_probs * mask, "entropy": entropy * mask}

    @in_phase("update_actor")
    def update_actor(
        self, minibatches: list[Batch], norms: list[dict[str, float]], inputs: UpdateInputs
    ) -> dict[str, float]:
        """One optimizer step per mini-batch; `norms` are the whole mini-batch's token/sequence counts;
        `inputs` what the loss reads (rlkit.core.algos.update_inputs).

        Metrics are global (rlkit.core.train.learner): every worker returns the same numbers.
        """
        cfg = self.config.actor
        micro_step = functools.partial(self._micro_step, inputs=inputs)
        totals = optimize(
            self.model,
            minibatches,
            norms,
            micro_step,
            grad_clip=cfg.grad_clip,
            micro_batch_tokens=self.fast_paths.micro_batch_tokens,
            per_update=("pg_loss", "kl_loss"),
        )
        return {k if "/" in k else f"actor/{k}": v for k, v in totals.items()}

    def _micro_step(
        self, mb: Batch, norm: dict[str, float], *, inputs: UpdateInputs
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The loss of one micro-batch, and metric sums to aggregate across micro-batches and ranks."""
        algorithm = self.algorithm
        packed = packing.pack(mb).to(self.device)
        mb = mb.to(self.device)
        old_from_here = inputs.old_log_probs_from_update
        logits = fsdp.packed_outputs(self.model.module, packed)
        with_entropy = "entropy" in algorithm.loss_terms or old_from_here
        flat_log_probs, flat_entropy = selected_log_probs(
            logits, packed.targets, self.config.rollout.temperature, with_entropy=with_entropy
        )
        log_probs = packed.scatter(flat_log_probs)
        old_log_probs = log_probs.detach() if old_from_here else mb["old_log_probs"]
        mask = mb["response_mask"].float()
        per_token, pg_metrics = algorithm.policy_loss(log_probs, old_log_probs, mb["advantages"], mask)
        correction = inputs.rollout_correction  # (level, cap), or None
        if correction is not None:
            weights = rollout_importance_weights(
                old_log_probs, mb["rollout_log_probs"], correction[1], level=correction[0], response_mask=mask
            )
            per_token = per_token * weights
            pg_metrics["rollout_is_weight"] = (weights * mask).sum() / mask.sum().clamp(min=1)
        agg = dict(
            global_num_tokens=norm["num_tokens"],
            global_num_seqs=norm["num_seqs"],
            norm_length=self.config.data.max_response_length,
        )
        loss = aggregate_loss(per_token, mask, algorithm.loss_agg_mode, **agg)
        tokens = mask.sum().detach().cpu()
        sums = {"pg_loss": loss.detach().cpu(), "tokens": tokens}
        sums.update({k: torch.as_tensor(v).detach().cpu() * tokens for k, v in pg_metrics.items()})
        entropy = packed.scatter(flat_entropy)
        if old_from_here:  # what the old-log-prob pass would have reported, token sums
            sums["entropy"] = (entropy.detach() * mask).sum().cpu()
            if inputs.rollout_log_probs:  # the engine returned them this step (rollout.log_prob_check_freq)
                sums["rollout/log_prob_diff"] = ((mb["rollout_log_probs"] - old_log_probs).abs() * mask).sum().cpu()
            if inputs.reference:
                sums["kl_ref"] = (kl_estimate(old_log_probs, mb["ref_log_probs"], "k1") * mask).sum().cpu()
        if "entropy" in algorithm.loss_terms:
            loss = loss - algorithm.entropy_coeff * aggregate_loss(entropy, mask, algorithm.loss_agg_mode, **agg)
        if inputs.reference:
            kl = kl_estimate(log_probs, mb["ref_log_probs"], algorithm.kl_loss_type)
            kl_loss = aggregate_loss(kl, mask, algorithm.loss_agg_mode, **agg)
            loss = loss + algorithm.kl_loss_coef * kl_loss
            sums["kl_loss"] = kl_loss.detach().cpu()
        return loss, sums

    # -- checkpoints (collective: every rank calls with the same folder) -----------------
    @in_phase("save_checkpoint")
    def save_checkpoint(self, folder: str) -> None:
        checkpoint_shards.save_shards(
            folder, self.rank, model=self.model.module, optimizer=self.model.optimizer, scheduler=self.model.scheduler
        )

    @in_phase("load_checkpoint")
    def load_checkpoint(self, folder: str) -> None:
        """The actor, its optimizer, LR schedule and RNG; the reference stays the base model."""
        checkpoint_shards.load_shards(
            folder, self.rank, model=self.model.module, optimizer=self.model.optimizer, scheduler=self.model.scheduler
        )

    # -- test and debugging hooks -------------------------------------------------------
    @torch.no_grad()
    def policy_logits(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The actor's full logits for `input_ids` (for checking exported weights)."""
        self.model.module.eval()
        return self.model.module(input_ids=input_ids.to(self.device), use_cache=False).logits.float().cpu()

    def engine_log_probs(self, sequences: list[list[int]], prompt_len: int) -> list[list[float]]:
        """The engine's log-probs of given continuations (for checking the weight sync)."""
        return self.engine.score(sequences, prompt_len)
