"""verl's long key spellings, so a verl command line runs (or is answered with ours)."""

from __future__ import annotations

from rlkit.errors import ConfigError

_ARR = "actor_rollout_ref"
VERL_ALIASES: dict[str, str] = {
    f"{_ARR}.model.path": "model.path",
    f"{_ARR}.model.enable_gradient_checkpointing": "model.gradient_checkpointing",
    f"{_ARR}.model.lora_rank": "model.lora.rank",
    f"{_ARR}.model.lora_alpha": "model.lora.alpha",
    f"{_ARR}.model.target_modules": "model.lora.target_modules",
    f"{_ARR}.rollout.name": "rollout.name",
    f"{_ARR}.rollout.n": "rollout.n",
    f"{_ARR}.rollout.temperature": "rollout.temperature",
    f"{_ARR}.rollout.top_p": "rollout.top_p",
    f"{_ARR}.rollout.top_k": "rollout.top_k",
    f"{_ARR}.rollout.gpu_memory_utilization": "rollout.gpu_memory_utilization",
    f"{_ARR}.rollout.enforce_eager": "rollout.vllm.enforce_eager",
    f"{_ARR}.rollout.engine_kwargs.vllm": "rollout.vllm.engine_kwargs",
    f"{_ARR}.rollout.engine_kwargs.sglang": "rollout.sglang.engine_kwargs",
    f"{_ARR}.rollout.max_num_seqs": "rollout.max_num_seqs",
    f"{_ARR}.actor.optim.lr": "actor.lr",
    f"{_ARR}.actor.optim.weight_decay": "actor.weight_decay",
    f"{_ARR}.actor.optim.lr_warmup_steps": "actor.warmup_steps",
    f"{_ARR}.actor.ppo_mini_batch_size": "actor.mini_batch_size",
    f"{_ARR}.actor.ppo_epochs": "actor.ppo_epochs",
    f"{_ARR}.actor.ppo_max_token_len_per_gpu": "actor.micro_batch_tokens",
    f"{_ARR}.actor.grad_clip": "actor.grad_clip",
    f"{_ARR}.actor.clip_ratio_low": "actor.clip_ratio_low",
    f"{_ARR}.actor.clip_ratio_high": "actor.clip_ratio_high",
    f"{_ARR}.actor.clip_ratio_c": "actor.clip_ratio_c",
    f"{_ARR}.actor.loss_agg_mode": "actor.loss_agg_mode",
    f"{_ARR}.actor.policy_loss.loss_mode": "actor.policy_loss",
    # The losses' own options where verl's name means one thing whatever the loss (its clip_ratio_low/high mean
    # another bound for cispo, gmpo and dppo: actor.policy_loss_options, docs/algorithms.md).
    f"{_ARR}.actor.tau_pos": "actor.policy_loss_options.tau_pos",
    f"{_ARR}.actor.tau_neg": "actor.policy_loss_options.tau_neg",
    f"{_ARR}.actor.policy_loss.clip_cov_ratio": "actor.policy_loss_options.clip_cov_ratio",
    f"{_ARR}.actor.policy_loss.clip_cov_lb": "actor.policy_loss_options.clip_cov_lb",
    f"{_ARR}.actor.policy_loss.clip_cov_ub": "actor.policy_loss_options.clip_cov_ub",
    f"{_ARR}.actor.policy_loss.kl_cov_ratio": "actor.policy_loss_options.kl_cov_ratio",
    f"{_ARR}.actor.policy_loss.ppo_kl_coef": "actor.policy_loss_options.ppo_kl_coef",
    f"{_ARR}.actor.entropy_coeff": "actor.entropy_coeff",
    f"{_ARR}.actor.use_kl_loss": "actor.use_kl_loss",
    f"{_ARR}.actor.kl_loss_coef": "actor.kl_loss_coef",
    f"{_ARR}.actor.kl_loss_type": "actor.kl_loss_type",
    "critic.optim.lr": "critic.lr",
    "trainer.critic_warmup": "critic.warmup_steps",
    "algorithm.norm_adv_by_std_in_grpo": "algorithm.norm_adv_by_std",
    "algorithm.filter_groups.enable": "algorithm.dynamic_sampling.enable",
    "algorithm.filter_groups.max_num_gen_batches": "algorithm.dynamic_sampling.max_gen_rounds",
    "reward_model.overlong_buffer.enable": "reward.overlong_buffer.enable",
    "reward_model.overlong_buffer.len": "reward.overlong_buffer.length",
    "reward_model.overlong_buffer.penalty_factor": "reward.overlong_buffer.penalty_factor",
    "algorithm.rollout_correction": "actor.rollout_correction",  # rollout_is, rollout_is_threshold, rollout_rs, ...
    "trainer.total_training_steps": "trainer.total_steps",
    "trainer.test_freq": "trainer.val_freq",
    f"{_ARR}.rollout.val_kwargs.n": "trainer.val_n",
    f"{_ARR}.rollout.val_kwargs.temperature": "trainer.val_temperature",
    "trainer.default_local_dir": "trainer.runs_dir",
    "trainer.max_actor_ckpt_to_keep": "trainer.keep_last",
}

# verl keys with no rlkit equivalent: the answer a user gets instead of "unknown key".
VERL_ANSWERS: dict[str, str] = {
    f"{_ARR}.actor.clip_ratio": "set actor.clip_ratio_low and actor.clip_ratio_high",
    f"{_ARR}.actor.ppo_micro_batch_size_per_gpu": "micro-batches are sized in tokens: actor.micro_batch_tokens",
    f"{_ARR}.actor.ppo_micro_batch_size": "micro-batches are sized in tokens: actor.micro_batch_tokens",
    f"{_ARR}.rollout.log_prob_micro_batch_size_per_gpu": "log-prob passes use actor.micro_batch_tokens",
    f"{_ARR}.ref.log_prob_micro_batch_size_per_gpu": "log-prob passes use actor.micro_batch_tokens",
    f"{_ARR}.rollout.tensor_model_parallel_size": "rollout tensor parallelism is not supported yet; "
    "each worker runs its own engine",
    f"{_ARR}.actor.fsdp_config.param_offload": "CPU offload is not supported yet",
    f"{_ARR}.actor.fsdp_config.optimizer_offload": "CPU offload is not supported yet",
    "custom_reward_function.path": "use reward.function=PATH.py:FUNCTION",
    "custom_reward_function.name": "use reward.function=PATH.py:FUNCTION",
    "critic.model.path": "the critic always starts from model.path (the policy's base) with a new value head",
    "algorithm.filter_groups.metric": "dynamic sampling always compares the verifier score (before overlong shaping)",
    "data.gen_batch_size": "each dynamic-sampling round samples data.train_batch_size prompts; "
    "algorithm.dynamic_sampling.max_gen_rounds caps the rounds",
    "trainer.total_epochs": "set trainer.total_steps (steps per epoch = rows // data.train_batch_size)",
    "trainer.val_only": "score a run's checkpoint or a model with `rlkit eval RUN_ID|MODEL_DIR --data FILE`",
    "trainer.log_val_generations": "every validation response is written to RUN/validation/step_N.jsonl",
    "trainer.validation_data_dir": "every validation response is written to RUN/validation/step_N.jsonl",
    "data.val_batch_size": "validation generates all of data.val_files at once, spread over the workers",
    f"{_ARR}.rollout.val_kwargs.do_sample": "validation always scores one greedy response per prompt (mean@1) and, "
    "with trainer.val_n >= 2, that many samples at trainer.val_temperature",
    f"{_ARR}.rollout.val_kwargs.top_p": "validation samples with rollout.top_p",
    f"{_ARR}.rollout.val_kwargs.top_k": "validation samples with rollout.top_k",
    f"{_ARR}.rollout.calculate_log_probs": "the engine returns log-probs every rollout.log_prob_check_freq steps "
    "(1 = every step)",
    "algorithm.rollout_correction.loss_type": "the policy loss is actor.policy_loss (vanilla = PPO clip, "
    "gpg = the plain policy gradient), whatever actor.old_log_probs is; verl's bypass with loss_type=reinforce is "
    "actor.old_log_probs=rollout actor.policy_loss=gpg actor.rollout_correction.rollout_is=token (or sequence)",
}

# rlkit keys that were renamed: the new spelling, for configs and run dirs written before.
RENAMED: dict[str, str] = {
    "actor.recompute_old_log_probs": "now actor.old_log_probs: recompute (was true) or rollout (was false); "
    "the default, auto, skips the pass only where it is exact",
}


# rlkit keys read into a section by its schema (rlkit.recipes.correction_schema): a value they are refused for is
# reported under the key as written.
READ_INTO: dict[str, str] = {
    "actor.rollout_is": "actor.rollout_correction.rollout_is",
    "actor.rollout_is_cap": "actor.rollout_correction.rollout_is_threshold",
}

# rlkit keys that moved, and their place now: read silently (run dirs written before keep resuming).
MOVED: dict[str, str] = {
    "rollout.enforce_eager": "rollout.vllm.enforce_eager",
    "rollout.engine_kwargs": "rollout.vllm.engine_kwargs",
}


def translate_key(key: str, origin: str) -> str:
    """Map a verl spelling to ours; refuse known-but-unsupported verl keys with our spelling (first: one may sit
    under an aliased group, as algorithm.rollout_correction.bypass_mode)."""
    if key in VERL_ANSWERS:
        raise ConfigError(f"{key} ({origin}) is verl's key: {VERL_ANSWERS[key]}")
    for table in (VERL_ALIASES, MOVED):
        for old, new in table.items():  # a dict-valued key arrives flattened: old.sub -> new.sub
            if key == old or key.startswith(old + "."):
                return new + key[len(old) :]
    if key in RENAMED:
        raise ConfigError(f"{key} ({origin}) is {RENAMED[key]}")
    return key
