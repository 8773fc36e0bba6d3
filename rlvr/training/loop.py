"""The GRPO loop, top to bottom: prompts -> rollout -> rewards -> advantages -> log-probs -> updates.

Read it like nanoGPT's train.py. The math lives in :mod:`rlvr.algos`; this file only
orders the calls, moves tensors, times the phases and saves what the run produced.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from pathlib import Path

import torch

from rlvr import algos
from rlvr.config import Config, to_yaml
from rlvr.data import PromptStream, prepare_rows
from rlvr.data.loading import load_split
from rlvr.errors import UserError
from rlvr.evaluation.during_training import TrainingEval
from rlvr.evaluation.during_training import describe as eval_line
from rlvr.models import load_model, load_tokenizer, resolve_device, resolve_model_path, response_logits
from rlvr.models.forward import shared_prompt_group
from rlvr.reporting import JsonlWriter, MetricsLogger, peak_memory, truncate_jsonl
from rlvr.reporting.console import StepPrinter
from rlvr.rewards import Scorer, get as get_reward
from rlvr.rollout import HFRolloutEngine, RolloutBatch
from rlvr.training import checkpoint as ckpt


def lr_lambda(*, warmup_steps: int, total_steps: int, schedule: str, min_lr_ratio: float):
    """Multiplier of the peak lr at optimizer step ``s``: linear warmup, then constant or cosine."""

    def f(s: int) -> float:
        if s < warmup_steps:
            return (s + 1) / warmup_steps
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (s - warmup_steps) / max(1, total_steps - warmup_steps))
        return min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


@torch.no_grad()
def batch_logprobs(model, batch: RolloutBatch, *, micro_batch_seqs: int, group_size: int, temperature: float, autocast) -> torch.Tensor:
    """[B, T] log-probs of the sampled tokens under ``model``, micro-batched, no grad."""
    T = batch.response_mask.shape[1]
    out = []
    for start in range(0, batch.input_ids.shape[0], micro_batch_seqs):
        rows = slice(start, start + micro_batch_seqs)
        with autocast():
            logits = response_logits(model, **batch.select(rows), num_response_tokens=T, group_size=group_size)
        out.append(algos.token_logprobs(logits, batch.response_ids[rows], temperature=temperature))
    return torch.cat(out)


def _set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def prepare_run_dir(cfg: Config) -> Path:
    """The run directory; refuses to write a new run over an existing one."""
    run_dir = Path(cfg.resume or cfg.run_dir)
    if not cfg.resume and (run_dir / "metrics.jsonl").exists():
        raise UserError(
            f"{run_dir} already holds a run; continue it with resume={run_dir} "
            f"or start a new one with run_dir=runs/NEW_NAME"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(to_yaml(cfg), encoding="utf-8")
    tmp.replace(run_dir / "config.yaml")
    return run_dir


def train(cfg: Config, *, console=None) -> Path:
    """Run GRPO as configured; returns the run directory."""
    # -- inputs are checked before anything is written ------------------------------------
    device = resolve_device(cfg.model.device)
    train_split, test_rows = load_split(cfg.data, "train"), load_split(cfg.data, "test").rows  # file and row errors
    evaluator = TrainingEval(
        cfg.eval, cfg.data, test_rows, Path(cfg.resume or cfg.run_dir),
        rollout_max_new_tokens=cfg.rollout.max_new_tokens, total_steps=cfg.train.steps,
    )
    model_path = resolve_model_path(cfg.model.path)
    scorer = Scorer.from_config(cfg.reward)  # unknown rules fail now, not after the first rollout
    get_reward(cfg.reward.accuracy_rule)
    resume_from = ckpt.last_checkpoint(Path(cfg.resume)) if cfg.resume else None
    run_dir = prepare_run_dir(cfg)
    printer = StepPrinter(cfg.train.steps, enabled=cfg.log.progress, console=console)
    _set_seed(cfg.seed)

    # -- model, reference, rollout engine --------------------------------------------------
    tokenizer = load_tokenizer(model_path)
    prepared = prepare_rows(train_split, cfg.data, tokenizer)  # rendered prompts + token counts, cached
    train_rows, prefix = prepared.rows, prepared.template.assistant_prefix
    for note in prepared.notes:
        printer.note(note)
    start_step, state = 0, None
    if resume_from is not None:
        state = ckpt.load_trainer_state(resume_from)
        start_step = state["step"]
        policy = load_model(resume_from, dtype=cfg.model.dtype, device=cfg.model.device)
        printer.note(f"resuming {run_dir} from {resume_from.name} (step {start_step})")
    else:
        policy = load_model(model_path, dtype=cfg.model.dtype, device=cfg.model.device)
    if cfg.model.gradient_checkpointing:
        policy.gradient_checkpointing_enable()
    ref = None
    if cfg.algo.kl_coef > 0:  # kl_coef == 0: no reference model is loaded at all
        ref = load_model(model_path, dtype=cfg.model.dtype, device=cfg.model.device).eval().requires_grad_(False)
    engine = HFRolloutEngine(
        policy,
        tokenizer,
        max_new_tokens=cfg.rollout.max_new_tokens,
        temperature=cfg.rollout.temperature,
        top_p=cfg.rollout.top_p,
        top_k=cfg.rollout.top_k,
        dtype=cfg.rollout.dtype,
        batch_seqs=cfg.rollout.batch_seqs,
    )
    use_autocast = cfg.model.autocast_bf16

    def autocast():
        if not use_autocast:
            return contextlib.nullcontext()
        return torch.autocast(device_type=device.type, dtype=torch.bfloat16)

    # -- optimizer, schedule, resume ------------------------------------------------------
    optimizer = torch.optim.AdamW(
        policy.parameters(), lr=cfg.train.lr, betas=tuple(cfg.train.adam_betas), weight_decay=cfg.train.weight_decay
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer,
        lr_lambda(
            warmup_steps=cfg.train.warmup_steps,
            total_steps=cfg.train.steps * cfg.algo.num_iterations,
            schedule=cfg.train.lr_schedule,
            min_lr_ratio=cfg.train.min_lr_ratio,
        ),
    )
    if state is not None:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        ckpt.set_rng_state(state["rng"])
        truncate_jsonl(run_dir / "metrics.jsonl", start_step)
        truncate_jsonl(run_dir / "samples.jsonl", start_step)
    if start_step >= cfg.train.steps:
        printer.note(f"{run_dir} already finished {start_step} steps (train.steps={cfg.train.steps}); nothing to do")
        return run_dir

    stream = PromptStream(len(train_rows), cfg.train.prompts_per_step, cfg.seed)
    metrics_log = MetricsLogger.from_config(run_dir, cfg.log)  # jsonl + TensorBoard/W&B, each failure-isolated
    samples_log = JsonlWriter(run_dir / "samples.jsonl")
    G, mb = cfg.rollout.samples_per_prompt, cfg.train.micro_batch_seqs
    temperature = cfg.rollout.temperature
    share = shared_prompt_group(mb, G) if cfg.train.shared_prompt_forward else 1

    def save(step: int) -> Path:
        trainer_state = {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": ckpt.rng_state(),
        }
        return ckpt.save_checkpoint(run_dir, step, policy, tokenizer, trainer_state, keep=cfg.train.keep_checkpoints)

    printer.start(start_step)
    step = start_step
    if start_step == 0 and evaluator.due(0):  # the before of before/after: RUN/eval/ and TensorBoard step 0
        before = evaluator.run(engine, tokenizer, 0)
        if metrics_log.tb is not None:  # not a metrics.jsonl row: its rows are training steps 1..N
            for k, v in before.items():
                metrics_log.tb.add_scalar(k, v, 0)
        printer.note(eval_line(0, before))
    try:
        for step in range(start_step, cfg.train.steps):
            t_step = time.perf_counter()
            # 1. prompts and rollout
            rows = [train_rows[i] for i in stream.batch(step)]
            prompts = [r["prompt"] for r in rows]
            t0 = time.perf_counter()
            engine.sync_weights()
            batch = engine.generate(prompts, G)
            batch.input_ids, batch.attention_mask = batch.input_ids.to(device), batch.attention_mask.to(device)
            batch.response_mask = batch.response_mask.to(device)
            t_rollout = time.perf_counter() - t0

            # 2. rewards on what the assistant said (the prefix is part of its turn) and advantages
            t0 = time.perf_counter()
            said = [prefix + text for text in batch.texts]
            answers = [r["answer"] for r in rows for _ in range(G)]
            fields = {k: [r.get(k) for r in rows for _ in range(G)] for k in rows[0] if k != "answer"}
            result = scorer.score(said, answers, fields, truncated=batch.truncated.tolist())
            acc = result.per_rule.get(cfg.reward.accuracy_rule) or scorer.rule_scores(cfg.reward.accuracy_rule, said, answers, fields)[0]
            fmt = result.per_rule.get("format") or scorer.rule_scores("format", said, answers, fields)[0]
            rewards = torch.tensor(result.total, dtype=torch.float32)
            adv = algos.group_advantages(rewards, G, scale_by_std=cfg.algo.adv_scale_by_std, eps=cfg.algo.adv_eps)
            adv = adv.to(device)
            t_reward = time.perf_counter() - t0

            # 3. log-probs that stay fixed during the updates
            t0 = time.perf_counter()
            lp_kwargs = dict(micro_batch_seqs=mb, group_size=share, temperature=temperature, autocast=autocast)
            ref_logp = batch_logprobs(ref, batch, **lp_kwargs) if ref is not None else None
            old_logp = batch_logprobs(policy, batch, **lp_kwargs) if cfg.algo.num_iterations > 1 else None
            t_ref = time.perf_counter() - t0

            # 4. updates: each iteration is one optimizer step over the whole batch
            t0 = time.perf_counter()
            update = _update(policy, optimizer, scheduler, batch, adv, old_logp, ref_logp, cfg, autocast)
            t_update = time.perf_counter() - t0

            # 5. metrics, samples, checkpoint
            lengths = batch.response_lengths.float()
            group_std = rewards.view(-1, G).std(-1)
            metrics = {
                "rollout/reward_mean": rewards.mean(),
                "rollout/reward_std": rewards.std(),
                "rollout/accuracy": sum(acc) / len(acc),
                "rollout/format_rate": sum(fmt) / len(fmt),
                "rollout/zero_std_groups": (group_std == 0).float().mean(),
                "rollout/response_len_mean": lengths.mean(),
                "rollout/response_len_max": lengths.max(),
                "rollout/truncated_frac": batch.truncated.float().mean(),
                **{f"reward/{name}_mean": sum(v) / len(v) for name, v in result.per_rule.items()},
                **{f"reward/{name}_errors": n for name, n in result.errors.items()},
                **update,
                "time/rollout_s": t_rollout,
                "time/reward_s": t_reward,
                "time/reference_s": t_ref,
                "time/update_s": t_update,
                "time/step_s": time.perf_counter() - t_step,
                "perf/gen_tokens_per_s": lengths.sum() / max(t_rollout, 1e-9),
                **peak_memory(device),
            }
            if evaluator.due(step + 1):  # after the update: evaluates the weights saved as step_{step+1}
                metrics.update(evaluator.run(engine, tokenizer, step + 1))
                printer.note(eval_line(step + 1, metrics))
            logged = metrics_log.log(step + 1, metrics)
            if cfg.log.samples_every and (step + 1) % cfg.log.samples_every == 0:
                for i, text in enumerate(batch.texts):
                    samples_log.write(
                        {
                            "step": step + 1,
                            "question": rows[i // G]["question"],
                            "answer": answers[i],
                            "completion": said[i],
                            "reward": result.total[i],
                            "rewards": {name: v[i] for name, v in result.per_rule.items()},
                            "advantage": adv[i],
                            "length": int(lengths[i]),
                            "truncated": bool(batch.truncated[i]),
                        }
                    )
            printer.step(step + 1, logged)
            if cfg.train.save_every and (step + 1) % cfg.train.save_every == 0 and step + 1 < cfg.train.steps:
                save(step + 1)
        final = save(cfg.train.steps)
        printer.done(run_dir, final, report=cfg.log.report)  # summary; writes RUN/report/ unless log.report=false
    except KeyboardInterrupt:
        saved = ckpt.list_checkpoints(run_dir)
        where = f"last checkpoint {saved[-1]}" if saved else "no checkpoint saved yet"
        printer.note(f"interrupted at step {step + 1}; {where}; metrics are in {run_dir / 'metrics.jsonl'}")
        raise
    finally:
        metrics_log.close()
        samples_log.close()
        printer.stop()
    return run_dir


def accumulate_gradients(policy, batch: RolloutBatch, adv, old_logp, ref_logp, cfg: Config, autocast) -> dict:
    """Backward the loss of the whole rollout batch, ``train.micro_batch_seqs`` rows at a time.

    Every micro-batch's loss uses the token and sequence counts of the whole batch as its
    denominator, so the accumulated gradient equals the full-batch gradient for any split.

    Returns:
        Detached scalar tensors: the batch's loss, pg_loss, kl, clip_frac, entropy, ratio_mean.
    """
    mask = batch.response_mask.float()  # [B, T]
    B, T = mask.shape
    num_tokens, mb = mask.sum(), cfg.train.micro_batch_seqs
    agg = dict(mode=cfg.algo.loss_agg, num_tokens=num_tokens, num_seqs=B, max_tokens=T)
    temperature = cfg.rollout.temperature
    share = shared_prompt_group(mb, batch.group_size) if cfg.train.shared_prompt_forward else 1
    sums = {k: torch.zeros((), device=mask.device) for k in ("loss", "pg_loss", "kl", "clip_frac", "entropy", "ratio_mean")}
    for start in range(0, B, mb):
        rows = slice(start, start + mb)
        m = mask[rows]
        with autocast():
            logits = response_logits(policy, **batch.select(rows), num_response_tokens=T, group_size=share)
        logp = algos.token_logprobs(logits, batch.response_ids[rows], temperature=temperature)
        old = old_logp[rows] if old_logp is not None else logp.detach()
        pg_tok, clipped = algos.clipped_surrogate(
            logp, old, adv[rows], clip_low=cfg.algo.clip_low, clip_high=cfg.algo.clip_high
        )
        loss_tok = pg_tok
        if ref_logp is not None:
            kl_tok = algos.kl_penalty(logp, ref_logp[rows], cfg.algo.kl_estimator)
            loss_tok = loss_tok + cfg.algo.kl_coef * kl_tok
            sums["kl"] += (kl_tok.detach() * m).sum() / num_tokens
        if cfg.algo.entropy_coef:
            entropy = algos.token_entropy(logits, temperature=temperature)
            loss_tok = loss_tok - cfg.algo.entropy_coef * entropy
        else:
            with torch.no_grad():
                entropy = algos.token_entropy(logits.detach(), temperature=temperature)
        loss = algos.aggregate(loss_tok, m, **agg)
        loss.backward()
        with torch.no_grad():
            sums["loss"] += loss.detach()
            sums["pg_loss"] += algos.aggregate(pg_tok.detach(), m, **agg)
            sums["clip_frac"] += (clipped.float() * m).sum() / num_tokens
            sums["entropy"] += (entropy.detach() * m).sum() / num_tokens
            sums["ratio_mean"] += (torch.exp(logp.detach() - old) * m).sum() / num_tokens
    if ref_logp is None:
        del sums["kl"]
    return sums


def _update(policy, optimizer, scheduler, batch: RolloutBatch, adv, old_logp, ref_logp, cfg: Config, autocast) -> dict:
    """``algo.num_iterations`` optimizer steps over the rollout batch; returns averaged metrics."""
    lr = scheduler.get_last_lr()[0]  # the lr this step trains with
    max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else float("inf")
    totals: dict[str, torch.Tensor] = {}
    grad_norms = []
    policy.train()
    for _ in range(cfg.algo.num_iterations):
        sums = accumulate_gradients(policy, batch, adv, old_logp, ref_logp, cfg, autocast)
        for k, v in sums.items():
            totals[k] = totals.get(k, 0) + v
        grad_norms.append(torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm))
        if not torch.isfinite(grad_norms[-1]):  # checked before the step, so the weights stay intact
            raise FloatingPointError(f"non-finite gradient norm {grad_norms[-1]}; lower train.lr or check the rewards")
        optimizer.step()
        scheduler.step()
        optimizer.zero_grad(set_to_none=True)
    n = cfg.algo.num_iterations
    out = {f"train/{k}": v / n for k, v in totals.items()}
    out["train/grad_norm"] = torch.stack(grad_norms).mean()
    out["train/lr"] = lr
    return out
