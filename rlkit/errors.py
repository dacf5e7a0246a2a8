"""Errors a user can fix. The CLI prints them as one message and exits with code 2."""


class UserError(Exception):
    """Bad input from the user (config, paths, data). The message must say what to change."""

    next_step = ""  # how to continue, when a run found the problem after it started (the run loop sets it)


class ConfigError(UserError):
    """A recipe or override that does not validate."""


def shown(value: object) -> str:
    """A value's type and the start of its repr, for messages about bad input."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"
