"""The modes and names the config validates, importable without torch, transformers or a reward pool.

Each is defined once, here: ``rlvr.config`` checks values against them, and the packages that
implement them import them from this module (``algos`` its modes, ``rewards`` ``OnError``,
``data`` its template file rule). Names that the heavy registries also hold as dict keys
(``data.presets.PRESETS``, ``data.templates.TEMPLATES``, ``data.files.FORMATS``) are checked
against these lists by ``tests/config/test_config_choices.py``.

Standard library only (``tests/test_import_graph.py`` pins it).
"""

from __future__ import annotations

from enum import Enum

try:
    from enum import StrEnum
except ImportError:  # Python 3.10 has no enum.StrEnum

    class StrEnum(str, Enum):  # type: ignore[no-redef]
        def __str__(self) -> str:
            return str(self.value)


# -- algos: one StrEnum per choice, each mapped to one function in rlvr.algos ------------------


class AdvMethod(StrEnum):
    """How a group's rewards become advantages (one small function each, in ``algos/advantages.py``)."""

    GRPO = "grpo"
    DR_GRPO = "dr_grpo"
    RLOO = "rloo"
    REINFORCE_PP = "reinforce_pp"


class KLEstimator(StrEnum):
    """Monte-Carlo estimator of KL(pi || ref) from samples of pi (Schulman, "Approximating KL")."""

    K1 = "k1"
    K2 = "k2"
    K3 = "k3"


class KLPlacement(StrEnum):
    """Where the KL-to-reference term acts: in the loss (GRPO) or subtracted from the reward (PPO-style)."""

    LOSS = "loss"
    REWARD = "reward"


class LossAgg(StrEnum):
    """How a [B, T] per-token loss is reduced to the scalar that is backpropagated."""

    TOKEN_MEAN = "token_mean"
    SEQ_MEAN_TOKEN_MEAN = "seq_mean_token_mean"
    SEQ_MEAN_TOKEN_SUM_NORM = "seq_mean_token_sum_norm"


class RatioLevel(StrEnum):
    """Importance ratio per token (PPO/GRPO) or per sequence, length-normalised (GSPO)."""

    TOKEN = "token"
    SEQUENCE = "sequence"


# -- rollout ----------------------------------------------------------------------------------


class Engine(StrEnum):
    """What generates the rollouts: Hugging Face ``generate`` (``rlvr/rollout/hf.py``) or vLLM (not built yet)."""

    HF = "hf"
    VLLM = "vllm"


# -- distributed ------------------------------------------------------------------------------


class Backend(StrEnum):
    """How a run is spread over processes: one process, or data-parallel Ray workers."""

    NONE = "none"
    RAY = "ray"


class Strategy(StrEnum):
    """What each Ray worker holds: a full replica (gradients all-reduced), or a shard of the weights,
    gradients and optimizer state (PyTorch FSDP2 ``fully_shard``): over every worker (``fsdp``), or
    over the workers of one node, replicated across nodes (``hsdp``)."""

    DDP = "ddp"
    FSDP = "fsdp"
    HSDP = "hsdp"

    @property
    def shards(self) -> bool:
        """A worker holds a shard of the model, not a replica (FSDP2, flat or hybrid)."""
        return self is not Strategy.DDP


# -- rewards ----------------------------------------------------------------------------------


class OnError(str, Enum):
    """What a rule failure (exception, time-out, NaN, non-number) does to its item."""

    SCORE = "score"  # the item gets reward.on_error_score; counted in reward/<name>_errors
    RAISE = "raise"  # stop with RewardError (for debugging a plugin)

    def __str__(self) -> str:
        return self.value


# Reward rule names are not listed here: config does not check them. The Scorer does, when
# training starts (built-ins from rlvr.rewards.registry.REWARDS, plugins by importing them).

# -- tools ------------------------------------------------------------------------------------

TOOL_CALL_SYNTAX = "<tool>{name}: {args}</tool>"
"""The default call syntax (``rollout.tool_call``): what the model writes to call a tool."""
TOOL_RESULT_SYNTAX = "<result>{output}</result>"
"""The default result syntax (``rollout.tool_result``): what the environment appends after a call."""


def parse_tool_syntax(call: str, result: str) -> tuple[str, str, str, str, str]:
    """(open, separator, close, result open, result close) of a tool call syntax.

    ``call`` holds ``{args}`` once, after ``{name}`` when it names the tool (without ``{name}``
    exactly one tool may be configured): non-empty text before the first placeholder (where a call
    starts) and after ``{args}`` (where it ends: generation pauses there); with ``{name}``, non-empty
    text between the two. ``result`` holds ``{output}`` once. Tool names and rule names are not
    checked here: the tool registry does that when a run starts.

    Raises:
        ValueError: a message that says what is wrong with which of the two.
    """
    for key, text, holders in (("call", call, ("{args}",)), ("result", result, ("{output}",))):
        for h in holders:
            if text.count(h) != 1:
                raise ValueError(f"tool_{key}={text!r} must hold {h} exactly once")
    if call.count("{name}") > 1:
        raise ValueError(f"tool_call={call!r} holds {{name}} more than once")
    head, _, close = call.partition("{args}")
    opening, has_name, sep = head.partition("{name}")
    if not has_name:
        opening, sep = head, ""
    if not opening.strip() or not close.strip():
        raise ValueError(
            f"tool_call={call!r} needs text before the first placeholder and after {{args}} "
            "(where a call starts and ends), e.g. '<tool>{name}: {args}</tool>'"
        )
    if has_name and not sep:
        raise ValueError(f"tool_call={call!r} needs text between {{name}} and {{args}}, e.g. '{{name}}: {{args}}'")
    if "{" in opening + sep + close:
        raise ValueError(f"tool_call={call!r}: the only placeholders are {{name}} and {{args}}")
    r_open, _, r_close = result.partition("{output}")
    if not r_open.strip():
        raise ValueError(f"tool_result={result!r} needs text before {{output}}, e.g. '<result>{{output}}</result>'")
    return opening, sep, close, r_open, r_close


# -- data -------------------------------------------------------------------------------------

BUILTIN_TASKS = ("arithmetic", "arithmetic_tool", "countdown", "code")
"""Offline, seeded prompt generators in ``rlvr/data/tasks.py``."""
DATA_TASKS = (*BUILTIN_TASKS, "files")
"""Values of ``data.task``: a built-in task, or ``files`` (read ``data.path``)."""
FILE_FORMATS = ("jsonl", "json", "parquet", "csv", "arrow")
"""Data file formats ``rlvr/data/files.py`` reads (``data.format``, besides ``auto``)."""
DATA_PRESETS = (
    "auto",
    "gsm8k",
    "math",
    "math500",
    "deepscaler",
    "orz",
    "dapo_math",
    "alpaca",
    "humaneval",
    "mbpp",
    "apps",
    "lcb",
    "deepcoder",
    "kodcode",
    "trl",
    "custom",
)
"""Values of ``data.preset``: ``auto`` (detect), the schemas of ``rlvr/data/presets.py``, ``custom``."""
TEMPLATE_NAMES = ("r1", "qwen_r1", "r1_base", "r1_tool", "r1_code", "cot", "plain")
"""Built-in prompt templates (``rlvr/data/templates.py``), in the order error messages list them."""
TEMPLATE_FILE_SUFFIXES = (".yaml", ".yml", ".json")


def is_template_file(spec: str) -> bool:
    """True if ``spec`` names a template file (``FILE.yaml``, ``FILE.json``, ``FILE.yaml:NAME``)."""
    return spec.rsplit(":", 1)[0].endswith(TEMPLATE_FILE_SUFFIXES) or spec.endswith(TEMPLATE_FILE_SUFFIXES)
