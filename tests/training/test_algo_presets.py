"""Algorithm presets and trainer features end to end on a tiny random model (CPU, seconds)."""

from __future__ import annotations

import contextlib
import math

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import metrics, tiny_config

from rlvr.config import load_config
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.training import train
from rlvr.training.loop import accumulate_gradients

pytestmark = pytest.mark.slow

# the tiny run at 2 prompts x 4 samples, without evaluation
SMALL = (
    "rollout.samples_per_prompt=4",
    "train.prompts_per_step=2",
    "train.micro_batch_seqs=4",
    "eval.at_start=false",
    "eval.at_end=false",
)


def run(preset, model_dir, run_dir, *extra):
    train(tiny_config(model_dir, run_dir, *SMALL, *extra, preset=preset))
    return metrics(run_dir)


@pytest.mark.parametrize("preset", ["grpo", "dapo", "dr_grpo", "gspo", "rloo"])
def test_preset_runs_three_steps(preset, tiny_dir, tmp_path):
    extra = ["algo.overlong_buffer=4"] if preset == "dapo" else []  # the preset's 16 > 8 tiny tokens
    metrics = run(preset, tiny_dir, tmp_path / preset, "train.steps=3", *extra)
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert all(math.isfinite(v) for v in m.values() if isinstance(v, (int, float))), m
        assert m["train/clip_frac"] == pytest.approx(m["train/clip_frac_low"] + m["train/clip_frac_high"])
        assert m["train/ratio_min"] <= m["train/ratio_mean"] <= m["train/ratio_max"]
        assert "train/adv_mean" in m and "train/adv_std" in m and "train/entropy" in m
    if preset in ("grpo", "rloo"):
        assert all("train/kl" in m for m in metrics)
    if preset == "dapo":
        assert all("rollout/dropped_groups" in m and "rollout/extra_batches" in m for m in metrics)
        assert "rollout/overlong_penalty_mean" in metrics[0]


def test_dynamic_sampling_drops_flat_groups_and_resumes_bit_exact(tiny_dir, tmp_path):
    ds = ["algo.dynamic_sampling=true", "algo.dynamic_sampling_max_batches=2"]
    straight, split = tmp_path / "straight", tmp_path / "split"
    m = run("quickstart", tiny_dir, straight, "train.steps=2", "train.save_every=1", "train.keep_checkpoints=0", *ds)
    run("quickstart", tiny_dir, split, "train.steps=1", *ds)
    run("quickstart", tiny_dir, split, "train.steps=2", f"resume={split}", *ds)
    # a random tiny model rarely says '7': most groups score all 0 and get dropped
    assert sum(x["rollout/dropped_groups"] for x in m) > 0
    assert all(0 <= x["rollout/extra_batches"] <= 2 for x in m)
    a = load_file(straight / "checkpoints" / "step_000002" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_000002" / "model.safetensors")
    for k in a:
        assert torch.equal(a[k], b[k]), k


def test_tis_with_bf16_rollout_and_reference_refresh(tiny_dir, tmp_path):
    # the entropy bonus moves the policy even when every reward is 0
    common = [
        "train.steps=2",
        "algo.kl_coef=0.1",
        "algo.entropy_coef=0.1",
        "rollout.dtype=bfloat16",
        "algo.tis_cap=2.0",
    ]
    synced = run("quickstart", tiny_dir, tmp_path / "synced", *common, "algo.ref_sync_every=1")
    for m in synced:
        assert 0 < m["train/tis_weight_min"] <= m["train/tis_weight_mean"] <= m["train/tis_weight_max"] <= 2.0
        assert 0 <= m["train/tis_capped_frac"] <= 1
        # the bf16 sampler differs from the fp32 trainer, so the weights are not all exactly 1
        assert m["train/tis_weight_min"] < 1 or m["train/tis_weight_max"] > 1
    # step 2 starts from a reference refreshed to the policy after step 1: KL 0 (one iteration)
    assert abs(synced[1]["train/kl"]) < 1e-6
    frozen = run("quickstart", tiny_dir, tmp_path / "frozen", *common)
    assert frozen[1]["train/kl"] > 1e-6


def test_kl_in_reward_keeps_kl_out_of_the_loss(tiny_dir, tmp_path):
    # step 1's entropy bonus moves the policy off the frozen reference: step 2 has a real KL
    m = run("rloo", tiny_dir, tmp_path / "rloo", "train.steps=2", "algo.entropy_coef=0.1", "train.lr=0.1")
    assert abs(m[1]["train/kl"]) > 1e-3  # logged from the reward side; in the loss it would add 0.05 * KL
    # the loss is the policy-gradient part minus the entropy bonus (both token means), no KL
    assert m[1]["train/loss"] == pytest.approx(m[1]["train/pg_loss"] - 0.1 * m[1]["train/entropy"], abs=1e-6)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_every_feature_is_micro_batch_invariant(loss_agg):
    """1x8, 2x4, 4x2 and 8x1 give the same gradient with dual-clip, GSPO ratio (seq_mean_token_mean), TIS, KL
    and entropy on."""
    model = tiny_model(seed=1)
    torch.manual_seed(0)
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=6, dtype="float32", logprobs=True)
    batch = engine.generate(["what is 3 + 4 ?", "what is the answer"], 4)
    gen = torch.Generator().manual_seed(0)
    batch.logprobs = batch.logprobs + 0.3 * torch.randn(batch.logprobs.shape, generator=gen)  # engine != trainer
    old_logp = batch.logprobs + 0.2 * torch.randn(batch.logprobs.shape, generator=gen)
    ref_logp = batch.logprobs + 0.2 * torch.randn(batch.logprobs.shape, generator=gen)
    adv = torch.randn(8, generator=gen)
    grads = {}
    levels = ["token", "sequence"] if loss_agg == "seq_mean_token_mean" else ["token"]  # GSPO needs seq_mean_token_mean
    for level in levels:
        for mb in (8, 4, 2, 1):
            cfg = load_config(
                None,
                [
                    "rollout.samples_per_prompt=4",
                    "train.prompts_per_step=2",
                    f"train.micro_batch_seqs={mb}",
                    f"algo.loss_agg={loss_agg}",
                    f"algo.ratio_level={level}",
                    "algo.dual_clip=1.5",
                    "algo.tis_cap=1.5",
                    "algo.kl_coef=0.1",
                    "algo.entropy_coef=0.01",
                    "algo.clip_low=0.1",
                    "algo.clip_high=0.1",
                ],
            )
            model.zero_grad(set_to_none=True)
            out = accumulate_gradients(model, batch, adv, old_logp, ref_logp, cfg, contextlib.nullcontext)
            grads[level, mb] = torch.cat([p.grad.flatten() for p in model.parameters()])
            assert out["clip_frac"] > 0 and out["tis_capped_frac"] > 0  # the clamps are exercised
        for mb in (4, 2, 1):
            torch.testing.assert_close(grads[level, mb], grads[level, 8], rtol=1e-4, atol=1e-7)
    if len(levels) == 2:
        assert not torch.allclose(grads["token", 8], grads["sequence", 8])
