"""Persistent worker processes that run ``"module:function"(*args)`` calls, each under a hard time limit.

Why not ``concurrent.futures``: a call stuck inside sympy's C code ignores signals and cannot be
cancelled, so the only way to bound it is to kill the process that runs it. Each worker here
takes one call at a time over its own pipe; a call that overruns its limit gets its worker
killed and replaced, and costs nothing but its own limit.

Workers are forked from a ``forkserver`` that has already imported (and warmed up) the modules
in ``preload``: the first start costs one interpreter start-up (math-verify's imports), a
replacement after a kill only a fork, and no worker ever inherits the trainer's threads
or CUDA state. Workers are daemons and are stopped at interpreter exit.

The time limit is the item's own: every worker, including a replacement, first runs the pool's
``setup`` calls (a warm-up verification; see :meth:`WorkerPool.prepare`) and the batch's own
(a plugin's import; ``run(..., setup=)``) under a separate, generous limit, and only then takes
items. An item's clock starts when it is handed to an idle, warm worker, so start-up and imports
never count against it, even on a busy machine. A batch's setup calls are its own: a pool shared
by several scorers does not make a replacement worker import every plugin any of them used.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import logging
import multiprocessing as mp
import signal
import sys
import time
import types
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import wait
from typing import Any

log = logging.getLogger(__name__)

Call = tuple[str, tuple]
"""("module:function", args): the function is imported by name in the worker, so nothing unpicklable travels."""


@dataclass(frozen=True)
class Outcome:
    """The result of one call: ``value`` if ``error`` is None, else why it failed."""

    value: Any = None
    error: str | None = None
    seconds: float = 0.0


def _serve(conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    fns: dict[str, Any] = {}
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        target, args = msg
        try:
            if target not in fns:
                module, _, name = target.partition(":")
                fns[target] = getattr(importlib.import_module(module), name)
            reply = (fns[target](*args), None)
        except BaseException as e:  # noqa: BLE001 - report everything, the worker lives on
            reply = (None, f"{type(e).__name__}: {e}")
        try:
            conn.send(reply)
        except Exception as e:  # noqa: BLE001 - e.g. an unpicklable return value
            conn.send((None, f"result could not be sent back: {type(e).__name__}: {e}"))


@contextlib.contextmanager
def _main_module_hidden():
    """Workers only run functions named by module, so they must not re-run the parent's script:
    multiprocessing would (the `if __name__ == "__main__"` trap) for a script started by path."""
    main = sys.modules.get("__main__")
    if main is None or getattr(main, "__spec__", None) is not None or not getattr(main, "__file__", None):
        yield
        return
    sys.modules["__main__"] = types.ModuleType("__main__")
    try:
        yield
    finally:
        sys.modules["__main__"] = main


class WorkerPool:
    """``workers`` processes; :meth:`run` maps calls over them with a per-call time limit.

    Args:
        workers: number of processes.
        preload: modules the forkserver imports once (every worker is forked with them loaded).
        setup: calls every worker runs when it starts, before its first item (see :meth:`prepare`).
        setup_timeout_s: limit per setup call; a worker that overruns it is replaced by a bare one,
            and the call is not run again.
    """

    def __init__(
        self, workers: int, preload: tuple[str, ...] = (), setup: tuple[Call, ...] = (), setup_timeout_s: float = 120.0
    ):
        if workers < 1:
            raise ValueError(f"workers={workers}: need at least 1")
        self._ctx = mp.get_context("forkserver")
        self._ctx.set_forkserver_preload(list(preload))
        self._procs: list = [None] * workers
        self._conns: list = [None] * workers
        self._setup: list[Call] = []  # every worker's, replacements included (prepare)
        self._batch_setup: list[Call] = []  # the running batch's (run's setup=)
        self._done: list[list[Call]] = [[] for _ in range(workers)]  # setup calls each worker has run
        self._given_up: list[Call] = []  # setup calls that overran setup_timeout_s
        self.setup_timeout_s = setup_timeout_s
        for w in range(workers):
            self._start(w, setup=False)
        atexit.register(self.close)
        self.prepare(list(setup))

    def _start(self, w: int, *, setup: bool = True) -> None:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_serve, args=(child,), daemon=True, name=f"rlvr-reward-{w}")
        with _main_module_hidden():
            proc.start()
        child.close()
        self._procs[w], self._conns[w] = proc, parent
        self._done[w] = []
        if setup:
            self._run_setup([w], [*self._setup, *self._batch_setup])

    def _restart(self, w: int, *, setup: bool = True) -> None:
        self._procs[w].kill()
        self._procs[w].join()
        self._conns[w].close()
        self._start(w, setup=setup)

    def prepare(self, calls: list[Call]) -> list[str]:
        """Run each call once on every worker now, and on every worker started later (replacements
        after a time-out), before that worker takes an item: imports and warm-ups that must not
        count against an item's time limit. Calls already registered are skipped.

        Returns:
            the errors reported by the calls (empty if all went well); a failed call is logged and
            the worker stays in service (the same error will then fail the items that need it).
        """
        new = [c for c in calls if c not in self._setup]
        self._setup += new
        return self.ensure(new)

    def ensure(self, calls: list[Call]) -> list[str]:
        """Run each call now on every worker that has not run it yet (untimed), but not on workers
        started later: :meth:`run` asks for it again (its ``setup``) when its batch needs it.

        Returns:
            the errors reported by the calls, as :meth:`prepare`.
        """
        return self._run_setup(list(range(len(self._procs))), list(calls))

    def _run_setup(self, workers: list[int], calls: list[Call]) -> list[str]:
        errors: list[str] = []
        for call in calls:
            if call in self._given_up:
                continue
            pending = {}
            for w in workers:
                if call in self._done[w]:
                    continue
                try:
                    self._conns[w].send(call)
                    pending[w] = self._conns[w]
                except Exception as e:  # noqa: BLE001 - a dead worker is replaced (bare) below
                    errors.append(f"{call[0]}: could not be sent: {type(e).__name__}: {e}")
                    self._restart(w, setup=False)
            deadline = time.monotonic() + self.setup_timeout_s
            while pending:
                ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
                if not ready:
                    break
                for w in [w for w, c in pending.items() if c in ready]:
                    del pending[w]
                    try:
                        _, error = self._conns[w].recv()
                    except (EOFError, OSError):
                        error = f"worker process died (exit code {self._procs[w].exitcode})"
                        self._restart(w, setup=False)
                    if error:
                        errors.append(f"{call[0]}: {error}")
                    self._done[w].append(call)  # failed or not: it is not run again on this worker
            for w in pending:  # overran the setup limit: replace it with a bare worker
                errors.append(f"{call[0]}: setup timed out after {self.setup_timeout_s:g} s")
                self._restart(w, setup=False)
            if pending:  # never again: every replacement would wait as long
                self._given_up.append(call)
        for e in dict.fromkeys(errors):
            log.warning("reward worker setup failed: %s", e)
        return errors

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def run(self, calls: list[Call], timeout_s: float, setup: list[Call] = ()) -> list[Outcome]:
        """Run every call; results in input order. A call running longer than ``timeout_s``
        (counted from when a worker picks it up) gets an Outcome with an error instead.

        ``setup``: calls a worker must have run before it takes one of these (a plugin's import):
        run first (untimed) on every worker that has not, and on every worker that replaces one
        during this batch (see :meth:`ensure`)."""
        self.ensure(list(setup))
        results: list[Outcome | None] = [None] * len(calls)
        queue = deque(range(len(calls)))
        busy: dict[int, tuple[int, float]] = {}  # worker -> (call index, start time)
        self._batch_setup = list(setup)
        try:
            self._run(calls, timeout_s, results, queue, busy)
        except BaseException:
            # interrupted (Ctrl-C, an error) with calls in flight: their replies would arrive during
            # the next batch and be taken for its answers, so those workers are replaced now
            for w in list(busy):
                self._restart(w)
            raise
        finally:
            self._batch_setup = []
        return results  # type: ignore[return-value]

    def _run(self, calls: list[Call], timeout_s: float, results: list, queue: deque, busy: dict) -> None:
        """The loop of :meth:`run`; ``busy`` always holds the workers with a call in flight."""
        while queue or busy:
            for w in range(len(self._procs)):
                while w not in busy and queue:
                    i = queue[0]
                    try:
                        self._conns[w].send(calls[i])
                    except (BrokenPipeError, ConnectionResetError, EOFError):  # worker died while idle
                        self._restart(w)
                        continue
                    except Exception as e:  # noqa: BLE001 - unpicklable arguments fail this call only
                        results[queue.popleft()] = Outcome(
                            error=f"arguments could not be sent: {type(e).__name__}: {e}"
                        )
                        continue
                    busy[w] = (queue.popleft(), time.monotonic())
            if not busy:
                break
            first_deadline = min(start for _, start in busy.values()) + timeout_s
            ready = wait([self._conns[w] for w in busy], timeout=max(0.0, first_deadline - time.monotonic()))
            now = time.monotonic()
            for w, (i, start) in list(busy.items()):
                if self._conns[w] in ready:
                    try:
                        value, error = self._conns[w].recv()
                    except (EOFError, OSError):
                        value, error = None, f"worker process died (exit code {self._procs[w].exitcode})"
                        self._restart(w)
                    results[i] = Outcome(value, error, now - start)
                elif now - start >= timeout_s:
                    results[i] = Outcome(None, f"timed out after {timeout_s:g} s", now - start)
                    self._restart(w)
                else:
                    continue
                del busy[w]

    def close(self) -> None:
        """Stop every worker (politely, then by force). Safe to call twice."""
        for w, proc in enumerate(self._procs):
            if proc is None:
                continue
            try:
                self._conns[w].send(None)
            except Exception:  # noqa: BLE001 - already gone
                pass
            proc.join(timeout=1.0)
            if proc.is_alive():
                proc.kill()
                proc.join()
            self._conns[w].close()
            self._procs[w] = None
        atexit.unregister(self.close)
