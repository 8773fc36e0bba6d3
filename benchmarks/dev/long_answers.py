"""Time the update on quickstart-shaped batches where a few answers are much longer than the rest.

An answer that runs to the token limit among short ones (the quickstart's early steps have one in
most steps) used to pad every segment of the grouped attention kernel to its length, and every group
of an unpadded micro-batch to the longest group's summed lengths. This times, in one process and
interleaved (so a slow spell of a shared VM hits every side alike), one ``update_policy`` on:

- ``all 17``: 32 answers of 17 tokens (4 prompts of 126 x G 8), the reference;
- ``one 48``: the same with one answer of 48 (one group 31 positions longer);
- ``48 same sums``: one answer of 48 in a group whose other answers are shorter, so every group sums
  to 136 (only the attention's padding differs from ``all 17``);
- ``two ~31``: two answers of 30 and 32 in two groups;

each with the CPU attention's core length on (``shared_prefix.core_length``, the default) and off
(padded to the longest), under bf16 autocast (``--fp32``: without). Random token ids, the built-in
model, the quickstart's config (one pass of 32 rows, shared prompt, answers unpadded).

    python benchmarks/dev/long_answers.py --rounds 8

Writes benchmarks/results/long_answers-<capability>-<precision>-<date>.json and prints a table.
Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import json
import statistics
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "results"
PROMPT, P, G = 126, 4, 8
CASES = {
    "all 17": [17] * 32,
    "one 48": [17] * 31 + [48],
    "48 same sums": [48, 12, 12, 12, 13, 13, 13, 13] + [17] * 24,
    "two ~31": [17] * 15 + [32] + [17] * 15 + [30],
}


def batch(lengths: list[int], vocab: int):
    """P prompts of PROMPT tokens x G answers of ``lengths`` (right-padded), random ids."""
    from rlvr.rollout import RolloutBatch

    g = torch.Generator().manual_seed(0)
    T, rlen = max(lengths), torch.tensor(lengths)
    ids = torch.randint(100, vocab, (P * G, PROMPT + T), generator=g)
    ids[:, :PROMPT] = torch.randint(100, vocab, (P, PROMPT), generator=g).repeat_interleave(G, 0)
    mask = (torch.arange(PROMPT + T) < PROMPT + rlen[:, None]).long()
    return RolloutBatch(
        input_ids=ids * mask,
        attention_mask=mask,
        response_mask=mask[:, PROMPT:].clone(),
        prompt_len=PROMPT,
        texts=[""] * (P * G),
        truncated=rlen == T,
        group_size=G,
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8, help="timed rounds (every case and side once each)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--fp32", action="store_true", help="float32 (default: bf16 autocast, as `auto` on AVX-512)")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    from rlvr.config import load_config
    from rlvr.models import load_model, resolve_model_path, shared_prefix
    from rlvr.training.loop import update_policy

    model = load_model(resolve_model_path("smollm2-135m-instruct"))
    cfg = load_config("quickstart", ["rollout.max_new_tokens=48", f"train.prompts_per_step={P}"])
    if not args.fp32:  # as the trainer applies it under autocast
        cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, micro_batch_seqs=cfg.train.micro_batch_seqs_bf16)
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    autocast = contextlib.nullcontext if args.fp32 else (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    adv = torch.randn(P * G, generator=torch.Generator().manual_seed(1))
    batches = {name: batch(lengths, model.config.vocab_size) for name, lengths in CASES.items()}
    core_length = shared_prefix.core_length
    times = {(name, on): [] for name in CASES for on in (True, False)}
    for i in range(args.warmup + args.rounds):
        for name, b in batches.items():
            for on in (True, False) if i % 2 else (False, True):  # alternate which side runs first
                shared_prefix.core_length = core_length if on else (lambda Lp, T, *_: T)
                t0 = time.perf_counter()
                update_policy(model, opt, sched, b, adv, None, None, cfg, autocast)
                if i >= args.warmup:
                    times[(name, on)].append(time.perf_counter() - t0)
        shared_prefix.core_length = core_length
    ref = statistics.median(times[("all 17", True)])
    rows = []
    for name, lengths in CASES.items():
        on, off = (statistics.median(times[(name, side)]) for side in (True, False))
        c = core_length(PROMPT - 1, max(lengths), tuple(lengths), P, not args.fp32)
        rows.append(dict(case=name, core_length=c, on_s=on, off_s=off, on_over_off=on / off, on_over_all17=on / ref))
    precision = "fp32" if args.fp32 else "bf16"
    print(f"{torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, {precision}: one update, s")
    print("| case | core length | core on | core off | on / off | on / all 17 |\n| --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(
            f"| {r['case']} | {r['core_length']} | {r['on_s']:.3f} | {r['off_s']:.3f} | "
            f"{r['on_over_off']:.3f} | {r['on_over_all17']:.3f} |"
        )
    tag = f"-{args.tag}" if args.tag else ""
    cap = torch.backends.cpu.get_cpu_capability()
    out = RESULTS / f"long_answers-{cap}-{precision}{tag}-{datetime.date.today()}.json"
    body = dict(
        date=str(datetime.date.today()),
        cpu_capability=torch.backends.cpu.get_cpu_capability(),
        threads=torch.get_num_threads(),
        precision=precision,
        rounds=args.rounds,
        rows=rows,
        times={f"{k[0]} / core {'on' if k[1] else 'off'}": v for k, v in times.items()},
    )
    out.write_text(json.dumps(body, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
