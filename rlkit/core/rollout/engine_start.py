"""The parts of a vLLM engine's start, read from the INFO lines vLLM logs while it starts.

vLLM reports them only in its log: the weights' load, torch.compile, the memory profiling run,
the CUDA graphs' capture and the engine core's whole initialisation. Their wording moved between
releases ("torch.compile takes" in older ones, "took" in 0.32; "Memory profiling takes" became
"Initial profiling/warmup run took"), so each part accepts every spelling seen; a part whose line
did not come (enforce_eager: no compile or graphs) is absent, never guessed. Several lines of one part (a
model's language and encoder compiles) add up. An engine core in a process of its own logs there: rlkit's worker
extension keeps those lines in that process (`keep_start_lines`, rlkit.core.rollout.vllm_worker) and the engine
asks for them once it has started.
Two more parts come from when the lines were logged: what the engine did before its weights' load began
(configuration, platform, distributed set-up, tokenizer, building the model) and after its init line (until
the constructor returned); the logged parts leave most of both out.
"""

from __future__ import annotations

import logging
import re
import threading
from contextlib import contextmanager
from typing import Iterable, Iterator, NamedTuple

logger = logging.getLogger(__name__)

_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
# part -> the line that reports it, the seconds in the pattern's group
PATTERNS: dict[str, re.Pattern[str]] = {
    "weights_load": re.compile(rf"Loading weights took {_NUMBER} s"),
    "model_load": re.compile(rf"Model loading took [0-9.]+ ?GiB(?: memory)? and {_NUMBER} s"),
    "compile": re.compile(rf"torch\.compile (?:takes|took) {_NUMBER} s in total"),
    "memory_profiling": re.compile(rf"(?:Memory profiling takes|Initial profiling/warmup run took) {_NUMBER} s"),
    "cuda_graphs": re.compile(rf"(?<![Ee]ncoder )Graph capturing finished in {_NUMBER} secs"),
    "init": re.compile(rf"init engine \(profile, create kv cache, warmup model\) took {_NUMBER} s"),
    # rlkit's own line in an engine's process (`process_start_line`): its launch to vLLM building its worker
    "process_start": re.compile(rf"rlkit: vLLM built its worker {_NUMBER} s after the process's launch"),
}


class LogLine(NamedTuple):
    at: float  # when it was logged (time.time())
    message: str


def start_parts(lines: Iterable[LogLine], began: float, ended: float) -> dict[str, float]:
    """Seconds per part found in `lines` (vLLM's messages during its start, from `began` to `ended` by time.time()),
    as `rollout_engine_<part>`; with `before_weights_load` and `after_init` where their lines came."""
    found: dict[str, float] = {}
    for at, message in lines:
        for part, pattern in PATTERNS.items():
            match = pattern.search(message)
            if match:
                key = f"rollout_engine_{part}"
                seconds = float(match.group(1))
                if part == "weights_load" and key not in found:  # logged at its end: it began `seconds` earlier
                    found["rollout_engine_before_weights_load"] = max(0.0, at - seconds - began)
                if part == "init":
                    found["rollout_engine_after_init"] = max(0.0, ended - at)
                found[key] = found.get(key, 0.0) + seconds
    return found


def replicas_start_parts(parts: list[dict[str, float]], together: bool) -> dict[str, float]:
    """One start's parts for replicas (rlkit.core.rollout.replicas) from each one's: where they started together,
    the parts of the one whose parts add up to most (the slowest, as the start-up table's other details are the
    slowest rank's); where they started in turn, each part summed over the replicas."""
    if together:
        return dict(max(parts, key=lambda own: sum(own.values()), default={}))
    summed: dict[str, float] = {}
    for own in parts:
        for key, seconds in own.items():
            summed[key] = summed.get(key, 0.0) + seconds
    return summed


class _Lines(logging.Handler):
    def __init__(self, parts_only: bool = False) -> None:
        """`parts_only`: keep only the lines that report a part (a capture that stays open for good)."""
        super().__init__(logging.INFO)
        self.lines: list[LogLine] = []
        self.parts_only = parts_only

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a record whose arguments do not fit its message: not one of ours
            return
        if not self.parts_only or any(pattern.search(message) for pattern in PATTERNS.values()):
            self.lines.append(LogLine(record.created, message))


def process_start_line(launched: float, now: float) -> LogLine:
    """The line that reports an engine's process start: from its launch (`launched`) to now, when vLLM imports rlkit's
    worker extension as it builds its worker (Python, the imports of vLLM's engine and worker, its configuration)."""
    return LogLine(now, f"rlkit: vLLM built its worker {now - launched:.2f} s after the process's launch")


def keep_start_lines() -> list[LogLine]:
    """From now on, in this process, the lines vLLM logs that report its start's parts, kept in the list returned
    (a few per engine). For a process of vLLM's own (an engine core's or its worker's), where nothing of rlkit runs
    until the start is over: vLLM's logger is lowered to INFO for good and its handlers raised to the level it had,
    so the screen shows what it showed."""
    capture = _Lines(parts_only=True)
    with _open_lock:
        _lower_vllm_logger()
        logging.getLogger("vllm").addHandler(capture)
    return capture.lines


@contextmanager
def vllm_info_lines() -> Iterator[list[LogLine]]:
    """The messages vLLM logs at INFO or above in this process during the block, with when each was logged.

    Its logger is lowered to INFO while any such block is open, and its handlers raised to the level it had
    (VLLM_LOGGING_LEVEL, ERROR in rlkit's workers): what reaches the screen stays as it was. Blocks may overlap
    (replicas starting together on threads of their own, rlkit.core.rollout.replica_start): the first to open
    lowers the level, the last to close restores it, and each sees every line logged while it is open.
    """
    capture = _Lines()
    with _open_lock:
        if not _open:
            _quiet_vllm_logger()
        _open.append(capture)
        logging.getLogger("vllm").addHandler(capture)
    try:
        yield capture.lines
    finally:
        with _open_lock:
            logging.getLogger("vllm").removeHandler(capture)
            _open.remove(capture)
            if not _open:
                _restore_vllm_logger()


_open_lock = threading.Lock()
_open: list[_Lines] = []  # the blocks open now
_restore: list[tuple[logging.Handler | logging.Logger, int]] = []  # (handler or logger, its level before)


def _quiet_vllm_logger() -> None:
    settle_vllm_logging()
    _restore.extend(_lower_vllm_logger())


def _lower_vllm_logger() -> list[tuple[logging.Handler | logging.Logger, int]]:
    """vLLM's logger lowered to INFO, its handlers raised to the level it showed; the levels before."""
    vllm_logger = logging.getLogger("vllm")
    shown = vllm_logger.getEffectiveLevel()
    before: list[tuple[logging.Handler | logging.Logger, int]] = [(vllm_logger, vllm_logger.level)]
    for handler in vllm_logger.handlers:
        if handler.level < shown:
            before.append((handler, handler.level))
            handler.setLevel(shown)
    vllm_logger.setLevel(min(shown, logging.INFO))
    return before


def _restore_vllm_logger() -> None:
    while _restore:
        target, level = _restore.pop()
        target.setLevel(level)


def settle_vllm_logging() -> None:
    """Apply now the logging configuration vLLM applies as its engine starts (0.32: once per process,
    unless already in force), so that the start does not reset the `vllm` logger under the capture.
    Releases without it configure their logging once, when imported."""
    try:
        from vllm.config.logging import LoggingConfig
        from vllm.logger import configure_logging_if_needed
    except ImportError:
        return
    try:
        configure_logging_if_needed(LoggingConfig())
    except ValueError:  # logging.config could not build vLLM's handlers (a stand-in vllm module): start uncaptured
        logger.debug("vLLM's logging configuration did not apply; its start's parts go unrecorded")
