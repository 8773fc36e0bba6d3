"""`rlvr chat`'s streaming: what the terminal shows is the answer the conversation keeps. CPU, no downloads."""

from __future__ import annotations

import pytest
import torch

from rlvr.commands.chat import Chat, until_stop
from rlvr.evaluation.evaluate import PromptStyle
from rlvr.models.tiny import TINY_WORDS, tiny_model, tiny_tokenizer


def always(word: str):
    """A tiny model that greedily says ``word`` every step: its LM head is a bias alone."""
    model = tiny_model().eval()
    head = torch.nn.Linear(model.config.hidden_size, len(TINY_WORDS), bias=True)
    with torch.no_grad():
        head.weight.zero_()
        head.bias.zero_()
        head.bias[TINY_WORDS.index(word)] = 10.0
    model.lm_head = head
    return model


def test_streamed_text_ends_where_the_answer_ends():
    """The token that completes a stop string carries more text (here ``>`` after ``</answer``, as
    SmolLM's BPE merges ``><``): the streamer flushes it whole at the end, and chat showed it."""
    style = PromptStyle(template="plain", system_prompt="", assistant_prefix="<think>")
    chat = Chat(always("</answer>"), tiny_tokenizer(), style, max_new_tokens=4, temperature=0, stop=["</answer"])
    shown = []
    answer = chat.reply("what is 3 + 4 ?", on_text=shown.append)
    assert answer == "<think></answer"
    assert "".join(shown) == answer
    assert chat.history[-1] == {"role": "assistant", "content": answer}


@pytest.mark.parametrize(
    ("pieces", "stop", "expected"),
    [
        (["<answer> 9</answer", "><"], ["</answer>"], ["<answer> 9</answer", ">"]),
        (["<answer> 9", "</answer><", "more"], ["</answer>"], ["<answer> 9", "</answer>"]),
        (["a ", "b"], [], ["a ", "b"]),
        (["a ", "b"], ["</answer>"], ["a ", "b"]),
        (["x</answer>", "</answer>"], ["</answer>", "x"], ["x"]),  # the first stop string to end wins
    ],
)
def test_until_stop_cuts_the_stream_like_cut_at_stop(pieces, stop, expected):
    from rlvr.rollout.base import cut_at_stop

    assert list(until_stop(iter(pieces), stop)) == expected
    assert "".join(expected) == cut_at_stop("".join(pieces), stop)
