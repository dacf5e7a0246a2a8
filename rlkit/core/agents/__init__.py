"""Multi-turn episodes: the agent loop that runs on the rollout workers (loop), the token-exact
turn boundary (chat), environments (envs), tools and their Hermes-format calls (tools,
builtin_tools; they run code in rlkit.core.sandbox), guarded calls into user code (guard), the
workers' and the rollout source's side (worker, dispatch), checks before a run (preflight).
docs/agents.md is the user's guide."""
