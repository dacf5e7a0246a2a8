"""The GRPO benchmark with multi-turn episodes: the same model, prompts and response budget as
bench/rlkit_grpo.py, each response split into `--turns` policy turns with an environment's
message between them (bench/agent_env.py), so tokens/s compare with the single-turn workload.

  python bench/agent_grpo.py --workdir /tmp/bench --out result.json [--turns 3] [--cuda-graphs] [--compile] [--tiny]
      [--host-profile DIR [--py-spy-step 3] [--py-spy-seconds 10]]

Shape: the response holds `--turns` turns of equal length (EOS ignored, so every turn runs to
its limit) and `--turns - 1` environment answers of `--message-chars` characters plus the chat
template's turn boundary, 512 tokens in all (the single-turn workload's response length).

Each step's rollout records the GPU's busy share (nvidia-smi, as bench/rlkit_grpo.py), and `--host-profile DIR`
writes py-spy's stacks of every process (rlkit's worker with the agent loop and vLLM's clients, each engine core)
during step `--py-spy-step`'s first `--py-spy-seconds` to DIR/py-spy-step.txt: where a turn boundary's time goes
(bench/py_spy_summary.py reads it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from contextlib import ExitStack
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.host_time import NvmlSampler, busy_within, py_spy  # noqa: E402
from bench.rlkit_grpo import overrides, rollout_windows, summarize, with_defaults  # noqa: E402
from bench.workload import H200_BF16_PEAK_FLOPS, prepared  # noqa: E402

CHATML = ("{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")
TINY_RESPONSE_TOKENS = 96  # the tiny workload's 8 response tokens hold no turn boundary


def agent_model(workdir: Path) -> Path:
    """The workload's model with a ChatML template (its prompts are plain strings, so the
    single-turn benchmark has none): weights linked, tokenizer files of its own, so a
    single-turn run reading the shared folder at the same time is not disturbed."""
    from transformers import AutoTokenizer

    folder = workdir / "agent-model"
    if not (folder / "tokenizer_config.json").exists():
        folder.mkdir(exist_ok=True)
        for file in (workdir / "model").iterdir():
            if file.name in ("config.json", "generation_config.json") or file.suffix == ".safetensors":
                (folder / file.name).unlink(missing_ok=True)
                (folder / file.name).symlink_to(file)
        tokenizer = AutoTokenizer.from_pretrained(workdir / "model")
        tokenizer.chat_template = CHATML
        tokenizer.save_pretrained(folder)
    return folder


def turn_shape(model_dir: Path, response_tokens: int, turns: int, message_chars: int) -> tuple[int, int]:
    """(tokens per policy turn, the whole response) for `turns` turns in `response_tokens`."""
    from transformers import AutoTokenizer

    from rlkit.core.agents.chat import TurnBoundary

    boundary = len(TurnBoundary(AutoTokenizer.from_pretrained(model_dir)).after_turn(
        [], [{"role": "user", "content": "x" * message_chars}]))
    per_turn = (response_tokens - (turns - 1) * boundary) // turns
    if per_turn < 1:
        raise SystemExit(f"{turns} turns with {boundary}-token answers do not fit {response_tokens} response tokens")
    return per_turn, per_turn * turns + (turns - 1) * boundary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--label", default="rlkit-agent")
    parser.add_argument("--tiny", action="store_true")
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--message-chars", type=int, default=19, help="characters of the environment's answer")
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--rollout", default="vllm", choices=["vllm", "hf"])
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--micro-batch-tokens", type=int, default=32768)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.35)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--peak-flops", type=float, default=H200_BF16_PEAK_FLOPS)
    parser.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                        help="a further recipe override, last (repeatable), e.g. rollout.vllm.prefix_caching=false")
    parser.add_argument("--host-profile", metavar="DIR", help="py-spy stacks of every process during one step, in DIR")
    parser.add_argument("--py-spy-step", type=int, default=3)
    parser.add_argument("--py-spy-seconds", type=float, default=10.0, help="how long py-spy samples that step")
    args = with_defaults(parser.parse_args())

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    from rlkit.core.controller.controller import Controller
    from rlkit.core.state.run_dir import RunDir
    from rlkit.recipes.loader import load_config

    workload, workdir = prepared(args.workdir, args.tiny)
    if args.tiny:
        workload = dataclasses.replace(workload, response_tokens=TINY_RESPONSE_TOKENS)
    model = agent_model(workdir)
    per_turn, response = turn_shape(model, workload.response_tokens, args.turns, args.message_chars)
    agent = [f"data.max_response_length={response}", "rollout.agent.loop=env",
             f"rollout.agent.env={Path(__file__).resolve().parent / 'agent_env.py'}:FixedTurns",
             f"rollout.agent.env_kwargs={{turns: {args.turns}, chars: {args.message_chars}}}",
             f"rollout.agent.max_turns={args.turns}", f"rollout.agent.max_tokens_per_turn={per_turn}"]
    config = load_config("grpo", overrides(args, workload, str(workdir / "prompts.parquet"), str(workdir / "runs")) + agent,
                         model=str(model))
    result: dict = {"label": args.label, "args": vars(args), "tokens_per_turn": per_turn, "response_tokens": response,
                    "status": "starting"}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)  # run directly, not only under run_all (which makes it)
    start = time.perf_counter()
    controller = Controller(config, RunDir.create(config))
    result["setup_seconds"] = time.perf_counter() - start
    utilisation = NvmlSampler().start()  # the GPU's busy share in each step's rollout; stopped below
    steps: list[dict] = []
    step_began: list[float] = []
    try:
        for step in range(1, args.steps + 1):
            step_began.append(time.time())
            with ExitStack() as around:
                if args.host_profile and step == args.py_spy_step:
                    Path(args.host_profile).mkdir(parents=True, exist_ok=True)
                    around.enter_context(py_spy(Path(args.host_profile) / "py-spy-step.txt", args.py_spy_seconds,
                                                subprocesses=True))
                steps.append(controller.step(step))
            measured = steps[args.warmup:] or steps
            result.update(status=f"{step}/{args.steps} steps", steps=steps,
                          summary=summarize(measured, workload, config.world_size, args.peak_flops))
            windows = rollout_windows(step_began, steps)
            result["rollout_nvml_busy_by_step"] = {i + 1: busy_within(utilisation.samples, [window])
                                                   for i, window in enumerate(windows)}
            result["summary"]["rollout"].update(busy_within(utilisation.samples, windows[args.warmup:] or windows))
            out.write_text(json.dumps(result, indent=1))
            print(f"[{args.label}] step {step}: {steps[-1]['timing/step']:.2f} s, "
                  f"{steps[-1]['agent/turns_mean']:.1f} turns", flush=True)
        result["status"] = "done"
    finally:
        utilisation.stop()
        out.write_text(json.dumps(result, indent=1))
        controller.close()


if __name__ == "__main__":
    main()
