"""How close each phase of a GRPO step comes to this CPU's roofline.

    .venv/bin/python benchmarks/roofline.py                               # rates + the floor of vs_trl.py's
                                                                          # default step
    .venv/bin/python benchmarks/roofline.py --run /tmp/rlvr-vs-trl/rlvr   # ... and a run's measured phases against it
    .venv/bin/python benchmarks/roofline.py --run runs/quickstart         # any rlvr run directory
    .venv/bin/python benchmarks/roofline.py --precision bf16 --response-tokens 48
    .venv/bin/python benchmarks/roofline.py --run RUN \\
        --rates results/roofline-AVX2-2026-11-25.json   # rates measured earlier

1. Measures this machine with torch's thread count: the matmul rate in float32 and bfloat16 on the
   model's own GEMM shapes (tokens x hidden -> intermediate, intermediate -> hidden, hidden ->
   vocab, for 1024 tokens: a prefill or update micro-batch; 32 where a dtype is so slow that one
   call would take over a second), best of ``--repeats`` runs of each (at most 5 s of them), and
   the best of two kernels: ``torch.mm`` (MKL) and oneDNN's prepacked linear (what rlvr's rollout
   multiplies with; on a 2-core AVX-512 CPU it ran 1024-row fp32 products about 2x faster than MKL,
   so a compute floor from ``torch.mm`` alone would be about twice too high, too easy to reach),
   and the memory bandwidth as the best rate of summing (read) and copying (read + write) a
   512 MiB float32 tensor, far larger than any cache.
2. Counts the FLOPs and bytes of one step's phases with ``roofline_model.py`` (its docstring says
   what is counted; ``tests/test_roofline.py`` checks the counting by hand): rollout = prefill +
   decode with the KV cache, the no-grad reference / old-log-prob passes, and the update
   (forward + backward + AdamW), from the model's config.json (layers, hidden, intermediate,
   heads, KV heads, vocabulary, tied embeddings). The floor of a phase is max(FLOPs / matmul
   rate, bytes / read bandwidth) in the phase's precision.
3. With ``--run RUN``: reads the run's config.yaml (batch, precision, shared-prompt forward,
   reference) and every step of its metrics.jsonl (``time/rollout_s``, ``time/reference_s``,
   ``time/update_s``, ``rollout/response_len_mean`` and ``_max``, ``train/forward_only_frac``: the
   sequences the update ran forward only), computes each step's floors
   for that step's response lengths, and reports per phase the floor, the measured time and the
   fraction of the floor reached (floor / measured; 1 = at the roofline), medians over the steps
   after the first (a warm-up). The prompt length is the mean over the run's prepared prompts
   (``--prompt-tokens`` sets it without loading the tokenizer).

Writes ``benchmarks/results/roofline-<capability>-<date>.json`` (``--out`` to change) and
prints a Markdown table. Nothing else should run on the machine: the rates are the point.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import time
from dataclasses import asdict
from pathlib import Path

if __name__ == "__main__":  # the rates as rlvr runs: in its own process environment (huge pages, MKL on AMD)
    from rlvr.cpu.runtime_env import reexec_with_runtime_env

    reexec_with_runtime_env()

import torch  # noqa: E402
from roofline_model import Rates, decode_cost, floor, forward_cost, prefill_cost, update_cost  # noqa: E402

from rlvr.cpu.packed import dtype_unpackable, pack_weight, packed_linear  # noqa: E402
from rlvr.estimate import BYTES, model_shape  # noqa: E402
from rlvr.models.forward import shared_prompt_group  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def _best(fn, repeats: int, budget_s: float = 5.0) -> float:
    """Fastest of ``repeats`` timed calls, after one untimed warm-up call; stops early once the
    timed calls have taken ``budget_s`` (a slow path, such as bf16 emulated on an AVX2-only CPU,
    would otherwise take minutes per call)."""
    fn()
    best, spent = math.inf, 0.0
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        took = time.perf_counter() - t0
        best, spent = min(best, took), spent + took
        if spent > budget_s:
            break
    return best


def write_report(kind: str, body: dict, out: Path | None = None) -> tuple[dict, Path]:
    """Writes a result file: the date, the machine it was measured on and the torch version, then
    ``body``; by default to ``results/<kind>-<capability>-<date>.json``. Returns (report, path)."""
    capability, date = torch.backends.cpu.get_cpu_capability(), datetime.date.today().isoformat()
    machine = {
        "cpu_capability": capability,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "mkl_avx512_shim": "mkl_intel_cpu" in os.environ.get("LD_PRELOAD", ""),
        "glibc_tunables": os.environ.get("GLIBC_TUNABLES", ""),
        "load_avg_1m_at_end": os.getloadavg()[0],
    }
    report = {"date": date, "machine": machine, "torch": torch.__version__, **body}
    out = out or RESULTS / f"{kind}-{capability}-{date}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    return report, out


def matmul_rates(shape, repeats: int, tokens: int = 1024, probe_tokens: int = 32, call_budget_s: float = 1.0) -> dict:
    """FLOP/s of ``[tokens, k] @ [k, n]`` for the model's projection and LM-head shapes, per dtype.

    A dtype whose ``probe_tokens``-row LM-head product projects to more than ``call_budget_s`` at
    ``tokens`` rows (bf16 without native support: 0.3 GFLOP/s on an AVX2-only CPU, minutes per
    call) is measured at ``probe_tokens`` rows instead; the key of each shape says the rows used."""
    H, I, V = shape.hidden_size, shape.intermediate_size, shape.vocab_size
    out = {}
    for name, dtype in DTYPES.items():
        a, b = torch.randn(probe_tokens, H, dtype=dtype), torch.randn(H, V, dtype=dtype)
        torch.mm(a, b)
        t0 = time.perf_counter()
        torch.mm(a, b)
        rows = tokens if (time.perf_counter() - t0) * tokens / probe_tokens < call_budget_s else probe_tokens
        per_shape, per_kernel = {}, {}
        for k, n in [(H, I), (I, H), (H, V)]:
            a, b = torch.randn(rows, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            kernels = {"mm": lambda: torch.mm(a, b)}
            if dtype_unpackable(dtype) is None:  # the kernel rlvr's rollout multiplies with (rlvr.cpu.packed)
                packed = pack_weight(b.t(), rows)
                kernels["onednn_packed"] = lambda: packed_linear(a, packed)
            for kernel, fn in kernels.items():
                per_kernel.setdefault(kernel, {})[f"{rows}x{k}x{n}"] = 2 * rows * k * n / _best(fn, repeats)
            per_shape[f"{rows}x{k}x{n}"] = max(r[f"{rows}x{k}x{n}"] for r in per_kernel.values())
        out[name] = {"best_flops_per_s": max(per_shape.values()), "per_shape": per_shape, "per_kernel": per_kernel}
    return out


def bandwidth(repeats: int, mib: int = 512) -> dict:
    """Bytes/s of reading (sum) and of copying (read + write) a ``mib`` MiB float32 tensor."""
    x = torch.rand(mib * 2**20 // 4)
    y = torch.empty_like(x)
    nbytes = x.numel() * 4
    return {
        "read_bytes_per_s": nbytes / _best(lambda: x.sum(), repeats),
        "copy_bytes_per_s": 2 * nbytes / _best(lambda: y.copy_(x), repeats),
        "tensor_mib": mib,
    }


def step_floors(
    shape,
    rates: dict,
    bw: float,
    *,
    prompts: int,
    G: int,
    mb: int,
    prompt_tokens: float,
    response_mean: float,
    response_max: float,
    rollout_dtype: str,
    autocast: bool,
    shared_prompt: int,
    update_share: int,
    reference_passes: int,
    iterations: int,
    rollout_sequences: int | None = None,
    forward_only: float = 0.0,
    forward_only_pass: bool = True,
) -> dict:
    """Cost and floor of each phase of one step. ``rates`` holds the matmul FLOP/s per precision.
    ``forward_only``: the fraction of the sequences the update ran forward only
    (``train/forward_only_frac``; their responses taken as long as the step's mean), or with no pass
    where not ``forward_only_pass`` (:func:`run_batch`)."""
    B = prompts * G
    train_rate = Rates(rates["bf16" if autocast else "fp32"], bw)
    roll_rate = Rates(rates["bf16" if rollout_dtype == "bfloat16" else "fp32"], bw)
    rb, n_micro = BYTES[rollout_dtype], math.ceil(B / mb)
    common = dict(sequences=B, prompt_tokens=prompt_tokens, response_tokens=response_mean, micro_batches=n_micro)
    rows = rollout_sequences or B
    costs = {
        # the floor of the work: each prompt prefilled once for its G samples (as rlvr's engine does)
        "prefill": (
            prefill_cost(shape, sequences=rows, prompt_tokens=prompt_tokens, dtype_bytes=rb, prompt_share=G),
            roll_rate,
        ),
        "decode": (
            decode_cost(
                shape,
                sequences=rows,
                prompt_tokens=prompt_tokens,
                response_tokens=response_mean,
                decode_steps=response_max,
                dtype_bytes=rb,
            ),
            roll_rate,
        ),
        "reference": (forward_cost(shape, **common, prompt_share=shared_prompt) * reference_passes, train_rate),
        "update": (
            update_cost(
                shape,
                **common,
                prompt_share=update_share,
                forward_only=forward_only,
                forward_only_pass=forward_only_pass,
            )
            * iterations,
            train_rate,
        ),
    }
    return {name: {"flops": c.flops, "bytes": c.bytes, **asdict(floor(c, r))} for name, (c, r) in costs.items()}


PHASE_TIME = {"rollout": "time/rollout_s", "reference": "time/reference_s", "update": "time/update_s"}


def _bound(p: dict) -> str:
    return "compute" if p["compute_s"] >= p["memory_s"] else "memory"


def phase_rows(floors: dict) -> dict:
    """Adds rollout = prefill + decode (their floors add; the bound names each part's)."""
    roll = {
        k: floors["prefill"][k] + floors["decode"][k] for k in ("flops", "bytes", "compute_s", "memory_s", "seconds")
    }
    parts = [_bound(floors["prefill"]), _bound(floors["decode"])]
    roll["bound"] = parts[0] if parts[0] == parts[1] else f"{parts[0]} + {parts[1]}"
    rows = {**floors, "rollout": roll}
    for name in ("prefill", "decode", "reference", "update"):
        rows[name] = {**rows[name], "bound": _bound(rows[name])}
    return {name: rows[name] for name in ("prefill", "decode", "rollout", "reference", "update")}


def run_batch(run: Path, prompt_tokens: float | None) -> tuple[dict, list[dict], str]:
    """The batch settings of a run, its metrics rows and its model spec."""
    from rlvr.config import Switch, load_config
    from rlvr.run_dir import RunDir
    from rlvr.training.loop import rollout_entropy_applies

    rd = RunDir(run)
    cfg = load_config(rd.config_file)
    # a run written before train.rollout_entropy existed ran its forward-only groups' passes
    known = "rollout_entropy" in Path(rd.config_file).read_text(encoding="utf-8")
    if prompt_tokens is None:
        from rlvr.data import prepare
        from rlvr.models import load_tokenizer, resolve_model_path

        rows = prepare(cfg.data, load_tokenizer(resolve_model_path(cfg.model.path))).rows
        prompt_tokens = statistics.fmean(r["prompt_tokens"] for r in rows)
    G, mb = cfg.rollout.samples_per_prompt, cfg.train.micro_batch_seqs
    share = shared_prompt_group(mb, G) if cfg.train.shared_prompt_forward else 1
    kl_in_reward = cfg.algo.kl_coef > 0 and cfg.algo.kl_placement == "reward"
    batch = {
        "prompts": cfg.train.prompts_per_step,
        "G": G,
        "mb": mb,
        "prompt_tokens": prompt_tokens,
        "rollout_dtype": str(cfg.rollout.dtype),
        "autocast": cfg.model.autocast_bf16 == Switch.ON,
        "shared_prompt": share,
        "update_share": 1 if cfg.model.gradient_checkpointing else share,
        "reference_passes": int(cfg.algo.kl_coef > 0) + int(cfg.algo.num_iterations > 1 or kl_in_reward),
        "iterations": cfg.algo.num_iterations,
        "forward_only_pass": not (known and rollout_entropy_applies(cfg)),
    }
    return batch, rd.read_metrics(), cfg.model.path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", type=Path, help="an rlvr run directory: compare its measured phase times")
    ap.add_argument("--model", default="smollm2-135m-instruct", help="without --run: the model whose shape is counted")
    ap.add_argument("--prompts-per-step", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--micro-batch-seqs", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=float, help="default: 128 without --run, the run's prompt mean with it")
    ap.add_argument(
        "--response-tokens", type=float, default=128, help="without --run: response length of every sequence"
    )
    ap.add_argument(
        "--precision", choices=["fp32", "bf16"], default="fp32", help="without --run: rollout and update precision"
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--rates",
        type=Path,
        help="reuse the matmul rates and bandwidth of an earlier roofline JSON "
        "(measured on a quiet machine) instead of measuring now, e.g. while other work runs",
    )
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()

    if args.run:
        batch, metrics, model = run_batch(args.run, args.prompt_tokens)
        if not metrics:
            raise SystemExit(f"{args.run}: no metrics.jsonl rows")
    else:
        mb = min(args.micro_batch_seqs, args.prompts_per_step * args.group_size)
        share = shared_prompt_group(mb, args.group_size)  # as rlvr's default shared-prompt forward runs it
        batch = {
            "prompts": args.prompts_per_step,
            "G": args.group_size,
            "mb": mb,
            "prompt_tokens": args.prompt_tokens or 128.0,
            "rollout_dtype": "bfloat16" if args.precision == "bf16" else "float32",
            "autocast": args.precision == "bf16",
            "shared_prompt": share,
            "update_share": share,
            "reference_passes": 0,
            "iterations": 1,
        }
        metrics, model = [], args.model
    shape, shape_from = model_shape(model)

    threads = torch.get_num_threads()
    if args.rates:
        earlier = json.loads(args.rates.read_text())
        if earlier["machine"]["cpu_capability"] != torch.backends.cpu.get_cpu_capability():
            raise SystemExit(
                f"{args.rates} was measured on {earlier['machine']['cpu_capability']}, this CPU dispatches "
                f"{torch.backends.cpu.get_cpu_capability()}: measure here instead (drop --rates)"
            )
        mm, bw = earlier["rates"]["matmul"], earlier["rates"]["memory"]
        print(f"rates from {args.rates} ({earlier['date']}, {earlier['machine']['threads']} threads)")
    else:
        print(f"measuring matmul rates and memory bandwidth ({threads} threads) ...", flush=True)
        mm = matmul_rates(shape, args.repeats)
        bw = bandwidth(args.repeats)
    rates = {name: r["best_flops_per_s"] for name, r in mm.items()}
    read_bw = bw["read_bytes_per_s"]
    print(
        f"matmul: fp32 {rates['fp32'] / 1e9:.1f} GFLOP/s, bf16 {rates['bf16'] / 1e9:.1f} GFLOP/s; "
        f"memory: read {read_bw / 1e9:.1f} GB/s, copy {bw['copy_bytes_per_s'] / 1e9:.1f} GB/s"
    )

    if metrics:
        per_step = []
        for m in metrics:
            extra = 1 + m.get("rollout/extra_batches", 0)  # dynamic sampling generates more rows
            f = step_floors(
                shape,
                rates,
                read_bw,
                **batch,
                response_mean=m["rollout/response_len_mean"],
                response_max=m["rollout/response_len_max"],
                rollout_sequences=round(batch["prompts"] * batch["G"] * extra),
                forward_only=m.get("train/forward_only_frac", 0.0),
            )
            per_step.append((m, phase_rows(f)))
        measured_steps = per_step[1:] or per_step
        phases = {}
        for name, first in measured_steps[0][1].items():
            phases[name] = {
                k: (v if k == "bound" else statistics.median(p[name][k] for _, p in measured_steps))
                for k, v in first.items()
            }
            if name in PHASE_TIME:
                times = [m.get(PHASE_TIME[name], 0.0) for m, _ in measured_steps]
                ratios = [
                    p[name]["seconds"] / t
                    for (_, p), t in zip(measured_steps, times)
                    if t > 0 and p[name]["seconds"] > 0
                ]
                phases[name].update(
                    measured_s=statistics.median(times), fraction_of_floor=statistics.median(ratios) if ratios else None
                )
        lens = {
            "response_len_mean": statistics.median(m["rollout/response_len_mean"] for m, _ in measured_steps),
            "response_len_max": statistics.median(m["rollout/response_len_max"] for m, _ in measured_steps),
        }
    else:
        R = args.response_tokens
        phases = phase_rows(step_floors(shape, rates, read_bw, **batch, response_mean=R, response_max=R))
        lens = {"response_len_mean": R, "response_len_max": R}

    cols = "| phase | GFLOP | GB moved | compute s | memory s | floor s | bound | measured s | floor / measured |"
    lines = [cols, "|" + " --- |" * 9]
    for name, p in phases.items():
        if p["flops"] == 0 and (p.get("measured_s") or 0) < 1e-3:
            continue  # no reference pass in this run
        measured, frac = p.get("measured_s"), p.get("fraction_of_floor")
        label = f"  {name} (part of rollout)" if name in ("prefill", "decode") else name
        lines.append(
            f"| {label} | {p['flops'] / 1e9:.1f} | {p['bytes'] / 1e9:.2f} | {p['compute_s']:.3f} | "
            f"{p['memory_s']:.3f} | "
            f"{p['seconds']:.3f} | {p['bound']} | "
            + ("" if measured is None else f"{measured:.2f}")
            + " | "
            + ("" if frac is None else f"{frac:.1%}")
            + " |"
        )
    md = "\n".join(lines)
    _, out = write_report(
        "roofline",
        {
            "rates": {"matmul": mm, "memory": bw},
            "rates_from": str(args.rates) if args.rates else "measured",
            "model": {"spec": model, "shape_from": shape_from, **asdict(shape), "params": shape.num_params()},
            "batch": {**batch, **lens},
            "run": str(args.run) if args.run else None,
            "phases": phases,
            "table": md,
        },
        args.out,
    )
    print(
        f"\n{model}: P={batch['prompts']} x G={batch['G']}, prompt {batch['prompt_tokens']:.0f} tokens, "
        f"response mean {lens['response_len_mean']:.1f} / max {lens['response_len_max']:.0f}, "
        f"rollout {batch['rollout_dtype']}, update {'bf16 autocast' if batch['autocast'] else 'fp32'}\n\n"
        f"{md}\n\nwrote {out}"
    )


if __name__ == "__main__":
    main()
