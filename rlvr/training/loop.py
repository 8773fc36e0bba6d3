"""One GRPO update, top to bottom: fixed log-probs -> per-micro-batch loss and backward -> optimizer steps.

:class:`rlvr.training.trainer.Trainer` calls these once per step. The math lives in
:mod:`rlvr.algos`; this file only slices micro-batches, runs the forward passes, sums the
statistics over the step's global denominators and steps the optimizer and its lr schedule.
"""

from __future__ import annotations

import math
from functools import partial

import torch
from torch import Tensor
from torch.distributed.tensor import DTensor
from torch.optim.lr_scheduler import LambdaLR
from transformers.optimization import get_cosine_with_min_lr_schedule_with_warmup_lr_rate, get_wsd_schedule

from rlvr import algos
from rlvr import metric_names as M
from rlvr.config import Config
from rlvr.models import eval_mode, response_logits
from rlvr.models.forward import shared_prompt_group
from rlvr.rollout import RolloutBatch
from rlvr.training import microbatch
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
) -> torch.Tensor:
    """[B, T] log-probs of the sampled tokens under ``model``, micro-batched, no grad (0 on padding).

    Each pass runs only up to its own longest response: the columns after it are padding in
    every row, so cutting them changes no log-prob and saves their compute; with
    ``length_buckets`` a micro-batch's short responses run in a pass of their own."""
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32, device=batch.response_mask.device)
    for p in forward_passes(batch, micro_batch_seqs, group_size, bucket=length_buckets):
        rows, Tm = p.rows, p.longest
        with eval_mode(model), autocast():  # the sampled distribution: no dropout
            logits = response_logits(model, **batch.select(rows, Tm), num_response_tokens=Tm, group_size=p.group_size)
        out[rows, :Tm] = algos.token_logprobs(logits, batch.response_ids[rows, :Tm], temperature=temperature)
    return out * batch.response_mask


def forward_passes(
    batch: RolloutBatch, micro_batch_seqs: int, group_size: int, *, bucket: bool
) -> list[microbatch.Pass]:
    """The update's and log-prob passes' row sets (:func:`rlvr.training.microbatch.plan`)."""
    lengths = batch.response_lengths.tolist()
    return microbatch.plan(
        lengths, micro_batch_seqs=micro_batch_seqs, group_size=group_size, prompt_len=batch.prompt_len, bucket=bucket
    )


class _UpdateStats:
    """Statistics of one update summed over its micro-batches, keyed by ``train/`` stat name:
    token means over the whole batch (the step's token count as denominator) and extremes."""

    def __init__(self, num_tokens: Tensor, device) -> None:
        self.num_tokens = num_tokens
        self.zero = torch.zeros((), device=device)
        self.sums: dict[str, Tensor] = {}
        self.extremes: dict[str, Tensor] = {}

    def add(self, key: str, value: Tensor) -> None:
        name = M.stat(key)
        self.sums[name] = self.sums.get(name, self.zero) + value

    def mean(self, key: str, tok: Tensor, m: Tensor) -> None:
        self.add(key, (tok.detach().float() * m).sum() / self.num_tokens)

    def extreme(self, low_key: str, high_key: str, tok: Tensor, m: Tensor) -> None:
        on = m.bool()
        lo = torch.where(on, tok, torch.full_like(tok, float("inf"))).min()
        hi = torch.where(on, tok, torch.full_like(tok, float("-inf"))).max()
        low, high = M.stat(low_key), M.stat(high_key)
        self.extremes[low] = torch.minimum(self.extremes.get(low, lo), lo)
        self.extremes[high] = torch.maximum(self.extremes.get(high, hi), hi)

    def policy(self, stats: dict[str, Tensor], entropy: Tensor, m: Tensor, *, dual_clip: bool) -> None:
        """The policy-loss statistics of one micro-batch (see :func:`rlvr.algos.policy_loss`)."""
        self.mean(M.ENTROPY, entropy, m)
        self.mean(M.CLIP_FRAC, stats["clipped_low"] | stats["clipped_high"], m)
        self.mean(M.CLIP_FRAC_LOW, stats["clipped_low"], m)
        self.mean(M.CLIP_FRAC_HIGH, stats["clipped_high"], m)
        if dual_clip:
            self.mean(M.DUAL_CLIP_FRAC, stats["dual_clipped"], m)
        self.mean(M.RATIO_MEAN, stats["ratio"], m)
        self.extreme(M.RATIO_MIN, M.RATIO_MAX, stats["ratio"], m)


def _micro_batch_loss(
    logits, batch: RolloutBatch, rows: Tensor, m: Tensor, adv, old_logp, ref_logp, cfg: Config, stats: _UpdateStats
):
    """(per-token loss, its policy-gradient part, entropy, policy-loss stats) of one micro-batch
    from its [b, Tm, V] logits; records the TIS and KL statistics."""
    algo, temperature = cfg.algo, cfg.rollout.temperature
    cols = slice(0, m.shape[1])
    # the entropy is a metric (one pass with the log-probs) unless algo.entropy_coef puts it in the loss
    logp, entropy = algos.token_logprobs_entropy(
        logits, batch.response_ids[rows, cols], temperature=temperature, entropy=not algo.entropy_coef
    )
    old = old_logp[rows, cols] if old_logp is not None else logp.detach()
    pg_tok, pg_stats = algos.policy_loss(
        logp,
        old,
        adv[rows],
        m,
        clip_low=algo.clip_low,
        clip_high=algo.clip_high,
        dual_clip=algo.dual_clip,
        level=algo.ratio_level,
    )
    weight = kl_tok = None
    if algo.tis_cap is not None and batch.logprobs is not None:
        weight = algos.truncated_importance_weights(old, batch.logprobs[rows, cols], cap=algo.tis_cap)
        stats.mean(M.TIS_WEIGHT_MEAN, weight, m)
        stats.mean(M.TIS_CAPPED_FRAC, weight >= algo.tis_cap, m)
        stats.extreme(M.TIS_WEIGHT_MIN, M.TIS_WEIGHT_MAX, weight, m)
    if ref_logp is not None:
        kl_tok = algos.kl_divergence(logp, ref_logp[rows, cols], estimator=algo.kl_estimator)
        stats.mean(M.KL, kl_tok, m)
    if algo.entropy_coef:
        entropy = algos.entropy_from_logits(logits, temperature=temperature)
    loss_tok, pg_tok = algos.token_loss(
        pg_tok,
        tis_weight=weight,
        kl=kl_tok,
        kl_coef=algo.kl_coef,
        entropy=entropy if algo.entropy_coef else None,
        entropy_coef=algo.entropy_coef,
    )
    return loss_tok, pg_tok, entropy, pg_stats


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
) -> dict:
    """Backward the loss of the whole rollout batch, ``train.micro_batch_seqs`` rows at a time.

    Every micro-batch's loss uses the token and sequence counts of the whole step (and the
    constant ``rollout.max_new_tokens`` for Dr. GRPO) as its denominator, so the accumulated
    gradient equals the full-batch gradient for any split. ``ref_logp`` adds the KL term to the
    loss (pass None when the KL sits in the reward); ``batch.logprobs`` with ``algo.tis_cap``
    weighs each token by the truncated trainer/engine probability ratio.

    Args:
        num_tokens: response tokens of the whole step; default this batch's (a data-parallel
            worker passes the sum over all workers).
        num_seqs: sequences of the whole step; default this batch's B.

    Returns:
        Detached scalar tensors keyed by ``train/`` stat name: sums over the batch (loss, pg_loss,
        kl, entropy, clip fractions, ratio_mean, tis_weight_mean, ...) and extremes (``*_min`` / ``*_max``).
    """
    algo = cfg.algo
    mask = batch.response_mask.float()  # [B, T]
    B, mb = mask.shape[0], cfg.train.micro_batch_seqs
    num_tokens = mask.sum() if num_tokens is None else num_tokens
    num_seqs = B if num_seqs is None else num_seqs
    agg = dict(mode=algo.loss_agg, num_tokens=num_tokens, num_seqs=num_seqs, max_len=cfg.rollout.max_new_tokens)
    share = shared_prompt_group(mb, batch.group_size) if cfg.train.shared_prompt_forward else 1
    stats = _UpdateStats(num_tokens, mask.device)
    for p in forward_passes(batch, mb, share, bucket=cfg.train.length_buckets):
        rows, Tm = p.rows, p.longest  # the columns after Tm are padding in every row: cut them (exact)
        m = mask[rows, :Tm]
        with autocast():
            logits = response_logits(policy, **batch.select(rows, Tm), num_response_tokens=Tm, group_size=p.group_size)
        loss_tok, pg_tok, entropy, pg_stats = _micro_batch_loss(
            logits, batch, rows, m, adv, old_logp, ref_logp, cfg, stats
        )
        loss = algos.aggregate(loss_tok, m, **agg)
        loss.backward()
        with torch.no_grad():
            stats.add(M.LOSS, loss.detach())
            stats.add(M.PG_LOSS, algos.aggregate(pg_tok.detach(), m, **agg))
            stats.policy(pg_stats, entropy, m, dual_clip=algo.dual_clip is not None)
    return {**stats.sums, **stats.extremes}


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
    ranks before clipping, so every rank clips, skips and steps alike and the weights stay equal."""
    group = OneProcess() if group is None else group
    lr = scheduler.get_last_lr()[0]  # the lr this step trains with
    max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else float("inf")
    totals: dict[str, torch.Tensor] = {}
    grad_norms = []
    skipped = 0
    for _ in range(cfg.algo.num_iterations):
        policy.train()  # dropout as the model defines it; eval mode again before anything samples
        try:
            sums = accumulate_gradients(
                policy, batch, adv, old_logp, ref_logp, cfg, autocast, num_tokens=num_tokens, num_seqs=num_seqs
            )
        finally:
            policy.eval()
        group.reduce_grads(policy)
        sums = group.reduce_stats(sums)
        for k, v in sums.items():
            combine = torch.minimum if k.endswith("_min") else torch.maximum if k.endswith("_max") else torch.add
            totals[k] = combine(totals[k], v) if k in totals else v
        norm = torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm)
        grad_norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)  # FSDP: the global norm
        if torch.isfinite(grad_norms[-1]) and torch.isfinite(sums[M.stat(M.LOSS)]):
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
    return out
