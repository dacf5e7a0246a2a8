"""The one typed schema of a run. Defaults live here, once; recipes state what differs.

Groups follow verl's names (`data`, `actor`, `rollout`, `algorithm`, `critic`, `trainer`)
so its users find their keys; `rlkit.recipes.aliases` maps verl's long spellings here.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from rlkit.recipes.agent_schema import AgentConfig
from rlkit.recipes.reward_schema import RewardConfig, RewardModelConfig

# The truncation of rollout importance weights when none is given (TIS's and verl's default).
DEFAULT_ROLLOUT_IS_CAP = 2.0


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DataConfig(Section):
    train_files: list[str] = Field(default_factory=list, description="Parquet files of training prompts (see `rlkit prep-data`).")
    val_files: list[str] = Field(default_factory=list, description="Parquet files of held-out prompts: validated before training (trainer.val_before_train), every trainer.val_freq steps and after the last step (docs/architecture.md, Validation).")
    synthetic_task: str | None = Field(None, description="Built-in task (echo, succ, add) generated into the run dir when train_files is empty; with trainer.val_freq > 0 and no val_files, its test split is the validation set.")
    train_batch_size: int = Field(16, ge=1, description="Prompts per RL step (before rollout.n samples each); objective sft: rows (sequences) per step; objective dpo: pairs per step.")
    max_prompt_length: int = Field(512, ge=1, description="Longest prompt in tokens; longer ones error or are dropped (overlong_prompts). objective sft: a row's prompt + response must fit max_prompt_length + max_response_length; objective dpo: a pair's prompt + its longer response.")
    max_response_length: int = Field(512, ge=1, description="Most tokens generated per response (objectives sft, dpo: see max_prompt_length).")
    overlong_prompts: Literal["error", "filter"] = Field("error", description="What to do with prompts over max_prompt_length (objective sft: rows over max_prompt_length + max_response_length; objective dpo: pairs whose prompt + longer response is over it): error names them and stops before the run starts; filter drops them with a warning that counts them.")
    shuffle: bool = Field(True, description="Shuffle prompts each epoch (seeded by trainer.seed).")


class LoraSettings(Section):
    rank: int = Field(0, ge=0, description="LoRA rank r (peft); 0 = off, every weight trains. On: only the adapters train and are checkpointed, the reference policy is the base with adapters off (no second model in memory), and the rollout engine receives merged weights W + alpha/r * B @ A. The critic (PPO) always trains all its weights.")
    alpha: float = Field(16.0, gt=0, description="LoRA scaling numerator: the update is alpha / rank * B @ A.")
    dropout: float = Field(0.0, ge=0, lt=1, description="Dropout on the adapters' input in training forward passes (not in log-prob passes or the engine).")
    target_modules: str | list[str] = Field("all-linear", description="Modules that get adapters: peft's 'all-linear' (every linear layer but the output head) or a list of module names, e.g. [q_proj, v_proj].")


class ModelConfig(Section):
    path: str = Field("", description="Hub id or local directory of the policy (also `--model`). 'rlkit:tiny-qwen2' builds a tiny offline model.")
    dtype: Literal["auto", "float32", "bfloat16"] = Field("auto", description="Compute dtype of forward/backward and rollout (parameters and optimizer stay fp32); auto = bfloat16 on GPU, float32 on CPU.")
    gradient_checkpointing: bool = Field(False, description="Recompute activations in backward: less memory, ~30% more compute.")
    compile: bool | Literal["auto"] = Field("auto", description="torch.compile each decoder layer and the log-prob kernels: the first step pays the compile, later ones run fused (ref/update passes ~40% instead of ~28% MFU on an H200, docs/benchmarks.md). auto = on with CUDA, off on CPU; false turns it off.")
    lora: LoraSettings = Field(default_factory=LoraSettings)


class VLLMOptions(Section):
    """`rollout.vllm.*`: options only the vLLM engine reads."""

    enforce_eager: bool | None = Field(None, description="Skip CUDA graphs/compile (faster start, slower decode); None = eager on CPU, CUDA graphs on GPU (2x the decode speed on an H200, ~1 min more start-up; docs/benchmarks.md). Was rollout.enforce_eager.")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Further `vllm.LLM` arguments, e.g. {async_scheduling: true}; arguments rlkit derives from its own keys are refused. Was rollout.engine_kwargs.")


class SGLangOptions(Section):
    """`rollout.sglang.*`: options only the SGLang engine reads."""

    attention_backend: str | None = Field(None, description="SGLang attention backend (its --attention-backend, e.g. fa3, flashinfer, triton); None = SGLang's choice on GPU, torch_native on CPU. Per-request seeds need one SGLang runs deterministically (fa3, fa4, flashinfer, triton).")
    deterministic: bool = Field(True, description="SGLang's deterministic inference on GPUs (its --enable-deterministic-inference). true: per-request seeds count, so rollouts repeat and a resumed run can be exact; SGLang then runs batch-invariant kernels (slower; Triton compiles them on first use, docs/benchmarks.md). false: SGLang's ordinary kernels, but the seeds are ignored, so rollouts are not reproducible and a resumed run is not bit-exact (the engine warns). On a CPU seeds are always ignored.")
    engine_kwargs: dict[str, Any] = Field(default_factory=dict, description="Further `sglang.Engine` arguments (its server arguments), e.g. {chunked_prefill_size: 4096}; arguments rlkit derives from its own keys are refused. Two defaults can be changed here: log_level (error) and disable_cuda_graph (false on GPUs), e.g. {log_level: info} to watch a slow engine start.")


class HFOptions(Section):
    """`rollout.hf.*`: options only the transformers `generate` engine reads."""

    batch_size: int = Field(512, ge=1, description="Sequences per `generate` call (memory: the KV cache of this many).")


class RolloutConfig(Section):
    name: str = Field("vllm", description="Generation engine, from the registry in rlkit/core/rollout/engines.py: vllm, sglang, or hf (transformers `generate`, the fallback that needs nothing more). Each engine's own options live under rollout.<name>.")
    n: int = Field(8, ge=1, description="Samples per prompt (the group size for GRPO/RLOO).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (1.0 keeps rollouts on-policy).")
    top_p: float = Field(1.0, gt=0, le=1, description="Nucleus sampling; < 1 makes the rollout policy differ from the trained one.")
    top_k: int = Field(-1, description="Top-k sampling; -1 disables.")
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1, description="Fraction of device memory the engine takes for weights + KV cache.")
    max_num_seqs: int = Field(256, ge=1, description="Sequences the engine decodes at once.")
    ignore_eos: bool = Field(False, description="Always generate data.max_response_length tokens, EOS or not (benchmarks with fixed shapes).")
    placement: Literal["colocated", "split"] = Field("colocated", description="colocated: every training worker also runs a rollout engine on its device (vLLM sleeps during training); split: rollout.devices devices run only rollout and receive the weights after each update.")
    devices: int = Field(1, ge=1, description="split placement: devices (of trainer.nnodes x trainer.n_gpus_per_node) that run only rollout; the rest train.")
    mode: Literal["sync", "one_step_off", "async"] = Field("sync", description="sync: each step generates its batch with the current policy, then trains on it. one_step_off: step k+1's batch is generated (with the policy before step k's update) while step k trains. async: the rollout workers run up to rollout.max_staleness batches ahead of the trainer. Both overlapping modes need rollout.placement=split and correct the staleness with importance weights (actor.rollout_is); docs/async.md.")
    max_staleness: int = Field(2, ge=1, description="rollout.mode=async: batches generated ahead of the trainer, so no trained sample is more than this many policy versions older than the policy being updated (one_step_off is 1).")
    weight_sync: Literal["broadcast", "object_store"] = Field("broadcast", description="split placement: how the weights travel from training rank 0 to the rollout workers after each update. broadcast: a collective of their own (NCCL on GPUs, gloo on CPU), full tensors in flat buckets. object_store: through Ray's object store (slower; no extra communicator).")
    weight_sync_timeout_s: float = Field(300.0, gt=0, description="split placement: deadline of one weight transfer once both sides have joined it; a transfer that stalls past it stops the run with a message naming it.")
    log_prob_check_freq: int = Field(10, ge=0, description="Every this many steps the engine also returns the log-prob of each sampled token, and rollout/log_prob_diff (mean |engine - trainer|) checks the weight sync and the engine's numerics; 0 = never (but step 1, for the step-1 invariants, unless trainer.invariants=off). Not every step: vLLM decodes at half speed while returning them (docs/benchmarks.md). actor.old_log_probs=rollout takes them on every step.")
    log_prob_tolerance: float = Field(0.05, gt=0, description="Weight-sync check: the most rollout/log_prob_diff (mean |engine - trainer| log-prob per token, nats) a check step may show; more means the engine is not running the trained weights. Measured: ~1e-7 on CPU (fp32), 0.008 with vLLM bf16 on an H200. Not applied with rollout.top_p < 1 or top_k > 0, or with rollout.mode one_step_off/async (stale samples), where the two differ by design.")
    sync_check: Literal["error", "warn"] = Field("error", description="What a failed weight-sync check does (log-prob gap over rollout.log_prob_tolerance, or the first sync that changed the weights left the engine's outputs unchanged): error stops the run with the reason; warn logs it and trains on.")
    vllm: VLLMOptions = Field(default_factory=VLLMOptions)
    sglang: SGLangOptions = Field(default_factory=SGLangOptions)
    hf: HFOptions = Field(default_factory=HFOptions)
    agent: AgentConfig = Field(default_factory=AgentConfig, description="Multi-turn episodes: tools, environments (rlkit/recipes/agent_schema.py, docs/agents.md).")


class ActorConfig(Section):
    lr: float = Field(1e-6, gt=0, description="AdamW learning rate.")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay.")
    betas: tuple[float, float] = Field((0.9, 0.999), description="AdamW betas.")
    warmup_steps: int = Field(0, ge=0, description="Linear LR warm-up, in optimizer steps.")
    lr_schedule: Literal["constant", "cosine"] = Field("constant", description="LR after warm-up.")
    mini_batch_size: int = Field(16, ge=1, description="Prompts per optimizer step (global); with rollout.n samples each. objective sft: rows per optimizer step; objective dpo: pairs per optimizer step (a multiple of the workers: each holds whole pairs).")
    ppo_epochs: int = Field(1, ge=1, description="Passes over each step's batch.")
    micro_batch_tokens: Annotated[int, Field(ge=1)] | Literal["auto"] = Field("auto", description="Per-device token budget of one forward/backward (performance only, never the math). auto = on GPUs, sized at start-up from the memory free once the models are loaded (at most 65536, at least one full-length sequence; printed at start-up); 16384 on CPU.")
    grad_clip: float = Field(1.0, gt=0, description="Global gradient-norm clip.")
    policy_loss: str = Field("vanilla", description="Registered policy loss: vanilla (PPO clip), gspo.")
    clip_ratio_low: float = Field(0.2, ge=0, description="PPO clip: ratio lower bound is 1 - clip_ratio_low.")
    clip_ratio_high: float = Field(0.2, ge=0, description="PPO clip: ratio upper bound is 1 + clip_ratio_high (DAPO clip-higher raises it).")
    clip_ratio_c: float | None = Field(3.0, gt=1, description="Dual-clip PPO (Ye et al. 2020): where the advantage is negative, the policy loss is capped at -A * clip_ratio_c, so a token whose ratio ran far above 1 cannot blow up the update. 3.0 as verl's default; None disables.")
    loss_agg_mode: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum", "seq-mean-token-sum-norm"] = Field(
        "token-mean", description="How per-token losses become one number.")
    entropy_coeff: float = Field(0.0, ge=0, description="Entropy bonus weight (0 = off).")
    use_kl_loss: bool = Field(False, description="Add a KL(policy || reference) term to the loss (GRPO-style).")
    kl_loss_coef: float = Field(0.001, ge=0, description="Weight of the KL loss term.")
    kl_loss_type: str = Field("low_var_kl", description="KL estimator of the loss term: k1, k2, k3/low_var_kl, abs.")
    rollout_is: Literal["auto", "token", "sequence"] | None = Field("auto", description="Importance weights that correct for samples the rollout engine drew from another policy than the one the update starts from (its numerics, or staleness in rollout.mode one_step_off/async): each token's policy loss times min(pi_old / pi_rollout, actor.rollout_is_cap). token: a weight per token (TIS). sequence: one weight per sequence, the product of its tokens' ratios, truncated. auto: token when rollout.mode is not sync or actor.rollout_is_cap is set, else off. off (or null): none. The engine then returns log-probs every step, which costs rollout speed (docs/benchmarks.md).")
    rollout_is_cap: float | None = Field(None, gt=0, description="Truncation of the importance weights of actor.rollout_is (TIS: Yao et al. 2025; TRL's vllm_importance_sampling_correction, verl's rollout_is_threshold). Setting it turns token-level weights on in sync mode too. None = 2.0 wherever weights are on.")
    @field_validator("rollout_is", mode="before")
    @classmethod
    def _off_is_none(cls, value: Any) -> Any:
        """`off` reads as YAML's false (on the command line too): it means no weights, like null."""
        return None if value is False or value == "off" else value

    old_log_probs: Literal["auto", "recompute", "rollout"] = Field("auto", description="Where the PPO ratio's old log-probs come from. recompute: a forward pass of the trainer before the update. rollout: the engine's (exact only with one optimizer step per RL step). auto: with one optimizer step per RL step (ppo_epochs 1, mini_batch_size == train_batch_size) and no KL in the reward, the update's own log-probs, detached, which are the old policy's exactly (TRL's num_iterations=1), so the pass is skipped; otherwise recompute.")


class CriticConfig(Section):
    enable: bool | None = Field(None, description="Train a value model; None = on exactly when algorithm.adv_estimator is gae.")
    lr: float = Field(1e-5, gt=0, description="Critic AdamW learning rate.")
    cliprange_value: float | None = Field(0.5, description="PPO value clipping range; None disables.")
    warmup_steps: int = Field(0, ge=0, description="RL steps that train only the critic before the actor updates.")
    grad_clip: float = Field(1.0, gt=0, description="Critic global gradient-norm clip.")


class KLControlConfig(Section):
    type: Literal["fixed", "adaptive"] = Field("fixed", description="Fixed coefficient or the Ziegler et al. adaptive controller.")
    kl_coef: float = Field(0.001, ge=0, description="(Initial) KL-in-reward coefficient.")
    target_kl: float = Field(0.1, gt=0, description="Adaptive controller's target KL per sequence.")
    horizon: int = Field(10000, gt=0, description="Adaptive controller's horizon in samples.")


class DynamicSamplingConfig(Section):
    enable: bool = Field(False, description="DAPO dynamic sampling: drop prompt groups whose samples all got the same verifier score (no group-relative signal) and sample more prompts until data.train_batch_size groups remain.")
    max_gen_rounds: int = Field(10, ge=1, description="Most generation rounds per step, the first included. A batch still short after them is filled up with dropped groups (counted in dapo/groups_filled) instead of stopping the run.")


class AlgorithmConfig(Section):
    adv_estimator: str = Field("grpo", description="Registered advantage estimator: grpo, gae, rloo, remax, reinforce_plus_plus, ...")
    norm_adv_by_std: bool = Field(True, description="GRPO: divide by the group std (false = Dr.GRPO).")
    gamma: float = Field(1.0, ge=0, le=1, description="Discount (gae, reinforce_plus_plus).")
    lam: float = Field(1.0, ge=0, le=1, description="GAE lambda.")
    use_kl_in_reward: bool = Field(False, description="Subtract a per-token KL penalty from the reward (PPO-style).")
    kl_penalty: str = Field("k1", description="KL estimator for the in-reward penalty.")
    kl_ctrl: KLControlConfig = Field(default_factory=KLControlConfig)
    dynamic_sampling: DynamicSamplingConfig = Field(default_factory=DynamicSamplingConfig)


class TrainerConfig(Section):
    total_steps: int = Field(100, ge=1, description="RL steps to train.")
    n_gpus_per_node: int = Field(1, ge=1, description="Workers per node: GPUs, or CPU worker processes on a machine without GPUs.")
    nnodes: int = Field(1, ge=1, description="Nodes in the Ray cluster.")
    device: Literal["auto", "cpu", "cuda"] = Field("auto", description="auto = cuda when GPUs are visible, else cpu (gloo).")
    seed: int = Field(0, description="Seeds data order, initialisation of new heads and sampling.")
    runs_dir: str = Field("runs", description="Parent folder of run directories (shared storage for multi-node runs: every node writes checkpoint shards there).")
    logger: list[Literal["console", "jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["console", "jsonl", "tensorboard"],
        description="Where metrics go: console (live table), jsonl (RUN/metrics.jsonl), tensorboard (RUN/tensorboard), wandb (needs `pip install wandb`).")
    project_name: str = Field("rlkit", description="Grouping name for trackers.")
    experiment_name: str | None = Field(None, description="Run name for trackers (default: the run id).")
    save_freq: int = Field(0, ge=0, description="Checkpoint every N steps (0 = only at the end); the last step is always saved.")
    keep_last: int = Field(2, ge=1, description="Complete checkpoints kept on disk (older ones are deleted after each save).")
    val_freq: int = Field(0, ge=0, description="Validate every N steps (0 = only before training and after the last step); validation runs only when there are validation prompts (data.val_files).")
    val_before_train: bool = Field(True, description="Validate the starting policy (logged as step 0) before a fresh run trains; a resumed run continues the schedule instead.")
    val_n: int = Field(0, ge=0, description="Sampled responses per validation prompt besides the greedy one: with n >= 2 validation also reports mean@n, unbiased pass@k (k = 1, 2, 4, ..., n) and maj@n. 0 = greedy only (mean@1).")
    val_temperature: float | None = Field(None, gt=0, description="Temperature of the trainer.val_n samples (top-p/top-k are rollout's); None = rollout.temperature.")
    phase_timeout_s: float = Field(1800.0, gt=0, description="Deadline of one controller -> worker call in a step (generate, update, sync, save); past it the run stops and names the late workers.")
    setup_timeout_s: float = Field(3600.0, gt=0, description="Deadline of worker start-up (model load, rollout-engine start), whose progress is logged as it goes.")
    save_on_interrupt: bool = Field(True, description="On Ctrl-C/SIGTERM, finish the current step and checkpoint it before stopping (a second Ctrl-C stops at once).")
    nvlink_multicast: bool = Field(False, description="Let NCCL, torch symmetric memory and NVSHMEM use NVLink multicast (NVLS). Off by default: on hosts whose NVSwitch multicast is not set up (no fabric manager/IMEX), start-up fails or hangs with it on; turn it on where it works for faster all-reduce on 4+ GPUs. Off sets NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 in every worker.")
    cpu_threads_per_worker: int = Field(1, ge=1, description="Torch threads per CPU worker process.")
    record_rollouts: bool = Field(False, description="Keep each step's batch, as the actor update received it (token ids, masks, scores, rollout/old/reference log-probs, advantages), with the step's metrics, as RUN/rollouts/step_N.parquet: `rlkit inspect` shows it, `rlkit replay` re-runs its update (docs/replay.md). On steps with engine log-probs but no old-log-prob pass it adds one forward pass, for the per-token gap. About 15-25 bytes per token of the batch (zstd parquet): ~5 MB for the benchmark's 393k-token step.")
    invariants: Literal["error", "warn", "off"] = Field("error", description="Step-1 invariants of a fresh run (rlkit.core.controller.invariants): the KL to the reference is ~0 (the reference is the initial policy), rollout/log_prob_diff is under trainer.invariant_tolerance (step 1 is always a log-prob check step), and the first batch's prompts survive a tokenizer round trip (decode, then encode, gives the same ids). error stops the run naming the broken invariant; warn logs it and goes on; off skips them (and step 1's engine log-probs).")
    invariant_tolerance: float = Field(0.05, gt=0, description="Largest |KL to the reference| and rollout/log_prob_diff (nats per token) the step-1 invariants accept. Measured: ~1e-7 on CPU (fp32), ~0.008 with vLLM in bf16 on an H200 (docs/benchmarks.md).")

    @field_validator("invariants", mode="before")
    @classmethod
    def _bare_off(cls, value: Any) -> Any:
        """YAML reads a bare `off` (trainer.invariants=off) as false."""
        return "off" if value is False else value


class SFTConfig(Section):
    """`sft.*`: options only supervised fine-tuning (objective: sft) reads."""

    completion_only_loss: bool = Field(True, description="Train only on the response tokens (prompt+response rows: the response and its EOS; `messages` rows: the assistant turns, each up to its end-of-turn token); everything else is context with loss mask 0. false trains on every token but the first (TRL's completion_only_loss / assistant_only_loss).")


class DPOConfig(Section):
    """`dpo.*`: options only preference training (objective: dpo) reads (rlkit.core.algos.preference)."""

    loss_type: Literal["sigmoid", "ipo", "length_normalized"] = Field("sigmoid", description="sigmoid: DPO (Rafailov et al. 2023); ipo: IPO (Azar et al. 2023), squared distance of the log-ratio margin from 1/(2 beta); length_normalized: the sigmoid loss on per-token log-ratios (Tulu 3's length-normalized DPO). docs/algorithms.md, Preference losses.")
    beta: float = Field(0.1, gt=0, description="How strongly the policy is held to the reference: DPO's beta (the implicit reward is beta x the log-ratio to the reference), IPO's tau.")
    label_smoothing: float = Field(0.0, ge=0, lt=0.5, description="cDPO (Mitchell 2023): the share of pairs assumed to be mislabelled; the loss mixes in the flipped pair's with this weight. sigmoid and length_normalized only.")


class RLConfig(Section):
    """A whole run. `rlkit train --dry-run` prints it resolved."""

    recipe: str = Field("", description="Name of the recipe this config came from.")
    objective: Literal["rl", "sft", "dpo"] = Field("rl", description="What a step trains on. rl: samples the policy generates, scored by the reward (rollout, reward, algorithm, critic). sft: supervised fine-tuning on data.train_files rows (prompt + response, or chat `messages`), the negative log-likelihood of the response tokens, aggregated by actor.loss_agg_mode; no rollout engine starts and the RL-only sections are ignored (docs/algorithms.md, SFT). dpo: preference training on data.train_files pairs (prompt, chosen, rejected) against the frozen initial model, options under dpo.* (docs/preference.md).")
    data: DataConfig = Field(default_factory=DataConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    reward: RewardConfig = Field(default_factory=RewardConfig)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    sft: SFTConfig = Field(default_factory=SFTConfig)
    dpo: DPOConfig = Field(default_factory=DPOConfig)

    @property
    def offline(self) -> bool:
        """Trains on rows of a data set (objectives sft, dpo), not on samples of the policy: no rollout engine."""
        return self.objective != "rl"

    @property
    def samples_per_prompt(self) -> int:
        """Sequences each data row becomes in a step: rollout.n samples in RL, a pair's two responses in
        dpo, the row itself in sft."""
        return {"rl": self.rollout.n, "dpo": 2}.get(self.objective, 1)

    @property
    def micro_batch_group(self) -> int:
        """Rows that always share a micro-batch: a dpo pair's two responses (its loss needs both); else 1."""
        return 2 if self.objective == "dpo" else 1

    @property
    def world_size(self) -> int:
        """Training workers: every device, less those that split placement gives to rollout."""
        devices = self.trainer.n_gpus_per_node * self.trainer.nnodes
        return devices - self.rollout.devices if self.rollout.placement == "split" else devices

    @property
    def critic_enabled(self) -> bool:
        if self.offline:
            return False
        return self.critic.enable if self.critic.enable is not None else self.algorithm.adv_estimator == "gae"

    @property
    def old_log_probs_from_update(self) -> bool:
        """The policy before the update is the one being updated: no separate old-log-prob pass."""
        actor = self.actor
        return (actor.old_log_probs == "auto" and actor.ppo_epochs == 1
                and actor.mini_batch_size == self.data.train_batch_size and not self.algorithm.use_kl_in_reward)

    @property
    def rollout_correction(self) -> tuple[str, float] | None:
        """(level, cap) of the rollout importance weights (actor.rollout_is), or None when they are off."""
        actor = self.actor
        if actor.rollout_is is None:
            return None
        if actor.rollout_is == "auto" and self.rollout.mode == "sync" and actor.rollout_is_cap is None:
            return None
        level = "token" if actor.rollout_is == "auto" else actor.rollout_is
        return level, actor.rollout_is_cap if actor.rollout_is_cap is not None else DEFAULT_ROLLOUT_IS_CAP

    @property
    def needs_rollout_log_probs(self) -> bool:
        """The math (not just the sync check) uses the engine's log-probs, so every step asks for them."""
        return self.actor.old_log_probs == "rollout" or self.rollout_correction is not None

    def log_prob_check_step(self, step: int) -> bool:
        """The engine returns the sampled tokens' log-probs this step, for rollout/log_prob_diff."""
        freq = self.rollout.log_prob_check_freq
        return (freq > 0 and step % freq == 0) or (step == 1 and self.trainer.invariants != "off")

    @property
    def needs_reference(self) -> bool:
        if self.objective == "dpo":  # the preference losses compare the policy with it
            return True
        return self.objective == "rl" and (self.actor.use_kl_loss or self.algorithm.use_kl_in_reward)

    @property
    def log_prob_temperature(self) -> float:
        """The temperature of log-prob passes: RL's rollout.temperature (the distribution the engine
        sampled from); 1 offline (the data's likelihood)."""
        return self.rollout.temperature if self.objective == "rl" else 1.0
