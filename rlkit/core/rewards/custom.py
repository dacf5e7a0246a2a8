"""User code named in a config: 'path/file.py:function', 'python:module:qualname', or (from the Python API)
the object itself; loaded or checked here, one way for all (rewards, environments, tools, agent functions,
dataset builders)."""

from __future__ import annotations

import atexit
import hashlib
import importlib.util
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

from rlkit.errors import UserError
from rlkit.recipes.user_code import PYTHON_REF, reference

_MODULES: dict[Path, Any] = {}  # imported user files, once per process
_FUNCTIONS: dict[str, Callable[..., Any]] = {}  # FileFunction's resolved functions, by spec
_OBJECTS: dict[str, Any] = {}  # ObjectFunction's objects, by the sha1 of their pickle
_SPILLED: dict[str, str] = {}  # ObjectFunction's pickle files in this process, by the same sha1


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

    @property
    def target(self) -> Callable[..., Any]:
        fn = _FUNCTIONS.get(self.spec)
        if fn is None:
            fn = _FUNCTIONS[self.spec] = load_function(self.spec, self.what)
        return fn

    def __call__(self, *args: Any) -> Any:
        return self.target(*args)

    def __repr__(self) -> str:
        return self.spec


def resolve(value: str | Callable[..., Any], what: str) -> Any:
    """The object a config value names (`what`, e.g. 'reward.function', prefixes every error): 'path/file.py:name'
    imported from the file, 'python:module:qualname' imported from the module, an object checked to pickle
    (the run's other processes receive copies of it)."""
    if not isinstance(value, str):
        pickled(value, what)
        return value
    if value.startswith(PYTHON_REF):
        return _import_reference(value, what)
    return load_function(value, what)


def names_code(value: Any) -> bool:
    """Whether a config value names user code (an object, a file or a module) rather than a built-in by name."""
    return not isinstance(value, str) or ":" in value


def pickled(obj: Any, what: str) -> bytes:
    """`obj` pickled with cloudpickle (functions of `__main__` or a notebook by value, of a module by
    reference); UserError saying why when it cannot be."""
    import cloudpickle

    try:
        return cloudpickle.dumps(obj)
    except Exception as exc:  # noqa: BLE001 - pickling fails as whatever the object's state raises
        raise UserError(
            f"{what}={reference(obj)}: this object cannot be pickled ({type(exc).__name__}: {exc}), and the run "
            "sends copies of it to other processes (Ray workers, reward worker processes). Keep what does not "
            "pickle (open files, locks, clients, loaded models) out of it: create it inside the function on its "
            "first call, or name the code as 'path/file.py:name'"
        ) from None


def _import_reference(text: str, what: str) -> Any:
    module_name, _, qualname = text.removeprefix(PYTHON_REF).partition(":")
    again = (
        f"{what}={text!r} was a Python object given to rlkit.train, and its module cannot import it again; "
        f"pass the object again (rlkit.resume(RUN, overrides={{{what!r}: obj}})), or name it as 'path/file.py:name'"
    )
    if module_name == "__main__" or not all(part.isidentifier() for part in qualname.split(".")):
        raise UserError(again)  # a script's or a notebook's object, a nested function, an instance
    try:
        target: Any = importlib.import_module(module_name)
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ModuleNotFoundError, AttributeError):
        raise UserError(again) from None
    except Exception as exc:  # noqa: BLE001 - the module's own code failed while it was imported
        raise UserError(f"{what}={text!r}: importing {module_name} failed: {type(exc).__name__}: {exc}") from exc
    if not callable(target):
        raise UserError(f"{what}={text!r} is {type(target).__name__}, not a function or a class")
    return target


class ObjectFunction:
    """A picklable handle on a Python object passed as a reward function. The object is pickled once, into a file
    only this user can read (removed when this process exits); the handle pickles as that file's path, so a
    call sent to a reward worker process stays small whatever the object holds (a closure over a large table),
    and each worker process loads the object once."""

    def __init__(self, obj: Callable[..., Any], what: str) -> None:
        payload = pickled(obj, what)
        self.key = hashlib.sha1(payload).hexdigest()
        self.spec = reference(obj)
        self.path = _SPILLED.get(self.key) or _spill(payload, self.key)
        _OBJECTS[self.key] = obj  # in this process: the object itself

    @property
    def target(self) -> Callable[..., Any]:
        obj = _OBJECTS.get(self.key)
        if obj is None:
            import cloudpickle

            obj = _OBJECTS[self.key] = cloudpickle.loads(Path(self.path).read_bytes())
        return obj

    def __call__(self, *args: Any) -> Any:
        return self.target(*args)

    def __repr__(self) -> str:
        return self.spec


def _spill(payload: bytes, key: str) -> str:
    fd, path = tempfile.mkstemp(prefix="rlkit-reward-", suffix=".pkl")  # mode 0600
    with os.fdopen(fd, "wb") as handle:
        handle.write(payload)
    atexit.register(Path(path).unlink, missing_ok=True)
    _SPILLED[key] = path
    return path


def user_function(value: str | Callable[..., Any], what: str) -> FileFunction | ObjectFunction:
    """A picklable handle on the function `value` names, checked here (in the caller's process, not in a worker):
    a file's by its spec, anything else by its pickle."""
    if isinstance(value, str) and not value.startswith(PYTHON_REF):
        return FileFunction(value, what)
    function = resolve(value, what)
    if not callable(function):
        raise UserError(f"{what}={reference(value)}: {type(function).__name__} is not callable")
    return ObjectFunction(function, what)
