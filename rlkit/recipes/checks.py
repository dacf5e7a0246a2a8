"""Cross-field checks pydantic cannot express per field: each names the keys and the fix."""

from __future__ import annotations

from typing import Callable

from rlkit.core.algos.algorithm import Algorithm
from rlkit.core.algos.needs import estimator_needs, estimators_that
from rlkit.core.algos.phase_plan import describe, phase_plan
from rlkit.core.registrations import ADV_ESTIMATORS, ENGINES, KL_ESTIMATORS, POLICY_LOSSES
from rlkit.errors import ConfigError
from rlkit.recipes.actor_schema import CPU_MICRO_BATCH_TOKENS
from rlkit.recipes.correction_checks import check_rollout_correction
from rlkit.recipes.offline_checks import check_offline
from rlkit.recipes.reward_component_checks import check_reward_components
from rlkit.recipes.schema import RLConfig

# vllm.LLM arguments rlkit derives from its own keys (rlkit.core.rollout.vllm_engine).
VLLM_KEYS_SET_BY_RLKIT = {
    "model",
    "dtype",
    "seed",
    "max_model_len",
    "gpu_memory_utilization",
    "enforce_eager",
    "max_num_seqs",
    "enable_sleep_mode",
    "enable_prefix_caching",
    "logprobs_mode",
    "worker_extension_cls",
}
# sglang.Engine arguments rlkit derives from its own keys (rlkit.core.rollout.sglang_engine).
SGLANG_KEYS_SET_BY_RLKIT = {
    "model_path",
    "dtype",
    "random_seed",
    "context_length",
    "device",
    "base_gpu_id",
    "mem_fraction_static",
    "max_running_requests",
    "max_total_tokens",
    "attention_backend",
    "enable_deterministic_inference",
    "enable_memory_saver",
    "enable_weights_cpu_backup",
    "skip_tokenizer_init",
    "disable_radix_cache",
}
_OWN_KEYS = (
    "model.path, model.dtype, trainer.seed, data.max_*_length, rollout.gpu_memory_utilization, "
    "rollout.max_num_seqs, rollout.<engine>.*"
)
# Engine arguments set from exactly one rlkit key: the refusal names that key instead of the list above.
OWN_KEY = {
    "enforce_eager": "rollout.vllm.enforce_eager",
    "attention_backend": "rollout.sglang.attention_backend",
    "enable_deterministic_inference": "rollout.sglang.deterministic",
}


def check_config(config: RLConfig, origins: dict[str, str] | None = None, *, require_inputs: bool = True) -> None:
    """Raise ConfigError for inconsistent settings; `require_inputs` also demands a model and data."""
    import torch

    origins = origins or {}

    def fail(key: str, message: str) -> None:
        where = origins.get(key)
        raise ConfigError(f"{key}" + (f" ({where})" if where else "") + f": {message}")

    algo, actor, data, rollout = config.algorithm, config.actor, config.data, config.rollout
    algorithm = Algorithm.from_config(config)
    needs = estimator_needs(algo.adv_estimator)  # the estimator's own, whatever critic.enable says
    for key, name, registry in (
        ("algorithm.adv_estimator", algo.adv_estimator, ADV_ESTIMATORS),
        ("actor.policy_loss", actor.policy_loss, POLICY_LOSSES),
        ("actor.kl_loss_type", actor.kl_loss_type, KL_ESTIMATORS),
        ("algorithm.kl_penalty", algo.kl_penalty, KL_ESTIMATORS),
        ("rollout.name", rollout.name, ENGINES),
    ):
        if name not in registry:
            fail(key, registry.unknown_message(name))
    try:  # the loss itself judges its options' values: one token through it
        token = torch.zeros(1, 1)
        algorithm.policy_loss(token, token, token, torch.ones(1, 1))
    except ValueError as exc:
        fail("actor.policy_loss_options", str(exc))
    if require_inputs and not config.model.path:
        fail(
            "model.path",
            "no model given; pass --model PATH_OR_HUB_ID or model.path=... "
            "('rlkit:tiny-qwen2' builds a tiny offline model)",
        )
    if require_inputs and not data.train_files and not data.synthetic_task and not config.offline:
        fail(
            "data.train_files",
            "no training data; set data.train_files=[train.parquet] "
            "(see `rlkit prep-data`) or data.synthetic_task=echo",
        )
    if rollout.vllm.streaming and rollout.name != "vllm":
        fail(
            "rollout.vllm.streaming",
            f"streams to vLLM's async engine, so it needs rollout.name=vllm (got {rollout.name}); drop streaming=true",
        )
    if rollout.sglang.streaming and rollout.name != "sglang":
        fail(
            "rollout.sglang.streaming",
            f"streams to SGLang's async client, so it needs rollout.name=sglang (got {rollout.name}); "
            "drop streaming=true",
        )
    if config.offline:
        check_offline(config, origins, fail, require_inputs=require_inputs)
    elif algorithm.groups and rollout.n < 2:
        fail(
            "rollout.n",
            f"{algo.adv_estimator} compares samples of one prompt, so it needs rollout.n >= 2 (got {rollout.n})",
        )
    if needs.critic and config.critic.enable is False:
        fail(
            "critic.enable",
            f"algorithm.adv_estimator={algo.adv_estimator} needs a critic; set critic.enable=true "
            "or pick a critic-free estimator (grpo, rloo, ...)",
        )
    if algorithm.critic and not needs.critic:
        fail(
            "critic.enable",
            f"a critic is only used by adv_estimator={'/'.join(estimators_that('critic'))} (got {algo.adv_estimator})",
        )
    if data.train_batch_size % actor.mini_batch_size:
        fail(
            "actor.mini_batch_size",
            f"must divide data.train_batch_size={data.train_batch_size} (got {actor.mini_batch_size})",
        )
    if config.trainer.val_n == 1:
        fail(
            "trainer.val_n",
            "validation always scores one greedy response per prompt (mean@1); trainer.val_n "
            "adds samples at trainer.val_temperature for mean@n, pass@k and maj@n: use 0 or >= 2",
        )
    devices = config.trainer.nnodes * config.trainer.n_gpus_per_node
    if rollout.placement == "split" and rollout.devices >= devices:
        fail(
            "rollout.devices",
            f"split placement gives {rollout.devices} of the {devices} device(s) to rollout, "
            "leaving none to train; raise trainer.n_gpus_per_node / trainer.nnodes or use rollout.placement=colocated",
        )
    check_in_process(config, fail)
    n = config.samples_per_prompt
    if actor.mini_batch_size * n % config.world_size:
        fail(
            "actor.mini_batch_size",
            f"{actor.mini_batch_size} rows x {n} sample(s) each = "
            f"{actor.mini_batch_size * n} sequences cannot be split evenly over {config.world_size} workers",
        )
    if data.train_batch_size * n % config.world_size:
        fail(
            "data.train_batch_size",
            f"{data.train_batch_size} rows x {n} sample(s) each = "
            f"{data.train_batch_size * n} sequences cannot be split evenly over {config.world_size} workers",
        )
    longest = (data.max_prompt_length + data.max_response_length) * config.micro_batch_group
    if actor.micro_batch_tokens != "auto" and longest > actor.micro_batch_tokens:
        what = "one sequence" if config.micro_batch_group == 1 else "one pair (two sequences)"
        fail(
            "actor.micro_batch_tokens",
            f"{actor.micro_batch_tokens} tokens cannot hold {what} of "
            f"max_prompt_length + max_response_length = {data.max_prompt_length + data.max_response_length}",
        )
    if config.offline:  # no rollout, reward or advantage: the rest are RL's
        return
    check_rollout_mode(config, algorithm, fail)
    check_rollout_correction(config, algorithm, origins, fail)
    for engine, kwargs, set_by_rlkit in (
        ("vllm", rollout.vllm.engine_kwargs, VLLM_KEYS_SET_BY_RLKIT),
        ("sglang", rollout.sglang.engine_kwargs, SGLANG_KEYS_SET_BY_RLKIT),
    ):
        reserved = sorted(set(kwargs) & set_by_rlkit)
        if reserved:
            own = "; ".join(sorted({OWN_KEY.get(key, _OWN_KEYS) for key in reserved}))
            fail(
                f"rollout.{engine}.engine_kwargs",
                f"{', '.join(reserved)} is set by rlkit; use its own key instead ({own})",
            )
    check_algorithm(config, algorithm, origins, fail)
    check_reward_components(config, algorithm, fail)


def check_rollout_mode(config: RLConfig, algorithm: Algorithm, fail: Callable[[str, str], None]) -> None:
    """rollout.mode one_step_off/async: what overlapping generation with training needs."""
    rollout = config.rollout
    if rollout.mode == "sync":
        return
    if rollout.placement != "split":
        fail(
            "rollout.mode",
            f"{rollout.mode} generates while the trainer trains, on devices of its own: set "
            "rollout.placement=split and rollout.devices=N (N of trainer.n_gpus_per_node x trainer.nnodes "
            "devices then only generate), or use rollout.mode=sync",
        )
    if algorithm.old_log_probs == "rollout":
        fail(
            "actor.old_log_probs",
            f"with rollout.mode={rollout.mode} the engine's log-probs come from an older "
            "policy than the one the update starts from; use auto or recompute (importance weights, "
            "actor.rollout_correction, then correct for the gap)",
        )
    if algorithm.group_filter and algorithm.greedy_baseline:
        # The baseline is generated with its batch, ahead; the extra rounds' groups come later, from another
        # policy version, and would need baselines of their own (docs/async.md).
        fail(
            "algorithm.dynamic_sampling.enable",
            f"with rollout.mode={rollout.mode}, {algorithm.estimator}'s greedy "
            "baseline is generated ahead with the batch, not for the groups of dynamic sampling's extra rounds; "
            "turn one of them off or use rollout.mode=sync",
        )


def check_algorithm(
    config: RLConfig, algorithm: Algorithm, origins: dict[str, str], fail: Callable[[str, str], None]
) -> None:
    """Combinations of algorithm options that cannot work, or would silently do nothing."""
    algo, actor, critic, rollout = config.algorithm, config.actor, config.critic, config.rollout
    overlong = config.reward.overlong_buffer
    if critic.warmup_steps and not algorithm.critic:
        fail(
            "critic.warmup_steps",
            f"only a critic warms up, and adv_estimator={algo.adv_estimator} uses none; "
            f"remove it or use adv_estimator={'/'.join(estimators_that('critic'))}",
        )
    if algorithm.critic and critic.warmup_steps >= config.trainer.total_steps:
        fail(
            "critic.warmup_steps",
            f"{critic.warmup_steps} critic warm-up steps leave none of "
            f"trainer.total_steps={config.trainer.total_steps} for the actor; lower it",
        )
    if algorithm.kl_loss and actor.kl_loss_coef == 0:
        fail(
            "actor.kl_loss_coef",
            "is 0 with actor.use_kl_loss=true, so a reference model would load for a term "
            "that is always 0; set a coefficient > 0 or actor.use_kl_loss=false",
        )
    if algorithm.kl_in_reward and algo.kl_ctrl.type == "fixed" and algo.kl_ctrl.kl_coef == 0:
        fail(
            "algorithm.kl_ctrl.kl_coef",
            "is 0 with algorithm.use_kl_in_reward=true, so a reference model would "
            "load for a penalty that is always 0; set a coefficient > 0 or use_kl_in_reward=false",
        )
    if algorithm.token_stats and algorithm.old_log_probs == "rollout":
        fail(
            "actor.old_log_probs",
            f"adv_estimator={algo.adv_estimator} reads each token's probabilities from the trainer's old-log-prob "
            "pass, which actor.old_log_probs=rollout leaves out; use auto or recompute",
        )
    if algorithm.group_filter and rollout.n < 2:
        fail(
            "algorithm.dynamic_sampling.enable",
            "dynamic sampling drops groups whose samples all scored the "
            f"same, so it needs rollout.n >= 2 (got {rollout.n})",
        )
    if overlong.enable and overlong.length > config.data.max_response_length:
        fail(
            "reward.overlong_buffer.length",
            f"{overlong.length} tokens is longer than "
            f"data.max_response_length={config.data.max_response_length}; the buffer must fit inside it",
        )
    # A key given on the command line for a part that is off would silently change nothing.
    inactive = {
        "critic.": (not algorithm.critic, f"there is no critic (adv_estimator={algo.adv_estimator})"),
        "algorithm.kl_ctrl.": (not algorithm.kl_in_reward, "algorithm.use_kl_in_reward is false"),
        "algorithm.kl_penalty": (not algorithm.kl_in_reward, "algorithm.use_kl_in_reward is false"),
        "actor.kl_loss_": (not algorithm.kl_loss, "actor.use_kl_loss is false"),
        "algorithm.dynamic_sampling.max_gen_rounds": (
            not algorithm.group_filter,
            "algorithm.dynamic_sampling.enable is false",
        ),
        "reward.overlong_buffer.": (not overlong.enable, "reward.overlong_buffer.enable is false"),
        **{
            f"algorithm.{option}": (
                option not in estimator_needs(algo.adv_estimator).options,
                f"only adv_estimator={' and '.join(estimators_that(option))} read it",
            )
            for option in ("norm_adv_by_std", "lam", "gamma")
        },
        "rollout.max_staleness": (
            rollout.mode != "async",
            f"only rollout.mode=async reads it (mode is {rollout.mode})",
        ),
        "rollout.weight_sync": (rollout.placement != "split", "only split placement sends weights to other devices"),
        "sft.": (config.objective != "sft", f"only objective sft reads it (objective is {config.objective})"),
        "dpo.": (config.objective != "dpo", f"only objective dpo reads it (objective is {config.objective})"),
    }
    switches = ("critic.enable", "reward.overlong_buffer.enable")
    for key, origin in origins.items():
        if origin != "command line" or key in switches:
            continue
        for prefix, (off, why) in inactive.items():
            if key.startswith(prefix) and off:
                fail(key, f"has no effect: {why}")


def batch_arithmetic(config: RLConfig) -> list[str]:
    """The derived batch numbers, in words, for --dry-run."""
    d, a, w, n = config.data, config.actor, config.world_size, config.samples_per_prompt
    sequences = d.train_batch_size * n
    updates = d.train_batch_size // a.mini_batch_size * a.ppo_epochs
    longest = d.max_prompt_length + d.max_response_length
    per_worker = a.mini_batch_size * n // w
    if a.micro_batch_tokens == "auto":
        micro = (
            "in micro-batches sized at start-up (actor.micro_batch_tokens=auto: from the free GPU memory, "
            f"{CPU_MICRO_BATCH_TOKENS} tokens on CPU)"
        )
    else:
        per_micro = max(1, a.micro_batch_tokens // longest)
        micro = (
            f"in micro-batches of up to {a.micro_batch_tokens} tokens (at least {per_micro} full-length "
            f"sequences, so at most {-(-per_worker // per_micro)} micro-batch(es))"
        )
    unit = {"rl": "prompts", "dpo": "pairs"}.get(config.objective, "rows")
    pairs = f" = {sequences} sequences" if config.objective == "dpo" else ""
    first = (
        f"each step takes {d.train_batch_size} {unit} of data.train_files{pairs} ({config.objective}: no generation)"
        if config.offline
        else f"each step samples {d.train_batch_size} prompts x rollout.n={n} = {sequences} sequences"
    )
    return [
        first,
        f"the {sequences} sequences are split over {w} worker(s): {sequences // w} each",
        f"{updates} optimizer step(s) per {'step' if config.offline else 'RL step'}: "
        f"{d.train_batch_size // a.mini_batch_size} mini-batch(es) "
        f"of {a.mini_batch_size} {unit} ({a.mini_batch_size * n} sequences) x {a.ppo_epochs} epoch(s)",
        f"each worker takes {per_worker} sequences per optimizer step, {micro}",
        f"{config.trainer.total_steps} steps in all = {config.trainer.total_steps * sequences} "
        f"{'trained' if config.offline else 'sampled'} sequences",
    ] + ([] if config.offline else _plan_lines(config))


def _plan_lines(config: RLConfig) -> list[str]:
    algorithm = Algorithm.from_config(config)
    return describe(phase_plan(algorithm), algorithm, config.rollout, train_batch_size=config.data.train_batch_size)


def check_in_process(config: RLConfig, fail: Callable[[str, str], None]) -> None:
    """trainer.workers=in_process: every worker is an object in this process, on the CPU: one training worker, and
    with split placement one rollout worker beside it, which gets the weights handed over in memory."""
    trainer, rollout = config.trainer, config.rollout
    if trainer.workers != "in_process":
        return
    split = rollout.placement == "split"
    devices = trainer.nnodes * trainer.n_gpus_per_node
    if split and (devices != 2 or rollout.devices != 1):
        fail(
            "trainer.n_gpus_per_node" if devices != 2 else "rollout.devices",
            f"trainer.workers=in_process with split placement runs one training and one rollout worker in this "
            f"process, but trainer.nnodes x trainer.n_gpus_per_node = {devices} devices and rollout.devices="
            f"{rollout.devices}; set trainer.n_gpus_per_node=2 and rollout.devices=1, or use trainer.workers=ray",
        )
    if not split and devices != 1:
        key = "trainer.nnodes" if trainer.nnodes > 1 else "trainer.n_gpus_per_node"
        fail(
            key,
            f"trainer.workers=in_process runs one worker per group in this process, but trainer.nnodes x "
            f"trainer.n_gpus_per_node = {devices} devices; set both to 1 or use trainer.workers=ray",
        )
    if split and rollout.weight_sync == "broadcast":
        fail(
            "rollout.weight_sync",
            "trainer.workers=in_process hands the weights to the rollout worker in memory, with no collective to "
            "broadcast over; set rollout.weight_sync=object_store (there: the buckets themselves), or use "
            "trainer.workers=ray",
        )
    if trainer.device == "cuda":
        fail(
            "trainer.device",
            "trainer.workers=in_process runs on the CPU only; set trainer.device=cpu or use trainer.workers=ray",
        )
