"""Where the host time went in a py-spy profile of every process (`bench/rlkit_grpo.py --host-profile`,
`bench/vllm_rollout.py --profile`), per process, per thread and per function; with `--vs`, against another.

  python bench/py_spy_summary.py PROFILE.txt [--vs OTHER.txt] [--top 25] [--rate 200] [--process EngineCore]
      [--imports]

PROFILE is py-spy's raw (collapsed) output: one stack a line, `frame;frame;... count`, each process's frames
after its `process PID:"command"` frame (`--subprocesses` nests a child's under its parent's). A process is named
by its command's first word (Ray's actors and vLLM's engine cores name themselves: `ray::PolicyWorker`,
`VLLM::EngineCore`); processes of one name are summed (two replicas' engine cores), and --process keeps those
whose name contains the text. Seconds are samples / --rate (py-spy's default 100 a second, rlkit's 200): a
thread's busy seconds in the profiled window, idle threads not sampled. Functions are counted inclusively (a
sample counts once for every function on its stack), named without line numbers so the call sites of one
function add up. Made to read a like-for-like step's profile against one without rollout log-probs: which process
and thread the extra seconds are in (docs/benchmarks.md, "Where rollout log-probs cost").
--imports adds, per process, the seconds inside each module's import (its `<module>` frame, inclusive: a package's
import holds its submodules'), to read a start-up's profile (`py-spy record --subprocesses -- python3 ...`): which
imports each process pays. A child that multiprocessing spawned and that has not named itself yet (vLLM's engine
core while it imports) is `mp-spawn`.
"""

from __future__ import annotations

import argparse
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

_PROCESS = re.compile(r'^process \d+:"(?P<command>.*)"$')
_FRAME = re.compile(r"^(?P<function>.*?) \((?P<file>[^()]*?)(?::\d+)?\)$")


@dataclass
class Profile:
    """Samples by process name, by (process, thread root) and by (process, function)."""

    processes: Counter = field(default_factory=Counter)
    threads: Counter = field(default_factory=Counter)
    functions: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    imports: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))  # process -> module file


def process_name(frame: str) -> str:
    """`process 4129:"ray::PolicyWorker"` -> `ray::PolicyWorker`; a command's first word, without its folder."""
    match = _PROCESS.match(frame)
    command = match.group("command") if match else frame
    if "multiprocessing.spawn" in command:
        return "mp-spawn"
    words = command.split()
    first = words[0] if words else command
    if first.endswith(("python", "python3")) or re.search(r"python3?\.\d+$", first):
        first = next((w for w in words[1:] if not w.startswith("-")), first)  # the script, not the interpreter
    return first.rsplit("/", 1)[-1]


def function_name(frame: str) -> str:
    """`Worker.main_loop (ray/_private/worker.py:1069)` -> `Worker.main_loop (worker.py)`."""
    match = _FRAME.match(frame)
    if not match:
        return frame
    return f"{match.group('function')} ({match.group('file').rsplit('/', 1)[-1]})"


def split_frames(stack: str) -> list[str]:
    """A stack's frames: split at `;`, except inside a process frame's quoted command (`python -c "a; b"`)."""
    frames: list[str] = []
    for piece in stack.split(";"):
        if frames and frames[-1].startswith("process ") and not _PROCESS.match(frames[-1]):
            frames[-1] += ";" + piece  # the command's closing quote is still to come
        else:
            frames.append(piece)
    return frames


def module_file(frame: str) -> str | None:
    """`<module> (vllm/config/__init__.py:12)` -> `vllm/config/__init__.py`; None for any other frame."""
    match = _FRAME.match(frame)
    return match.group("file") if match and match.group("function") == "<module>" else None


def read(path: Path) -> Profile:
    profile = Profile()
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = split_frames(stack)
        starts = [i for i, frame in enumerate(frames) if frame.startswith("process ")]
        own = frames[starts[-1] + 1 :] if starts else frames
        name = process_name(frames[starts[-1]]) if starts else "?"
        samples = int(count)
        profile.processes[name] += samples
        profile.threads[(name, function_name(own[0]) if own else "(no Python frame)")] += samples
        for function in {function_name(frame) for frame in own}:
            profile.functions[name][function] += samples
        for module in {module_file(frame) for frame in own} - {None, "<string>"}:
            profile.imports[name][module] += samples
    return profile


def table(rows: list[tuple[str, ...]], header: tuple[str, ...]) -> str:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths)) for r in [header, *rows]]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def seconds(samples: int, rate: float) -> str:
    return f"{samples / rate:.2f}"


def summary(
    profile: Profile, other: Profile | None, *, top: int, rate: float, keep: str | None, imports: bool = False
) -> str:
    """The report: processes, then each kept process's threads and functions, and with `imports` its imports (with
    `other`: side by side, sorted by the difference)."""

    def rows(mine: Counter, theirs: Counter | None, keys: list) -> list[tuple[str, ...]]:
        if theirs is None:
            return [(str(k), seconds(mine[k], rate)) for k in keys]
        return [
            (str(k), seconds(mine[k], rate), seconds(theirs[k], rate), seconds(mine[k] - theirs[k], rate)) for k in keys
        ]

    def ranked(mine: Counter, theirs: Counter | None) -> list:
        keys = set(mine) | set(theirs or {})
        if theirs is None:
            return sorted(keys, key=lambda k: (-mine[k], str(k)))[:top]
        return sorted(keys, key=lambda k: (-abs(mine[k] - theirs[k]), str(k)))[:top]

    header = ("", "s") if other is None else ("", "s", "other s", "difference s")
    kept = Counter({n: c for n, c in profile.processes.items() if not keep or keep in n})
    their_kept = Counter({n: c for n, c in other.processes.items() if not keep or keep in n}) if other else None
    names = ranked(kept, their_kept)
    out = [
        "== processes (busy seconds of the profiled window)",
        table(rows(kept, their_kept, names), ("process", *header[1:])),
    ]
    for name in names[: max(1, min(4, top))]:
        mine_threads = Counter({t: c for (p, t), c in profile.threads.items() if p == name})
        their_threads = Counter({t: c for (p, t), c in other.threads.items() if p == name}) if other else None
        out += [
            f"\n== {name}: threads, by the first frame",
            table(rows(mine_threads, their_threads, ranked(mine_threads, their_threads)), ("thread", *header[1:])),
        ]
        theirs = other.functions[name] if other else None
        out += [
            f"\n== {name}: functions, inclusive",
            table(
                rows(profile.functions[name], theirs, ranked(profile.functions[name], theirs)),
                ("function", *header[1:]),
            ),
        ]
        if imports:
            theirs = other.imports[name] if other else None
            out += [
                f"\n== {name}: imports, inclusive",
                table(rows(profile.imports[name], theirs, ranked(profile.imports[name], theirs)), ("module", *header[1:])),
            ]
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path)
    parser.add_argument("--vs", type=Path, help="another profile: side by side, sorted by the difference")
    parser.add_argument("--top", type=int, default=25, help="rows a table")
    parser.add_argument("--rate", type=float, default=200, help="py-spy's samples a second (rlkit's bench: 200)")
    parser.add_argument("--process", help="only processes whose name contains this")
    parser.add_argument("--imports", action="store_true", help="also each process's seconds in each module's import")
    args = parser.parse_args()
    other = read(args.vs) if args.vs else None
    print(summary(read(args.profile), other, top=args.top, rate=args.rate, keep=args.process, imports=args.imports))


if __name__ == "__main__":
    main()
