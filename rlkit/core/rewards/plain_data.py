"""Plain data as one line of text: the only form in which a candidate program's answer reaches its judge.

Standard library only: the code reward (rlkit.core.rewards.code) copies this file into both of its
sandboxes as `plain_data.py`, the candidate's (which encodes answers) and the judge's (which decodes them).

The encoding is JSON with tags. None, bools, ints, floats (NaN and +-Infinity as Python's json writes
them), strings and lists are JSON's own; every other value is an object with one key:
{"tuple": [...]}, {"set": [...]}, {"frozenset": [...]}, {"dict": [[key, value], ...]}, {"bytes": "<hex>"}.
Decoding builds only those builtin types, so nothing decoded carries methods of the sender's making
(no always-equal `__eq__`, no subclass): it is compared by value. It refuses anything else, and any
line longer than MAX_LINE_BYTES or nested deeper than MAX_DEPTH, by raising NotPlain.
"""

from __future__ import annotations

import json
from typing import Any

MAX_LINE_BYTES = 1 << 20  # one answer; HumanEval's largest canonical answer is a few hundred bytes
MAX_DEPTH = 100
_SEQUENCES = {"tuple": tuple, "set": set, "frozenset": frozenset}


class NotPlain(ValueError):
    """A value (or a line) that is not plain data in this encoding."""


def encode(value: Any, depth: int = 0) -> Any:
    """`value` as JSON-ready data; subclasses of the plain types are encoded as their base type's value."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"nested deeper than {MAX_DEPTH}")
    if value is None or isinstance(value, bool):
        return None if value is None else bool(value)
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        return float(value)
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, (bytes, bytearray)):
        return {"bytes": bytes(value).hex()}
    if isinstance(value, list):
        return [encode(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {"dict": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    for tag, kind in _SEQUENCES.items():
        if isinstance(value, kind):
            return {tag: [encode(item, depth + 1) for item in value]}
    raise NotPlain(f"a {type(value).__name__} is not plain data")


def decode(data: Any, depth: int = 0) -> Any:
    """The value `data` (as json.loads returned it) encodes; NotPlain for anything else."""
    if depth > MAX_DEPTH:
        raise NotPlain(f"nested deeper than {MAX_DEPTH}")
    if data is None or type(data) in (bool, int, float, str):
        return data
    if type(data) is list:
        return [decode(item, depth + 1) for item in data]
    if type(data) is dict and len(data) == 1:
        ((tag, body),) = data.items()
        if tag == "bytes" and type(body) is str:
            try:
                return bytes.fromhex(body)
            except ValueError:
                raise NotPlain("bytes that are not hex") from None
        if type(body) is list and tag in _SEQUENCES:
            try:
                return _SEQUENCES[tag](decode(item, depth + 1) for item in body)
            except TypeError:  # an unhashable member of a set
                raise NotPlain(f"a {tag} of unhashable values") from None
        if tag == "dict" and type(body) is list and all(type(p) is list and len(p) == 2 for p in body):
            try:
                return {decode(k, depth + 1): decode(v, depth + 1) for k, v in body}
            except TypeError:
                raise NotPlain("a dict with an unhashable key") from None
    raise NotPlain(f"{str(data)[:60]!r} is not plain data in this encoding")


def dumps(message: dict[str, Any]) -> bytes:
    """One protocol line: a JSON object and a newline."""
    return json.dumps(message, separators=(",", ":")).encode() + b"\n"


def loads(line: bytes) -> dict[str, Any]:
    """A protocol line back to its JSON object; NotPlain for an over-long line, bad JSON or too deep a nesting."""
    if len(line) > MAX_LINE_BYTES:
        raise NotPlain(f"a line over {MAX_LINE_BYTES} bytes")
    try:
        message = json.loads(line)
    except (ValueError, RecursionError) as exc:  # bad JSON, an int of over 4300 digits, a nesting too deep
        raise NotPlain(f"not a JSON line ({type(exc).__name__})") from None
    if type(message) is not dict:
        raise NotPlain("not a JSON object")
    return message
