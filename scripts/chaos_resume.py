"""Kill a PPO run at random points, continue it each time, and compare every metric to an uninterrupted run.

  python scripts/chaos_resume.py --out /tmp/chaos [--seed 0] [--kills 5] [--steps 6] [--points-only]

The run: PPO with a critic (its own worker group, one warm-up step), an adaptive KL penalty in the
reward (a reference model, and a KL coefficient that the checkpoint must restore), responses of
up to 4 tokens, two optimizer steps per RL step, a checkpoint after every step; the tiny offline
model and the transformers engine on CPU, which are deterministic (docs/resume.md).

First one run goes through uninterrupted: the reference. With --points-only its workers are objects in its CLI
process (trainer.workers=in_process: no Ray cluster to start; no kill needs its timing), so the comparison
also pins that Ray and in-process workers compute the same numbers; without it, it runs on Ray as the killed
runs do, and its step and start-up times place the timed kills. Then the same run is started and killed
`--kills` times, each time in one of these ways, chosen at random (seeded):
  worker-kill   a training or critic worker is SIGKILLed on entering a phase (RLKIT_FAULT kill): the
                run notices and exits 1 by itself
  tree-kill     the run stops (RLKIT_FAULT hang) on entering a worker phase or halfway through writing
                a checkpoint (shards written, COMPLETE marker not yet), and the whole process tree
                (controller, Ray, workers) is SIGKILLed there, as a power cut or the OOM killer would
  timed-kill    the tree is SIGKILLed at a random moment within a step (not with --points-only,
                which keeps a seeded run the same every time)
After each kill the run is continued the way its last message says: `rlkit resume` from the last
complete checkpoint, or, before the first one, `rlkit train <run>/config.yaml --run-id` again.
The last continuation runs to the end. Then metrics.jsonl must hold every step exactly once, each
with every non-timing metric equal (==) to the reference's. The report (stdout and OUT/report.json)
says what was killed where, how the run continued, and the comparison. Exit code 0 when equal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rlkit.core.cluster.faults import HANG_MESSAGE  # noqa: E402
from rlkit.core.controller.tracking import is_timing_key  # noqa: E402
from rlkit.core.data.builders import write_parquet  # noqa: E402
from rlkit.core.data.synthetic import build_synthetic  # noqa: E402
from rlkit.core.state.checkpoint import interrupted_writes, latest_checkpoint, list_checkpoints  # noqa: E402

RUN_TIMEOUT_S = 600
CRITIC_WARMUP = 1
# Worker phases entered once in every step, by the policy (worker0) or the critic (also worker0 of its group).
EVERY_STEP = ("generate", "log_probs/actor", "log_probs/ref", "compute_values", "update_critic", "save_checkpoint")


def overrides(data: Path, runs: Path, steps: int) -> list[str]:
    return [
        "model.path=rlkit:tiny-qwen2", f"data.train_files=[{data}]", "data.train_batch_size=4",
        "data.max_prompt_length=16", "data.max_response_length=4", "data.shuffle=true",
        "rollout.name=hf", "rollout.n=1", "actor.mini_batch_size=2", "actor.lr=1e-3", "actor.entropy_coeff=0.01",
        "critic.lr=1e-3", f"critic.warmup_steps={CRITIC_WARMUP}",
        "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.kl_coef=0.05",
        "algorithm.kl_ctrl.target_kl=0.01", "algorithm.kl_ctrl.horizon=100",
        f"trainer.total_steps={steps}", "trainer.save_freq=1", "trainer.keep_last=2", "trainer.logger=[jsonl]",
        f"trainer.runs_dir={runs}",
    ]


@dataclass
class Kill:
    kind: str        # worker-kill, tree-kill or timed-kill
    where: str       # the fault point (RLKIT_FAULT), or when a timed kill fired
    step: int        # the step in flight when it fired
    exit_code: int | None = None  # of the killed process (None: killed from outside)
    left: str = ""                # what the run directory held afterwards: checkpoints, a torn write
    continued_with: str = ""      # the command that continued the run


class Chaos:
    def __init__(self, out: Path, seed: int, steps: int, points_only: bool) -> None:
        self.out, self.steps, self.points_only = out, steps, points_only
        self.rng = random.Random(seed)
        self.runs = out / "runs"
        rows = build_synthetic(task="echo", n_train=12, n_test=1, seed=3)["train"]
        self.data = write_parquet(rows, out / "echo12.parquet")
        self.step_seconds = self.startup_seconds = 5.0  # measured by the reference run
        self.logs = 0

    # -- processes ------------------------------------------------------------------------
    def start(self, args: list[str], fault: str | None = None) -> tuple[subprocess.Popen, Path]:
        """The CLI in its own session, so its whole tree can be killed as one group."""
        self.logs += 1
        log = self.out / f"{self.logs:02d}-{args[0]}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO), "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "HF_HUB_OFFLINE": "1",
               "RLKIT_WORKER_LOGS": "1", "COLUMNS": "250"}  # worker output (the hang notice) in the log
        env.pop("RLKIT_FAULT", None)
        if fault:
            env["RLKIT_FAULT"] = fault
        proc = subprocess.Popen([sys.executable, "-m", "rlkit.cli.main", *args], cwd=REPO, env=env,
                                stdout=log.open("w"), stderr=subprocess.STDOUT, start_new_session=True)
        return proc, log

    def finish(self, proc: subprocess.Popen, log: Path) -> int:
        try:
            return proc.wait(timeout=RUN_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_tree(proc)
            raise SystemExit(f"{log} did not finish within {RUN_TIMEOUT_S} s") from None

    # -- the two runs -----------------------------------------------------------------------
    def reference(self) -> list[dict]:
        started = time.monotonic()
        workers = ["trainer.workers=in_process", "trainer.device=cpu"] if self.points_only else []
        proc, log = self.start(["train", "ppo", *overrides(self.data, self.runs, self.steps), *workers,
                                "--run-id", "reference"])
        if self.finish(proc, log) != 0:
            raise SystemExit(f"the reference run failed:\n{log.read_text()[-3000:]}")
        records = metrics(self.runs / "reference")
        self.step_seconds = sum(r["timing/step"] for r in records) / len(records)
        self.startup_seconds = max(0.0, time.monotonic() - started - self.step_seconds * len(records))
        return records

    def chaos(self, kills: int) -> list[Kill]:
        run = self.runs / "chaos"
        args = ["train", "ppo", *overrides(self.data, self.runs, self.steps), "--run-id", "chaos"]
        done: list[Kill] = []
        while len(done) < kills and last_step(run) < self.steps:
            kill = self.plan(last_step(run))
            action = {"worker-kill": "kill", "tree-kill": "hang"}.get(kill.kind)
            proc, log = self.start(args, fault=f"{action}:{kill.where}" if action else None)
            if kill.kind == "worker-kill":
                kill.exit_code = self.finish(proc, log)
            else:
                self.wait_for_kill_point(kill, proc, log, run)
                kill_tree(proc)
            if kill.exit_code == 0 and kill.kind != "timed-kill":
                raise SystemExit(f"the run finished although it was to be killed at {kill.where}; see {log}")
            done.append(kill)
            if kill.exit_code == 0:  # a timed kill that came after the last step
                kill.continued_with = "nothing: the run had finished"
                return done
            kill.left = what_is_left(run)
            args = continue_command(run)
            kill.continued_with = "rlkit " + " ".join(args)
            print(f"kill {len(done)}: {kill.kind} at {kill.where} (planned in step {kill.step}); exit code "
                  f"{kill.exit_code if kill.exit_code is not None else 'SIGKILL'}; left {kill.left}; continue: "
                  f"{kill.continued_with}", flush=True)
        if last_step(run) < self.steps:  # else a kill came after the last checkpoint: nothing left to train
            proc, log = self.start(args)
            if self.finish(proc, log) != 0:
                raise SystemExit(f"the last continuation failed:\n{log.read_text()[-3000:]}")
        return done

    def plan(self, start: int) -> Kill:
        """A random kill in a step still to come, for a process that continues after step `start`."""
        step = self.rng.randint(start + 1, self.steps)
        kinds = ["worker-kill", "tree-kill"] + ([] if self.points_only else ["timed-kill"])
        kind = self.rng.choice(kinds)
        if kind == "timed-kill":  # anywhere in the step, or, for the process's first step, in its start-up too
            if step > start + 1:
                return Kill(kind, f"{self.rng.uniform(0, self.step_seconds):.2f} s after step {step - 1} was logged",
                            step)
            return Kill(kind, f"{self.rng.uniform(0, self.startup_seconds + self.step_seconds):.2f} s after the "
                              "process started", step)
        points = [p for p in EVERY_STEP if not (kind == "tree-kill" and p == "save_checkpoint")]
        if step > CRITIC_WARMUP:
            points.append("update_actor")  # the critic's warm-up step leaves the actor as is
        if kind == "tree-kill":
            points.append("checkpoint-before-marker")
        point = self.rng.choice(points)
        if point == "checkpoint-before-marker":
            return Kill(kind, f"{point}:{step}", step)  # this point counts steps, not arrivals
        first = max(start, CRITIC_WARMUP) if point == "update_actor" else start
        return Kill(kind, f"worker0.{point}:{step - first}", step)  # the N-th arrival in this process

    def wait_for_kill_point(self, kill: Kill, proc: subprocess.Popen, log: Path, run: Path) -> None:
        """Until the hang notice (tree-kill), or the chosen moment (timed-kill); the process may end first."""
        deadline = time.monotonic() + RUN_TIMEOUT_S
        console_log = run / "console.log"
        offset = console_log.stat().st_size if console_log.exists() else 0  # what earlier processes wrote
        if kill.kind == "tree-kill":
            reached = lambda: HANG_MESSAGE in log.read_text()  # noqa: E731
        elif "process started" in kill.where:
            reached = lambda: True  # noqa: E731
        else:  # this process logged the step before (console.log: one line per step)
            line = f"rlkit.metrics: step {kill.step - 1} "
            reached = lambda: line in read_from(console_log, offset)  # noqa: E731
        while not reached():
            if proc.poll() is not None:
                kill.exit_code = proc.returncode
                return
            if time.monotonic() > deadline:
                kill_tree(proc)
                raise SystemExit(f"never reached {kill.where}; see {log}")
            time.sleep(0.05)
        if kill.kind == "timed-kill":
            time.sleep(float(kill.where.split()[0]))
            kill.exit_code = proc.poll()


def read_from(path: Path, offset: int) -> str:
    """The text written to `path` after `offset` (all of it if the file was replaced by a shorter one)."""
    if not path.exists():
        return ""
    text = path.read_text()
    return text[offset:] if len(text) >= offset else text


def continue_command(run: Path) -> list[str]:
    """How the run's own messages say to continue: resume from a checkpoint, or train it again."""
    try:
        latest_checkpoint(run, warn=False)
    except Exception:  # noqa: BLE001 - no checkpoint yet: start again under the same id
        return ["train", str(run / "config.yaml"), "--run-id", run.name, f"trainer.runs_dir={run.parent}"]
    return ["resume", run.name, "--runs-dir", str(run.parent)]


def what_is_left(run: Path) -> str:
    """The run directory after a kill, in words: the last complete checkpoint, any half-written one."""
    steps = [c.step for c in list_checkpoints(run) if c.problem is None]
    torn = [p.name for p in interrupted_writes(run)]
    logged = last_step(run, logged=True)
    return (f"steps logged up to {logged}, " + (f"checkpoints {steps}" if steps else "no checkpoint")
            + (f", a half-written {', '.join(torn)}" if torn else ""))


def last_step(run: Path, logged: bool = False) -> int:
    """The last complete checkpoint's step (or, `logged`, the last step in metrics.jsonl); 0 if none."""
    if logged:
        return max((r["step"] for r in metrics(run)), default=0)
    try:
        return latest_checkpoint(run, warn=False).step
    except Exception:  # noqa: BLE001 - no run directory or no checkpoint yet
        return 0


def metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def kill_tree(proc: subprocess.Popen) -> None:
    """SIGKILL the process group, then any descendant that left it (Ray's own processes)."""
    try:
        family = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        family = []
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    for child in family:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    proc.wait()
    psutil.wait_procs(family, timeout=30)


def compare(got: list[dict], want: list[dict]) -> dict:
    """Each step once, in order, with the same keys and every non-timing value equal."""
    steps = [r["step"] for r in got]
    mismatches = {}
    for mine, theirs in zip(got, want):
        differ = {k: [mine.get(k), theirs.get(k)] for k in set(mine) | set(theirs)
                  if not is_timing_key(k) and mine.get(k) != theirs.get(k)}
        if differ:
            mismatches[mine["step"]] = differ
    compared = sum(1 for r in got for k in r if not is_timing_key(k) and k != "step")
    return {"steps": steps, "each_step_once": steps == [r["step"] for r in want], "values_compared": compared,
            "mismatches": mismatches}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, type=Path, help="a new folder for runs, logs and report.json")
    parser.add_argument("--seed", type=int, default=None, help="picks the kills (default: random, printed)")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--points-only", action="store_true", help="no timed kills: a seed gives the same run")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
    args.out.mkdir(parents=True, exist_ok=False)
    os.environ.setdefault("RLKIT_CACHE", str(args.out / "cache"))
    print(f"chaos: seed {seed}, {args.kills} kills, {args.steps} steps; PPO + critic + adaptive KL in the reward, "
          "responses up to 4 tokens", flush=True)
    chaos = Chaos(args.out, seed, args.steps, args.points_only)
    started = time.monotonic()
    reference = chaos.reference()
    kills = chaos.chaos(args.kills)
    result = compare(metrics(chaos.runs / "chaos"), reference)
    equal = result["each_step_once"] and not result["mismatches"]
    report = {"seed": seed, "steps": args.steps, "kills": [asdict(k) for k in kills], **result, "equal": equal,
              "seconds": round(time.monotonic() - started)}
    (args.out / "report.json").write_text(json.dumps(report, indent=1))
    print(f"steps logged: {result['steps']} (each once: {result['each_step_once']}); {result['values_compared']} "
          f"non-timing values compared with the uninterrupted run: "
          + ("all equal" if equal else f"MISMATCHES {json.dumps(result['mismatches'])[:2000]}"), flush=True)
    sys.exit(0 if equal else 1)


if __name__ == "__main__":
    main()
