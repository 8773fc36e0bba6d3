"""One step's rollout data: prompts -> samples -> rewards, with DAPO dynamic sampling.

The trainer calls :func:`collect` once per step. With ``algo.dynamic_sampling`` off it is one
rollout of the step's prompts; with it on, groups whose rewards are all equal (no learning
signal) are dropped and more prompts are drawn until as many groups as the step has prompts
carry signal or ``algo.dynamic_sampling_max_batches`` extra batches were drawn. Extra prompts
are a pure function of ``(seed, step, attempt)``, like the step's own prompts, so resume stays
exact. What a sequence samples is a pure function of ``(seed, step, attempt, group, sample)``
(:func:`sequence_seeds`): the same in one process and in N data-parallel workers, whatever the
batch it is generated in. :func:`rollout_metrics` summarises everything sampled.
"""

from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass

import torch

from rlvr import algos
from rlvr import metric_names as M
from rlvr.config import Config
from rlvr.rewards.code import drain_stats as drain_code_stats
from rlvr.rewards.registry import RewardResult
from rlvr.rollout.base import RolloutBatch, concat_batches, select_groups
from rlvr.rollout.hf import sample_seed
from rlvr.tools import tool_stats
from rlvr.training.replicas import OneProcess


@dataclass
class Scored:
    """Sampled groups with their rewards; row ``i`` of every list belongs to prompt ``rows[i // G]``."""

    rows: list[dict]
    """P' prompt rows (one per group)."""
    batch: RolloutBatch
    """P'·G sampled sequences."""
    said: list[str]
    """What the assistant said: the template's assistant prefix + the completion (what rewards read)."""
    answers: list[str]
    """Gold answer per sequence."""
    result: RewardResult
    """Per-rule scores, weighted totals, error counts."""
    acc: list[float]
    """``reward.accuracy_rule`` score per sequence."""
    fmt: list[float]
    """``format`` rule score per sequence."""
    rewards: torch.Tensor
    """[P'·G] float32 reward used for advantages: total + DAPO overlong penalty (if on)."""

    def select(self, groups: list[int]) -> Scored:
        G = self.batch.group_size
        seqs = [g * G + j for g in groups for j in range(G)]
        pick = lambda xs: [xs[i] for i in seqs]  # noqa: E731
        result = RewardResult(
            total=pick(self.result.total),
            per_rule={k: pick(v) for k, v in self.result.per_rule.items()},
            errors=self.result.errors,
        )
        return Scored(
            [self.rows[g] for g in groups],
            select_groups(self.batch, groups),
            pick(self.said),
            pick(self.answers),
            result,
            pick(self.acc),
            pick(self.fmt),
            self.rewards[seqs],
        )

    @staticmethod
    def concat(parts: list[Scored], pad_id: int) -> Scored:
        if len(parts) == 1:
            return parts[0]
        cat = lambda name: [x for p in parts for x in getattr(p, name)]  # noqa: E731
        return Scored(
            cat("rows"),
            concat_batches([p.batch for p in parts], pad_id),
            cat("said"),
            cat("answers"),
            _concat_results([p.result for p in parts]),
            cat("acc"),
            cat("fmt"),
            torch.cat([p.rewards for p in parts]),
        )

    def summary(self) -> Sampled:
        """What the step's metrics read of these groups (scores and lengths, on the CPU)."""
        b = self.batch
        return Sampled(
            b.group_size,
            self.result,
            self.acc,
            self.fmt,
            self.rewards.cpu(),
            b.response_lengths.cpu(),
            b.truncated.cpu(),
            b.tool_calls,
            b.tool_errors,
        )


@dataclass
class Sampled:
    """What the ``rollout/*`` metrics read of everything sampled in a step: the scores and lengths, not
    the sequences. Without dynamic sampling, data-parallel workers exchange this and nothing more."""

    group_size: int
    result: RewardResult
    acc: list[float]
    fmt: list[float]
    rewards: torch.Tensor
    """[n] float32: the rewards the advantages use."""
    response_lengths: torch.Tensor
    """[n] response tokens of each sequence."""
    truncated: torch.Tensor
    """[n] bool: the sequence reached ``rollout.max_new_tokens``."""
    tool_calls: list[int] | None = None
    """[n] tool calls per sequence; None without tools."""
    tool_errors: list[int] | None = None
    """[n] of those, the calls that answered an error; None without tools."""

    @staticmethod
    def concat(parts: list[Sampled]) -> Sampled:
        if len(parts) == 1:
            return parts[0]
        return Sampled(
            parts[0].group_size,
            _concat_results([p.result for p in parts]),
            [x for p in parts for x in p.acc],
            [x for p in parts for x in p.fmt],
            torch.cat([p.rewards for p in parts]),
            torch.cat([p.response_lengths for p in parts]),
            torch.cat([p.truncated for p in parts]),
            _cat_lists([p.tool_calls for p in parts]),
            _cat_lists([p.tool_errors for p in parts]),
        )


def _cat_lists(parts: list[list[int] | None]) -> list[int] | None:
    return None if any(p is None for p in parts) else [x for p in parts for x in p]


def _concat_results(results: list[RewardResult]) -> RewardResult:
    errors: dict[str, int] = {}
    for r in results:
        for k, n in r.errors.items():
            errors[k] = errors.get(k, 0) + n
    return RewardResult(
        total=[x for r in results for x in r.total],
        per_rule={k: [x for r in results for x in r.per_rule[k]] for k in results[0].per_rule},
        errors=errors,
    )


def extra_prompt_indices(num_rows: int, n: int, *, seed: int, step: int, attempt: int) -> list[int]:
    """Row indices of extra prompts for dynamic sampling: a pure function of (seed, step, attempt)."""
    rng = random.Random(f"rlvr-dynamic-sampling:{seed}:{step}:{attempt}")
    return [rng.randrange(num_rows) for _ in range(n)]


def sequence_seeds(seed: int, step: int, attempt: int, first_group: int, num_groups: int, G: int) -> list[int]:
    """The sampling seed of each of ``num_groups`` x G sequences: group ``first_group + p`` of the
    step's (``attempt`` 0) or a dynamic-sampling extra batch's prompts, sample ``j``."""
    return [sample_seed(seed, step, attempt, first_group + p, j) for p in range(num_groups) for j in range(G)]


def _sample_and_score(
    engine, scorer, rows: list[dict], cfg: Config, prefix: str, timing: dict, seeds: list[int]
) -> Scored:
    G = cfg.rollout.samples_per_prompt
    t0 = time.perf_counter()
    episodes = {"rows": rows} if getattr(engine, "environment", None) is not None else {}  # each reset reads its row
    batch = engine.generate([r["prompt"] for r in rows], G, seeds=seeds, **episodes)
    turns, env_rewards = getattr(batch, "turns", None), getattr(batch, "env_rewards", None)
    if turns is not None and engine.tools is None:  # episodes with turns of the model's (not tool calls)
        timing.setdefault("turns", []).extend(turns)
    t1 = time.perf_counter()
    said = [prefix + text for text in batch.texts]  # the prefix is part of the assistant's turn
    answers = [r["answer"] for r in rows for _ in range(G)]
    fields = {k: [r.get(k) for r in rows for _ in range(G)] for k in rows[0] if k != "answer"}
    result = scorer.score(said, answers, fields, truncated=batch.truncated.tolist())
    acc_rule = cfg.reward.accuracy_rule
    acc = result.per_rule.get(acc_rule) or scorer.rule_scores(acc_rule, said, answers, fields)[0]
    fmt = result.per_rule.get("format") or scorer.rule_scores("format", said, answers, fields)[0]
    # on the batch's device: the overlong penalty and the advantages meet the batch's tensors there
    if env_rewards is not None:  # a plugin environment's own reward, weighted beside the rules'
        env = [0.0 if x is None else float(x) for x in env_rewards]
        total = [t + cfg.reward.env_weight * e for t, e in zip(result.total, env)]
        result = dataclasses.replace(result, total=total, per_rule={**result.per_rule, "env": env})
    if cfg.rollout.turn_discount < 1 and turns is not None:  # a later attempt's pass is worth less
        total = [t * cfg.rollout.turn_discount ** (n - 1) for t, n in zip(result.total, turns)]
        result = dataclasses.replace(result, total=total)
    rewards = torch.tensor(result.total, dtype=torch.float32, device=batch.response_lengths.device)
    if cfg.algo.overlong_buffer:
        rewards = rewards + algos.overlong_penalty(
            batch.response_extent,  # the budget counts tool results too
            max_len=cfg.rollout.max_new_tokens,
            buffer=cfg.algo.overlong_buffer,
            factor=cfg.algo.overlong_penalty,
        )
    timing["rollout"] += t1 - t0
    timing["reward"] += time.perf_counter() - t1
    return Scored(rows, batch, said, answers, result, acc, fmt, rewards)


def collect(engine, scorer, train_rows: list[dict], prompts: list[int], step: int, cfg: Config, *, prefix: str,
            first_group: int = 0, group=None):  # fmt: skip
    """Samples and scores the step's groups.

    Args:
        prompts: row indices of this rank's prompts (one group of G samples each): the whole
            step's batch in one process, a contiguous shard of it on a data-parallel worker.
        first_group: index of ``prompts[0]`` among the step's prompts (a data-parallel worker's
            shard starts past 0); with ``step`` it picks the sampling seeds.
        group: the data-parallel group (:class:`rlvr.training.replicas.OneProcess` by default).

    Returns:
        (trained, sampled, info): ``trained`` holds ``len(prompts)`` groups for this rank to
        train on; ``sampled`` the scores and lengths (:class:`Sampled`) of every group sampled
        this step by every rank, in the order one process samples them; ``info`` the metrics
        ``rollout/dropped_groups`` and ``rollout/extra_batches`` (dynamic sampling only) and this
        rank's phase times ``rollout_s`` / ``reward_s``.

    Under data parallelism each rank samples its shard of every batch (the step's, then each
    extra one), the decision to draw more counts the informative groups of all ranks, and the
    groups to train on are picked from everything sampled exactly as one process picks them,
    then dealt out in contiguous equal shares: N workers train on the groups one process would.
    The ranks exchange only the scores and lengths of what they sampled, except under dynamic
    sampling, where a rank may train on groups another rank sampled: there the batches travel.
    """
    group = OneProcess() if group is None else group
    G, P, algo = cfg.rollout.samples_per_prompt, len(prompts), cfg.algo
    P_all = P * group.world_size  # the step's prompts over all ranks
    timing = {"rollout": 0.0, "reward": 0.0}
    seeds = sequence_seeds(cfg.seed, step, 0, first_group, P, G)
    drain_code_stats()  # what an evaluation ran since the last step is not this step's
    parts = [_sample_and_score(engine, scorer, [train_rows[i] for i in prompts], cfg, prefix, timing, seeds)]
    info: dict = {}
    if algo.dynamic_sampling:

        def informative() -> int:  # over all ranks: every rank takes the same decision
            local = sum(int(algos.informative_groups(p.rewards, G).sum()) for p in parts)
            return int(group.sum(torch.tensor(float(local))))  # cpu: group.sum moves it to the collective's device

        while informative() < P_all and len(parts) <= algo.dynamic_sampling_max_batches:
            idx = extra_prompt_indices(len(train_rows), P_all, seed=cfg.seed, step=step, attempt=len(parts))
            seeds = sequence_seeds(cfg.seed, step, len(parts), first_group, P, G)
            rows = [train_rows[i] for i in idx[first_group : first_group + P]]
            parts.append(_sample_and_score(engine, scorer, rows, cfg, prefix, timing, seeds))
    info["rollout_s"], info["reward_s"] = timing["rollout"], timing["reward"]
    if timing.get("turns"):  # this rank's episodes (rollout.max_turns > 1)
        info[M.TURNS_MEAN] = sum(timing["turns"]) / len(timing["turns"])
    info.update({M.CODE + k: v for k, v in drain_code_stats().items()})  # code/programs, code/timeouts, ...
    if not algo.dynamic_sampling:  # this rank trains on its own groups; the others need only their scores
        return parts[0], Sampled.concat(group.gather(parts[0].summary())), info
    batches = len(parts)
    if group.world_size > 1:  # batch by batch, each rank's shard in rank order: one process's order
        shards = group.gather(parts)
        parts = [shards[r][a] for a in range(batches) for r in range(group.world_size)]
    everything = Scored.concat(parts, engine.tokenizer.pad_token_id)
    trained = _informative_share(everything, G, P, group, info)
    info[M.EXTRA_BATCHES] = batches - 1
    return trained, everything.summary(), info


def _informative_share(sampled: Scored, G: int, P: int, group, info: dict) -> Scored:
    """Dynamic sampling's pick: the step's groups with a reward spread first (zero-variance ones fill up
    when the cap is reached short of signal: they add no policy gradient), in sampling order, and this
    rank's equal contiguous share of them; counts the dropped groups in ``info``."""
    keep = algos.informative_groups(sampled.rewards, G).tolist()
    signal = [g for g, k in enumerate(keep) if k]
    flat = [g for g, k in enumerate(keep) if not k]
    groups = sorted((signal + flat)[: P * group.world_size])
    info[M.DROPPED_GROUPS] = sum(1 for g in flat if g not in groups)
    return sampled.select(groups[group.rank * P : (group.rank + 1) * P])


def rollout_metrics(sampled: Sampled, info: dict, *, overlong: bool) -> dict:
    """``rollout/*`` and ``reward/*`` metrics of everything sampled this step (tensors and floats).

    Args:
        sampled: every group sampled this step (:func:`collect`'s second value).
        info: :func:`collect`'s dynamic-sampling metrics (its phase times already taken out).
        overlong: the DAPO overlong penalty is on (``rollout/overlong_penalty_mean``).
    """
    G = sampled.group_size
    result = sampled.result
    total = torch.tensor(result.total, dtype=torch.float32, device=sampled.rewards.device)
    lengths = sampled.response_lengths.float()
    tools = {}
    if sampled.tool_calls is not None:
        stats = tool_stats(sampled.tool_calls, sampled.tool_errors, sampled.acc)
        tools = {M.ROLLOUT + k: v for k, v in stats.items()}  # M.TOOL_CALLS_MEAN, ...
    return {
        M.REWARD_MEAN: total.mean(),
        M.REWARD_STD: total.std(),
        M.ACCURACY: sum(sampled.acc) / len(sampled.acc),
        M.FORMAT_RATE: sum(sampled.fmt) / len(sampled.fmt),
        M.ZERO_STD_GROUPS: 1 - algos.informative_groups(sampled.rewards, G).float().mean(),
        M.RESPONSE_LEN_MEAN: lengths.mean(),
        M.RESPONSE_LEN_MAX: lengths.max(),
        M.TRUNCATED_FRAC: sampled.truncated.float().mean(),
        **info,
        **{M.reward_mean(name): sum(v) / len(v) for name, v in result.per_rule.items()},
        **{M.reward_errors(name): n for name, n in result.errors.items()},
        **({M.OVERLONG_PENALTY_MEAN: (sampled.rewards - total).mean()} if overlong else {}),
        **tools,
    }
