"""Fault injection for tests that kill runs at exact points.

`RLKIT_FAULT=hang:<point>:<step>` makes the process print a line and sleep when it reaches
`<point>` at `<step>`, so a test can SIGKILL it there (e.g. halfway through a checkpoint
write, which is otherwise over too quickly to hit). Unset, every hook is a no-op.
Points: checkpoint-before-marker (shards and state written, marker and rename not yet).
"""

from __future__ import annotations

import os
import sys
import time

ENV = "RLKIT_FAULT"
HANG_MESSAGE = "rlkit fault injection: hanging at"


def maybe_hang(point: str, step: int) -> None:
    spec = os.environ.get(ENV, "")
    if spec != f"hang:{point}:{step}":
        return
    print(f"{HANG_MESSAGE} {point} step {step}", file=sys.stderr, flush=True)
    while True:  # until the test kills us
        time.sleep(60)
