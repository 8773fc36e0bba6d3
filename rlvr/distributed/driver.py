"""The driver side of a Ray run: :class:`RayTrainer` has the Trainer's methods and runs them on workers.

:func:`rlvr.training.trainer.train` runs the same loop (signals, evaluation, checkpoints) over a
:class:`RayTrainer` as over a :class:`~rlvr.training.trainer.Trainer`: :meth:`RayTrainer.step`
runs every worker's shard of the step, and the logging process's methods run on rank 0.
"""

from __future__ import annotations

import math
import os
import re
import time
from pathlib import Path

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from rlvr import metric_names as M
from rlvr.choices import Strategy
from rlvr.config import Config
from rlvr.distributed.pipeline import RolloutPipeline
from rlvr.distributed.placement import absolute_paths, placement
from rlvr.distributed.rollout_worker import RolloutWorker
from rlvr.distributed.versions import require_fsdp
from rlvr.distributed.worker import Worker
from rlvr.errors import UserError
from rlvr.run_dir import RunDir
from rlvr.tracking.console import StepPrinter, make_console
from rlvr.training.preflight import preflight

PLACEMENT_TIMEOUT_S = 120
"""How long the workers' placement group may wait for room in the cluster before the run stops."""


class RayTrainer:
    """``distributed.num_workers`` Ray actors (:class:`rlvr.distributed.worker.Worker`) in one
    placement group (HSDP: one per node), each a Trainer of its rank, driven step by step from this process.

    Args:
        cfg: the run's config (``distributed.backend=ray``).
        console: where rank 0's lines and the driver's notes go (a rich Console; default stderr).
    """

    def __init__(self, cfg: Config, console=None) -> None:
        self.cfg = absolute_paths(cfg, Path.cwd())  # a worker on another node starts in another directory
        self.console = console or make_console(stderr=True)
        self.printer = StepPrinter(cfg.train.steps, enabled=False, console=self.console)
        self.workers: list = []
        self.rollout_actors: list = []
        """distributed.rollout_workers: the actors that make the rollouts (:mod:`rlvr.distributed.rollout_worker`)."""
        self.pipeline: RolloutPipeline | None = None
        self.pgs: list = []
        self.started_ray = False
        self.busy = False  # a call to the workers is under way (a second signal leaves them to ray.kill)

    # -- the Trainer's methods, on the workers ---------------------------------------------

    def setup(self) -> bool:
        """Starts (or joins) Ray, places the workers, joins them in a process group and sets up
        each Trainer, rank 0 first, after checking that every rank sees rank 0's run directory (under
        FSDP all at once: the Trainers shard together, and the check runs inside their setup);
        False (workers released) when the run has nothing left to do."""
        fsdp = self.cfg.distributed.strategy.shards
        # the checks that need no device, before Ray starts: a bad input is the first line a user sees
        if fsdp:
            require_fsdp()  # this torch has FSDP2 as rlvr calls it (each worker checks its own too)
        checked = preflight(self.cfg, device=False, shards=fsdp)
        self.cfg = checked.cfg  # a hub model pinned to the commit resolved here: every worker loads that one
        if checked.nothing_to_do:
            self.printer.note(checked.nothing_to_do_line())
            return False
        try:
            self._start()  # at once under FSDP: the Trainers shard together
            ok, run_dir, self.start_step = self._all("setup", self.workers if fsdp else self.workers[:1])[0]
            self.run_dir, self.run = Path(run_dir), RunDir(Path(run_dir))
            if not fsdp and len(self.workers) > 1:  # the other ranks, once they see rank 0's run directory
                name = self._all("mark_shared", self.workers[:1], printed=False)[0]
                try:
                    self._all("check_shared", self.workers[1:], run_dir, name, printed=False)
                finally:
                    self._all("unmark", self.workers[:1], name, printed=False)
                self._all("setup", self.workers[1:])
            if ok and self.rollout_actors:
                self._start_pipeline()
        except BaseException:
            self.close()
            raise
        if not ok:
            self.close()
        return ok

    def _start_pipeline(self) -> None:
        """Sets up the rollout workers (each loads the weights the trainers start from) and launches the
        first rollouts; a resume trains first on the rollouts its checkpoint held."""
        d, r = self.cfg.distributed, self.cfg.rollout
        try:
            ray.get([a.setup.remote() for a in self.rollout_actors], timeout=d.step_timeout_s or None)
        except (GetTimeoutError, RayActorError, RayTaskError) as e:
            raise self._rollout_lost(e, "setup") from None
        restored = self._all("resumed_inflight", self.workers[:1], printed=False)[0]
        self.pipeline = RolloutPipeline(
            self.rollout_actors, staleness=r.max_staleness, steps=self.cfg.train.steps, start=self.start_step,
            restored=restored,
        )  # fmt: skip
        kept = f"; {len(restored)} made before the checkpoint restored" if restored else ""
        plural = "s" if d.rollout_workers > 1 else ""
        self.printer.note(
            f"{d.rollout_workers} Ray rollout worker{plural} apart from the trainers, "
            f"rollout.max_staleness={r.max_staleness}"
            + (" (one-step-off)" if r.max_staleness == 1 else " (synchronous)" if r.max_staleness == 0 else "")
            + kept
        )

    def _rollout_lost(self, error, what: str) -> UserError:
        """The one line for a rollout worker that raised, died or hung during ``what``."""
        if isinstance(error, RayTaskError) and isinstance(error.cause, UserError):
            return UserError(str(error.cause))
        if isinstance(error, GetTimeoutError):
            how = f"did not answer within distributed.step_timeout_s={self.cfg.distributed.step_timeout_s:g} s (hung?)"
        elif isinstance(error, RayActorError):
            how = f"died ({type(error).__name__})"
        else:
            cause = str(getattr(error, "cause", error)).strip().splitlines()
            how = f"failed ({cause[-1] if cause else type(error).__name__})"
        return UserError(f"a Ray rollout worker {how} during {what}; {self._saved()}")

    def evaluate_start(self) -> None:
        self._all("evaluate_start", self.workers)  # each evaluates a share of the rows (rank 0 writes)

    def step(self, step: int) -> dict:
        """Every worker's shard of ``step``; returns the step's metrics (rank 0's, of the global batch).
        With rollout workers the trainers train on the step's rollout, then rank 0 pushes the new
        weights and the rollout they serve is launched (:class:`RolloutPipeline`)."""
        if self.pipeline is None:
            return self._all("step", self.workers, step)[0]
        t0 = time.perf_counter()
        try:
            _, handed, pipe = self.pipeline.take(step, self.cfg.distributed.step_timeout_s or None)
        except (GetTimeoutError, RayActorError, RayTaskError) as e:
            raise self._rollout_lost(e, f"the rollout of step {step + 1}") from None
        metrics = self._all("step_rollout", self.workers, step, handed)[0]
        pushed = self.workers[0].push_weights.remote() if self.pipeline.wants_push() else None
        self.pipeline.updated(pushed)
        self.workers[0].hold_inflight.remote(self.pipeline.inflight())  # before record: a checkpoint keeps them
        metrics.update(pipe)
        metrics[M.TIME_STEP_S] = time.perf_counter() - t0  # the pipeline's step: waiting, training, pushing
        return metrics

    def record(self, step: int, metrics: dict) -> None:
        """Every worker: each evaluates a share of the rows when due; rank 0 logs (and under FSDP every
        worker writes its shards of a checkpoint)."""
        self._all("record", self.workers, step, metrics)

    def stop(self, step: int, signal_name: str) -> Path:
        return Path(self._saving("stop", step, signal_name))

    def finish(self) -> Path:
        return self._saving("finish")

    def _saving(self, name: str, *args):
        """A method that may save a checkpoint: rank 0's, or under FSDP every rank's (each writes its
        shards); returns rank 0's value."""
        workers = self.workers if self.cfg.distributed.strategy.shards else self.workers[:1]
        return self._all(name, workers, *args)[0]

    def interrupted(self, step: int) -> None:
        """A second signal: notes what is saved, without waiting for the workers (they are killed)."""
        saved = self.run.checkpoints()
        where = f"last checkpoint {saved[-1]}" if saved else "no checkpoint saved yet"
        self.printer.note(f"interrupted at step {step + 1}; {where}; metrics are in {self.run.metrics_file}")

    def close(self) -> None:
        """Closes the workers' sinks and process group (unless a call is still under way), then
        kills the actors, removes the placement group and stops Ray if this run started it."""
        if self.workers and not self.busy:
            try:
                self._all("close", self.workers, timeout=60)
            except Exception as e:  # the run's files are already saved; say so and release the rest
                self.printer.note(f"warning: closing the Ray workers failed ({type(e).__name__}: {e})")
        for w in [*self.workers, *self.rollout_actors]:
            ray.kill(w)
        self.workers, self.rollout_actors, self.pipeline = [], [], None
        for pg in self.pgs:
            remove_placement_group(pg)
        self.pgs = []
        if self.started_ray:
            ray.shutdown()
            self.started_ray = False

    def _saved(self) -> str:
        """What is safe on disk, for the line that ends a run whose worker was lost."""
        run = getattr(self, "run", None)
        saved = run.checkpoints() if run is not None else []
        if not saved:
            return "no checkpoint was saved yet"
        return f"the last checkpoint {saved[-1]} is intact: continue with resume={self.run_dir}"

    # -- Ray -------------------------------------------------------------------------------

    def _start(self) -> None:
        d = self.cfg.distributed
        n, cpus, gpus = d.num_workers, d.cpus_per_worker, d.gpus_per_worker
        if not ray.is_initialized():  # inside a Ray job the job's driver is already connected
            if d.address == "local":
                # at least the workers' CPUs, so 2 workers fit on a 1-core CI machine too (slower)
                want = math.ceil((n + d.rollout_workers) * cpus)
                ray.init(num_cpus=max(os.cpu_count() or 1, want), log_to_driver=True)
            else:
                try:
                    ray.init(address=d.address, log_to_driver=True)
                except ConnectionError as e:
                    raise UserError(
                        f"distributed.address={d.address}: no Ray cluster there ({e}); "
                        "start one with `ray start --head`, "
                        "or use distributed.address=local"
                    ) from None
            self.started_ray = True
        bundle = {"CPU": cpus, **({"GPU": gpus} if gpus else {}), **d.resources_per_worker}
        hsdp = d.strategy == Strategy.HSDP
        how, sizes, where = placement(n, d.workers_per_node if hsdp else 0)
        self.pgs = [placement_group([bundle] * k, strategy=how) for k in sizes]
        ready, _ = ray.wait([pg.ready() for pg in self.pgs], num_returns=len(self.pgs), timeout=PLACEMENT_TIMEOUT_S)
        if len(ready) < len(self.pgs):
            nodes = f" in {len(sizes)} nodes of distributed.workers_per_node={sizes[0]}" if hsdp else ""
            raise UserError(
                f"the Ray cluster has no room for distributed.num_workers={n} workers of {bundle} each{nodes} within "
                f"{PLACEMENT_TIMEOUT_S} s (it has {ray.available_resources()}); lower num_workers or "
                "cpus_per_worker/gpus_per_worker, or add nodes"
            )
        actor = ray.remote(Worker)
        self.workers = [
            actor.options(
                num_cpus=cpus,
                num_gpus=gpus,
                resources=dict(d.resources_per_worker) or None,
                runtime_env={"env_vars": d.worker_env} if d.worker_env else None,
                name=None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=self.pgs[where[rank][0]], placement_group_bundle_index=where[rank][1]
                ),
            ).remote(self.cfg, rank, n, max(1, int(cpus)))
            for rank in range(n)
        ]
        if d.rollout_workers:
            self._start_rollout_actors(bundle)
        host, port = ray.get(self.workers[0].address.remote())
        self._all("connect", self.workers, host, port, printed=False)
        nodes = self._all("node", self.workers, printed=False)
        plural = lambda k, what: f"{k} {what}{'s' if k > 1 else ''}"  # noqa: E731
        shape = f", HSDP: {len(sizes)} shard groups of {sizes[0]}" if hsdp else ""
        self.printer.note(f"{plural(n, 'Ray worker')} on {plural(len(set(nodes)), 'node')}{shape}")

    def _start_rollout_actors(self, bundle: dict) -> None:
        """``distributed.rollout_workers`` actors in a placement group of their own, each with a worker's
        CPUs and GPUs (on a GPU cluster: devices of their own)."""
        d = self.cfg.distributed
        pg = placement_group([bundle] * d.rollout_workers, strategy="PACK")
        self.pgs.append(pg)
        ready, _ = ray.wait([pg.ready()], timeout=PLACEMENT_TIMEOUT_S)
        if not ready:
            raise UserError(
                f"the Ray cluster has no room for distributed.rollout_workers={d.rollout_workers} besides the "
                f"{d.num_workers} trainers, {bundle} each, within {PLACEMENT_TIMEOUT_S} s (it has "
                f"{ray.available_resources()}); lower rollout_workers or cpus_per_worker/gpus_per_worker, or add nodes"
            )
        actor = ray.remote(RolloutWorker)
        self.rollout_actors = [
            actor.options(
                num_cpus=d.cpus_per_worker,
                num_gpus=d.gpus_per_worker,
                resources=dict(d.resources_per_worker) or None,
                runtime_env={"env_vars": d.worker_env} if d.worker_env else None,
                scheduling_strategy=PlacementGroupSchedulingStrategy(
                    placement_group=pg, placement_group_bundle_index=i
                ),
            ).remote(self.cfg, i, max(1, int(d.cpus_per_worker)))
            for i in range(d.rollout_workers)
        ]

    def _on(self, name: str, *args):
        """Rank 0's ``name(*args)``; prints what it printed, returns its value."""
        return self._all(name, self.workers[:1], *args)[0]

    def _all(self, name: str, workers: list, *args, printed: bool = True, timeout: float | None = None) -> list:
        """``name(*args)`` on every worker at once; waits (at most ``distributed.step_timeout_s``, or
        ``timeout``), prints what they printed, returns the values.

        A worker's :class:`~rlvr.errors.UserError` is raised here as the one-line error it is; a worker
        that died, hung or did not answer in time ends the run with one line that names its rank and
        the last checkpoint."""
        self.busy = True
        d = self.cfg.distributed
        limit = timeout if timeout is not None else (d.step_timeout_s or None)
        ranks = [self.workers.index(w) for w in workers]
        refs = [getattr(w, name).remote(*args) for w in workers]
        began = time.monotonic()
        try:
            out = ray.get(refs, timeout=limit)
        except (GetTimeoutError, RayActorError, RayTaskError) as e:
            # the others may wait in a collective for the lost one: close() kills them
            self.busy = not isinstance(e, RayTaskError) or len(workers) > 1
            if isinstance(e, RayTaskError) and isinstance(e.cause, UserError):
                raise UserError(str(e.cause)) from None
            waited = time.monotonic() - began
            outcomes = _outcomes(refs, ranks, 0 if isinstance(e, GetTimeoutError) else 10.0)
            line = _lost(e, name, outcomes, limit=limit, collective_s=d.collective_timeout_s, waited_s=waited)
            if line is None:  # a worker's own error, no peer lost: its traceback
                raise
            raise UserError(f"{line}; {self._saved()}") from None
        self.busy = False  # not reached on KeyboardInterrupt: close() then leaves the workers to ray.kill
        if not printed:
            return out
        values = []
        for value, text in out:
            if text:
                self.console.print(text, end="", markup=False, highlight=False, soft_wrap=True)
            values.append(value)
        return values


def _outcomes(refs: list, ranks: list[int], wait_s: float) -> dict[int, BaseException | None | str]:
    """What each rank's call came to, after waiting at most ``wait_s`` for the unfinished ones: its
    error, None (it returned) or ``"pending"`` (still running). When a worker dies or hangs, the others
    fail in their next collective (gloo: "Connection closed by peer", or a timeout), and their error
    can reach the driver first; Ray marks a dead worker's call within seconds."""
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=wait_s)
    done = set(ready)
    out: dict[int, BaseException | None | str] = {}
    for rank, ref in zip(ranks, refs):
        if ref not in done:
            out[rank] = "pending"
            continue
        try:
            ray.get(ref, timeout=0)
            out[rank] = None
        except Exception as e:  # noqa: BLE001 - sorted by the caller
            out[rank] = e
    return out


def _timed_out(error) -> bool:
    """A worker's collective gave up waiting (gloo: "Timed out waiting ... for recv"; NCCL's watchdog:
    "collective operation timeout")."""
    cause = getattr(error, "cause", error)
    return cause is not None and re.search(r"timed? ?out", str(cause), re.IGNORECASE) is not None


def _lost(error, name: str, outcomes: dict, *, limit, collective_s: float, waited_s: float) -> str | None:
    """The line that says which worker was lost during ``name`` and how, or None when none was (a
    worker's own error, raised with its traceback).

    A hung worker shows as a collective timeout on the others: after ``collective_s`` gloo raises in
    the ranks that waited, and the rank they waited for is the one whose call still runs. NCCL's
    watchdog ends a waiting worker's process instead, which looks like a death; the line then says
    which rank may have hung."""
    pending = [r for r, o in outcomes.items() if o == "pending"]
    died = [r for r, o in outcomes.items() if isinstance(o, RayActorError)]
    timed = [r for r, o in outcomes.items() if isinstance(o, RayTaskError) and _timed_out(o)]
    ranks = lambda rs: "rank " + ", ".join(map(str, rs))  # noqa: E731
    if isinstance(error, GetTimeoutError):
        who = ranks(pending) if pending else "a worker"
        return f"Ray worker {who} did not answer {name} within distributed.step_timeout_s={limit:g} s (hung?)"
    if pending and timed:
        return (
            f"Ray worker {ranks(pending)} hung during {name}: {ranks(timed)} waited "
            f"distributed.collective_timeout_s={collective_s:g} s for it in a collective"
        )
    if died:
        line = f"a Ray worker died during {name} ({ranks(died)}, {type(outcomes[died[0]]).__name__})"
        if pending and waited_s >= collective_s:
            line += (
                f" after {waited_s:.0f} s, past distributed.collective_timeout_s={collective_s:g} s: NCCL ends a "
                f"worker whose collective timed out, so {ranks(pending)}, still in {name}, may have hung"
            )
        return line
    if timed:
        cause = str(getattr(outcomes[timed[0]], "cause", "")).strip().splitlines()
        return (
            f"a collective timed out during {name} on {ranks(timed)} after "
            f"distributed.collective_timeout_s={collective_s:g} s ({cause[0] if cause else 'no detail'})"
        )
    return None


def _dead(refs: list, wait_s: float = 10.0) -> str | None:
    """The error type of a call whose worker died (``RayActorError``), if one did (:func:`_outcomes`)."""
    for outcome in _outcomes(refs, list(range(len(refs))), wait_s).values():
        if isinstance(outcome, RayActorError):
            return type(outcome).__name__
    return None


def train(cfg: Config, *, console=None, notes: tuple[str, ...] = ()) -> Path:
    """Run GRPO on ``distributed.num_workers`` Ray workers as configured; returns the run directory
    (the same loop as one process: :func:`rlvr.training.run`). ``notes`` are printed first."""
    from rlvr.training import run

    trainer = RayTrainer(cfg, console=console)
    for line in notes:
        trainer.console.print(line, highlight=False, markup=False)
    return run(trainer)
