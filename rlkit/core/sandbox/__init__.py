"""Untrusted code behind an operating-system boundary: the sandboxed Python process (process) and the boundary
it runs behind, with the process-wide isolation mode (isolation). Code rewards (rlkit.core.rewards.code) and the
agents' code tools (rlkit.core.agents.builtin_tools) run a model's code here. docs/security.md."""
