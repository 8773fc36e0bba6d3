"""One GRPO update, top to bottom: fixed log-probs -> per-micro-batch loss and backward -> optimizer steps.

:class:`rlvr.training.trainer.Trainer` calls these once per step. The math lives in
:mod:`rlvr.algos`; this file only slices micro-batches, runs the forward passes, sums the
statistics over the step's global denominators and steps the optimizer and its lr schedule.
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from functools import partial

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR
from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup_lr_rate, get_wsd_schedule

from rlvr import algos
from rlvr import metric_names as M
from rlvr.config import Config
from rlvr.models import eval_mode
from rlvr.models.forward import call_logprobs, pass_logprobs, shared_prompt_group, unpadded_applies
from rlvr.rollout import RolloutBatch
from rlvr.rollout.base import group_rows, select_groups
from rlvr.training import microbatch, packing
from rlvr.training.replicas import OneProcess


def adamw(params: list, *, lr: float, betas: tuple[float, float], weight_decay: float) -> torch.optim.AdamW:
    """torch's AdamW, with its fused kernel where the parameters' device has one (CPU and CUDA).

    The fused kernel does the same math in one pass over each tensor; the default (``foreach``)
    loop makes several, which measured several times slower (``benchmarks/NOTES.md``; TRL's default
    is the fused kernel too). The weights agree to float rounding
    (tests/training/test_fused_adamw.py)."""
    device = params[0].device.type if params else "cpu"
    fused = device in ("cpu", "cuda") and all(p.dtype in (torch.float32, torch.bfloat16, torch.float16) for p in params)
    return torch.optim.AdamW(params, lr=lr, betas=betas, weight_decay=weight_decay, fused=fused or None)


def lr_scheduler(optimizer, *, schedule: str, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> LambdaLR:
    """The lr multiplier per optimizer step ``s``: linear warmup, then constant or cosine.

    Warmup trains step s < W at (s + 1)/W of the peak, so its first step is not wasted at lr 0 and
    step W − 1 reaches the peak; cosine then starts from the peak at step W and falls to
    ``min_lr_ratio`` at step ``total_steps``, where it stays (a resume past the horizon).

    transformers ships each case but one, value for value:

    - constant: its warmup that starts at 1/W (``..._warmup_lr_rate``), with the cosine's floor at
      the peak (``min_lr_rate=1``), which makes the cosine flat.
    - cosine without warmup: warmup-stable-decay with no warmup and no stable phase (it holds the
      floor after the horizon, which its plain cosine schedules do not).
    - cosine after a warmup: none. Its schedules either start the warmup at lr 0 or, in the
      ``..._warmup_lr_rate`` variant, start the cosine one step early, below the peak; rlvr keeps
      its own schedule here (:func:`_warmup_then_cosine`).
    """
    if schedule == "constant":
        return get_cosine_with_min_lr_schedule_with_warmup_lr_rate(
            optimizer, warmup_steps, total_steps, min_lr_rate=1.0
        )
    if warmup_steps == 0:
        return get_wsd_schedule(optimizer, 0, total_steps, num_stable_steps=0, min_lr_ratio=min_lr_ratio)
    return LambdaLR(
        optimizer,
        partial(_warmup_then_cosine, warmup_steps=warmup_steps, total_steps=total_steps, min_lr_ratio=min_lr_ratio),
    )


def _warmup_then_cosine(s: int, *, warmup_steps: int, total_steps: int, min_lr_ratio: float) -> float:
    if s < warmup_steps:
        return (s + 1) / warmup_steps
    progress = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
    return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@torch.no_grad()
def batch_logprobs(
    model,
    batch: RolloutBatch,
    *,
    micro_batch_seqs: int,
    group_size: int,
    temperature: float,
    autocast,
    length_buckets: bool = True,
    micro_batch_tokens: int = 0,
    remove_padding: bool = True,
) -> torch.Tensor:
    """[B, T] log-probs of the sampled tokens under ``model``, micro-batched, no grad (0 on padding).

    Each pass runs only up to its own longest response: the columns after it are padding in
    every row, so cutting them changes no log-prob and saves their compute; with
    ``length_buckets`` a micro-batch's short responses run in a pass of their own. With
    ``micro_batch_tokens`` the rows are packed into passes of that many tokens instead
    (:func:`rlvr.training.microbatch.slices`). With ``remove_padding`` a micro-batch that shares its
    prompts in one pass runs its responses without their padding (``train.remove_padding``)."""
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32, device=batch.response_mask.device)
    passes = microbatch.slices(
        batch,
        micro_batch_seqs=micro_batch_seqs,
        group_size=group_size,
        bucket=length_buckets,
        micro_batch_tokens=micro_batch_tokens,
        unpadded=remove_padding and unpadded_applies(model, grad=False),
    )
    for p in passes:
        with eval_mode(model):  # the sampled distribution: no dropout
            logp, _ = _pass_logprobs(model, p, autocast, temperature=temperature)
        out[p.rows, : p.cols] = logp  # device row indices: no host sync
    return out * batch.response_mask


def _pass_logprobs(
    model, p: microbatch.Slice, autocast, *, temperature: float, entropy: bool = False, entropy_grad: bool = False
) -> tuple[Tensor, Tensor | None]:
    """([b, Tm] log-probs of one pass's response tokens, [b, Tm] entropy or None), float32.

    One forward under ``autocast`` whose LM head returns the tokens' log-probs (and entropy) in
    place of the [b, Tm, V] logits (:func:`rlvr.models.forward.pass_logprobs`; the log-sum-exp in
    float32; the full-logits path for models it cannot fuse). ``entropy``: the metric, detached;
    ``entropy_grad``: differentiable, for an entropy bonus in the loss."""
    kw = dict(temperature=temperature, entropy=entropy, entropy_grad=entropy_grad)
    with autocast():
        if p.unpad is None:
            return pass_logprobs(model, **p.inputs, tokens=p.tokens, group_size=p.group_size, unpadded=p.unpadded, **kw)
        logp, ent = call_logprobs(model, partial(packing.packed_logits, model, **p.inputs), p.tokens, **kw)  # [1, n]
    idx = p.unpad.flatten()  # [1, n] -> [b, Tm] by a gather, whose backward is a scatter-add (no host sync)
    logp = logp[0].gather(0, idx).view_as(p.unpad)
    return logp, None if ent is None else ent[0].gather(0, idx).view_as(p.unpad)


class _UpdateStats:
    """Statistics of one update, kept on the device, keyed by ``train/`` stat name: token means over
    the whole batch (the step's token count as denominator), sums and extremes.

    Each micro-batch's statistics are queued and reduced together by :meth:`flush` (one masked sum
    and one masked min and max over the stacked [K, b, Tm] values) into running [K] tensors; the
    token means are divided by the step's token count once, in :meth:`result`."""

    def __init__(self) -> None:
        self._queued: dict[str, list] = {"sum": [], "mean": [], "low": [], "high": []}
        self._names: dict[str, list[str]] | None = None
        self._totals: dict[str, Tensor] = {}

    def add(self, key: str, value: Tensor) -> None:
        """A scalar summed over the micro-batches (the loss, already divided by the step's counts)."""
        self._queued["sum"].append((M.stat(key), value))

    def mean(self, key: str, tok: Tensor) -> None:
        """A [b, Tm] per-token value averaged over the step's trained tokens."""
        self._queued["mean"].append((M.stat(key), tok))

    def extreme(self, low_key: str, high_key: str, tok: Tensor) -> None:
        """The min and max of a [b, Tm] per-token value over the step's trained tokens."""
        self._queued["low"].append((M.stat(low_key), tok))
        self._queued["high"].append((M.stat(high_key), tok))

    def policy(self, stats: dict[str, Tensor], entropy: Tensor, *, dual_clip: bool) -> None:
        """The policy-loss statistics of one micro-batch (see :func:`rlvr.algos.policy_loss`)."""
        self.mean(M.ENTROPY, entropy)
        self.mean(M.CLIP_FRAC, stats["clipped_low"] | stats["clipped_high"])
        self.mean(M.CLIP_FRAC_LOW, stats["clipped_low"])
        self.mean(M.CLIP_FRAC_HIGH, stats["clipped_high"])
        if dual_clip:
            self.mean(M.DUAL_CLIP_FRAC, stats["dual_clipped"])
        self.mean(M.RATIO_MEAN, stats["ratio"])
        self.extreme(M.RATIO_MIN, M.RATIO_MAX, stats["ratio"])

    def flush(self, m: Tensor) -> None:
        """Reduce the queued statistics of a micro-batch with [b, Tm] mask ``m`` into the totals."""
        queued, self._queued = self._queued, {k: [] for k in self._queued}
        names = {k: [name for name, _ in v] for k, v in queued.items()}
        if self._names is None:
            self._names = names
        elif names != self._names:  # the config fixes which statistics a micro-batch records
            raise RuntimeError(f"micro-batches recorded different statistics: {names} vs {self._names}")
        on = m.bool()
        new = {}
        if queued["sum"]:
            new["sum"] = torch.stack([v.detach().float() for _, v in queued["sum"]])
        if queued["mean"]:
            new["mean"] = (torch.stack([v.detach().float() for _, v in queued["mean"]]) * m).sum((1, 2))
        for kind, reduce, fill in (("low", torch.amin, float("inf")), ("high", torch.amax, float("-inf"))):
            if queued[kind]:
                values = torch.stack([v.detach().float() for _, v in queued[kind]])  # [K, b, Tm]
                new[kind] = reduce(values.masked_fill(~on, fill), dim=(1, 2))
        combine = {"sum": torch.add, "mean": torch.add, "low": torch.minimum, "high": torch.maximum}
        for kind, value in new.items():
            self._totals[kind] = combine[kind](self._totals[kind], value) if kind in self._totals else value

    def result(self, num_tokens: Tensor) -> dict[str, Tensor]:
        """The statistics so far: sums, token means (divided by ``num_tokens``), extremes."""
        out = {}
        for kind, total in self._totals.items():
            values = total / num_tokens if kind == "mean" else total
            out.update(zip(self._names[kind], values.unbind()))
        return out


@dataclass(frozen=True)
class _Targets:
    """What one pass's loss compares its log-probs with, cut before the loop: mask [b, Tm], adv [b],
    the old, reference and engine log-probs [b, Tm], and the rollout's entropy [b, Tm] for the
    statistics (each None when unused)."""

    mask: Tensor
    adv: Tensor
    old: Tensor | None
    ref: Tensor | None
    engine: Tensor | None
    entropy: Tensor | None = None

    @staticmethod
    def cut(p: microbatch.Slice, adv: Tensor, old_logp, ref_logp, engine_logp, entropy=None) -> _Targets:
        cols = slice(0, p.cols)
        rows = lambda t: None if t is None else t[p.rows, cols]  # noqa: E731 - one cut for five tensors
        return _Targets(p.mask.float(), adv[p.rows], rows(old_logp), rows(ref_logp), rows(engine_logp), rows(entropy))


def _micro_batch_loss(logp: Tensor, entropy: Tensor | None, t: _Targets, cfg: Config, stats: _UpdateStats):
    """(per-token loss, its policy-gradient part, policy-loss stats) of one micro-batch from its
    [b, Tm] log-probs (and entropy, differentiable when ``algo.entropy_coef`` puts it in the loss);
    records the TIS and KL statistics."""
    algo = cfg.algo
    old = t.old if t.old is not None else logp.detach()
    pg_tok, pg_stats = algos.policy_loss(
        logp,
        old,
        t.adv,
        t.mask,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        dual_clip=algo.dual_clip,
        level=algo.ratio_level,
    )
    weight = kl_tok = None
    if algo.tis_cap is not None and t.engine is not None:
        weight = algos.truncated_importance_weights(old, t.engine, cap=algo.tis_cap)
        stats.mean(M.TIS_WEIGHT_MEAN, weight)
        stats.mean(M.TIS_CAPPED_FRAC, weight >= algo.tis_cap)
        stats.extreme(M.TIS_WEIGHT_MIN, M.TIS_WEIGHT_MAX, weight)
    if t.ref is not None:
        kl_tok = algos.kl_divergence(logp, t.ref, estimator=algo.kl_estimator)
        stats.mean(M.KL, kl_tok)
    loss_tok, pg_tok = algos.token_loss(
        pg_tok,
        tis_weight=weight,
        kl=kl_tok,
        kl_coef=algo.kl_coef,
        entropy=entropy if algo.entropy_coef else None,
        entropy_coef=algo.entropy_coef,
    )
    return loss_tok, pg_tok, pg_stats


def update_passes(batch: RolloutBatch, cfg: Config, policy) -> list[microbatch.Slice]:
    """The update's passes of ``policy`` (:func:`rlvr.training.microbatch.slices` with the ``train.*``
    micro-batch keys)."""
    mb = min(cfg.train.micro_batch_seqs, batch.input_ids.shape[0])  # at least the batch: one pass
    share = shared_prompt_group(mb, batch.group_size) if cfg.train.shared_prompt_forward else 1
    return microbatch.slices(
        batch,
        micro_batch_seqs=mb,
        group_size=share,
        bucket=cfg.train.length_buckets,
        micro_batch_tokens=cfg.train.micro_batch_tokens,
        unpadded=cfg.train.remove_padding and unpadded_applies(policy, grad=True),
    )


def accumulate_gradients(
    policy,
    batch: RolloutBatch,
    adv,
    old_logp,
    ref_logp,
    cfg: Config,
    autocast,
    *,
    num_tokens: Tensor | None = None,
    num_seqs: int | None = None,
    passes: list[microbatch.Slice] | None = None,
    observed: ForwardOnly | None = None,
) -> dict:
    """Backward the loss of the whole rollout batch, one micro-batch at a time: ``train.micro_batch_seqs``
    rows, or rows packed into ``train.micro_batch_tokens``.

    Every micro-batch's loss uses the token and sequence counts of the whole step (and the
    constant ``rollout.max_new_tokens`` for Dr. GRPO) as its denominator, so the accumulated
    gradient equals the full-batch gradient for any split. ``ref_logp`` adds the KL term to the
    loss (pass None when the KL sits in the reward); ``batch.logprobs`` with ``algo.tis_cap``
    weighs each token by the truncated trainer/engine probability ratio. The loop over
    micro-batches never waits for the device: its tensors are cut beforehand, and the statistics
    stay on the device.

    Args:
        num_tokens: response tokens of the whole step; default this batch's (a data-parallel
            worker passes the sum over all workers).
        num_seqs: sequences of the whole step; default this batch's B.
        passes: the batch's :func:`update_passes`, when the caller planned them already.
        observed: rows that run forward only, for the statistics (:func:`forward_only_groups`):
            their loss is identically 0, so they add nothing to the gradient.

    Returns:
        Detached scalar tensors keyed by ``train/`` stat name: sums over the batch (loss, pg_loss,
        kl, entropy, clip fractions, ratio_mean, tis_weight_mean, ...) and extremes (``*_min`` / ``*_max``).
    """
    algo = cfg.algo
    mask = batch.response_mask
    num_tokens = mask.sum().float() if num_tokens is None else num_tokens
    num_seqs = mask.shape[0] if num_seqs is None else num_seqs
    agg = dict(mode=algo.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs, max_len=cfg.rollout.max_new_tokens)
    passes = update_passes(batch, cfg, policy) if passes is None else passes
    engine_logp = batch.logprobs if algo.tis_cap is not None else None
    entropy = batch.entropy if rollout_entropy_applies(cfg) else None
    targets = [_Targets.cut(p, adv, old_logp, ref_logp, engine_logp, entropy) for p in passes]
    stats = _UpdateStats()
    # One autocast region spans all micro-batches, so its cache casts each weight to bf16 once per
    # update instead of once per micro-batch; the loss and the backward run with autocast off, as
    # they did outside the per-pass region.
    off = partial(torch.autocast, mask.device.type, enabled=False)
    with autocast():
        for p, t in zip(passes, targets):
            _micro_batch_backward(policy, p, t, cfg, autocast, off, agg, stats)
        if observed is not None:
            _forward_only(policy, observed, cfg, autocast, off, agg, stats)
    return stats.result(num_tokens)


@torch.no_grad()
def _forward_only(policy, observed: ForwardOnly, cfg: Config, autocast, off, agg: dict, stats) -> None:
    """The passes of ``observed`` as :func:`_micro_batch_backward` runs them, without gradients or a
    backward: their statistics only (their loss is identically 0).

    Where the rollout recorded its entropy (:func:`rollout_entropy_applies`) and nothing needs
    these rows' log-probs (no old log-probs, no TIS), no pass runs: the ratio is exp(logp − logp)
    = 1 exactly whatever the log-probs, so the statistics are those of any log-probs (zeros here)
    and the rollout's entropy."""
    tis = cfg.algo.tis_cap is not None
    engine = observed.batch.logprobs if tis else None
    entropy = observed.batch.entropy if rollout_entropy_applies(cfg) else None
    no_pass = entropy is not None and observed.old_logp is None and not tis  # the same for every pass
    for p in observed.passes:
        t = _Targets.cut(p, observed.adv, observed.old_logp, None, engine, entropy)
        if no_pass:
            with off():
                _loss_and_stats(t.mask.new_zeros(t.mask.shape), None, t, cfg, agg, stats)
        else:
            _micro_batch_backward(policy, p, t, cfg, autocast, off, agg, stats, backward=False)


def rollout_entropy_applies(cfg: Config) -> bool:
    """Whether ``train/entropy`` comes from the rollout's record of its sampling distribution
    (``train.rollout_entropy``; ``RolloutBatch.entropy``) rather than from the update's passes: the
    policy the update starts from is the one that sampled (``algo.num_iterations=1``), the entropy
    is not in the loss (no ``algo.entropy_coef``), the rollout is single-turn (tool rollouts record
    none) and not made by older weights (asynchronous rollouts). The rollout engine records it where
    this holds; a batch without the record falls back to the update's passes."""
    algo = cfg.algo
    plain = algo.num_iterations == 1 and not algo.entropy_coef and not cfg.rollout.tools and cfg.rollout.max_turns == 1
    plain = plain and not (cfg.rollout.max_staleness and cfg.distributed.rollout_workers)  # an older policy sampled
    return cfg.train.rollout_entropy and plain


def _micro_batch_backward(
    policy, p: microbatch.Slice, t: _Targets, cfg: Config, autocast, off, agg: dict, stats, *, backward: bool = True
):
    """One micro-batch of :func:`accumulate_gradients`: its forward under ``autocast``, its loss and
    backward under ``off`` (autocast disabled; no backward when not ``backward``), its statistics
    added to ``stats``."""
    algo = cfg.algo
    # packed: the rows' own attention through the backward too (checkpointed layers run again there)
    with packing.row_attention(policy) if p.unpad is not None else contextlib.nullcontext():
        # the entropy is a metric (one pass with the log-probs; none where the rollout recorded it) unless
        # algo.entropy_coef puts it in the loss
        kw = dict(temperature=cfg.rollout.temperature, entropy=t.entropy is None, entropy_grad=bool(algo.entropy_coef))
        logp, entropy = _pass_logprobs(policy, p, autocast, **kw)
        with off():
            _loss_and_stats(logp, entropy, t, cfg, agg, stats, backward=backward)


def _loss_and_stats(logp: Tensor, entropy, t: _Targets, cfg: Config, agg: dict, stats, *, backward=False):
    """One pass's loss from its [b, Tm] log-probs and entropy (its backward when ``backward``), its
    statistics added to ``stats``: the entropy's from the rollout's record where ``t`` has it."""
    loss_tok, pg_tok, pg_stats = _micro_batch_loss(logp, entropy, t, cfg, stats)
    loss = algos.aggregate(loss_tok, t.mask, **agg)
    if backward:
        loss.backward()
    with torch.no_grad():
        stats.add(M.LOSS, loss)
        stats.add(M.PG_LOSS, algos.aggregate(pg_tok.detach(), t.mask, **agg))
        stats.policy(pg_stats, entropy if t.entropy is None else t.entropy, dual_clip=cfg.algo.dual_clip is not None)
        stats.flush(t.mask)


def update_policy(
    policy,
    optimizer,
    scheduler,
    batch: RolloutBatch,
    adv,
    old_logp,
    ref_logp,
    cfg: Config,
    autocast,
    *,
    num_tokens: Tensor | None = None,
    num_seqs: int | None = None,
    group=None,
) -> dict:
    """``algo.num_iterations`` optimizer steps over the rollout batch; returns ``train/`` metrics
    over them (means, and the min/max of the ``*_min`` / ``*_max`` ones).

    An iteration whose loss or gradient norm is not finite takes no optimizer or schedule step
    (its gradients are dropped); ``train/skipped_updates`` counts them. ``num_tokens`` /
    ``num_seqs``: the loss denominators, see :func:`accumulate_gradients`. ``group``: the
    data-parallel group (default one process); its gradients and statistics are summed over the
    ranks before clipping, so every rank clips, skips and steps alike and the weights stay equal.
    Groups whose loss is identically 0 may run forward only (:func:`_plan_update`)."""
    group = OneProcess() if group is None else group
    lr = scheduler.get_last_lr()[0]  # the lr this step trains with
    max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else float("inf")
    totals, grad_norms, skipped = {}, [], 0  # statistics by name; each iteration's norm; skipped steps
    batch, adv, old_logp, kw, forward_only = _plan_update(
        policy, batch, adv, old_logp, ref_logp, cfg, num_tokens, num_seqs, group
    )
    all_zero = not kw["passes"] and group.world_size == 1  # no backward will run: every gradient is a zero
    for _ in range(cfg.algo.num_iterations):
        policy.train()  # dropout as the model defines it; eval mode again before anything samples
        try:
            sums = accumulate_gradients(policy, batch, adv, old_logp, ref_logp, cfg, autocast, **kw)
        finally:
            policy.eval()
        _zero_missing_grads(policy, kw["observed"], shared=group.world_size == 1)
        group.reduce_grads(policy)
        sums = group.reduce_stats(sums)
        for k, v in sums.items():
            combine = torch.minimum if k.endswith("_min") else torch.maximum if k.endswith("_max") else torch.add
            totals[k] = combine(totals[k], v) if k in totals else v
        finite, norm = _clip_gradients(policy, max_norm, sums[M.stat(M.LOSS)], all_zero=all_zero)
        grad_norms.append(norm)
        if finite:
            optimizer.step()
            scheduler.step()
        else:  # a NaN/inf loss or gradient: skip this update, weights and AdamW state stay intact
            skipped += 1
        optimizer.zero_grad(set_to_none=True)
    n = cfg.algo.num_iterations
    out = {M.train(k): v if k.endswith(("_min", "_max")) else v / n for k, v in totals.items()}
    out[M.GRAD_NORM] = torch.stack(grad_norms).mean()
    out[M.LR] = lr
    out[M.SKIPPED_UPDATES] = skipped
    out[M.FORWARD_ONLY_FRAC] = forward_only
    return out


@dataclass(frozen=True)
class ForwardOnly:
    """Rows of an update that run forward only, for its statistics (:func:`forward_only_groups`):
    the sub-batch, its advantages (all 0) and old log-probs, and its passes."""

    batch: RolloutBatch
    adv: Tensor
    old_logp: Tensor | None
    passes: list[microbatch.Slice]


def forward_only_groups(adv: Tensor, group_size: int) -> tuple[list[int], list[int]]:
    """(groups to train, groups whose every advantage is exactly 0), by index; one host read.

    A group whose G samples scored alike has advantages of exactly 0 under every method
    (:func:`rlvr.algos.group_advantages`). Without a KL term or an entropy bonus in the loss, its
    tokens' loss is then identically 0 whatever the log-probs (every policy-loss form multiplies
    by the advantage), and so is their gradient: a backward through them adds only zeros. In the
    quickstart's later steps half to all of the groups are such (``rollout/zero_std_groups``)."""
    zero = (adv.view(-1, group_size) == 0).all(1).tolist()  # host read
    return [g for g, z in enumerate(zero) if not z], [g for g, z in enumerate(zero) if z]


def _plan_update(policy, batch: RolloutBatch, adv, old_logp, ref_logp, cfg: Config, num_tokens, num_seqs, group):
    """(the trained batch, its advantages, its old log-probs, the keywords of
    :func:`accumulate_gradients`, the fraction of the step's sequences that run forward only),
    planned once for all iterations (the update's host reads).

    With ``train.zero_adv_forward_only``, the groups whose advantages are all 0 move out of the
    backward into forward-only passes (:class:`ForwardOnly`) when their loss is identically 0: no
    KL term in the loss, no entropy bonus. The loss denominators stay the whole batch's, so the
    gradient and every statistic are the same up to float rounding. Off under FSDP, where every
    worker must run the same passes."""
    num_tokens = batch.response_mask.sum().float() if num_tokens is None else num_tokens
    num_seqs = batch.response_mask.shape[0] if num_seqs is None else num_seqs
    kw = dict(num_tokens=num_tokens, num_seqs=num_seqs, observed=None)
    zero_loss = ref_logp is None and not cfg.algo.entropy_coef
    if cfg.train.zero_adv_forward_only and zero_loss and not group.shards:
        trained, frozen = forward_only_groups(adv, batch.group_size)
        if frozen:
            part, frozen_adv, frozen_old = _select_groups(batch, adv, old_logp, frozen)
            kw["observed"] = ForwardOnly(part, frozen_adv, frozen_old, update_passes(part, cfg, policy))
            batch, adv, old_logp = _select_groups(batch, adv, old_logp, trained)
    kw["passes"] = update_passes(batch, cfg, policy) if batch.response_mask.shape[0] else []
    seqs = 0 if kw["observed"] is None else kw["observed"].adv.shape[0]  # this rank's
    total = group.sum(adv.new_tensor(float(seqs))) if group.world_size > 1 else seqs
    return batch, adv, old_logp, kw, total / num_seqs


def _select_groups(batch: RolloutBatch, adv: Tensor, old_logp: Tensor | None, groups: list[int]):
    """(batch, advantages, old log-probs) of the given groups' rows."""
    rows = group_rows(groups, batch.group_size).to(adv.device)
    return select_groups(batch, groups), adv[rows], None if old_logp is None else old_logp[rows]


def _clip_gradients(policy, max_norm: float, loss: Tensor, *, all_zero: bool = False) -> tuple[bool, Tensor]:
    """``clip_grad_norm_`` with the step's one host read: (whether the loss and the gradient norm are
    finite, the global norm). The gradients are rescaled only where clipping changes them: torch
    multiplies every gradient by its factor even when the factor is 1 (a full pass over the
    gradients, to spare a GPU a host read), and the update reads the norm on the host anyway to
    decide whether to step. The factor is computed as ``clip_grads_with_norm_`` computes it, so
    skipping a factor of exactly 1 leaves the gradients bit for bit as they were.

    ``all_zero``: every gradient is known to be zero (no pass ran a backward, in one process), so
    the norm is exactly 0 and is not computed: a read of every gradient saved."""
    if all_zero:
        return bool(torch.isfinite(loss)), torch.zeros((), device=loss.device)  # host read: the loss's finiteness
    params = list(policy.parameters())
    local = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    norm = local.full_tensor() if isinstance(local, DTensor) else local  # FSDP: the global norm
    factor = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    finite = torch.isfinite(norm) & torch.isfinite(loss)
    ok, factor = torch.stack([finite.to(factor.dtype), factor]).tolist()  # the one host read of a step
    if ok and factor < 1.0:
        torch.nn.utils.clip_grads_with_norm_(params, max_norm, local)
    return bool(ok), norm


def _zero_missing_grads(policy, observed: ForwardOnly | None, *, shared: bool) -> None:
    """With forward-only groups, zeros for every trainable parameter without a gradient: what a
    backward through those groups alone would have given, so that AdamW steps it as before
    (momentum, weight decay).

    ``shared``: parameters of one shape and dtype take one zero tensor between them (a step where
    every group ran forward only fills one of each shape, not a model's worth). Only in one process:
    until the step, a gradient is changed in place only by clipping's rescale, which keeps a zero
    zero, and by the sum over ranks, which would write another rank's gradient into the tensor that
    the others share."""
    if observed is None:
        return
    zeros: dict[tuple, Tensor] = {}
    for p in policy.parameters():
        if p.requires_grad and p.grad is None:
            key = (p.shape, p.dtype, p.device) if shared else id(p)
            if key not in zeros:
                zeros[key] = torch.zeros_like(p)
            p.grad = zeros[key]
