"""Token-budget micro-batches (train.micro_batch_tokens): rows packed end to end without padding give
the loss, gradients, statistics and log-probs of row micro-batches; the update loop never makes the
host wait for the device."""

from __future__ import annotations

import contextlib
import random

import pytest
import torch
from host_syncs import HostSyncs
from tiny_run import assert_same_metrics, tiny_config

from rlvr import metric_names as M
from rlvr.config import load_config
from rlvr.errors import UserError
from rlvr.models.forward import response_logits
from rlvr.models.tiny import tiny_model, tiny_qwen2, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.hf import sample_seed
from rlvr.training import packing, train
from rlvr.training.loop import accumulate_gradients, batch_logprobs, update_passes
from rlvr.training.microbatch import pack

PROMPTS = ["what is 3 + 4 ?", "what is the answer", "2 + 2 = ?", "what is 7"]


def _model(arch: str, attn: str):
    model = (tiny_model if arch == "llama" else tiny_qwen2)(seed=1)
    model.set_attn_implementation(attn)
    return model


def _batch(model, *, P: int = 4, G: int = 4, new: int = 24, seed: int = 3):
    """P prompts x G samples of varied prompt and response lengths (a stop string ends some early)."""
    engine = HFRolloutEngine(model, tiny_tokenizer(), max_new_tokens=new, dtype="float32", stop=["7"])
    batch = engine.generate(PROMPTS[:P], G, seeds=[sample_seed(seed, i) for i in range(P * G)])
    assert len(set(batch.response_lengths.tolist())) > 2  # short and long responses
    return batch


def _cfg(*overrides: str, P: int = 4, G: int = 4):
    base = [f"rollout.samples_per_prompt={G}", f"train.prompts_per_step={P}", "train.shared_prompt_forward=false"]
    return load_config(None, base + list(overrides))


def _update(model, batch, cfg, adv, old=None, ref=None):
    """(statistics, flattened gradient) of one accumulate_gradients call."""
    model.zero_grad(set_to_none=True)
    stats = accumulate_gradients(model, batch, adv, old, ref, cfg, contextlib.nullcontext)
    return stats, torch.cat([p.grad.flatten() for p in model.parameters()])


@pytest.mark.parametrize("arch, attn", [("llama", "sdpa"), ("llama", "eager"), ("qwen2", "sdpa"), ("qwen2", "eager")])
def test_packed_logits_are_each_rows_own(arch, attn, monkeypatch):
    """Rows end to end with restarting positions, attention row by row (sdpa) or under the block mask
    (eager): each row's logits are those of the row on its own, for Llama and Qwen2 (biases, an untied
    head)."""
    model = _model(arch, attn)
    real_mask = packing.block_causal_mask
    g = torch.Generator().manual_seed(0)
    B, P, T = 4, 6, 10
    ids = torch.randint(9, 100, (B, P + T), generator=g)
    plen, rlen = [6, 3, 5, 1], [10, 4, 7, 1]
    am = torch.zeros(B, P + T, dtype=torch.long)
    for i in range(B):
        am[i, P - plen[i] : P + rlen[i]] = 1
    rows = (0, 1, 2, 3)
    lay = packing.layout(rows, plen, rlen, prompt_len=P, width=P + T)
    packed_ids = ids.reshape(-1)[lay.src][None]
    masks = []
    monkeypatch.setattr(packing, "block_causal_mask", lambda *a: masks.append(1) or real_mask(*a))
    out = packing.packed_logits(model, packed_ids, lay.position_ids[None], lay.seq_ids[None], lay.keep, lay.lengths)
    assert len(masks) == (attn == "eager")  # sdpa runs row by row: no [N, N] mask
    assert model.config._attn_implementation == attn  # restored after the pass
    alone = response_logits(model, ids, am, T)  # [B, T, V]
    assert out.shape[1] == sum(rlen)
    for j in rows:
        torch.testing.assert_close(out[0, lay.unpad[j, : rlen[j]]], alone[j, : rlen[j]], rtol=1e-5, atol=1e-5)
    assert torch.equal(packed_ids[0, lay.keep + 1], torch.cat([ids[j, P : P + rlen[j]] for j in rows]))


@pytest.mark.parametrize(
    "config, says", [({"_attn_implementation": "flex_attention"}, "flex_attention"), ({}, "sliding-window")]
)
def test_attention_packing_is_not_built_for_is_a_one_line_error(config, says):
    model = _model("qwen2", "sdpa")
    if not config:  # Qwen2 with its sliding window on every layer
        model.config.layer_types = ["sliding_attention"] * model.config.num_hidden_layers
    for k, v in config.items():
        setattr(model.config, k, v)
    with pytest.raises(UserError, match=r"^[^\n]*set train.micro_batch_tokens=0") as err:
        packing.attention(model)
    assert says in str(err.value)


@pytest.mark.parametrize("arch, attn", [("llama", "sdpa"), ("qwen2", "eager")])
@pytest.mark.parametrize("extra", [[], ["algo.kl_coef=0.04", "algo.num_iterations=2", "algo.entropy_coef=0.01"]])
def test_token_budget_update_equals_row_micro_batches(arch, attn, extra):
    """Loss, every statistic, the gradient and the log-probs of packed passes equal row micro-batches'
    (fp32 rounding), with the KL, old log-probs and a differentiable entropy in the loss too."""
    model = _model(arch, attn)
    batch = _batch(model)
    adv = torch.randn(16, generator=torch.Generator().manual_seed(0))
    lp = dict(micro_batch_seqs=4, group_size=1, temperature=1.0, autocast=contextlib.nullcontext)
    rows_logp = batch_logprobs(model, batch, **lp)
    packed_logp = batch_logprobs(model, batch, **lp, micro_batch_tokens=64)
    torch.testing.assert_close(packed_logp, rows_logp, rtol=1e-5, atol=1e-5)
    old = rows_logp + 0.01 * torch.randn(rows_logp.shape, generator=torch.Generator().manual_seed(1))
    ref = rows_logp - 0.02
    old, ref = old * batch.response_mask, ref * batch.response_mask
    with_ref = ref if extra else None
    stats_rows, grad_rows = _update(model, batch, _cfg("train.micro_batch_seqs=4", *extra), adv, old, with_ref)
    stats_packed, grad_packed = _update(model, batch, _cfg("train.micro_batch_tokens=64", *extra), adv, old, with_ref)
    assert stats_rows.keys() == stats_packed.keys()
    for k in stats_rows:
        torch.testing.assert_close(stats_packed[k], stats_rows[k], rtol=1e-5, atol=1e-6, msg=k)
    torch.testing.assert_close(grad_packed, grad_rows, rtol=1e-4, atol=1e-6)
    assert grad_rows.abs().sum() > 0 and (M.stat(M.KL) in stats_rows) == bool(extra)
    passes = update_passes(batch, _cfg("train.micro_batch_tokens=64", *extra), model)
    assert len(passes) > 2 and max(len(p.rows) for p in passes) > 2  # several passes of several rows each


def test_pack_fits_the_budget_balances_tokens_and_covers_every_row_once():
    rng = random.Random(0)
    tokens = [rng.randint(20, 200) for _ in range(64)]
    responses = [t - 10 for t in tokens]
    passes = pack(tokens, responses, micro_batch_tokens=600)
    rows = sorted(r for p in passes for r in p.rows)
    assert rows == list(range(64))
    loads = [sum(tokens[r] for r in p.rows) for p in passes]
    assert max(loads) <= 600
    assert len(passes) <= -(-sum(tokens) // 600) + 1  # the fewest passes, or one more
    assert max(loads) - min(loads) <= max(tokens)  # balanced by tokens: within one row of each other
    for p in passes:
        assert p.packed and p.group_size == 1 and p.longest == max(responses[r] for r in p.rows)
        assert list(p.rows) == sorted(p.rows)
    over = pack([700, 100, 100], [600, 50, 50], micro_batch_tokens=600)  # a row over the budget runs alone
    assert [p.rows for p in over] == [(0,), (1, 2)]


@pytest.mark.parametrize(
    "extra", [(), ("model.lora.rank=4", "model.lora.alpha=8"), ("model.gradient_checkpointing=true",)]
)
def test_a_training_step_with_token_budgets_logs_what_row_micro_batches_do(extra, tiny_dir, tmp_path, monkeypatch):
    """The trainer end to end (reference and old log-probs in packed no-grad passes, two updates; with
    LoRA, with gradient checkpointing): the step's metrics equal those of row micro-batches."""
    common = ("train.steps=1", "algo.kl_coef=0.1", "algo.num_iterations=2", "train.shared_prompt_forward=false", *extra)
    train(tiny_config(tiny_dir, tmp_path / "rows", *common))
    real, grad_passes = packing.packed_logits, []

    def counted(model, *args, **kwargs):
        grad_passes.append(torch.is_grad_enabled())
        return real(model, *args, **kwargs)

    monkeypatch.setattr(packing, "packed_logits", counted)
    train(tiny_config(tiny_dir, tmp_path / "packed", *common, "train.micro_batch_tokens=64"))
    assert True in grad_passes and False in grad_passes  # the update's passes and the log-prob passes packed
    assert_same_metrics(tmp_path / "rows", tmp_path / "packed", steps=1)


@pytest.mark.parametrize(
    "overrides, says",
    [
        (["train.micro_batch_tokens=512"], "train.shared_prompt_forward=false"),
        (["train.logprob_micro_batch_tokens=512"], "set train.micro_batch_tokens too"),
        (["train.micro_batch_tokens=-1"], "train.micro_batch_tokens must be >= 0"),
        (
            [
                "train.micro_batch_tokens=512",
                "train.shared_prompt_forward=false",
                "distributed.backend=ray",
                "distributed.strategy=fsdp",
            ],
            "set train.micro_batch_tokens=0 (or distributed.strategy=ddp)",
        ),
    ],
)
def test_bad_token_budget_combinations_are_one_line_errors(overrides, says):
    with pytest.raises(UserError, match=r"^[^\n]*$") as err:
        load_config(None, overrides)
    assert says in str(err.value)


def test_token_budget_config_defaults():
    cfg = load_config(None, ["train.micro_batch_tokens=512", "train.shared_prompt_forward=false"])
    assert cfg.train.logprob_tokens == 1024
    cfg = load_config(
        None, ["train.micro_batch_tokens=512", "train.shared_prompt_forward=false", "train.micro_batch_seqs=7"]
    )
    assert cfg.train.micro_batch_seqs == 7  # unused with a token budget: no divisor needed
    assert load_config(None, []).train.logprob_tokens == 0


class _HostSyncs(HostSyncs):
    """Host syncs split by where the op was called from: transformers' own code or rlvr's; and, through
    a patched ``Tensor.tolist`` (which reads the data without a dispatched op), the host reads of whole
    tensors."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.rlvr = self.transformers = self.tolist = 0
        real = torch.Tensor.tolist

        def tolist(t):
            self.tolist += 1
            return real(t)

        monkeypatch.setattr(torch.Tensor, "tolist", tolist)

    def sync(self, func, args) -> None:
        import traceback

        frames = traceback.extract_stack()[:-2]  # without this method's and the dispatcher's frames
        caller = next(
            f.filename for f in reversed(frames) if "/torch/" not in f.filename and "host_syncs" not in f.filename
        )
        if "/transformers/" in caller:
            self.transformers += 1
        else:
            self.rlvr += 1


@pytest.mark.parametrize("key, few, many", [("micro_batch_tokens", 192, 48), ("micro_batch_seqs", 16, 2)])
def test_the_update_loop_makes_no_host_sync_per_micro_batch(key, few, many, monkeypatch):
    """Issue 37: after the planning (one host read of the rows' lengths per call), a micro-batch adds no
    host sync: counted as the syncs of the same batch split into more passes. Packed passes make none
    at all; row passes' only syncs are transformers' padding-mask checks in its sdpa mask (up to three
    per forward, outside rlvr)."""
    model = _model("llama", "sdpa")
    batch = _batch(model)
    adv = torch.randn(16, generator=torch.Generator().manual_seed(0))
    counts = []
    for size in (few, many):
        cfg = _cfg(f"train.{key}={size}", "train.length_buckets=false")
        lp = dict(micro_batch_seqs=cfg.train.micro_batch_seqs, micro_batch_tokens=cfg.train.micro_batch_tokens)
        passes = len(update_passes(batch, cfg, model))
        with _HostSyncs(monkeypatch) as syncs:
            accumulate_gradients(model, batch, adv, None, None, cfg, contextlib.nullcontext)
            batch_logprobs(model, batch, group_size=1, temperature=1.0, autocast=contextlib.nullcontext, **lp)
        counts.append(dict(passes=passes, rlvr=syncs.rlvr, reads=syncs.tolist, transformers=syncs.transformers))
    few_, many_ = counts
    assert many_["passes"] > few_["passes"] >= 1, counts
    assert few_["rlvr"] == many_["rlvr"] == 0, counts
    assert few_["reads"] == many_["reads"] == 2, counts  # the planning's one read, in each of the two calls
    extra = many_["transformers"] - few_["transformers"]
    if key == "micro_batch_tokens":
        assert few_["transformers"] == extra == 0, counts
    else:  # up to three fast_all checks per forward (masking_utils._ignore_causal_mask_sdpa), two calls
        assert 0 < extra <= 3 * 2 * (many_["passes"] - few_["passes"]), counts


def test_estimate_counts_a_token_budget_pass():
    """rlvr estimate's activations for packed passes, by hand on a tiny shape."""
    from rlvr.estimate import ModelShape, estimate

    # layers, hidden, intermediate, heads, kv, V; gemma2 post-processes its logits: the full-logits path
    tiny = ModelShape(2, 32, 64, 4, 2, 128, tie_word_embeddings=True, model_type="gemma2")
    run = [
        "model.dtype=float32",
        "model.autocast_bf16=false",
        "train.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=8",
        "train.shared_prompt_forward=false",
    ]

    def acts(*overrides):
        items = estimate(load_config(None, run + list(overrides)), tiny, prompt=(16, "test")).items
        return next(i for i in items if i.name == "activations")

    # 40 tokens a pass, 40 * 8 // (16 + 8) = 13 of them responses (rows of 16 prompt + 8 response tokens)
    # saved: 2 layers * 40 tokens * (9*32 + 4*64 = 544) * 4 B = 174080 (sdpa attends row by row: no mask)
    # logits: 13 * 128 * (2 * 4 + 2 * 4) B = 26624, + the joined gradient 13 * 128 * 4 = 6656 -> 33280
    # x 1.2 on a CPU: int(1.2 * 207360) = 248832
    packed = acts("train.micro_batch_tokens=40")
    assert packed.bytes == 248832 and "40 tokens packed" in packed.how
    assert acts("train.micro_batch_tokens=10").bytes == acts("train.micro_batch_tokens=24").bytes  # a row runs alone
    # the same 4 rows of 24 tokens as one row micro-batch: 96 tokens, 32 responses (no mask, no extra gradient)
    rows = acts("train.micro_batch_seqs=4").bytes
    assert rows == int(1.2 * (2 * 96 * 544 * 4 + 32 * 128 * 16))
