"""Evaluation inside a training run: at step 0, every ``eval.every_steps``, and after the last step.

The trainer calls :meth:`TrainingEval.run` with its own rollout engine (weights synced), so
evaluation costs generation only: no second model copy. Data-parallel workers (Ray) each evaluate a
strided share of the rows, every row sampled with its own seeds, and rank 0 gathers the shares into
the result one process would get (:func:`rlvr.evaluation.evaluate.merge_results`). Results go to
``RUN/eval/step_NNNNNN/{summary.json,predictions.jsonl}``, one line per evaluation in
``RUN/eval/history.jsonl``, and back to the trainer as ``eval/<metric>`` floats.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch

from rlvr import metric_names as M
from rlvr.evaluation.evaluate import (
    PromptStyle,
    evaluate,
    load_eval_rows,
    merge_results,
    metric_keys,
    write_result,
)
from rlvr.jsonl import JsonlWriter, truncate_jsonl
from rlvr.rollout.hf import sample_seed
from rlvr.run_dir import RunDir


class TrainingEval:
    """Decides when to evaluate and runs it.

    Args:
        eval_cfg: the run's :class:`rlvr.config.EvalConfig`.
        data_cfg: the run's DataConfig (prompt template; its test split is the default eval data).
        test_rows: the run's test rows (used when ``eval.data`` is empty).
        rollout_max_new_tokens: default response limit (``eval.max_new_tokens=0``).
        total_steps: the run's last step (``eval.at_end``).
        scorer: the trainer's :class:`rlvr.rewards.Scorer`, so evaluation scores with the same rules,
            worker pool and time limit as training (None = a default Scorer).
        seed: the run's seed: with ``eval.samples > 1`` row i's sample j at step s is seeded by
            ``(seed, s, i, j)`` alone, whichever process evaluates it.
    """

    def __init__(
        self,
        eval_cfg,
        data_cfg,
        test_rows: list[dict],
        run_dir: Path,
        *,
        rollout_max_new_tokens: int,
        total_steps: int,
        scorer=None,
        seed: int = 0,
    ) -> None:
        self.cfg = eval_cfg
        self.scorer = scorer
        self.seed = seed
        self.run_dir = RunDir(run_dir)
        self.total_steps = total_steps
        self.style = PromptStyle(data_cfg.template, data_cfg.system_prompt, data_cfg.assistant_prefix)
        self.max_new_tokens = eval_cfg.max_new_tokens or rollout_max_new_tokens
        if eval_cfg.data:
            rows = load_eval_rows(eval_cfg.data, limit=eval_cfg.limit or None, difficulty=data_cfg.difficulty)
        else:
            rows = test_rows[: eval_cfg.limit] if eval_cfg.limit else test_rows
        self.rows = rows

    @property
    def enabled(self) -> bool:
        return bool(self.rows) and (self.cfg.at_start or self.cfg.at_end or self.cfg.every_steps > 0)

    def due(self, step: int) -> bool:
        """Whether to evaluate the model after ``step`` optimizer steps (0 = the starting model)."""
        if not self.enabled:
            return False
        if step == 0:
            return self.cfg.at_start
        if step == self.total_steps and self.cfg.at_end:
            return True
        return self.cfg.every_steps > 0 and step % self.cfg.every_steps == 0

    def run(self, engine, tokenizer, step: int, group=None) -> dict[str, float] | None:
        """Evaluate the engine's current weights; returns ``{"eval/accuracy": ..., "eval/time_s": ...}``.

        With a data-parallel ``group`` (:class:`rlvr.training.replicas.OneProcess`'s methods) every
        rank calls it at once (a collective): rank r evaluates rows ``r::world_size``, rank 0 gathers
        the shares, writes the result as one process would and returns the metrics; the others
        return None. Sampling (``eval.samples > 1``) is seeded per row and runs under a forked RNG,
        so evaluating never changes the training trajectory.
        """
        rank, world = (0, 1) if group is None else (group.rank, group.world_size)
        t0 = time.perf_counter()
        engine.sync_weights()
        ids = range(rank, len(self.rows), world)
        K = self.cfg.samples
        seeds = [sample_seed(self.seed, step, i, j) for i in ids for j in range(K)] if K > 1 else None
        with torch.random.fork_rng(devices=[]):
            result = evaluate(
                engine,
                tokenizer,
                [self.rows[i] for i in ids],
                style=self.style,
                samples=K,
                temperature=self.cfg.temperature,
                max_new_tokens=self.max_new_tokens,
                batch_prompts=self.cfg.batch_prompts,
                scorer=self.scorer,
                seeds=seeds,
            )
        if world > 1:
            parts = group.gather(result)  # every rank's share, in rank order
            if rank != 0:
                return None
            result = merge_results(parts, elapsed=time.perf_counter() - t0)
        write_result(result, self.run_dir.eval_dir(step), step=step)
        metrics = {M.eval_key(k): float(result.summary[k]) for k in metric_keys(result.summary)}
        metrics[M.EVAL_TIME_S] = float(result.summary["time_s"])
        history = self.run_dir.eval_history_file
        truncate_jsonl(history, step - 1)  # a resumed run redoes evaluations past its checkpoint
        with JsonlWriter(history) as writer:
            writer.write({"step": step, **metrics})
        return metrics


def describe(step: int, metrics: dict[str, float]) -> str:
    """One console line for an evaluation's metrics."""
    shown = "  ".join(
        f"{k.removeprefix('eval/')} {v:.3f}"
        for k, v in metrics.items()
        if k.startswith(M.EVAL) and k not in (M.EVAL_TIME_S, M.EVAL_RESPONSE_LEN_MEAN)
    )
    return f"eval after step {step}: {shown}  ({metrics.get('eval/time_s', 0):.1f} s)"
