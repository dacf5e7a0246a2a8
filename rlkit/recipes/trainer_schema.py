"""`trainer.*`, `sft.*` and `dpo.*`: the run around the step, and the offline objectives' options."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rlkit.recipes.section import Section


class TrainerConfig(Section):
    total_steps: int = Field(100, ge=1, description="RL steps to train.")
    n_gpus_per_node: int = Field(
        1,
        ge=1,
        description="Workers per node: GPUs, or CPU worker processes on a machine without GPUs.",
    )
    nnodes: int = Field(1, ge=1, description="Nodes in the Ray cluster.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto",
        description="auto = cuda when GPUs are visible, else cpu (gloo).",
    )
    seed: int = Field(0, description="Seeds data order, initialisation of new heads and sampling.")
    runs_dir: str = Field(
        "runs",
        description="Parent folder of run directories (shared storage for multi-node runs: every node writes "
        "checkpoint shards there).",
    )
    logger: list[Literal["console", "jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["console", "jsonl", "tensorboard"],
        description="Where metrics go: console (live table), jsonl (RUN/metrics.jsonl), tensorboard "
        "(RUN/tensorboard), wandb (needs `pip install wandb`).",
    )
    project_name: str = Field("rlkit", description="Grouping name for trackers.")
    experiment_name: str | None = Field(None, description="Run name for trackers (default: the run id).")
    save_freq: int = Field(
        0,
        ge=0,
        description="Checkpoint every N steps (0 = only at the end); the last step is always saved.",
    )
    keep_last: int = Field(
        2,
        ge=1,
        description="Complete checkpoints kept on disk (older ones are deleted after each save).",
    )
    val_freq: int = Field(
        0,
        ge=0,
        description="Validate every N steps (0 = only before training and after the last step); validation runs only "
        "when there are validation prompts (data.val_files).",
    )
    val_before_train: bool = Field(
        True,
        description="Validate the starting policy (logged as step 0) before a fresh run trains; a resumed run "
        "continues the schedule instead.",
    )
    val_n: int = Field(
        0,
        ge=0,
        description="Sampled responses per validation prompt besides the greedy one: with n >= 2 validation also "
        "reports mean@n, unbiased pass@k (k = 1, 2, 4, ..., n) and maj@n. 0 = greedy only (mean@1).",
    )
    val_temperature: float | None = Field(
        None,
        gt=0,
        description="Temperature of the trainer.val_n samples (top-p/top-k are rollout's); None = rollout.temperature.",
    )
    phase_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="Deadline of one controller -> worker call in a step (generate, update, sync, save); past it the "
        "run stops and names the late workers.",
    )
    setup_timeout_s: float = Field(
        3600.0,
        gt=0,
        description="Deadline of worker start-up (model load, rollout-engine start), whose progress is logged as it "
        "goes.",
    )
    save_on_interrupt: bool = Field(
        True,
        description="On Ctrl-C/SIGTERM, finish the current step and checkpoint it before stopping (a second Ctrl-C "
        "stops at once).",
    )
    nvlink_multicast: bool = Field(
        False,
        description="Let NCCL, torch symmetric memory and NVSHMEM use NVLink multicast (NVLS). Off by default: on "
        "hosts whose NVSwitch multicast is not set up (no fabric manager/IMEX), start-up fails or hangs "
        "with it on; turn it on where it works for faster all-reduce on 4+ GPUs. Off sets "
        "NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1, NVSHMEM_DISABLE_NVLS=1 in every worker.",
    )
    cpu_threads_per_worker: int = Field(1, ge=1, description="Torch threads per CPU worker process.")
    workers: Literal["ray", "in_process"] = Field(
        "ray",
        description="Where the workers run. ray: one Ray actor (a process of its own) per device, on the local "
        "Ray cluster rlkit starts or the one at RAY_ADDRESS. in_process: the workers are plain objects "
        "in this process, no Ray and no worker processes, for debugging on one CPU device, notebooks and "
        "tests; on the CPU only: one device (trainer.nnodes x trainer.n_gpus_per_node = 1), or with "
        "rollout.placement=split two (one training and one rollout worker, rollout.weight_sync=object_store: "
        "the weights handed over in memory; an asynchronous rollout keeps its schedule, without the "
        "overlap). It does not enforce trainer.phase_timeout_s / setup_timeout_s "
        "(a call runs to its end in this thread). docs/architecture.md, Workers.",
    )
    record_rollouts: bool = Field(
        True,
        description="Keep the last steps' batches, as the actor update received them (token ids, masks, scores, "
        "rollout/old/reference log-probs, advantages), with each step's metrics, as "
        "RUN/rollouts/step_N.parquet: `rlkit inspect` shows one, `rlkit replay` re-runs its update "
        "(docs/replay.md). trainer.record_keep_steps says how many stay on disk. Written on a thread of its "
        "own (the step waits ~2 ms for the demo, ~0.1 s for a 786k-token step). On steps with engine "
        "log-probs but no old-log-prob pass it adds one forward pass, for the per-token gap. grpo-demo "
        "(CPU, log-probs every step) measured ~0.11 s a step without recording, ~0.135 s with it. "
        "Disk, measured: 13 KB a "
        "step for grpo-demo, 1.4-1.6 MB for a GSM8K-sized grpo step (512 sequences), at most ~13 MB at "
        "that recipe's maximum lengths.",
    )
    record_keep_steps: int = Field(
        3,
        ge=0,
        description="Recorded steps kept on disk: once step N is written, the records of steps up to N-3 (for "
        "3) are deleted, 0 keeps every step. At 3: ~40 KB for grpo-demo, ~5 MB for a GSM8K-sized run. "
        "`rlkit replay` of step N also needs the checkpoint of step N-1 (trainer.save_freq).",
    )
    invariants: Literal["error", "warn", "off"] = Field(
        "error",
        description="Step-1 invariants of a fresh run (rlkit.core.controller.invariants): the KL to the reference is "
        "~0 (the reference is the initial policy), rollout/log_prob_diff is under "
        "trainer.invariant_tolerance (step 1 is always a log-prob check step), and the first batch's "
        "prompts survive a tokenizer round trip (decode, then encode, gives the same ids). error stops "
        "the run naming the broken invariant; warn logs it and goes on; off skips them (and step 1's "
        "engine log-probs).",
    )
    invariant_tolerance: float = Field(
        0.05,
        gt=0,
        description="Largest |KL to the reference| and rollout/log_prob_diff (nats per token) the step-1 invariants "
        "accept. Measured: ~1e-7 on CPU (fp32), ~0.008 with vLLM in bf16 on an H200 (docs/benchmarks.md).",
    )

    profile_steps: list[int] = Field(
        default_factory=list,
        description="Steps whose phases run under torch.profiler in every training worker (e.g. [3]: after step "
        "1's compiles and warm-up): per phase and rank, RUN/profile/step<N>/ gets the wall and device-busy seconds, "
        "a table of the top ops and kernels by device time, and a Chrome trace for https://ui.perfetto.dev "
        "(rlkit.core.cluster.profiling). What runs in other processes (a vLLM engine core of its own) is not in "
        "them; the profiled step's timings include the profiler's cost. Empty: no profiling.",
    )

    @field_validator("profile_steps", mode="before")
    @classmethod
    def _one_step(cls, value: Any) -> Any:
        """trainer.profile_steps=3 on a command line: that one step."""
        return [value] if isinstance(value, int) and not isinstance(value, bool) else value

    @model_validator(mode="after")
    def _profile_steps_in_run(self) -> TrainerConfig:
        outside = [step for step in self.profile_steps if not 1 <= step <= self.total_steps]
        if outside:
            raise ValueError(
                f"trainer.profile_steps has {outside}, outside this run's steps 1..{self.total_steps} "
                "(trainer.total_steps): name steps the run takes"
            )
        return self

    @field_validator("invariants", mode="before")
    @classmethod
    def _bare_off(cls, value: Any) -> Any:
        """YAML reads a bare `off` (trainer.invariants=off) as false."""
        return "off" if value is False else value


class SFTConfig(Section):
    """`sft.*`: options only supervised fine-tuning (objective: sft) reads."""

    completion_only_loss: bool = Field(
        True,
        description="Train only on the response tokens (prompt+response rows: the response and its EOS; `messages` "
        "rows: the assistant turns, each up to its end-of-turn token); everything else is context with "
        "loss mask 0. false trains on every token but the first (TRL's completion_only_loss / "
        "assistant_only_loss).",
    )


class DPOConfig(Section):
    """`dpo.*`: options only preference training (objective: dpo) reads (rlkit.core.algos.preference)."""

    loss_type: Literal["sigmoid", "cdpo", "robust", "ipo", "ipo_sum", "length_normalized"] = Field(
        "sigmoid",
        description="sigmoid: DPO (Rafailov et al. 2023); cdpo: conservative DPO (Mitchell 2023) and robust: robust "
        "DPO (Chowdhury et al. 2024), both with dpo.label_smoothing; ipo: IPO (Azar et al. 2023) on per-token "
        "log-ratios as TRL computes it, ipo_sum: on sequence sums; length_normalized: the sigmoid loss on "
        "per-token log-ratios (Tulu 3's length-normalized DPO). docs/algorithms.md, Preference losses.",
    )
    beta: float = Field(
        0.1,
        gt=0,
        description="How strongly the policy is held to the reference: DPO's beta (the implicit reward is beta x the "
        "log-ratio to the reference), IPO's tau.",
    )
    label_smoothing: float = Field(
        0.0,
        ge=0,
        lt=0.5,
        description="The share of pairs assumed to be mislabelled, for loss_type cdpo (the loss mixes in the flipped "
        "pair's with this weight) and robust (unbiased under that noise). sigmoid takes none, as TRL's sigmoid "
        "ignores it; until 2026-12-03 rlkit's sigmoid read it as cdpo does now.",
    )
