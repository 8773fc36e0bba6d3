"""Profile one quickstart-shaped update on this CPU: time by phase and by operator (issue 41, item 1).

One micro-batch of the quickstart's update on the built-in model: 8 rows of one group (G = 8) with a
126-token prompt and 48-token responses, the update's own forward (``pass_logprobs``: shared prompt,
fused LM head), a token-mean loss of the log-probs, its backward, and a fused AdamW step. Phases are
marked with ``torch.profiler.record_function``; operators are ranked by self CPU time. The first
repeat warms up (allocator, oneDNN primitives) and is left out.

    .venv/bin/python benchmarks/dev/profile_update.py                 # fp32
    .venv/bin/python benchmarks/dev/profile_update.py --bf16          # under bf16 autocast
    .venv/bin/python benchmarks/dev/profile_update.py --packed        # the trainer's fp32 path on AVX-512

``--packed`` multiplies by oneDNN-prepacked weights (:class:`rlvr.cpu.packed.PackedLinears`, repacked
after each optimizer step), as the trainer does in fp32 where ``packed_training_pays()``; without it
the products run MKL's sgemm.

Writes benchmarks/results/profile_update-<capability>-<precision>-<date>.json and prints two tables.
Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, record_function

from rlvr.cpu.packed import PackedLinears
from rlvr.models import load_model, resolve_model_path
from rlvr.models.forward import pass_logprobs

RESULTS = Path(__file__).resolve().parents[1] / "results"
PHASES = ("forward + log-probs", "backward", "AdamW step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast in the update")
    ap.add_argument("--packed", action="store_true", help="oneDNN-prepacked linears (the trainer's fp32 path)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--prompt", type=int, default=126)
    ap.add_argument("--response", type=int, default=48)
    ap.add_argument("--rows", type=int, default=8)
    ap.add_argument("--tag", default="", help="added to the results file's name")
    args = ap.parse_args()

    model = load_model(resolve_model_path("smollm2-135m-instruct"))
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    torch.manual_seed(0)
    V, G = model.config.vocab_size, args.rows
    ids = torch.cat(
        [torch.randint(100, V, (1, args.prompt)).repeat(G, 1), torch.randint(100, V, (G, args.response))], 1
    )
    mask = torch.ones_like(ids)
    tokens = ids[:, args.prompt :]
    autocast = torch.autocast("cpu", dtype=torch.bfloat16) if args.bf16 else contextlib.nullcontext()
    packs = PackedLinears(model, train=True) if args.packed else None
    if packs is not None:
        packs.watch(opt)
    active = packs.active if packs is not None else contextlib.nullcontext

    def one_update() -> None:
        with active():
            with record_function(PHASES[0]), autocast:
                logp, _ = pass_logprobs(model, ids, mask, tokens, entropy=True, group_size=G)
                loss = -logp.mean()
            with record_function(PHASES[1]):
                loss.backward()
            with record_function(PHASES[2]):
                opt.step()
                opt.zero_grad(set_to_none=True)

    one_update()  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(args.repeats):
            one_update()
    events = prof.key_averages()
    n = args.repeats
    phases = {e.key: e.cpu_time_total / n / 1e6 for e in events if e.key in PHASES}
    total = sum(phases.values())
    ops = sorted((e for e in events if e.key not in PHASES), key=lambda e: e.self_cpu_time_total, reverse=True)
    top = [
        {"op": e.key, "self_s": e.self_cpu_time_total / n / 1e6, "calls": e.count // n, "share": 0.0} for e in ops[:25]
    ]
    self_total = sum(e.self_cpu_time_total for e in ops) / n / 1e6
    for row in top:
        row["share"] = row["self_s"] / self_total if self_total else 0.0
    capability = torch.backends.cpu.get_cpu_capability()
    result = {
        "date": datetime.date.today().isoformat(),
        "cpu_capability": capability,
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "precision": "bf16 autocast" if args.bf16 else "fp32",
        "products": "oneDNN prepacked" if args.packed else "MKL sgemm (F.linear)",
        "batch": {"rows": G, "group_size": G, "prompt": args.prompt, "response": args.response},
        "repeats": n,
        "phases_s": phases,
        "update_s": total,
        "ops_self_s_total": self_total,
        "top_ops": top,
    }
    RESULTS.mkdir(exist_ok=True)
    tag = ("bf16" if args.bf16 else "fp32") + ("-packed" if args.packed else "") + (f"-{args.tag}" if args.tag else "")
    out = RESULTS / f"profile_update-{capability}-{tag}-{result['date']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{capability}, {result['threads']} threads, {result['precision']}: one micro-batch update {total:.2f} s")
    print("| phase | s | share |\n| --- | --- | --- |")
    for k in PHASES:
        print(f"| {k} | {phases.get(k, 0.0):.3f} | {phases.get(k, 0.0) / total:.0%} |")
    print("\n| operator (self time) | s | calls | share |\n| --- | --- | --- | --- |")
    for row in top[:15]:
        print(f"| {row['op']} | {row['self_s']:.3f} | {row['calls']} | {row['share']:.0%} |")
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
