"""Reading and writing a :class:`~rlvr.config.tree.Config`: a YAML preset (with ``defaults:``
includes) and dotted overrides -> a nested dict -> a typed, validated Config; back to YAML; and the
config reference read from the attribute docstrings (``rlvr config``, ``docs/config.md``).

Why a hand-written loader and not OmegaConf structured configs: OmegaConf 2.3 takes these
dataclasses as they are (StrEnums, ``X | None``, lists, frozen), but its typing is not the one
users already rely on, and every error would have to be caught and reworded. Its overrides
read ``data.system_prompt=`` as null where ours read an empty string (which means "no system
turn", unlike null); it rejects ``train.steps=1.0`` and YAML's ``true`` for ``auto``/``true``/
``false`` switches (``model.autocast_bf16=true``) and accepts ``1`` for a bool; its errors
are several lines (``Invalid value 'k9', expected one of [K1, K2, K3]`` plus ``full_key``/
``object_type`` lines) and its "did you mean" names one level (``trian``), not the dotted key;
``defaults:`` includes are Hydra's, not OmegaConf's, so they would stay ours anyway. The
loader here (``_coerce``/``_build``/``_set_dotted``/``_merge``/``_with_defaults``) is about as
long as that wrapping would be, so it stays, and ``omegaconf`` is not a dependency.
"""

from __future__ import annotations

import ast
import dataclasses
import difflib
import enum
import inspect
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from rlvr.config.sections import ALL_LINEAR
from rlvr.config.tree import Config
from rlvr.errors import UserError

PRESETS_DIR = Path(__file__).parents[1] / "configs"


def _fields(cls) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(cls)}


def _hints(cls) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def all_keys(cls=Config, prefix: str = "") -> list[str]:
    """Every dotted key of the tree, e.g. ``train.lr``."""
    keys = []
    for name, hint in _hints(cls).items():
        if dataclasses.is_dataclass(hint):
            keys += all_keys(hint, prefix + name + ".")
        else:
            keys.append(prefix + name)
    return keys


def _unknown_key(key: str) -> UserError:
    near = difflib.get_close_matches(key, all_keys(), n=1, cutoff=0.5)
    hint = f"; did you mean '{near[0]}'?" if near else "; `rlvr config` lists every key"
    return UserError(f"unknown config key '{key}'{hint}")


def _coerce(value: Any, hint: Any, key: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return _coerce(value, inner, key)
    if inspect.isclass(hint) and issubclass(hint, enum.Enum):
        try:
            return hint(str(value).lower())
        except ValueError:
            raise UserError(f"{key}={value}: must be one of {', '.join(m.value for m in hint)}") from None
    if hint is bool:
        if isinstance(value, bool):
            return value
        raise UserError(f"{key}={value!r}: expected true or false")
    if hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        if isinstance(value, float) and value.is_integer():
            return int(value)
        raise UserError(f"{key}={value!r}: expected an integer")
    if hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)  # YAML reads 1e-6 as a string
            except ValueError:
                pass
        raise UserError(f"{key}={value!r}: expected a number")
    if hint is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
        raise UserError(f"{key}={value!r}: expected a string")
    if origin is dict:
        if not isinstance(value, dict):
            raise UserError(f"{key}={value!r}: expected a mapping like {{name: weight}}")
        return {str(k): _coerce(v, args[1], f"{key}.{k}") for k, v in value.items()}
    if origin is list:
        if key == "model.lora.target_modules" and value == ALL_LINEAR:
            value = [ALL_LINEAR]  # peft's and TRL's spelling, a string there
        if not isinstance(value, (list, tuple)):
            raise UserError(f"{key}={value!r}: expected a list like [a, b]")
        return [_coerce(v, args[0], f"{key}[{i}]") for i, v in enumerate(value)]
    raise TypeError(f"unsupported config type {hint} for {key}")  # a bug in this file, not user input


def _build(cls, values: dict[str, Any], prefix: str = ""):
    hints = _hints(cls)
    kwargs = {}
    for name, value in values.items():
        key = prefix + name
        if name not in hints:
            while isinstance(value, dict) and value:  # report the full dotted key: trian.lr, not trian
                name, value = next(iter(value.items()))
                key += "." + str(name)
            raise _unknown_key(key)
        hint = hints[name]
        if dataclasses.is_dataclass(hint):
            if not isinstance(value, dict):
                raise UserError(f"{key} is a section; set its keys, e.g. {key}.{next(iter(_fields(hint)))}=...")
            kwargs[name] = _build(hint, value, key + ".")
        else:
            kwargs[name] = _coerce(value, hint, key)
    return cls(**kwargs)


def _set_dotted(tree: dict, key: str, value: Any) -> None:
    parts = key.split(".")
    node = tree
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise _unknown_key(key)
        node = child
    node[parts[-1]] = value


def parse_override(text: str) -> tuple[str, Any]:
    """``train.lr=1e-5`` -> ("train.lr", 1e-5). Values are read as YAML (numbers, lists, {a: 1})."""
    if "=" not in text:
        raise UserError(f"override '{text}' must look like key=value, e.g. train.lr=1e-5")
    key, raw = text.split("=", 1)
    key = key.strip().removeprefix("--")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    _bounded(value, f"override {key}")
    return key, value


MAX_CONFIG_VALUES = 100_000
"""Most values a config file or override may expand to (YAML aliases share, and then repeat, a value)."""


def _bounded(doc: Any, where: str) -> None:
    """Refuses a document that expands to more than :data:`MAX_CONFIG_VALUES` values: a YAML alias bomb
    ("billion laughs": 9 aliases of 9 aliases of ...) loads in microseconds as shared references, then
    takes minutes and gigabytes the first time anything walks or prints it. Counts with an early stop."""
    count, stack = 0, [doc]
    while stack:
        node = stack.pop()
        count += 1
        if count > MAX_CONFIG_VALUES:
            raise UserError(
                f"{where} expands to more than {MAX_CONFIG_VALUES:,} values (YAML anchors and aliases repeated "
                "inside each other?); write the values out, or use fewer aliases"
            )
        if isinstance(node, dict):
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)


def read_yaml(path: str | Path, *, _seen: tuple[Path, ...] = ()) -> dict:
    """A YAML config file (or built-in preset name) as a nested dict, its ``defaults:`` resolved.

    ``defaults: [quickstart]`` (or ``defaults: base.yaml``, paths relative to the file) loads
    those first and merges this file on top, so an algorithm preset layers on any model/data.
    """
    path = Path(path)
    if not path.is_file():
        named = PRESETS_DIR / f"{path.name}.yaml"
        if named.is_file():  # a preset name like `quickstart`
            path = named
        else:
            presets = ", ".join(sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")))
            raise UserError(f"config file {path} not found (built-in presets: {presets})")
    if path.resolve() in _seen:
        raise UserError(f"{path}: its defaults include it again (a loop)")
    _seen = _seen + (path.resolve(),)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except UnicodeDecodeError:
        raise UserError(f"{path} is not a UTF-8 text file; give a YAML config file") from None
    except yaml.YAMLError as e:
        raise UserError(f"{path} is not valid YAML: {str(e).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} must hold a mapping of config sections")
    _bounded(data, str(path))
    return _with_defaults(data, path, _seen)


def _merge(base: dict, top: dict) -> dict:
    """Deep merge: ``top``'s keys win; mappings merge key by key, lists and scalars are replaced."""
    out = dict(base)
    for k, v in top.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _with_defaults(data: dict, path: Path, seen: tuple[Path, ...]) -> dict:
    """Resolves a file's ``defaults:`` key: the named files/presets, in order, then this file on top."""
    names = data.pop("defaults", None)
    if names is None:
        return data
    if isinstance(names, str):
        names = [names]
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UserError(
            f"{path}: defaults must be a preset name or file, or a list of them (e.g. defaults: [quickstart])"
        )
    base: dict = {}
    for name in names:
        target = path.parent / name
        if not target.is_file():
            target = Path(name)  # a preset name, or a path relative to the working directory
        base = _merge(base, read_yaml(target, _seen=seen))
    return _merge(base, data)


def load_tree(path: str | Path | None = None, overrides: list[str] = ()) -> dict:
    """A YAML preset (default: the quickstart preset) with dotted overrides applied, as a nested dict
    not yet validated (what :func:`load_config` builds the Config from)."""
    tree = read_yaml(path if path is not None else PRESETS_DIR / "quickstart.yaml")
    for text in overrides:
        key, value = parse_override(text)
        _set_dotted(tree, key, value)
    return tree


def load_config(path: str | Path | None = None, overrides: list[str] = ()) -> Config:
    """Load a YAML preset (default: the quickstart preset), apply dotted overrides, validate."""
    return build_config(load_tree(path, overrides))


def build_config(tree: dict) -> Config:
    """The validated Config of a nested dict (:func:`load_tree`)."""
    return _build(Config, tree)


def to_dict(cfg: Any) -> Any:
    """Plain nested dict (enums as their values), for YAML and JSON."""
    if dataclasses.is_dataclass(cfg):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, enum.Enum):
        return cfg.value
    if isinstance(cfg, dict):
        return {k: to_dict(v) for k, v in cfg.items()}
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    return cfg


def to_yaml(cfg: Config) -> str:
    return yaml.safe_dump(to_dict(cfg), sort_keys=False, allow_unicode=True)


def field_docs(cls=Config, prefix: str = "") -> list[tuple[str, Any, str]]:
    """(dotted key, default, one-line doc) for every leaf field, read from the attribute docstrings."""
    tree = ast.parse(inspect.getsource(cls))
    docs: dict[str, str] = {}
    body = tree.body[0].body
    for node, nxt in zip(body, body[1:]):
        if isinstance(node, ast.AnnAssign) and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant):
            docs[node.target.id] = " ".join(str(nxt.value.value).split())
    rows = []
    default = cls()
    for name, hint in _hints(cls).items():
        if dataclasses.is_dataclass(hint):
            rows += field_docs(hint, prefix + name + ".")
        else:
            rows.append((prefix + name, to_dict(getattr(default, name)), docs.get(name, "")))
    return rows


def config_markdown() -> str:
    """The config reference as a Markdown table (docs/config.md is generated from this)."""
    lines = [
        "# Config reference",
        "",
        "Generated by `rlvr config --docs --markdown`; every key can be set in a YAML file or as `key.sub=value`.",
        "",
        "| key | default | meaning |",
        "| --- | --- | --- |",
    ]
    for key, default, doc in field_docs():
        shown = yaml.safe_dump(default, default_flow_style=True, width=1000).strip().removesuffix("...").strip()
        doc = doc.replace("|", "\\|")
        lines.append(f"| `{key}` | `{shown}` | {doc} |")
    return "\n".join(lines) + "\n"
