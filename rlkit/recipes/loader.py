"""Recipe -> overrides -> one validated RLConfig, with errors that say what to change."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from rlkit.errors import ConfigError
from rlkit.recipes.aliases import READ_INTO, VERL_ALIASES, VERL_ANSWERS, translate_key
from rlkit.recipes.schema import RLConfig

BUILTIN_DIR = Path(__file__).parent / "builtin"
META_KEYS = ("description", "base")
# The command line's 'KEY=VALUE' texts (each value read as YAML), or the Python API's {key: value}: the value as
# it is, which may be an object no YAML can hold (a reward function, an environment class).
Overrides = Sequence[str] | Mapping[str, Any]
COMMAND_LINE, PYTHON_OVERRIDES = "command line", "overrides"
EVAL_OVERRIDES = "rlkit eval"  # validation settings of a model: no training reads them


def list_recipes() -> dict[str, str]:
    """Built-in recipe names and their one-line descriptions."""
    return {p.stem: (_read_yaml(p).get("description") or "").strip() for p in sorted(BUILTIN_DIR.glob("*.yaml"))}


def find_recipe(name_or_path: str) -> Path:
    path = Path(name_or_path).expanduser()
    if path.suffix in (".yaml", ".yml") or path.exists():
        if not path.is_file():
            raise ConfigError(f"recipe file {path} does not exist")
        return path
    builtin = BUILTIN_DIR / f"{name_or_path}.yaml"
    if builtin.is_file():
        return builtin
    names = list(list_recipes())
    close = difflib.get_close_matches(name_or_path, names, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise ConfigError(
        f"no recipe named {name_or_path!r} (built-in: {', '.join(names)}){hint}; or pass a path to a .yaml file"
    )


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping of config groups, not {type(data).__name__}")
    return data


def recipe_layers(name_or_path: str) -> list[tuple[Path, dict[str, Any]]]:
    """The recipe and its `base:` chain, base first."""
    layers: list[tuple[Path, dict[str, Any]]] = []
    seen: set[Path] = set()
    current: str | None = name_or_path
    while current:
        path = find_recipe(current)
        if path in seen:
            raise ConfigError(f"recipe {path} has a `base:` cycle")
        seen.add(path)
        data = _read_yaml(path)
        layers.insert(0, (path, data))
        current = data.get("base")
    return layers


def parse_override(text: str) -> tuple[str, Any]:
    """'rollout.n=8' -> ('rollout.n', 8); the value is read as YAML (lists, numbers, null)."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError(f"override {text!r} is not KEY=VALUE (e.g. rollout.n=8)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    return key.strip().lstrip("+"), value


def override_items(overrides: Overrides | None, origin: str = COMMAND_LINE) -> list[tuple[str, Any, str]]:
    """(dotted key, value, where it was written) for each override, in order; `origin` names where KEY=VALUE
    texts come from."""
    if not overrides:
        return []
    if isinstance(overrides, Mapping):
        for key in overrides:
            if not isinstance(key, str) or not key.strip():
                raise ConfigError(f"override key {key!r} is not a dotted key such as 'rollout.n'")
        return [(key.strip(), value, PYTHON_OVERRIDES) for key, value in overrides.items()]
    if isinstance(overrides, (str, bytes)) or not all(isinstance(text, str) for text in overrides):
        raise ConfigError(
            f"overrides={overrides!r:.80}: pass a dict {{'rollout.n': 8}} or a list of 'KEY=VALUE' strings"
        )
    return [(*parse_override(text), origin) for text in overrides]


def _set_dotted(tree: dict[str, Any], key: str, value: Any, origin: str, origins: dict[str, str]) -> None:
    parts = key.split(".")
    node = tree
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"{key} ({origin}): {'.'.join(parts[: i + 1])} is a value, not a group")
        node = child
    node[parts[-1]] = value
    origins[key] = origin


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        dotted = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            flat.update(_flatten(value, dotted + "."))
        else:
            flat[dotted] = value
    return flat


def valid_keys(model: type[BaseModel] = RLConfig, prefix: str = "") -> list[str]:
    keys = []
    for name, field in model.model_fields.items():
        annotation = field.annotation
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            keys += valid_keys(annotation, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _field_description(key: str) -> str:
    model: type[BaseModel] = RLConfig
    parts = key.split(".")
    for part in parts[:-1]:
        field = model.model_fields.get(part)
        if field is None or not (isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)):
            return ""
        model = field.annotation
    field = model.model_fields.get(parts[-1])
    return (field.description or "") if field else ""


def _unknown_key(key: str, origin: str) -> str:
    """'unknown key K (ORIGIN); did you mean ...', the suggestion taken from K's own namespace.

    A verl key (actor_rollout_ref.rollout.nn) is matched against verl's spellings, one of ours
    (rollout.nn) against ours: compared with every key, a typo deep in a long verl key lands on
    whichever short key shares the most letters.
    """
    spellings = {k: "" for k in valid_keys()}
    spellings.update({k: f" (verl's spelling of {ours})" for k, ours in VERL_ALIASES.items()})
    spellings.update({k: f" (verl's key: {answer})" for k, answer in VERL_ANSWERS.items()})
    namespace = key.split(".")[0]
    same_namespace = [k for k in spellings if k.split(".")[0] == namespace]
    close = difflib.get_close_matches(key, same_namespace, n=1, cutoff=0.6) or difflib.get_close_matches(
        key, list(spellings), n=1, cutoff=0.6
    )
    hint = f"did you mean {close[0]!r}{spellings[close[0]]}?" if close else "`rlkit recipes show NAME` lists the keys"
    return f"unknown key {key!r} ({origin}); {hint}"


def _explain(exc: ValidationError, origins: dict[str, str], flat: dict[str, Any]) -> str:
    lines = []
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"] if not isinstance(p, int))
        origin = origins.get(key, "recipe")
        if err["type"] == "extra_forbidden":
            # Pydantic names the first unknown level (`actor_rollout_ref`); the user wrote whole keys.
            written = [k for k in origins if k == key or k.startswith(key + ".")] or [key]
            lines += [_unknown_key(k, origins.get(k, "recipe")) for k in written]
        elif err["type"] == "value_error" and isinstance(err.get("input"), dict):  # a section's check: names keys
            lines.append(f"{key}: {err['msg']}")
        else:
            written = next((old for old, new in READ_INTO.items() if new == key and old in origins), key)
            value = flat.get(written, err.get("input"))
            about = _field_description(key)
            origin = origins.get(written, "recipe")
            lines.append(f"{written}={value!r} ({origin}): {err['msg']}" + (f". {key}: {about}" if about else ""))
    return "\n".join(lines)


def load_config(
    recipe: str,
    overrides: Overrides | None = None,
    *,
    model: str | None = None,
    require_inputs: bool = True,
    overrides_origin: str = COMMAND_LINE,
) -> RLConfig:
    """Resolve a recipe (name or path), its bases, then the overrides (KEY=VALUE texts, or a {key: value} dict),
    into one RLConfig.

    `require_inputs=False` (for --dry-run) accepts a config that names no model or data yet. `overrides_origin`:
    where KEY=VALUE texts come from (EVAL_OVERRIDES: `rlkit eval`'s, which may set how an SFT or DPO model is
    validated).
    """
    tree: dict[str, Any] = {}
    origins: dict[str, str] = {}
    layers = recipe_layers(recipe)
    for path, data in layers:
        body = {k: v for k, v in data.items() if k not in META_KEYS}
        for key, value in _flatten(body).items():
            _set_dotted(tree, translate_key(key, f"{path.name}"), value, path.name, origins)
    for key, value, origin in override_items(overrides, overrides_origin):
        _set_dotted(tree, translate_key(key, origin), value, origin, origins)
    if model:
        _set_dotted(tree, "model.path", model, "--model", origins)
    tree["recipe"] = tree.get("recipe") or layers[-1][0].stem  # a run's config.yaml keeps its recipe's name
    try:
        config = RLConfig.model_validate(tree)
    except ValidationError as exc:
        raise ConfigError(_explain(exc, origins, _flatten(tree))) from None
    from rlkit.recipes.checks import check_config

    check_config(config, origins, require_inputs=require_inputs)
    return config


def overrides_text(overrides: Overrides | None) -> str:
    """The overrides as one line of KEY=VALUE (an object as config.yaml records it), for logs and messages."""
    from rlkit.recipes.user_code import reference

    if isinstance(overrides, Mapping):
        return " ".join(f"{key}={reference(value) if callable(value) else value}" for key, value in overrides.items())
    return " ".join(overrides or [])


def config_to_yaml(config: RLConfig) -> str:
    return yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False)
