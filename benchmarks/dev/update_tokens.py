"""Time the update and the log-prob pass of a quickstart-shaped batch: row micro-batches against
token-budget micro-batches (``train.micro_batch_tokens``), on the built-in model.

The batch: ``--prompts`` (default 2) prompts x 8 samples, prompts of 110 to 126 tokens
(left-padded to 126, the quickstart's longest), responses of 12 to 48 tokens; random token ids
(speed does not depend on them), fp32, the plain model (no packed CPU weights). Each side runs
``accumulate_gradients`` (one update's forward + backward) and ``batch_logprobs`` (a no-grad pass)
through rlvr's loop, in rounds over all sides, the best of ``--repeats`` rounds. Run by hand:
`python benchmarks/dev/update_tokens.py` (writes benchmarks/results/update_tokens-<cpu>-<threads>t.json).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from pathlib import Path

import torch

from rlvr.config import load_config
from rlvr.models import load_model, resolve_model_path
from rlvr.rollout import RolloutBatch
from rlvr.training.loop import accumulate_gradients, batch_logprobs, update_passes

SIDES = {
    "rows 8, shared prompt (quickstart default)": ["train.micro_batch_seqs=8"],
    "rows 8, per-row prompt": ["train.micro_batch_seqs=8", "train.shared_prompt_forward=false"],
    "tokens 640": ["train.micro_batch_tokens=640", "train.shared_prompt_forward=false"],
    "tokens 1280": ["train.micro_batch_tokens=1280", "train.shared_prompt_forward=false"],
    "tokens 2560": ["train.micro_batch_tokens=2560", "train.shared_prompt_forward=false"],
}


def quickstart_batch(V: int, *, P: int = 4, G: int = 8, prompt_len: int = 126, T: int = 48, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    B = P * G
    plen = torch.randint(110, prompt_len + 1, (P,), generator=g).repeat_interleave(G)
    rlen = torch.randint(12, T + 1, (B,), generator=g)
    ids = torch.randint(100, V, (B, prompt_len + T), generator=g)
    prompts = torch.randint(100, V, (P, prompt_len), generator=g).repeat_interleave(G, 0)
    ids[:, :prompt_len] = prompts
    cols = torch.arange(prompt_len + T)
    am = ((cols >= prompt_len - plen[:, None]) & (cols < prompt_len + rlen[:, None])).long()
    ids = ids * am  # padding id 0
    return RolloutBatch(
        input_ids=ids,
        attention_mask=am,
        response_mask=am[:, prompt_len:].clone(),
        prompt_len=prompt_len,
        texts=[""] * B,
        truncated=rlen == T,
        group_size=G,
    )


def main(repeats: int, threads: int, P: int) -> None:
    torch.set_num_threads(threads)
    model = load_model(resolve_model_path("smollm2-135m-instruct"))
    batch = quickstart_batch(model.config.vocab_size, P=P)
    adv = torch.randn(batch.input_ids.shape[0], generator=torch.Generator().manual_seed(1))
    tokens = int(batch.attention_mask.sum())
    results = {
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "threads": torch.get_num_threads(),
        "batch": dict(rows=batch.input_ids.shape[0], real_tokens=tokens, padded_positions=batch.input_ids.numel()),
        "sides": {},
    }
    print(results["cpu_capability"], "threads", results["threads"], results["batch"], flush=True)
    base = ["rollout.samples_per_prompt=8", f"train.prompts_per_step={P}", "rollout.max_new_tokens=48"]
    configs = {name: load_config(None, base + overrides) for name, overrides in SIDES.items()}
    times = {name: {"update": [], "logprobs": []} for name in SIDES}
    for _ in range(repeats):  # rounds over every side, so that a busy spell on a shared machine hits them alike
        for name, cfg in configs.items():
            lp = dict(
                micro_batch_seqs=cfg.train.micro_batch_seqs,
                group_size=8 if cfg.train.shared_prompt_forward else 1,
                temperature=1.0,
                autocast=contextlib.nullcontext,
                length_buckets=cfg.train.length_buckets,
                micro_batch_tokens=cfg.train.micro_batch_tokens,
            )
            model.zero_grad(set_to_none=True)
            t0 = time.perf_counter()
            accumulate_gradients(model, batch, adv, None, None, cfg, contextlib.nullcontext)
            t1 = time.perf_counter()
            batch_logprobs(model, batch, **lp)
            t2 = time.perf_counter()
            times[name]["update"].append(round(t1 - t0, 3))
            times[name]["logprobs"].append(round(t2 - t1, 3))
            print(name, times[name], flush=True)
    for name, cfg in configs.items():
        update, logprobs = times[name]["update"], times[name]["logprobs"]
        results["sides"][name] = {
            "update_s": min(update),
            "logprob_pass_s": min(logprobs),
            "update_tokens_per_s": round(tokens / min(update)),
            "passes": len(update_passes(batch, cfg, model)),
            "all_update_s": update,
            "all_logprob_pass_s": logprobs,
        }
    print(json.dumps(results, indent=2))
    out = Path(__file__).resolve().parents[1] / "results" / f"update_tokens-{results['cpu_capability']}-{threads}t.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--prompts", type=int, default=2, help="prompts per step (8 samples each)")
    args = parser.parse_args()
    main(args.repeats, args.threads, args.prompts)
