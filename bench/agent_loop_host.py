"""The agent loop's own host time, without an engine: what a multi-turn rollout costs the rollout worker's
interpreter beside vLLM's client (issue 26: multi-turn generating at >= 0.95x the single-turn rate).

  python bench/agent_loop_host.py --out host.json [--episodes 512] [--turns 3] [--tokens-per-turn 144] [--repeats 4]
      [--profile DIR]

bench/agent_grpo.py's episodes (its environment, ChatML template and the workload's tokenizer) against an engine
stand-in that answers every turn at once with `--tokens-per-turn` tokens: the wall time of `AgentLoop.run` is then
rlkit's own per-episode and per-turn work (guarded environment calls, turn boundaries, decoding the turn for the
environment), best of `--repeats`. `--profile DIR`: py-spy's collapsed stacks of all threads (where installed).
Runs on any machine; no GPU is used.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.agent_env import FixedTurns  # noqa: E402
from bench.agent_grpo import CHATML  # noqa: E402
from bench.workload import SHAPES, bench_tokenizer  # noqa: E402


class InstantEngine:
    """A streaming engine stand-in: each turn's tokens come back at once (rlkit.core.agents.turns.StreamedTurns)."""

    streams = True

    def __init__(self) -> None:
        from rlkit.core.rollout.event_loop import EventLoop

        self.events = EventLoop("bench-instant-engine")

    def run(self, coroutine):
        return self.events.run(coroutine)

    async def sample(self, prompt, sampling, seed, max_tokens, place=(0, 1)):
        from rlkit.core.rollout.base import RolloutSample

        await asyncio.sleep(0)
        return RolloutSample(0, [70 + seed % 20] * max_tokens, [], False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--episodes", type=int, default=512)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--tokens-per-turn", type=int, default=144)
    parser.add_argument("--message-chars", type=int, default=19)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--profile", help="folder for py-spy's collapsed stacks of one more run")
    args = parser.parse_args()
    from rlkit.core.agents.guard import Guard
    from rlkit.core.agents.loop import AgentLoop, Limits
    from rlkit.core.data.dataset import PromptRow
    from rlkit.core.rollout.base import Sampling

    tokenizer = bench_tokenizer(SHAPES["0.5b"].vocab)
    tokenizer.chat_template = CHATML
    samples = 8
    rows = [PromptRow(i, [65 + i % 20] * 64, "bench", "", prompt="x" * 64) for i in range(args.episodes // samples)]
    limits = Limits(args.turns, args.tokens_per_turn, 512 * args.turns, 64)
    loop = AgentLoop(tokenizer, lambda: FixedTurns(args.turns, args.message_chars), limits, Guard(60.0))
    engine = InstantEngine()
    sampling = Sampling(n=samples, max_tokens=limits.max_response_tokens, seed=1, log_probs=False)
    seconds = []
    for _ in range(args.repeats):
        began = time.perf_counter()
        trajectories = loop.run(engine, rows, list(range(len(rows))), sampling)
        seconds.append(time.perf_counter() - began)
    turns = sum(t.info.get("turns", args.turns) for t in trajectories) if trajectories else 0
    result = {"episodes": len(trajectories), "turns_per_episode": args.turns, "seconds": seconds,
              "best_seconds": min(seconds), "ms_per_episode": min(seconds) / len(trajectories) * 1e3,
              "ms_per_turn": min(seconds) / max(turns, 1) * 1e3, "args": vars(args)}
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(json.dumps({k: v for k, v in result.items() if k != "args"}))
    spy = shutil.which("py-spy")
    if args.profile and spy:
        folder = Path(args.profile)
        folder.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, __file__, "--out", str(folder / "profiled.json"), "--episodes", str(args.episodes),
                   "--turns", str(args.turns), "--tokens-per-turn", str(args.tokens_per_turn), "--repeats", "3"]
        subprocess.run([spy, "record", "-r", "200", "--threads", "-f", "raw", "-o", str(folder / "stacks.txt"), "--",
                        *command], check=False)


if __name__ == "__main__":
    main()
