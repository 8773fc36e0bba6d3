"""One layer's shared-prompt attention of the update, forward and forward + backward: the compiled
kernel (``train.fused_attention``, ``rlvr/cpu/update_attention.c``) against the torch kernels the
one pass takes without it, under bf16 autocast, interleaved in one process.

The shapes are the built-in model's heads (9 query heads over 3 key/value heads of 64) on the
quickstart's batch (4 prompts left-padded to 126 × G 8, answers of ``--lengths``) and on
``vs_trl.py``'s (2 prompts of 128 × G 8, answers of 12 to 128 tokens). The queries and keys come in
as float32 (the rotary's output under autocast) and the values as bf16, [1, heads, N, 64] views of
[1, N, heads, 64] rows, as the model hands them over; each side gets the same unpadded rows and
decides as the one pass does (``shared_prefix._shared_prefix_attention``: the torch side by segment,
with a core length, or padded).

    python benchmarks/dev/update_attention.py --rounds 30
    git show 565f642:rlvr/cpu/update_attention.c > /tmp/before.c   # per-thread sums, not deterministic
    python benchmarks/dev/update_attention.py --against /tmp/before.c

``--against FILE`` times another version of ``update_attention.c`` as a third side, interleaved
(what the determinism of issue 58 costs: FILE the version before it). Each compiled side's backward
also runs twice on the first shape at the machine's thread count and once at one thread, and the
results say whether the gradients were bit-identical each time. ``--emulated`` builds the C on
SIMDe's emulation of AVX-512 (the tests' build, tests/ua_emulated.py) where this CPU has no
AVX512-BF16: it shows the work the code does and whether its bits repeat, not the hardware's speed,
and its results file says so (``-emulated`` in its name).

Writes benchmarks/results/update_attention-<capability>-<date>.json and prints a table. Nothing else
should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "results"
H, KV, D = 9, 3, 64
SHAPES = {
    "quickstart, answers of 17": dict(P=4, G=8, Lp=125, lengths=[17] * 32, pads=[10, 0, 16, 5]),
    "quickstart, answers of 12-21": dict(P=4, G=8, Lp=125, lengths=None, pads=[10, 0, 16, 5], low=12, high=21),
    "vs_trl, answers of 12-128": dict(P=2, G=8, Lp=127, lengths=None, pads=[40, 0], low=12, high=128),
}


def _inputs(spec: dict, seed: int = 0):
    """(query, key, value, masks, lengths, T) of one call, as the model hands them to the attention."""
    from rlvr.models import shared_prefix

    g = torch.Generator().manual_seed(seed)
    P, G, Lp = spec["P"], spec["G"], spec["Lp"]
    lengths = spec["lengths"] or torch.randint(spec["low"], spec["high"] + 1, (P * G,), generator=g).tolist()
    T = max(lengths)
    mask = torch.ones(P * G, Lp + 1 + T, dtype=torch.long)
    for p, n in enumerate(spec["pads"]):
        mask[p * G : (p + 1) * G, :n] = 0
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    _, _, masks, _ = shared_prefix.layout(torch.zeros_like(mask), mask, positions, T, G)
    N = P * Lp + sum(lengths)
    q = torch.randn(1, N, H, D, generator=g).transpose(1, 2)
    k = torch.randn(1, N, KV, D, generator=g).transpose(1, 2)
    v = torch.randn(1, N, KV, D, generator=g).bfloat16().transpose(1, 2)
    return q, k, v, masks, tuple(lengths), T


class _Module(torch.nn.Module):
    """What the attention function reads of its layer."""

    def __init__(self) -> None:
        super().__init__()
        self.train()


def _call(q, k, v, masks, lengths, T, G):
    """The one pass's attention call on unpadded rows (its indices built as the pass builds them)."""
    from rlvr.models import shared_prefix

    P, Lp = masks[0].shape[0], masks[0].shape[-1]
    host, sums = shared_prefix.unpadded_span(lengths, T, G)
    index = shared_prefix.unpadded_index(torch.tensor(host).view(P, G), T, Lp, sums)
    c = shared_prefix.core_length(Lp, T, host, P, True)
    core = shared_prefix.core_rows(host, Lp, G, c, "cpu") if c < T else None

    def run():
        return shared_prefix._shared_prefix_attention(
            _Module(), q, k, v, None, shared_prefix=(G, T, masks, (index.into, index.back, host, core)), scaling=D**-0.5
        )[0]

    return run


def _time(run, inputs, backward: bool) -> float:
    for x in inputs:
        x.grad = None
        x.requires_grad_(backward)
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = run()
    if backward:
        out.backward(torch.ones_like(out))
    return time.perf_counter() - t0


def _build(source: Path, emulated: bool):
    """The kernel function of ``source`` (a version of update_attention.c), native or on SIMDe."""
    import functools

    from rlvr.cpu import kernels
    from rlvr.cpu import update_attention as ua

    extra: tuple[str, ...] = ()
    if emulated:
        import simde_py  # the test extra

        extra = ("-DUA_SIMDE", f"-I{simde_py.get_include()}", "-Wno-psabi")
    cc = kernels.c_compiler()
    if cc is None:
        raise SystemExit("no C compiler (cc or gcc, or $CC) on PATH")
    lib = ua.Library(kernels.compile_library(cc, source, extra=extra))
    if not lib.supported:
        raise SystemExit(f"{source}: built without AVX512-BF16 here; add --emulated to run it on SIMDe")
    if (err := ua._self_check(lib)) is not None:
        raise SystemExit(f"{source}: differs from the float32 reference ({err})")
    return functools.partial(ua.attention, lib)


def _same_bits(kernel, spec: dict) -> dict:
    """Whether the kernel's gradients repeat bit for bit: twice at the current thread count, then at 1."""
    from rlvr.models.shared_prefix import use_kernel

    q, k, v, masks, lengths, T = _inputs(spec, seed=1)
    run = _call(q, k, v, masks, lengths, T, spec["G"])
    use_kernel(kernel)
    threads, grads = torch.get_num_threads(), []
    try:
        for n in (threads, threads, 1):
            torch.set_num_threads(n)
            _time(run, (q, k, v), True)
            grads.append([x.grad.clone() for x in (q, k, v)])
    finally:
        torch.set_num_threads(threads)
        use_kernel(None)
    same = lambda a, b: all(torch.equal(x, y) for x, y in zip(a, b))  # noqa: E731
    return {"repeat": same(grads[0], grads[1]), "one_thread": same(grads[0], grads[2])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--against", type=Path, help="another version of update_attention.c, timed as a third side")
    ap.add_argument("--emulated", action="store_true", help="build on SIMDe's AVX-512 emulation (see above)")
    args = ap.parse_args()
    if args.against is not None and not args.against.is_file():
        raise SystemExit(f"--against {args.against}: no such file; git show REV:rlvr/cpu/update_attention.c > FILE")

    from rlvr.cpu import update_attention as ua
    from rlvr.models.shared_prefix import use_kernel

    sides = {"compiled": _build(ua.SOURCE, args.emulated) if args.emulated else ua.kernel()[0], "torch": None}
    if sides["compiled"] is None:
        raise SystemExit(f"no compiled update attention here: {ua.why_not} (--emulated runs its C on SIMDe)")
    if args.against is not None:
        sides["against"] = _build(args.against, args.emulated)
    bits = {side: _same_bits(fn, next(iter(SHAPES.values()))) for side, fn in sides.items() if fn is not None}
    rows = {}
    for name, spec in SHAPES.items():
        q, k, v, masks, lengths, T = _inputs(spec)
        run = _call(q, k, v, masks, lengths, T, spec["G"])
        times = {(side, bwd): [] for side in sides for bwd in (False, True)}
        for i in range(args.warmup + args.rounds):
            order = list(sides.items())
            for side, fn in order[i % len(order) :] + order[: i % len(order)]:
                use_kernel(fn)
                for bwd in (False, True):
                    t = _time(run, (q, k, v), bwd)
                    if i >= args.warmup:
                        times[side, bwd].append(t)
        use_kernel(None)
        med = {
            f"{side} {'forward + backward' if bwd else 'forward'}": statistics.median(t)
            for (side, bwd), t in times.items()
        }
        rows[name] = dict(positions=q.shape[2], longest=T, **{k: round(v * 1e3, 3) for k, v in med.items()})
    cap = torch.backends.cpu.get_cpu_capability()
    emulated = " (compiled sides on SIMDe's emulation: not the hardware's speed)" if args.emulated else ""
    print(f"{cap}, {torch.get_num_threads()} threads, bf16 autocast: one layer's attention, ms (medians){emulated}")
    cols = [f"{side} {part}" for part in ("forward", "forward + backward") for side in sides]
    print(f"| shape | positions | {' | '.join(cols)} |")
    print("| --- | --- |" + " --- |" * len(cols))
    for name, r in rows.items():
        print(f"| {name} | {r['positions']} | " + " | ".join(str(r[c]) for c in cols) + " |")
    for side, b in bits.items():
        print(f"{side}: gradients bit-identical on a repeat: {b['repeat']}, at 1 thread: {b['one_thread']}")
    tag = "-emulated" if args.emulated else ""
    out = RESULTS / f"update_attention-{cap}{tag}-{datetime.date.today()}.json"
    body = dict(
        date=str(datetime.date.today()),
        cpu_capability=cap,
        threads=torch.get_num_threads(),
        rounds=args.rounds,
        emulated=args.emulated,
        against=str(args.against) if args.against else None,
        same_bits=bits,
    )
    out.write_text(json.dumps(dict(body, shapes=rows), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
