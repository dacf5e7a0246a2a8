"""Learning, side by side: SFT a model built from scratch, then GRPO / PPO / DAPO with rlkit and GRPO with TRL.

  python bench/learning.py --out OUT_DIR [--tiny] [--gpus 2] [--budget 540] [--sft-budget 200] [--workdir DIR]
      [--sft-steps N] [--rl-steps N] [--runs NAME,...|none] [--reuse-sft] [--sft-plateau MIN_GAIN]

1. Task: `rlkit prep-data arithmetic` (GSM8K-format word problems, worked solutions ending in
   '#### N'), as SFT rows and as RL rows, with a held-out test split.
2. Tokenizer and model: a BPE trained on the task's text and a Qwen2 of SETTINGS' size
   (rlkit.core.train.scratch), one `--model DIR` directory.
3. SFT: `rlkit train sft` with a checkpoint every SETTINGS' sft_save_freq steps; the latest whose
   greedy test score is at most 0.6 (a middling start) is exported with `rlkit export` in bf16. With
   --sft-plateau MIN_GAIN (on a GPU with the harder task of learning_settings' gpu-hard), every checkpoint is
   scored and RL starts from the SFT plateau: the first checkpoint after which no score rises by MIN_GAIN or
   more; the RL runs then run --rl-steps steps each, equal samples (DAPO with one generation round).
4. The RL runs (--runs: rlkit GRPO, TRL's GRPOTrainer (bench/trl_learning.py), rlkit PPO with a
   critic, rlkit DAPO), all from the SFT export, with the same prompts per step, samples per prompt,
   response length, learning rate and loss aggregation (token-mean), greedy validation on the test
   split before training and every few steps. --gpus 1: one after another on GPU 0; --gpus 2: two
   lanes at once, run i of --runs on GPU i % 2 (CUDA_VISIBLE_DEVICES). Each run of a lane gets an
   equal share of the time its lane has left. Both tools' vLLM engines are eager (no CUDA graphs):
   engine start-up is ~40-60 s eager against ~130-175 s with graphs, a large share of a few-minute run.
5. OUT_DIR: results.json (validation accuracy against samples and against seconds since each run
   started, per run), learning.png (both curves, rlkit plot style), results.md (a table), bench.log.
   A copy of results.json stays in the workdir: --reuse-sft (a later call with the same --workdir)
   skips steps 1-3, starts its --runs from the same SFT export and adds them to those results, so
   the work fits several device calls (`--runs none`: steps 1-3 only).

Every phase has a deadline inside --budget: an rlkit run past it gets SIGTERM (it finishes the
step, checkpoints and stops), TRL stops itself; whatever validation points exist are reported. The
last run's deadline leaves STOP_GRACE_S for its stop, so a call ends within --budget (plus the report).
--tiny runs the same pipeline on CPU with a tiny model and a few steps (tests/test_learning_bench.py), each rlkit
run's worker an object in its CLI process (trainer.workers=in_process) and the transformers rollout engine; the TRL
lane needs `trl` importable and is skipped (reported as such) when it is not.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, replace
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from bench.learning_report import plot, table  # noqa: E402
from bench.learning_results import earlier_results, pick_checkpoint, plateau_step, rlkit_points, versions  # noqa: E402
from bench.learning_settings import RUNS, SETTINGS, SFT_MAX_SCORE, STOP_GRACE_S, Settings  # noqa: E402


def rlkit_cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "rlkit.cli.main", *args]


class Bench:
    def __init__(self, out: Path, workdir: Path, settings: Settings, budget: float, log,
                 earlier: dict | None = None) -> None:
        """`earlier`: the results of an earlier call with this workdir (--reuse-sft), which this call adds to."""
        self.out, self.workdir, self.settings, self.log = out, workdir, settings, log
        self.start, self.budget = time.monotonic(), budget
        self.results: dict = earlier or {"settings": asdict(settings), "runs": {}, "phases": {}, "calls": []}
        self.lock = threading.Lock()

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def run(self, name: str, command: list[str], deadline_s: float, gpu: str | None) -> str:
        """One command in its own session; SIGTERM at the deadline (rlkit finishes the step, checkpoints and
        stops), then SIGKILL to the whole session (STOP_GRACE_S later at most)."""
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
                proc.wait(timeout=STOP_GRACE_S)
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
            self.results["phases"][name] = {"status": status, "began": began - self.start,
                                            "seconds": time.monotonic() - began}
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
        self.build_model()

    def build_model(self) -> None:
        """The scratch model and tokenizer, from the SFT data's texts (scripts/build_scratch_model.py)."""
        model = self.workdir / "model"
        status = self.run("build-model", [sys.executable, str(HERE.parent / "scripts" / "build_scratch_model.py"),
                                          "--data", str(self.data("sft") / "train.parquet"), "--out", str(model),
                                          "--size", self.settings.size, "--vocab", str(self.settings.vocab)], 300, None)
        if status != "ok":
            raise SystemExit(f"building the model failed ({status}); see {self.out / 'bench.log'}")
        self.results["model"] = json.loads((model / "rlkit_scratch.json").read_text())

    def data(self, kind: str) -> Path:
        return self.workdir / "data" / kind

    def sft(self, deadline_s: float, plateau: float | None = None) -> Path:
        """`rlkit train sft` (a checkpoint every sft_save_freq steps, all kept), then the checkpoint RL starts from,
        exported: without `plateau`, the latest whose greedy test score is at most SFT_MAX_SCORE (a warm start that
        leaves RL room to improve); with it, the SFT plateau: every checkpoint is scored and the first after which no
        score rises by `plateau` or more is taken (learning_results.plateau_step)."""
        s = self.settings
        overrides = [f"{k}={v}" for k, v in s.sft.items()] + [
            f"data.train_files=[{self.data('sft') / 'train.parquet'}]",
            f"data.val_files=[{self.data('sft') / 'test.parquet'}]", f"trainer.total_steps={s.sft_steps}",
            f"trainer.save_freq={s.sft_save_freq}",
            f"trainer.keep_last={s.sft_steps // s.sft_save_freq + 1}", "trainer.val_freq=0",
            "trainer.logger=[jsonl]", f"trainer.runs_dir={self.workdir / 'runs'}"]
        self.run("sft", rlkit_cli("train", "sft", "--model", str(self.workdir / "model"), *overrides, "--run-id",
                                  "sft"), deadline_s, "0")
        folder = self.workdir / "runs" / "sft" / "checkpoints"
        steps = [int(p.name.removeprefix("step_")) for p in folder.glob("step_*")
                 if p.name.removeprefix("step_").isdigit()]
        if plateau is None:
            chosen, scores = pick_checkpoint(steps, lambda step: self.greedy_scores([step]).get(step), SFT_MAX_SCORE)
        else:
            scores = self.greedy_scores(steps)
            chosen, reached = plateau_step(scores, plateau)
            self.results["sft_plateau"] = {"min_gain": plateau, "step": chosen, "reached": reached}
        self.results.update(sft_checkpoints=scores, sft_step=chosen)
        self.save()
        if chosen is None:
            raise SystemExit(f"no SFT checkpoint could be exported and scored; see {self.out / 'bench.log'}")
        return self.workdir / f"sft-export-{chosen}"

    def greedy_scores(self, steps: list[int]) -> dict[int, float]:
        """Each SFT checkpoint of `steps` exported (at once: CPU work) and scored greedily on the test split in one
        process on GPU 0; a step whose export or scoring failed has no score."""
        exports = {step: self.workdir / f"sft-export-{step}" for step in steps}

        def export(step: int) -> None:
            # bf16, as a hub checkpoint: both tools keep fp32 master weights (rlkit always, TRL by default)
            # and both engines load bf16 (an fp32 checkpoint would make TRL's vLLM run in fp32).
            if self.run(f"export-{step}", rlkit_cli("export", "sft", "--runs-dir", str(self.workdir / "runs"),
                                                    "--step", str(step), "--dtype", "bfloat16", "--out",
                                                    str(exports[step])), 120, None) != "ok":
                exports.pop(step)

        threads = [threading.Thread(target=export, args=(step,)) for step in steps]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if not exports:
            return {}
        result = self.workdir / f"sft-scores-{'-'.join(map(str, sorted(exports)))}.json"
        command = [sys.executable, str(HERE / "greedy_eval.py"), *[x for e in exports.values() for x in ("--model",
                   str(e))], "--data", str(self.data("rl") / "test.parquet"), "--max-new-tokens",
                   str(self.settings.response_length), "--json-out", str(result)]
        if self.run(f"score-{'-'.join(map(str, sorted(exports)))}", command, 60 + 30 * len(exports), "0") != "ok":
            return {}
        scores = json.loads(result.read_text())["scores"]
        return {step: scores[str(export)] for step, export in exports.items()}

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
        # A run named again (a retry with --reuse-sft) replaces the earlier one: rlkit refuses a used run directory.
        shutil.rmtree(self.workdir / "runs" / name, ignore_errors=True)
        began = time.time()
        status = self.run(name, rlkit_cli("train", recipe, "--model", str(model), *self.rl_overrides(), *extra,
                                          "--run-id", name), deadline_s, gpu)
        points = rlkit_points(self.workdir / "runs" / name, began)
        with self.lock:
            self.results["runs"][name] = {"tool": "rlkit", "recipe": recipe, "status": status, "points": points}
        self.save()

    def trl_run(self, model: Path, deadline_s: float, gpu: str, name: str = "trl-grpo",
                extra_spec: dict | None = None) -> None:
        """bench/trl_learning.py on `model`, as run `name`; `extra_spec` adds to its spec (tools: learning_tools)."""
        s = self.settings
        if importlib.util.find_spec("trl") is None:
            with self.lock:
                self.results["runs"][name] = {"tool": "trl", "status": "skipped: trl is not installed", "points": []}
            return
        spec = {"model": str(model), "train": str(self.data("rl") / "train.parquet"),
                "test": str(self.data("rl") / "test.parquet"), "prompts": s.prompts, "samples": s.samples,
                "response_length": s.response_length, "lr": s.rl_lr, "steps": s.rl_steps, "val_freq": s.val_freq,
                "deadline_s": max(deadline_s - 30, 1), "gpu_memory_utilization": 0.3, "label": name,
                **(extra_spec or {})}
        spec_file, result_file = self.workdir / f"{name}-spec.json", self.workdir / f"{name}-result.json"
        spec_file.write_text(json.dumps(spec))
        status = self.run(name, [sys.executable, str(HERE / "trl_learning.py"), "--spec", str(spec_file),
                                 "--out", str(result_file)], deadline_s, gpu)
        result = json.loads(result_file.read_text()) if result_file.exists() else {}
        with self.lock:
            if status == "ok" and "stopped_at_deadline" in result:  # TRL stops itself before its deadline
                status = "stopped at its deadline"
            self.results["runs"][name] = {"tool": "trl", "recipe": "GRPOTrainer", "status": status,
                                          "trl_status": result.get("status"), "points": result.get("points", []),
                                          "train": result.get("train", [])}
        self.save()

    def rl_run(self, name: str, model: Path, deadline_s: float, gpu: str) -> None:
        s = self.settings
        if name == "trl-grpo":
            return self.trl_run(model, deadline_s, gpu)
        recipe, extra = {
            "rlkit-grpo": ("grpo", []),
            "rlkit-ppo": ("ppo", [f"data.train_batch_size={s.prompts * s.samples}", "rollout.n=1",
                                  f"actor.mini_batch_size={s.prompts * s.samples}", f"critic.lr={s.rl_lr * 10}"]),
            # From the SFT plateau the runs compare equal samples: one generation round, no resampling.
            "rlkit-dapo": ("dapo", ["reward.overlong_buffer.enable=false", "algorithm.dynamic_sampling.max_gen_rounds="
                                    f"{1 if 'sft_plateau' in self.results else 3}"]),
        }[name]
        self.rlkit_run(name, recipe, model, extra, deadline_s, gpu)

    def lane(self, names: list[str], model: Path, gpu: str) -> None:
        """`names` one after another on one device, each given an equal share of the time left, less the
        STOP_GRACE_S the last one may take to stop."""
        for index, name in enumerate(names):
            self.rl_run(name, model, (self.left() - STOP_GRACE_S) / (len(names) - index), gpu)

    def rl_runs(self, names: list[str], model: Path, gpus: int) -> None:
        """--gpus 1: every run in turn on GPU 0 (vLLM's sleep mode assumes it is alone on its GPU: a second
        process there can stop a run). --gpus 2: two lanes at once, run i of `names` on GPU i % 2."""
        lanes = [(names, "0")] if gpus == 1 else [(names[0::2], "0"), (names[1::2], "1")]
        threads = [threading.Thread(target=self.lane, args=(lane, model, gpu)) for lane, gpu in lanes if lane]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def save(self) -> None:
        """results.json in --out, and its copy in the workdir that a later --reuse-sft call adds to."""
        with self.lock:
            text = json.dumps(self.results, indent=1)
            (self.out / "results.json").write_text(text)
            (self.workdir / "results.json").write_text(text)


def run_names(text: str) -> list[str]:
    """`--runs`: distinct names from RUNS, or `none` (task, model and SFT only: on one GPU the first of three
    calls, so that the runs compared in the next call get equal shares of a whole call)."""
    if text.strip() == "none":
        return []
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in RUNS]
    if unknown or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"{text!r}: give distinct names from {','.join(RUNS)}, or none")
    return names


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="results.json, results.md, learning.png, bench.log go here")
    parser.add_argument("--workdir", default=None,
                        help="data, model and run directories and a copy of results.json (default: a new temporary "
                             "directory; keep it out of --out where only a few files may come back)")
    parser.add_argument("--tiny", action="store_true", help="the CPU smoke run: tiny model, a few steps")
    parser.add_argument("--budget", type=float, default=540,
                        help="seconds for everything, the stop of a run past its deadline included (the report and "
                             "the picture take a few seconds more)")
    parser.add_argument("--sft-budget", type=float, default=200,
                        help="seconds from the start to the end of SFT, less 30 s (choosing and exporting the SFT "
                             "checkpoint comes after it)")
    parser.add_argument("--sft-steps", type=int, default=None, help="SFT steps (default: the settings')")
    parser.add_argument("--gpus", type=int, default=2, choices=[1, 2],
                        help="1: the RL runs one after another on GPU 0, each given an equal share of the time left "
                             "(vLLM's sleep mode assumes it is alone on its GPU: two runs at once on one GPU stopped "
                             "rlkit runs, docs/learning.md); 2: two lanes at once, run i of --runs on GPU i %% 2, "
                             "each run an equal share of its lane's time")
    parser.add_argument("--runs", type=run_names, default=list(RUNS),
                        help=f"the RL runs of this call, in this order (default: {','.join(RUNS)}); none: SFT only")
    parser.add_argument("--reuse-sft", action="store_true",
                        help="skip task, model and SFT: start --runs from the SFT export an earlier call made in "
                             "--workdir and add them to its results (results.json there), so that this call's "
                             "outputs hold every run of both")
    parser.add_argument("--rl-steps", type=int, default=None,
                        help="most steps of each RL run (default: the settings'; without --sft-plateau the deadline "
                             "usually ends a run first)")
    parser.add_argument("--sft-plateau", type=float, default=None, metavar="MIN_GAIN",
                        help="RL from the SFT plateau: every SFT checkpoint is scored and RL starts from the first "
                             "after which no score rises by MIN_GAIN or more (e.g. 0.02); on a GPU with the harder "
                             "task (gpu-hard in bench/learning_settings.py: the default task plateaus near 1.0). The "
                             "RL runs then compare equal samples: each runs --rl-steps steps of the same prompts x "
                             "samples (DAPO generates one round: no resampling); give them time for it")
    args = parser.parse_args()
    if args.reuse_sft and not args.workdir:
        parser.error("--reuse-sft needs the --workdir of the call that ran SFT")
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="rlkit-learning-"))
    if args.tiny:  # two CPU engines at once (--gpus 2): a small KV cache each, no thread pinning
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
    settings = SETTINGS["tiny" if args.tiny else "gpu" if args.sft_plateau is None else "gpu-hard"]
    settings = replace(settings, sft_steps=args.sft_steps or settings.sft_steps,
                       rl_steps=args.rl_steps or settings.rl_steps)
    earlier, model = earlier_results(workdir, asdict(settings)) if args.reuse_sft else (None, None)
    workdir.mkdir(parents=True, exist_ok=True)
    with (out / "bench.log").open("w") as log:
        bench = Bench(out, workdir, settings, args.budget, log, earlier)
        call = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "command": " ".join(sys.argv),
                "gpus": args.gpus, "runs": args.runs}
        bench.results.update(workdir=str(workdir), versions=versions())
        if model is None:
            bench.prepare()
            model = bench.sft(args.sft_budget - (time.monotonic() - bench.start) - 30, args.sft_plateau)
        bench.rl_runs(args.runs, model, args.gpus)
        bench.results["calls"].append({**call, "seconds": time.monotonic() - bench.start})
        bench.save()
    (out / "results.md").write_text(table(bench.results))
    plot(bench.results, out / "learning.png")
    print((out / "results.md").read_text())


if __name__ == "__main__":
    main()
