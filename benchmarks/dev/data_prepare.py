"""Time preparing 50,000 GSM8K-shaped rows: read the JSONL, map it (gsm8k preset), render the R1
template, tokenise on data.num_workers processes, write the cache; then the cached (warm) run.

Run: OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dev/data_prepare.py [--rows 50000] [--workers 2]
Writes benchmarks/results/data_prepare.json. Uses the built-in model's tokenizer
(~/.cache/rlvr/models/smollm2-135m-instruct) when it has been converted, else the tiny test tokenizer.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

QUESTION = (
    "Natalia sold clips to {a} of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May? (case {i})"
)
ANSWER = (
    "Natalia sold {a}/2 = <<{a}/2={h}>>{h} clips in May.\nNatalia sold {a}+{h} = <<{a}+{h}={t}>>{t} clips.\n#### {t:,}"
)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=50_000)
    ap.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    builtin = Path.home() / ".cache/rlvr/models/smollm2-135m-instruct"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["RLVR_CACHE"] = str(Path(tmp) / "cache")  # a cold cache, not the user's
        from rlvr.config import DataConfig
        from rlvr.data import load_split, prepare_rows
        from rlvr.data.prepare import summary

        if (builtin / "tokenizer.json").is_file():
            from transformers import AutoTokenizer

            tok, tok_name = AutoTokenizer.from_pretrained(builtin), "smollm2-135m-instruct"
        else:
            from rlvr.models.tiny import tiny_tokenizer

            tok, tok_name = tiny_tokenizer(), "tiny (built-in model not converted)"
            tok.chat_template = (
                "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"
            )
        rng = random.Random(0)
        path = Path(tmp) / "gsm8k_50k.jsonl"
        with path.open("w", encoding="utf-8") as f:
            for i in range(args.rows):
                a = 2 * rng.randint(10, 5000)
                row = {"question": QUESTION.format(a=a, i=i), "answer": ANSWER.format(a=a, h=a // 2, t=a + a // 2)}
                f.write(json.dumps(row) + "\n")
        cfg = DataConfig(task="files", path=str(path), assistant_prefix="<think>", num_workers=args.workers)
        timings = {}
        for run in ("cold", "warm"):
            t0 = time.perf_counter()
            split = load_split(cfg)
            t_load = time.perf_counter() - t0
            prepared = prepare_rows(split, cfg, tok)
            timings[run] = {
                "load_s": round(t_load, 2),
                "total_s": round(time.perf_counter() - t0, 2),
                "cached": prepared.cached,
            }
        stats = summary(prepared)
    result = {
        "rows": args.rows,
        "prepared_rows": stats["rows"],
        "workers": args.workers,
        "cpu_count": os.cpu_count(),
        "tokenizer": tok_name,
        "prompt_tokens": stats["prompt_tokens"],
        "cold": timings["cold"],
        "warm": timings["warm"],
        "python": platform.python_version(),
        "machine": platform.machine(),
    }
    out = Path(__file__).resolve().parents[1] / "results" / "data_prepare.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
