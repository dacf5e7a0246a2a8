"""The policy worker: one per training device, a Ray actor (or an in-process object) composing the roles
that work on the policy there, in one process.

- `actor` (rlkit.core.train.actor): the FSDP2 shard of the actor with its optimizer; its log-probs,
  the RL and offline updates, the checkpoint;
- `scoring` (rlkit.core.train.scoring): the reference's log-probs and the reward model's scores;
- `generation` (rlkit.core.rollout.generator; colocated placement only): the rollout engine, fed the
  actor's weights after every update (`sync_weights`);
- `weights` (rlkit.core.train.weight_export; split placement): the actor's weights out to the rollout
  workers on other devices.

The class body lists the calls the controller makes, each served by one role (rlkit.core.cluster.roles):
the controller names the role's function (`workers.call(Actor.update_actor, ...)`). The worker is its
process's composition root: it holds the run's config and builds each role from the sections that role
reads.
"""

from __future__ import annotations

import os
import random
import socket
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.cluster.device_worker import DeviceWorker
from rlkit.core.cluster.roles import serve
from rlkit.core.rewards.reward_model import RewardModel
from rlkit.core.rollout.engines import BesideStart
from rlkit.core.rollout.generator import Generator
from rlkit.core.state.run_dir import resolve_model_path
from rlkit.core.train import fast_paths, fsdp, packing, warmup
from rlkit.core.train.actor import Actor
from rlkit.core.train.model import TrainableModel, actor_updates, build_policy
from rlkit.core.train.scoring import Scoring
from rlkit.core.train.weight_export import WeightExport

FP32_BYTES = 4  # the master weights, gradients and AdamW's moments


class PolicyWorker(DeviceWorker):
    """Rank `rank` of the training group: its roles, built by `setup`."""

    actor: Actor
    scoring: Scoring
    generation: Generator | None  # None: split placement (rollout workers generate), or set up without an engine
    weights: WeightExport

    generate = serve("generation", Generator.generate)
    generate_scored = serve("generation", Generator.generate_scored)
    agent_episodes = serve("generation", Generator.agent_episodes)
    validation_episodes = serve("generation", Generator.validation_episodes)
    engine_log_probs = serve("generation", Generator.engine_log_probs)
    sync_weights = serve("generation", Generator.sync_weights)
    weight_specs = serve("weights", WeightExport.weight_specs)
    join_weight_transfer = serve("weights", WeightExport.join_weight_transfer)
    export_weights = serve("weights", WeightExport.export_weights)
    send_weights = serve("weights", WeightExport.send_weights)
    actor_log_probs = serve("actor", Actor.actor_log_probs)
    update_actor = serve("actor", Actor.update_actor)
    update_offline = serve("actor", Actor.update_offline)
    evaluate_offline = serve("actor", Actor.evaluate_offline)
    save_checkpoint = serve("actor", Actor.save_checkpoint)
    load_checkpoint = serve("actor", Actor.load_checkpoint)
    policy_logits = serve("actor", Actor.policy_logits)
    reference_log_probs = serve("scoring", Scoring.reference_log_probs)
    reward_model_scores = serve("scoring", Scoring.reward_model_scores)

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
        objectives only update). A colocated engine starts while the models load and the compile warm-up runs,
        where it can have that company (rlkit.core.rollout.engines.BesideStart; docs/startup.md)."""
        began = time.perf_counter()
        self.join_process_group(master_addr, master_port)
        self._seed(self.config.trainer.seed)
        cfg = self.config
        startup = {"process_group": time.perf_counter() - began}  # the parts the controller's start-up table shows
        # The device as this process found it, before any model (its own cached blocks count as free): the
        # micro-batch budget is this less what the load holds, so that engines starting meanwhile on the device
        # (beside the load) do not count against it.
        self._free_at_start = 0
        if self.use_cuda:
            self._free_at_start = torch.cuda.mem_get_info(self.device)[0] + torch.cuda.memory_reserved(self.device)
        self.generation = None
        if not (cfg.rollout.placement == "colocated" and with_engine):
            # Split placement: rollout workers on other devices hold the engine (rlkit.core.controller.placement),
            # starting it meanwhile: the load and the warm-up run now.
            self._load_models(startup)
            self._warm_up(startup, beside=False)
            return self._setup_result(startup)
        dtype = fsdp.compute_dtype(cfg.model.dtype, self.device)
        handed = None
        if cfg.reward_model.path:  # its size is not known before its load: the load runs before the start
            self._load_models(startup)
            self._warm_up(startup, beside=False)
        else:
            models, warm_up = self._load_bytes(dtype)
            handed = BesideStart(
                lambda beside: self._warm_up(startup, beside=beside),
                models + warm_up,
                "the trainer's model load" + (" and compile warm-up" if self._compiles() else ""),
                prelude=lambda: self._load_models(startup),
                prelude_bytes=models,
            )
        with self.reporting("setup/rollout-engine"):
            began = time.perf_counter()
            self.generation = Generator.start(
                self,
                cfg,
                self.model_path,
                device=self.device,
                dtype=dtype,
                seed=cfg.trainer.seed + self.rank,
                sleep_mode=True,
                weights=lambda: self.actor.model.engine_weights(),  # the actor is loaded by then (maybe beside)
                beside_start=handed,
            )
            self._release_cached()  # what the load and the warm-up held beside the engine's start
            seconds = time.perf_counter() - began
            if handed is not None and not handed.ran_beside:  # it ran before the start, alone: not the engine's time
                seconds -= startup["model_load"] + startup.get("compile_warmup", 0.0)
            startup.update(rollout_engine_start=seconds, **self.generation.engine.start_parts())
        return self._setup_result(startup)

    def _setup_result(self, startup: dict[str, float]) -> dict[str, Any]:
        shards = fsdp.shard_numels(self.actor.model.module)
        self.freeze_heap()
        paths = self.actor.fast_paths
        return {"rank": self.rank, "shards": shards, "fast_paths": paths, "startup": startup}

    def _load_models(self, startup: dict[str, float]) -> None:
        """The models and the roles on them (actor, scoring, weights) and the micro-batch budget; its seconds in
        `startup` (`model_load`)."""
        began = time.perf_counter()
        cfg = self.config
        with self.reporting("setup/load-models"):
            dtype = fsdp.compute_dtype(cfg.model.dtype, self.device)
            algorithm = Algorithm.from_config(cfg)
            updates = actor_updates(
                cfg.actor,
                total_steps=cfg.trainer.total_steps,
                train_batch_size=cfg.data.train_batch_size,
                critic_warmup_steps=algorithm.critic_warmup_steps,
            )
            model = build_policy(
                cfg.model,
                cfg.actor,
                algorithm,
                self.model_path,
                self.device,
                seed=cfg.trainer.seed,
                total_updates=updates,
            )
            reward_model = (
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
            sized = self._size_micro_batches(model, dtype)
            paths = fast_paths.resolve(
                cfg.model, cfg.rollout, cfg.actor, self.device.type, sized=sized, with_engine=not cfg.offline
            )
            self.actor = Actor(
                self,
                model,
                self.rank,
                self.device,
                paths,
                actor=cfg.actor,
                algorithm=algorithm,
                objective=cfg.objective,
                temperature=cfg.log_prob_temperature,
                micro_batch_group=cfg.micro_batch_group,
                max_response_length=cfg.data.max_response_length,
                dpo=cfg.dpo,
            )
            self.scoring = Scoring(
                self,
                model,
                reward_model,
                self.device,
                paths.micro_batch_tokens,
                temperature=cfg.log_prob_temperature,
                fused_head=cfg.actor.fused_lm_head,
            )
            self.weights = WeightExport(
                self,
                model,
                self.rank,
                self.device,
                dtype,
                self.share,
                handshake_timeout_s=cfg.trainer.phase_timeout_s,
                transfer_timeout_s=cfg.rollout.weight_sync_timeout_s,
            )
        startup["model_load"] = time.perf_counter() - began

    def _warm_up(self, startup: dict[str, float], *, beside: bool) -> None:
        """With model.compile in an RL run, the passes' compile warm-up (rlkit.core.train.warmup); its seconds in
        `startup` (`compile_warmup`). `beside`: an engine is starting meanwhile (what the passes held stays
        cached for the caller to give back); else one may start next and measure the device's free memory, so
        it is given back now."""
        cfg = self.config
        algorithm = self.actor.algorithm
        if self._compiles():
            began = time.perf_counter()
            warmup.warm_up_passes(
                self.actor.model,
                self.device,
                temperature=cfg.log_prob_temperature,
                fused_head=cfg.actor.fused_lm_head,
                old_log_probs=not algorithm.old_log_probs_from_update,
                reference=algorithm.reference,
                entropy_grad="entropy" in algorithm.loss_terms,
            )
            startup["compile_warmup"] = time.perf_counter() - began
        if not beside:
            self._release_cached()

    def _compiles(self) -> bool:
        """model.compile in an RL run: the set-up runs the compile warm-up."""
        return fast_paths.compile_enabled(self.config.model.compile, self.device.type) and not self.config.offline

    def _load_bytes(self, dtype: str) -> tuple[int, int]:
        """What the load and the warm-up may hold on the device, before the models exist: (the models' fp32 weights,
        the policy's and the reference's where the algorithm has one; with model.compile the warm-up's peak beyond
        them, rlkit.core.train.warmup.warm_up_bytes), counted from the model built on the meta device. LoRA counts
        as a full fine-tune (its adapters' gradients are far fewer: an upper bound)."""
        if not self.use_cuda:
            return 0, 0
        cfg = self.config
        numels = warmup.meta_numels(self.model_path)
        world = dist.get_world_size()
        shard = sum(-(-n // world) for n in numels.values())  # FSDP2 pads each parameter's shard evenly
        models = 2 if Algorithm.from_config(cfg).reference and not cfg.model.lora.rank else 1
        held = models * shard * FP32_BYTES
        if not self._compiles():
            return held, 0
        itemsize = fsdp.DTYPES[dtype].itemsize
        config = warmup.meta_config(self.model_path)
        per_token = fast_paths.activation_bytes_per_token(config, itemsize, cfg.model.gradient_checkpointing)
        return held, warmup.warm_up_bytes(
            shard * FP32_BYTES,
            sum(numels.values()),
            activation_bytes_per_token=per_token,
            compute_dtype_bytes=itemsize,
        )

    def _release_cached(self) -> None:
        if self.use_cuda:
            torch.cuda.empty_cache()

    def _size_micro_batches(self, model: TrainableModel, dtype: str) -> tuple[int, float] | None:
        """actor.micro_batch_tokens=auto on a GPU: (the budget all ranks agree on, this rank's free GiB)."""
        cfg = self.config
        if cfg.actor.micro_batch_tokens != "auto" or not self.use_cuda:
            return None
        total = torch.cuda.mem_get_info(self.device)[1]
        # What this process found free less what it holds now (its models): engines starting meanwhile on the
        # device (beside the load) are not counted; during the update they sleep.
        free = self._free_at_start - torch.cuda.memory_reserved(self.device)
        module = model.module
        numels = fsdp.shard_numels(module)
        trainable = sum(numels[name][0] for name, param in module.named_parameters() if param.requires_grad)
        per_token = fast_paths.activation_bytes_per_token(
            module.config,
            fsdp.DTYPES[dtype].itemsize,
            cfg.model.gradient_checkpointing,
            fused_head=cfg.actor.fused_lm_head,
        )
        critic = Algorithm.from_config(cfg).critic
        tokens = fast_paths.auto_micro_batch_tokens(
            free_bytes=free,
            total_bytes=total,
            trainable_params=trainable,
            critic_params=sum(local for local, _ in numels.values()) if critic else 0,  # same shape
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
