"""Prompt data: local files through dataset presets, built-in offline tasks, prompt templates,
preparation (render + tokenise + cache) and the step-wise prompt stream.

Entry points:
- :func:`load_rows` / :func:`load_split`: rows ``{"question", "answer", "system", "fields"}``
  for a :class:`rlvr.config.DataConfig` (train and test);
- :func:`prepare` / :func:`prepare_rows`: the same rows plus ``"prompt"`` (exact rendered
  text) and ``"prompt_tokens"``, cached;
- :func:`render_prompt`: one prompt; :data:`TEMPLATES`: the built-in templates;
- ``row["fields"]`` holds the extra values reward functions receive as keyword arguments.
"""

from rlvr.data.loading import Split, load_rows, load_split
from rlvr.data.prepare import Prepared, prepare, prepare_rows
from rlvr.data.presets import PRESETS
from rlvr.data.stream import PromptStream
from rlvr.data.tasks import arithmetic, arithmetic_tool, countdown, countdown_reward, countdown_score, safe_arithmetic
from rlvr.data.templates import (
    R1_INSTRUCTION,
    TEMPLATES,
    PromptTemplate,
    build_messages,
    get_template,
    render_prompt,
    template_for,
)

__all__ = [
    "PRESETS",
    "Prepared",
    "PromptStream",
    "PromptTemplate",
    "R1_INSTRUCTION",
    "Split",
    "TEMPLATES",
    "arithmetic",
    "arithmetic_tool",
    "build_messages",
    "countdown",
    "countdown_reward",
    "countdown_score",
    "get_template",
    "load_rows",
    "load_split",
    "prepare",
    "prepare_rows",
    "render_prompt",
    "safe_arithmetic",
    "template_for",
]
