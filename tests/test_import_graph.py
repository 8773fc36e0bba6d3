"""The import graph runs one way: what each package of rlvr may import, checked statically (every
``import`` in every module, function-local ones included) and by importing in a fresh interpreter."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# Packages that run or present training. Nothing in LAYERS imports them; they import anything.
# A new top-level package of that kind goes here.
UPPER = ["training", "evaluation", "tracking", "analysis", "distributed", "commands", "cli", "api"]
# The entry point (argv -> a command module): no module imports it.
ENTRY = "cli"
# What `rlvr/__init__.py` may import, inside its module __getattr__ alone (on first use of rlvr.train,
# rlvr.UserError, ...), so that `import rlvr.algos` still loads nothing else of rlvr.
ROOT_LAZY = {"api", "errors"}

# The lower packages (a top-level module counts as a package). A module may import its own
# package and any package of a lower level; `rlvr` imports: None = that rule alone, else only
# these; `third_party`: None = any, else only these (the standard library is always allowed).
#   package          level  rlvr                          third_party
LAYERS: dict[str, tuple[int, set[str] | None, set[str] | None]] = {
    "__init__": (0, set(), set()),  # rlvr/__init__.py
    "errors": (0, set(), set()),
    "choices": (0, set(), set()),  # the modes and names config validates
    "plugins": (1, {"errors"}, set()),  # functions by name: built-ins, modules, files (reward rules, tools)
    "config": (1, {"errors", "choices"}, {"yaml"}),
    "algos": (1, {"choices"}, {"torch"}),
    "sandbox": (1, {"errors"}, set()),  # bubblewrap + rlimits + the harness: running model-written code
    "rewards": (2, {"errors", "choices", "plugins", "sandbox"}, {"math_verify"}),
    "jsonl": (1, {"errors"}, set()),  # the one JSONL reader/writer
    "hub": (1, {"errors"}, {"huggingface_hub"}),  # Hub names: cache, offline, one-line errors (models, data)
    "metric_names": (1, set(), set()),  # every metric key, named once
    "models": (2, None, None),  # -> config, errors
    "tools": (
        3,
        {"errors", "choices", "rewards", "plugins", "sandbox"},
        set(),
    ),  # tool plugins, run in the rewards' worker pool
    "environments": (
        4,
        {"errors", "plugins", "tools", "rewards", "sandbox"},
        set(),
    ),  # reset(row) / step(turn): the tool loop, code feedback, plugins; driven by the rollout
    "run_dir": (2, {"errors", "jsonl"}, {"yaml"}),  # a run's files; no torch
    "data": (3, None, None),  # -> models (tokenizer), rewards (countdown rules)
    "cpu": (3, {"models"}, None),  # CPU acceleration; others import only rlvr.cpu's names
    "rollout": (5, None, None),  # -> models, cpu, environments
    "estimate": (4, None, None),  # memory estimate -> config, models, cpu
}


def _package(module: str) -> str:
    """``rlvr.data.files`` -> ``data``; ``rlvr`` -> ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(path: Path, root: Path = REPO) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file under ``root``, at any depth."""
    module = ".".join(path.relative_to(root).with_suffix("").parts)
    if path.name == "__init__.py":
        module = module.rsplit(".", 1)[0] + "._"  # relative imports resolve against the package
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name == "rlvr":  # from rlvr import config -> rlvr.config
                found += [(node.lineno, f"rlvr.{alias.name}") for alias in node.names]
            else:
                found.append((node.lineno, name))
    return [(line, name) for line, name in found if name != "__future__"]


def _violations(root: Path = REPO) -> list[str]:
    out = []
    for path in sorted((root / "rlvr").rglob("*.py")):
        rel = path.relative_to(root)
        own = _package(".".join(rel.with_suffix("").parts).removesuffix(".__init__"))
        if own in UPPER:
            out += [
                f"{rel}:{line}: imports {name}, but nothing imports the entry point rlvr.{ENTRY}"
                for line, name in _imports(path, root)
                if name.startswith("rlvr.") and _package(name) == ENTRY and own != ENTRY
            ]
            continue
        if own not in LAYERS:
            out.append(f"{rel}: package '{own}' is in neither LAYERS nor UPPER of {Path(__file__).name}; add it to one")
            continue
        level, rlvr_ok, third_ok = LAYERS[own]
        module_level = {n.lineno for n in ast.parse(path.read_text(encoding="utf-8")).body}
        for line, name in _imports(path, root):
            where = f"{rel}:{line}: imports {name}"
            top = name.split(".")[0]
            if top == "rlvr":
                target = _package(name)
                if target == own or (own == "__init__" and target in ROOT_LAZY and line not in module_level):
                    continue
                if target in UPPER:
                    out.append(f"{where}, but '{own}' must not import the upper package '{target}'")
                elif target not in LAYERS:
                    out.append(f"{where}: '{target}' is in neither LAYERS nor UPPER; add it to one")
                elif rlvr_ok is not None and target not in rlvr_ok:
                    allowed = ", ".join(sorted(rlvr_ok)) or "nothing"
                    out.append(f"{where}, but '{own}' may import only {allowed} of rlvr")
                elif LAYERS[target][0] >= level:
                    out.append(
                        f"{where}, but '{target}' (level {LAYERS[target][0]}) is not below '{own}' (level {level})"
                    )
            elif third_ok is not None and top not in sys.stdlib_module_names and top not in third_ok:
                allowed = ", ".join(sorted(third_ok)) or "the standard library"
                out.append(f"{where}, but '{own}' may import only {allowed}")
    return out


def test_lower_packages_import_only_downward():
    problems = _violations()
    assert not problems, "import graph broken:\n  " + "\n  ".join(problems)


def test_the_checker_sees_function_local_and_relative_imports(tmp_path):
    source = tmp_path / "rlvr" / "algos" / "x.py"
    source.parent.mkdir(parents=True)
    source.write_text(
        "from . import losses\nfrom .. import training\n\n"
        "def f():\n    from rlvr.data import files\n    import transformers\n"
    )
    assert _imports(source, tmp_path) == [
        (1, "rlvr.algos"),
        (2, "rlvr.training"),
        (5, "rlvr.data"),
        (6, "transformers"),
    ]
    assert _violations(tmp_path) == [
        "rlvr/algos/x.py:2: imports rlvr.training, but 'algos' must not import the upper package 'training'",
        "rlvr/algos/x.py:5: imports rlvr.data, but 'algos' may import only choices of rlvr",
        "rlvr/algos/x.py:6: imports transformers, but 'algos' may import only torch",
    ]


def _loaded_after(statement: str) -> set[str]:
    """The modules in ``sys.modules`` after running ``statement`` in a fresh interpreter."""
    code = f"import json, sys\n{statement}\nprint(json.dumps(sorted(sys.modules)))"
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, timeout=120, cwd=REPO, capture_output=True, text=True
    )
    return set(json.loads(out.stdout.splitlines()[-1]))


HEAVY = [
    "torch",
    "math_verify",
    "sympy",
    "transformers",
    "datasets",
    "multiprocessing.pool",
    "rlvr.rewards.pool",
    "rlvr.rewards.registry",
]


def test_loading_a_config_loads_nothing_heavy():
    loaded = _loaded_after("from rlvr.config import load_config\nload_config('quickstart')")
    assert not loaded & set(HEAVY), f"loading a config imported {sorted(loaded & set(HEAVY))}"
    rlvr_modules = sorted(m for m in loaded if m.startswith("rlvr") and not m.startswith("rlvr.config."))
    assert rlvr_modules == ["rlvr", "rlvr.choices", "rlvr.config", "rlvr.errors"], rlvr_modules  # + config's own


def test_rewards_load_no_torch():
    loaded = _loaded_after("import rlvr.rewards")
    assert "torch" not in loaded and "transformers" not in loaded


def test_algos_load_only_torch():
    loaded = _loaded_after("import rlvr.algos")
    outside = sorted(
        m for m in loaded if m.startswith("rlvr.") and not m.startswith("rlvr.algos") and m != "rlvr.choices"
    )
    assert not outside, f"rlvr.algos imported {outside}"
    assert "transformers" not in loaded and "math_verify" not in loaded


def test_outside_rlvr_cpu_only_its_public_names_are_imported():
    """The CPU acceleration is one fenced package: the rest of rlvr imports ``from rlvr.cpu import <name>``
    for a name in ``rlvr.cpu.__all__``, never one of its modules."""
    import rlvr.cpu

    problems = []
    for path in sorted((REPO / "rlvr").rglob("*.py")):
        rel = path.relative_to(REPO)
        if rel.parts[1] == "cpu":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "rlvr.cpu":
                problems += [
                    f"{rel}:{node.lineno}: from rlvr.cpu import {a.name}"
                    for a in node.names
                    if a.name not in rlvr.cpu.__all__
                ]
            elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rlvr.cpu."):
                problems.append(f"{rel}:{node.lineno}: from {node.module} import ...")
            elif isinstance(node, ast.Import):
                problems += [
                    f"{rel}:{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("rlvr.cpu.")
                ]
    assert not problems, "rlvr.cpu's insides imported from outside:\n  " + "\n  ".join(problems)


def _module_graph(root: Path = REPO) -> dict[str, set[str]]:
    """Module -> the rlvr modules it imports (any depth, function-local ones included), by file:
    ``from rlvr.a import y`` is an edge to ``rlvr.a.y`` where that is a module, else to ``rlvr.a``."""
    files = {
        ".".join(p.relative_to(root).with_suffix("").parts).removesuffix(".__init__"): p
        for p in (root / "rlvr").rglob("*.py")
    }
    graph: dict[str, set[str]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        names = []
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1]) if node.level else ""
                target = ".".join(x for x in (base, node.module or "") if x)
                names += [f"{target}.{a.name}" if f"{target}.{a.name}" in files else target for a in node.names]
        targets = set()
        for name in names:
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module and not module.startswith(name + "."):  # a package's own __init__ is not a cycle
                targets.add(name)
        graph[module] = targets
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles between modules (strongly connected components of two or more), by Tarjan's algorithm."""
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle_between_files():
    """Not even through a function-local import: training never reaches distributed, nor any module itself."""
    cycles = _cycles(_module_graph())
    assert not cycles, "import cycles:\n  " + "\n  ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_finder_finds_one(tmp_path):
    (tmp_path / "rlvr" / "a").mkdir(parents=True)
    (tmp_path / "rlvr" / "a" / "x.py").write_text("def f():\n    from rlvr.a import y\n")
    (tmp_path / "rlvr" / "a" / "y.py").write_text("from rlvr.a.x import f\n")
    (tmp_path / "rlvr" / "a" / "z.py").write_text("from rlvr.a import x\n")
    assert _cycles(_module_graph(tmp_path)) == [["rlvr.a.x", "rlvr.a.y"]]
