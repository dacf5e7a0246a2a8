"""The one place that builds what a worker trains: the sharded model, its optimizer and schedule.

`build_policy` and `build_critic` load the model, shard it (FSDP2, rlkit.core.train.fsdp),
and give it an AdamW over its trainable parameters. Anything that changes the model's
structure (LoRA adapters, rlkit.core.train.adapters) is applied here, before `fully_shard`,
so that every consumer (the update, the log-prob passes, the weight sync, checkpoints)
sees one `TrainableModel`.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator

import torch

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.train import adapters, fast_paths, fsdp
from rlkit.errors import ConfigError

if TYPE_CHECKING:
    from rlkit.recipes.actor_schema import ActorConfig, CriticConfig
    from rlkit.recipes.model_schema import ModelConfig


@dataclass
class TrainableModel:
    """A sharded model with the optimizer (and LR schedule) that trains it."""

    module: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler | None  # None: a constant learning rate
    base: torch.nn.Module | None = None  # a frozen copy of the base model, the reference of a KL term
    lora: bool = False  # `module` is a peft model whose adapters are the only trainable weights

    def trainable_parameters(self) -> list[torch.nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    @property
    def learning_rate(self) -> float:
        """The rate of the last optimizer step (the schedule has already advanced it)."""
        return self.optimizer.param_groups[0]["lr"]

    @contextmanager
    def reference(self) -> Iterator[torch.nn.Module]:
        """The reference policy: the base model, never trained (so a resumed run keeps the original anchor).

        With LoRA that is the trained module itself with its adapters off: no second model in memory.
        """
        if self.lora:
            with adapters.adapters_off(self.module) as module:
                yield module
            return
        if self.base is None:
            raise RuntimeError("this model was built without a reference (no KL term is configured)")
        yield self.base

    def engine_weight_shapes(self) -> list[tuple[str, tuple[int, ...]]]:
        """(HF name, full shape) of each tensor `engine_weights` yields, in its order, without gathering."""
        named = self.module.named_parameters()
        if self.lora:  # merged tensors have their base weight's shape
            return [(adapters.engine_name(n), tuple(p.shape)) for n, p in named if ".lora_" not in n]
        return [(n, tuple(p.shape)) for n, p in named]

    def engine_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """(HF name, full tensor) of every weight a rollout engine loads; a collective on every rank.

        With LoRA: the base model's names and weights, adapters merged in.
        """
        return adapters.merged_weights(self.module) if self.lora else fsdp.full_state_items(self.module)


def actor_updates(actor: ActorConfig, *, total_steps: int, train_batch_size: int, critic_warmup_steps: int) -> int:
    """The actor's optimizer steps over the run, the length of its LR schedule: mini-batches x epochs a step, on
    every step but the critic's warm-up (which does not update the actor)."""
    return (total_steps - critic_warmup_steps) * (train_batch_size // actor.mini_batch_size * actor.ppo_epochs)


def build_policy(
    model_config: ModelConfig,
    actor: ActorConfig,
    algorithm: Algorithm,
    model_path: str,
    device: torch.device,
    *,
    seed: int,
    total_updates: int,
) -> TrainableModel:
    """The actor, its AdamW and LR schedule over `total_updates` optimizer steps (`actor_updates`), and (when the
    algorithm has a reference) the frozen base model. `seed` initialises LoRA adapters.

    With model.lora.rank > 0 the actor is the base model with LoRA adapters, and only they train.
    """
    dtype = fsdp.compute_dtype(model_config.dtype, device)
    compile_layers = fast_paths.compile_enabled(model_config.compile, device.type)  # auto: on with CUDA
    model = fsdp.load_model(model_path, gradient_checkpointing=model_config.gradient_checkpointing)
    lora = model_config.lora.rank > 0
    if lora:
        model = adapters.add_lora(model, model_config.lora, seed=seed)
    problem = fsdp.fused_head_problem(model) if actor.fused_lm_head else None
    if problem:
        raise ConfigError(
            f"actor.fused_lm_head=true does not fit the model at {model_path}: {problem}; set actor.fused_lm_head=false"
        )
    module = fsdp.shard_model(model, device=device, compute_dtype=dtype, compile=compile_layers)
    optimizer = torch.optim.AdamW(
        [p for p in module.parameters() if p.requires_grad],
        lr=actor.lr,
        betas=actor.betas,
        weight_decay=actor.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, fsdp.lr_lambda(actor.warmup_steps, total_updates, actor.lr_schedule)
    )
    base = None
    if algorithm.reference and not lora:  # always the model on disk
        base = fsdp.shard_model(fsdp.load_model(model_path), device=device, compute_dtype=dtype, compile=compile_layers)
        base.eval().requires_grad_(False)
    return TrainableModel(module, optimizer, scheduler, base=base, lora=lora)


def build_critic(
    model_config: ModelConfig, critic: CriticConfig, model_path: str, device: torch.device, *, seed: int
) -> TrainableModel:
    """The value model: the policy's base model with a one-output head, and its AdamW (constant rate).

    Every rank must build the same freshly initialised head before sharding it, so the head's
    initialisation draws from `seed` (trainer.seed) on every rank.
    """
    torch.manual_seed(seed)
    model = fsdp.load_model(model_path, value_head=True, gradient_checkpointing=model_config.gradient_checkpointing)
    module = fsdp.shard_model(model, device=device, compute_dtype=fsdp.compute_dtype(model_config.dtype, device))
    optimizer = torch.optim.AdamW(module.parameters(), lr=critic.lr)
    return TrainableModel(module, optimizer, scheduler=None)
