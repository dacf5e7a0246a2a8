"""`rollout.*`: how samples are generated (engine, sampling, placement, async modes, agents)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlkit.recipes.agent_schema import AgentConfig
from rlkit.recipes.section import Section


class VLLMOptions(Section):
    """`rollout.vllm.*`: options only the vLLM engine reads."""

    enforce_eager: bool | None = Field(
        None,
        description="Skip CUDA graphs/compile (faster start, slower decode); None = eager on CPU, CUDA graphs on GPU "
        "(2x the decode speed on an H200, ~1 min more start-up; docs/benchmarks.md). Was "
        "rollout.enforce_eager.",
    )
    separate_process: bool = Field(
        False,
        description="Run vLLM's engine core (scheduler and model) in a process of its own, so that turning its "
        "outputs into results overlaps the next decode step; weights then move by CUDA IPC handles. Off by default: "
        "on an H200 (0.5B GRPO, 2026-12-04) a step took 12.7 s with it and 10.3 s without (docs/benchmarks.md).",
    )
    replicas: int = Field(
        1,
        ge=1,
        description="vLLM engines per rollout device, each with its engine core in a process of its own (whatever "
        "separate_process says) and 1/replicas of rollout.gpu_memory_utilization; a call's prompts are split into "
        "contiguous shares, one per engine, generated at the same time (rollout.max_num_seqs is per engine). vLLM's "
        "engine loop is single-threaded Python that leaves an H200 idle most of a 0.5B model's decode; several "
        "loops on several cores fill it: on an H200 (0.5B GRPO, 2026-12-05) 2 replicas took a step with rollout "
        "log-probs from 14.1 to 10.7 s, the GPU busy 81-89% of the engine's generate instead of 40%, but set-up "
        "took 86-134 s instead of 46 s, so 1 stays the default: set 2 for long runs of small models "
        "(docs/benchmarks.md). Samples keep a single engine's seeds, and which engine serves a prompt depends only "
        "on the number of replicas. The first run of a configuration on a GPU starts the replicas one after another "
        "(vLLM measures each KV cache) and records the size; later runs start them together with it "
        "(docs/startup.md); on a CPU they always start together.",
    )
    streaming: bool = Field(
        False,
        description="vLLM's async engine (its engine core in a process of its own) fed one request per sample: a "
        "call's samples stream in and out, and an agent episode submits its next turn as soon as its environment "
        "answers, with no per-turn barrier (rollout.agent; rlkit/core/agents/turns.py). Off (the default), each "
        "turn of all running episodes goes to the engine in one batch: the deterministic schedule, under which a "
        "resumed run repeats the uninterrupted one bit for bit. Streamed, a request keeps its seed, but which "
        "requests share a forward pass depends on timing, so on a GPU a sample's last bits, and so rarely a "
        "token, can differ between runs (docs/resume.md). With replicas > 1 each replica is such an engine and an "
        "episode's turns stay on one. On one H100 a 3-turn agent rollout took 5.81 s streamed, 6.23 s batched; "
        "streamed on 2 replicas it generated 70.8k policy tokens/s against 83.0k for single-turn responses on the "
        "same engines (0.85x; docs/benchmarks.md). With reward.while_generating each response is scored as it "
        "finishes.",
    )
    prefix_caching: bool = Field(
        True,
        description="vLLM's prefix cache within one rollout: an agent's next turn, and the other samples of a "
        "prompt, reuse the keys and values already computed for their shared prefix instead of prefilling it "
        "again. Emptied when the rollout ends (generation, agent episodes or validation) and at every weight load, "
        "so it never holds an older policy's values and a resumed run replays the same cache hits.",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Further `vllm.LLM` arguments, e.g. {async_scheduling: true}; arguments rlkit derives from its "
        "own keys are refused. Was rollout.engine_kwargs.",
    )


class SGLangOptions(Section):
    """`rollout.sglang.*`: options only the SGLang engine reads."""

    attention_backend: str | None = Field(
        None,
        description="SGLang attention backend (its --attention-backend, e.g. fa3, flashinfer, triton); None = "
        "SGLang's choice on GPU, torch_native on CPU. Per-request seeds need one SGLang runs "
        "deterministically (fa3, fa4, flashinfer, triton).",
    )
    deterministic: bool = Field(
        False,
        description="SGLang's deterministic inference on GPUs (its --enable-deterministic-inference). false "
        "(default): SGLang's ordinary kernels, but the seeds are ignored, so rollouts are not reproducible and "
        "a resumed run is not bit-exact (the engine warns). true: per-request seeds count, so rollouts repeat "
        "and a resumed run can be exact, at a large cost in speed: SGLang then runs batch-invariant kernels "
        "and PyTorch sampling (docs/benchmarks.md, 'SGLang on an H200'). On a CPU seeds are always ignored.",
    )
    streaming: bool = Field(
        False,
        description="SGLang's async client fed one request per sample, as rollout.vllm.streaming does for vLLM: an "
        "agent episode submits its next turn as soon as its environment answers (no per-turn barrier), and with "
        "reward.while_generating each response is scored as it finishes. SGLang's scheduler already runs in a "
        "process of its own. Off: one batch call per turn. Not measured on a GPU yet.",
    )
    engine_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Further `sglang.Engine` arguments (its server arguments), e.g. {chunked_prefill_size: 4096}; "
        "arguments rlkit derives from its own keys are refused. Two defaults can be changed here: "
        "log_level (error) and disable_cuda_graph (false on GPUs), e.g. {log_level: info} to watch a slow "
        "engine start.",
    )


class HFOptions(Section):
    """`rollout.hf.*`: options only the transformers `generate` engine reads."""

    batch_size: int = Field(512, ge=1, description="Sequences per `generate` call (memory: the KV cache of this many).")


class RolloutConfig(Section):
    name: str = Field(
        "vllm",
        description="Generation engine, from the registry in rlkit/core/rollout/engines.py: vllm, sglang, or hf "
        "(transformers `generate`, the fallback that needs nothing more). Each engine's own options live "
        "under rollout.<name>.",
    )
    n: int = Field(8, ge=1, description="Samples per prompt (the group size for GRPO/RLOO).")
    temperature: float = Field(1.0, gt=0, description="Sampling temperature (1.0 keeps rollouts on-policy).")
    top_p: float = Field(
        1.0,
        gt=0,
        le=1,
        description="Nucleus sampling; < 1 makes the rollout policy differ from the trained one.",
    )
    top_k: int = Field(-1, description="Top-k sampling; -1 disables.")
    gpu_memory_utilization: float = Field(
        0.5,
        gt=0,
        le=1,
        description="Fraction of device memory the engine takes for weights + KV cache.",
    )
    max_num_seqs: int = Field(256, ge=1, description="Sequences the engine decodes at once.")
    ignore_eos: bool = Field(
        False,
        description="Always generate data.max_response_length tokens, EOS or not (benchmarks with fixed shapes).",
    )
    placement: Literal["colocated", "split"] = Field(
        "colocated",
        description="colocated: every training worker also runs a rollout engine on its device (vLLM sleeps during "
        "training); split: rollout.devices devices run only rollout and receive the weights after each "
        "update.",
    )
    devices: int = Field(
        1,
        ge=1,
        description="split placement: devices (of trainer.nnodes x trainer.n_gpus_per_node) that run only rollout; "
        "the rest train.",
    )
    mode: Literal["sync", "one_step_off", "async"] = Field(
        "sync",
        description="sync: each step generates its batch with the current policy, then trains on it. one_step_off: "
        "step k+1's batch is generated (with the policy before step k's update) while step k trains. "
        "async: the rollout workers run up to rollout.max_staleness batches ahead of the trainer. Both "
        "overlapping modes need rollout.placement=split and correct the staleness with importance weights "
        "(actor.rollout_correction); docs/async.md.",
    )
    max_staleness: int = Field(
        2,
        ge=1,
        description="rollout.mode=async: batches generated ahead of the trainer, so no trained sample is more than "
        "this many policy versions older than the policy being updated (one_step_off is 1).",
    )
    weight_sync: Literal["broadcast", "object_store"] = Field(
        "broadcast",
        description="split placement: how the weights travel from training rank 0 to the rollout workers after each "
        "update. broadcast: a collective of their own (NCCL on GPUs, gloo on CPU), full tensors in flat "
        "buckets. object_store: through Ray's object store (slower; no extra communicator).",
    )
    weight_sync_timeout_s: float = Field(
        300.0,
        gt=0,
        description="split placement: deadline of one weight transfer once both sides have joined it; a transfer that "
        "stalls past it stops the run with a message naming it.",
    )
    log_prob_check_freq: int = Field(
        10,
        ge=0,
        description="Every this many steps the engine also returns the log-probs of the tokens it sampled for about "
        "32 of the step's samples (one in samples // 32 by seed; every sample of a smaller batch and every agent "
        "episode), and rollout/log_prob_diff (mean |engine - trainer| over them) checks the weight sync and the "
        "engine's numerics; 0 = never (but step 1, for the step-1 invariants, unless trainer.invariants=off). Not "
        "every step, nor every sample: vLLM decodes at half speed while returning them, a cost per request and "
        "token (docs/benchmarks.md). actor.old_log_probs=rollout and the rollout corrections take them from "
        "every sample on every step.",
    )
    log_prob_tolerance: float = Field(
        0.05,
        gt=0,
        description="Weight-sync check: the most rollout/log_prob_diff (mean |engine - trainer| log-prob per token, "
        "nats) a check step may show; more means the engine is not running the trained weights. Measured: "
        "~1e-7 on CPU (fp32), 0.008 with vLLM bf16 on an H200. Not applied with rollout.top_p < 1 or "
        "top_k > 0, or with rollout.mode one_step_off/async (stale samples), where the two differ by "
        "design.",
    )
    sync_check: Literal["error", "warn"] = Field(
        "error",
        description="What a failed weight-sync check does (log-prob gap over rollout.log_prob_tolerance, or the first "
        "sync that changed the weights left the engine's outputs unchanged): error stops the run with the "
        "reason; warn logs it and trains on.",
    )
    vllm: VLLMOptions = Field(default_factory=VLLMOptions)
    sglang: SGLangOptions = Field(default_factory=SGLangOptions)
    hf: HFOptions = Field(default_factory=HFOptions)
    agent: AgentConfig = Field(
        default_factory=AgentConfig,
        description="Multi-turn episodes: tools, environments (rlkit/recipes/agent_schema.py, docs/agents.md).",
    )

    @property
    def streams(self) -> bool:
        """The engine in use takes requests one by one (rollout.vllm.streaming, rollout.sglang.streaming)."""
        return (self.name == "vllm" and self.vllm.streaming) or (self.name == "sglang" and self.sglang.streaming)
