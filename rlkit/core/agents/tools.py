"""Tools: plain Python functions the policy calls in the Hermes/Qwen2.5 format.

A tool is a function with type hints and a docstring; its JSON schema (what the chat
template shows the model through `tools=`) comes from them: the docstring's first paragraph
describes the function, its Google-style `Args:` section each parameter. A parameter named
`row` is not shown to the model: rlkit passes the episode's data row there (a tool that
needs to know which problem it serves).

The policy calls tools by writing `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`
(one or more per turn); each call's result comes back as a "tool" message. A call that is not
valid JSON, names no known tool, has wrong arguments, raises, or times out is answered with
an error message the model can read, never a crash.
"""

from __future__ import annotations

import functools
import inspect
import json
import re
import types
import typing
from dataclasses import dataclass
from typing import Any, Callable, Literal, Union

ROW_PARAMETER = "row"  # filled by rlkit with the episode's row, hidden from the model
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_ARGS_SECTION = re.compile(r"^[ \t]*(?:Args|Arguments|Parameters):[ \t]*$", re.MULTILINE)
_SIMPLE_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean"}


class ToolDefinitionError(ValueError):
    """A function that cannot be offered as a tool (message says why)."""


class ToolUnavailable(RuntimeError):
    """Raised by a tool whose service is gone (an MCP server that exited): the episode fails (scored 0,
    reported with its row) instead of the model reading an error it did not cause."""


@dataclass
class Tool:
    fn: Callable[..., Any]
    schema: dict[str, Any]  # {"type": "function", "function": {"name", "description", "parameters"}}

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    @property
    def wants_row(self) -> bool:
        return ROW_PARAMETER in inspect.signature(self.fn).parameters

    @classmethod
    def from_function(cls, fn: Callable[..., Any]) -> Tool:
        return cls(fn, function_schema(fn))

    def bind(self, arguments: dict[str, Any], row: dict[str, Any]) -> functools.partial | str:
        """The call ready to run (with the episode's `row` where the function takes one), or an error
        message for the model when the arguments do not fit the function."""
        arguments = dict(arguments)
        if self.wants_row:
            arguments[ROW_PARAMETER] = row
        try:
            inspect.signature(self.fn).bind(**arguments)
        except TypeError as exc:
            return f"error: wrong arguments for {self.name}: {exc}"
        return functools.partial(self.fn, **arguments)


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any]


def parse_tool_calls(text: str) -> list[ToolCall | str]:
    """The calls in a policy turn, in order; a malformed one is a string saying what is wrong with it."""
    calls: list[ToolCall | str] = [_parse_call(body.strip()) for body in _CALL.findall(text)]
    if text.count("<tool_call>") > text.count("</tool_call>"):
        calls.append("a <tool_call> is not closed by </tool_call>")
    return calls


def _parse_call(body: str) -> ToolCall | str:
    try:
        data = json.loads(body)
    except json.JSONDecodeError as exc:
        return f"the tool call is not valid JSON ({exc.msg} at character {exc.pos}): {body[:200]}"
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return 'a tool call must be a JSON object {"name": ..., "arguments": {...}}'
    arguments = data.get("arguments", {})
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            pass
    if not isinstance(arguments, dict):
        return f'the "arguments" of the call to {data["name"]!r} must be a JSON object'
    return ToolCall(data["name"], arguments)


def function_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The OpenAI/Hermes function schema of `fn`, from its type hints and Google-style docstring."""
    name = getattr(fn, "__name__", "")
    description, arg_docs = parse_docstring(inspect.getdoc(fn) or "")
    if not description:
        raise ToolDefinitionError(f"tool {name!r} has no docstring: its first line tells the model what it does")
    try:
        hints = typing.get_type_hints(fn)
    except Exception as exc:  # noqa: BLE001 - an unresolvable annotation, whatever the error
        raise ToolDefinitionError(f"tool {name!r}: its type hints cannot be read ({exc})") from None
    properties, required = {}, []
    for param in inspect.signature(fn).parameters.values():
        if param.name == ROW_PARAMETER:
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            raise ToolDefinitionError(
                f"tool {name!r}: parameter {param.name!r} must be a plain named parameter "
                "(the model passes arguments by name)"
            )
        if param.name not in hints:
            raise ToolDefinitionError(f"tool {name!r}: parameter {param.name!r} has no type hint")
        properties[param.name] = json_type(hints[param.name], f"tool {name!r}, parameter {param.name!r}")
        if param.name in arg_docs:
            properties[param.name]["description"] = arg_docs[param.name]
        if param.default is param.empty:
            required.append(param.name)
    parameters = {"type": "object", "properties": properties, "required": required}
    return {"type": "function", "function": {"name": name, "description": description, "parameters": parameters}}


def json_type(hint: Any, where: str) -> dict[str, Any]:
    """JSON schema of a type hint: str, int, float, bool, list[X], dict[str, X], Literal[...], X | None."""
    if hint in _SIMPLE_TYPES:
        return {"type": _SIMPLE_TYPES[hint]}
    if hint is Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        if len(kept) == 1:
            return json_type(kept[0], where)
        return {"anyOf": [json_type(a, where) for a in kept]}
    if origin is Literal:
        kinds = {_SIMPLE_TYPES.get(type(a)) for a in args}
        if len(kinds) == 1 and None not in kinds:
            return {"type": kinds.pop(), "enum": list(args)}
        return {"enum": list(args)}
    if hint is list or origin is list:
        return {"type": "array", **({"items": json_type(args[0], where)} if args else {})}
    if hint is dict or origin is dict:
        return {"type": "object", **({"additionalProperties": json_type(args[1], where)} if args else {})}
    raise ToolDefinitionError(
        f"{where}: type {hint!r} has no JSON equivalent; use str, int, float, bool, list, "
        "dict, Literal or Optional of those"
    )


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(description, {argument: description}) from a Google-style docstring."""
    section = _ARGS_SECTION.search(doc)
    head = doc[: section.start()] if section else doc
    description = " ".join(head.strip().split("\n\n")[0].split())
    args: dict[str, str] = {}
    if section is None:
        return description, args
    indent, current = None, None
    for line in doc[section.end() :].splitlines():
        if not line.strip():
            continue
        depth = len(line) - len(line.lstrip())
        indent = depth if indent is None else indent
        if depth < indent:
            break  # the next section (Returns:, Raises:)
        entry = re.match(r"\s*(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", line)
        if depth == indent and entry:
            current = entry.group(1)
            args[current] = entry.group(2).strip()
        elif current is not None:
            args[current] = f"{args[current]} {line.strip()}".strip()
    return description, args
