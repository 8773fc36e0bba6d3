"""FSDP on the built-in model: 2 Ray workers (distributed.strategy=fsdp, gloo) against one process.

Trains the quickstart preset (SmolLM2-135M-Instruct) for ``--steps`` steps both ways, evaluation and
report off, and writes to ``benchmarks/results/fsdp_builtin-<capability>-<date>.json``: each step's
metrics side by side, the weight difference after every step (max absolute, and the largest
difference relative to the tensor's own scale), what each worker held of the training state
(``perf/train_state_mib``) and the wall times. Run by hand, with nothing else running:

    .venv/bin/python benchmarks/dev/fsdp_builtin.py --steps 2

On a real model the two agree to float rounding in the first step; later steps may sample a
different token where rounding flips one (docs/distributed.md, "What to expect").
"""

from __future__ import annotations

import argparse
import datetime
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from rlvr.commands.train import run_training
from rlvr.config import load_config
from rlvr.run_dir import RunDir

RESULTS = Path(__file__).resolve().parents[1] / "results"
COMMON = ("eval.at_start=false", "eval.at_end=false", "log.report=false", "log.progress=false", "train.save_every=1")
FSDP = ("distributed.backend=ray", "distributed.num_workers=2", "distributed.strategy=fsdp")


def weights_gap(a_dir: Path, b_dir: Path) -> dict:
    """The largest absolute difference and the largest one relative to the tensor's max magnitude."""
    a, b = load_file(a_dir / "model.safetensors"), load_file(b_dir / "model.safetensors")
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    abs_max = max((a[k] - b[k]).abs().max().item() for k in a)
    rel_max = max(((a[k] - b[k]).abs().max() / a[k].abs().max().clamp(min=1e-12)).item() for k in a)
    return {"max_abs": abs_max, "max_rel_to_tensor_scale": rel_max}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    cap = torch.backends.cpu.get_cpu_capability()
    root = Path(tempfile.mkdtemp(prefix="fsdp_builtin-"))
    runs, seconds = {}, {}
    for name, extra in (("one_process", ()), ("fsdp_2_workers", FSDP)):
        run = root / name
        cfg = load_config("quickstart", [f"run_dir={run}", f"train.steps={args.steps}", "train.keep_checkpoints=0",
                                         *COMMON, *extra])  # fmt: skip
        t0 = time.perf_counter()
        run_training(cfg)
        seconds[name] = time.perf_counter() - t0
        runs[name] = run
    one, fsdp = (RunDir(runs[n]) for n in ("one_process", "fsdp_2_workers"))
    rows_one, rows_fsdp = one.read_metrics(), fsdp.read_metrics()
    steps = []
    for step, (r1, r2) in enumerate(zip(rows_one, rows_fsdp), start=1):
        gap = weights_gap(one.checkpoint_dir(step), fsdp.checkpoint_dir(step))
        keys = sorted(k for k in r1 if k.startswith(("rollout/", "train/")) and k in r2)
        steps.append({"step": step, "weights": gap, "metrics": {k: [r1[k], r2[k]] for k in keys}})
    result = {
        "what": "quickstart preset, one process vs distributed.strategy=fsdp on 2 Ray workers (gloo)",
        "cpu_capability": cap,
        "torch": torch.__version__,
        "date": datetime.date.today().isoformat(),
        "steps": steps,
        "train_state_mib": {
            "one_process": rows_one[-1].get("perf/train_state_mib"),
            "fsdp_worker": rows_fsdp[-1].get("perf/train_state_mib"),
        },
        "peak_rss_mib": {
            "one_process": rows_one[-1].get("perf/peak_rss_mib"),
            "fsdp_rank0": rows_fsdp[-1].get("perf/peak_rss_mib"),
        },
        "s_per_step": {n: [r.get("time/step_s") for r in RunDir(runs[n]).read_metrics()] for n in runs},
        "wall_s": seconds,
    }
    out = args.out or RESULTS / f"fsdp_builtin-{cap}-{result['date']}.json"
    out.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    print(json.dumps({k: result[k] for k in ("train_state_mib", "s_per_step", "wall_s")}, indent=1))
    for s in steps:
        print(f"step {s['step']}: weights {s['weights']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
