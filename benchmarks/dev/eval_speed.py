"""How long greedy evaluation of N arithmetic problems takes (the cost of eval.at_start / eval.at_end).

    .venv/bin/python benchmarks/dev/eval_speed.py [--model smollm2-135m-instruct] [--limit 200] [--batch 64]

Uses the quickstart's prompt (r1 template, assistant prefix '<think>', 64 new tokens) and prints
one JSON line: problems, seconds, problems/s, accuracy, and the 1-minute load average before and
after (other processes on the machine slow it down; the number says how busy it was).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--limit", type=int, default=200)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--dtype", default="bfloat16")
    args = p.parse_args()

    from rlvr.commands.common import quiet_libraries
    from rlvr.evaluation import PromptStyle, evaluate, load_eval_rows
    from rlvr.evaluation import loading as eval_models
    from rlvr.rollout import HFRolloutEngine

    quiet_libraries()
    rows = load_eval_rows("arithmetic", limit=args.limit)
    model, tok = eval_models.load(eval_models.resolve(args.model), dtype=args.dtype, device="cpu")
    engine = HFRolloutEngine(model, tok, max_new_tokens=args.max_new_tokens, dtype=args.dtype, batch_seqs=args.batch)
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    result = evaluate(
        engine,
        tok,
        rows,
        style=PromptStyle("r1", assistant_prefix="<think>"),
        max_new_tokens=args.max_new_tokens,
        batch_prompts=args.batch,
    )
    seconds = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "model": args.model,
                "problems": len(rows),
                "seconds": round(seconds, 1),
                "problems_per_s": round(len(rows) / seconds, 2),
                "accuracy": result.summary["accuracy"],
                "accuracy_lenient": result.summary["accuracy_lenient"],
                "threads": torch.get_num_threads(),
                "cpus": os.cpu_count(),
                "load_before": load_before,
                "load_after": os.getloadavg()[0],
            }
        )
    )


if __name__ == "__main__":
    main()
