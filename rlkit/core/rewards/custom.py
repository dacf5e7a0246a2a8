"""Load user code named as 'path/file.py:function' (reward functions, dataset builders)."""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from pathlib import Path
from typing import Any, Callable

from rlkit.errors import UserError

_MODULES: dict[Path, Any] = {}  # imported user files, once per process
_FUNCTIONS: dict[str, Callable[..., Any]] = {}  # FileFunction's resolved functions, by spec


def split_spec(spec: str, what: str) -> tuple[Path, str]:
    """'dir/file.py:fn' -> (absolute path, 'fn'); a UserError naming `what` if malformed or missing."""
    path_text, sep, name = spec.rpartition(":")
    if not sep or not path_text or not name.isidentifier():
        raise UserError(f"{what}={spec!r} must look like 'path/to/file.py:function_name'")
    path = Path(path_text).expanduser().resolve()
    if not path.is_file():
        raise UserError(f"{what}={spec!r}: file {path} does not exist")
    return path, name


def _import_file(path: Path, what: str) -> Any:
    if path in _MODULES:
        return _MODULES[path]
    # A unique, stable module name: classes defined in the file pickle and compare sanely.
    module_name = f"rlkit_user_{path.stem}_{hashlib.sha1(str(path).encode()).hexdigest()[:8]}"
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise UserError(f"{what}: {path} is not an importable Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise UserError(f"{what}: importing {path} failed: {type(exc).__name__}: {exc}") from exc
    _MODULES[path] = module
    return module


def load_function(spec: str, what: str) -> Callable[..., Any]:
    """The callable `spec` names; `what` (e.g. 'reward.function') prefixes every error."""
    path, name = split_spec(spec, what)
    module = _import_file(path, what)
    fn = getattr(module, name, None)
    if not callable(fn):
        defined = sorted(
            k
            for k, v in vars(module).items()
            if callable(v) and not k.startswith("_") and getattr(v, "__module__", None) == module.__name__
        )
        problem = "is not callable" if fn is not None else "is not defined there"
        raise UserError(f"{what}={spec!r}: {name!r} {problem}; functions in {path.name}: {defined or 'none'}")
    return fn


class FileFunction:
    """A picklable handle on 'file.py:fn': pickles as the spec and imports the file where called,
    so it can cross into reward worker processes, which import it once each."""

    def __init__(self, spec: str, what: str) -> None:
        path, name = split_spec(spec, what)
        self.spec, self.what = f"{path}:{name}", what
        load_function(self.spec, what)  # fail now, in the caller's process, not in a worker

    def __call__(self, *args: Any) -> Any:
        fn = _FUNCTIONS.get(self.spec)
        if fn is None:
            fn = _FUNCTIONS[self.spec] = load_function(self.spec, self.what)
        return fn(*args)

    def __repr__(self) -> str:
        return self.spec
