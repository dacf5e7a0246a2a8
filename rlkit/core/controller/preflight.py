"""Checks of a run's inputs before anything starts: each bad input is one sentence and exit code 2.

They all run before the run directory, Ray or any worker exists, so a typo costs seconds instead
of a cluster start-up, and a fixed command can reuse the same --run-id. What they load (the
tokenizer, every training prompt tokenized) is handed to the controller, so nothing is read twice.
`rlkit train --dry-run` runs the same checks, except those that need the run's devices, and says
which it skipped.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from typing import Any

from rlkit.core.agents.preflight import check_agent, check_sandbox
from rlkit.core.agents.tool_env import prompt_tools
from rlkit.core.controller import model_checks
from rlkit.core.data.dataset import (
    PromptRow,
    PromptSampler,
    open_parquet,
    read_rows,
    tokenize_rows,
)
from rlkit.errors import UserError
from rlkit.recipes.schema import RLConfig
from rlkit.recipes.user_code import reference


@dataclass
class RunInputs:
    """What the checks loaded, for the controller."""

    model_path: str  # what the workers load: a local directory or a hub id
    tokenizer: Any
    rows: list[PromptRow] | list[Any]  # the training prompts, tokenized (offline objectives: their rows, tokenized)
    generated: list[dict[str, Any]] | None = None  # data.synthetic_task's rows (the run dir keeps a copy)
    val_rows: list[Any] = field(default_factory=list)  # offline objectives: data.val_files' rows, tokenized


@dataclass
class Preflight:
    """Runs the checks in order; `checked` and `skipped` say, in words, what was and was not looked at."""

    config: RLConfig
    dry_run: bool = False
    checked: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    def run(self) -> RunInputs | None:
        """Every check (UserError at the first problem); None when a dry run has no model to load data with."""
        cfg = self.config
        inputs = None
        if cfg.model.path:
            model_path, tokenizer = self.model(cfg.model.path, "model.path")
            if cfg.offline:
                inputs = self.offline_data(model_path, tokenizer)
            else:
                inputs = self.training_data(model_path, tokenizer)
                # rollout.agent: the user's environment, tools or agent function
                check_agent(
                    cfg.rollout.agent,
                    tokenizer,
                    max_response_length=cfg.data.max_response_length,
                    model_path=cfg.model.path,
                )
                self.checked.append(f"rollout.agent.loop={reference(cfg.rollout.agent.loop)}")
        else:  # only a dry run gets here: the config check demands a model otherwise
            self.skipped.append("the model, its tokenizer and the training prompts (no model.path given)")
        if cfg.reward_model.path and not cfg.offline:
            self.model(cfg.reward_model.path, "reward_model.path")
        if "wandb" in cfg.trainer.logger and importlib.util.find_spec("wandb") is None:
            raise UserError(
                "trainer.logger lists wandb, but wandb is not installed; "
                "`pip install wandb` or drop it from trainer.logger"
            )
        self.devices()
        if self.dry_run:
            self.skipped.append(
                "loading the weights onto the devices"
                + ("" if cfg.offline else " and starting the rollout engine")
                + " (the workers do that when the run starts)"
            )
        return inputs

    def model(self, spec: str, key: str) -> tuple[str, Any]:
        """Where the model is, its config and weights; a policy's context must hold prompt + response,
        and its tokenizer load (a reward model shares it)."""
        cfg = self.config
        path = model_checks.locate_model(spec, key)
        head = "sequence_classification" if key == "reward_model.path" else "causal_lm"
        model_config = model_checks.load_model_config(path, spec, key, head=head)
        found = [f"config ({model_config.model_type})", model_checks.check_weights(path, spec, key)]
        if key == "reward_model.path":
            if getattr(model_config, "num_labels", 1) != 1:
                raise UserError(
                    f"reward_model.path={spec!r} has num_labels={model_config.num_labels}; a reward "
                    "model gives one score per sequence (num_labels=1)"
                )
            self.checked.append(f"{key}={spec}: " + ", ".join(found))
            return path, None
        lengths = (cfg.data.max_prompt_length, cfg.data.max_response_length)
        found.append(model_checks.check_context(model_config, spec, *lengths))
        window = model_checks.check_attention(model_config, spec, *lengths)
        found += [window] if window else []
        tokenizer = model_checks.load_tokenizer(path, spec, key)
        self.checked.append(f"{key}={spec}: " + ", ".join(found + ["tokenizer"]))
        return path, tokenizer

    def training_data(self, model_path: str, tokenizer: Any) -> RunInputs:
        """Every training prompt tokenized and within data.max_prompt_length, enough of them for one
        batch, a reward for each; the validation files readable."""
        from rlkit.core.agents.verifiers_env import is_verifiers
        from rlkit.core.algos.algorithm import Algorithm
        from rlkit.core.rewards.probe import probe_reward
        from rlkit.core.rewards.scoring import check_reward_functions

        data = self.config.data
        generated = None
        if data.train_files:
            for file in data.train_files:  # the file's own problems first (cheap: footer and first row)
                check_data_file(file, "data.train_files", tokenizer, self.config.model.path)
            sources = [(file, read_rows(file)) for file in data.train_files]
        else:
            generated = synthetic_rows(self.config)
            sources = [(f"data.synthetic_task={data.synthetic_task}", generated)]
        rows = tokenize_rows(
            sources,
            tokenizer,
            max_prompt_length=data.max_prompt_length,
            overlong=data.overlong_prompts,
            tools=prompt_tools(self.config.rollout.agent),
        )
        PromptSampler.check_size(len(rows), data.train_batch_size)
        where = ", ".join(name for name, _ in sources)
        self.checked.append(
            f"data: {len(rows)} training prompts of {where}, each within "
            f"data.max_prompt_length={data.max_prompt_length}"
        )
        loop = self.config.rollout.agent.loop
        if is_verifiers(loop):  # its rubric scores every episode
            for key, value in (
                ("reward.function", self.config.reward.function),
                ("reward_model.path", self.config.reward_model.path),
            ):
                if value:
                    raise UserError(f"{key} is set but rollout.agent.loop={loop} is scored by its rubric; drop it")
            self.checked.append(f"reward: the rubric of rollout.agent.loop={loop}")
        elif not self.config.reward_model.path:
            self.checked.append(check_reward_functions(self.config.reward, [r.data_source for r in rows], where))
            if self.dry_run:  # a real run scores rows at step 1 anyway; a dry run has no other chance
                components = Algorithm.from_config(self.config).reward_components  # gdpo's, checked too
                self.checked.append(probe_reward(self.config.reward, rows, components))
        cfg = self.config
        sandbox = check_sandbox(cfg.rollout.agent, cfg.reward, cfg.reward_model, {row.data_source for row in rows})
        if sandbox:
            self.checked.append(sandbox)
        for file in data.val_files:
            check_data_file(file, "data.val_files", tokenizer, self.config.model.path)
        return RunInputs(model_path, tokenizer, rows, generated)

    def offline_data(self, model_path: str, tokenizer: Any) -> RunInputs:
        """An offline objective's training and validation rows, tokenized, each within data.max_prompt_length +
        data.max_response_length (every bad row named with its file and row), enough for one batch."""
        from rlkit.core.data.offline import row_kind

        data = self.config.data
        kind = row_kind(self.config.objective, data, self.config.sft)
        rows = kind.load(data.train_files, "data.train_files", tokenizer)
        PromptSampler.check_size(len(rows), data.train_batch_size)
        val_rows = kind.load(data.val_files, "data.val_files", tokenizer) if data.val_files else []
        self.checked.append(
            f"data: {len(rows)} training and {len(val_rows)} validation {kind.what} of "
            f"{', '.join(data.train_files + data.val_files)}, each within data.max_prompt_length + "
            f"data.max_response_length = {data.max_prompt_length + data.max_response_length} tokens"
        )
        return RunInputs(model_path, tokenizer, rows, val_rows=val_rows)

    def devices(self) -> None:
        trainer = self.config.trainer
        if os.environ.get("RAY_ADDRESS"):
            self.skipped.append("devices: the Ray cluster at RAY_ADDRESS is checked when the run connects to it")
            return
        if self.dry_run and trainer.device != "cpu":
            import torch

            if not torch.cuda.device_count():
                self.skipped.append(
                    f"devices: no GPU is visible here, so trainer.n_gpus_per_node="
                    f"{trainer.n_gpus_per_node} is checked when the run starts, on its machine"
                )
                return
        check_devices(self.config)
        self.checked.append(f"devices: {trainer.n_gpus_per_node * trainer.nnodes} worker(s) fit this machine")


def check_inputs(config: RLConfig) -> RunInputs:
    """Every input check; what they loaded. Raises UserError naming the key and the fix."""
    inputs = Preflight(config).run()
    assert inputs is not None, "load_config demands model.path outside dry runs"
    return inputs


def synthetic_rows(config: RLConfig) -> list[dict[str, Any]]:
    """data.synthetic_task's training rows (deterministic in trainer.seed)."""
    from rlkit.core.data.synthetic import TASKS, build_synthetic

    task = config.data.synthetic_task
    if task not in TASKS:
        raise UserError(f"data.synthetic_task={task!r} is not a built-in task; choose one of {sorted(TASKS)}")
    return build_synthetic(task=task, seed=config.trainer.seed)["train"]


def check_data_file(path: str, key: str, tokenizer: Any, model_spec: str) -> None:
    """A readable parquet file with the required columns whose prompts the tokenizer can encode."""
    file = open_parquet(path)
    if file.metadata.num_rows == 0:
        raise UserError(f"data file {path} ({key}) has no rows")
    first = file.read_row_group(0, columns=["prompt"]).slice(0, 1).to_pylist()[0]["prompt"]
    if isinstance(first, list) and not tokenizer.chat_template:  # other types: tokenize_rows names them
        raise UserError(
            f"data file {path} ({key}) holds chat prompts (lists of messages), but the tokenizer of "
            f"model.path={model_spec} has no chat template; use a chat/instruct model or a data file "
            "whose 'prompt' column holds plain strings"
        )


def check_devices(config: RLConfig) -> None:
    """Enough devices on this machine for trainer.n_gpus_per_node x trainer.nnodes (training and,
    with split placement, rollout workers: one device each).

    With RAY_ADDRESS the workers run on a cluster's nodes, which `check_cluster` (cluster.ray_access)
    checks once the controller has connected.
    """
    if os.environ.get("RAY_ADDRESS"):
        return
    import torch

    trainer = config.trainer
    devices = trainer.n_gpus_per_node * trainer.nnodes
    gpus = torch.cuda.device_count()
    wanted = f"trainer.n_gpus_per_node={trainer.n_gpus_per_node}" + (
        f" x trainer.nnodes={trainer.nnodes}" if trainer.nnodes > 1 else ""
    )
    if trainer.device == "cuda" and gpus == 0:
        raise UserError(
            "trainer.device=cuda, but no CUDA device is visible (CUDA_VISIBLE_DEVICES="
            f"{os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); use trainer.device=auto or cpu"
        )
    if gpus and trainer.device != "cpu":
        if devices > gpus:
            raise UserError(
                f"{wanted} asks for {devices} GPUs, but this machine has {gpus} visible GPU(s); "
                f"lower trainer.n_gpus_per_node to {gpus}, or set RAY_ADDRESS to a cluster with more"
            )
        return
    cores = len(os.sched_getaffinity(0))
    if devices > cores:
        raise UserError(
            f"{wanted} asks for {devices} CPU worker processes (no GPU in use), but this machine has "
            f"{cores} CPU core(s); lower trainer.n_gpus_per_node to at most {cores}"
        )
