"""Tool-use statistics of a set of completions: the ``rollout/tool_*`` and ``eval/tool_*`` metrics."""

from __future__ import annotations


def tool_stats(calls: list[int], errors: list[int], acc: list[float]) -> dict[str, float]:
    """Tool-use statistics of n completions, keyed by name (``rollout/`` and ``eval/`` prefix them,
    :mod:`rlvr.metric_names`): ``tool_calls_mean``, ``tool_use_rate``, ``tool_error_rate`` (errors
    over calls, 0 without calls), and ``accuracy_with_tool`` / ``accuracy_without_tool`` (each
    absent when no completion is in its part).

    Args:
        calls, errors: [n] calls and error results per completion; acc: [n] accuracy scores.
    """
    n, total = len(calls), sum(calls)
    used = [a for a, c in zip(acc, calls) if c > 0]
    unused = [a for a, c in zip(acc, calls) if c == 0]
    out = {
        "tool_calls_mean": total / max(n, 1),
        "tool_use_rate": len(used) / max(n, 1),
        "tool_error_rate": sum(errors) / total if total else 0.0,
    }
    if used:
        out["accuracy_with_tool"] = sum(used) / len(used)
    if unused:
        out["accuracy_without_tool"] = sum(unused) / len(unused)
    return out
