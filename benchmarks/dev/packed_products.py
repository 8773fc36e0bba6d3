"""The linear products of one decode step: PyTorch's ``F.linear`` against oneDNN-prepacked weights.

    .venv/bin/python benchmarks/dev/packed_products.py                 # the built-in model's shapes
    ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        .venv/bin/python benchmarks/dev/packed_products.py

What ``rlvr.cpu.packed`` rests on. For SmolLM2-135M's shapes (30 layers x q, k, v, o, gate,
up, down, and the 49,152 x 576 LM head; random float32 weights, 538 MB in all, far larger than
the caches, so every step streams them from memory as a decode step does) it times the 211
products of one decode step at 16, 8, 4 and 1 rows, best of ``--repeats`` steps, with
``F.linear`` (MKL) and with ``torch.ops.mkldnn._linear_pointwise`` on weights reordered once by
``_reorder_linear_weight``; and one 1,024-row product per kind (an update micro-batch's size).
It checks that both give the same products (to float rounding) before timing them.

Writes ``benchmarks/results/packed_products-<capability>-<date>.json`` (``--out`` to change) and
prints a table. Nothing else should run on the machine: the times are the point.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # roofline.py, in benchmarks/
from roofline import _best, write_report  # noqa: E402

from rlvr.cpu.packed import pack_weight, packed_linear  # noqa: E402

H, I, KV, V, LAYERS = 576, 1536, 192, 49152, 30  # SmolLM2-135M
SHAPES = [(H, H), (KV, H), (KV, H), (H, H), (I, H), (I, H), (H, I)]  # (out, in) of q, k, v, o, gate, up, down


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.manual_seed(0)
    layers = [[torch.randn(o, i) * 0.02 for o, i in SHAPES] for _ in range(LAYERS)]
    head = torch.randn(V, H) * 0.02
    weights = [w for layer in layers for w in layer] + [head]
    packed = [pack_weight(w, 16) for w in weights]
    for w, p in zip(weights[:7] + [head], packed[:7] + [packed[-1]]):  # the same products, to float rounding
        x = torch.randn(16, w.shape[1])
        torch.testing.assert_close(packed_linear(x, p), F.linear(x, w), atol=1e-4, rtol=1e-4)

    def step(rows: int, kind: str):
        xs = {H: torch.randn(rows, H), I: torch.randn(rows, I)}
        ws = packed if kind == "onednn_packed" else weights
        mul = packed_linear if kind == "onednn_packed" else F.linear
        return lambda: [mul(xs[w.shape[1]], p) for w, p in zip(weights, ws)]

    decode = {}
    for rows in (16, 8, 4, 1):
        decode[rows] = {kind: _best(step(rows, kind), args.repeats) for kind in ("linear", "onednn_packed")}
    x, gate = torch.randn(1024, H), layers[0][4]
    gate_packed = pack_weight(gate, 1024)
    big = {
        "linear": 2 * 1024 * H * I / _best(lambda: F.linear(x, gate), args.repeats),
        "onednn_packed": 2 * 1024 * H * I / _best(lambda: packed_linear(x, gate_packed), args.repeats),
    }
    lines = ["| rows | F.linear (ms) | oneDNN packed (ms) | speed-up |", "| --- | --- | --- | --- |"]
    for rows, t in decode.items():
        lines.append(
            f"| {rows} | {t['linear'] * 1e3:.1f} | {t['onednn_packed'] * 1e3:.1f} | "
            f"{t['linear'] / t['onednn_packed']:.2f}x |"
        )
    table = "\n".join(lines)
    mb = sum(w.numel() * 4 for w in weights) / 1e6
    report, out = write_report(
        "packed_products",
        {
            "weights_mb": mb,
            "decode_step_seconds": {str(r): t for r, t in decode.items()},
            "gflops_1024_rows_576x1536": {k: v / 1e9 for k, v in big.items()},
            "table": table,
        },
        args.out,
    )
    print(
        f"{report['machine']['cpu_capability']}, {report['machine']['threads']} threads; the 211 products of one "
        f"decode step ({mb:.0f} MB of float32 weights):\n\n{table}\n\n1,024 rows x 576 -> 1536: "
        f"F.linear {big['linear'] / 1e9:.0f} GFLOP/s, oneDNN packed {big['onednn_packed'] / 1e9:.0f} GFLOP/s\n"
        f"wrote {out}"
    )


if __name__ == "__main__":
    main()
