"""rlvr's rollout engine alone: the time of one ``generate`` call against the decode's roofline floor.

    .venv/bin/python benchmarks/decode.py --device cuda --model random:qwen2.5-0.5b   # static decode, compiled, bf16
    .venv/bin/python benchmarks/decode.py --device cuda --model random:qwen2.5-0.5b --dynamic
    .venv/bin/python benchmarks/decode.py --device cuda --model random:qwen2.5-0.5b --max-new-tokens 1024 \\
        --eos-every 300                                                            # long-tailed lengths
    .venv/bin/python benchmarks/decode.py --device cpu --model builtin --rows 16 --max-new-tokens 64
    .venv/bin/python benchmarks/decode.py --device cpu --model random:tiny --rows 16 --max-new-tokens 128 \\
        --eos-every 32                                                             # the plumbing, on a CPU

**The work**: ``--rows`` sequences, ``--group-size`` samples of each of rows / G prompts (the
two-digit additions ``vs_trl.py`` trains on, rendered by rlvr's data preparation), at most
``--max-new-tokens`` new tokens, temperature 1, top-p 1, top-k off, stopping only at EOS, every row
drawing from its own seeded generator. ``--model``: ``builtin`` (SmolLM2-135M-Instruct), a model
directory, or ``random:SHAPE`` (a random-initialised Qwen2 of a published shape with the built-in
tokenizer; ``workload.py``). A random model never samples EOS, so its rows all run to the limit;
``--eos-every N`` calibrates its EOS row so that EOS comes about every N tokens (long-tailed lengths:
``workload.py`` says how), which is where dropping finished rows (the dynamic decode) and stepping
every row to the end (the static decode) differ.

**The engine**: ``rlvr.rollout.hf.HFRolloutEngine(model, tokenizer, max_new_tokens, batch_seqs,
static_decode, dtype)`` as training builds it, on the model loaded in ``--dtype`` (bfloat16 on a GPU,
float32 on a CPU by default), so it decodes on the model's own weights. ``--static`` / ``--dynamic``
pick the decoder; neither = the engine's own choice (static and compiled on a GPU, the dynamic decode
with lean decode and packed weights on a CPU). ``generate(prompts, G, seeds=...)`` is called once to
warm up (on a GPU, the static decode compiles and captures its CUDA graphs here; reported separately
as the warm-up seconds) and then ``--repeats`` times with the same seeds, so every timed call does the
same work; on a GPU each call is timed between ``torch.cuda.synchronize()`` calls.

**Reported per call** (the median call's line is the summary): seconds; ``engine.last_stats``: rows,
decode steps (forwards after the prefills), row-steps (rows computed over those steps) and tokens
kept; ms per decode step (the call's time, prefill included, over its decode steps) and per
generated token; tokens / row-steps and the useful share of the row-steps, (tokens − rows) /
row-steps (the prefill samples each row's first token, so a row of L tokens needs L − 1 decode
steps: 1.0 = no row computed after its end); the mean and longest response and the truncated share;
and the **floor**: the least time this device could take for the same work, prefill + decode, from
``roofline_model.py``'s counting with each row's actual length. The decode part reads the weights
once per decode step (per chunk: its longest row's length − 1 steps) and each live row's KV cache
once per step (its real prompt tokens plus the tokens so far; each group's prompt is counted per
row); the prefill reads the weights once per chunk and writes the prompts' cache; all those bytes
over the device's measured bandwidth (the faster of reading and copying, ``workload.device_rates``).
``fraction_of_floor`` = floor / measured time (1.0 = at the floor). Beside it the FLOPs over the
measured matmul rate (``compute_s``) and the roofline, the larger of the two terms per phase
(``roofline_s``), which a prefill of long prompts on a CPU can push above the bytes' floor. On a GPU
also ``torch.cuda.max_memory_allocated`` and the count of graphs dynamo compiled during warm-up and
during the timed calls (none expected in the latter).

**Attention traffic** (after the timed calls; ``--no-traffic`` skips it): the static decode's step
traced once more at the first prompts (8 rows or one group) with a backend that keeps dynamo's graph,
and the bytes its attention calls read as keys and values and the bytes copies of them write and read
(``rlvr.models.gqa_decode.attention_traffic``): rlvr's step, which folds a grouped-query layer's
query heads onto their key/value heads, beside transformers' sdpa attention as it runs compiled with a
mask (``repeat_kv``: the keys and values once per query head).

Writes ``benchmarks/results/decode-<date>-<device>.json`` (``<device>``: ``cpu-<capability>`` or the
GPU's name; ``--out`` to change) with the machine (``torch.backends.cpu.get_cpu_capability()``,
threads, load), the settings, the rates, the EOS calibration (random models with ``--eos-every``)
and every call, and prints a short table. Nothing else should run on the machine: the times are the
point.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

from workload import (
    RANDOM_SHAPES,
    device_rates,
    eos_calibration,
    expected_len_mean,
    machine,
    model_dir,
    rendered_prompts,
    slug,
)

RESULTS = Path(__file__).parent / "results"
SEED = 0


def floor_of_call(
    shape, rates: dict, lengths: list[int], prompt_tokens: list[int], *, G: int, chunk_rows: int, dtype_bytes: int
) -> dict:
    """The floor of one ``generate`` call on this device: prefill + decode of each chunk of ``chunk_rows``
    rows, from the rows' actual response lengths (see the module docstring).

    Args:
        shape: the model's :class:`rlvr.estimate.ModelShape`.
        rates: ``workload.device_rates``' matmul FLOP/s and copy bytes/s.
        lengths: [B] tokens kept per row (EOS counted); the prefill sampled each row's first.
        prompt_tokens: [B] each row's real (unpadded) prompt tokens.
        G: rows per prompt (a prompt is prefilled once for its group).
        chunk_rows: rows the engine decodes together (whole groups).
        dtype_bytes: bytes per weight and per cached key/value element.

    Returns:
        ``seconds``: the floor, bytes read and written over the bandwidth (``bytes``); ``compute_s``:
        the FLOPs over the matmul rate; ``roofline_s``: the larger of the two per phase, summed (above
        ``seconds`` where a phase, such as a long prompt's prefill, is compute-bound); ``bound``.
    """
    from roofline_model import (
        Cost,
        Rates,
        attention_flops,
        causal_pairs,
        floor,
        head_params,
        kv_bytes_per_token,
        layer_matmul_params,
        prefill_cost,
        streamed_params,
    )

    r = Rates(rates["matmul_flops_per_s"], rates["bytes_per_s"])
    total = None
    for first in range(0, len(lengths), chunk_rows):
        L = lengths[first : first + chunk_rows]
        Lp = prompt_tokens[first : first + chunk_rows]
        prefill = prefill_cost(
            shape,
            sequences=len(L),
            prompt_tokens=statistics.fmean(Lp),
            dtype_bytes=dtype_bytes,
            prompt_share=G,
        )
        passes = [max(n - 1, 0) for n in L]  # decode forwards each row needs
        pairs = sum(k * p + causal_pairs(k) for k, p in zip(passes, Lp))  # step j attends to Lp + j positions
        steps = max(passes)  # the chunk steps until its longest row ends; each step streams the weights
        decode = Cost(
            2 * (layer_matmul_params(shape) + head_params(shape)) * sum(passes) + attention_flops(shape, pairs),
            steps * streamed_params(shape) * dtype_bytes + pairs * kv_bytes_per_token(shape, dtype_bytes),
        )
        part = floor(prefill, r) + floor(decode, r)
        total = part if total is None else total + part
    return {
        "seconds": total.memory_s,
        "bytes": total.memory_s * r.bytes_per_s,
        "compute_s": total.compute_s,
        "roofline_s": total.seconds,
        "bound": total.bound,
    }


def timed_call(engine, prompts: list[str], G: int, seeds: list[int], sync) -> dict:
    """One ``generate`` between device synchronisations: its seconds, ``last_stats`` and lengths."""
    import torch

    cuda = sync is not None
    if cuda:
        torch.cuda.reset_peak_memory_stats()
        sync()
    t0 = time.perf_counter()
    batch = engine.generate(prompts, G, seeds=seeds)
    if cuda:
        sync()
    seconds = time.perf_counter() - t0
    lengths = batch.response_mask.sum(dim=1).tolist()
    return {
        "seconds": seconds,
        **engine.last_stats,
        "lengths": lengths,
        "truncated_frac": batch.truncated.float().mean().item(),
        "cuda_max_allocated_mib": torch.cuda.max_memory_allocated() / 2**20 if cuda else None,
    }


def derived(call: dict) -> dict:
    """The per-call ratios of the module docstring."""
    s, steps, row_steps, tokens, rows = (call[k] for k in ("seconds", "decode_steps", "row_steps", "tokens", "rows"))
    return {
        "ms_per_decode_step": 1e3 * s / steps if steps else None,
        "ms_per_token": 1e3 * s / tokens if tokens else None,
        "tokens_per_row_step": tokens / row_steps if row_steps else None,
        "useful_row_step_frac": (tokens - rows) / row_steps if row_steps else None,
        "len_mean": statistics.fmean(call["lengths"]),
        "len_max": max(call["lengths"]),
        "fraction_of_floor": call["floor"]["seconds"] / s,
    }


COLUMNS = [
    ("s", "seconds", "{:.3f}"),
    ("decode steps", "decode_steps", "{}"),
    ("ms/step", "ms_per_decode_step", "{:.2f}"),
    ("ms/token", "ms_per_token", "{:.3f}"),
    ("tokens", "tokens", "{}"),
    ("row-steps", "row_steps", "{}"),
    ("tokens/row-step", "tokens_per_row_step", "{:.3f}"),
    ("mean len", "len_mean", "{:.1f}"),
    ("max len", "len_max", "{}"),
    ("floor s", "floor_s", "{:.3f}"),
    ("of floor", "fraction_of_floor", "{:.1%}"),
]


def table(calls: list[tuple[str, dict]]) -> str:
    fmt = lambda spec, v: "n/a" if v is None else spec.format(v)  # noqa: E731
    lines = ["| call | " + " | ".join(c[0] for c in COLUMNS) + " |", "| --- |" + " --- |" * len(COLUMNS)]
    for label, call in calls:
        row = {**call, "floor_s": call["floor"]["seconds"]}
        lines.append(f"| {label} | " + " | ".join(fmt(spec, row.get(key)) for _, key, spec in COLUMNS) + " |")
    return "\n".join(lines)


def step_traffic(model, tokenizer, prompts: list[str], G: int, tokens: int = 4) -> dict | None:
    """The keys and values the static decode's step attends per token, and the bytes repeats copy, read off
    the graph dynamo traces for it (a backend that keeps the graph and runs it uncompiled), at the first
    prompts' batch and window: the step's own attention (``folded``, :mod:`rlvr.models.gqa_decode`) and
    transformers' sdpa attention as it runs compiled (``repeated``, for comparison). None for a model
    that is not sdpa."""
    import contextlib

    import rlvr.rollout.static as static
    from rlvr.models.gqa_decode import attention_traffic
    from rlvr.rollout.hf import eos_token_ids

    if getattr(model.config, "_attn_implementation", None) != "sdpa":
        return None
    enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False).to(model.device)
    out = {}
    for name, attention in (("folded", static.gqa_decode), ("repeated", lambda m: contextlib.nullcontext())):
        graphs = []

        def keep(gm, example_inputs, graphs=graphs):
            graphs.append(gm)
            return gm.forward

        decoder = static.StaticDecoder(model, compile=keep, sync_every=tokens)
        how = static.Sampler(greedy=True)
        kw = dict(max_new_tokens=tokens, how=how, seeds=None, eos_ids=eos_token_ids(model, tokenizer))
        before, static.gqa_decode = static.gqa_decode, attention
        try:
            decoder.decode(enc.input_ids, enc.attention_mask, G, pad_id=tokenizer.pad_token_id, **kw)
        finally:
            static.gqa_decode = before
        out[name] = attention_traffic(graphs[0])
        del decoder
    folded, repeated = out["folded"], out["repeated"]
    out["read_ratio"] = repeated["attention_kv_bytes"] / max(1, folded["attention_kv_bytes"])
    out["moved_ratio"] = (repeated["attention_kv_bytes"] + repeated["kv_copy_bytes"]) / max(
        1, folded["attention_kv_bytes"] + folded["kv_copy_bytes"]
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", help="cpu, or cuda / cuda:N")
    ap.add_argument(
        "--model",
        default="builtin",
        help=f"builtin, a model directory, or random:SHAPE ({', '.join(RANDOM_SHAPES)}; workload.py)",
    )
    ap.add_argument("--rows", type=int, default=64, help="sequences per generate call: prompts x G")
    ap.add_argument("--group-size", type=int, default=8, help="G, samples per prompt (divides --rows)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--eos-every", type=int, metavar="N", help="random models: EOS about every N tokens")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--static", dest="static", action="store_true", default=None, help="the static decode")
    which.add_argument("--dynamic", dest="static", action="store_false", help="the dynamic decode")
    ap.add_argument("--repeats", type=int, default=3, help="timed calls after the warm-up")
    ap.add_argument("--dtype", choices=["float32", "bfloat16"], help="default: bfloat16 on a GPU, float32 on a CPU")
    ap.add_argument("--batch-seqs", type=int, help="rows decoded together (default --rows: one chunk)")
    ap.add_argument(
        "--workdir",
        type=Path,
        default=Path(tempfile.gettempdir()) / "rlvr-decode",
        help="random models and the prompt file",
    )
    ap.add_argument("--out", type=Path, help="result JSON (default benchmarks/results/decode-<date>-<device>.json)")
    ap.add_argument(
        "--no-traffic", dest="traffic", action="store_false", help="skip tracing the step's attention traffic"
    )
    args = ap.parse_args()
    cuda = args.device.startswith("cuda")
    if not cuda:  # as rlvr's command line runs: glibc's malloc on huge pages where that applies
        from rlvr.cpu.runtime_env import reexec_with_runtime_env

        reexec_with_runtime_env()

    import torch

    from rlvr.estimate import BYTES, model_shape
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout.hf import HFRolloutEngine, sample_seed

    if cuda and not torch.cuda.is_available():
        raise SystemExit(f"--device {args.device}: no CUDA device is visible here; use --device cpu")
    if args.device != "cpu" and not cuda:
        raise SystemExit(f"--device {args.device}: expected cpu, cuda or cuda:N")
    G = args.group_size
    if args.rows < 1 or G < 1 or args.rows % G:
        raise SystemExit(f"--rows {args.rows} must be a positive multiple of --group-size {G}")
    if args.eos_every is not None and args.eos_every < 1:
        raise SystemExit(f"--eos-every {args.eos_every}: expected a number of tokens >= 1")
    dtype = args.dtype or ("bfloat16" if cuda else "float32")
    batch_seqs = args.batch_seqs or args.rows
    if batch_seqs < G:
        raise SystemExit(f"--batch-seqs {batch_seqs} must hold a whole group (>= --group-size {G})")

    path = model_dir(args.model, args.workdir, eos_every=args.eos_every, device=args.device)
    tokenizer = load_tokenizer(path)
    model = load_model(path, dtype=dtype, device=args.device)
    rows = rendered_prompts(tokenizer, args.rows // G, args.workdir)
    prompts = [r["prompt"] for r in rows]
    prompt_tokens = [r["prompt_tokens"] for r in rows for _ in range(G)]  # [B], grouped by prompt
    engine = HFRolloutEngine(
        model,
        tokenizer,
        max_new_tokens=args.max_new_tokens,
        batch_seqs=batch_seqs,
        static_decode=args.static,
        dtype=dtype,
    )
    seeds = [sample_seed(SEED, i) for i in range(args.rows)]
    sync = torch.cuda.synchronize if cuda else None
    rates = device_rates(args.device, dtype)  # measured before the model's calls, with their memory free
    if cuda:
        torch.cuda.empty_cache()
    shape = model_shape(str(path))[0]
    chunk_rows = max(1, batch_seqs // G) * G  # the engine's chunks: whole groups

    def graphs() -> int:
        from torch._dynamo.utils import counters

        return int(counters["stats"]["unique_graphs"])

    graphs_before = graphs()
    warm = timed_call(engine, prompts, G, seeds, sync)
    graphs_warm = graphs()
    calls = [timed_call(engine, prompts, G, seeds, sync) for _ in range(args.repeats)]
    graphs_timed = graphs() - graphs_warm
    for call in [warm, *calls]:
        call["floor"] = floor_of_call(
            shape, rates, call["lengths"], prompt_tokens, G=G, chunk_rows=chunk_rows, dtype_bytes=BYTES[dtype]
        )
        call.update(derived(call))
    median = sorted(calls, key=lambda c: c["seconds"])[len(calls) // 2] if calls else warm
    traffic = step_traffic(engine.model, tokenizer, prompts[: max(1, 8 // G)], G) if args.traffic else None
    calibration = eos_calibration(path) if args.eos_every else None
    if calibration:
        calibration["expected_len_mean"] = expected_len_mean(calibration["eos_probability"], args.max_new_tokens)
    md = table([("warm-up", warm), *((f"{i + 1}", c) for i, c in enumerate(calls)), ("median", median)])
    info = machine(args.device)
    date = datetime.date.today().isoformat()
    report = {
        "date": date,
        "machine": {**info, "glibc_tunables": os.environ.get("GLIBC_TUNABLES")},
        "torch": torch.__version__,
        "settings": {
            **{k: v for k, v in vars(args).items() if k not in ("workdir", "out")},
            "workdir": str(args.workdir),
            "model_path": str(path),
            "dtype": dtype,
            "batch_seqs": batch_seqs,
            "prompts": len(prompts),
            "prompt_tokens_mean": statistics.fmean(prompt_tokens),
            "seed": SEED,
        },
        "engine": {
            "static": engine.static,
            "lean": engine.lean is not None,
            "packed": engine.packed is not None,
            "unpacked_why": engine.unpacked,
        },
        "rates": rates,
        "eos_calibration": calibration,
        "warmup_s": warm["seconds"],
        "dynamo_graphs": {"warm_up": graphs_warm - graphs_before, "timed_calls": graphs_timed},
        "host_reads": engine.decoder.host_reads if engine.decoder is not None else None,
        "cudagraph_skips": int(torch._dynamo.utils.counters["inductor"].get("cudagraph_skips", 0)),
        "static_failure": engine.static_failure,
        "attention_traffic": traffic,
        "summary": {k: v for k, v in median.items() if k != "lengths"},
        "warmup": warm,
        "calls": calls,
        "table": md,
    }
    device = slug(info["gpu"]) if info["gpu"] else f"cpu-{info['cpu_capability'].lower()}"
    out = args.out or RESULTS / f"decode-{date}-{device}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    engine_kind = "static" if engine.static else "dynamic" + (" (lean)" if engine.lean is not None else "")
    print(
        f"{args.model} on {info['gpu'] or 'cpu ' + info['cpu_capability']}, {dtype}, {engine_kind} decode; "
        f"{args.rows} rows (G={G}), <= {args.max_new_tokens} new tokens"
        + (f", EOS about every {args.eos_every}" if args.eos_every else "")
        + f"\nwarm-up {warm['seconds']:.2f} s; floor = bytes / bandwidth {rates['bytes_per_s'] / 1e9:.1f} GB/s "
        f"(matmul {rates['matmul_flops_per_s'] / 1e12:.2f} TFLOP/s: the roofline is {median['floor']['bound']}-bound)\n"
    )
    if calibration:
        print(f"expected mean length (independent draws): {calibration['expected_len_mean']:.1f}")
    if traffic:
        f, r = traffic["folded"], traffic["repeated"]
        print(
            f"attention per step at {f['batch']} rows x {f['window']} positions: keys and values read "
            f"{f['attention_kv_bytes'] / 1e6:.2f} MB, copied {f['kv_copy_bytes'] / 1e6:.2f} MB (rlvr's step); "
            f"transformers' compiled sdpa reads {r['attention_kv_bytes'] / 1e6:.2f} MB and copies "
            f"{r['kv_copy_bytes'] / 1e6:.2f} MB ({traffic['moved_ratio']:.1f}x the bytes)"
        )
    print(f"{md}\n\nwrote {out}")


if __name__ == "__main__":
    main()
