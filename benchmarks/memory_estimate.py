"""Calibrate rlvr/estimate/peak.py's activation factors: the bytes autograd saves for one update micro-batch.

Sums the storages that ``saved_tensors_hooks`` sees during the built-in model's forward pass
(parameters excluded; autocast's bf16 weight copies included), and prints them per token x layer x
hidden, next to the logits. Measured with SmolLM2-135M, micro-batch 8, 126 prompt + 48 response
tokens: the plain per-row pass saves 77.7 B per token x layer x hidden in fp32 (19.4 fp32 tensors
of hidden size: rlvr.estimate's 9 x hidden + 4 x intermediate, intermediate = 2.67 x hidden) and
64.2 B under bf16 autocast; the shared-prompt pass adds the prompt's key/values repeated to each row.
Run by hand: `python benchmarks/memory_estimate.py`.
"""

from __future__ import annotations

import contextlib

import torch

from rlvr import algos
from rlvr.models import load_model, resolve_model_path
from rlvr.models.forward import response_logits
from rlvr.models.loading import set_checkpointing


def saved_bytes(model, mb: int, G: int, Lp: int, T: int, *, bf16: bool, checkpointing: bool = False) -> dict:
    if checkpointing:
        set_checkpointing(model)
    else:
        set_checkpointing(model, False)
    model.train()
    V, P = model.config.vocab_size, max(1, mb // G)
    ids = torch.cat([torch.randint(100, V, (P, Lp)).repeat_interleave(mb // P, 0), torch.randint(100, V, (mb, T))], 1)
    seen: dict[int, int] = {}

    def pack(t):
        s = t.untyped_storage()
        seen[s.data_ptr()] = s.nbytes()
        return t

    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with ctx:
            logits = response_logits(model, ids, torch.ones_like(ids), T, group_size=G)
        model_saved = sum(v for k, v in seen.items() if k not in params)
        algos.token_logprobs(logits, ids[:, -T:])
    logprob_saved = sum(v for k, v in seen.items() if k not in params) - model_saved
    L, H = model.config.num_hidden_layers, model.config.hidden_size
    tokens = mb * (Lp + T) if G == 1 or checkpointing else P * Lp + mb * T
    return {
        "model_saved_mib": model_saved / 2**20,
        "logprob_saved_mib": logprob_saved / 2**20,
        "logits_mib": logits.untyped_storage().nbytes() / 2**20,
        "bytes_per_token_layer_hidden": model_saved / (L * tokens * H),
    }


def main() -> None:
    torch.set_num_threads(1)
    model = load_model(resolve_model_path("smollm2-135m-instruct"))
    for mb, G, bf16, ckpt in [
        (8, 1, False, False),
        (8, 1, True, False),
        (8, 8, False, False),
        (8, 8, True, False),
        (8, 1, False, True),
    ]:
        got = saved_bytes(model, mb, G, 126, 48, bf16=bf16, checkpointing=ckpt)
        print(
            f"micro-batch {mb}, shared by {G}, bf16 autocast {bf16}, checkpointing {ckpt}: "
            + ", ".join(f"{k} {v:.1f}" for k, v in got.items()),
            flush=True,
        )


if __name__ == "__main__":
    main()
