"""Benchmark evaluation: greedy accuracy, pass@k, maj@k = rollout + answer checking. No training imports."""

from rlvr.evaluation.evaluate import EvalResult, PromptStyle, evaluate, load_eval_rows, write_result
from rlvr.evaluation.metrics import ks_up_to, majority_vote, pass_at_k

__all__ = [
    "EvalResult",
    "PromptStyle",
    "evaluate",
    "ks_up_to",
    "load_eval_rows",
    "majority_vote",
    "pass_at_k",
    "write_result",
]
