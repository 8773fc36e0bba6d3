"""train/entropy from the rollout's record (train.rollout_entropy): the rollout's entropy is a full
forward's, the update takes it for every group and runs no pass for groups of all-zero advantages
where nothing needs their log-probs, and the weights and the other statistics are those of the
update's own passes."""

from __future__ import annotations

import contextlib
import copy

import pytest
import torch

from rlvr import algos
from rlvr import metric_names as M
from rlvr.config import load_config
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.rollout import HFRolloutEngine
from rlvr.rollout.base import RolloutBatch, concat_batches, select_groups
from rlvr.rollout.hf import sample_seed
from rlvr.training import loop
from rlvr.training.loop import adamw, lr_scheduler, rollout_entropy_applies, update_policy

PROMPTS = ["what is 3 + 4 ?", "what is the answer", "2 + 2 = ?"]


def _generate(model, *, entropy=True, static=False, greedy=False, temperature=1.0, logprobs=False):
    engine = HFRolloutEngine(
        model, tiny_tokenizer(), max_new_tokens=16, dtype="float32", stop=["7"], entropy=entropy,
        static_decode=static, temperature=temperature, logprobs=logprobs,
    )  # fmt: skip
    return engine.generate(PROMPTS, 4, seeds=None if greedy else [sample_seed(9, i) for i in range(12)], greedy=greedy)


def _full_pass_entropy(model, batch: RolloutBatch, temperature: float) -> torch.Tensor:
    """[B, T] entropy of softmax(z / T) at each response position, from one forward of the whole rows."""
    mask = batch.attention_mask
    positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=batch.input_ids, attention_mask=mask, position_ids=positions).logits
    T = batch.response_mask.shape[1]
    at = logits[:, batch.prompt_len - 1 : batch.prompt_len - 1 + T]  # the logits that sampled each response token
    return algos.entropy_from_logits(at, temperature=temperature) * batch.response_mask


@pytest.mark.parametrize("static", [False, True], ids=["dynamic", "static"])
def test_the_rollout_records_the_entropy_a_full_pass_computes(static):
    model = tiny_model(seed=3)
    batch = _generate(model, static=static, temperature=0.7)
    assert batch.entropy is not None and batch.entropy.shape == batch.response_mask.shape
    assert float((batch.entropy * (1 - batch.response_mask)).abs().sum()) == 0.0  # 0 past each row's end
    torch.testing.assert_close(batch.entropy, _full_pass_entropy(model, batch, 0.7), rtol=1e-4, atol=1e-4)
    assert float(batch.entropy.sum()) > 0


def test_greedy_and_unasked_rollouts_record_no_entropy():
    model = tiny_model(seed=3)
    assert _generate(model, greedy=True).entropy is None
    assert _generate(model, entropy=False).entropy is None


def test_groups_and_batches_keep_their_entropy():
    batch = _generate(tiny_model(seed=3))
    part = select_groups(batch, [2, 0])
    torch.testing.assert_close(part.entropy, torch.cat([batch.entropy[8:], batch.entropy[:4]]))
    both = concat_batches([part, select_groups(batch, [1])], pad_id=0)
    torch.testing.assert_close(both.entropy[8:, : batch.entropy.shape[1]], batch.entropy[4:8])
    part.entropy = None  # one batch without it: none for the whole
    assert concat_batches([part, select_groups(batch, [1])], pad_id=0).entropy is None


def _cfg(*extra: str):
    base = ["rollout.samples_per_prompt=4", "train.prompts_per_step=3", "train.micro_batch_seqs=4", "train.lr=1e-3"]
    return load_config(None, [*base, "train.weight_decay=0.1", *extra])


@pytest.fixture
def passes(monkeypatch):
    """The rows of every model pass the update runs, in order."""
    rows, real = [], loop._pass_logprobs

    def counted(model, p, *args, **kw):
        rows.append(p.rows.numel())
        return real(model, p, *args, **kw)

    monkeypatch.setattr(loop, "_pass_logprobs", counted)
    return rows


def _train(model, advs, cfg, **generate):
    """Weights and metrics after one rollout (the seeds of :func:`_generate`) and update per advantage
    vector, as the trainer alternates them."""
    model = copy.deepcopy(model)
    opt = adamw(list(model.parameters()), lr=cfg.train.lr, betas=(0.9, 0.99), weight_decay=cfg.train.weight_decay)
    sched = lr_scheduler(opt, schedule="constant", warmup_steps=0, total_steps=10, min_lr_ratio=0.1)
    metrics = []
    for adv in advs:
        batch = _generate(model, temperature=cfg.rollout.temperature, logprobs=cfg.algo.tis_cap is not None, **generate)
        metrics.append(update_policy(model, opt, sched, batch, adv, None, None, cfg, contextlib.nullcontext))
    return torch.cat([p.detach().flatten() for p in model.parameters()]), metrics


PACKED = ("train.micro_batch_tokens=96", "train.shared_prompt_forward=false")


@pytest.mark.parametrize(
    "extra, frozen_pass", [((), False), (PACKED, False), (("algo.tis_cap=2.0",), True)], ids=["shared", "packed", "tis"]
)
def test_the_rollouts_entropy_keeps_the_weights_and_spares_the_forward_only_passes(extra, frozen_pass, passes):
    """A middle group of all-zero advantages, then a step of only such groups: bit for bit the same
    weights as with the update's entropy, the same statistics (the entropy within float rounding), and
    no pass for the all-zero groups, except under TIS, whose weights need their log-probs."""
    model = tiny_model(seed=3)
    adv = torch.randn(12, generator=torch.Generator().manual_seed(1))
    adv[4:8] = 0
    runs = {}
    for on in (True, False):
        start = len(passes)
        runs[on] = (*_train(model, [adv, torch.zeros(12)], _cfg(f"train.rollout_entropy={on}", *extra)),
                    passes[start:])  # fmt: skip
    (w_on, m_on, rows_on), (w_off, m_off, rows_off) = runs[True], runs[False]
    assert torch.equal(w_on, w_off)
    for a, b in zip(m_on, m_off):
        assert a.keys() == b.keys()
        for k in a.keys() - {M.ENTROPY}:
            assert torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])), k
        torch.testing.assert_close(torch.as_tensor(a[M.ENTROPY]), torch.as_tensor(b[M.ENTROPY]), rtol=1e-4, atol=1e-5)
    assert float(m_on[1][M.ENTROPY]) > 0 and float(m_on[1][M.FORWARD_ONLY_FRAC]) == 1.0
    assert sum(rows_off) == 12 + 12  # the trained groups and the forward-only one, then every group forward only
    assert sum(rows_on) == (24 if frozen_pass else 8)  # else the first step's trained groups only


def test_the_update_computes_no_entropy_of_its_own_where_the_rollout_gave_it(monkeypatch):
    asked, real = [], loop._pass_logprobs

    def spy(model, p, autocast, **kw):
        asked.append(kw["entropy"])
        return real(model, p, autocast, **kw)

    monkeypatch.setattr(loop, "_pass_logprobs", spy)
    adv = torch.randn(12, generator=torch.Generator().manual_seed(1))
    _train(tiny_model(seed=3), [adv], _cfg())
    _train(tiny_model(seed=3), [adv], _cfg("train.rollout_entropy=false"))
    assert asked == [False] * 3 + [True] * 3  # three passes of 4 rows each run


def test_a_batch_without_the_rollouts_entropy_runs_the_forward_only_passes(passes):
    _train(tiny_model(seed=3), [torch.zeros(12)], _cfg(), entropy=False)
    assert sum(passes) == 12


@pytest.mark.parametrize(
    "extra, applies",
    [
        ((), True),
        (("train.rollout_entropy=false",), False),
        (("train.zero_adv_forward_only=false",), True),
        (("algo.tis_cap=2.0",), True),
        (("algo.kl_coef=0.01", "algo.kl_placement=reward"), True),
        (("algo.num_iterations=2",), False),
        (("algo.entropy_coef=0.01",), False),
        (("rollout.tools=[calculator]",), False),
    ],
)
def test_the_entropy_comes_from_the_rollout_where_the_rollouts_policy_is_the_updates(extra, applies):
    assert rollout_entropy_applies(_cfg(*extra)) is applies


@pytest.mark.slow
def test_a_run_takes_its_frozen_groups_statistics_from_the_rollout(tiny_dir, tmp_path, passes):
    """`rlvr train` end to end: with the switch on, the engine records the entropy and the update runs
    no pass for the groups it would run forward only; the run is the same (the same rewards every
    step, the same final weights bit for bit), and its entropy within float rounding."""
    from safetensors.torch import load_file
    from tiny_run import metrics, tiny_config

    from rlvr.training import train

    runs = {}
    for on in (True, False):
        start, run_dir = len(passes), tmp_path / f"on-{on}"
        train(tiny_config(tiny_dir, run_dir, "train.steps=4", f"train.rollout_entropy={on}"))
        runs[on] = metrics(run_dir), sum(passes[start:]), load_file(run_dir / "checkpoints/last/model.safetensors")
    (m_on, rows_on, w_on), (m_off, rows_off, w_off) = runs[True], runs[False]
    assert [m["rollout/reward_mean"] for m in m_on] == [m["rollout/reward_mean"] for m in m_off]
    assert all(torch.equal(w_on[k], w_off[k]) for k in w_off)
    frozen = sum(m[M.FORWARD_ONLY_FRAC] for m in m_on) * 32  # the 4 steps' forward-only rows
    assert frozen > 0 and rows_on == rows_off - frozen
    for a, b in zip(m_on, m_off):
        assert a[M.ENTROPY] == pytest.approx(b[M.ENTROPY], rel=1e-4)
