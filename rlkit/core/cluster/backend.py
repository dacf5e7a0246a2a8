"""Where a run's workers live (trainer.workers), and the protocol of a group of them.

ray: one Ray actor per device (rlkit.core.cluster.worker_group). in_process: one plain object
per group in the controller's process, no Ray and no worker processes (rlkit.core.cluster.local_group).
`start_backend` is the one place that reads trainer.workers; every controller builds its groups
through the backend it returns, and talks to them only through `Group`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol, Sequence

if TYPE_CHECKING:
    from rlkit.core.cluster.phases import WorkerPlace
    from rlkit.recipes.schema import RLConfig


class Group(Protocol):
    """One worker per rank of a group (the policy, the critic, split placement's rollout workers)."""

    name: str  # what messages call a worker of it: "worker", "critic", "rollout worker"

    @property
    def size(self) -> int:
        """Ranks in the group."""

    def call(
        self,
        method: Callable[..., Any],
        *args: Any,
        phase: str | None = None,
        per_rank: Sequence[tuple] | None = None,
        startup: bool = False,
    ) -> list[Any]:
        """`method` (a worker class's function, e.g. Actor.update_actor: never a name as a string) on
        every rank (same args, or per_rank[r]); the results in rank order."""

    def submit(self, method: Callable[..., Any], *args: Any, per_rank: Sequence[tuple] | None = None) -> list[Any]:
        """Start `method` on every rank: one handle per rank, for `collect`. A group runs its calls in the
        order they were submitted."""

    def collect(self, refs: list[Any], phase: str, *, startup: bool = False) -> list[Any]:
        """The results of submitted calls, in rank order."""

    def places(self) -> dict[int, WorkerPlace]:
        """Each rank's host, pid and last reported phase."""

    def shutdown(self) -> None: ...


class Backend(Protocol):
    def group(
        self,
        worker_cls: type,
        *args: Any,
        name: str,
        first: int = 0,
        count: int | None = None,
        colocate_with: Group | None = None,
    ) -> Group:
        """Workers of `worker_cls` (constructed with config, *args, rank, world size) on devices
        first .. first + count - 1 of the run (count None: config.world_size), or beside `colocate_with`'s
        ranks, one by one. Not yet set up: the controller calls their `setup`."""

    def shutdown(self) -> None:
        """Stop every worker of the run and give back what the backend took (Ray, torch.distributed)."""


def start_backend(config: RLConfig) -> Backend:
    """The run's backend, per trainer.workers."""
    if config.trainer.workers == "in_process":
        from rlkit.core.cluster.local_group import InProcessBackend

        return InProcessBackend(config)
    from rlkit.core.cluster.worker_group import RayBackend

    return RayBackend(config)
