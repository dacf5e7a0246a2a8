"""Rewards: rule functions by data_source (registry, gsm8k, math), user functions (custom),
guarded batched scoring (scoring), reward models (reward_model); the `reward.*` options live in
rlkit.recipes.reward_schema."""
