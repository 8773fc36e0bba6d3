"""Every metric key a training run writes, named once: the trainer and every reader import them.

Keys have a namespace: ``rollout/`` (everything sampled this step), ``reward/`` (one reward
rule), ``train/`` (the update), ``eval/`` (held-out evaluation), ``time/`` (phase wall times,
seconds) and ``perf/`` (throughput, memory). Rows of ``metrics.jsonl`` also hold ``step``.
Standard library only: the light readers (report, compare) import it without torch.
"""

from __future__ import annotations

# -- rollout/: everything sampled this step (with DAPO dynamic sampling, the dropped groups too)
ROLLOUT = "rollout/"
TURNS_MEAN = "rollout/turns_mean"
"""Turns per code episode (rollout.max_turns > 1): 1 where the first attempt passed or was cut."""
CODE = "code/"
"""The code rules' sandbox per step (:func:`rlvr.rewards.code.drain_stats`): ``code/programs``,
``code/timeouts``, ``code/sandbox_errors``, ``code/exec_s``."""
REWARD_MEAN = "rollout/reward_mean"
REWARD_STD = "rollout/reward_std"
ACCURACY = "rollout/accuracy"
FORMAT_RATE = "rollout/format_rate"
ZERO_STD_GROUPS = "rollout/zero_std_groups"
RESPONSE_LEN_MEAN = "rollout/response_len_mean"
RESPONSE_LEN_MAX = "rollout/response_len_max"
TRUNCATED_FRAC = "rollout/truncated_frac"
OVERLONG_PENALTY_MEAN = "rollout/overlong_penalty_mean"
DROPPED_GROUPS = "rollout/dropped_groups"
EXTRA_BATCHES = "rollout/extra_batches"
# with rollout.tools only (evaluation writes the same names under eval/)
TOOL_CALLS_MEAN = "rollout/tool_calls_mean"
"""Tool calls per completion (errors included)."""
TOOL_ERROR_RATE = "rollout/tool_error_rate"
"""Of the step's tool calls, the fraction that answered an error (0 when none was made)."""
TOOL_USE_RATE = "rollout/tool_use_rate"
"""Completions with at least one tool call."""
ACCURACY_WITH_TOOL = "rollout/accuracy_with_tool"
"""Accuracy of the completions that called a tool (absent when none did)."""
ACCURACY_WITHOUT_TOOL = "rollout/accuracy_without_tool"
"""Accuracy of the completions that called none (absent when all did)."""

# -- reward/: one reward rule
REWARD = "reward/"


def reward_mean(rule: str) -> str:
    """``reward/<rule>_mean``: the rule's mean score over the step's completions."""
    return f"{REWARD}{rule}_mean"


def reward_errors(rule: str) -> str:
    """``reward/<rule>_errors``: completions whose score raised, timed out or was not finite."""
    return f"{REWARD}{rule}_errors"


def rule_of_mean(key: str) -> str | None:
    """The rule named by a :func:`reward_mean` key, else None."""
    if key.startswith(REWARD) and key.endswith("_mean"):
        return key.removeprefix(REWARD).removesuffix("_mean")
    return None


# -- train/: the update. accumulate_gradients returns its statistics without the prefix
TRAIN = "train/"
ADV_MEAN = "train/adv_mean"
ADV_STD = "train/adv_std"
LOSS = "train/loss"
PG_LOSS = "train/pg_loss"
KL = "train/kl"
ENTROPY = "train/entropy"
CLIP_FRAC = "train/clip_frac"
CLIP_FRAC_LOW = "train/clip_frac_low"
CLIP_FRAC_HIGH = "train/clip_frac_high"
DUAL_CLIP_FRAC = "train/dual_clip_frac"
RATIO_MEAN = "train/ratio_mean"
RATIO_MIN = "train/ratio_min"
RATIO_MAX = "train/ratio_max"
TIS_WEIGHT_MEAN = "train/tis_weight_mean"
TIS_WEIGHT_MIN = "train/tis_weight_min"
TIS_WEIGHT_MAX = "train/tis_weight_max"
TIS_CAPPED_FRAC = "train/tis_capped_frac"
GRAD_NORM = "train/grad_norm"
LR = "train/lr"
SKIPPED_UPDATES = "train/skipped_updates"
SKIPPED_STEPS = "train/skipped_steps"
FORWARD_ONLY_FRAC = "train/forward_only_frac"


def train(stat: str) -> str:
    """``train/<stat>``: the key of one statistic of the update."""
    return TRAIN + stat


def stat(key: str) -> str:
    """The statistic a ``train/`` key names (the inverse of :func:`train`)."""
    return key.removeprefix(TRAIN)


# -- eval/: held-out evaluation (RUN/eval/history.jsonl; in metrics.jsonl on evaluated steps)
EVAL = "eval/"
EVAL_ACCURACY = "eval/accuracy"
EVAL_ACCURACY_LENIENT = "eval/accuracy_lenient"
EVAL_FORMAT_RATE = "eval/format_rate"
EVAL_RESPONSE_LEN_MEAN = "eval/response_len_mean"
EVAL_PASS_AT = "eval/pass@"
"""Prefix of ``eval/pass@<k>``."""
EVAL_MAJ_AT = "eval/maj@"
"""Prefix of ``eval/maj@<k>``."""
EVAL_TIME_S = "eval/time_s"


def eval_key(name: str) -> str:
    """``eval/<name>``: one field of an evaluation summary."""
    return EVAL + name


# -- time/: wall time of the step's phases, seconds
TIME_ROLLOUT_S = "time/rollout_s"
TIME_REWARD_S = "time/reward_s"
TIME_REFERENCE_S = "time/reference_s"
TIME_UPDATE_S = "time/update_s"
TIME_STEP_S = "time/step_s"
TIME_WAIT_ROLLOUT_S = "time/wait_rollout_s"
"""Asynchronous rollouts: how long the trainers waited for the step's rollout (0 when it was ready)."""
TIME_ROLLOUT_IDLE_S = "time/rollout_idle_s"
"""Asynchronous rollouts: how long the rollout worker waited (for weights or work) before it began the
step's rollout."""
TIME_WEIGHT_PUSH_S = "time/weight_push_s"
"""Asynchronous rollouts: the push of the weights the step's rollout sampled with (the trainer's put and
the worker's load; 0 when the worker already held them)."""

# -- async/: asynchronous rollouts (distributed.rollout_workers > 0)
ASYNC = "async/"
ASYNC_STALENESS = "async/staleness"
"""Updates between the weights that sampled the step's batch and the weights it trains (0 = on-policy)."""
ASYNC_QUEUE_DEPTH = "async/queue_depth"
"""Rollouts made or under way and not yet trained, this step's included, as the step began."""
ASYNC_OVERLAP_FRAC = "async/overlap_frac"
"""The share of the step's rollout time that the trainers did not wait for (1 = hidden behind updates)."""

# -- perf/: throughput and memory
GEN_TOKENS_PER_S = "perf/gen_tokens_per_s"
STEP_TOKENS_PER_S = "perf/step_tokens_per_s"
"""Derived by the run reader (response tokens of the step / its wall time), not written by the trainer."""
PEAK_RSS_MIB = "perf/peak_rss_mib"
CUDA_MAX_ALLOCATED_MIB = "perf/cuda_max_allocated_mib"
TRAIN_STATE_MIB = "perf/train_state_mib"
"""What this worker holds of the policy's parameters, gradients and AdamW state, measured from the
tensors (under FSDP its shards: about 1/N of a replica's)."""
