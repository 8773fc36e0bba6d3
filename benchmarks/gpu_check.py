"""The first GPU's check: every GPU claim of rlvr measured in one command, within a wall-clock budget.

    python3 benchmarks/gpu_check.py                    # on an H100/H200: about 8 minutes
    python3 benchmarks/gpu_check.py --dry-run          # the plumbing on a CPU with a tiny model (CI runs it)

Stages, in order; each runs in a subprocess with the time the budget has left, and a stage that would
pass the deadline is skipped and said so:

1. ``versions``: torch, transformers, CUDA, the device, bf16 support, rlvr's commit.
2. ``decode-SHAPE-static`` / ``-dynamic`` (Qwen2.5-0.5B and 1.5B shapes, random weights, 64 rows x 256
   tokens, bf16): ``benchmarks/decode.py``'s ms/token, fraction of the byte floor, dynamo graphs, host
   reads, CUDA-graph skips, whether the static decode fell back, and (static) the bytes the step's
   attention reads and copies against transformers' compiled attention.
3. ``agreement``: the static decode against the dynamic one, greedy: at float32 every row must be equal;
   at bf16 the share of equal rows is reported against :data:`BF16_ROWS_EQUAL` (compiled and eager code
   round differently, so a long greedy row can part at a near-tie).
4. ``vs_trl``: ``benchmarks/vs_trl.py`` at the 0.5B shape (needs TRL's own environment, which the
   script builds from PyPI: a machine without the index records the failure).
5. ``train``: two steps of ``r1_zero_qwen25_7b_lora`` on a random model of ``--train-shape`` (7B by
   default), its peak memory against rlvr's estimate.
6. ``fsdp`` / ``fsdp-offload``: one Ray worker, FSDP2 on NCCL, two steps, without and with CPU offload.
7. ``pytest``: ``pytest --device cuda`` on the model, rollout and training tests.

Writes ``--out-dir``/gpu_check-<device>-<date>.json and .md (default benchmarks/results/). Whoever is
first lent a GPU runs it first and puts both files in benchmarks/results/.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULTS = HERE / "results"
BF16_ROWS_EQUAL = 0.9
"""At bf16, the share of greedy rows the static decode must give exactly as the dynamic one does."""


class Stages:
    """Runs named stages under one deadline and records each one's status, seconds and result."""

    def __init__(self, budget_s: float) -> None:
        self.start, self.budget = time.monotonic(), budget_s
        self.results: list[dict] = []

    def left(self) -> float:
        return self.budget - (time.monotonic() - self.start)

    def run(self, name: str, need_s: float, fn, *args, **kw) -> dict | None:
        """``fn(timeout_s, *args, **kw)`` -> a result dict; skipped when less than ``need_s`` is left."""
        left = self.left()
        if left < need_s:
            self.results.append(
                {"stage": name, "status": "skipped", "why": f"{left:.0f} s left, needs ~{need_s:.0f} s"}
            )
            print(f"[gpu_check] {name}: skipped ({left:.0f} s left)", flush=True)
            return None
        t0 = time.monotonic()
        try:
            out = fn(left, *args, **kw)
            status, why = "ok", None
        except Exception as e:  # noqa: BLE001 - a stage's failure is a result, never the check's end
            out, status, why = None, "failed", f"{type(e).__name__}: {str(e)[-1500:]}"
        row = {"stage": name, "status": status, "seconds": round(time.monotonic() - t0, 1), "result": out}
        if why:
            row["why"] = why
        self.results.append(row)
        print(f"[gpu_check] {name}: {status} in {row['seconds']} s" + (f" ({why[:200]})" if why else ""), flush=True)
        return out


def _run(cmd: list[str], timeout: float, env: dict | None = None) -> str:
    done = subprocess.run(
        cmd, cwd=REPO, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=max(timeout, 1)
    )
    if done.returncode:
        raise RuntimeError(f"exit {done.returncode}: {(done.stderr or done.stdout)[-1500:]}")
    return done.stdout + done.stderr


def versions(_timeout: float, device: str) -> dict:
    import torch
    import transformers

    out = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "rlvr_commit": subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip(),
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        out.update(
            gpu=props.name,
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            bf16=torch.cuda.is_bf16_supported(),
        )
    return out


def decode(
    timeout: float, device: str, model: str, static: bool, rows: int, tokens: int, dtype: str, work: Path
) -> dict:
    out = work / f"decode-{model.replace(':', '-')}-{'static' if static else 'dynamic'}.json"
    _run(
        [
            sys.executable,
            str(HERE / "decode.py"),
            "--device",
            device,
            "--model",
            model,
            "--rows",
            str(rows),
            "--group-size",
            str(min(8, rows)),
            "--max-new-tokens",
            str(tokens),
            "--repeats",
            "2",
            "--dtype",
            dtype,
            "--static" if static else "--dynamic",
            *([] if static else ["--no-traffic"]),  # the step's traffic is traced once, with the static decode
            "--workdir",
            str(work),
            "--out",
            str(out),
        ],
        timeout,
    )
    r = json.loads(out.read_text())
    s = r["summary"]
    return {
        "ms_per_token": s.get("ms_per_token"),
        "fraction_of_floor": s.get("fraction_of_floor"),
        "warmup_s": r.get("warmup_s"),
        "dynamo_graphs": r.get("dynamo_graphs"),
        "host_reads": r.get("host_reads"),
        "host_reads_per_token": (r["host_reads"] / max(s.get("decode_steps") or 1, 1)) if r.get("host_reads") else None,
        "cudagraph_skips": r.get("cudagraph_skips"),
        "static_failure": r.get("static_failure"),
        "engine": r.get("engine"),
        "attention_traffic": r.get("attention_traffic"),
    }


def agreement(_timeout: float, device: str, model_dir: Path, rows: int, tokens: int, dry: bool) -> dict:
    """Greedy static against dynamic on the same random model, at float32 and (on a GPU) bf16."""
    from rlvr.models import load_model, load_tokenizer
    from rlvr.rollout import HFRolloutEngine

    tok = load_tokenizer(model_dir)
    prompts = [f"What is {a} + {b}?" for a, b in zip(range(10, 10 + rows), range(40, 40 + rows))]
    out = {}
    for dtype in ("float32",) if dry else ("float32", "bfloat16"):
        model = load_model(model_dir, dtype=dtype).to(device).eval()
        common = dict(max_new_tokens=tokens, batch_seqs=rows, dtype=dtype)
        dynamic = HFRolloutEngine(model, tok, static_decode=False, lean_decode=False, **common)
        static = HFRolloutEngine(model, tok, static_decode=True, **common)
        a, b = (e.generate(prompts, 1, greedy=True) for e in (dynamic, static))
        same = [a.texts[i] == b.texts[i] for i in range(len(prompts))]
        out[dtype] = {
            "rows": len(same),
            "rows_equal": sum(same),
            "share_equal": sum(same) / len(same),
            "static_failure": static.static_failure,
        }
        del model, dynamic, static
    out["float32_exact"] = out["float32"]["rows_equal"] == out["float32"]["rows"]
    if "bfloat16" in out:
        out["bf16_within_tolerance"] = out["bfloat16"]["share_equal"] >= BF16_ROWS_EQUAL
        out["bf16_tolerance"] = BF16_ROWS_EQUAL
    if not out["float32_exact"]:
        raise AssertionError(f"float32 static and dynamic greedy rows differ: {out['float32']}")
    return out


def train(timeout: float, device: str, model_dir: Path, preset: str, work: Path, extra: list[str]) -> dict:
    run = work / f"train-{preset}"
    text = _run(
        [
            sys.executable,
            "-m",
            "rlvr.cli",
            "train",
            "--config",
            preset,
            f"model.path={model_dir}",
            f"model.device={device}",
            f"run_dir={run}",
            "train.steps=2",
            "train.save_every=0",
            "eval.every_steps=0",
            "eval.limit=0",
            "log.progress=false",
            "log.report=false",
            *extra,
        ],
        timeout,
    )
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    estimate = re.search(r"memory estimate: ([\d.]+) GiB", text)
    measured = re.search(r"measured peak ([\d.]+) GiB", text)
    return {
        "steps": len(rows),
        "s_per_step": [r.get("time/step_s") for r in rows],
        "estimate_gib": float(estimate.group(1)) if estimate else None,
        "measured_gib": float(measured.group(1)) if measured else None,
        "memory_lines": [x for x in text.splitlines() if "memory" in x][:4],
    }


def pytest_stage(timeout: float, device: str, dry: bool) -> dict:
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--device", device.split(":")[0]]
    cmd += (
        ["--collect-only", "tests/rollout/test_static_decode.py"]
        if dry
        else ["-m", "not extended", "tests/models", "tests/rollout", "tests/training/test_tiny_training.py"]
    )
    try:
        text = _run(cmd, timeout)
    except RuntimeError as e:
        text = str(e)
        if "failed" not in text:
            raise
    tail = [x for x in text.splitlines() if re.search(r"\d+ (passed|failed|tests? collected)", x)]
    return {"summary": tail[-1] if tail else text[-300:]}


def markdown(report: dict) -> str:
    lines = [
        f"# GPU check: {report['device_name']}, {report['date']}",
        "",
        f"{'dry run on a CPU (the plumbing only)' if report['dry_run'] else 'measured'}; "
        f"budget {report['budget_s']} s, took {report['seconds']} s",
        "",
        "| stage | status | seconds | result |",
        "| --- | --- | --- | --- |",
    ]
    for r in report["stages"]:
        res = r.get("result") or r.get("why") or ""
        text = json.dumps(res, default=str) if not isinstance(res, str) else res
        lines.append(f"| {r['stage']} | {r['status']} | {r.get('seconds', '')} | {text[:300].replace('|', '/')} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny random model, small sizes: the plumbing")
    ap.add_argument("--device", default=None, help="default: cuda (cpu with --dry-run)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="wall-clock budget (default: %(default)s)")
    ap.add_argument("--train-shape", default="qwen2.5-7b", help="random model shape of the train stage")
    ap.add_argument("--out-dir", type=Path, default=RESULTS)
    args = ap.parse_args(argv)
    dry = args.dry_run
    device = args.device or ("cpu" if dry else "cuda")
    if not dry and device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            sys.exit("gpu_check: no CUDA device here; run it on a GPU, or --dry-run for the plumbing on a CPU")
    sys.path.insert(0, str(HERE))
    from workload import random_model

    stages = Stages(args.budget_s)
    work = Path(tempfile.mkdtemp(prefix="rlvr-gpu-check-"))
    info = stages.run("versions", 0, versions, device) or {}
    rows, tokens, dtype = (4, 8, "float32") if dry else (64, 256, "bfloat16")
    if dry:  # rlvr's own tiny test model: the plumbing in seconds
        from rlvr.models.tiny import save_tiny_model

        small = save_tiny_model(work / "rlvr-tiny")  # not model-tiny: decode.py builds random:tiny there
        models = {"tiny": "random:tiny"}  # decode.py renders chat prompts: the built-in tokenizer's
    else:
        small = random_model("qwen2.5-0.5b", work / "model-agreement")
        models = {shape: f"random:{shape}" for shape in ("qwen2.5-0.5b", "qwen2.5-1.5b")}
    for shape, spec in models.items():
        for static in (True, False):
            name = f"decode-{shape}-{'static' if static else 'dynamic'}"
            stages.run(name, 5 if dry else 45, decode, device, spec, static, rows, tokens, dtype, work)
    stages.run(
        "agreement", 5 if dry else 40, agreement, device, small, rows if dry else 16, tokens if dry else 128, dry
    )
    if dry:
        stages.results.append(
            {"stage": "vs_trl", "status": "skipped", "why": "dry run: TRL's environment is not built"}
        )
    else:
        stages.run(
            "vs_trl",
            120,
            lambda t: {
                "output_tail": _run(
                    [
                        sys.executable,
                        str(HERE / "vs_trl.py"),
                        "--device",
                        device,
                        "--model",
                        "random:qwen2.5-0.5b",
                        "--precision",
                        "bf16",
                        "--steps",
                        "2",
                        "--out",
                        str(work / "vs_trl.json"),
                    ],
                    t,
                )[-800:],
                **json.loads((work / "vs_trl.json").read_text()),
            },
        )
    tiny_train = (
        [
            "rollout.max_new_tokens=8",
            "rollout.samples_per_prompt=2",
            "train.prompts_per_step=1",
            "train.micro_batch_seqs=2",
            "data.train_size=8",
            "data.template=plain",
            "data.system_prompt=",
            "data.assistant_prefix=",
            "rollout.dtype=float32",
        ]
        if dry
        else []
    )
    model = small if dry else random_model(args.train_shape, work / "model-train")
    preset = "quickstart" if dry else "r1_zero_qwen25_7b_lora"
    stages.run("train", 10 if dry else 150, train, device, model, preset, work, tiny_train)
    if dry:
        for name in ("fsdp", "fsdp-offload"):
            stages.results.append({"stage": name, "status": "skipped", "why": "dry run: NCCL needs a GPU"})
    else:
        fsdp = ["distributed.backend=ray", "distributed.num_workers=1", "distributed.strategy=fsdp"]
        stages.run("fsdp", 90, train, device, small, "quickstart", work, fsdp)
        stages.run(
            "fsdp-offload",
            90,
            train,
            device,
            small,
            "quickstart",
            work,
            [*fsdp, "offload.params=true", "offload.optimizer=true", f"run_dir={work / 'train-offload'}"],
        )
    stages.run("pytest", 10 if dry else 60, pytest_stage, device, dry)
    date = datetime.date.today().isoformat()
    name = re.sub(r"[^a-z0-9]+", "-", (info.get("gpu") or f"cpu-{info.get('cpu_capability', '')}").lower()).strip("-")
    report = {
        "date": date,
        "dry_run": dry,
        "device": device,
        "device_name": info.get("gpu") or "CPU",
        "budget_s": args.budget_s,
        "seconds": round(time.monotonic() - stages.start, 1),
        "versions": info,
        "stages": stages.results,
    }
    args.out_dir.mkdir(parents=True, exist_ok=True)
    base = args.out_dir / f"gpu_check-{name}-{date}{'-dry-run' if dry else ''}"
    base.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    base.with_suffix(".md").write_text(markdown(report))
    print(f"[gpu_check] wrote {base}.json and .md")
    return 0 if all(r["status"] != "failed" for r in stages.results) else 1


if __name__ == "__main__":
    sys.exit(main())
