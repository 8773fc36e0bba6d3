"""distributed.collective_timeout_s and distributed.env: a hung worker is named by its rank, and the
workers start with the allocator and NCCL settings (the end-to-end hang: tests/distributed/test_lost_worker.py)."""

from __future__ import annotations

import pytest

from rlvr.config import WORKER_ENV, load_config
from rlvr.errors import UserError

ray_exceptions = pytest.importorskip("ray.exceptions")
driver = pytest.importorskip("rlvr.distributed.driver")
RayTaskError, ActorDiedError = ray_exceptions.RayTaskError, ray_exceptions.ActorDiedError


def _failed(text: str):
    return RayTaskError("step", "traceback", RuntimeError(text))


TIMED_OUT = "[gloo/transport/tcp/unbound_buffer.cc:78] Timed out waiting 600000ms for recv operation to complete"
KW = dict(limit=3600.0, collective_s=600.0)


def test_a_hung_rank_is_named_by_the_ranks_that_timed_out_waiting_for_it():
    # rank 1 never left its reward function; ranks 0 and 2 gave up in the next collective (gloo raises)
    outcomes = {0: _failed(TIMED_OUT), 1: "pending", 2: _failed(TIMED_OUT)}
    line = driver._lost(outcomes[0], "step", outcomes, **KW, waited_s=601)
    assert line == (
        "Ray worker rank 1 hung during step: rank 0, 2 waited distributed.collective_timeout_s=600 s for it "
        "in a collective"
    )


def test_a_death_is_a_death_and_nccls_timeout_says_who_may_have_hung():
    dead = {0: None, 1: ActorDiedError()}
    assert (
        driver._lost(dead[1], "step", dead, **KW, waited_s=5)
        == "a Ray worker died during step (rank 1, ActorDiedError)"
    )
    # NCCL's watchdog ends rank 0's process once its collective times out; rank 1 still runs
    nccl = {0: ActorDiedError(), 1: "pending"}
    line = driver._lost(nccl[0], "step", nccl, **KW, waited_s=605)
    assert line.startswith("a Ray worker died during step (rank 0, ActorDiedError) after 605 s")
    assert "rank 1, still in step, may have hung" in line
    assert "may have hung" not in driver._lost(nccl[0], "step", nccl, **KW, waited_s=30)  # too soon for a timeout


def test_the_step_timeout_names_the_unanswered_ranks_and_a_plain_error_keeps_its_traceback():
    outcomes = {0: "pending", 1: "pending"}
    line = driver._lost(ray_exceptions.GetTimeoutError(), "step", outcomes, **KW, waited_s=3600)
    assert line == "Ray worker rank 0, 1 did not answer step within distributed.step_timeout_s=3600 s (hung?)"
    bug = {0: _failed("KeyError: 'x'"), 1: None}
    assert driver._lost(bug[0], "step", bug, **KW, waited_s=1) is None


def test_worker_env_defaults_overrides_and_bad_names():
    d = load_config(None, []).distributed
    assert d.worker_env == WORKER_ENV == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_DEBUG": "WARN"}
    d = load_config(None, ["distributed.env.NCCL_DEBUG=", "distributed.env.NCCL_SOCKET_NTHREADS=4"]).distributed
    assert d.worker_env == {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True", "NCCL_SOCKET_NTHREADS": "4"}
    assert d.collective_timeout_s == 600
    with pytest.raises(UserError, match=r"^distributed.env.NCCL-X: not an environment variable name"):
        load_config(None, ["distributed.env.NCCL-X=1"])
    with pytest.raises(UserError, match=r"^distributed.collective_timeout_s=0: must be > 0"):
        load_config(None, ["distributed.collective_timeout_s=0"])
