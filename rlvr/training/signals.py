"""Stop on SIGINT/SIGTERM without losing anything: finish the step, checkpoint, close the sinks.

Preemption (SIGTERM from a scheduler or ``kill``) and Ctrl-C (SIGINT) set a flag that the trainer
reads after each step; a second signal raises ``KeyboardInterrupt`` at once. Checkpoints are
written to a temporary directory and renamed, and JSONL lines are fsynced one by one, so even
that leaves nothing half-written.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable


class GracefulStop:
    """Installs the handlers between :meth:`install` and :meth:`restore` (main thread only).

    Args:
        note: prints one line when the first signal arrives.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, note: Callable[[str], None]) -> None:
        self.note = note
        self.requested: str | None = None
        """Name of the first signal received (e.g. 'SIGTERM'), or None."""
        self._previous: dict[int, object] = {}

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread; there, the default applies
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum, frame) -> None:
        if self.requested is not None:
            raise KeyboardInterrupt  # the second signal: stop now
        self.requested = signal.Signals(signum).name
        self.note(f"{self.requested}: finishing this step, then saving a checkpoint (send it again to stop at once)")
