"""Fault injection, so tests can break a run at an exact point the way real runs break.

Set `RLKIT_FAULT` to one or more comma-separated `ACTION:POINT:N` rules (Ray workers inherit
it). Rule `ACTION:POINT:N` fires at the N-th arrival at POINT (1-based), or at step N for the
points that pass their step. Unset, every hook is a no-op.

Points:
  worker<RANK>.<PHASE>      a worker entering a phase (N-th arrival; for the once-a-step phases
                            that is step N), e.g. worker1.update_actor, worker0.generate,
                            worker0.setup/rollout-engine (the phases of `rlkit.core.train.policy_worker` and its roles)
  checkpoint-before-marker  the controller saving step N: shards and state written, the
                            COMPLETE marker and the rename not yet (a write killed midway)
  engine-load               the N-th weight load into a rollout engine, in each worker process
                            (only the `noop` action)
Actions:
  kill         SIGKILL the process (what the OOM killer does)
  sleep=SECS   stall that long, then go on (a slow or hung phase)
  raise        raise a RuntimeError (a bug in a worker)
  hang         stall until killed
  noop         do the work but drop its result: at engine-load the weights are gathered and
               never reach the engine (a broken weight sync, which the sync check must catch)

Example: RLKIT_FAULT=kill:worker0.update_actor:2 kills rank 0 in the second step's update.
"""

from __future__ import annotations

import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass

ENV = "RLKIT_FAULT"
MESSAGE = "rlkit fault injection:"
HANG_MESSAGE = f"{MESSAGE} hanging at"  # printed (stderr) when a `hang` rule fires: tests wait for it


class InjectedFault(RuntimeError):
    """What the `raise` action raises."""


@dataclass(frozen=True)
class Rule:
    action: str
    point: str
    occurrence: int


def parse(spec: str) -> list[Rule]:
    rules = []
    for text in filter(None, (part.strip() for part in spec.split(","))):
        action, _, rest = text.partition(":")
        point, _, occurrence = rest.rpartition(":")
        if not point or not occurrence.isdigit() or not _valid_action(action):
            raise ValueError(
                f"{ENV}={spec!r}: rule {text!r} is not ACTION:POINT:N "
                "(ACTION one of kill, sleep=SECS, raise, hang, noop)"
            )
        rules.append(Rule(action, point, int(occurrence)))
    return rules


def _valid_action(action: str) -> bool:
    if action.startswith("sleep="):
        try:
            return float(action[len("sleep=") :]) >= 0
        except ValueError:
            return False
    return action in ("kill", "raise", "hang", "noop")


_reached: Counter[str] = Counter()


def reached(point: str, step: int | None = None) -> None:
    """Count one arrival at `point` and carry out the rule for this arrival (or `step`), if there is one."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    _reached[point] += 1
    occurrence = _reached[point] if step is None else step
    for rule in parse(spec):
        if rule.point == point and rule.occurrence == occurrence and rule.action != "noop":  # noop: `dropped`
            _act(rule)


def dropped(point: str) -> bool:
    """Count one arrival at `point`; True when a `noop` rule says to drop this arrival's result."""
    spec = os.environ.get(ENV)
    if not spec:
        return False
    _reached[point] += 1
    hit = any(r.action == "noop" and r.point == point and r.occurrence == _reached[point] for r in parse(spec))
    if hit:
        print(f"{MESSAGE} dropping {point} #{_reached[point]}", file=sys.stderr, flush=True)
    return hit


def _act(rule: Rule) -> None:
    doing = {"kill": "killing", "raise": "raising", "hang": "hanging"}.get(rule.action, rule.action)
    print(f"{MESSAGE} {doing} at {rule.point} #{rule.occurrence}", file=sys.stderr, flush=True)
    if rule.action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif rule.action == "raise":
        raise InjectedFault(f"{MESSAGE} raise at {rule.point} #{rule.occurrence}")
    elif rule.action == "hang":
        while True:
            time.sleep(60)
    else:
        time.sleep(float(rule.action[len("sleep=") :]))
