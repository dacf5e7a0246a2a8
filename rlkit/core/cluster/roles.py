"""Roles: the jobs of one device process (generation, the actor, scoring, sending weights), each a small
object with only the state it needs, composed by the device worker that Ray (or an in-process group) holds.

A role method that the controller calls is marked `@in_phase(name)` as a worker method would be: the
role reports through its worker (`Role.reporting`), so the board and the fault-injection points
(`worker<rank>.<phase>`) are the worker's. The worker lists what it serves, one line per call:
`update_actor = serve("actor", Actor.update_actor)`; the controller names the role's function,
`workers.call(Actor.update_actor, ...)`, and rlkit.core.cluster.calls checks the worker has it.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, ContextManager, TypeVar

from rlkit.core.cluster.phases import PhaseReporter

Method = TypeVar("Method", bound=Callable[..., Any])


class Role:
    """One job of a device worker; `phases` is the worker, whose board its phases go on."""

    def __init__(self, phases: PhaseReporter) -> None:
        self.phases = phases

    def reporting(self, name: str) -> ContextManager[None]:
        return self.phases.reporting(name)


def serve(role: str, method: Method) -> Method:
    """A worker method that runs the role function `method` on the worker's role object named `role`.

    It keeps `method`'s name: the worker's attribute must have that name (the name Ray calls, and
    the phase a call reports by default), so one call has one name from the controller to the board.
    """

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        return method(getattr(self, role), *args, **kwargs)

    call.served_by = role  # type: ignore[attr-defined]
    return call  # type: ignore[return-value]


def check_served_names(worker_cls: type) -> None:
    """A TypeError when `worker_cls` serves a role function under another name than the function's own."""
    for name, member in vars(worker_cls).items():
        if getattr(member, "served_by", None) is not None and member.__name__ != name:
            raise TypeError(f"{worker_cls.__name__}.{name} serves {member.__qualname__}: name them the same")
