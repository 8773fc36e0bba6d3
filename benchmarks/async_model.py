"""A small model of a GRPO step's time with the rollout apart from the update, and its projections.

Not a measurement: a discrete-event model of rlvr's pipeline (``rlvr/distributed/pipeline.py``),
fed with per-step rollout and update times, that predicts the step time and each side's utilisation
for a staleness. Three uses:

    python benchmarks/async_model.py calibrate       # against this machine's async_runs results
    python benchmarks/async_model.py verl            # against veRL's published one-step-off gain
    python benchmarks/async_model.py verl --decode-eff 0.4 --mfu 0.5 --rollout-batch-seqs 512 --tag vllm-like
    python benchmarks/async_model.py project         # r1_zero_qwen25_7b on 8 GPUs: 2 rollout + 6 train vs 8

**The pipeline** (``simulate``): rollout ``j`` may start once its worker is free and the weights it
samples with exist (version ``j - s``: update ``j - s - 1`` has finished and been pushed); update
``j`` starts once rollout ``j`` and update ``j - 1`` have finished. Synchronous colocated training
is rollout then update on the same devices (``colocated``). Step time = the steady-state interval
between updates; utilisation = each side's busy share.

**Where step times come from.** ``calibrate`` takes the rollout and update seconds per step measured
by ``benchmarks/async_runs.py`` (mode ``async1``: one trainer and one rollout worker, a core each) and
predicts that run's step time, then compares it with the measured one. ``verl`` and ``project`` build
them from a roofline of the GPU (``GPUS``: bandwidth and bf16 matmul rate) with two efficiencies
(``--decode-eff``: the share of the bandwidth a decode step reaches; ``--mfu``: the update's share of
the matmul rate), a long-tailed response length distribution (lognormal, ``--mean-len``,
``--sigma``, capped at the budget), static batches of ``batch_seqs`` rows per device (rlvr's decode:
a chunk runs to its longest row, finished rows compacted away), and the update's FLOPs (8·N per
token with gradient checkpointing, 2·N more for the reference and old log-probs). Every assumption
is an argument and is printed with the result.

Writes benchmarks/results/async_model-<use>.json and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import glob
import json
import statistics
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

RESULTS = Path(__file__).parent / "results"
GPUS = {
    "H100": {"bytes_per_s": 3.35e12, "flops": 989e12},
    "H200": {"bytes_per_s": 4.8e12, "flops": 989e12},
    "H20": {"bytes_per_s": 4.0e12, "flops": 148e12},
}
"""Published HBM bandwidth and dense bf16 matmul rate per GPU (SXM parts)."""
QWEN25_7B = {"params": 7.6e9, "layers": 28, "kv_dim": 512}


def simulate(rollout_s: list[float], update_s: list[float], staleness: int, push_s: float = 0.0) -> dict:
    """The pipeline above over the given per-step times (one rollout worker pool, one trainer pool).

    Returns the mean step interval after the first step (the pipeline's fill), the whole run's time,
    and each pool's busy share."""
    n = len(update_s)
    r_end, u_end = [0.0] * n, [0.0] * n
    free = 0.0  # the rollout pool is free from this time
    for j in range(n):
        weights_at = 0.0 if j - staleness <= 0 else u_end[j - staleness - 1] + push_s
        start = max(free, weights_at)
        r_end[j] = start + rollout_s[j]
        free = r_end[j]
        u_end[j] = max(r_end[j], u_end[j - 1] if j else 0.0) + update_s[j]
    total = u_end[-1]
    steps = np.diff([0.0, *u_end])
    return {
        "step_s": float(np.mean(steps[1:])) if n > 1 else total,
        "total_s": total,
        "rollout_busy": sum(rollout_s) / total,
        "update_busy": sum(update_s) / total,
    }


def colocated(rollout_s: list[float], update_s: list[float]) -> dict:
    """Rollout then update on the same devices: each step the sum."""
    steps = [r + u for r, u in zip(rollout_s, update_s)]
    total = sum(steps)
    return {"step_s": statistics.fmean(steps[1:] or steps), "total_s": total, "busy": 1.0}


# -- calibrate: this machine's measurements -------------------------------------------------


def calibrate(pattern: str) -> dict:
    """Predicts each measured ``async1`` run's step time from its own per-step rollout and update seconds."""
    out = []
    for path in sorted(glob.glob(pattern)):
        report = json.loads(Path(path).read_text())
        for run in report["runs"]:
            if run["mode"] != "async1" or not run.get("per_step"):
                continue
            rollout = [s["rollout_s"] + s["reward_s"] for s in run["per_step"]]
            update = [s["update_s"] for s in run["per_step"]]
            push = statistics.fmean(s["push_s"] for s in run["per_step"])
            predicted = simulate(rollout, update, staleness=1, push_s=push)
            measured = statistics.fmean(s["step_s"] for s in run["per_step"][1:])
            out.append(
                {
                    "file": Path(path).name,
                    "seed": run["seed"],
                    "measured_step_s": round(measured, 2),
                    "predicted_step_s": round(predicted["step_s"], 2),
                    "error": round(predicted["step_s"] / measured - 1, 3),
                    "rollout_busy": round(predicted["rollout_busy"], 2),
                    "update_busy": round(predicted["update_busy"], 2),
                }
            )
    return {"runs": out, "from_async0": from_async0(pattern)}


def from_async0(pattern: str) -> list[dict]:
    """The harder check: each ``async0`` run (the same two processes, one after the other: no overlap)
    predicts staleness 1 from its per-step times, against the ``async1`` runs of the same config measured."""
    reports = [json.loads(Path(p).read_text()) for p in sorted(glob.glob(pattern))]
    out = []
    for report in reports:
        for run in (r for r in report["runs"] if r["mode"] == "async0" and r.get("per_step")):
            steps = run["per_step"]
            push = statistics.fmean(s["push_s"] for s in steps[1:])
            predicted = simulate(
                [s["rollout_s"] + s["reward_s"] for s in steps], [s["update_s"] for s in steps], 1, push
            )
            same = [
                r["step_s_mean"]
                for other in reports
                if other["config"] == report["config"] and other["overrides"] == report["overrides"]
                for r in other["runs"]
                if r["mode"] == "async1"
            ]
            if same:
                measured = statistics.fmean(same)
                out.append(
                    {
                        "config": " ".join([report["config"], *report["overrides"]]),
                        "predicted_step_s": round(predicted["step_s"], 2),
                        "measured_async1_step_s": round(measured, 2),
                        "async1_runs": len(same),
                        "error": round(predicted["step_s"] / measured - 1, 3),
                    }
                )
    return out


# -- GPU projections from a roofline ---------------------------------------------------------


@dataclass
class Workload:
    prompts: int
    group: int
    prompt_len: int
    budget: int
    mean_len: float
    sigma: float
    batch_seqs: int
    model: dict


def lengths(w: Workload, rng: np.random.Generator) -> np.ndarray:
    """Response lengths of one step: lognormal with mean ``mean_len`` and shape ``sigma``, capped at the budget."""
    mu = np.log(w.mean_len) - w.sigma**2 / 2
    return np.minimum(rng.lognormal(mu, w.sigma, w.prompts * w.group), w.budget).astype(int) + 1


def rollout_seconds(w: Workload, lens: np.ndarray, devices: int, gpu: dict, decode_eff: float) -> float:
    """One step's rollout on ``devices`` GPUs: rows dealt to the devices, each device running chunks of
    ``batch_seqs`` rows to their longest row; each decode step reads the bf16 weights once and each live
    row's keys and values so far, at ``decode_eff`` of the bandwidth (prefill counted as weight reads)."""
    bw = gpu["bytes_per_s"] * decode_eff
    weights = 2 * w.model["params"]
    kv_token = 2 * w.model["layers"] * w.model["kv_dim"] * 2
    per_device = np.array_split(lens, devices)
    times = []
    for rows in per_device:
        t = 0.0
        for chunk in np.array_split(rows, max(1, -(-len(rows) // w.batch_seqs))):
            steps = int(chunk.max())
            live_ctx = sum(int(n) * (w.prompt_len + n / 2) for n in chunk)  # each row's KV read at each of its steps
            t += (steps * weights + live_ctx * kv_token) / bw
        times.append(t)
    return max(times)


def update_seconds(w: Workload, lens: np.ndarray, devices: int, gpu: dict, mfu: float) -> float:
    """One step's update on ``devices`` GPUs: 10·N FLOPs per token (forward, backward, checkpointing's second
    forward, the reference's and old log-probs' forwards) at ``mfu`` of the matmul rate."""
    tokens = float(lens.sum() + len(lens) * w.prompt_len)
    return 10 * w.model["params"] * tokens / (gpu["flops"] * mfu * devices)


def compare(w: Workload, gpu: dict, total: int, splits: tuple[int, ...], args, steps: int = 40) -> dict:
    """Colocated synchronous training on ``total`` GPUs against each split (rollout GPUs, the rest train)
    at staleness 1, 2 and 4; the rollout GPUs decode ``args.rollout_batch_seqs`` rows at once (they hold
    no optimizer state, so their cache may be larger than the colocated run's)."""
    rng = np.random.default_rng(0)
    draws = [lengths(w, rng) for _ in range(steps)]
    col_r = [rollout_seconds(w, x, total, gpu, args.decode_eff) for x in draws]
    col_u = [update_seconds(w, x, total, gpu, args.mfu) for x in draws]
    sync = colocated(col_r, col_u)
    out = {
        "colocated_step_s": round(sync["step_s"], 1),
        "colocated_rollout_share": round(sum(col_r) / sync["total_s"], 3),
    }
    wide = dataclasses.replace(w, batch_seqs=args.rollout_batch_seqs)
    for k in splits:
        split_r = [rollout_seconds(wide, x, k, gpu, args.decode_eff) for x in draws]
        split_u = [update_seconds(w, x, total - k, gpu, args.mfu) for x in draws]
        for s in (1, 2, 4):
            r = simulate(split_r, split_u, staleness=s, push_s=args.push_s)
            out[f"{k}+{total - k}_s{s}"] = {
                "step_s": round(r["step_s"], 1),
                "speedup": round(sync["step_s"] / r["step_s"], 3),
                "rollout_busy": round(r["rollout_busy"], 2),
                "update_busy": round(r["update_busy"], 2),
            }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("use", choices=["calibrate", "verl", "project"])
    ap.add_argument("--results", default=str(RESULTS / "async_runs-*.json"), help="calibrate: the measured runs")
    ap.add_argument("--decode-eff", type=float, default=0.5, help="share of the bandwidth a decode step reaches")
    ap.add_argument("--mfu", type=float, default=0.35, help="share of the bf16 matmul rate the update reaches")
    ap.add_argument("--push-s", type=float, default=0.3, help="a weight push (veRL reports under 0.3 s at 7B)")
    ap.add_argument("--mean-len", type=float, help="mean response tokens (default: 600 project, 6000 verl)")
    ap.add_argument("--sigma", type=float, default=0.8, help="lognormal shape of the response lengths")
    ap.add_argument("--tag", default="", help="added to the result file's name")
    ap.add_argument(
        "--rollout-batch-seqs", type=int, default=128, help="rows a rollout GPU decodes at once (no optimizer there)"
    )
    args = ap.parse_args(argv)
    if args.use == "calibrate":
        result = calibrate(args.results)
    elif args.use == "verl":
        # veRL's one-step-off figure: Qwen2.5-Math-7B, DAPO, 16 H20 (4 generate + 12 train) against 16 colocated,
        # responses up to 20,480 tokens (FSDP2): 19h18m -> 15h34m, +23 % (docs/advance/one_step_off.md)
        w = Workload(512, 16, 512, 20480, args.mean_len or 6000, args.sigma, 64, QWEN25_7B)
        result = {
            "published_speedup": round((19 * 60 + 18) / (15 * 60 + 34), 3),
            **compare(w, GPUS["H20"], 16, (4,), args),
        }
    else:
        # r1_zero_qwen25_7b: 64 prompts x 8, 1,024-token prompts, 2,048-token budget, 32 rows per decode chunk
        w = Workload(64, 8, 1024, 2048, args.mean_len or 600, args.sigma, 32, QWEN25_7B)
        result = {gpu: compare(w, GPUS[gpu], 8, (1, 2, 3, 4), args) for gpu in ("H100", "H200")}
        result["workload"] = asdict(w)
    result["assumptions"] = {k: v for k, v in vars(args).items() if k not in ("use", "results", "tag")}
    out = RESULTS / f"async_model-{args.use}{'-' + args.tag if args.tag else ''}.json"
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
