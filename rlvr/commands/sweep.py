"""``rlvr sweep``: run the cartesian product of config values, one run after another; then compare them.

Each combination gets its own run directory under the sweep directory, named by its overrides
(``samples_per_prompt=4,seed=1``). A run whose final checkpoint exists is skipped; a run that
stopped after a checkpoint is resumed from it; one that stopped before its first checkpoint is
started again. So re-running the same command finishes an interrupted sweep. Every combination's
config is built and validated before the first run starts.
"""

from __future__ import annotations

import argparse
import itertools
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import yaml

from rlvr.errors import UserError
from rlvr.run_dir import RunDir, is_checkpoint

ABLATIONS_DIR = Path(__file__).resolve().parent.parent / "configs" / "ablations"
SPEC_KEYS = {"config", "grid", "repeat", "sweep_dir", "overrides"}


def split_values(raw: str) -> list[str]:
    """``"4,8"`` -> ["4", "8"]; commas inside brackets or braces stay: ``"[1,0],[1,1]"`` -> ["[1,0]", "[1,1]"]."""
    out, depth, cur = [], 0, []
    for ch in raw:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return out


def parse_grid(text: str) -> tuple[str, list]:
    """``--grid rollout.samples_per_prompt=4,8`` -> ("rollout.samples_per_prompt", [4, 8])."""
    if "=" not in text:
        raise UserError(f"--grid {text}: must look like key=v1,v2 (e.g. --grid rollout.samples_per_prompt=4,8)")
    key, raw = text.split("=", 1)
    key = key.strip().removeprefix("--")
    values = split_values(raw)
    if not key or not raw.strip() or any(v == "" for v in values):
        raise UserError(f"--grid {text}: give a key and comma-separated values, e.g. --grid train.lr=1e-5,2e-5")
    parsed = []
    for v in values:
        try:
            parsed.append(yaml.safe_load(v))
        except yaml.YAMLError:
            parsed.append(v)
    return key, parsed


def _slug(value) -> str:
    if isinstance(value, (list, tuple)):
        return "_".join(_slug(v) for v in value)
    if isinstance(value, dict):
        return "_".join(f"{k}-{_slug(v)}" for k, v in value.items())
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return re.sub(r"[^A-Za-z0-9.+-]+", "-", text).strip("-") or "empty"


def _override_text(key: str, value) -> str:
    return f"{key}={yaml.safe_dump(value, default_flow_style=True).strip().removesuffix('...').strip()}"


@dataclass
class PlannedRun:
    name: str
    run_dir: Path
    overrides: list[str]  # every override for this run, run_dir= last


@dataclass
class Sweep:
    base: str | None  # --config: preset name or YAML file (None = quickstart)
    grid: list[tuple[str, list]]
    repeat: int = 1
    sweep_dir: Path = Path("runs/sweep")
    overrides: list[str] = field(default_factory=list)  # applied to every run

    def plan(self) -> list[PlannedRun]:
        """Every combination (times ``repeat`` seeds), validated, each with its run directory."""
        from rlvr.config import load_config

        if not self.grid:
            raise UserError("nothing to sweep: give at least one --grid key=v1,v2 (or a spec file with grid:)")
        if self.repeat < 1:
            raise UserError(f"--repeat {self.repeat}: must be >= 1")
        keys = [k for k, _ in self.grid]
        dupes = sorted({k for k in keys if keys.count(k) > 1})
        if dupes:
            raise UserError(f"--grid {dupes[0]} is given twice; list all its values in one --grid")
        if self.repeat > 1 and "seed" in keys:
            raise UserError("--repeat and --grid seed=... both set the seed; use one of them")
        for text in self.overrides:
            if text.split("=", 1)[0].strip() in ("run_dir", "resume"):
                raise UserError(f"override {text}: the sweep sets run_dir and resume itself; use --sweep-dir")
        short = [k.rsplit(".", 1)[-1] for k in keys]
        names_for = [s if short.count(s) == 1 else k for s, k in zip(short, keys)]
        base_seed = load_config(self.base, self.overrides).seed
        runs = []
        for combo in itertools.product(*(values for _, values in self.grid)):
            assign = [_override_text(k, v) for k, v in zip(keys, combo)]
            name = ",".join(f"{n}={_slug(v)}" for n, v in zip(names_for, combo))
            for i in range(self.repeat):
                extra, run_name = [], name
                if self.repeat > 1:
                    extra = [f"seed={base_seed + i}"]
                    run_name = f"{name},seed={base_seed + i}"
                run_dir = self.sweep_dir / run_name
                overrides = [*self.overrides, *assign, *extra, f"run_dir={run_dir}"]
                try:
                    load_config(self.base, overrides)
                except UserError as e:
                    raise UserError(f"sweep run {run_name}: {e}") from None
                runs.append(PlannedRun(run_name, run_dir, overrides))
        names = [r.name for r in runs]
        if len(set(names)) != len(names):
            raise UserError("two grid values give the same run name; make the values distinct")
        return runs


def load_spec(path: str | Path) -> dict:
    """A sweep spec YAML: ``config``, ``grid`` (key -> list of values), ``repeat``, ``sweep_dir``, ``overrides``.

    A bare name (``format_weight``) is looked up in the built-in ``configs/ablations/``.
    """
    p = Path(path)
    if not p.is_file() and (ABLATIONS_DIR / f"{p.name}.yaml").is_file():
        p = ABLATIONS_DIR / f"{p.name}.yaml"
    if not p.is_file():
        known = ", ".join(sorted(q.stem for q in ABLATIONS_DIR.glob("*.yaml")))
        raise UserError(f"sweep spec {path} not found (built-in: {known})")
    try:
        spec = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        raise UserError(f"{p} is not a valid YAML file: {str(e).splitlines()[0]}") from None
    if not isinstance(spec, dict):
        raise UserError(f"{p} must be a mapping with grid: (and optionally config:, repeat:, sweep_dir:, overrides:)")
    unknown = sorted(set(spec) - SPEC_KEYS)
    if unknown:
        raise UserError(f"{p}: unknown key '{unknown[0]}' (a sweep spec has {', '.join(sorted(SPEC_KEYS))})")
    grid = spec.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise UserError(f"{p}: grid must map each config key to a non-empty list of values")
    overrides = spec.get("overrides") or []
    if isinstance(overrides, dict):
        overrides = [_override_text(k, v) for k, v in overrides.items()]
    if not isinstance(overrides, list):
        raise UserError(f"{p}: overrides must be a list of key=value strings or a mapping")
    base = spec.get("config")
    if isinstance(base, str) and not Path(base).is_file() and (p.parent / base).is_file():
        base = str(p.parent / base)  # a base config next to the spec file
    return {
        "base": base,
        "grid": [(str(k), list(v)) for k, v in grid.items()],
        "repeat": spec.get("repeat", 1),
        "sweep_dir": spec.get("sweep_dir"),
        "overrides": [str(o) for o in overrides],
        "path": p,
    }


# ---------------------------------------------------------------------------------------------
# running


def run_state(run: PlannedRun, total_steps: int) -> str:
    """'done' (final checkpoint saved), 'resume' (stopped after a checkpoint), 'restart' (stopped
    before one), or 'new'."""
    files = RunDir(run.run_dir)
    if is_checkpoint(files.checkpoint_dir(total_steps)):
        return "done"
    if files.checkpoints():
        return "resume"
    if files.is_run():
        return "restart"
    return "new"


def check_same_config(run: PlannedRun, expected: dict) -> None:
    """A run directory left by an earlier sweep must hold the same config, or resuming it would mix two runs."""
    from rlvr.analysis.run import flatten
    from rlvr.config import Config, to_dict

    saved = RunDir(run.run_dir).read_config()
    if saved is None:  # none, or not readable: nothing to compare
        return
    # a key the saved config lacks was added to rlvr after that run, which ran as its default does
    a, b = {**flatten(to_dict(Config())), **flatten(saved)}, flatten(expected)
    for key in sorted(set(a) | set(b)):
        if key in ("run_dir", "resume"):
            continue
        if _unpinned(a.get(key), b.get(key)) != b.get(key):
            raise UserError(
                f"{run.run_dir} holds a run with {key}={a.get(key)!r}, but this sweep asks for {b.get(key)!r}; "
                "use another --sweep-dir or delete that run directory"
            )


def _unpinned(saved, asked):
    """``saved`` without the commits a run pinned its Hub names to (``org/name@<commit>``), when the sweep
    names them without one: the run read what the sweep asks for."""
    if not isinstance(saved, str) or not isinstance(asked, str) or "@" in asked:
        return saved
    return re.sub(r"@[\w./-]+(?=,|$)", "", saved)


def subprocess_runner(base: str | None, overrides: list[str]) -> int:
    """Runs ``rlvr train`` in a fresh process (its own peak memory, its own crash); returns the exit status."""
    cmd = [sys.executable, "-m", "rlvr.cli", "train", *(["--config", base] if base else []), *overrides]
    return subprocess.call(cmd)


def run_sweep(
    sweep: Sweep,
    *,
    runner: Callable[[str | None, list[str]], int] = subprocess_runner,
    note: Callable[[str], None] = print,
) -> tuple[list[PlannedRun], list[str]]:
    """Run every planned run that is not done; returns (planned runs, names of failed runs)."""
    from rlvr.config import load_config, to_yaml

    runs = sweep.plan()
    states = []
    for r in runs:
        cfg = load_config(sweep.base, r.overrides)
        check_same_config(r, yaml.safe_load(to_yaml(cfg)))
        states.append(run_state(r, cfg.train.steps))
    todo = sum(s != "done" for s in states)
    note(f"sweep: {len(runs)} runs in {sweep.sweep_dir}, {len(runs) - todo} already done, {todo} to run")
    failed = []
    for i, (r, state) in enumerate(zip(runs, states), start=1):
        if state == "done":
            note(f"[{i}/{len(runs)}] {r.name}: done, skipped")
            continue
        overrides = list(r.overrides)
        if state == "resume":
            overrides.append(f"resume={r.run_dir}")
            note(f"[{i}/{len(runs)}] {r.name}: resuming from its last checkpoint")
        else:
            if state == "restart":  # stopped before its first checkpoint: nothing to resume from
                RunDir(r.run_dir).remove_outputs(keep=("checkpoints",))
                note(f"[{i}/{len(runs)}] {r.name}: stopped before its first checkpoint; starting it again")
            else:
                note(f"[{i}/{len(runs)}] {r.name}: starting")
        rc = runner(sweep.base, overrides)
        if rc == 130:
            raise KeyboardInterrupt
        if rc != 0:
            failed.append(r.name)
            note(f"[{i}/{len(runs)}] {r.name}: failed (exit status {rc}); going on with the next run")
    return runs, failed


EXAMPLES = """examples:
  rlvr sweep --grid rollout.samples_per_prompt=4,8 --sweep-dir runs/g_ablation train.steps=20
  rlvr sweep --config configs/quickstart.yaml --grid train.lr=5e-6,1e-5 --repeat 2
  rlvr sweep --spec format_weight              # configs/ablations/format_weight.yaml
  rlvr sweep --spec group_size --dry-run       # list the runs and whether each is done
Run the same command again to finish an interrupted sweep: finished runs are skipped and a
stopped run resumes from its last checkpoint.
"""


def cmd_sweep(args) -> int:
    from rlvr.analysis.compare import compare_runs
    from rlvr.commands.common import quiet_libraries

    spec = load_spec(args.spec) if args.spec else {}
    grid = list(spec.get("grid", []))
    for text in args.grid or []:
        key, values = parse_grid(text)
        grid = [(k, v) for k, v in grid if k != key] + [(key, values)]  # the command line wins
    sweep_dir = args.sweep_dir or spec.get("sweep_dir") or "runs/sweep"
    sweep = Sweep(
        base=args.config or spec.get("base"),
        grid=grid,
        repeat=args.repeat if args.repeat is not None else int(spec.get("repeat", 1)),
        sweep_dir=Path(sweep_dir),
        overrides=[*spec.get("overrides", []), *args.overrides],
    )
    if args.dry_run:
        from rlvr.config import load_config

        for r in sweep.plan():
            state = run_state(r, load_config(sweep.base, r.overrides).train.steps)
            print(f"{state:8s} {r.run_dir}   {' '.join(o for o in r.overrides if not o.startswith('run_dir='))}")
        return 0
    quiet_libraries()
    runs, failed = run_sweep(sweep)
    have = [r.run_dir for r in runs if RunDir(r.run_dir).metrics_file.is_file()]
    if have:
        title = f"Sweep {sweep.sweep_dir.name}: " + ", ".join(k for k, _ in sweep.grid)
        out = compare_runs(have, sweep.sweep_dir / "compare", title=title)
        print(f"comparison: {out / 'compare.html'}")
    if failed:
        print(f"{len(failed)} run(s) failed: {', '.join(failed)}; run the same command again to retry them")
        return 1
    return 0


def register(sub) -> None:
    from rlvr.commands.common import add_config_args

    p = sub.add_parser(
        "sweep",
        help="run a grid of configs one after another (resumable), then compare them",
        epilog=EXAMPLES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(p)
    p.add_argument(
        "--grid",
        "-g",
        action="append",
        metavar="KEY=V1,V2",
        help="a config key and its values (repeat for a cartesian product); lists: key=[1,0],[1,1]",
    )
    p.add_argument("--repeat", type=int, default=None, help="seeds per combination: seed, seed+1, … (default 1)")
    p.add_argument("--sweep-dir", default=None, help="parent of the run directories (default runs/sweep)")
    p.add_argument(
        "--spec",
        default=None,
        help="sweep spec YAML (config, grid, repeat, sweep_dir, overrides), or a name in configs/ablations/",
    )
    p.add_argument("--dry-run", action="store_true", help="list the runs and their state; train nothing")
    p.set_defaults(func=cmd_sweep)
