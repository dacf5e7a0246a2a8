"""How a worker group names the method it calls on its workers: from the function itself (a role's, or a worker
class's), checked."""

from __future__ import annotations

from typing import Any, Callable


def method_name(worker_cls: type, method: Callable[..., Any]) -> str:
    """The name a group calls `method` by on its workers, checked: `worker_cls` has a method of that name.
    `method` is a role's function (`Actor.update_actor`), which a worker serves under its own name
    (rlkit.core.cluster.roles; a colocated policy worker and a rollout worker both serve `Generator.generate`),
    or a worker class's own (`DeviceWorker.save_checkpoint`, on every group that checkpoints). A TypeError
    otherwise, before anything is sent to a worker."""
    name = getattr(method, "__name__", None)
    if not callable(method) or name is None or not callable(getattr(worker_cls, name, None)):
        raise TypeError(f"{worker_cls.__name__} has no method {name or method!r}")
    return name
