"""Time one GRPO update (forward + backward over a rollout batch) on the built-in model.

Compares the plain per-row forward with the shared-prompt forward, in float32 and under bf16
autocast, and checks that the bf16 gradient stays close to the float32 one.
Run by hand: `python benchmarks/dev/update_speed.py` (writes benchmarks/results/update_speed.json).
"""

from __future__ import annotations

import contextlib
import json
import time
from pathlib import Path

import torch

from rlvr import algos
from rlvr.models import load_model, load_tokenizer, resolve_model_path
from rlvr.models.forward import response_logits


def main(P: int = 4, G: int = 8, prompt_len: int = 126, T: int = 64, mb: int = 8) -> None:
    path = resolve_model_path("smollm2-135m-instruct")
    model = load_model(path)
    load_tokenizer(path)
    torch.manual_seed(0)
    V = model.config.vocab_size
    prompts = torch.randint(100, V, (P, prompt_len)).repeat_interleave(G, 0)
    resp = torch.randint(100, V, (P * G, T))
    ids = torch.cat([prompts, resp], 1)
    am = torch.ones_like(ids)
    adv = torch.randn(P * G)
    mask = torch.ones(P * G, T)
    results = {
        "batch": dict(P=P, G=G, prompt_len=prompt_len, T=T, micro_batch_seqs=mb),
        "threads": torch.get_num_threads(),
    }
    grads = {}
    for name, group, bf16 in [("plain_fp32", 1, False), ("shared_fp32", G, False), ("shared_bf16_autocast", G, True)]:
        model.zero_grad(set_to_none=True)
        ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
        t0 = time.perf_counter()
        for s in range(0, P * G, mb):
            rows = slice(s, s + mb)
            with ctx:
                logits = response_logits(model, ids[rows], am[rows], T, group_size=min(group, mb))
            logp = algos.token_logprobs(logits, resp[rows])
            loss_tok, _ = algos.policy_loss(logp, logp.detach(), adv[rows], mask[rows], clip_low=0.2, clip_high=0.2)
            algos.aggregate(loss_tok, mask[rows], mode=algos.LossAgg.TOKEN_MEAN, num_tokens=mask.sum()).backward()
        dt = time.perf_counter() - t0
        grads[name] = torch.cat([p.grad.flatten() for p in model.parameters()])
        results[name] = {"seconds": round(dt, 2), "tokens_per_s": round(P * G * (prompt_len + T) / dt, 1)}
        print(name, results[name], flush=True)
    ref = grads["plain_fp32"].double()  # float32 sums over 134M elements round the cosine of g with itself to 1.03
    for name, g in grads.items():
        g = g.double()
        rel = ((g - ref).norm() / ref.norm()).item()
        cos = torch.nn.functional.cosine_similarity(g, ref, dim=0).item()
        results[name].update(grad_rel_err_vs_plain_fp32=rel, grad_cosine_vs_plain_fp32=cos)
        print(name, "rel err", rel, "cos", cos)
    out = Path(__file__).resolve().parents[1] / "results" / "update_speed.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
