"""Algorithm presets, the YAML `defaults:` key, and the algo.* config checks."""

import pytest
import yaml

from rlvr.algos import AdvMethod, KLPlacement, LossAgg, RatioLevel
from rlvr.config import load_config, read_yaml
from rlvr.errors import UserError

PRESETS = ["grpo", "dapo", "dr_grpo", "gspo", "rloo"]


@pytest.mark.parametrize("name", PRESETS)
def test_preset_layers_on_quickstart(name):
    cfg, quick = load_config(name), load_config("quickstart")
    # model, data and rewards come from the quickstart; only algo (and run_dir) differ
    assert (cfg.model, cfg.data, cfg.reward, cfg.rollout, cfg.train) == (
        quick.model,
        quick.data,
        quick.reward,
        quick.rollout,
        quick.train,
    )
    assert cfg.run_dir == f"runs/{name}"


def test_presets_set_what_they_claim():
    grpo, dapo, dr, gspo, rloo = (load_config(n).algo for n in PRESETS)
    assert (grpo.adv_method, grpo.kl_coef > 0, grpo.loss_agg) == (AdvMethod.GRPO, True, LossAgg.SEQ_MEAN_TOKEN_MEAN)
    assert (dapo.clip_low, dapo.clip_high, dapo.kl_coef, dapo.loss_agg) == (0.2, 0.28, 0.0, LossAgg.TOKEN_MEAN)
    assert dapo.dynamic_sampling and dapo.overlong_buffer > 0
    assert (dr.adv_method, dr.loss_agg) == (AdvMethod.DR_GRPO, LossAgg.SEQ_MEAN_TOKEN_SUM_NORM)
    assert (gspo.ratio_level, gspo.loss_agg) == (RatioLevel.SEQUENCE, LossAgg.SEQ_MEAN_TOKEN_MEAN)
    assert (rloo.adv_method, rloo.kl_placement) == (AdvMethod.RLOO, KLPlacement.REWARD)


def test_quickstart_algo_is_plain_grpo():
    a = load_config("quickstart").algo
    assert (a.adv_method, a.adv_eps, a.loss_agg, a.clip_low, a.clip_high) == (
        AdvMethod.GRPO,
        1e-6,
        LossAgg.TOKEN_MEAN,
        0.2,
        0.2,
    )
    assert (a.kl_coef, a.num_iterations, a.dynamic_sampling, a.overlong_buffer, a.tis_cap, a.dual_clip) == (
        0,
        1,
        False,
        0,
        None,
        None,
    )


def test_defaults_key_merges_deeply_and_replaces_lists(tmp_path):
    base = tmp_path / "base.yaml"
    base.write_text(
        yaml.safe_dump({"train": {"lr": 1e-3, "warmup_steps": 5}, "reward": {"rules": ["a", "b"], "weights": [1, 1]}})
    )
    top = tmp_path / "top.yaml"
    top.write_text(
        yaml.safe_dump({"defaults": ["base.yaml", "dapo"], "train": {"steps": 7}, "reward": {"rules": ["x"]}})
    )
    tree = read_yaml(top)
    assert "defaults" not in tree
    assert tree["train"]["steps"] == 7 and tree["train"]["warmup_steps"] == 5  # mappings merged key by key
    assert tree["train"]["lr"] == 1e-5  # later defaults win: dapo -> quickstart's lr over base.yaml's
    assert tree["reward"]["rules"] == ["x"]  # lists replaced, not merged
    assert tree["algo"]["clip_high"] == 0.28  # from the dapo preset (by name)
    assert tree["model"]["path"] == "smollm2-135m-instruct"  # dapo's own defaults: quickstart


def test_defaults_loop_and_bad_value_are_errors(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("defaults: b.yaml\n")
    b.write_text("defaults: [a.yaml]\n")
    with pytest.raises(UserError, match="loop"):
        read_yaml(a)
    a.write_text("defaults: {x: 1}\n")
    with pytest.raises(UserError, match="defaults must be"):
        read_yaml(a)
    a.write_text("defaults: nope_preset\n")
    with pytest.raises(UserError, match="not found"):
        read_yaml(a)


def test_model_and_data_override_a_preset(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("defaults: [dr_grpo]\nmodel: {path: /models/x}\ndata: {difficulty: 3}\n")
    cfg = load_config(mine)
    assert cfg.model.path == "/models/x" and cfg.data.difficulty == 3 and cfg.algo.adv_method == AdvMethod.DR_GRPO


@pytest.mark.parametrize(
    "override, message",
    [
        ("algo.dual_clip=1.0", "algo.dual_clip must be > 1"),
        ("algo.tis_cap=0", "algo.tis_cap must be > 0"),
        ("algo.ref_sync_every=5", "algo.ref_sync_every needs a reference model"),
        ("algo.overlong_buffer=-1", "algo.overlong_buffer must be >= 0"),
        ("algo.overlong_buffer=100", "longer than rollout.max_new_tokens"),
        ("algo.adv_method=ppo", "must be one of grpo, dr_grpo, rloo, reinforce_pp"),
        ("algo.kl_placement=both", "must be one of loss, reward"),
        ("algo.ratio_level=word", "must be one of token, sequence"),
        ("algo.dynamic_sampling_max_batches=-1", "must be >= 0"),
    ],
)
def test_bad_algo_values_fail_with_one_line(override, message):
    with pytest.raises(UserError, match=message):
        load_config(None, [override])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (
            ["algo.ratio_level=sequence", "algo.loss_agg=token_mean"],
            "algo.ratio_level=sequence .* is not GSPO: set algo.loss_agg=seq_mean_token_mean",
        ),
        (["algo.ratio_level=sequence", "algo.loss_agg=seq_mean_token_sum_norm"], "is not GSPO"),
        (
            ["algo.kl_coef=0.1", "algo.kl_estimator=k1"],
            "algo.kl_estimator=k1 with algo.kl_placement=loss .* use algo.kl_estimator=k3",
        ),
    ],
)
def test_combinations_that_are_not_what_they_say_fail_with_one_line(overrides, message):
    with pytest.raises(UserError, match=message) as err:
        load_config(None, overrides)
    assert "\n" not in str(err.value)


def test_k1_is_fine_in_the_reward_or_without_kl():
    assert (
        load_config(None, ["algo.kl_coef=0.1", "algo.kl_estimator=k1", "algo.kl_placement=reward"]).algo.kl_coef == 0.1
    )
    assert load_config(None, ["algo.kl_estimator=k1"]).algo.kl_coef == 0  # no KL term at all
    assert load_config("gspo").algo.ratio_level == RatioLevel.SEQUENCE
