"""`data.*` and `model.*`: what a run trains on and which model it starts from."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlkit.recipes.section import Section


class DataConfig(Section):
    train_files: list[str] = Field(
        default_factory=list,
        description="Parquet files of training prompts (see `rlkit prep-data`).",
    )
    val_files: list[str] = Field(
        default_factory=list,
        description="Parquet files of held-out prompts: validated before training (trainer.val_before_train), every "
        "trainer.val_freq steps and after the last step (docs/architecture.md, Validation).",
    )
    synthetic_task: str | None = Field(
        None,
        description="Built-in task (echo, succ, add) generated into the run dir when train_files is empty; with "
        "trainer.val_freq > 0 and no val_files, its test split is the validation set.",
    )
    train_batch_size: int = Field(
        16,
        ge=1,
        description="Prompts per RL step (before rollout.n samples each); objective sft: rows (sequences) per step; "
        "objective dpo: pairs per step.",
    )
    max_prompt_length: int = Field(
        512,
        ge=1,
        description="Longest prompt in tokens; longer ones error or are dropped (overlong_prompts). objective sft: a "
        "row's prompt + response must fit max_prompt_length + max_response_length; objective dpo: a "
        "pair's prompt + its longer response.",
    )
    max_response_length: int = Field(
        512,
        ge=1,
        description="Most tokens generated per response (objectives sft, dpo: see max_prompt_length).",
    )
    overlong_prompts: Literal["error", "filter"] = Field(
        "error",
        description="What to do with prompts over max_prompt_length (objective sft: rows over max_prompt_length + "
        "max_response_length; objective dpo: pairs whose prompt + longer response is over it): error "
        "names them and stops before the run starts; filter drops them with a warning that counts them.",
    )
    shuffle: bool = Field(True, description="Shuffle prompts each epoch (seeded by trainer.seed).")


class LoraSettings(Section):
    rank: int = Field(
        0,
        ge=0,
        description="LoRA rank r (peft); 0 = off, every weight trains. On: only the adapters train and are "
        "checkpointed, the reference policy is the base with adapters off (no second model in memory), "
        "and the rollout engine receives merged weights W + alpha/r * B @ A. The critic (PPO) always "
        "trains all its weights.",
    )
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator: the update is alpha / rank * B @ A.")
    dropout: float = Field(
        0.0,
        ge=0,
        lt=1,
        description="Dropout on the adapters' input in training forward passes (not in log-prob passes or the engine).",
    )
    target_modules: str | list[str] = Field(
        "all-linear",
        description="Modules that get adapters: peft's 'all-linear' (every linear layer but the output head) or a "
        "list of module names, e.g. [q_proj, v_proj].",
    )


class ModelConfig(Section):
    path: str = Field(
        "",
        description="Hub id or local directory of the policy (also `--model`). 'rlkit:tiny-qwen2' builds a tiny "
        "offline model.",
    )
    dtype: Literal["auto", "float32", "bfloat16"] = Field(
        "auto",
        description="Compute dtype of forward/backward and rollout (parameters and optimizer stay fp32); auto = "
        "bfloat16 on GPU, float32 on CPU.",
    )
    gradient_checkpointing: bool = Field(
        False,
        description="Recompute activations in backward: less memory, ~30% more compute.",
    )
    compile: bool | Literal["auto"] = Field(
        "auto",
        description="torch.compile each decoder layer and the log-prob kernels: the passes run fused (ref/update "
        "~40% instead of ~28% MFU on an H200, docs/benchmarks.md). The compile happens during set-up, in a "
        "warm-up of each pass on two short sequences, beside the rollout engine's start where it can be "
        "(docs/startup.md). auto = on with CUDA, off on CPU; false turns it off.",
    )
    lora: LoraSettings = Field(default_factory=LoraSettings)
