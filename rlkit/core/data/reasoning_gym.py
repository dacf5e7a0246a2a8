"""reasoning-gym's procedural tasks (github.com/open-thought/reasoning-gym, Apache-2.0), generated offline.

`rlkit prep-data reasoning-gym --task chain_sum -o min_terms=2 --size 1000 --test-size 100 --seed 0`: the task's
generator with its config (-o KEY=VALUE, checked against the task's config keys) writes the rows; each row keeps
the task, its config and the generated entry, so the reward (rlkit.core.rewards.reasoning_gym) scores a response
with the task's own scorer. The prompt is the task's question and an instruction to answer inside
<answer>...</answer>, the tags reasoning-gym's answer extraction reads.

The split: the test rows are the entries of seed + TEST_SEED_OFFSET, the train rows those of `seed`.
reasoning-gym draws entry i of a seed from Random(seed + i), so the two streams share no generator state; a train
entry whose question is also a test question (small tasks repeat questions) is dropped and counted. The test
split depends on (task, config, seed, test size) only: a bigger train set leaves it as it was.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
from typing import Any

from rlkit.core.data.builders import Dropped, Row, make_row
from rlkit.core.rewards.reasoning_gym import (
    DATA_SOURCE_PREFIX,
    dataset_for,
    from_json,
    import_reasoning_gym,
    to_json,
)
from rlkit.errors import UserError

INSTRUCTION = "Think it through, then write the final answer alone between <answer> and </answer>."
FORMATS = ("rl", "sft")
# Far above any train size: train entries come from Random(seed + i), i < size, test entries from Random(seed + this
# + j), so the two never share a generator seed.
TEST_SEED_OFFSET = 2**31
BUILDER_KEYS = ("seed", "size")  # config keys the builder sets itself (from --seed and --size/--test-size)
NOT_TASKS = {"composite": "it mixes tasks: build each task, then list their files in data.train_files"}
NO_SINGLE_ANSWER = "(no single answer: the task's scorer checks the response)"


def _registry() -> dict[str, tuple[type, type]]:
    """reasoning-gym's tasks: name -> (dataset class, config dataclass), less those that are not one task."""
    try:
        datasets = import_reasoning_gym().factory.DATASETS
    except ImportError as exc:
        raise UserError(str(exc)) from None
    return {name: classes for name, classes in sorted(datasets.items()) if name not in NOT_TASKS}


def _first_line(cls: type) -> str:
    """A class's own docstring's first line ('' for none or for a dataclass's generated signature)."""
    doc = (cls.__dict__.get("__doc__") or "").strip()
    line = doc.splitlines()[0].strip() if doc else ""
    return "" if line.startswith(f"{cls.__name__}(") else line


def _config_keys(config_cls: type) -> dict[str, Any]:
    """The options a task's config takes, with their defaults (less the seed and size the builder sets)."""
    defaults = {}
    for field in dataclasses.fields(config_cls):
        if field.name not in BUILDER_KEYS:
            factory = field.default_factory
            defaults[field.name] = factory() if factory is not dataclasses.MISSING else field.default
    return defaults


def list_tasks(task: str | None = None, **_: Any) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """`rlkit prep-data reasoning-gym --list`: (header, rows) of the tasks and what each generates; with a task,
    its config keys (-o KEY=VALUE) and their defaults."""
    tasks = _registry()
    if task is None:
        return ("task", "what it generates"), [(n, _first_line(d) or _first_line(c)) for n, (d, c) in tasks.items()]
    _, config_cls = tasks[_known_task(task, tasks)]
    return (f"{task} option", "default"), [(key, repr(value)) for key, value in _config_keys(config_cls).items()]


def _known_task(task: str | None, tasks: dict[str, tuple[type, type]]) -> str:
    if task is None:
        raise UserError("name a task: --task NAME (`rlkit prep-data reasoning-gym --list` lists them)")
    if task in NOT_TASKS:
        raise UserError(f"--task {task}: not supported, {NOT_TASKS[task]}")
    if task not in tasks:
        close = difflib.get_close_matches(task, tasks, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise UserError(f"unknown reasoning-gym task {task!r}{hint} (`rlkit prep-data reasoning-gym --list` lists all)")
    return task


def _check_options(task: str, config_cls: type, options: dict[str, Any]) -> None:
    known = _config_keys(config_cls)
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UserError(
                f"reasoning-gym task {task!r} has no option {key!r}{hint} (its options: {', '.join(known)}; "
                f"`rlkit prep-data reasoning-gym --task {task} --list` shows their defaults)"
            )


def _generate(task: str, options: dict[str, Any], seed: int, count: int) -> tuple[str, Any, list[dict[str, Any]]]:
    """(the config as stored in each row, the task's dataset, its first `count` entries) at `seed`."""
    config = {**options, "seed": seed, "size": count}
    create = import_reasoning_gym().create_dataset
    try:
        dataset = create(task, **config)
        entries = [dataset[index] for index in range(count)]
        again = create(task, **config)[0]
    except Exception as exc:  # noqa: BLE001 - the task's own checks and generator, on the user's config values
        shown = " ".join(f"-o {k}={v!r}" for k, v in options.items()) or "its default config"
        raise UserError(
            f"reasoning-gym task {task!r} cannot generate with {shown}: {type(exc).__name__}: {exc}"
        ) from None
    if (again["question"], again["answer"]) != (entries[0]["question"], entries[0]["answer"]):
        raise UserError(f"reasoning-gym task {task!r} generates different entries from one seed: not reproducible")
    return to_json(config), dataset, entries


def _storage_problem(task: str, config_json: str, original: Any, entry: dict[str, Any], entry_json: str) -> str | None:
    """Why the reward would not score this row as reasoning-gym does, or None: the stored entry reads back equal
    to the generated one, or (a metadata value stored as its str()) the task's own answer scores the same with
    the rebuilt scorer on the stored entry as with the generating dataset's scorer on the generated one."""
    stored = from_json(entry_json)
    with contextlib.suppress(Exception):  # a metadata value whose == is not a bool (an array): scored instead
        if stored == entry:
            return None
    try:
        expected = original.score_answer(entry["answer"], entry)
        rebuilt = dataset_for(task, config_json).score_answer(entry["answer"], stored)
    except Exception as exc:  # noqa: BLE001 - the task's scorer, on its own answer
        return f"the task's scorer fails on its own answer ({type(exc).__name__})"
    return None if rebuilt == expected else "the stored entry scores differently from the generated one"


def build_reasoning_gym(
    source: str | None = None,
    *,
    task: str | None = None,
    size: int = 1000,
    test_size: int = 100,
    seed: int = 0,
    instruction: str = INSTRUCTION,
    format: str = "rl",
    **task_options: Any,
) -> dict[str, list[Row | Dropped]]:
    """reasoning-gym's generated tasks (--task NAME, -o KEY=VALUE: its config), scored by the task's own scorer.

    `size`/`test_size`: train/test entries (train entries with a test question are dropped); `seed`: train at
    seed, test at seed + 2**31; `format` sft adds `response`: '<answer>ANSWER</answer>'.
    """
    if source is not None:
        raise UserError("reasoning-gym generates its data: drop --source")
    if format not in FORMATS:
        raise UserError(f"reasoning-gym: format={format!r}; choose one of {', '.join(FORMATS)}")
    if not all(isinstance(n, int) for n in (size, test_size, seed)) or size < 1 or test_size < 1:
        raise UserError(f"--size {size!r} --test-size {test_size!r} --seed {seed!r}: whole numbers, sizes at least 1")
    tasks = _registry()
    name = _known_task(task, tasks)
    _check_options(name, tasks[name][1], task_options)
    generated = {
        "train": _generate(name, task_options, seed, size),
        "test": _generate(name, task_options, seed + TEST_SEED_OFFSET, test_size),
    }
    test_questions = {entry["question"] for entry in generated["test"][2]}
    splits: dict[str, list[Row | Dropped]] = {}
    for split, (config_json, dataset, entries) in generated.items():
        splits[split] = [
            Dropped("same question as a test row")
            if split == "train" and entry["question"] in test_questions
            else _row(name, config_json, dataset, entry, split, index, instruction, format)
            for index, entry in enumerate(entries)
        ]
    return splits


def _row(
    task: str,
    config_json: str,
    dataset: Any,
    entry: dict[str, Any],
    split: str,
    index: int,
    instruction: str,
    format: str,
) -> Row | Dropped:
    answer = entry.get("answer")
    has_answer = isinstance(answer, str) and answer.strip() != ""
    if format == "sft" and not has_answer:
        return Dropped("no single answer to train on (--format sft)")
    entry_json = to_json(entry)
    problem = _storage_problem(task, config_json, dataset, entry, entry_json)
    if problem:
        return Dropped(problem)
    question = entry["question"]
    content = f"{question}\n\n{instruction}" if instruction else question
    ground_truth = answer if has_answer else NO_SINGLE_ANSWER
    row = make_row(
        f"{DATA_SOURCE_PREFIX}/{task}",
        content,
        ground_truth,
        split=split,
        index=index,
        ability="reasoning",
        task=task,
        config=config_json,
        entry=entry_json,
    )
    return {**row, "response": f"<answer>{answer}</answer>"} if format == "sft" else row


build_reasoning_gym.catalogue = list_tasks  # type: ignore[attr-defined]  # what `prep-data reasoning-gym --list` prints
