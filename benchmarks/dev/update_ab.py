"""Time one update of this tree against a git revision, interleaved.

The update: the quickstart's batch shape (``--shape quickstart``: 4 prompts x G 8, prompts of
110-126 tokens left-padded to 126, responses of 12 to ``--response`` tokens) or
``benchmarks/vs_trl.py``'s (``--shape vs_trl``: 2 prompts x G 8, prompts left-padded to 128,
responses of 12 to 128 tokens), the quickstart's config (shared prompt, micro-batches of one group,
the fused head), ``accumulate_gradients`` then one fused AdamW step, on the built-in model. Each
side runs in its own process (the revision's ``rlvr`` first on ``PYTHONPATH``, from a temporary
``git worktree``), the sides alternate ``--rounds`` times, and each process times ``--updates``
updates after ``--warmup`` untimed ones; so a slow spell of a shared VM hits both sides alike. Each
side's processes run in the environment its own ``rlvr`` command gives itself (:func:`tree_env`),
and under ``--bf16`` with the compiled update attention where its tree has it (as its trainer would).

    python benchmarks/dev/update_ab.py --base b6df056                # fp32
    python benchmarks/dev/update_ab.py --base b6df056 --bf16         # under bf16 autocast
    python benchmarks/dev/update_ab.py --base b6df056 --shape vs_trl # long, uneven answers

Writes benchmarks/results/update_ab-<capability>-<precision>-<date>.json and prints a table. Nothing
else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from remove_padding import SHAPES  # the batch shapes (prompts, padded prompt length, longest response T)

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results"


def child(args) -> None:
    """Time ``args.updates`` updates in this process; print one JSON line."""
    import torch

    sys.path.insert(0, str(ROOT / "benchmarks" / "dev"))
    from update_tokens import quickstart_batch

    import rlvr
    from rlvr.config import load_config
    from rlvr.models import load_model, resolve_model_path
    from rlvr.training.loop import accumulate_gradients

    model = load_model(resolve_model_path("smollm2-135m-instruct"))
    shape = SHAPES[args.shape]
    batch = quickstart_batch(model.config.vocab_size, P=shape["P"], prompt_len=shape["prompt_len"], T=args.response)
    adv = torch.randn(batch.input_ids.shape[0], generator=torch.Generator().manual_seed(1))
    overrides = [f"rollout.max_new_tokens={args.response}", f"train.prompts_per_step={shape['P']}"]
    cfg = load_config("quickstart", overrides)
    if args.bf16 and getattr(cfg.train, "micro_batch_seqs_bf16", 0):  # as the trainer applies it (a base may lack it)
        bf16_passes = dataclasses.replace(cfg.train, micro_batch_seqs=cfg.train.micro_batch_seqs_bf16)
        cfg = dataclasses.replace(cfg, train=bf16_passes)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-6, fused=True)
    import contextlib

    bf16 = lambda: torch.autocast("cpu", dtype=torch.bfloat16)  # noqa: E731
    autocast = bf16 if args.bf16 else contextlib.nullcontext
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.bf16:  # the compiled update attention, as the trainer installs it, where the tree has it
        try:
            from rlvr.cpu import update_attention_kernel
            from rlvr.models.shared_prefix import use_kernel
        except ImportError:
            pass
        else:
            use_kernel(update_attention_kernel()[0])
    times, cpu = [], []
    for i in range(args.warmup + args.updates):
        model.train()
        t0, c0 = time.perf_counter(), time.process_time()
        accumulate_gradients(model, batch, adv, None, None, cfg, autocast)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
            cpu.append(time.process_time() - c0)
    out = {"rlvr": str(Path(rlvr.__file__).parent.parent), "times": times, "cpu": cpu}
    out["threads"] = torch.get_num_threads()
    out["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    print(json.dumps(out))


def tree_env(tree: str) -> dict:
    """The environment ``tree``'s own ``rlvr`` command gives itself (``rlvr.cpu.runtime_env``: huge pages
    for malloc; from this change on also MKL's AVX-512 kernels on AMD CPUs), with ``tree`` on PYTHONPATH."""
    code = (
        "import json, os; from rlvr.cpu import runtime_env as r; "
        "f = getattr(r, 'process_env', None) or r.huge_pages_env; print(json.dumps(f() or dict(os.environ)))"
    )
    env = dict(os.environ, PYTHONPATH=tree)
    # from inside the tree: `python -c` puts the working directory first on sys.path
    cmd = [sys.executable, "-c", code]
    out = subprocess.run(cmd, env=env, cwd=tree, check=True, capture_output=True, text=True).stdout
    return dict(json.loads(out), PYTHONPATH=tree)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", help="git revision to compare against (required)")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast in the update")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--updates", type=int, default=3, help="timed updates per process")
    ap.add_argument(
        "--warmup",
        type=int,
        default=2,
        help="untimed updates first: the first warms the kernels, the second still faults in fresh memory "
        "(the optimizer's state came in between); benchmarks/NOTES.md has the numbers",
    )
    ap.add_argument("--shape", choices=sorted(SHAPES), default="quickstart", help="the batch's shape (above)")
    ap.add_argument("--response", type=int, help="longest response (default: the shape's; the quickstart's: about 21)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: PyTorch's); 1 on a busy machine")
    ap.add_argument("--tag", default="", help="added to the results file's name")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.response is None:
        args.response = SHAPES[args.shape]["T"]
    if args.child:
        return child(args)
    if not args.base:
        ap.error("--base REVISION is required: the git revision to compare this tree against")
    flags = ["--updates", str(args.updates), "--response", str(args.response), "--threads", str(args.threads)]
    flags += ["--warmup", str(args.warmup)]
    flags += ["--shape", args.shape]
    flags += ["--bf16"] if args.bf16 else []
    with tempfile.TemporaryDirectory() as tmp:
        base_tree = Path(tmp) / "base"
        git = ["git", "-C", str(ROOT), "worktree"]
        subprocess.run([*git, "add", "-q", "--detach", str(base_tree), args.base], check=True)
        try:
            sides = {f"base {args.base}": str(base_tree), "this tree": str(ROOT)}
            runs: dict[str, list[float]] = {name: [] for name in sides}
            cpu: dict[str, list[float]] = {name: [] for name in sides}
            info = {}
            for r in range(args.rounds):
                for name, tree in sides.items():
                    env = tree_env(tree)
                    cmd = [sys.executable, __file__, "--child", *flags]
                    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                    if proc.returncode:
                        sys.exit(f"the {name} side failed:\n{proc.stderr[-3000:]}")
                    line = proc.stdout
                    got = json.loads(line.strip().splitlines()[-1])
                    assert Path(got["rlvr"]).resolve() == Path(tree).resolve(), got["rlvr"]
                    runs[name] += got["times"]
                    cpu[name] += got["cpu"]
                    info = got
                    print(f"round {r + 1} {name}: " + " ".join(f"{t:.2f}" for t in got["times"]), flush=True)
        finally:
            subprocess.run([*git, "remove", "--force", str(base_tree)], check=False)
    precision = "bf16" if args.bf16 else "fp32"
    result = {
        "date": datetime.date.today().isoformat(),
        "cpu_capability": info["cpu_capability"],
        "threads": info["threads"],
        "precision": precision,
        "batch": {
            "shape": args.shape,
            "prompts": SHAPES[args.shape]["P"],
            "G": 8,
            "prompt": SHAPES[args.shape]["prompt_len"],
            "response_max": args.response,
        },
        "rounds": args.rounds,
        "updates_per_round": args.updates,
        "warmup_updates": args.warmup,
        "update_s": {name: {"median": statistics.median(t), "min": min(t), "all": t} for name, t in runs.items()},
        "update_cpu_s": {name: {"median": statistics.median(t), "all": t} for name, t in cpu.items()},
    }
    names = list(runs)
    result["ratio_median"] = result["update_s"][names[1]]["median"] / result["update_s"][names[0]]["median"]
    RESULTS.mkdir(exist_ok=True)
    shape = "" if args.shape == "quickstart" else f"-{args.shape}"
    tag = f"{precision}-{info['threads']}t{shape}" + (f"-{args.tag}" if args.tag else "")
    out = RESULTS / f"update_ab-{info['cpu_capability']}-{tag}-{result['date']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{info['cpu_capability']}, {info['threads']} threads, {precision}: one {args.shape} update, seconds")
    print("| side | median | min | CPU s, median |\n| --- | --- | --- | --- |")
    for name, t in result["update_s"].items():
        print(f"| {name} | {t['median']:.2f} | {t['min']:.2f} | {result['update_cpu_s'][name]['median']:.2f} |")
    print(f"this tree / base: {result['ratio_median']:.3f} (medians)\nwrote {out}")


if __name__ == "__main__":
    main()
