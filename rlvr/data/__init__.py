"""Prompt data: built-in offline tasks, JSONL files, the R1 prompt template, and the step-wise prompt stream."""

from rlvr.data.files import load_jsonl
from rlvr.data.stream import PromptStream
from rlvr.data.tasks import arithmetic
from rlvr.data.templates import R1_INSTRUCTION, build_messages, render_prompt

__all__ = ["PromptStream", "R1_INSTRUCTION", "arithmetic", "build_messages", "load_jsonl", "render_prompt"]
