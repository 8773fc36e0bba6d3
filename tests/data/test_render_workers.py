"""Prompt rendering over worker processes ends even when the parent has a Python SIGTERM handler.

A clean-clone CI run hung in ``render_all``: ``Pool.__exit__`` calls ``terminate()``, whose
``_help_stuff_finish`` takes the task queue's lock for good and then relies on SIGTERM to end any
worker still waiting on it; the pytest process had a Python SIGTERM handler, which the forked
worker inherited, so it survived the signal and ``join()`` waited forever. The race (a worker not
yet gone when ``terminate()`` runs) did not reproduce on demand, so this test exercises the path
end to end: the workers now leave by ``close()`` + ``join()`` and start with default handlers."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_render_workers_finish_under_a_parent_sigterm_handler(tmp_path):
    code = textwrap.dedent("""
        import signal
        import importlib
        prepare = importlib.import_module("rlvr.data.prepare")
        from rlvr.data.templates import get_template
        from rlvr.models.tiny import tiny_tokenizer
        signal.signal(signal.SIGTERM, lambda *a: None)  # a handler that survives the signal
        rows = [{"question": f"What is {i} + 1?", "system": None} for i in range(prepare._PARALLEL_MIN_ROWS + 10)]
        for _ in range(3):
            prompts, counts = prepare.render_all(rows, tiny_tokenizer(), get_template("r1_base"), num_workers=2)
            assert len(prompts) == len(rows) == len(counts)
        import multiprocessing, os
        assert not multiprocessing.active_children()  # every worker has exited
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
