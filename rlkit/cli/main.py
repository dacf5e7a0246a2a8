"""The `rlkit` command line: parsing and printing only; the work lives in rlkit.core."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from rlkit.cli import algos_cmds, data_cmds, doctor_cmds, eval_cmds, record_cmds, run_cmds
from rlkit.cli.common import console, print_yaml, run_failures, user_errors

app = typer.Typer(
    name="rlkit",
    help="Recipe-driven RL post-training of LLMs: GRPO, PPO, DAPO on one box or a Ray cluster.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
recipes_app = typer.Typer(help="List and show the built-in recipes.", no_args_is_help=True)
app.add_typer(recipes_app, name="recipes")


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": False})
@user_errors
@run_failures
def train(
    recipe: str = typer.Argument(..., help="Recipe name (`rlkit recipes list`) or path to a .yaml file."),
    overrides: Optional[list[str]] = typer.Argument(None, help="KEY=VALUE overrides, e.g. rollout.n=8 actor.lr=1e-6."),
    model: Optional[str] = typer.Option(None, "--model", help="Hub id or local path of the policy (sets model.path)."),
    run_id: Optional[str] = typer.Option(
        None, "--run-id", help="Name of the run directory (default: recipe-date-time)."
    ),
    dry_run: bool = typer.Option(
        False,
        "--dry-run",
        help="Print the resolved config and batch arithmetic, run "
        "every check that needs no GPU, call the reward on the "
        "first two training rows, then stop.",
    ),
) -> None:
    """Train with a recipe.

    Example:
    rlkit train grpo --model Qwen/Qwen2.5-0.5B-Instruct data.train_files=[~/data/gsm8k/train.parquet] rollout.n=8
    """
    from rlkit.recipes.checks import batch_arithmetic
    from rlkit.recipes.loader import config_to_yaml, load_config

    config = load_config(recipe, overrides or [], model=model, require_inputs=not dry_run)
    if dry_run:
        from rlkit.core.controller.preflight import Preflight

        print_yaml(config_to_yaml(config))
        console.print("[bold]Batch arithmetic[/]")
        for line in batch_arithmetic(config):
            console.print(f"  - {line}")
        checks = Preflight(config, dry_run=True)
        checks.run()  # a problem ends the command here: exit code 2 and its message
        console.print("[bold]Checks[/] (the ones `rlkit train` runs before it starts anything)")
        for line in checks.checked:
            console.print(f"  [green]ok[/]       {line}", highlight=False)
        for line in checks.skipped:
            console.print(f"  [yellow]skipped[/]  {line}", highlight=False)
        return
    from rlkit.core.controller.loop import train_run

    train_run(config, run_id=run_id)


@recipes_app.command("list")
def recipes_list() -> None:
    """List built-in recipes. Example: rlkit recipes list"""
    from rlkit.recipes.loader import list_recipes

    table = Table("recipe", "description")
    for name, description in list_recipes().items():
        table.add_row(name, description)
    console.print(table)


@recipes_app.command("show")
@user_errors
def recipes_show(name: str = typer.Argument(..., help="Recipe name or path.")) -> None:
    """Show a recipe's YAML (`rlkit train NAME --dry-run` shows it resolved). Example: rlkit recipes show dapo"""
    from rlkit.recipes.loader import find_recipe

    print_yaml(find_recipe(name).read_text())


# Command groups that live in their own modules.
data_cmds.register(app)
run_cmds.register(app)
eval_cmds.register(app)
doctor_cmds.register(app)
record_cmds.register(app)
algos_cmds.register(app)

if __name__ == "__main__":
    app()
