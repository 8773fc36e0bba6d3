"""A reward pool interrupted mid-batch must not hand the old batch's replies to the next one."""

from __future__ import annotations

import pytest

from rlvr.rewards import pool as pool_module
from rlvr.rewards.pool import WorkerPool


def test_interrupted_batch_leaves_no_stale_reply(monkeypatch):
    p = WorkerPool(2)
    try:
        real_wait = pool_module.wait

        def interrupted(*args, **kwargs):  # Ctrl-C arrives while both workers are busy
            raise KeyboardInterrupt

        monkeypatch.setattr(pool_module, "wait", interrupted)
        with pytest.raises(KeyboardInterrupt):
            p.run([("time:sleep", (0.3,)), ("time:sleep", (0.3,))], timeout_s=5)
        monkeypatch.setattr(pool_module, "wait", real_wait)
        out = p.run([("operator:add", (1, 2)), ("operator:mul", (3, 4))], timeout_s=5)
        assert [o.value for o in out] == [3, 12] and all(o.error is None for o in out)
    finally:
        p.close()
