"""The sub-packages import one way: cli -> controller -> rollout/train/agents/planning ->
cluster/state/rewards/data -> algos/recipes -> base modules (errors, console, batch, compat, ...).

A module may import its own layer and the layers below it, never one above. The module graph is
read as in test_import_graph (lazy imports included, `if TYPE_CHECKING:` blocks skipped).
`KNOWN_UPWARD` lists the imports against the order that the code still has: each is debt to
remove (the pipeline redesign moves them), and the list may only shrink: a new upward import
fails, and so does an entry that no longer exists (delete it).
"""

from __future__ import annotations

from test_import_graph import graph

LAYERS = {
    "cli": 0, "core.doctor": 0, "core.doctor_cluster": 0,
    "core.controller": 1,
    "core.rollout": 2, "core.train": 2, "core.agents": 2, "core.planning": 2,
    "core.cluster": 3, "core.state": 3, "core.rewards": 3, "core.data": 3,
    "core.algos": 4, "recipes": 4,
}
BASE = 5  # every other module: rlkit.errors, rlkit.console, rlkit.core.batch, rlkit.core.compat, ...

KNOWN_UPWARD = {
    # cluster -> rollout/train: Placement builds the workers it places (roles would invert this)
    ("rlkit.core.cluster.placement", "rlkit.core.rollout.worker"),
    ("rlkit.core.cluster.placement", "rlkit.core.rollout.sync_check"),
    ("rlkit.core.cluster.placement", "rlkit.core.train.policy_worker"),
    # recipes' checks ask the fast-path defaults (component configs would own them)
    ("rlkit.recipes.checks", "rlkit.core.train.fast_paths"),
    # code rewards run in the agents' sandbox (the sandbox belongs a layer lower, beside rewards)
    ("rlkit.core.rewards.code", "rlkit.core.agents.sandbox"),
    # eval-reward generates with an engine: a command, not a reward (it belongs in the controller layer)
    ("rlkit.core.rewards.evaluate", "rlkit.core.rollout.base"),
    ("rlkit.core.rewards.evaluate", "rlkit.core.rollout.engines"),
    # export merges LoRA and casts with the trainer's helpers; run dirs build the tiny model
    ("rlkit.core.state.export", "rlkit.core.train.adapters"),
    ("rlkit.core.state.export", "rlkit.core.train.fsdp"),
    ("rlkit.core.state.run_dir", "rlkit.core.train.tiny"),
}


def layer_of(module: str) -> tuple[str, int]:
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
    upward = upward_imports()
    new = sorted(upward - KNOWN_UPWARD)
    assert not new, "imports against the layer order (cli -> controller -> rollout/train/agents/planning -> " \
                    "cluster/state/rewards/data -> algos/recipes -> base):\n" + "\n".join(f"{a} -> {b}" for a, b in new)
    gone = sorted(KNOWN_UPWARD - upward)
    assert not gone, "no longer imported; delete from KNOWN_UPWARD:\n" + "\n".join(f"{a} -> {b}" for a, b in gone)


def test_the_layer_table_names_real_packages():
    packages = {layer_of(module)[0] for module in graph()}
    assert set(LAYERS) <= packages
