"""Where one update's time goes, operator by operator, on the quickstart's batch with 0, 3 or 4 of
its 4 groups forward only (their advantages all 0).

For each case it times steady updates, then one more update with every ATen call timed in place by
a ``TorchDispatchMode`` (``torch.profiler`` misplaces the time of the small element-wise operators
on this kind of CPU, see ``benchmarks/NOTES.md``), and splits the update into its passes with
gradients, its forward-only passes and the rest (the optimizer step, the norm, the zero gradients).
It also times the shared-prompt attention's forward calls (their products' FLOPs counted from each
call's shape, for their rate against the products of the rest of the layer).
The compiled attention (``train.fused_attention``) is installed as the trainer installs it, where it
applies; ``--kernel off`` leaves it out, and ``--kernel-ab`` also times, interleaved in one process,
each case with and without it.
``--zeros-ab`` also times, interleaved in one process, an update whose groups all ran forward only
with one zero gradient per parameter shape and no norm pass (the default in one process) against a
zero tensor per parameter and a computed norm (what several ranks do).

    python benchmarks/dev/update_ops.py --rounds 8 --zeros-ab

Writes benchmarks/results/update_ops-<capability>-<precision>-<date>.json and prints tables. Nothing
else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import datetime
import functools
import json
import statistics
import time
from pathlib import Path

import torch
from torch.utils._python_dispatch import TorchDispatchMode

RESULTS = Path(__file__).resolve().parents[1] / "results"
CASES = {"every group trained": 0, "three of four forward only": 3, "every group forward only": 4}


class OpTimes(TorchDispatchMode):
    """Wall time and count of every ATen call, by operator name."""

    def __init__(self) -> None:
        super().__init__()
        self.by_op: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        t0 = time.perf_counter()
        out = func(*args, **(kwargs or {}))
        entry = self.by_op[str(func)]
        entry[0] += 1
        entry[1] += time.perf_counter() - t0
        return out


@contextlib.contextmanager
def attention_forwards():
    """Times every forward call of the shared-prompt attention (the registered transformers attention
    function) for the block; yields ``{"s": seconds, "gflop": its products' GFLOP, "calls": n}``.

    The GFLOP are what its kernels multiply: per group, the prompt's queries against the prompt's
    keys and the G segments' against the prompt's and their own (padded to T), scores and values."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from rlvr.models.shared_prefix import SHARED_ATTENTION

    real, acc = ALL_ATTENTION_FUNCTIONS[SHARED_ATTENTION], {"s": 0.0, "gflop": 0.0, "calls": 0}

    def timed(module, query, key, value, attention_mask, *, shared_prefix, **kw):
        G, T, masks = shared_prefix[:3]
        P, Lp = masks[0].shape[0], masks[0].shape[-1]
        t0 = time.perf_counter()
        out = real(module, query, key, value, attention_mask, shared_prefix=shared_prefix, **kw)
        acc["s"] += time.perf_counter() - t0
        acc["gflop"] += 4 * query.shape[1] * query.shape[-1] * P * (Lp * Lp + G * T * (Lp + T)) / 1e9
        acc["calls"] += 1
        return out

    AttentionInterface.register(SHARED_ATTENTION, timed)
    try:
        yield acc
    finally:
        AttentionInterface.register(SHARED_ATTENTION, real)


def _setup(fp32: bool):
    from long_answers import P, batch

    from rlvr.config import load_config
    from rlvr.models import load_model, resolve_model_path

    model = load_model(resolve_model_path("smollm2-135m-instruct"))
    cfg = load_config("quickstart", ["rollout.max_new_tokens=48", f"train.prompts_per_step={P}"])
    if not fp32:  # as the trainer applies it under autocast
        cfg = dataclasses.replace(
            cfg, train=dataclasses.replace(cfg.train, micro_batch_seqs=cfg.train.micro_batch_seqs_bf16)
        )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0)
    autocast = contextlib.nullcontext if fp32 else (lambda: torch.autocast("cpu", dtype=torch.bfloat16))
    return model, cfg, opt, sched, autocast, batch([17] * 32, model.config.vocab_size)


def _advantages(frozen: int):
    from long_answers import G, P

    adv = torch.randn(P * G, generator=torch.Generator().manual_seed(1))
    adv[: frozen * G] = 0
    return adv


def _case(update, rounds: int, warmup: int) -> dict:
    """Steady update time, the split by pass, and one update's operators timed in place."""
    from rlvr.training import loop

    real, passes = loop._micro_batch_backward, collections.defaultdict(float)

    def timed(*args, **kw):
        t0 = time.perf_counter()
        out = real(*args, **kw)
        passes["with gradients" if kw.get("backward", True) else "forward only"] += time.perf_counter() - t0
        return out

    times, split, attention = [], collections.defaultdict(list), []
    loop._micro_batch_backward = timed
    try:
        for i in range(warmup + rounds):
            passes.clear()
            with attention_forwards() as att:
                t0 = time.perf_counter()
                update()
                t = time.perf_counter() - t0
            if i >= warmup:
                times.append(t)
                attention.append(att)
                for k in ("with gradients", "forward only"):
                    split[k].append(passes[k])
                split["the rest"].append(times[-1] - passes["with gradients"] - passes["forward only"])
    finally:
        loop._micro_batch_backward = real
    ops = OpTimes()
    t0 = time.perf_counter()
    with ops:
        update()
    in_mode = time.perf_counter() - t0
    products = sum(t for name, (_, t) in ops.by_op.items() if name.split(".")[1] in ("mm", "bmm", "addmm", "baddbmm"))
    total = sum(t for _, t in ops.by_op.values())
    top = sorted(ops.by_op.items(), key=lambda kv: -kv[1][1])[:15]
    return dict(
        update_s=statistics.median(times),
        split_s={k: statistics.median(v) for k, v in split.items()},
        attention_forward_s=statistics.median(a["s"] for a in attention),
        attention_forward_gflop=attention[-1]["gflop"],
        attention_calls=attention[-1]["calls"],
        in_mode_s=in_mode,
        products_s=products,
        other_ops_s=total - products,
        outside_ops_s=in_mode - total,
        operators=sum(n for n, _ in ops.by_op.values()),
        top=[dict(op=name, calls=n, s=t) for name, (n, t) in top],
    )


def _zeros_ab(update, rounds: int, warmup: int) -> dict:
    """Every group forward only: shared zeros and no norm (default) against a zero per parameter and
    a computed norm, interleaved."""
    from rlvr.training import loop

    shared_zero, clip = loop._zero_missing_grads, loop._clip_gradients
    sides = {
        "one zero per shape, no norm": (shared_zero, clip),
        "a zero per parameter, the norm computed": (
            lambda policy, observed, shared: shared_zero(policy, observed, shared=False),
            lambda *a, all_zero: clip(*a, all_zero=False),
        ),
    }
    times = {k: [] for k in sides}
    try:
        for i in range(warmup + rounds):
            for name in list(sides) if i % 2 else list(sides)[::-1]:
                loop._zero_missing_grads, loop._clip_gradients = sides[name]
                t0 = time.perf_counter()
                update()
                if i >= warmup:
                    times[name].append(time.perf_counter() - t0)
    finally:
        loop._zero_missing_grads, loop._clip_gradients = shared_zero, clip
    return {k: statistics.median(v) for k, v in times.items()}


def _kernel_ab(update, rounds: int, warmup: int, kernel) -> dict:
    """The update with the compiled attention installed and without, interleaved (the order swapped
    every round)."""
    from rlvr.models.shared_prefix import use_kernel

    sides = {"compiled attention": kernel, "torch attention": None}
    times = {k: [] for k in sides}
    try:
        for i in range(warmup + rounds):
            for name in list(sides) if i % 2 else list(sides)[::-1]:
                use_kernel(sides[name])
                t0 = time.perf_counter()
                update()
                if i >= warmup:
                    times[name].append(time.perf_counter() - t0)
    finally:
        use_kernel(kernel)
    return {k: statistics.median(v) for k, v in times.items()}


def _install_kernel(want: bool, fp32: bool):
    """The compiled attention installed as the trainer does (bf16 autocast only), or None with why."""
    from rlvr.cpu import update_attention_kernel
    from rlvr.models.shared_prefix import use_kernel

    fn, why = (None, "--kernel off") if not want else (None, "float32") if fp32 else update_attention_kernel()
    use_kernel(fn)
    print(f"compiled attention: {'on' if fn is not None else f'off ({why})'}")
    return fn


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=8, help="timed updates per case")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--fp32", action="store_true", help="float32 (default: bf16 autocast, as `auto` on AVX-512)")
    ap.add_argument("--zeros-ab", action="store_true", help="also time shared zeros against a zero per parameter")
    ap.add_argument("--kernel", choices=("on", "off"), default="on", help="the compiled attention, where it applies")
    ap.add_argument("--kernel-ab", action="store_true", help="also time each case with and without it, interleaved")
    ap.add_argument("--tag", default="")
    args = ap.parse_args()

    from rlvr.training.loop import update_policy

    model, cfg, opt, sched, autocast, batch = _setup(args.fp32)
    kernel = _install_kernel(args.kernel == "on", args.fp32)
    rows, kernel_ab = {}, {}
    for name, frozen in CASES.items():
        adv = _advantages(frozen)
        update = functools.partial(update_policy, model, opt, sched, batch, adv, None, None, cfg, autocast)
        rows[name] = _case(update, args.rounds, args.warmup)
        if args.kernel_ab and kernel is not None:
            kernel_ab[name] = _kernel_ab(update, args.rounds, args.warmup, kernel)
    adv = _advantages(4)
    ab = (
        _zeros_ab(
            lambda: update_policy(model, opt, sched, batch, adv, None, None, cfg, autocast), args.rounds, args.warmup
        )
        if args.zeros_ab
        else None
    )

    precision = "fp32" if args.fp32 else "bf16"
    cap = torch.backends.cpu.get_cpu_capability()
    print(f"{cap}, {torch.get_num_threads()} threads, {precision}: one update of the quickstart's all-17 batch, s")
    print(
        "| case | update | with gradients | forward only | the rest | products | other ops | outside ops | operators "
        "| attention forwards (GFLOP/s) |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for name, r in rows.items():
        s, att = r["split_s"], r["attention_forward_s"]
        rate = r["attention_forward_gflop"] / att if att else 0.0
        print(
            f"| {name} | {r['update_s']:.3f} | {s['with gradients']:.3f} | {s['forward only']:.3f} | "
            f"{s['the rest']:.3f} | {r['products_s']:.3f} | {r['other_ops_s']:.3f} | {r['outside_ops_s']:.3f} | "
            f"{r['operators']} | {att:.3f} ({rate:.0f}) |"
        )
    if ab:
        print("every group forward only: " + "; ".join(f"{k} {v:.3f} s" for k, v in ab.items()))
    for name, r in kernel_ab.items():
        ratio = r["compiled attention"] / r["torch attention"]
        print(f"{name}: " + "; ".join(f"{k} {v:.3f} s" for k, v in r.items()) + f" (ratio {ratio:.3f})")
    tag = f"-{args.tag}" if args.tag else ""
    out = RESULTS / f"update_ops-{cap}-{precision}{tag}-{datetime.date.today()}.json"
    body = dict(
        date=str(datetime.date.today()),
        cpu_capability=cap,
        threads=torch.get_num_threads(),
        precision=precision,
        rounds=args.rounds,
        cases=rows,
        zeros_ab=ab,
        compiled_attention=kernel is not None,
        kernel_ab=kernel_ab or None,
    )
    out.write_text(json.dumps(body, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
