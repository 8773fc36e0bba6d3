"""The fused, chunked LM-head log-probs (``rlvr.models.forward.pass_logprobs``) against the full logits.

Three measurements, each variant in a fresh process so that one's memory does not hide another's:

- ``memory``: the peak RSS an update micro-batch adds (forward + backward of the log-probs, and a
  no-grad pass) on a tiny Qwen2-shaped model with a 151,936-word vocabulary, 8 rows × 512 response
  tokens: the full path holds the [8, 512, V] logits (2.5 GB in float32) and their gradient.
- ``speed``: the update's forward + backward over a quickstart-shaped micro-batch (built-in
  SmolLM2-135M, 1 prompt × G 8) with the fused head or the full logits, the
  prompt shared or not, float32 or bf16 autocast.
- ``sharing``: the shared prompt's pass against the plain pass over prompt lengths, for the cost
  rule of ``rlvr.models.forward.prompt_sharing_pays`` (the break-even prompt length per micro-batch).

Run by hand: ``python benchmarks/dev/fused_logprobs.py [--threads=N] [memory|speed|sharing ...]`` (all
three by default); writes ``benchmarks/results/fused_logprobs-<CPU capability>-<date>-<parts>.json``.
On cores that other processes share, ``--threads=1`` and the CPU times are the steadier measure:
with two threads, one waits (spinning, which counts as CPU time) whenever the other is descheduled.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parents[1] / "results"


def _peak_rss_bytes() -> int:
    """The process's RSS high-water mark (VmHWM), bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


def _rss_bytes() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux: ``echo 5 > /proc/self/clear_refs``); False if refused."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def memory_child(fused: bool, grad: bool, rows: int = 8, T: int = 512, prompt: int = 16) -> dict:
    """One pass in this process: the peak RSS it adds over the RSS before it."""
    from rlvr.models.forward import pass_logprobs
    from rlvr.models.tiny import tiny_qwen2

    torch.manual_seed(0)
    model = tiny_qwen2(vocab_size=151936, hidden_size=64, intermediate_size=128, max_position_embeddings=1024)
    V = model.config.vocab_size
    ids = torch.randint(2, V, (rows, prompt + T))
    am = torch.ones_like(ids)
    tokens = ids[:, prompt:]
    # warm up the kernels on a small batch first, so the measured peak is the pass's own
    small = ids[:2, : prompt + 8]
    with torch.no_grad():
        pass_logprobs(model, small, torch.ones_like(small), small[:, prompt:], fused=fused)
    before = _rss_bytes()
    reset = _reset_peak_rss()
    t0 = time.perf_counter()
    with contextlib.nullcontext() if grad else torch.no_grad():
        logp, ent = pass_logprobs(model, ids, am, tokens, entropy=True, fused=fused)
        if grad:
            (logp * torch.linspace(-1, 1, T)).mean().backward()
    seconds = time.perf_counter() - t0
    peak = _peak_rss_bytes()
    full_logits = rows * T * V * 4
    return dict(
        fused=fused,
        grad=grad,
        rows=rows,
        response_tokens=T,
        vocab=V,
        rss_before_gib=round(before / 2**30, 3),
        peak_growth_gib=round((peak - before) / 2**30, 3),
        full_logits_fp32_gib=round(full_logits / 2**30, 3),
        peak_reset=reset,
        seconds=round(seconds, 2),
    )


def memory() -> list[dict]:
    out = []
    for grad in (True, False):
        for fused in (True, False):
            cmd = [sys.executable, __file__, "_memory_child", str(int(fused)), str(int(grad))]
            res = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
            print("memory", res, flush=True)
            out.append(res)
    return out


def _quickstart_batch(model, P: int, G: int, prompt_len: int, T: int):
    torch.manual_seed(0)
    V = model.config.vocab_size
    prompts = torch.randint(100, V, (P, prompt_len)).repeat_interleave(G, 0)
    resp = torch.randint(100, V, (P * G, T))
    return torch.cat([prompts, resp], 1), resp


def _update_seconds(model, ids, resp, *, mb: int, group: int, fused: bool, bf16: bool) -> tuple[float, float]:
    """(wall, CPU) seconds of the policy loss's forward + backward over the batch, micro-batch by
    micro-batch. The CPU time (all threads of this process) is the steadier of the two on a machine
    whose cores other processes share: it counts this process's work, not its waiting."""
    from rlvr import algos
    from rlvr.models.forward import pass_logprobs

    B, T = resp.shape
    am, adv, mask = torch.ones_like(ids), torch.randn(B), torch.ones(B, T)
    model.zero_grad(set_to_none=True)
    ctx = torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()
    t0, c0 = time.perf_counter(), time.process_time()
    for s in range(0, B, mb):
        rows = slice(s, s + mb)
        with ctx:
            kw = dict(entropy=True, group_size=group, fused=fused)
            logp, ent = pass_logprobs(model, ids[rows], am[rows], resp[rows], **kw)
        loss_tok, _ = algos.policy_loss(logp, logp.detach(), adv[rows], mask[rows], clip_low=0.2, clip_high=0.2)
        algos.aggregate(loss_tok, mask[rows], mode=algos.LossAgg.TOKEN_MEAN, num_tokens=mask.sum()).backward()
    return time.perf_counter() - t0, time.process_time() - c0


def speed(P: int = 1, G: int = 8, prompt_len: int = 126, T: int = 48, mb: int = 8, repeats: int = 3) -> dict:
    """One micro-batch of the quickstart's update (a ~126-token prompt, ≤ 48-token responses; the
    update runs four such) in each variant, the variants interleaved so that load from other
    processes spreads over all of them."""
    import rlvr.models.forward as fwd
    from rlvr.models import load_model, resolve_model_path

    model = load_model(resolve_model_path("smollm2-135m-instruct"))
    model.train()
    ids, resp = _quickstart_batch(model, P, G, prompt_len, T)
    saved = dict(fwd.SHARED_PROMPT_PASS_COST_TOKENS)
    fwd.SHARED_PROMPT_PASS_COST_TOKENS["cpu"] = 0  # "shared" variants share whatever the rule says
    name = lambda group, fused, bf16: "_".join(  # noqa: E731
        ["fused" if fused else "full", "shared" if group > 1 else "plain", "bf16" if bf16 else "fp32"]
    )
    variants = [
        (name(group, fused, bf16), group, fused, bf16)
        for bf16 in (False, True)
        for group in (G, 1)
        for fused in (True, False)
    ]
    times: dict[str, list[tuple[float, float]]] = {name: [] for name, *_ in variants}
    try:
        for _ in range(repeats):
            for name, group, fused, bf16 in variants:
                times[name].append(_update_seconds(model, ids, resp, mb=mb, group=group, fused=fused, bf16=bf16))
                print("speed", name, [round(t, 2) for t in times[name][-1]], flush=True)
    finally:
        fwd.SHARED_PROMPT_PASS_COST_TOKENS.update(saved)
    return {
        "batch": dict(P=P, G=G, prompt_len=prompt_len, T=T, micro_batch_seqs=mb),
        "wall_seconds": {k: [round(w, 2) for w, _ in v] for k, v in times.items()},
        "cpu_seconds": {k: [round(c, 2) for _, c in v] for k, v in times.items()},
        "median_cpu_seconds": {k: round(statistics.median(c for _, c in v), 2) for k, v in times.items()},
    }


def sharing(G: int = 8, T: int = 48, mb: int = 8, prompt_lens=(2, 8, 16, 32, 126), repeats: int = 3) -> dict:
    """One micro-batch's fused update pass, shared prompt against plain, over prompt lengths."""
    import rlvr.models.forward as fwd
    from rlvr.models import load_model, resolve_model_path

    model = load_model(resolve_model_path("smollm2-135m-instruct"))
    model.train()
    saved = dict(fwd.SHARED_PROMPT_PASS_COST_TOKENS)
    fwd.SHARED_PROMPT_PASS_COST_TOKENS["cpu"] = 0
    out = {}
    try:
        for bf16 in (False, True):
            for Lp in prompt_lens:
                ids, resp = _quickstart_batch(model, 1, G, Lp, T)
                t = {"shared": [], "plain": []}
                for _ in range(repeats):
                    for name, group in (("shared", G), ("plain", 1)):
                        t[name].append(_update_seconds(model, ids, resp, mb=mb, group=group, fused=True, bf16=bf16)[1])
                key = f"{'bf16' if bf16 else 'fp32'}_prompt{Lp}"
                out[key] = {f"{k}_cpu_s": round(statistics.median(v), 3) for k, v in t.items()}
                out[key]["saved_positions"] = (mb - mb // G) * (Lp - 1)
                print("sharing", key, out[key], flush=True)
    finally:
        fwd.SHARED_PROMPT_PASS_COST_TOKENS.update(saved)
    return {"batch": dict(G=G, T=T, micro_batch_seqs=mb), "passes": out}


def main(which: list[str]) -> None:
    cap = torch.backends.cpu.get_cpu_capability()
    results = {
        "cpu_capability": cap,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "note": "2 cores shared with other engineers' test runs and benchmarks: times are noisy",
    }
    for name in which:
        results[name] = {"memory": memory, "speed": speed, "sharing": sharing}[name]()
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"fused_logprobs-{cap}-{datetime.date.today()}-{'-'.join(which)}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    print("wrote", path)


if __name__ == "__main__":
    if sys.argv[1:2] == ["_memory_child"]:
        print(json.dumps(memory_child(bool(int(sys.argv[2])), bool(int(sys.argv[3])))))
    else:
        args = [a for a in sys.argv[1:] if not a.startswith("--threads=")]
        for a in sys.argv[1:]:
            if a.startswith("--threads="):
                torch.set_num_threads(int(a.partition("=")[2]))
        main(args or ["memory", "speed", "sharing"])
