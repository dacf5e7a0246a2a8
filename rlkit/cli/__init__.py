"""The `rlkit` command line; `main` is the installed command."""

from __future__ import annotations


def main() -> None:
    """The `rlkit` command: Python's bytecode kept where the environment keeps none (rlkit.core.bytecode), before
    the commands import torch, transformers and vLLM; then the commands."""
    from rlkit.core.bytecode import keep_bytecode

    keep_bytecode()
    from rlkit.cli.main import app

    app()
