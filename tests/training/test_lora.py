"""LoRA (``model.lora.*``, peft): only the adapter trains, the reference is the base with the adapter
off (no second copy), a merged adapter gives base+adapter's logits, and a resumed LoRA run is
bit-exact. Tiny models on CPU, no downloads."""

from __future__ import annotations

import contextlib
import copy
import json

import pytest
import torch
from safetensors.torch import load_file
from tiny_run import metrics, tiny_config

from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.models import load_model, lora
from rlvr.models.tiny import save_tiny_model, tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.training import train
from rlvr.training.loop import batch_logprobs
from rlvr.training.trainer import Trainer

LORA = dict(
    rank=4,
    alpha=8.0,
    dropout=0.0,
    target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"],
)
LORA_RUN = ("model.lora.rank=4", "model.lora.alpha=8", "algo.kl_coef=0.05", "eval.at_start=false", "eval.at_end=false")


def _batch(model, P=2, G=4, seed=0):
    torch.manual_seed(seed)
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=6, dtype="float32")
    return engine.generate(["what is 3 + 4 ?", "what is the answer"][:P], G)


def _logprobs(model, batch, group_size=4):
    return batch_logprobs(
        model, batch, micro_batch_seqs=8, group_size=group_size, temperature=1.0, autocast=contextlib.nullcontext
    )


def _perturb(adapted: lora.Adapted, seed=1) -> None:
    """Give every lora_B a random value (B = 0 at init makes the adapter a no-op)."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in adapted.model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)


def _base_params(model) -> dict[str, torch.Tensor]:
    """The base weights under their plain names (peft renames a wrapped Linear's weight to base_layer.weight)."""
    return {n.replace(".base_layer", ""): p.detach().clone() for n, p in model.named_parameters() if "lora_" not in n}


# -- the adapter, the reference and merging, without the trainer -----------------------------


@pytest.mark.parametrize("group_size", [1, 4])  # the plain pass and the shared-prompt pass
def test_the_reference_is_the_base_model_at_init_and_with_the_adapter_off(group_size):
    # frozen, as the trainer's own reference copy is: PyTorch's CPU linear can pick another kernel for
    # a weight that requires grad, which changes the last bit of some logits
    base = tiny_model(seed=1).requires_grad_(False)
    batch = _batch(base)
    want = _logprobs(base, batch, group_size)
    adapted = lora.add_adapter(copy.deepcopy(base), **LORA, base="tiny")
    # at init B = 0: the adapter adds exactly zero
    assert torch.equal(_logprobs(adapted.model, batch, group_size), want)
    _perturb(adapted)
    moved = _logprobs(adapted.model, batch, group_size)
    assert not torch.allclose(moved, want, atol=1e-3)  # the comparison can fail
    with adapted.disabled():
        assert torch.equal(_logprobs(adapted.model, batch, group_size), want)
    assert torch.equal(_logprobs(adapted.model, batch, group_size), moved)  # on again after the block


def test_only_adapter_parameters_require_grad_and_the_recorded_base(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rel" / "dir").mkdir(parents=True)  # a relative path that does not exist would be a hub id
    assert lora.base_spec("org/name@abc") == "org/name@abc"  # a hub id stays one
    adapted = lora.add_adapter(tiny_model(seed=1), **LORA, base=lora.base_spec("rel/dir"))
    trainable = [n for n, p in adapted.model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_A" in n or "lora_B" in n for n in trainable)
    assert len(trainable) == 2 * 2 * 7  # 2 layers x 7 projections x (A, B)
    adapted.save_pretrained(tmp_path / "a", safe_serialization=True)
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    saved = json.loads((tmp_path / "a" / "adapter_config.json").read_text())
    assert saved["base_model_name_or_path"] == str((tmp_path / "rel" / "dir").resolve())
    assert lora.saved_settings(tmp_path / "a") == {**LORA, "target_modules": sorted(LORA["target_modules"])}
    assert lora.is_adapter_dir(tmp_path / "a")


def test_the_merged_model_gives_base_plus_adapter_logits(tmp_path):
    base_dir = save_tiny_model(tmp_path / "base", seed=2)
    adapted = lora.add_adapter(load_model(base_dir), **LORA, base=str(base_dir))
    _perturb(adapted)
    adapted.save_pretrained(tmp_path / "adapter", safe_serialization=True)
    merged = lora.load_merged(tmp_path / "adapter", base=lora.adapter_base(tmp_path / "adapter"))
    assert not any("lora_" in n for n, _ in merged.named_parameters())  # a plain model
    ids = torch.tensor([[20, 21, 22, 3, 4, 5, 6], [9, 10, 11, 12, 13, 14, 15]])
    with torch.no_grad():
        want = adapted.model.eval()(ids).logits
        got = merged.eval()(ids).logits
        base = load_model(base_dir).eval()(ids).logits
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(base, want, atol=1e-3)


def test_the_base_of_an_adapter_is_found(tmp_path, monkeypatch):
    base_dir = save_tiny_model(tmp_path / "base")
    adapter = tmp_path / "adapter"
    lora.add_adapter(load_model(base_dir), **LORA, base=str(tmp_path / "moved")).save_pretrained(adapter)
    with pytest.raises(UserError, match="base model .*moved.* is not found"):
        lora.adapter_base(adapter)
    assert lora.adapter_base(adapter, fallback=str(base_dir)) == base_dir  # the run's model.path
    # a built-in name resolves to its converted copy
    monkeypatch.setitem(lora.BUILTIN_MODELS, "tiny-builtin", None)
    monkeypatch.setattr(lora, "resolve_model_path", lambda spec: base_dir if spec == "tiny-builtin" else None)
    config = json.loads((adapter / "adapter_config.json").read_text())
    (adapter / "adapter_config.json").write_text(json.dumps({**config, "base_model_name_or_path": "tiny-builtin"}))
    assert lora.adapter_base(adapter) == base_dir


def test_unknown_target_modules_and_changed_settings_are_one_line_errors(tmp_path):
    with pytest.raises(UserError, match=r"model.lora.target_modules=\['c_attn'\]") as e:
        lora.add_adapter(tiny_model(), **{**LORA, "target_modules": ["c_attn"]}, base="x")
    assert "\n" not in str(e.value)
    lora.add_adapter(tiny_model(), **LORA, base="x").save_pretrained(tmp_path / "a")
    with pytest.raises(UserError, match=r"model.lora.rank=8 \(saved: 4\)"):
        lora.load_adapter(tiny_model(), tmp_path / "a", **{**LORA, "rank": 8})


@pytest.mark.parametrize(
    "override, message",
    [
        ("model.lora.rank=-1", "model.lora.rank=-1: must be >= 0"),
        ("model.lora.alpha=0", "model.lora.alpha=0.0: must be > 0"),
        ("model.lora.dropout=1", "model.lora.dropout=1.0: must be in [0, 1)"),
        ("model.lora.target_modules=[]", "model.lora.target_modules=[]: name at least one layer"),
    ],
)
def test_lora_config_errors(override, message):
    with pytest.raises(UserError) as e:
        load_config(None, [override])
    assert str(e.value).startswith(message)


def test_lora_with_a_reference_sync_is_refused():
    with pytest.raises(UserError, match="algo.ref_sync_every .* model.lora.rank > 0"):
        load_config(None, ["model.lora.rank=8", "algo.kl_coef=0.01", "algo.ref_sync_every=5"])
    assert load_config(None, ["model.lora.rank=8"]).model.lora.target_modules[0] == "q_proj"


# -- training ---------------------------------------------------------------------------------


def _trainer(tiny_dir, run_dir, *extra) -> Trainer:
    trainer = Trainer(tiny_config(tiny_dir, run_dir, *LORA_RUN, *extra))
    assert trainer.setup()
    return trainer


@pytest.mark.slow
def test_lora_training_moves_only_the_adapter_and_the_reference_stays_the_base(tiny_dir, tmp_path):
    trainer = _trainer(tiny_dir, tmp_path / "run", "train.steps=3")
    assert trainer.ref is None  # kl_coef > 0, yet no second copy of the weights
    trainable = [p for p in trainer.policy.parameters() if p.requires_grad]
    assert [id(p) for p in trainer.optimizer.param_groups[0]["params"]] == [id(p) for p in trainable]
    before = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}
    try:
        for step in range(3):
            row = trainer.step(step)
            assert row["train/kl"] >= 0
            trainer.record(step + 1, row)
        assert row["train/kl"] > 0  # the adapter moved the policy away from the reference
        batch = _batch(trainer.policy)
    finally:
        trainer.close()
    # the reference a full fine-tuning run loads, on the run's device (`pytest --device cuda`)
    base = load_model(tiny_dir, device=str(trainer.device)).requires_grad_(False)
    got, want = _base_params(trainer.policy), _base_params(base)
    assert got.keys() == want.keys()
    assert all(torch.equal(got[k], want[k]) for k in want)  # base weights bit-identical
    moved = [n for n, p in trainer.policy.named_parameters() if p.requires_grad and not torch.equal(p, before[n])]
    assert any("lora_B" in n for n in moved) and any("lora_A" in n for n in moved)
    # the reference log-probs are the base model's; the policy's are not
    with trainer.reference() as ref:
        ref_logp = _logprobs(ref, batch)
    assert torch.equal(ref_logp, _logprobs(base, batch))
    assert not torch.allclose(_logprobs(trainer.policy, batch), ref_logp, atol=1e-4)


@pytest.mark.slow
def test_a_lora_checkpoint_holds_the_adapter_and_resume_is_bit_exact(tiny_dir, tmp_path):
    straight, split = tmp_path / "straight", tmp_path / "split"
    train(tiny_config(tiny_dir, straight, *LORA_RUN, "train.steps=4", "train.save_every=2", "train.keep_checkpoints=0"))
    train(tiny_config(tiny_dir, split, *LORA_RUN, "train.steps=2"))
    ckpt = split / "checkpoints" / "step_000002"
    assert sorted(p.name for p in ckpt.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "trainer_state.pt",
    ]
    train(tiny_config(tiny_dir, split, *LORA_RUN, "train.steps=4", f"resume={split}"))
    a = load_file(straight / "checkpoints" / "step_000004" / "adapter_model.safetensors")
    b = load_file(split / "checkpoints" / "step_000004" / "adapter_model.safetensors")
    assert a.keys() == b.keys() and len(a) == 28
    for k in a:
        assert torch.equal(a[k], b[k]), k
    state_a = torch.load(straight / "checkpoints" / "step_000004" / "trainer_state.pt", weights_only=False)
    state_b = torch.load(split / "checkpoints" / "step_000004" / "trainer_state.pt", weights_only=False)
    opt_a, opt_b = state_a["optimizer"]["state"], state_b["optimizer"]["state"]
    assert opt_a.keys() == opt_b.keys() and len(opt_a) == 28  # AdamW holds the adapter's moments only
    for i in opt_a:
        for k in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(opt_a[i][k], opt_b[i][k]), (i, k)
    assert metrics(split, timings=False) == metrics(straight, timings=False)
    # config.yaml records the base model; resuming with other LoRA settings is refused
    assert f"path: {tiny_dir}" in (split / "config.yaml").read_text()
    with pytest.raises(UserError, match=r"model.lora.rank=8 \(saved: 4\)"):
        train(tiny_config(tiny_dir, split, *LORA_RUN, "model.lora.rank=8", "train.steps=5", f"resume={split}"))
    with pytest.raises(UserError, match="holds a LoRA adapter but model.lora.rank=0"):
        train(tiny_config(tiny_dir, split, *LORA_RUN, "model.lora.rank=0", "train.steps=5", f"resume={split}"))


@pytest.mark.slow
def test_lora_with_gradient_checkpointing_bf16_autocast_and_a_bf16_rollout_copy(tiny_dir, tmp_path):
    """Gradient checkpointing gives the adapter the same update (frozen embeddings: the checkpointed
    layers still get an input that requires grad); bf16 autocast and a bf16 generation copy that
    carries the adapter work with it."""
    adapters = {}
    for ckpt in ("false", "true"):
        trainer = _trainer(
            tiny_dir,
            tmp_path / ckpt,
            "train.steps=1",
            f"model.gradient_checkpointing={ckpt}",
            "train.shared_prompt_forward=false",
            "model.autocast_bf16=false",
        )
        _perturb(trainer.adapter)  # policy != reference: the KL term alone gives A and B a gradient
        start = {n: p.detach().clone() for n, p in trainer.policy.named_parameters() if p.requires_grad}
        try:
            trainer.step(0)
        finally:
            trainer.close()
        adapters[ckpt] = {n: p.detach() for n, p in trainer.policy.named_parameters() if p.requires_grad}
        assert all(not torch.equal(adapters[ckpt][n], start[n]) for n in start)  # every A and B moved
    for n in adapters["false"]:
        assert torch.allclose(adapters["true"][n], adapters["false"][n], atol=1e-6), n

    trainer = _trainer(
        tiny_dir,
        tmp_path / "bf16",
        "train.steps=2",
        "rollout.dtype=bfloat16",
        "model.autocast_bf16=true",
        "model.gradient_checkpointing=true",
    )
    _perturb(trainer.adapter)
    try:
        trainer.step(0)
        trainer.engine.sync_weights()
        assert trainer.engine.model is not trainer.policy
        copy_state, policy_state = trainer.engine.model.state_dict(), trainer.policy.state_dict()
        lora_keys = [k for k in policy_state if "lora_" in k]
        assert len(lora_keys) == 28
        for k in lora_keys:  # the generation copy samples with the updated adapter on
            assert torch.equal(copy_state[k], policy_state[k].to(torch.bfloat16)), k
        trainer.step(1)
    finally:
        trainer.close()


def test_the_preflight_counts_a_lora_checkpoint_as_the_adapter_and_its_adam_moments(tiny_dir):
    from rlvr.training.checkpoint import checkpoint_bytes

    adapted = lora.add_adapter(load_model(tiny_dir), **LORA, base="x")
    params = sum(p.numel() for p in adapted.model.parameters() if p.requires_grad)
    assert checkpoint_bytes(tiny_dir, lora_rank=4, lora_targets=LORA["target_modules"]) == 3 * 4 * params
    assert checkpoint_bytes(tiny_dir, "bfloat16", lora_rank=4, lora_targets=LORA["target_modules"]) == 3 * 4 * params
    assert checkpoint_bytes(tiny_dir) > 3 * 4 * 5 * params  # full fine-tuning saves every weight


def test_all_linear_targets_as_in_peft_and_trl(tiny_dir, tmp_path):
    """model.lora.target_modules=all-linear (TRL's and peft's spelling): every linear layer of the blocks
    gets an adapter, the head none, and a resume with the same setting is accepted."""
    cfg = load_config(None, ["model.lora.rank=4", "model.lora.target_modules=all-linear"])
    assert cfg.model.lora.target_modules == ["all-linear"]
    adapted = lora.add_adapter(tiny_model(), rank=4, alpha=8, dropout=0.0, target_modules=["all-linear"], base="x")
    names = {n.split(".lora_A")[0].rsplit(".", 1)[-1] for n, _ in adapted.model.named_parameters() if "lora_A" in n}
    assert names == {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    run = tmp_path / "run"
    every = [*LORA_RUN, "model.lora.target_modules=all-linear"]
    train(tiny_config(tiny_dir, run, *every, "train.steps=1"))
    train(tiny_config(tiny_dir, run, *every, "train.steps=2", f"resume={run}"))
    assert len(metrics(run)) == 2
