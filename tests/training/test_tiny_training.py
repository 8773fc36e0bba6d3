"""End-to-end behaviour of the trainer on tiny randomly initialised models (CPU, no downloads)."""

from __future__ import annotations

import contextlib

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import metrics, tiny_config

from rlvr import algos
from rlvr.config import load_config
from rlvr.models.forward import response_logits
from rlvr.models.loading import set_checkpointing
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.training import train
from rlvr.training.loop import accumulate_gradients, batch_logprobs

pytestmark = pytest.mark.slow


def test_tiny_model_learns_a_trivial_reward(tiny_dir, tmp_path):
    run_dir = tmp_path / "run"
    train(tiny_config(tiny_dir, run_dir, "train.steps=30"))
    rewards = [m["rollout/reward_mean"] for m in metrics(run_dir)]
    assert len(rewards) == 30
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    # a random 130-word model says '7' about 1/130 of the time; GRPO must push that up a lot
    assert first < 0.1
    assert last > first + 0.3, rewards
    # the run directory holds what a user needs
    assert (run_dir / "config.yaml").is_file()
    assert (run_dir / "samples.jsonl").stat().st_size > 0
    assert (run_dir / "checkpoints" / "last" / "model.safetensors").is_file()


def test_resume_is_bit_exact(tiny_dir, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(tiny_config(tiny_dir, straight, "train.steps=4", "train.save_every=2", "train.keep_checkpoints=0"))
    train(tiny_config(tiny_dir, split, "train.steps=2"))
    train(tiny_config(tiny_dir, split, "train.steps=4", f"resume={split}"))
    a = load_file(straight / "checkpoints" / "step_000004" / "model.safetensors")
    b = load_file(split / "checkpoints" / "step_000004" / "model.safetensors")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    # metrics of the resumed run continue the first part without duplicates
    steps = [m["step"] for m in metrics(split)]
    assert steps == [1, 2, 3, 4]
    assert metrics(split)[3]["rollout/reward_mean"] == metrics(straight)[3]["rollout/reward_mean"]


def _rollout_batch(model, P=2, G=4, seed=0):
    torch.manual_seed(seed)
    tok = tiny_tokenizer()
    engine = HFRolloutEngine(model, tok, max_new_tokens=6, dtype="float32", temperature=1.0)
    return engine.generate(["what is 3 + 4 ?", "what is the answer"][:P], G)


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
@pytest.mark.parametrize("shared", [True, False])
def test_micro_batch_split_gives_the_same_gradient(tmp_path, loss_agg, shared):
    model = tiny_model(seed=1)
    batch = _rollout_batch(model, P=2, G=4)
    adv = torch.randn(8)
    grads = {}
    for mb in (8, 1, 2, 4):
        cfg = load_config(
            None,
            [
                "rollout.samples_per_prompt=4",
                "train.prompts_per_step=2",
                f"train.micro_batch_seqs={mb}",
                f"algo.loss_agg={loss_agg}",
                f"train.shared_prompt_forward={str(shared).lower()}",
            ],
        )
        model.zero_grad(set_to_none=True)
        accumulate_gradients(model, batch, adv, None, None, cfg, contextlib.nullcontext)
        grads[mb] = torch.cat([p.grad.flatten() for p in model.parameters()])
    for mb in (1, 2, 4):
        torch.testing.assert_close(grads[mb], grads[8], rtol=1e-4, atol=1e-7)
    assert grads[8].abs().sum() > 0


def test_logprobs_match_the_sampling_distribution():
    """The trainer's log-probs of sampled tokens equal generate()'s own, with left padding."""
    model = tiny_model(seed=2).eval()
    tok = tiny_tokenizer()
    enc = tok(["what is 3 + 4 ?", "the answer"], return_tensors="pt", padding=True)
    torch.manual_seed(0)
    out = model.generate(
        **enc,
        do_sample=True,
        max_new_tokens=5,
        min_new_tokens=5,
        temperature=0.7,
        top_k=0,
        output_logits=True,
        return_dict_in_generate=True,
        pad_token_id=0,
    )
    resp = out.sequences[:, enc.input_ids.shape[1] :]
    gen_logits = torch.stack(out.logits, dim=1)  # [B, T, V]
    expected = algos.token_logprobs(gen_logits, resp, temperature=0.7)
    am = torch.cat([enc.attention_mask, torch.ones_like(resp)], 1)
    with torch.no_grad():
        logits = response_logits(model, out.sequences, am, resp.shape[1])
    torch.testing.assert_close(algos.token_logprobs(logits, resp, temperature=0.7), expected, rtol=1e-4, atol=1e-5)


def test_shared_prompt_forward_equals_plain_forward():
    model = tiny_model(seed=3)
    batch = _rollout_batch(model, P=2, G=4, seed=1)
    T = batch.response_mask.shape[1]
    plain = response_logits(model, batch.input_ids, batch.attention_mask, T)
    (plain**2).mean().backward()
    g_plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    shared = response_logits(model, batch.input_ids, batch.attention_mask, T, group_size=4)
    (shared**2).mean().backward()
    torch.testing.assert_close(shared, plain, rtol=1e-5, atol=1e-5)
    for a, b in zip(model.parameters(), g_plain):
        torch.testing.assert_close(a.grad, b, rtol=1e-4, atol=1e-7)


def test_gradient_checkpointing_with_shared_prompt_equals_plain_pass():
    """Checkpointed layers drop the prompt's KV cache; the gradient must still be the plain pass's."""
    model = tiny_model(seed=4)
    batch = _rollout_batch(model, P=2, G=4, seed=2)
    gen = torch.Generator().manual_seed(0)
    adv = torch.randn(8, generator=gen)
    ref_logp = torch.randn(batch.response_mask.shape, generator=gen) - 3.0  # a reference != policy
    model.train()
    expected = {}
    for shared in (False, True):
        cfg = load_config(
            None,
            [
                "rollout.samples_per_prompt=4",
                "train.prompts_per_step=2",
                "train.micro_batch_seqs=8",
                "algo.kl_coef=0.1",
                f"train.shared_prompt_forward={str(shared).lower()}",
            ],
        )
        for checkpointing in (False, True):
            if checkpointing:
                set_checkpointing(model)
            else:
                set_checkpointing(model, False)
            model.zero_grad(set_to_none=True)
            accumulate_gradients(model, batch, adv, None, ref_logp, cfg, contextlib.nullcontext)
            grad = torch.cat([p.grad.flatten() for p in model.parameters()])
            # old/ref log-probs: no_grad, on a policy left in training mode
            logp = batch_logprobs(
                model,
                batch,
                micro_batch_seqs=8,
                group_size=4 if shared else 1,
                temperature=1.0,
                autocast=contextlib.nullcontext,
            )
            torch.testing.assert_close(grad, expected.setdefault("grad", grad), rtol=1e-4, atol=1e-7)
            torch.testing.assert_close(logp, expected.setdefault("logp", logp), rtol=1e-5, atol=1e-5)
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())  # flags put back
    assert expected["grad"].abs().sum() > 0


def test_generate_with_gradient_checkpointing_in_training_mode_keeps_the_cache():
    """The engine shares the policy (same dtype), which the update leaves in training mode."""
    model = tiny_model(seed=3)
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=6, dtype="float32", logprobs=True)
    torch.manual_seed(0)
    expected = engine.generate(["what is 3 + 4 ?", "the answer"], 2)
    set_checkpointing(model)
    model.train()
    torch.manual_seed(0)
    got = engine.generate(["what is 3 + 4 ?", "the answer"], 2)
    assert torch.equal(got.input_ids, expected.input_ids)
    torch.testing.assert_close(got.logprobs, expected.logprobs)
    assert any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())


def test_kl_is_zero_and_ratio_one_when_policy_equals_reference(tiny_dir, tmp_path):
    run_dir = tmp_path / "kl"
    train(tiny_config(tiny_dir, run_dir, "train.steps=1", "algo.kl_coef=0.1"))
    (m,) = metrics(run_dir)
    assert abs(m["train/kl"]) < 1e-6  # first step: policy == reference
    assert m["train/ratio_mean"] == pytest.approx(1.0, abs=1e-6)


def test_second_iteration_moves_the_ratio(tiny_dir, tmp_path):
    run_dir = tmp_path / "iters"
    train(tiny_config(tiny_dir, run_dir, "train.steps=1", "algo.num_iterations=3", "algo.kl_coef=0.1"))
    (m,) = metrics(run_dir)
    # iterations 2 and 3 see a policy that moved away from old_logp and from the reference
    assert m["train/kl"] > 0
    assert abs(m["train/ratio_mean"] - 1) > 1e-6


def test_resume_with_more_steps_follows_the_new_schedule_at_once(tiny_dir, tmp_path):
    """Found while splitting the trainer: resuming with a larger train.steps trained the first resumed
    step at the old cosine's lr (restored from the optimizer state)."""
    extra = ("train.lr_schedule=cosine", "train.warmup_steps=0", "train.min_lr_ratio=0.1")
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    train(tiny_config(tiny_dir, straight, "train.steps=6", *extra))
    train(tiny_config(tiny_dir, resumed, "train.steps=3", *extra))
    train(tiny_config(tiny_dir, resumed, "train.steps=6", f"resume={resumed}", *extra))
    lrs = [m["train/lr"] for m in metrics(resumed)]
    assert lrs[3:] == [m["train/lr"] for m in metrics(straight)][3:]
    assert lrs[2] < lrs[3]  # step 3 ended the 3-step cosine at its floor; step 4 is on the 6-step one
