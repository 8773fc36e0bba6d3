"""Pure tensor math for GRPO-style RL with verifiable rewards.

Imports only torch and the standard library: no I/O, no config objects, no
distributed calls and no host syncs (``.item()``), so every function here can be
unit-tested on CPU and reused unchanged by any trainer.

Shape letters used in every docstring of this package:

- P: prompts in a step.
- G: samples (completions) per prompt, the group size.
- B: sequences, B = P·G; rows are ordered so that consecutive runs of G rows
  belong to one prompt.
- T: response tokens per sequence (right-padded; ``mask`` marks real tokens).
- V: vocabulary size.

Every mode is a ``StrEnum`` mapped to one small function through a dict. The enums are defined
in :mod:`rlvr.choices` (so the config validates them without importing torch) and exported here.
"""

from rlvr.algos.advantages import group_advantages, informative_groups
from rlvr.algos.logprobs import entropy_from_logits, lm_head_logprobs, token_logprobs, token_logprobs_entropy
from rlvr.algos.losses import (
    aggregate,
    kl_divergence,
    masked_mean,
    policy_loss,
    token_loss,
    truncated_importance_weights,
)
from rlvr.algos.shaping import kl_shaped_rewards, overlong_penalty
from rlvr.choices import AdvMethod, KLEstimator, KLPlacement, LossAgg, RatioLevel  # the modes these functions take

__all__ = [
    "AdvMethod",
    "KLEstimator",
    "KLPlacement",
    "LossAgg",
    "RatioLevel",
    "aggregate",
    "entropy_from_logits",
    "group_advantages",
    "informative_groups",
    "kl_divergence",
    "kl_shaped_rewards",
    "lm_head_logprobs",
    "masked_mean",
    "overlong_penalty",
    "policy_loss",
    "token_logprobs",
    "token_logprobs_entropy",
    "token_loss",
    "truncated_importance_weights",
]
