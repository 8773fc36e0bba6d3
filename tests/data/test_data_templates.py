"""Prompt templates against the exact expected strings, template files, the quickstart prompt, countdown."""

import json
from pathlib import Path

import pytest

from rlvr.config import DataConfig, load_config
from rlvr.data import (
    TEMPLATES,
    build_messages,
    countdown,
    countdown_score,
    get_template,
    render_prompt,
    safe_arithmetic,
)
from rlvr.data.tasks import countdown_reward
from rlvr.data.templates import template_for
from rlvr.errors import UserError
from rlvr.models.tiny import tiny_tokenizer

# MindSpeed-RL configs/model/templates.json `qwen_r1`, written out here rather than imported.
R1_TEXT = (
    "A conversation between User and Assistant. The user asks a question, and the Assistant solves it. "
    "The assistant first thinks about the reasoning process in the mind and then provides the user with the answer. "
    "The reasoning process and answer are enclosed within <think> </think> and <answer> </answer> tags, "
    "respectively, i.e., <think> reasoning process here </think><answer> answer here </answer>. "
    "Put your final answer within \\boxed{}.\n"
)
# A ChatML template like Qwen2.5's / SmolLM2's, without their default system prompt.
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat_tok():
    tok = tiny_tokenizer()
    tok.chat_template = CHATML
    return tok


def test_r1_matches_mindspeed_qwen_r1_rendering(chat_tok):
    # reference §2.1: the fully rendered qwen_r1 prompt
    text = render_prompt(chat_tok, "What is 3 + 4?", template="r1")
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{R1_TEXT}What is 3 + 4?<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    assert render_prompt(chat_tok, "What is 3 + 4?", template="qwen_r1") == text


def test_quickstart_prompt_is_unchanged(chat_tok):
    cfg = load_config("quickstart")
    t = template_for(cfg.data)
    assert (t.name, t.system, t.assistant_prefix) == ("r1", "You are a helpful assistant.", "<think>")
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": R1_TEXT + "What is 5 + 2?"},
    ]
    expected = chat_tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True) + "<think>"
    assert render_prompt(chat_tok, "What is 5 + 2?", template=t) == expected


def test_quickstart_prompt_with_the_builtin_model_tokenizer():
    path = Path.home() / ".cache/rlvr/models/smollm2-135m-instruct"
    if not (path / "tokenizer.json").is_file():
        pytest.skip("built-in model not converted on this machine")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    text = render_prompt(tok, "What is 3 + 2?", template=template_for(load_config("quickstart").data))
    assert text == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        f"<|im_start|>user\n{R1_TEXT}What is 3 + 2?<|im_end|>\n<|im_start|>assistant\n<think>"
    )


def test_r1_base_is_plain_text_ending_in_think():
    text = render_prompt(tiny_tokenizer(), "What is 3 + 4?", template="r1_base")
    assert text == R1_TEXT + "User: What is 3 + 4?\nAssistant: <think>"
    assert get_template("r1_base").assistant_prefix == "<think>"  # rewards see the <think> the prompt opened


def test_cot_and_plain(chat_tok):
    cot = "Please reason step by step, and put your final answer within \\boxed{}."
    assert (
        render_prompt(chat_tok, "Q?", template="cot")
        == f"<|im_start|>user\nQ?\n{cot}<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_prompt(chat_tok, "Q?", template="plain") == "<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n"
    assert render_prompt(tiny_tokenizer(), "Q?", template="plain") == "Q?"  # no chat template: the problem alone
    assert (
        render_prompt(tiny_tokenizer(), "Q?", template="plain", system_prompt="Sys", assistant_prefix="<think>")
        == "Sys\nQ?<think>"
    )


def test_overrides_system_and_prefix(chat_tok):
    assert render_prompt(chat_tok, "Q", template="r1", system_prompt="", assistant_prefix="<think>") == (
        f"<|im_start|>user\n{R1_TEXT}Q<|im_end|>\n<|im_start|>assistant\n<think>"
    )
    assert build_messages("Q", template="r1", system_prompt="Be brief.") == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": R1_TEXT + "Q"},
    ]
    assert template_for(DataConfig(template="r1_base", assistant_prefix="")).assistant_prefix == ""


@pytest.mark.parametrize("name", ["r1", "qwen_r1", "cot"])
def test_chat_template_required(name):
    with pytest.raises(UserError, match=rf"data.template={name} needs a chat template.*r1_base"):
        render_prompt(tiny_tokenizer(), "Q", template=name)


def test_problem_braces_are_literal(chat_tok):
    assert "f(x) = {x}" in render_prompt(chat_tok, "f(x) = {x}", template="r1")
    assert set(TEMPLATES) == {"r1", "qwen_r1", "r1_base", "r1_tool", "r1_code", "cot", "plain"}


def test_template_files(tmp_path, chat_tok):
    one = tmp_path / "t.yaml"
    one.write_text('system: "Sys."\nuser: "Solve: {problem}\\nBox it."\nassistant_prefix: "<think>"\n')
    assert render_prompt(chat_tok, "1+1", template=str(one)) == (
        "<|im_start|>system\nSys.<|im_end|>\n<|im_start|>user\nSolve: 1+1\nBox it.<|im_end|>\n"
        "<|im_start|>assistant\n<think>"
    )
    many = tmp_path / "t.json"
    many.write_text(json.dumps({"base": {"user": "Q: {problem}\nA:", "chat": False}, "x": {"user": "{problem}"}}))
    assert render_prompt(tiny_tokenizer(), "2+2", template=f"{many}:base") == "Q: 2+2\nA:"
    assert DataConfig(template=f"{many}:base").template.endswith(":base")


@pytest.mark.parametrize(
    "content, spec_suffix, needle",
    [
        (None, "", "template file .* not found"),
        ("user: no placeholder\n", "", "exactly one {problem}"),
        ("user: '{problem}'\ncolour: red\n", "", "unknown template key.*colour"),
        ("a: {user: '{problem}'}\n", "", "holds several templates \\(a\\).*:NAME"),
        ("a: {user: '{problem}'}\n", ":b", "has no template 'b' \\(it has: a\\)"),
        ("user: [1,\n", "", "not valid YAML"),
    ],
)
def test_template_file_errors(tmp_path, content, spec_suffix, needle):
    path = tmp_path / "t.yaml"
    if content is not None:
        path.write_text(content)
    with pytest.raises(UserError, match=needle):
        get_template(f"{path}{spec_suffix}")


def test_unknown_template_name_is_a_config_error():
    with pytest.raises(
        UserError,
        match="data.template=chatml: use r1, qwen_r1, r1_base, r1_tool, r1_code, cot, plain or a template file",
    ):
        DataConfig(template="chatml")


# --- countdown -------------------------------------------------------------------------------


@pytest.mark.parametrize("difficulty", [1, 2, 3, 4])
def test_countdown_rows_are_seeded_and_solvable(difficulty):
    rows = countdown(40, seed=3, difficulty=difficulty)
    assert rows == countdown(40, seed=3, difficulty=difficulty) != countdown(40, seed=4, difficulty=difficulty)
    for r in rows:
        f = r["fields"]
        assert r["answer"] == str(f["target"]) and str(f["numbers"]) in r["question"]
        assert countdown_score(f"<think>x</think><answer>{f['solution']}</answer>", r["answer"], f["numbers"]) == 1.0


@pytest.mark.parametrize(
    "completion, expected",
    [
        ("<answer>(10 - 4) * 2</answer>", 1.0),
        ("<answer>2 * (10 - 4) = 12</answer>", 1.0),  # text after '=' ignored
        ("<answer>\\boxed{2 × (10 − 4)}</answer>".replace("−", "-"), 1.0),
        ("the answer is \\boxed{(10-4)*2}", 1.0),
        ("<answer>10 + 2</answer>", 0.0),  # 4 unused
        ("<answer>(10 - 4) * 2 * 2</answer>", 0.0),  # 2 used twice
        ("<answer>10 + 4 - 2</answer>", 1.0),  # any expression that uses each number once
        ("<answer>(10 / 4) * 2</answer>", 0.0),  # 5, exact fractions
        ("<answer>__import__('os').system('x')</answer>", 0.0),
        ("<answer>2 ** 10 - 4</answer>", 0.0),
        ("<answer>10.0 - 4 + 2</answer>", 0.0),
        ("<answer>(10 - 4) * 2 / 0</answer>", 0.0),
        ("no answer at all", 0.0),
    ],
)
def test_countdown_score(completion, expected):
    assert countdown_score(completion, 12, [10, 4, 2]) == expected


def test_safe_arithmetic_never_evaluates_code():
    assert safe_arithmetic("(3 + 4) / 7") == (1, [3, 4, 7])
    for bad in ["os.system('ls')", "[1][0]", "(lambda: 1)()", "1 if 1 else 2", "x + 1", "'a' * 3", "9" * 300, ""]:
        assert safe_arithmetic(bad) is None
    assert countdown_reward(["<answer>3+4</answer>", "<answer>3*4</answer>"], ["7", "7"], numbers=[[3, 4], [3, 4]]) == [
        1.0,
        0.0,
    ]
