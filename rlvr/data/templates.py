"""Prompt templates, rendered through the tokenizer's own chat template."""

from __future__ import annotations

# The DeepSeek-R1-Zero instruction, worded as in MindSpeed-RL's `qwen_r1` template.
R1_INSTRUCTION = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the "
    "answer. The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>. "
    "Put your final answer within \\boxed{}.\n"
)


def build_messages(question: str, *, template: str = "r1", system_prompt: str = "") -> list[dict]:
    """Chat messages for one question: optional system turn, then the templated user turn."""
    user = R1_INSTRUCTION + question if template == "r1" else question
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return messages + [{"role": "user", "content": user}]


def render_prompt(tokenizer, question: str, *, template: str = "r1", system_prompt: str = "", assistant_prefix: str = "") -> str:
    """The full prompt text: chat template with the assistant turn opened, plus ``assistant_prefix``."""
    messages = build_messages(question, template=template, system_prompt=system_prompt)
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    else:  # a tokenizer without a chat template (e.g. tiny test tokenizers): plain role lines
        text = "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant: "
    return text + assistant_prefix
