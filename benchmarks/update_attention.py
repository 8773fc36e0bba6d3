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

    python benchmarks/update_attention.py --rounds 30

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

RESULTS = Path(__file__).resolve().parent / "results"
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    args = ap.parse_args()

    from rlvr.cpu import update_attention_kernel
    from rlvr.models.shared_prefix import use_kernel

    kernel, why = update_attention_kernel()
    if kernel is None:
        raise SystemExit(f"no compiled update attention here: {why}")
    rows = {}
    for name, spec in SHAPES.items():
        q, k, v, masks, lengths, T = _inputs(spec)
        run = _call(q, k, v, masks, lengths, T, spec["G"])
        times = {(side, bwd): [] for side in ("compiled", "torch") for bwd in (False, True)}
        for i in range(args.warmup + args.rounds):
            for side, fn in (
                (("compiled", kernel), ("torch", None)) if i % 2 else (("torch", None), ("compiled", kernel))
            ):
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
    print(f"{cap}, {torch.get_num_threads()} threads, bf16 autocast: one layer's attention, ms (medians)")
    print("| shape | positions | torch forward | compiled forward | torch fwd + bwd | compiled fwd + bwd |")
    print("| --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        print(
            f"| {name} | {r['positions']} | {r['torch forward']} | {r['compiled forward']} | "
            f"{r['torch forward + backward']} | {r['compiled forward + backward']} |"
        )
    out = RESULTS / f"update_attention-{cap}-{datetime.date.today()}.json"
    body = dict(
        date=str(datetime.date.today()), cpu_capability=cap, threads=torch.get_num_threads(), rounds=args.rounds
    )
    out.write_text(json.dumps(dict(body, shapes=rows), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
