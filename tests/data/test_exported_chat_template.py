"""`rlvr.data.templates.chat_template`: a tokenizer chat template that renders rlvr's own prompt, so a model
exported by `rlvr export` is prompted by plain transformers exactly as it was trained."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from rlvr.data.templates import chat_template, get_template, load_template_file, render
from rlvr.errors import UserError
from rlvr.models.tiny import tiny_tokenizer

# ChatML without a default system turn (Qwen2.5-like), and SmolLM2-Instruct's, which adds its own default.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SMOLLM = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}\n"  # a file's trailing newline
)
QUESTIONS = ["What is 4 + 5?", "f(x) = {x}; is \\boxed{2} {% raw %} right?", ' "quoted"\n and spaced ']


def tokenizers():
    """(name, tokenizer): the tiny one with each chat template (or none), and the built-in model's if converted."""
    out = []
    for name, base in [("chatml", CHATML), ("smollm", SMOLLM), ("none", None)]:
        tok = tiny_tokenizer()
        tok.chat_template = base
        out.append((name, tok))
    path = Path.home() / ".cache/rlvr/models/smollm2-135m-instruct"
    if (path / "tokenizer.json").is_file():
        from transformers import AutoTokenizer

        out.append(("builtin", AutoTokenizer.from_pretrained(path)))
    return out


TEMPLATES = [
    ("r1", {"assistant_prefix": "<think>"}),  # the quickstart's
    ("r1", {}),
    ("r1", {"system_prompt": ""}),  # no system turn of ours: the chat template's default, as in training
    ("r1", {"system_prompt": 'Réponds "vite" 😀 {{ x }} %} \\n'}),
    ("cot", {}),
    ("plain", {}),
    ("plain", {"system_prompt": "Sys", "assistant_prefix": "<think>"}),
    ("r1_base", {}),
]


@pytest.mark.parametrize(("tok_name", "tok"), tokenizers(), ids=lambda v: v if isinstance(v, str) else "")
@pytest.mark.parametrize(("spec", "overrides"), TEMPLATES)
def test_exported_template_renders_rlvrs_prompt(tok_name, tok, spec, overrides):
    template = get_template(spec, **overrides)
    if template.chat and not tok.chat_template:
        with pytest.raises(UserError, match="needs a chat template"):
            chat_template(template, tok.chat_template)
        return
    exported = copy.deepcopy(tok)
    exported.chat_template = chat_template(template, tok.chat_template)
    for question in QUESTIONS:
        messages = [{"role": "user", "content": question}]
        text = render(tok, template, question)  # what training and evaluation feed the model
        assert exported.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text
        ids = exported.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert ids == tok(text, add_special_tokens=False).input_ids


def test_a_given_system_turn_and_history_are_kept():
    tok = tiny_tokenizer()
    tok.chat_template = chat_template(get_template("r1"), CHATML)
    r1 = get_template("r1").user_text
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "1 + 1"},
        {"role": "assistant", "content": "2"},
        {"role": "user", "content": "2 + 2"},
    ]
    assert tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n"
        f"<|im_start|>user\n{r1('1 + 1')}<|im_end|>\n<|im_start|>assistant\n2<|im_end|>\n"
        f"<|im_start|>user\n{r1('2 + 2')}<|im_end|>\n<|im_start|>assistant\n"
    )
    template = get_template("cot", assistant_prefix="<think>")
    tok.chat_template = chat_template(template, CHATML)
    assert tok.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=False) == (
        f"<|im_start|>user\n{template.user_text('1 + 1')}<|im_end|>\n"  # no prefix without the assistant turn
    )


def test_template_file(tmp_path):
    path = tmp_path / "t.yaml"
    path.write_text('system: "Sys."\nuser: "Solve: {problem}\\nBox it."\nassistant_prefix: "<think>"\n')
    template = load_template_file(str(path))
    tok = tiny_tokenizer()
    tok.chat_template = CHATML
    exported = copy.deepcopy(tok)
    exported.chat_template = chat_template(template, CHATML)
    messages = [{"role": "user", "content": "1+1"}]
    assert exported.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == render(
        tok, template, "1+1"
    )
    assert str(tmp_path) not in exported.chat_template  # the file's name alone: no local paths in an export
