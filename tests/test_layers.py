"""The sub-packages import one way: cli and the Python API (rlkit.api, and the package itself, which loads
its names) -> controller -> rollout/train/agents/planning ->
cluster/state/rewards/data -> algos/recipes -> base modules (errors, console, batch, compat, tiny, the
sandbox, ...).

A module may import its own layer and the layers below it, never one above: any import against the order
fails the test. The module graph is read as in test_import_graph (lazy imports included, `if TYPE_CHECKING:`
blocks skipped).
"""

from __future__ import annotations

from test_import_graph import graph

LAYERS = {
    "cli": 0, "api": 0, "core.doctor": 0, "core.doctor_cluster": 0,
    "core.controller": 1,
    "core.rollout": 2, "core.train": 2, "core.agents": 2, "core.planning": 2,
    "core.cluster": 3, "core.state": 3, "core.rewards": 3, "core.data": 3,
    "core.algos": 4, "recipes": 4,
}
BASE = 5  # every other module: rlkit.errors, rlkit.console, rlkit.core.batch, rlkit.core.compat, ...


def layer_of(module: str) -> tuple[str, int]:
    if module == "rlkit":  # the package's __init__: `from rlkit import train` loads rlkit.api's names
        return "api", LAYERS["api"]
    parts = module.split(".")[1:]
    for depth in (2, 1):
        name = ".".join(parts[:depth])
        if name in LAYERS:
            return name, LAYERS[name]
    return "base", BASE


def upward_imports() -> set[tuple[str, str]]:
    found = set()
    for module, imported in graph().items():
        _, layer = layer_of(module)
        for target in imported:
            if layer_of(target)[1] < layer:
                found.add((module, target))
    return found


def test_imports_point_down_the_layers():
    upward = "\n".join(f"{a} -> {b}" for a, b in sorted(upward_imports()))
    assert not upward, "imports against the layer order (cli -> controller -> rollout/train/agents/planning -> " \
                       "cluster/state/rewards/data -> algos/recipes -> base):\n" + upward


def test_an_upward_import_is_found(monkeypatch):
    """The check sees an import against the order: a cluster module importing the controller."""
    import test_layers

    edges = {"rlkit.core.cluster.backend": {"rlkit.core.controller.loop"}, "rlkit.core.controller.loop": set()}
    monkeypatch.setattr(test_layers, "graph", lambda: edges)
    assert upward_imports() == {("rlkit.core.cluster.backend", "rlkit.core.controller.loop")}


def test_the_layer_table_names_real_packages():
    packages = {layer_of(module)[0] for module in graph()}
    assert set(LAYERS) <= packages
