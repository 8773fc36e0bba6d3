"""Functions by name for reward rules and tools: a built-in from a table, ``package.module:function``,
or ``path/to/file.py:function`` (a file imported once per process under a name derived from its path)."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import importlib.util
import sys
from pathlib import Path
from typing import Callable

from rlvr.errors import UserError, failure_line


def is_plugin(name: str, builtins: dict) -> bool:
    """Whether ``name`` is ``package.module:function`` or ``path/to/file.py:function``."""
    return ":" in name and name not in builtins


def canonical(name: str, builtins: dict) -> str:
    """``name`` with a relative plugin file path made absolute (pool workers may run in another directory)."""
    if is_plugin(name, builtins):
        where, _, fn = name.rpartition(":")
        if where.endswith(".py"):
            return f"{Path(where).resolve()}:{fn}"
    return name


def load(name: str, builtins: dict, *, kind: str, expects: str, context: str = "", close_matches: int = 3) -> Callable:
    """The function ``name`` stands for: ``builtins[name]``, or a plugin's function.

    Args:
        kind: what it is, in messages and in the module name of a plugin file ("reward", "tool").
        expects: the signature a plugin's function must have, in the message when it has none.
        context: where the name was given, after the unknown name in its message.

    Raises:
        UserError: an unknown name (with close matches and the known names), a plugin file that is
            missing or fails to import, a module that does not import, or no such function in it.
    """
    if name in builtins:
        return builtins[name]
    if ":" not in name:
        close = difflib.get_close_matches(name, builtins, n=close_matches)
        hint = f"did you mean {' or '.join(repr(c) for c in close)}? " if close else ""
        raise UserError(
            f"unknown {kind} '{name}'{context}; {hint}known: {', '.join(sorted(builtins))}, "
            "or a plugin 'package.module:function' / 'path/to/file.py:function'"
        )
    where, _, fn_name = name.rpartition(":")
    if where.endswith(".py"):
        module = _load_file(Path(where).resolve(), name, kind)
    else:
        try:
            module = importlib.import_module(where)
        except ImportError as e:
            raise UserError(
                f"cannot import {kind} module '{where}' (from '{name}'): {e}; "
                "check it is on PYTHONPATH, or give a file as path/to/file.py:function"
            ) from None
        except (Exception, SystemExit) as e:  # the module raised while it ran
            raise UserError(f"{kind} module '{where}' (from '{name}') failed to import: {failure_line(e)}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        what = "function" if expects.startswith("(") else "class"
        raise UserError(f"{kind} plugin '{where}' has no {what} '{fn_name}'; expected a {what} {expects}")
    return fn


def _load_file(path: Path, name: str, kind: str):
    key = f"rlvr_{kind}_plugin_" + hashlib.sha1(str(path).encode()).hexdigest()[:12]
    if key in sys.modules:
        return sys.modules[key]
    if not path.is_file():
        raise UserError(
            f"{kind} plugin file {path} not found (from '{name}'); give an existing path/to/file.py:function"
        )
    spec = importlib.util.spec_from_file_location(key, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[key] = module
    try:
        spec.loader.exec_module(module)
    except (Exception, SystemExit) as e:  # sys.exit() at import would end rlvr with no word
        del sys.modules[key]
        raise UserError(f"{kind} plugin file {path} failed to import: {failure_line(e)}") from None
    return module
