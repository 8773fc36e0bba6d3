"""benchmarks/dev/update_attention.py's harness: its call is the one pass's attention on the rows it
builds, and the compiled and torch sides it times compute the same attention."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from rlvr.cpu import update_attention as ua
from rlvr.models import shared_prefix

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "dev"))
import update_attention  # noqa: E402


def test_both_sides_compute_the_same_attention():
    kernel, why = ua.kernel()
    if kernel is None:
        pytest.skip(f"no compiled update attention here: {why}")
    spec = dict(P=2, G=3, Lp=20, lengths=None, pads=[4, 0], low=2, high=19)
    q, k, v, masks, lengths, T = update_attention._inputs(spec)
    assert q.shape == (1, update_attention.H, 2 * 20 + sum(lengths), update_attention.D) and T == max(lengths)
    run = update_attention._call(q, k, v, masks, lengths, T, spec["G"])
    outs = []
    try:
        for fn in (kernel, None):
            shared_prefix.use_kernel(fn)
            with torch.autocast("cpu", dtype=torch.bfloat16):
                outs.append(run().detach().float())
            assert update_attention._time(run, (q, k, v), True) > 0 and q.grad is not None
    finally:
        shared_prefix.use_kernel(None)
    want = ua.reference(q.detach(), k.detach(), v.detach(), masks[1][::3, 0, 0, :20], lengths, update_attention.D**-0.5)
    for out in outs:
        assert float((out - want).abs().max()) < 0.05 * float(want.abs().max())
