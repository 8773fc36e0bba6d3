"""Evaluation during training split across data-parallel ranks: rank r evaluates rows ``r::N``, each
row's samples seeded by (seed, step, row, sample) alone, and rank 0 writes what one process writes.
Merging strided shares in one process (fast), then 2 gloo ranks against one process (seconds, no Ray;
the Ray wiring: tests/distributed/test_ray_dp.py)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from rlvr.config import load_config
from rlvr.evaluation.during_training import TrainingEval
from rlvr.evaluation.evaluate import PromptStyle, evaluate, merge_results
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.hf import sample_seed

ROWS = [{"question": f"what is {a} + {b} ?", "answer": str(a + b)} for a, b in [(1, 2), (3, 4), (2, 2), (5, 1), (0, 7)]]
EVAL = ["data.template=r1_base", "eval.samples=4", "eval.batch_prompts=2", "eval.max_new_tokens=6"]


def _engine():
    return HFRolloutEngine(tiny_model(seed=1), tiny_tokenizer(), max_new_tokens=6, dtype="float32")


def _without_time(summary: dict) -> dict:
    return {k: v for k, v in summary.items() if k != "time_s"}


def test_strided_shares_merge_into_the_evaluation_of_every_row():
    engine, tok, K = _engine(), tiny_tokenizer(), 4
    seeds = lambda ids: [sample_seed(9, i, j) for i in ids for j in range(K)]  # noqa: E731
    kw = dict(style=PromptStyle(template="r1_base"), samples=K, max_new_tokens=6, batch_prompts=2)
    whole = evaluate(engine, tok, ROWS, seeds=seeds(range(len(ROWS))), **kw)
    parts = [
        evaluate(engine, tok, ROWS[r::2], seeds=seeds(range(r, len(ROWS), 2)), **{**kw, "batch_prompts": 3})
        for r in range(2)
    ]
    merged = merge_results(parts, elapsed=1.5)
    assert merged.predictions == whole.predictions and merged.tallies == whole.tallies
    assert _without_time(merged.summary) == _without_time(whole.summary) and merged.summary["time_s"] == 1.5
    assert "pass@4" in whole.summary and whole.summary["n"] == len(ROWS)
    # a row's samples do not depend on its neighbours: the seeds, not the batch, decide them
    again = evaluate(engine, tok, ROWS[::-1], seeds=seeds(range(len(ROWS)))[::-1], **kw)
    assert [p["completion"] for p in again.predictions[::-1]] == [p["completion"] for p in whole.predictions]
    with pytest.raises(ValueError, match="3 seeds for 5 rows x 4 samples"):
        evaluate(engine, tok, ROWS, seeds=[1, 2, 3], **kw)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _evaluator(run_dir: Path) -> TrainingEval:
    cfg = load_config(None, EVAL)
    return TrainingEval(cfg.eval, cfg.data, ROWS, run_dir, rollout_max_new_tokens=6, total_steps=3, seed=5)


def _ranks(rank: int, world: int, port: int, out: str) -> None:
    from rlvr.distributed.group import TorchGroup

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    group = TorchGroup(rank, world, "cpu")
    torch.manual_seed(100 + rank)  # the ranks' RNGs differ, as after data-parallel steps: the seeds decide
    metrics = _evaluator(Path(out)).run(_engine(), tiny_tokenizer(), 2, group)
    assert (metrics is None) == (rank != 0)
    if rank == 0:
        (Path(out) / "returned.json").write_text(json.dumps(metrics))
    dist.destroy_process_group()


def _written(run_dir: Path) -> tuple[dict, list[str], list[dict]]:
    step = run_dir / "eval" / "step_000002"
    summary = json.loads((step / "summary.json").read_text())
    history = [json.loads(line) for line in (run_dir / "eval" / "history.jsonl").read_text().splitlines()]
    for row in history:
        row.pop("eval/time_s")
    return _without_time(summary), (step / "predictions.jsonl").read_text().splitlines(), history


@pytest.mark.slow
def test_two_ranks_write_the_evaluation_of_one_process(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    torch.manual_seed(0)
    want = _evaluator(one).run(_engine(), tiny_tokenizer(), 2)
    mp.spawn(_ranks, args=(2, _port(), str(two)), nprocs=2)
    got = json.loads((two / "returned.json").read_text())
    assert {k: v for k, v in got.items() if k != "eval/time_s"} == {k: v for k, v in want.items() if k != "eval/time_s"}
    assert _written(two) == _written(one)
    assert not (two / "eval" / "step_000002_rank1").exists() and len(list((two / "eval").iterdir())) == 2
