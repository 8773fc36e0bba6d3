"""rlvr.choices, the light lists the config validates, agree with the registries that implement them."""

import pytest

from rlvr import choices
from rlvr.config import DataConfig, load_config
from rlvr.data import load_split
from rlvr.data.files import FORMATS
from rlvr.data.presets import PRESETS
from rlvr.data.templates import TEMPLATES
from rlvr.errors import UserError


def test_preset_names_are_the_presets_plus_auto_and_custom():
    assert choices.DATA_PRESETS == ("auto", *PRESETS, "custom")


def test_template_names_are_the_built_in_templates_in_order():
    assert choices.TEMPLATE_NAMES == tuple(TEMPLATES)


def test_file_formats_are_the_formats_the_reader_knows():
    assert sorted(choices.FILE_FORMATS) == sorted(set(FORMATS.values()))


@pytest.mark.parametrize("task", choices.BUILTIN_TASKS)
def test_every_built_in_task_generates_rows(task):
    rows = load_split(DataConfig(task=task, train_size=3, test_size=0), "train").rows
    assert len(rows) == 3 and all(r["question"] and r["answer"] for r in rows)


@pytest.mark.parametrize(
    "override, needle",
    [
        ("data.task=web", "data.task=web: use arithmetic, arithmetic_tool, countdown, code or files"),
        ("data.format=xml", "data.format=xml: use auto, jsonl, json, parquet, csv or arrow"),
        (
            "data.preset=nope",
            "data.preset=nope: use one of auto, gsm8k, math, math500, deepscaler, orz, dapo_math, alpaca, humaneval, "
            "mbpp, apps, lcb, deepcoder, kodcode, trl, custom",
        ),
        (
            "data.template=r2",
            "data.template=r2: use r1, qwen_r1, r1_base, r1_tool, r1_code, cot, plain or a template file",
        ),
        ("algo.kl_estimator=k9", "algo.kl_estimator=k9: must be one of k1, k2, k3"),
        ("reward.on_error=ignore", "reward.on_error=ignore: must be one of score, raise"),
    ],
)
def test_choice_errors_list_the_choices(override, needle):
    with pytest.raises(UserError) as e:
        load_config("quickstart", [override])
    assert needle in str(e.value) and "\n" not in str(e.value)
