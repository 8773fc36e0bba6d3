"""Everything that can stop a run before a model loads, checked at once and in the order a user fixes
it, with nothing printed and nothing written: the error is the first line a user sees, and a refused
run (a resume included) leaves its run directory byte for byte as it was.

:func:`preflight` is called by :class:`rlvr.training.Trainer` before it loads weights, and by the Ray
driver before it starts Ray (without the device checks: each worker resolves its own device).
:func:`summary_lines` is the short picture of a run printed once the checks pass (the full config
goes to ``RUN/config.yaml``).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from rlvr import cpu, environments
from rlvr.config import Config
from rlvr.data.loading import load_split, pin_hub_data
from rlvr.errors import UserError
from rlvr.models import hub, lora, resolve_device, resolve_model_path
from rlvr.models.precision import bf16_micro_batch, needs_resolving, resolve_precision
from rlvr.rewards import Scorer
from rlvr.rewards import get as get_reward
from rlvr.run_dir import RunDir, step_of
from rlvr.tools import Toolbox
from rlvr.training import checkpoint as ckpt

LOADED_CORES = 0.5
"""A load average above this many runnable tasks per core, before training starts, means other work
shares the cores (a run alone on an idle machine reads close to 0)."""


@dataclass
class Checked:
    """What :func:`preflight` found: the config to train with and what the checks already loaded."""

    cfg: Config
    """The run's config, with ``auto`` precision resolved where a device was given, and a hub model's
    revision pinned to the commit it loads (``model.path=org/name@<commit>``, :func:`_model`); Hub data
    sets likewise (``data.path=openai/gsm8k:main@<commit>``, :func:`rlvr.data.loading.pin_hub_data`)."""
    run_dir: Path
    model_path: Path
    train_split: object
    """The training split (:func:`rlvr.data.loading.load_split`), not yet templated."""
    test_rows: list[dict]
    scorer: Scorer
    resume_from: Path | None = None
    """The checkpoint a resume continues from (None for a new run)."""
    start_step: int = 0
    """The step the run continues after (0 for a new run)."""
    device: torch.device | None = None
    precision: list[str] = field(default_factory=list)
    """How ``auto`` precision was resolved, and why (empty when nothing was ``auto`` or no device was given)."""
    notes: list[str] = field(default_factory=list)
    """Lines to print after the run's summary (no evaluation, a loaded machine)."""

    @property
    def nothing_to_do(self) -> bool:
        """A resumed run already holds ``train.steps`` steps."""
        return self.start_step >= self.cfg.train.steps

    def nothing_to_do_line(self) -> str:
        return (
            f"{self.run_dir} already finished {self.start_step} steps (train.steps={self.cfg.train.steps}); "
            "nothing to do, nothing changed; give a larger train.steps to train on"
        )


def preflight(cfg: Config, *, device: bool = True, shards: bool = False, writes: bool = True) -> Checked:
    """Checks a run's inputs; returns what it loaded. Writes and prints nothing.

    Args:
        cfg: the run's config.
        device: resolve ``model.device`` (and ``auto`` precision) here; False on a Ray driver.
        shards: this run trains FSDP shards (its checkpoints must be sharded ones to resume).
        writes: this process writes the run directory (checked: free, writable, room); False on the
            Ray ranks other than 0, which start while rank 0 is writing it.

    Raises:
        UserError: the first problem, in one line that says how to fix it: device, data files and
            rows, reward names, model path, the checkpoint to resume, the run directory.
    """
    precision: list[str] = []
    where = None
    if cfg.log.wandb and writes:  # before anything loads: MetricsLogger would say it after the models
        from rlvr.tracking.sinks import wandb_available

        if not wandb_available():
            raise UserError(
                "log.wandb=true but the wandb package is not installed; `pip install wandb` or set log.wandb=false"
            )
    if device:
        where = resolve_device(cfg.model.device)
        if needs_resolving(cfg):
            cfg, precision = resolve_precision(cfg, where)
        cfg, micro_batch = bf16_micro_batch(cfg)
        precision += [micro_batch] if micro_batch else []
    cfg, async_notes = async_settings(cfg)
    cfg = pin_hub_data(cfg, earlier=RunDir(Path(cfg.resume)).read_config() if cfg.resume else None)
    train_split, test_rows = load_split(cfg.data, "train"), load_split(cfg.data, "test").rows
    scorer = Scorer.from_config(cfg.reward)  # unknown rules fail now, not after the first rollout
    sandbox = _code_checks(cfg, train_split)
    get_reward(cfg.reward.accuracy_rule)
    box = Toolbox.from_config(cfg.rollout, cfg.reward.workers)  # unknown tools and broken plugins fail now too
    r = cfg.rollout
    environments.from_settings(r.environment, toolbox=box, max_turns=r.max_turns)  # and environment plugins
    model_path, cfg = _model(cfg)
    checked = Checked(cfg, Path(cfg.resume or cfg.run_dir), model_path, train_split, test_rows, scorer, device=where)
    if writes:
        RunDir(checked.run_dir).check_unlocked()
    if cfg.resume:
        checked.resume_from = _resume_checkpoint(cfg, shards)
        checked.start_step = step_of(checked.resume_from)
    if writes:
        _check_run_dir(cfg, checked.run_dir, model_path)
    mkl = cpu.mkl_avx512_note() if where is not None and where.type == "cpu" else None
    precision += [mkl] if mkl else []
    checked.precision, checked.notes = precision, sandbox + async_notes + _eval_note(cfg, test_rows) + _load_note()
    return checked


ASYNC_TIS_CAP = 2.0
"""The truncated importance weight's cap asynchronous rollouts take when ``algo.tis_cap`` is unset
(veRL's token-TIS default)."""


def async_settings(cfg: Config) -> tuple[Config, list[str]]:
    """``cfg`` with what ``rollout.max_staleness`` needs, and the lines that say so: with rollout workers
    and a staleness above 0 the update corrects for the older sampler, by the engine's log-probs and
    ``algo.tis_cap`` (:data:`ASYNC_TIS_CAP` when unset); without rollout workers the key is ignored."""
    s, workers = cfg.rollout.max_staleness, cfg.distributed.rollout_workers
    if not s:
        return cfg, []
    if not workers:
        return cfg, [
            f"rollout.max_staleness={s} is ignored: every step samples with the weights it updates where no rollout "
            "workers run (distributed.backend=ray distributed.rollout_workers=1 overlaps the rollout with the update)"
        ]
    if cfg.algo.tis_cap is not None:
        return cfg, []
    cfg = replace(cfg, algo=replace(cfg.algo, tis_cap=ASYNC_TIS_CAP))
    return cfg, [
        f"rollout.max_staleness={s}: algo.tis_cap={ASYNC_TIS_CAP:g} weighs each token by min(p_update_start / "
        "p_sampler, cap) to correct for the older weights that sampled it; set algo.tis_cap to change the cap"
    ]


def _code_checks(cfg: Config, train_split) -> list[str]:
    """The sandbox's summary line where model-written code runs (code rules, the python tool, code
    feedback), after checking it can run (or the one-line error naming the package); code feedback
    without a training row that has tests is an error."""
    sandbox: list[str] = []
    r = cfg.rollout
    feedback = r.environment == "code_feedback" or (not r.environment and not r.tools and r.max_turns > 1)
    if feedback and not any((row.get("fields") or {}).get("tests") for row in train_split.rows):
        raise UserError(
            f"rollout.max_turns={r.max_turns} runs code episodes with execution feedback, but no training row "
            "has tests (fields.tests); use a code data set (data.task=code, data.preset=humaneval|mbpp|apps|"
            "lcb|deepcoder|kodcode) or set rollout.max_turns=1"
        )
    if (
        feedback
        or {*cfg.reward.rules, cfg.reward.accuracy_rule} & {"code_tests", "code_tests_frac"}
        or "python" in (r.tools or [])
    ):  # model-written code runs: in the sandbox, or (reward.sandbox=none) said so
        from rlvr.rewards.code import SANDBOX_ENV
        from rlvr.sandbox import check_isolation

        sandbox.append(f"  sandbox    {check_isolation(cfg.reward.sandbox)}")  # or the error naming the package
        os.environ[SANDBOX_ENV] = cfg.reward.sandbox  # the code rules read it, here and in workers
    return sandbox


def _model(cfg: Config) -> tuple[Path, Config]:
    """(the model's local directory, ``cfg`` with a hub id's revision pinned to the commit that directory
    holds). config.yaml then records ``model.path=org/name@<commit>`` rather than a new key: the spec
    alone says what to load, so eval, export, a LoRA checkpoint's base and a resume read it as is, and
    a run repeated from its config.yaml loads the same files whatever ``main`` holds later. A resume
    that names the run's repo without a revision (``--config PRESET resume=RUN``) loads the commit the
    run recorded; an explicit ``@revision`` is taken as given."""
    spec = cfg.model.path
    named = hub.parse_hub_id(spec)
    if cfg.resume and named is not None and named.revision is None:
        saved = ((RunDir(Path(cfg.resume)).read_config() or {}).get("model") or {}).get("path")
        was = hub.parse_hub_id(saved) if isinstance(saved, str) else None
        if was is not None and was.repo_id == named.repo_id and was.revision:
            spec = saved
    path = resolve_model_path(spec)
    if hub.pinned(spec, path) != cfg.model.path:
        cfg = replace(cfg, model=replace(cfg.model, path=hub.pinned(spec, path)))
    return path, cfg


def _resume_checkpoint(cfg: Config, shards: bool) -> Path:
    """The checkpoint ``resume=`` continues from, when this run's settings can load it."""
    found = RunDir(Path(cfg.resume)).resume_checkpoint()
    if ckpt.is_sharded(found) != shards:
        saved, now = (
            ("fsdp or hsdp", "ddp") if ckpt.is_sharded(found) else ("ddp or one process", cfg.distributed.strategy)
        )
        raise UserError(
            f"resume={cfg.resume}: {found.name} was saved by a {saved} run, but this run's "
            f"distributed.strategy is {now}; resume with the run's own distributed settings"
        )
    rank = cfg.model.lora.rank
    if not shards and lora.is_adapter_dir(found) != bool(rank):
        kind = "a LoRA adapter" if rank == 0 else "full weights"
        raise UserError(
            f"resume={cfg.resume}: {found.name} holds {kind} but model.lora.rank={rank}; "
            "resume with the run's own model.lora settings"
        )
    return found


def _check_run_dir(cfg: Config, run_dir: Path, model_path: Path) -> None:
    """The run directory: a new run's must hold no other run (unless ``overwrite=true``); it must be
    writable, with room for two checkpoints."""
    if not cfg.resume and RunDir(run_dir).metrics_file.exists() and not cfg.overwrite:
        raise UserError(
            f"{run_dir} already holds a run; continue it with resume={run_dir}, start a new one with "
            f"run_dir=runs/NEW_NAME, or replace it with overwrite=true"
        )
    existing = next(p for p in (run_dir, *run_dir.parents) if p.exists() or p == Path(p.anchor))
    if not existing.is_dir():
        raise UserError(f"run_dir={run_dir} is not writable ({existing} is a file); pick another run_dir=")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"run_dir={run_dir} is not writable (permission denied on {existing}); pick another run_dir=")
    adapter = cfg.model.lora  # a LoRA checkpoint holds the adapter alone
    need = 2 * ckpt.checkpoint_bytes(
        model_path, cfg.model.dtype, lora_rank=adapter.rank, lora_targets=adapter.target_modules
    )
    free = shutil.disk_usage(existing).free
    if free < need:
        raise UserError(
            f"run_dir={run_dir} has {free / 2**30:.1f} GiB free but two checkpoints of this model need about "
            f"{need / 2**30:.1f} GiB; free space there or pick another run_dir="
        )


def _eval_note(cfg: Config, test_rows: list[dict]) -> list[str]:
    """One line when the run would evaluate but has nothing to evaluate on."""
    wanted = cfg.eval.at_start or cfg.eval.at_end or cfg.eval.every_steps > 0
    if not wanted or cfg.eval.data or test_rows:
        return []
    return [
        f"note: no evaluation in this run: data.path={cfg.data.path} has no test split; give one with "
        "data.test_path=FILE, or evaluate on eval.data=arithmetic (a built-in task), eval.data=FILE or a Hub data set "
        "(eval.data=HuggingFaceH4/MATH-500)"
    ]


def _load_note() -> list[str]:
    """A warning when the load average shows other work on this machine's cores."""
    try:
        load = os.getloadavg()[0]
    except (AttributeError, OSError):  # not on every platform
        return []
    cores = os.cpu_count() or 1
    if load <= LOADED_CORES * cores:
        return []
    return [
        f"warning: the load average is {load:.1f} on {cores} cores: other work is using them, so steps will "
        "be slower than quoted; stop it, or give rlvr the free cores with OMP_NUM_THREADS=N"
    ]


def summary_lines(checked: Checked) -> list[str]:
    """The run in a few lines: what it trains, on what, how, for how long, and where it writes."""
    cfg = checked.cfg
    run = RunDir(checked.run_dir)
    if checked.resume_from is not None:
        head = (
            f"resuming {checked.run_dir} from {checked.resume_from.name}: steps {checked.start_step + 1}"
            f"..{cfg.train.steps}; this segment's config goes to {run.resume_config_file(checked.start_step)}"
        )
    else:
        head = f"new run {checked.run_dir}: the full config goes to {run.config_file}"
    d, a, t = cfg.data, cfg.algo, cfg.train
    if d.task == "files":
        data = d.path + (f" (test: {d.test_path})" if d.test_path else "")
    else:
        data = f"{d.task} (difficulty {d.difficulty})"
    precision = checked.precision or [
        f"model {cfg.model.dtype}, rollout {cfg.rollout.dtype}, training autocast bf16 {cfg.model.autocast_bf16}"
    ]
    tests = len(checked.test_rows)
    ev = cfg.eval
    if not (ev.at_start or ev.at_end or ev.every_steps):
        evaluated = "no evaluation (eval.at_start, eval.at_end and eval.every_steps are off)"
    else:
        evaluated = f"evaluated on {min(ev.limit or tests, tests)} of {tests} test problems" if tests else "no test set"
    kl = f"kl {a.kl_coef:g} ({a.kl_estimator})" if a.kl_coef else "no kl"
    lora_note = f", LoRA rank {cfg.model.lora.rank}" if cfg.model.lora.rank else ""
    return [
        head,
        f"  model      {cfg.model.path} on {checked.device or cfg.model.device}{lora_note}",
        f"  data       {data}, template {d.template}; {evaluated}",
        f"  algorithm  {a.adv_method} advantages, {a.loss_agg} loss, {kl}, lr {t.lr:g}; "
        f"{t.prompts_per_step} prompts x {cfg.rollout.samples_per_prompt} samples per step",
        f"  steps      {t.steps}" + (f", a checkpoint every {t.save_every}" if t.save_every else ""),
        *(f"  precision  {line}" for line in precision),
    ]
