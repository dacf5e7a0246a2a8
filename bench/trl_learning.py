"""TRL's GRPOTrainer on bench/learning.py's task, with greedy validation every few steps.

  python bench/trl_learning.py --spec SPEC.json --out RESULT.json

SPEC.json (written by bench/learning.py) names the model directory (the SFT export), the RL
train/test parquet files and the settings rlkit's GRPO run uses: prompts and samples per step,
response length, learning rate, steps, validation frequency and a deadline. What is set to
match rlkit's run: one optimizer step per generation batch (num_iterations 1), loss_type "dapo"
(token-mean over the batch, rlkit's actor.loss_agg_mode=token-mean), rewards scaled by the group
std, clip 0.2, no KL term (beta 0), constant learning rate without warm-up, temperature 1, fp32
master weights (TRL's default dtype; the checkpoint is bf16, as rlkit's run loads it),
no importance-sampling correction (rlkit's run has none either), vLLM colocated and eager
(TRL builds its engine with CUDA graphs; the engine's constructor is wrapped to add
enforce_eager=True, as rlkit's run sets rollout.vllm.enforce_eager=true). Without CUDA (the
CPU smoke run) generation is transformers `generate`.

Validation: greedy decoding of every test prompt with the trained model (transformers
`generate`, batched), scored by rlkit's GSM8K reward, before training and every `val_freq`
steps; each point records the step, samples seen and seconds since this script started.

With "tools" in SPEC (["calculator"], bench/learning_tools.py), GRPOTrainer runs its own tool loop
(`tools=`, at most "max_turns" - 1 rounds of calls): TRL 1.16 parses a completion's calls with the
tokenizer's response template, which it sets itself only for chat templates it knows (Qwen2.5/3,
Llama 3, GPT-OSS, ...). The scratch model's template writes Qwen2.5's tool format, so Qwen's response
template is set on the tokenizer here. Validation then runs greedy episodes in rlkit's tool loop
(bench/greedy_eval.greedy_tool_accuracy) and each point also records tool calls per episode; the
training steps' reward and `tools/call_frequency` (TRL's calls per completion) go to "train".
"""

from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path

START = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.greedy_eval import greedy_accuracy, greedy_tool_accuracy, reward  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = json.loads(Path(args.spec).read_text())
    out = Path(args.out)

    import pyarrow.parquet as pq
    import torch
    import trl
    from datasets import Dataset
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    on_gpu = torch.cuda.is_available()
    if on_gpu:  # TRL's colocated engine has no enforce_eager option
        from trl.generation import vllm_generation

        vllm_generation.LLM = functools.partial(vllm_generation.LLM, enforce_eager=True)
    train = pq.read_table(spec["train"]).to_pylist()
    test = pq.read_table(spec["test"]).to_pylist()
    prompts, samples = spec["prompts"], spec["samples"]
    tools = tool_functions(spec.get("tools") or [])
    per_device = min(16, prompts * samples)
    config = GRPOConfig(
        output_dir=str(out.parent / f"{out.stem}-trainer"), per_device_train_batch_size=per_device,
        gradient_accumulation_steps=prompts * samples // per_device, num_generations=samples,
        max_completion_length=spec["response_length"], temperature=1.0, learning_rate=spec["lr"],
        lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.0, max_grad_norm=1.0, beta=0.0, epsilon=0.2,
        loss_type="dapo", scale_rewards="group", num_iterations=1, max_steps=spec["steps"], logging_steps=1,
        save_strategy="no", report_to="none", bf16=on_gpu, use_cpu=not on_gpu, gradient_checkpointing=False,
        use_vllm=on_gpu, vllm_mode="colocate", vllm_gpu_memory_utilization=spec.get("gpu_memory_utilization", 0.3),
        vllm_importance_sampling_correction=False, seed=spec.get("seed", 0), dataloader_num_workers=0,
        **({"max_tool_calling_iterations": spec["max_turns"] - 1} if tools else {}))
    tokenizer = AutoTokenizer.from_pretrained(spec["model"])
    if tools:
        from trl import chat_template_utils

        # The new-style response template where this transformers reads it (TRL sets one or the other itself).
        if hasattr(chat_template_utils, "qwen3_template") and hasattr(tokenizer, "parse_response"):
            tokenizer.response_template = chat_template_utils.qwen3_template
        else:
            tokenizer.response_schema = chat_template_utils.qwen3_schema
    result = {"label": spec.get("label", "trl-grpo"), "trl_version": trl.__version__, "status": "starting",
              "points": [], "train": [], "spec": spec}

    def save() -> None:
        out.write_text(json.dumps(result, indent=1))

    class Validation(TrainerCallback):
        """Greedy validation before training and every val_freq steps; stops at the deadline."""

        def __init__(self) -> None:
            self.trainer = None

        def validate(self, step: int) -> None:
            point = {"step": step, "samples": step * prompts * samples}
            if tools:
                accuracy, point["tool_calls"] = greedy_tool_accuracy(
                    self.trainer.model, tokenizer, test, spec["max_tokens_per_turn"], tools, spec["max_turns"])
            else:
                accuracy = greedy_accuracy(self.trainer.model, tokenizer, test, spec["response_length"])
            result["points"].append({**point, "seconds": time.perf_counter() - START, "val": accuracy})
            save()
            print(f"[trl-grpo] step {step}: val {accuracy:.3f} at {time.perf_counter() - START:.0f} s", flush=True)

        def on_train_begin(self, *_, **__):
            self.validate(0)

        def on_log(self, _args, state, _control, logs=None, **__):
            if logs and "reward" in logs:
                result["train"].append({"step": state.global_step, "reward": logs["reward"],
                                        **({"tool_calls": logs["tools/call_frequency"]}
                                           if "tools/call_frequency" in logs else {})})

        def on_step_end(self, _args, state, control, **__):
            past_deadline = time.perf_counter() - START > spec["deadline_s"]
            if state.global_step % spec["val_freq"] == 0 or state.global_step == spec["steps"] or past_deadline:
                self.validate(state.global_step)
            if past_deadline:
                result["stopped_at_deadline"] = state.global_step
                control.should_training_stop = True

    validation = Validation()
    trainer = GRPOTrainer(
        model=spec["model"], reward_funcs=reward, args=config, processing_class=tokenizer, tools=tools or None,
        train_dataset=Dataset.from_list([{"prompt": r["prompt"], "ground_truth": r["reward_model"]["ground_truth"]}
                                         for r in train]),
        callbacks=[validation])
    validation.trainer = trainer
    result["setup_seconds"] = time.perf_counter() - START
    try:
        trainer.train()
        result["status"] = "done"
    except Exception as exc:
        result["status"] = f"failed: {type(exc).__name__}: {str(exc)[:1000]}"
        raise
    finally:
        result["seconds"] = time.perf_counter() - START
        save()


def tool_functions(names: list[str]) -> list:
    """The named rlkit built-in tools as plain functions, TRL's `tools=` (only `calculator` takes no settings)."""
    from rlkit.core.agents.builtin_tools import calculator

    known = {"calculator": calculator}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"bench/trl_learning.py: no TRL tool for {unknown}; known: {sorted(known)}")
    return [known[name] for name in names]


if __name__ == "__main__":
    main()
