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
"""

from rlvr.algos.advantages import group_advantages
from rlvr.algos.logprobs import token_entropy, token_logprobs
from rlvr.algos.losses import (
    KLEstimator,
    LossAgg,
    aggregate,
    clipped_surrogate,
    kl_penalty,
    masked_mean,
)

__all__ = [
    "KLEstimator",
    "LossAgg",
    "aggregate",
    "clipped_surrogate",
    "group_advantages",
    "kl_penalty",
    "masked_mean",
    "token_entropy",
    "token_logprobs",
]
