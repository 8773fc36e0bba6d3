"""`rlvr export` of a run trained with the r1 template: plain transformers, loading the export, prompts the
model token for token as training did, and the model card shows that prompt. CPU, no downloads, seconds."""

from __future__ import annotations

import re

import pytest
import tiny_run

from rlvr.cli import main
from rlvr.data.templates import get_template, render
from rlvr.models.tiny import save_tiny_model, tiny_tokenizer

pytestmark = pytest.mark.slow

# SmolLM2-Instruct's chat template, which adds its own default system turn when the messages have none.
SMOLLM = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}"
    "{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture
def r1_run(tmp_path, tiny_dir, monkeypatch):
    """A one-step tiny run with the quickstart's prompt: template r1, its system prompt, prefix <think>."""
    from rlvr.training import train

    monkeypatch.chdir(tmp_path)
    tok = tiny_tokenizer()
    tok.chat_template = SMOLLM
    tok.save_pretrained(tiny_dir)
    run = tmp_path / "run"
    train(
        tiny_run.tiny_config(
            tiny_dir,
            run,
            "data.template=r1",
            "data.system_prompt=null",
            "data.assistant_prefix=<think>",
            "rollout.stop=[</answer>]",
            "train.steps=1",
        )
    )
    return run


def test_export_prompts_as_training_did(r1_run, tmp_path, capsys):
    from transformers import AutoTokenizer

    assert main(["export", str(r1_run), "--output", str(tmp_path / "exported")]) == 0
    trained = AutoTokenizer.from_pretrained(r1_run / "checkpoints" / "last")
    exported = AutoTokenizer.from_pretrained(tmp_path / "exported")
    template = get_template("r1", assistant_prefix="<think>")  # the run's, as rlvr builds its prompts
    for question in ["what is 3 + 4 ?", "What is 2 + 3?", "f(x) = {x} \\boxed{ 7 }"]:
        messages = [{"role": "user", "content": question}]
        text = render(trained, template, question)
        assert "You are a helpful assistant." in text and "SmolLM" not in text and text.endswith("<think>")
        ids = exported.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert ids == trained(text, add_special_tokens=False).input_ids
        assert exported.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) == text

    card = (tmp_path / "exported" / "README.md").read_text()
    assert "system prompt `None`" not in card
    assert 'system prompt "You are a helpful assistant.", assistant prefix `<think>`' in card
    example = render(trained, template, "What is 2 + 3?")
    assert "\n".join(["```text", example, "```"]) in card  # the exact prompt, rendered
    assert "stop_strings=['</answer>']" in card


def test_card_snippet_runs(r1_run, tmp_path):
    """The card's Python example loads the export and generates (stop strings aside: the tiny
    tokenizer's vocabulary is not one transformers' stop-string matcher can read). Without --output
    a run exports to runs/export/RUN, one of its checkpoints to runs/export/RUN-STEP."""
    assert main(["export", "run"]) == 0
    out = tmp_path / "runs" / "export" / "run"
    assert main(["export", "run/checkpoints/step_000001"]) == 0
    assert (tmp_path / "runs" / "export" / "run-step_000001" / "model.safetensors").is_file()
    snippet = re.search(r"```python\n(.*?)```", (out / "README.md").read_text(), re.S).group(1)
    snippet = re.sub(r", stop_strings=.*?, tokenizer=tokenizer", "", snippet)
    exec(snippet, {"PATH": str(out), "print": lambda *a: None})  # noqa: S102 - our own card's example


def test_export_outside_a_run_keeps_the_tokenizers_template(tmp_path, capsys):
    model = save_tiny_model(tmp_path / "m")
    tok = tiny_tokenizer()
    tok.chat_template = SMOLLM
    tok.save_pretrained(model)
    assert main(["export", str(model), "--output", str(tmp_path / "exported")]) == 0
    from transformers import AutoTokenizer

    assert AutoTokenizer.from_pretrained(tmp_path / "exported").chat_template == SMOLLM
    assert "tokenizer's own chat template is kept" in (tmp_path / "exported" / "README.md").read_text()
