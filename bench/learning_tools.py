"""An agent that learns to use a tool: arithmetic beyond a small model's reach, with rlkit's `calculator`.

  python bench/learning_tools.py --out OUT_DIR [--tiny] [--budget 560] [--workdir DIR] [--sft-steps N]
      [--rl-steps N] [--runs NAME,...|none] [--reuse-sft]

1. Task: `rlkit prep-data tool-arithmetic` ('What is 4821*9773?'): SFT chats that call the calculator in the chat
   template's tool format and copy its answer after '####' (`-o tool=calculator`, with the `tools` column), the
   same problems answered without it (`-o tool=none`), RL rows, a held-out test split.
2. Tokenizer and model: a BPE trained on the tool chats and a Qwen2 from scratch (scripts/build_scratch_model.py);
   its chat template renders `tools=`, tool calls and results as Qwen2.5's does (rlkit.core.train.scratch).
3. Two SFT runs of the same steps from that model: `sft-tool` on the chats (the warm start that has seen the tool
   format) and `sft-none` on the answers (the no-tool baseline); each exported in bf16.
4. The RL runs (--runs, one after another on GPU 0, each an equal share of the time left):
   rlkit-grpo-tool  `rlkit train grpo` from sft-tool with rollout.agent.loop=tool, tools [calculator]
   trl-grpo-tool    TRL's GRPOTrainer from sft-tool with tools=[calculator] (bench/trl_learning.py)
   rlkit-grpo-none  (not in the default runs) `rlkit train grpo` from sft-none, single turn: what RL does
                    without the tool
   All with the same prompts x samples per step, response length, learning rate, greedy validation every few steps.
   Before them, the no-tool SFT model's greedy score on the test split (bench/greedy_eval.py, single turn): the
   line the tool runs must beat.
5. OUT_DIR: results.json (per run: validation points with tool calls per episode, the training steps' reward and
   tool calls), results.md, learning_tools.png (validation, train reward and tool calls per episode against
   steps, from step 0), bench.log. A copy of results.json stays in the workdir: --reuse-sft starts --runs from the
   exports an earlier call made there (`--runs none`: steps 1-3 only), so the work fits several device calls.

--tiny: the same on CPU (tiny model, a few steps, workers in the CLI process, the transformers engine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.learning import STOP_GRACE_S, Bench, rlkit_cli  # noqa: E402
from bench.learning_results import fail, versions  # noqa: E402
from bench.learning_settings import Settings  # noqa: E402
from bench.learning_tools_report import plot, table, tool_points  # noqa: E402

RUNS = ("rlkit-grpo-tool", "trl-grpo-tool", "rlkit-grpo-none")
DEFAULT_RUNS = RUNS[:2]
MAX_TURNS = 3  # a call, the answer, and one more turn for a model that calls twice
SETTINGS = {
    # NOT YET RUN on a GPU. The 114M-parameter model of bench/learning.py; products of two 4-digit numbers (a 7-8
    # digit answer) are beyond what SFT on answers alone teaches it, while copying numbers into a call and its
    # result out is what a transformer learns first. One operand length: the tiny model learned to copy 2-digit
    # operands in ~250 SFT steps but not mixed 1-2 or 2-3 digit ones in 200 (docs/learning.md); the GPU run is
    # one try. SFT stops early (300 steps) so that RL has room: raise --sft-steps if the tool runs start without
    # the call format or with calls that do not copy the operands, lower it if they start near 1.0.
    "gpu": Settings(
        task={"n_train": 20000, "n_test": 256, "min_digits": 4, "max_digits": 4, "ops": "*"},
        size="large", vocab=1024,
        sft={"data.train_batch_size": 128, "actor.mini_batch_size": 128, "actor.lr": 5e-4, "actor.warmup_steps": 20,
             "actor.lr_schedule": "constant", "data.max_prompt_length": 256, "data.max_response_length": 96,
             "model.compile": "false"},
        sft_steps=300, sft_save_freq=0, prompts=32, samples=8, response_length=96, rl_lr=1e-5, rl_steps=200,
        val_freq=5,
        extra=["rollout.vllm.enforce_eager=true", "model.compile=false", "rollout.gpu_memory_utilization=0.3",
               "trainer.invariants=warn", "rollout.sync_check=warn"]),
    # tests/test_tool_learning_e2e.py's smoke of this script: 2 CPU cores, a few steps (no learning expected).
    "tiny": Settings(
        task={"n_train": 500, "n_test": 8, "min_digits": 2, "max_digits": 2, "ops": "*"},
        size="tiny", vocab=512,
        sft={"data.train_batch_size": 16, "actor.mini_batch_size": 16, "actor.lr": 3e-3,
             "data.max_prompt_length": 192, "data.max_response_length": 64, "actor.micro_batch_tokens": 8192,
             "trainer.workers": "in_process", "trainer.device": "cpu"},
        sft_steps=2, sft_save_freq=0, prompts=2, samples=2, response_length=64, rl_lr=3e-4, rl_steps=1, val_freq=1,
        extra=["actor.micro_batch_tokens=8192", "reward.num_workers=1", "trainer.workers=in_process",
               "trainer.device=cpu", "rollout.name=hf"]),
}


class ToolBench(Bench):
    """bench/learning.py's Bench (commands with deadlines, the log, results.json) for this pipeline."""

    def prepare(self) -> None:
        options = [x for k, v in self.settings.task.items() for x in ("-o", f"{k}={v}")]
        for kind, extra in (("sft", ["--format", "sft"]), ("sft-none", ["--format", "sft", "-o", "tool=none"]),
                            ("rl", [])):
            status = self.run(f"prep-{kind}", rlkit_cli("prep-data", "tool-arithmetic", "--out", str(self.data(kind)),
                                                        *options, *extra), 120, None)
            if status != "ok":
                raise SystemExit(f"prep-data failed ({status}); see {self.out / 'bench.log'}")
        self.build_model()

    def sft_export(self, name: str, kind: str) -> Path:
        """`rlkit train sft` on data `kind` for the settings' steps, its last checkpoint exported in bf16."""
        s = self.settings
        overrides = [f"{k}={v}" for k, v in s.sft.items()] + [
            f"data.train_files=[{self.data(kind) / 'train.parquet'}]",
            f"data.val_files=[{self.data(kind) / 'test.parquet'}]", f"trainer.total_steps={s.sft_steps}",
            "trainer.save_freq=0", "trainer.val_freq=0", "trainer.logger=[jsonl]",
            f"trainer.runs_dir={self.workdir / 'runs'}"]
        export = self.workdir / f"{name}-export"
        for phase, command in ((name, rlkit_cli("train", "sft", "--model", str(self.workdir / "model"), *overrides,
                                                "--run-id", name)),
                               (f"export-{name}", rlkit_cli("export", name, "--runs-dir", str(self.workdir / "runs"),
                                                            "--dtype", "bfloat16", "--out", str(export)))):
            status = self.run(phase, command, max(self.left() - STOP_GRACE_S, 60), "0")
            if status != "ok":
                raise SystemExit(f"{phase} failed ({status}); see {self.out / 'bench.log'}")
        return export

    def no_tool_score(self, model: Path) -> float | None:
        """The no-tool SFT model's greedy score on the RL test split, single turn (bench/greedy_eval.py)."""
        result = self.workdir / "sft-none-score.json"
        command = [sys.executable, str(HERE / "greedy_eval.py"), "--model", str(model), "--data",
                   str(self.data("rl") / "test.parquet"), "--max-new-tokens", "48", "--json-out", str(result)]
        return json.loads(result.read_text())["accuracy"] if self.run("score-sft-none", command, 180, "0") == "ok" \
            else None

    def tool_run(self, name: str, exports: dict[str, Path], deadline_s: float) -> None:
        agent = {"loop": "tool", "tools": ["calculator"], "max_turns": MAX_TURNS, "max_tokens_per_turn": 48}
        if name == "trl-grpo-tool":
            self.trl_run(exports["tool"], deadline_s, "0", name, {k: agent[k] for k in ("tools", "max_turns",
                                                                                         "max_tokens_per_turn")})
            return
        extra = ([] if name == "rlkit-grpo-none" else
                 ["rollout.agent.loop=tool", "rollout.agent.tools=[calculator]", f"rollout.agent.max_turns={MAX_TURNS}",
                  f"rollout.agent.max_tokens_per_turn={agent['max_tokens_per_turn']}"])
        began = time.time()
        self.rlkit_run(name, "grpo", exports["none" if name == "rlkit-grpo-none" else "tool"], extra, deadline_s, "0")
        self.results["runs"][name].update(tool_points(self.workdir / "runs" / name, began))
        self.save()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results.json, results.md, learning_tools.png, bench.log")
    parser.add_argument("--workdir", default=None, help="data, models, runs (default: a new temporary directory)")
    parser.add_argument("--tiny", action="store_true", help="the CPU smoke run: tiny model, a few steps")
    parser.add_argument("--budget", type=float, default=560, help="seconds for everything (the report comes after)")
    parser.add_argument("--sft-steps", type=int, default=None, help="steps of each SFT run (default: the settings')")
    parser.add_argument("--rl-steps", type=int, default=None, help="most steps of each RL run")
    parser.add_argument("--runs", default=",".join(DEFAULT_RUNS), help=f"of {','.join(RUNS)}, in order, or none")
    parser.add_argument("--reuse-sft", action="store_true", help="start --runs from an earlier call's exports")
    args = parser.parse_args()
    names = [] if args.runs == "none" else [n.strip() for n in args.runs.split(",") if n.strip()]
    if any(name not in RUNS for name in names) or len(set(names)) != len(names):
        parser.error(f"--runs {args.runs}: give distinct names from {','.join(RUNS)}, or none")
    if args.reuse_sft and not args.workdir:
        parser.error("--reuse-sft needs the --workdir of the call that ran SFT")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="rlkit-tools-"))
    settings = SETTINGS["tiny" if args.tiny else "gpu"]
    settings = replace(settings, sft_steps=args.sft_steps or settings.sft_steps,
                       rl_steps=args.rl_steps or settings.rl_steps)
    earlier = None
    if args.reuse_sft:
        path = workdir / "results.json"
        if not path.exists():
            fail(f"--reuse-sft: {path} is missing; run once without --reuse-sft with --workdir {workdir} first")
        earlier = json.loads(path.read_text())
        if earlier["settings"] != asdict(settings):
            fail(f"--reuse-sft: {path} was made with other settings; give this call the same --tiny, --sft-steps and "
                 "--rl-steps as that one")
    workdir.mkdir(parents=True, exist_ok=True)
    with (out / "bench.log").open("w") as log:
        bench = ToolBench(out, workdir, settings, args.budget, log, earlier)
        call = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv)}
        bench.results.update(workdir=str(workdir), versions=versions())
        if earlier is None:
            bench.prepare()
            bench.results["exports"] = {"tool": str(bench.sft_export("sft-tool", "sft")),
                                        "none": str(bench.sft_export("sft-none", "sft-none"))}
            bench.results["no_tool_sft"] = bench.no_tool_score(Path(bench.results["exports"]["none"]))
            bench.save()
        exports = {kind: Path(path) for kind, path in bench.results["exports"].items()}
        for index, name in enumerate(names):
            bench.tool_run(name, exports, (bench.left() - STOP_GRACE_S) / (len(names) - index))
        bench.results["calls"].append({**call, "seconds": time.monotonic() - bench.start})
        bench.save()
    (out / "results.md").write_text(table(bench.results))
    plot(bench.results, out / "learning_tools.png")
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
