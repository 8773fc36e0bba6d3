"""Fixtures of the data tests."""

import pytest

from rlvr.models.tiny import save_tiny_model, tiny_tokenizer

CHAT_TEMPLATE = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}<|assistant|>"


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A tiny model directory whose tokenizer has a chat template, so that prompts render as chats."""
    path = save_tiny_model(tmp_path_factory.mktemp("tiny") / "m")
    tok = tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(path)
    return path
