"""The counter-based draw rule (rlvr/rollout/sampling.py): u = counter_uniform(seed, position) is
uniform, neighbouring keys are independent, a value depends on its key alone (not on the batch, the
row order or the device), the values are pinned, int64 never overflows, and ``draw`` traces into one
graph. The hash is deterministic, so every statistical bound below passes or fails for good."""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlvr.rollout import decode, sampling
from rlvr.rollout.hf import sample_seed
from rlvr.rollout.sampling import counter_uniform, draw, inverse_cdf, warp

N = 100_000
M32 = 0xFFFFFFFF
KS_CRIT = 1.95 / N**0.5  # Kolmogorov-Smirnov, p = 0.001: 0.0062
CHI2_99_CRIT = 148.2  # chi-square with 99 degrees of freedom, p = 0.001 (100 bins, or a 10 x 10 grid)


def _lowbias32(x: int) -> int:
    """Chris Wellons' lowbias32 on Python ints (https://nullprogram.com/blog/2018/07/31/)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) & M32
    x ^= x >> 15
    x = (x * 0x846CA68B) & M32
    return x ^ (x >> 16)


def _reference(seed: int, position: int) -> float:
    """The rule in unbounded Python integers: no int64 anywhere, so nothing to overflow."""
    lo, hi, pos = seed & M32, seed >> 32, position & M32
    a = _lowbias32(lo ^ _lowbias32(hi ^ _lowbias32(pos ^ 0x9E3779B9)))
    b = _lowbias32(hi ^ _lowbias32(lo ^ _lowbias32(pos ^ 0x7F4A7C15)))
    return ((a >> 5) * 2**26 + (b >> 6)) / 2**53  # 27 + 26 = 53 bits


def _ks(u: torch.Tensor) -> float:
    """Kolmogorov-Smirnov distance of the sample ``u`` from U[0, 1)."""
    u, n = u.sort().values, u.numel()
    i = torch.arange(n, dtype=torch.float64)
    return float(torch.maximum((i + 1) / n - u, u - i / n).max())


def _chi2_counts(cell: torch.Tensor, cells: int) -> float:
    """Pearson chi-square of integer cell indices in [0, cells) against equal expected counts."""
    counts = torch.bincount(cell, minlength=cells).double()
    expected = cell.numel() / cells
    return float(((counts - expected) ** 2 / expected).sum())


def _chi2(u: torch.Tensor, bins: int = 100) -> float:
    """Chi-square of ``u`` in ``bins`` equal bins of [0, 1)."""
    return _chi2_counts((u * bins).long(), bins)


def _chi2_pairs(u: torch.Tensor, v: torch.Tensor, bins: int = 10) -> float:
    """Chi-square of the pairs (u, v) on a bins x bins grid: catches any dependence, not only linear."""
    return _chi2_counts((u * bins).long() * bins + (v * bins).long(), bins * bins)


def _corr(u: torch.Tensor, v: torch.Tensor) -> float:
    return float(torch.corrcoef(torch.stack([u, v]))[0, 1])


# keys that a weak hash gets wrong: consecutive seeds, consecutive positions, only the high word varying
SEQ_SEEDS = torch.arange(N, dtype=torch.int64)
ONE_SEED = torch.full((N,), sample_seed(0), dtype=torch.int64)
HIGH_SEEDS = SEQ_SEEDS << 32
POSITIONS = torch.arange(N, dtype=torch.int64)
KEYS = {
    "consecutive seeds": (SEQ_SEEDS, 0),
    "consecutive positions": (ONE_SEED, POSITIONS),
    "high words only": (HIGH_SEEDS, 3),
}


def test_draws_are_uniform():
    """KS and a 100-bin chi-square on 10^5 draws per key family, on the top bits and on the low bits
    (the fractional part of u · 2^26: the second word's 26 bits)."""
    for name, (seed, pos) in KEYS.items():
        u = counter_uniform(seed, pos)
        assert u.dtype == torch.float64 and (u >= 0).all() and (u < 1).all(), name
        assert _ks(u) < KS_CRIT, name
        assert _chi2(u) < CHI2_99_CRIT, name
        assert _chi2(torch.frac(u * 2**26)) < CHI2_99_CRIT, name
    # negative control: a rule that hashes nothing (the seed's low word as the draw) fails the test
    assert _ks((SEQ_SEEDS & M32).double() / 2**32) > KS_CRIT


def test_neighbouring_keys_are_independent():
    """(u at t, u at t + 1), (seed s, seed s + 1) and (seed s, seed s + 2^32): correlation within
    4.5 / sqrt(n) (0.014) and a 10 x 10 grid chi-square below its p = 0.001 bound."""
    by_position = counter_uniform(torch.full((N + 1,), sample_seed(0)), torch.arange(N + 1))
    pairs = {
        "positions t, t+1": (by_position[:-1], by_position[1:]),
        "seeds s, s+1": (counter_uniform(SEQ_SEEDS, 5), counter_uniform(SEQ_SEEDS + 1, 5)),
        "seeds s, s+2^32": (counter_uniform(SEQ_SEEDS, 5), counter_uniform(SEQ_SEEDS + 2**32, 5)),
        "seed s at t, seed s+1 at t+1": (counter_uniform(SEQ_SEEDS, 5), counter_uniform(SEQ_SEEDS + 1, 6)),
    }
    for name, (u, v) in pairs.items():
        assert abs(_corr(u, v)) < 4.5 / N**0.5, name
        assert _chi2_pairs(u, v) < CHI2_99_CRIT, name
    # negative control: a multiplicative (Weyl) hash is uniform, but neighbours lie on lines
    weyl = ((SEQ_SEEDS * 0x9E3779B9) & M32).double() / 2**32
    assert _ks(weyl) < KS_CRIT
    assert _chi2_pairs(weyl[:-1], weyl[1:]) > 10 * CHI2_99_CRIT


def test_a_value_depends_on_its_key_alone():
    """A row's value is the same alone, in a sub-batch, in the full batch, in any row order, with the
    position as an int, a 0-d tensor or one per row."""
    g = torch.Generator().manual_seed(0)
    seeds = torch.tensor([sample_seed(9, i) for i in range(64)])
    full = counter_uniform(seeds, 17)
    perm = torch.randperm(64, generator=g)
    assert torch.equal(counter_uniform(seeds[perm], 17), full[perm])
    sub = torch.tensor([3, 60, 0, 41])
    assert torch.equal(counter_uniform(seeds[sub], 17), full[sub])
    assert torch.equal(torch.cat([counter_uniform(seeds[i : i + 1], 17) for i in range(64)]), full)
    assert torch.equal(counter_uniform(seeds, torch.tensor(17)), full)
    assert torch.equal(counter_uniform(seeds, torch.full((64,), 17)), full)
    assert not torch.equal(counter_uniform(seeds, 18), full)


def test_pinned_values():
    """A change of rule (mixer, constants, key layout, bit join) changes these. They equal the
    Python-integer reference above, and so does every key of a random sample, extremes included."""
    golden = {
        (0, 0): 0.5793412531818818,
        (0, 1): 0.7247677680338199,
        (1, 0): 0.6991720431516835,
        (12345, 7): 0.7410423892644151,
        (2**32, 3): 0.6859936662194551,
        (2**63 - 1, 0): 0.7704467853378502,
        (2**63 - 1, 2**32 - 1): 0.2719680746829882,
    }
    for (seed, pos), want in golden.items():
        assert counter_uniform(torch.tensor([seed]), pos).item() == want, (seed, pos)
        assert _reference(seed, pos) == want, (seed, pos)
    g = torch.Generator().manual_seed(1)
    seeds = torch.randint(0, 2**63 - 1, (1000,), generator=g)
    seeds[:4] = torch.tensor([0, 1, 2**32 - 1, 2**63 - 1])
    positions = torch.randint(0, 2**32, (1000,), generator=g)
    got = counter_uniform(seeds, positions).tolist()
    assert got == [_reference(s, p) for s, p in zip(seeds.tolist(), positions.tolist())]


class _Int64Range(TorchDispatchMode):
    """The smallest and the largest value of every int64 tensor an op produces."""

    def __init__(self) -> None:
        super().__init__()
        self.lo, self.hi, self.ops = 0, 0, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor) and out.dtype == torch.int64 and out.numel():
            self.lo, self.hi, self.ops = min(self.lo, int(out.min())), max(self.hi, int(out.max())), self.ops + 1
        return out


def test_int64_intermediates_never_overflow():
    """With seeds up to 2^63 - 1 and positions up to 2^32, no intermediate leaves [0, 2^53): an
    overflow would wrap to a negative or a huge value. Positions count mod 2^32."""
    seeds = torch.tensor([0, 1, 2**31, 2**32 - 1, 2**32, 2**62, 2**63 - 2, 2**63 - 1])
    for pos in (0, 2**31, 2**32 - 1, 2**32, torch.full((8,), 2**32 - 1)):
        with _Int64Range() as seen:
            u = counter_uniform(seeds, pos)
        assert seen.ops > 20 and 0 <= seen.lo and seen.hi < 2**53, (pos, seen.lo, seen.hi)
        p = int(pos.max()) if isinstance(pos, torch.Tensor) else pos
        assert u.tolist() == [_reference(s, p) for s in seeds.tolist()]
    assert torch.equal(counter_uniform(seeds, 2**32), counter_uniform(seeds, 0))


def test_the_same_values_on_every_device(device):
    """Integer operations and an exact division: a GPU draws what a CPU draws (``pytest --device cuda``)."""
    seeds = torch.tensor([sample_seed(3, i) for i in range(256)])
    want = counter_uniform(seeds, 11)
    got = counter_uniform(seeds.to(device), torch.tensor(11, device=device))
    assert got.device.type == device.type and torch.equal(got.cpu(), want)


def test_draw_traces_into_one_graph_and_equals_eager():
    """``draw`` at ``counter_uniform`` draws, the position a tensor (as in a captured decode step), under
    ``torch.compile(fullgraph=True)``: no graph break, one graph over positions, the eager tokens."""
    from torch._dynamo.utils import counters

    def step(logits, seeds, t):
        return draw(logits, counter_uniform(seeds, t), 0.8, 20, 0.9)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(step, backend="eager", fullgraph=True)
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 1000, generator=g) * 3
    seeds = torch.tensor([sample_seed(4, i) for i in range(6)])
    for t in range(4):
        assert torch.equal(compiled(logits, seeds, torch.tensor(t)), step(logits, seeds, t))
    assert counters["stats"]["unique_graphs"] == 1


def test_draw_is_the_warpers_then_the_inverse_cdf():
    """``draw`` = ``inverse_cdf`` after ``warp``; the old names stay importable from rollout.decode."""
    assert decode.inverse_cdf is sampling.inverse_cdf and decode.warpers is sampling.warpers
    logits = torch.randn(5, 300, generator=torch.Generator().manual_seed(3))
    u = counter_uniform(torch.arange(5), 0)
    assert torch.equal(draw(logits, u, 0.7, 10, 0.8), inverse_cdf(warp(logits, 0.7, 10, 0.8), u))
    kept = torch.isfinite(warp(logits, 0.7, 10, 1.0)).sum(-1)
    assert (kept == 10).all()  # top-k cut the rest to -inf
