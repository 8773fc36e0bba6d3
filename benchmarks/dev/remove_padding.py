"""Time the update with and without ``train.remove_padding``, in one process, rounds interleaved.

Two batch shapes of the built-in model: ``vs_trl`` (2 prompts x G 8, 128-token prompts, responses of
12 to 128 tokens: the shape of ``benchmarks/vs_trl.py``'s long, uneven answers) and ``quickstart``
(4 prompts x G 8, prompts of 110-126 tokens, responses of 12 to 21). Each side runs
``accumulate_gradients`` + one fused AdamW step through rlvr's loop with the quickstart's config
(shared prompt, micro-batches of one group); the padded side keeps length buckets. The process
re-executes itself in the environment rlvr's command line runs in (``rlvr.cpu.runtime_env``). The
positions each side's linears compute are counted from its passes. The first round warms up and is
left out.

    .venv/bin/python benchmarks/dev/remove_padding.py [--rounds 4] [--threads 0] [--bf16] [--tag T]

Writes benchmarks/results/remove_padding-<capability>-<precision>-<date>.json and prints a table.
Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

RESULTS = Path(__file__).resolve().parents[1] / "results"
SHAPES = {"vs_trl": dict(P=2, T=128, prompt_len=128), "quickstart": dict(P=4, T=21, prompt_len=126)}


def positions(passes) -> int:
    """Token positions the linears compute over ``passes`` (a padded pass: its prompts once per group
    and every row to the pass's longest; an unpadded one: its prompts and each group's summed lengths)."""
    from rlvr.models.shared_prefix import unpadded_span

    total = 0
    for p in passes:
        rows, width = p.inputs["input_ids"].shape
        groups = rows // p.group_size
        prompt = width - p.cols - 1
        if p.unpadded is None:
            total += groups * prompt + rows * p.cols
        else:
            total += groups * prompt + sum(unpadded_span(p.unpadded[1], p.cols, p.group_size)[1])
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: PyTorch's)")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast in the update")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    from rlvr.cpu.runtime_env import reexec_with_runtime_env

    reexec_with_runtime_env()
    import torch
    from update_tokens import quickstart_batch

    from rlvr.config import load_config
    from rlvr.models import load_model, resolve_model_path
    from rlvr.training.loop import accumulate_gradients, update_passes

    if args.threads:
        torch.set_num_threads(args.threads)
    model = load_model(resolve_model_path("smollm2-135m-instruct"))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    autocast = bf16 if args.bf16 else contextlib.nullcontext
    result = {
        "date": datetime.date.today().isoformat(),
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "precision": "bf16 autocast" if args.bf16 else "fp32",
        "torch": torch.__version__,
        "shapes": {},
    }
    for name, shape in SHAPES.items():
        batch = quickstart_batch(model.config.vocab_size, **shape)
        adv = torch.randn(batch.input_ids.shape[0], generator=torch.Generator().manual_seed(1))
        base = [f"rollout.max_new_tokens={shape['T']}", f"train.prompts_per_step={shape['P']}"]
        sides = {rp: load_config("quickstart", [*base, f"train.remove_padding={rp}"]) for rp in ("false", "true")}
        times = {rp: [] for rp in sides}
        for r in range(args.rounds):
            for rp, cfg in sides.items():
                model.train()
                t0 = time.perf_counter()
                accumulate_gradients(model, batch, adv, None, None, cfg, autocast)
                opt.step()
                opt.zero_grad(set_to_none=True)
                if r:
                    times[rp].append(round(time.perf_counter() - t0, 3))
        row = {"real_tokens": int(batch.attention_mask.sum())}
        for rp, cfg in sides.items():
            passes = update_passes(batch, cfg, model)
            key = "unpadded" if rp == "true" else "padded (length buckets)"
            row[key] = {"passes": len(passes), "positions": positions(passes), "update_s": times[rp]}
            row[key]["median_s"] = statistics.median(times[rp])
        row["unpadded_over_padded"] = round(row["unpadded"]["median_s"] / row["padded (length buckets)"]["median_s"], 3)
        result["shapes"][name] = row
        print(name, json.dumps(row), flush=True)
    RESULTS.mkdir(exist_ok=True)
    precision = "bf16" if args.bf16 else "fp32"
    tag = f"-{args.tag}" if args.tag else ""
    out = RESULTS / f"remove_padding-{result['cpu_capability']}-{precision}{tag}-{result['date']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{result['cpu_capability']}, {result['threads']} threads, {result['precision']}")
    print("| batch | side | passes | positions | update s (median) |\n| --- | --- | --- | --- | --- |")
    for name, row in result["shapes"].items():
        for key in ("padded (length buckets)", "unpadded"):
            r = row[key]
            print(f"| {name} | {key} | {r['passes']} | {r['positions']} | {r['median_s']:.2f} |")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
