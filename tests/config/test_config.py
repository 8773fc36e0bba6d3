"""Config tree: defaults, YAML presets, dotted overrides, type and range errors, docs, round trips."""

import dataclasses

import pytest
import yaml

from rlvr.choices import KLEstimator, LossAgg
from rlvr.config import (
    PRESETS_DIR,
    Config,
    Switch,
    all_keys,
    field_docs,
    load_config,
    parse_override,
    read_yaml,
    to_dict,
    to_yaml,
)
from rlvr.errors import UserError


def test_defaults_build_and_are_consistent():
    cfg = Config()
    assert cfg.train.lr == 1e-6
    assert cfg.algo.kl_estimator is KLEstimator.K3
    assert cfg.algo.loss_agg is LossAgg.TOKEN_MEAN
    assert cfg.seqs_per_step == cfg.train.prompts_per_step * cfg.rollout.samples_per_prompt == 32
    assert cfg.seqs_per_step % cfg.train.micro_batch_seqs == 0
    # mutable defaults are not shared between instances
    assert Config().reward.rules is not cfg.reward.rules


def test_config_is_frozen():
    cfg = Config()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.train.lr = 1.0


def test_quickstart_preset_is_the_default_and_resolves_by_name():
    by_default = load_config()
    by_name = load_config("quickstart")
    by_path = load_config(PRESETS_DIR / "quickstart.yaml")
    assert by_default == by_name == by_path
    # every value the preset file sets is what the loaded config holds
    raw = yaml.safe_load((PRESETS_DIR / "quickstart.yaml").read_text())
    for section, values in raw.items():
        if not isinstance(values, dict):
            assert getattr(by_name, section) == values
            continue
        for key, value in values.items():
            got = getattr(getattr(by_name, section), key)
            assert got == (float(value) if isinstance(got, float) else value), f"{section}.{key}"


def test_overrides_numbers_lists_dicts_enums_null():
    cfg = load_config(
        "quickstart",
        [
            "train.steps=7",
            "train.lr=1e-6",  # YAML 1.1 reads this as a string; must still become a float
            "train.adam_betas=[0.9,0.95]",
            "reward.rules=[accuracy]",
            "reward.weights=[1]",
            "algo.kl_estimator=k2",
            "algo.loss_agg=SEQ_MEAN_TOKEN_SUM_NORM",
            "resume=null",
            "data.path=null",
            "algo.clip_high=1",  # an int for a float field
            "model.autocast_bf16=true",
            "seed=3",
        ],
    )
    assert cfg.train.steps == 7 and type(cfg.train.steps) is int
    assert cfg.train.lr == 1e-6 and type(cfg.train.lr) is float
    assert cfg.train.adam_betas == [0.9, 0.95]
    assert cfg.reward.rules == ["accuracy"] and cfg.reward.weights == [1.0]
    assert type(cfg.reward.weights[0]) is float
    assert cfg.algo.kl_estimator is KLEstimator.K2
    assert cfg.algo.loss_agg is LossAgg.SEQ_MEAN_TOKEN_SUM_NORM
    assert cfg.resume is None and cfg.data.path is None
    assert cfg.algo.clip_high == 1.0 and type(cfg.algo.clip_high) is float
    assert cfg.model.autocast_bf16 is Switch.ON
    assert cfg.seed == 3
    # untouched keys keep the preset's values
    assert cfg.data.assistant_prefix == "<think>"


def test_later_override_wins_and_nested_dict_key_can_be_set():
    cfg = load_config(None, ["train.steps=3", "train.steps=9", "reward.weights=[2, 0.5, 0.5]"])
    assert cfg.train.steps == 9
    assert cfg.reward.weights == [2.0, 0.5, 0.5]
    assert cfg.reward.rules == ["accuracy", "accuracy_lenient", "format_partial"]  # the preset's rules


def test_parse_override():
    assert parse_override("train.lr=1e-5") == ("train.lr", "1e-5")  # coerced later by the field type
    assert parse_override("--train.steps=4") == ("train.steps", 4)
    assert parse_override("data.system_prompt=") == ("data.system_prompt", "")
    assert parse_override("data.system_prompt=a=b") == ("data.system_prompt", "a=b")
    assert parse_override("x=[1, 2]") == ("x", [1, 2])
    with pytest.raises(UserError, match="key=value"):
        parse_override("train.lr")


def test_string_field_accepts_numbers_and_empty_string():
    cfg = load_config(None, ["data.system_prompt=", "data.assistant_prefix=42"])
    assert cfg.data.system_prompt == ""
    assert cfg.data.assistant_prefix == "42"


@pytest.mark.parametrize(
    "override, unknown, suggestion",
    [
        ("seeed=1", "seeed", "seed"),
        ("train.lrr=1e-5", "train.lrr", "train.lr"),
        ("trian.lr=1e-5", "trian.lr", "train.lr"),
        ("rollout.temprature=0.7", "rollout.temprature", "rollout.temperature"),
        ("algo.kl_coeff=0.1", "algo.kl_coeff", "algo.kl_coef"),
    ],
)
def test_unknown_key_names_the_nearest_key(override, unknown, suggestion):
    with pytest.raises(UserError) as e:
        load_config(None, [override])
    msg = str(e.value)
    assert f"unknown config key '{unknown}'" in msg
    assert f"did you mean '{suggestion}'" in msg
    assert "\n" not in msg


def test_unknown_key_without_near_match_points_to_the_listing():
    with pytest.raises(UserError, match=r"unknown config key 'zzzzqqqq'; `rlvr config` lists every key"):
        load_config(None, ["zzzzqqqq=1"])


def test_setting_a_section_to_a_scalar_is_an_error():
    with pytest.raises(UserError, match=r"train is a section; set its keys, e.g. train\.steps="):
        load_config(None, ["train=5"])


def test_key_below_a_leaf_is_unknown():
    with pytest.raises(UserError, match=r"unknown config key 'train\.lr\.x'.*'train\.lr'"):
        load_config(None, ["train.lr.x=1"])


@pytest.mark.parametrize(
    "override, needle",
    [
        ("train.steps=abc", "train.steps='abc': expected an integer"),
        ("train.steps=1.5", "train.steps=1.5: expected an integer"),
        ("train.steps=true", "train.steps=True: expected an integer"),
        ("model.autocast_bf16=3", "model.autocast_bf16=3: must be one of auto, true, false"),
        ("model.autocast_bf16=yess", "model.autocast_bf16=yess: must be one of auto, true, false"),
        ("train.lr=fast", "train.lr='fast': expected a number"),
        ("train.lr=[1]", "train.lr=[1]: expected a number"),
        ("model.path=null", "model.path=None: expected a string"),
        ("reward.rules=accuracy", "reward.rules='accuracy': expected a list"),
        ("reward.weights=[1, high, 2]", "reward.weights[1]='high': expected a number"),
        ("train.adam_betas=0.9", "train.adam_betas=0.9: expected a list"),
        ("train.adam_betas=[0.9, x]", "train.adam_betas[1]='x': expected a number"),
        ("algo.kl_estimator=k9", "algo.kl_estimator=k9: must be one of k1, k2, k3"),
    ],
)
def test_type_errors(override, needle):
    with pytest.raises(UserError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_integral_float_is_accepted_for_int_fields():
    assert load_config(None, ["train.steps=5.0"]).train.steps == 5


@pytest.mark.parametrize(
    "override, needle",
    [
        ("algo.clip_low=1.5", "algo.clip_low must be in [0, 1)"),
        ("algo.clip_low=-0.1", "algo.clip_low must be in [0, 1)"),
        ("rollout.samples_per_prompt=1", "rollout.samples_per_prompt must be >= 2"),
        ("train.lr=0", "train.lr must be > 0"),
        ("train.steps=0", "train.steps must be >= 1"),
        ("rollout.temperature=0", "rollout.temperature must be > 0"),
        ("rollout.top_p=1.5", "rollout.top_p must be in (0, 1]"),
        ("algo.kl_coef=-1", "algo.kl_coef must be >= 0"),
        ("train.adam_betas=[0.9]", "train.adam_betas must be two numbers"),
        ("train.adam_betas=[0.9, 1.0]", "train.adam_betas must be two numbers"),
        ("train.lr_schedule=linear", "train.lr_schedule=linear: use constant or cosine"),
        ("model.dtype=float16", "model.dtype=float16: use float32 or bfloat16"),
        ("model.device=tpu", "model.device=tpu"),
        ("data.difficulty=5", "data.difficulty=5: must be 1..4"),
        ("data.task=csv", "data.task=csv: use arithmetic, arithmetic_tool, countdown, code or files"),
        ("data.task=files", "data.task=files needs data.path"),
        (
            "data.template=chatml",
            "data.template=chatml: use r1, qwen_r1, r1_base, r1_tool, r1_code, cot, plain or a template file",
        ),
        ("reward.rules=[]", "reward.rules is empty"),
        ("log.samples_every=-1", "log.samples_every must be >= 0"),
    ],
)
def test_range_errors(override, needle):
    with pytest.raises(UserError) as e:
        load_config(None, [override])
    assert needle in str(e.value)


def test_range_error_from_direct_construction():
    from rlvr.config import AlgoConfig

    with pytest.raises(UserError, match="clip_low"):
        AlgoConfig(clip_low=1.5)


def test_batch_arithmetic_error_names_the_numbers():
    with pytest.raises(UserError) as e:
        load_config(None, ["train.prompts_per_step=3", "rollout.samples_per_prompt=5", "train.micro_batch_seqs=4"])
    msg = str(e.value)
    assert "= 15 sequences per step" in msg
    assert "train.micro_batch_seqs=4" in msg
    assert "divisor of 15" in msg


def test_batch_arithmetic_ok_when_divisible():
    cfg = load_config(None, ["train.prompts_per_step=3", "rollout.samples_per_prompt=4", "train.micro_batch_seqs=6"])
    assert cfg.seqs_per_step == 12


def test_all_keys_covers_every_leaf():
    keys = all_keys()
    assert len(keys) == len(set(keys))
    for key in ("train.lr", "model.path", "reward.rules", "algo.kl_estimator", "run_dir", "seed", "resume"):
        assert key in keys
    assert "train" not in keys and "model" not in keys  # sections are not leaves
    # every key can be read back from a Config
    cfg = Config()
    for key in keys:
        node = cfg
        for part in key.split("."):
            node = getattr(node, part)


def test_field_docs_has_a_doc_for_every_key():
    rows = field_docs()
    assert [key for key, _, _ in rows] == all_keys()
    missing = [key for key, _, doc in rows if not doc.strip()]
    assert missing == []
    docs = {key: (default, doc) for key, default, doc in rows}
    assert docs["train.lr"][0] == 1e-6
    assert docs["algo.kl_estimator"][0] == "k3"  # enums shown by value
    assert "learning rate" in docs["train.lr"][1].lower()
    assert all("\n" not in doc for _, _, doc in rows)


def test_to_yaml_round_trips(tmp_path):
    cfg = load_config(
        "quickstart",
        [
            "algo.kl_estimator=k1",
            "algo.loss_agg=seq_mean_token_mean",
            "train.adam_betas=[0.8, 0.95]",
            "train.lr=3e-7",
            "algo.adv_eps=1e-8",
            "reward.rules=[accuracy, boxed]",
            "reward.weights=[2.0, 0.25]",
            "data.system_prompt='Think: then answer. #1 [x]'",
            "resume=null",
        ],
    )
    path = tmp_path / "cfg.yaml"
    path.write_text(to_yaml(cfg))
    back = load_config(path)
    assert back == cfg
    assert back.algo.kl_estimator is KLEstimator.K1
    assert to_dict(back) == to_dict(cfg)


def test_default_config_round_trips(tmp_path):
    path = tmp_path / "d.yaml"
    path.write_text(to_yaml(Config()))
    assert load_config(path) == Config()


def test_yaml_file_then_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  steps: 11\n  lr: 2.0e-5\nseed: 4\n")
    cfg = load_config(path, ["seed=5"])
    assert cfg.train.steps == 11 and cfg.train.lr == 2e-5 and cfg.seed == 5
    assert cfg.model == Config().model  # not taken from the quickstart preset


def test_unknown_key_in_yaml_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  stesp: 11\n")
    with pytest.raises(UserError, match=r"unknown config key 'train\.stesp'; did you mean 'train\.steps'"):
        load_config(path)


def test_empty_yaml_file_gives_defaults(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("# nothing\n")
    assert read_yaml(path) == {}
    assert load_config(path) == Config()


def test_read_yaml_missing_file(tmp_path):
    with pytest.raises(UserError) as e:
        read_yaml(tmp_path / "nope.yaml")
    msg = str(e.value)
    assert "nope.yaml not found" in msg
    assert "quickstart" in msg  # lists the built-in presets


def test_read_yaml_invalid_yaml(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("train: {steps: 3\n")
    with pytest.raises(UserError) as e:
        read_yaml(path)
    assert "is not valid YAML" in str(e.value)
    assert "\n" not in str(e.value)


def test_read_yaml_list_is_rejected(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- train.lr=1\n- seed=2\n")
    with pytest.raises(UserError, match="must hold a mapping"):
        read_yaml(path)


def test_read_yaml_binary_file(tmp_path):
    path = tmp_path / "weights.bin"
    path.write_bytes(b"\xff\xfe\x00\x81binary")
    with pytest.raises(UserError, match="not a UTF-8 text file"):
        read_yaml(path)


def test_docs_config_md_is_in_sync():
    """docs/config.md is generated by `rlvr config --docs --markdown`; regenerate it after editing rlvr/config/."""
    from pathlib import Path

    from rlvr.config import config_markdown

    doc = Path(__file__).resolve().parents[2] / "docs" / "config.md"
    assert doc.read_text() == config_markdown()


def test_packed_weights_on_a_gpu_is_one_clear_error():
    with pytest.raises(UserError, match=r"model.packed_weights=true packs weights for a CPU, but model.device=cuda"):
        load_config(None, ["model.packed_weights=true", "model.device=cuda"])
    assert load_config(None, ["model.packed_weights=false"]).model.packed_weights.as_bool() is False
    assert load_config(None, []).model.packed_weights.as_bool() is None


def test_a_micro_batch_of_at_least_the_step_is_accepted():
    cfg = load_config(None, ["train.prompts_per_step=3", "rollout.samples_per_prompt=5", "train.micro_batch_seqs=16"])
    assert cfg.train.micro_batch_seqs == 16 and cfg.seqs_per_step == 15
    # every preset layered on the quickstart keeps a valid batch, as does the group-size ablation's G = 4
    assert load_config("quickstart", ["rollout.samples_per_prompt=4"]).seqs_per_step == 16


def test_the_bf16_micro_batch_follows_the_same_rule():
    with pytest.raises(UserError, match=r"not divisible by train.micro_batch_seqs_bf16=12; pick a divisor of 32"):
        load_config("quickstart", ["train.micro_batch_seqs_bf16=12"])
    with pytest.raises(UserError, match="train.micro_batch_seqs_bf16 must be >= 0"):
        load_config(None, ["train.micro_batch_seqs_bf16=-1"])
    assert load_config("quickstart", ["train.micro_batch_seqs_bf16=64"]).train.micro_batch_seqs_bf16 == 64  # one pass
    # with bf16 autocast off the bf16 size is never used: 6 prompts x 8 = 48 against the quickstart's 32 loads,
    # and auto (bf16 where it pays) still checks it
    six = ["train.prompts_per_step=6", "train.micro_batch_seqs=8"]
    assert load_config("quickstart", [*six, "model.autocast_bf16=false"]).seqs_per_step == 48
    with pytest.raises(UserError, match=r"48 sequences per step is not divisible by train.micro_batch_seqs_bf16=32"):
        load_config("quickstart", six)
    # per worker likewise: 12 prompts x 8 over 2 workers is 48 sequences each
    ray = [
        "train.prompts_per_step=12",
        "train.micro_batch_seqs=8",
        "distributed.backend=ray",
        "distributed.num_workers=2",
    ]
    with pytest.raises(UserError, match=r"each of the 2 workers trains on 48 sequences per step, not divisible by"):
        load_config("quickstart", ray)
    assert load_config("quickstart", [*ray, "model.autocast_bf16=false"]).seqs_per_step == 96


def test_a_yaml_alias_bomb_is_one_line_at_once(tmp_path):
    """Issue 62.3: a "billion laughs" config (aliases of aliases, 9^8 values) is refused before anything
    walks or prints it (formatting the error of such a value took half a minute and gigabytes), in a file
    and in an override."""
    import time

    bomb = tmp_path / "bomb.yaml"
    bomb.write_text(f"reward:\n  rules: {_nested(8)}\n")
    t0 = time.perf_counter()
    with pytest.raises(UserError, match=r"bomb.yaml expands to more than 100,000 values \(YAML anchors"):
        load_config(str(bomb), [])
    with pytest.raises(UserError, match="override reward.rules expands to more than 100,000 values"):
        load_config(None, [f"reward.rules={_nested(8)}"])
    assert time.perf_counter() - t0 < 30  # a guard against the hang, not a timing claim


def _nested(depth: int) -> str:
    """A flow YAML list, 9 aliases of the level below per level, ``depth`` levels: 9**depth values."""
    text = "&a0 [1, 1, 1, 1, 1, 1, 1, 1, 1]"
    for i in range(1, depth):
        text = f"&a{i} [{text}, " + ", ".join([f"*a{i - 1}"] * 8) + "]"
    return text
