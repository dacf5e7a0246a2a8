"""`rlkit prep-data` and `rlkit eval-reward`: parsing and printing; the work lives in rlkit.core."""

from __future__ import annotations

import contextlib
import difflib
import inspect
import json
from collections import Counter
from pathlib import Path
from typing import Any, Optional

import typer
from pydantic import ValidationError
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.table import Table

from rlkit.cli.common import console, user_errors
from rlkit.core.data.builders import (
    Builder,
    Dropped,
    load_builder,
    write_parquet,
)
from rlkit.core.data.validate import row_problem
from rlkit.core.registrations import DATASET_BUILDERS
from rlkit.errors import UserError
from rlkit.recipes.reward_schema import RewardConfig


def _builder_options(fn: Builder) -> dict[str, Any]:
    """The options a builder takes (its keyword parameters after `source`) and their defaults."""
    params = list(inspect.signature(fn).parameters.values())[1:]
    return {p.name: p.default for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "_"}


def _open_options(fn: Builder) -> str | None:
    """The name of a builder's **kwargs when it takes options beyond its named ones and checks them itself
    (reasoning-gym: the task's config keys), else None (`**_` swallows options without reading them)."""
    params = inspect.signature(fn).parameters.values()
    return next((p.name for p in params if p.kind is p.VAR_KEYWORD and p.name != "_"), None)


def _options_text(fn: Builder) -> str:
    named = [f"{k}={v!r}" for k, v in _builder_options(fn).items()]
    open_name = _open_options(fn)
    return ", ".join(named + ([f"**{open_name}"] if open_name else []))


def _list_builders() -> None:
    table = Table("builder", "what", "options (-o KEY=VALUE)")
    for name in DATASET_BUILDERS.names():
        fn = DATASET_BUILDERS.get(name)
        summary = (inspect.getdoc(fn) or "").split("\n")[0]
        table.add_row(name, summary, _options_text(fn))
    console.print(table)
    console.print(
        "Your own: --builder path/file.py:function, called as function(source, **options) "
        "and returning {split: [row, ...]}.",
        markup=False,
    )


def _list_one(fn: Builder, label: str, options: dict[str, Any]) -> None:
    """`prep-data NAME --list`: what the builder's `catalogue(**options)` lists (reasoning-gym: its tasks, or with
    --task a task's options), or, for a builder without one, its options."""
    catalogue = getattr(fn, "catalogue", None)
    if catalogue is None:
        console.print(f"{label} options (-o KEY=VALUE): {_options_text(fn) or 'none'}", markup=False)
        return
    header, rows = catalogue(**options)
    table = Table(*header)
    for row in rows:
        table.add_row(*row)
    console.print(table)


def _parse_options(texts: list[str], named: dict[str, Any], fn: Builder, name: str) -> dict[str, Any]:
    """The builder's keyword arguments: -o KEY=VALUE texts, then the named flags given (--format, --task, ...)."""
    from rlkit.recipes.loader import parse_override

    options = dict(parse_override(text) for text in texts)
    options.update({key: value for key, value in named.items() if value is not None})
    if _open_options(fn):  # it checks the options its named parameters do not take
        return options
    known = _builder_options(fn)
    for key in options:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise UserError(f"builder {name!r} takes no option {key!r} (its options: {sorted(known) or 'none'}){hint}")
    return options


def _clean_split(split: str, rows: Any, progress: Progress, dropped: Counter) -> list[dict[str, Any]]:
    if not isinstance(rows, list):
        raise UserError(
            f"the builder returned {type(rows).__name__} for split {split!r}; it must return a list of rows"
        )
    kept = []
    for row in progress.track(rows, description=f"checking {split}"):
        reason = row.reason if isinstance(row, Dropped) else row_problem(row)
        if reason:
            dropped[reason] += 1
            continue
        reward = row.get("reward_model")  # preference pairs have none
        if reward is not None and not isinstance(reward["ground_truth"], str):  # one column type, as the loader expects
            row = {**row, "reward_model": {**reward, "ground_truth": str(reward["ground_truth"])}}
        kept.append(row)
    return kept


def prep_data(
    name: Optional[str] = typer.Argument(
        None,
        help="Builder to run: gsm8k, gsm8k-pairs, math, humaneval, synthetic, arithmetic, reasoning-gym (see --list).",
    ),
    out: Optional[Path] = typer.Option(
        None, "--out", help="Output directory for {split}.parquet (default: ~/data/NAME)."
    ),
    source: Optional[str] = typer.Option(
        None,
        "--source",
        help="Local directory with {train,test}.jsonl or .parquet files; without it the data "
        "is downloaded from the Hugging Face hub (needs `pip install datasets`).",
    ),
    instruction: Optional[str] = typer.Option(
        None, "--instruction", help="Text appended to every question (gsm8k, math, reasoning-gym); '' appends nothing."
    ),
    data_format: Optional[str] = typer.Option(
        None,
        "--format",
        help="rl (prompts for RL, the default) or sft (a `response` column too, for "
        "`rlkit train sft`; gsm8k: the reference solution). Same as -o format=...",
    ),
    options: Optional[list[str]] = typer.Option(
        None, "--option", "-o", help="Builder option KEY=VALUE, repeatable (e.g. -o task=add -o n_train=4096)."
    ),
    task: Optional[str] = typer.Option(
        None,
        "--task",
        help="The builder's task (reasoning-gym: see `prep-data reasoning-gym --list`; synthetic: echo, succ, add, "
        "lookup). -o task=...",
    ),
    size: Optional[int] = typer.Option(None, "--size", help="Train rows to generate (reasoning-gym). -o size=..."),
    test_size: Optional[int] = typer.Option(
        None, "--test-size", help="Test rows to generate (reasoning-gym). -o test_size=..."
    ),
    seed: Optional[int] = typer.Option(
        None, "--seed", help="Seed of a generating builder (reasoning-gym, arithmetic, synthetic, gsm8k-pairs)."
    ),
    builder: Optional[str] = typer.Option(
        None, "--builder", help="Your builder as path/file.py:function, instead of NAME."
    ),
    list_builders: bool = typer.Option(
        False, "--list", help="List the builders and their options (with NAME: what that builder lists), then stop."
    ),
) -> None:
    """Build train/test parquet files (prompt as chat messages, reward_model.ground_truth, ...).

    Example: rlkit prep-data gsm8k --source ~/gsm8k-jsonl --out ~/data/gsm8k
    (SFT rows: rlkit prep-data gsm8k --format sft --out ~/data/gsm8k-sft;
    generated: rlkit prep-data reasoning-gym --task chain_sum -o max_terms=3 --size 2000 --test-size 200)
    """
    if list_builders and name is None and builder is None:
        _list_builders()
        return
    if (name is None) == (builder is None):
        raise UserError("name one builder: NAME (see `rlkit prep-data --list`) or --builder path/file.py:function")
    if builder is not None:
        fn, label = load_builder(builder), builder.rpartition(":")[2]
    elif name in DATASET_BUILDERS:
        fn, label = DATASET_BUILDERS.get(name), name
    else:
        raise UserError(DATASET_BUILDERS.unknown_message(name) + " (or use --builder path/file.py:function)")
    named = {
        "instruction": instruction,
        "format": data_format,
        "task": task,
        "size": size,
        "test_size": test_size,
        "seed": seed,
    }
    kwargs = _parse_options(options or [], named, fn, label)
    if list_builders:
        _list_one(fn, label, kwargs)
        return
    out_dir = (out or Path("~/data") / label).expanduser()
    with console.status(f"building {label}" + (f" from {source}" if source else "")):
        try:
            splits = fn(source, **kwargs)
        except UserError:
            raise
        except Exception as exc:
            if builder is None:
                raise
            raise UserError(f"builder {builder} failed: {type(exc).__name__}: {exc}") from exc
    if not isinstance(splits, dict) or not splits:
        raise UserError(f"builder {label} must return {{split: [row, ...]}}, got {type(splits).__name__}")
    table = Table("split", "rows written", "rows dropped", "why dropped", "file", title=f"{label} -> {out_dir}")
    written = 0
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), console=console) as progress:
        for split, rows in splits.items():
            dropped: Counter = Counter()
            kept = _clean_split(split, rows, progress, dropped)
            why = "; ".join(f"{count} {reason}" for reason, count in dropped.most_common())
            path = "-"
            if kept:
                try:
                    path = str(write_parquet(kept, out_dir / f"{split}.parquet"))
                except Exception as exc:  # mixed column types from a user builder
                    raise UserError(
                        f"cannot write split {split!r} as parquet ({exc}); every row needs the "
                        "same keys and value types"
                    ) from exc
            written += len(kept)
            table.add_row(split, str(len(kept)), str(sum(dropped.values())), why or "-", path)
    console.print(table)
    if not written:
        raise UserError(f"builder {label} produced no usable rows (see the reasons above)")


def _reward_config(overrides: list[str]) -> RewardConfig:
    from rlkit.recipes.loader import parse_override

    values = {}
    for text in overrides:
        key, value = parse_override(text)
        if not key.startswith("reward."):
            raise UserError(f"{text!r}: eval-reward takes reward.KEY=VALUE overrides only")
        values[key.removeprefix("reward.")] = value
    try:
        return RewardConfig.model_validate(values)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            key = "reward." + ".".join(map(str, err["loc"]))
            if err["type"] == "extra_forbidden":
                close = difflib.get_close_matches(key, [f"reward.{k}" for k in RewardConfig.model_fields], n=1)
                lines.append(f"unknown key {key!r}" + (f"; did you mean {close[0]!r}?" if close else ""))
            else:
                lines.append(f"{key}={err['input']!r}: {err['msg']}")
        raise UserError("; ".join(lines)) from None


def eval_reward(
    data: Path = typer.Option(..., "--data", help="Parquet file of prompts with data_source and ground truth."),
    responses: Optional[Path] = typer.Option(
        None,
        "--responses",
        help='jsonl, one line per data row in order: a JSON string, {"response": "..."} '
        'or {"responses": ["...", ...]}.',
    ),
    model: Optional[str] = typer.Option(
        None, "--model", help="Sample responses from this model (local path or hub id) instead of --responses."
    ),
    n: int = typer.Option(1, "--n", min=1, help="Responses sampled per row with --model."),
    max_new_tokens: int = typer.Option(512, "--max-new-tokens", min=1, help="Response length cap with --model."),
    temperature: float = typer.Option(
        1.0, "--temperature", min=0.0, help="Sampling temperature with --model; 0 = greedy."
    ),
    seed: int = typer.Option(0, "--seed", help="Sampling seed with --model."),
    limit: Optional[int] = typer.Option(
        None, "--limit", min=1, help="Score only the first N data rows (with --responses: its first N lines)."
    ),
    save: Optional[Path] = typer.Option(
        None, "--save", help="Write the sampled responses here as jsonl (re-score with --responses)."
    ),
    examples: int = typer.Option(
        3,
        "--examples",
        min=0,
        help="How many extraction failures, errors, invalid scores and responses of each reason kind to show.",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print the report as one JSON object, each row's scores included (for scripts)."
    ),
    overrides: Optional[list[str]] = typer.Argument(
        None, help="reward.KEY=VALUE settings, e.g. reward.gsm8k_method=flexible reward.function=my_reward.py:score"
    ),
) -> None:
    """Score responses with the reward a training run would use: is my reward right?

    Example: rlkit eval-reward --data ~/data/gsm8k/test.parquet --responses out.jsonl reward.gsm8k_method=flexible
    """
    from rlkit.core.controller.eval_reward import evaluate, read_responses, sample_responses
    from rlkit.core.data.dataset import read_rows

    if (responses is None) == (model is None):
        raise UserError("give exactly one of --responses FILE or --model PATH")
    if responses is not None and (save is not None or n != 1):
        raise UserError("--n and --save go with --model; with --responses the file holds the responses")
    config = _reward_config(overrides or [])
    rows = read_rows(data)
    if not rows:
        raise UserError(f"--data {data} has no rows: nothing to score")
    rows = rows[:limit]
    if model is not None:
        status = f"sampling {n} response(s) for {len(rows)} prompts from {model}"
        with contextlib.nullcontext() if as_json else console.status(status):
            texts = sample_responses(
                model, rows, n=n, max_new_tokens=max_new_tokens, temperature=temperature, seed=seed
            )
        if save is not None:
            save.expanduser().write_text("".join(json.dumps({"responses": t}) + "\n" for t in texts), encoding="utf-8")
    else:
        texts = read_responses(responses, len(rows), first_only=limit is not None)
    report = {
        "data": str(data),
        "responses": str(responses) if responses else None,
        "model": model,
        **evaluate(rows, texts, config, examples=examples),
    }
    if as_json:
        typer.echo(json.dumps(report, indent=2))
    else:
        _print_report(report)


def _print_report(report: dict[str, Any]) -> None:
    def fmt(value: Any) -> str:
        return "-" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)

    summary = Table("", "", show_header=False, title=f"reward on {report['data']}")
    percentages = ("accuracy", *[k for k in report if k.startswith("pass@")])
    for key in (
        "rows",
        "responses_per_row",
        "scored",
        "mean_score",
        *percentages,
        "extraction_failures",
        "errors",
        "invalid",
    ):
        value = report[key]
        text = f"{value:.1%}" if key in percentages and value is not None else fmt(value)
        summary.add_row(key.replace("_", " "), text)
    per_call = report["seconds_per_call_mean"]
    summary.add_row(
        "time per call",
        f"{per_call * 1e3:.3g} ms (max {report['seconds_per_call_max'] * 1e3:.3g} ms)" if per_call is not None else "-",
    )
    summary.add_row("time total", f"{report['seconds_total']:.2f} s")
    for kind, count in report["reasons"].items():  # why responses scored 0 (or below full marks), by kind
        summary.add_row(f"reason: {kind}", str(count))
    # The reward's own per-response numbers (a dict reward's other keys: a code reward's tests passed, runs,
    # timeouts), as means over the responses: what a training run logs as reward/<key>.
    shown = {"reward/errors", "reward/invalid", "reward/call_seconds_mean", "reward/call_seconds_max"}
    for key, value in sorted(report["metrics"].items()):
        if key not in shown:
            summary.add_row(f"{key} (mean)", fmt(value))
    console.print(summary)
    histogram = Table("score", "count", "", title="score histogram")
    total = max(report["scored"], 1)
    for bin_ in report["histogram"]:
        label = fmt(bin_["low"]) if bin_["low"] == bin_["high"] else f"{fmt(bin_['low'])} .. {fmt(bin_['high'])}"
        histogram.add_row(label, str(bin_["count"]), "█" * round(40 * bin_["count"] / total))
    console.print(histogram)
    if report["extraction_failure_examples"]:
        failures = Table("row", "ground truth", "response (end)", title="no answer extracted (examples)")
        for example in report["extraction_failure_examples"]:
            failures.add_row(str(example["row"]), example["ground_truth"], example["response_tail"])
        console.print(failures)
    if report["reason_examples"]:
        why = Table("row", "response", "score", "reason", title="why (examples per reason; every row's in --json)")
        for example in report["reason_examples"]:
            why.add_row(str(example["row"]), str(example["response"]), fmt(example["score"]), example["reason"])
        console.print(why)
    for error in report["error_examples"]:
        console.print(f"[red]error:[/] {error}", highlight=False)
    for invalid in report["invalid_examples"]:  # "invalid score on row N (...): why; scored 0"
        console.print(f"[yellow]{invalid}[/]", highlight=False)


def register(app: typer.Typer) -> None:
    """Add `prep-data` and `eval-reward` to the main app."""
    app.command("prep-data")(user_errors(prep_data))
    app.command("eval-reward")(user_errors(eval_reward))
