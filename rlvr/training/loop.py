"""The GRPO loop, top to bottom: prompts -> rollout -> rewards -> advantages -> log-probs -> updates.

Read it like nanoGPT's train.py. The math lives in :mod:`rlvr.algos`; this file only
orders the calls, moves tensors, times the phases and saves what the run produced.
"""

from __future__ import annotations

import contextlib
import math
import random
import shutil
import time
from pathlib import Path

import torch

from rlvr import algos
from rlvr.config import Config, Switch, to_yaml
from rlvr.data import PromptStream, prepare_rows
from rlvr.data.loading import load_split
from rlvr.errors import UserError
from rlvr.evaluation.during_training import TrainingEval
from rlvr.evaluation.during_training import describe as eval_line
from rlvr.models import eval_mode, load_model, load_tokenizer, resolve_device, resolve_model_path, response_logits
from rlvr.models.forward import shared_prompt_group
from rlvr.models.precision import needs_resolving, resolve_precision
from rlvr.reporting import JsonlWriter, MetricsLogger, peak_memory, truncate_jsonl
from rlvr.reporting.console import StepPrinter
from rlvr.rewards import Scorer, get as get_reward
from rlvr.rollout import HFRolloutEngine, RolloutBatch
from rlvr.training import checkpoint as ckpt
from rlvr.training.signals import GracefulStop
from rlvr.training.sampling import collect


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
    """[B, T] log-probs of the sampled tokens under ``model``, micro-batched, no grad (0 on padding).

    Each micro-batch runs only up to its own longest response: the columns after it are padding
    in every row, so cutting them changes no log-prob and saves their compute."""
    out = torch.zeros(batch.response_mask.shape, dtype=torch.float32, device=batch.response_mask.device)
    for start in range(0, batch.input_ids.shape[0], micro_batch_seqs):
        rows = slice(start, start + micro_batch_seqs)
        Tm = batch.longest(rows)
        with eval_mode(model), autocast():  # the sampled distribution: no dropout
            logits = response_logits(model, **batch.select(rows, Tm), num_response_tokens=Tm, group_size=group_size)
        out[rows, :Tm] = algos.token_logprobs(logits, batch.response_ids[rows, :Tm], temperature=temperature)
    return out * batch.response_mask


def _set_seed(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


RUN_OUTPUTS = ("metrics.jsonl", "samples.jsonl", "checkpoints", "eval", "tensorboard", "report", "wandb")
"""What a run writes into its directory (``overwrite=true`` removes these before starting again)."""


def prepare_run_dir(cfg: Config, model_path: Path | None = None) -> Path:
    """The run directory, checked before any model loads: refuses to write a new run over an
    existing one (unless ``overwrite=true``), and needs to be writable with room for two checkpoints."""
    run_dir = Path(cfg.resume or cfg.run_dir)
    if not cfg.resume and (run_dir / "metrics.jsonl").exists():
        if not cfg.overwrite:
            raise UserError(
                f"{run_dir} already holds a run; continue it with resume={run_dir}, start a new one with "
                f"run_dir=runs/NEW_NAME, or replace it with overwrite=true"
            )
        for name in RUN_OUTPUTS:
            target = run_dir / name
            shutil.rmtree(target) if target.is_dir() and not target.is_symlink() else target.unlink(missing_ok=True)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        tmp = run_dir / "config.yaml.tmp"
        tmp.write_text(to_yaml(cfg), encoding="utf-8")
    except OSError as e:
        raise UserError(f"run_dir={run_dir} is not writable ({e.strerror or e}); pick another run_dir=") from None
    if model_path is not None:
        need = 2 * ckpt.checkpoint_bytes(model_path, cfg.model.dtype)
        free = shutil.disk_usage(run_dir).free
        if free < need:
            tmp.unlink(missing_ok=True)
            raise UserError(
                f"run_dir={run_dir} has {free / 2**30:.1f} GiB free but two checkpoints of this model need about "
                f"{need / 2**30:.1f} GiB; free space there or pick another run_dir="
            )
    tmp.replace(run_dir / "config.yaml")
    return run_dir


def train(cfg: Config, *, console=None) -> Path:
    """Run GRPO as configured; returns the run directory."""
    # -- inputs are checked before anything is written ------------------------------------
    device = resolve_device(cfg.model.device)
    precision_notes = []
    if needs_resolving(cfg):  # `rlvr train` resolves (and prints) it before the config dump
        cfg, precision_notes = resolve_precision(cfg, device)
    train_split, test_rows = load_split(cfg.data, "train"), load_split(cfg.data, "test").rows  # file and row errors
    scorer = Scorer.from_config(cfg.reward)  # unknown rules fail now, not after the first rollout
    evaluator = TrainingEval(
        cfg.eval, cfg.data, test_rows, Path(cfg.resume or cfg.run_dir),
        rollout_max_new_tokens=cfg.rollout.max_new_tokens, total_steps=cfg.train.steps, scorer=scorer,
    )
    model_path = resolve_model_path(cfg.model.path)
    get_reward(cfg.reward.accuracy_rule)
    resume_from = ckpt.last_checkpoint(Path(cfg.resume)) if cfg.resume else None
    run_dir = prepare_run_dir(cfg, model_path)
    printer = StepPrinter(cfg.train.steps, enabled=cfg.log.progress, console=console)
    for name in ckpt.remove_stale(run_dir):  # left by a process killed mid-checkpoint
        printer.note(f"removed {run_dir / 'checkpoints' / name}, a checkpoint a killed run had not finished")
    for note in precision_notes:
        printer.note(note)
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
        if cfg.train.shared_prompt_forward:
            printer.note("model.gradient_checkpointing: the update runs each prompt per sequence (exact); old/ref log-probs still share it")
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
        logprobs=cfg.algo.tis_cap is not None,  # TIS weighs by trainer / engine probabilities
        stop=cfg.rollout.stop,
    )
    use_autocast = cfg.model.autocast_bf16 == Switch.ON

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
        if "ref" in state:  # a reference refreshed from the policy (algo.ref_sync_every)
            ref.load_state_dict(state["ref"])
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

    skipped_steps = state.get("skipped_steps", 0) if state is not None else 0  # steps with a skipped update
    bad_in_row = 0  # steps in a row whose every update was skipped
    last_save = {"step": start_step, "time": time.monotonic()}

    def save(step: int) -> Path:
        last_save.update(step=step, time=time.monotonic())
        trainer_state = {
            "step": step,
            "optimizer": optimizer.state_dict(),
            "scheduler": scheduler.state_dict(),
            "rng": ckpt.rng_state(),
            "skipped_steps": skipped_steps,
        }
        if cfg.algo.ref_sync_every:  # the reference is no longer the starting model: keep it
            trainer_state["ref"] = ref.state_dict()
        return ckpt.save_checkpoint(run_dir, step, policy, tokenizer, trainer_state, keep=cfg.train.keep_checkpoints)

    scorer.warm((cfg.reward.accuracy_rule,))  # reward workers started, warm and plugins imported before any time limit runs
    printer.start(start_step)
    step = start_step
    stopper = GracefulStop(printer.note)

    def stop_here(step: int) -> Path:
        saved = save(step) if last_save["step"] != step or step == 0 else ckpt.last_checkpoint(run_dir)
        printer.note(
            f"stopped by {stopper.requested} after step {step}; checkpoint {saved}; continue with: rlvr train resume={run_dir}"
        )
        return run_dir  # the finally below closes every sink

    try:
        stopper.install()
        if resume_from is None and evaluator.due(0):  # the before of before/after: RUN/eval/ and TensorBoard step 0
            before = evaluator.run(engine, tokenizer, 0)
            if metrics_log.tb is not None:  # not a metrics.jsonl row: its rows are training steps 1..N
                for k, v in before.items():
                    metrics_log.tb.add_scalar(k, v, 0)
            printer.note(eval_line(0, before))
        if stopper.requested:  # during the first evaluation: it finished, and step 0 is saved
            return stop_here(start_step)
        for step in range(start_step, cfg.train.steps):
            t_step = time.perf_counter()
            # 1-2. prompts -> rollout -> rewards on what the assistant said (DAPO dynamic sampling
            #      may draw extra prompts; the rollout/* metrics cover everything sampled)
            engine.sync_weights()
            got, sampled, sample_info = collect(engine, scorer, train_rows, stream, step, cfg, prefix=prefix)
            t_rollout, t_reward = sample_info.pop("rollout_s"), sample_info.pop("reward_s")
            batch, rows, rewards = got.batch, got.rows, got.rewards
            batch.input_ids, batch.attention_mask = batch.input_ids.to(device), batch.attention_mask.to(device)
            batch.response_mask = batch.response_mask.to(device)
            if batch.logprobs is not None:
                batch.logprobs = batch.logprobs.to(device)

            # 3. log-probs that stay fixed during the updates; KL in the reward; advantages
            t0 = time.perf_counter()
            lp_kwargs = dict(micro_batch_seqs=mb, group_size=share, temperature=temperature, autocast=autocast)
            ref_logp = batch_logprobs(ref, batch, **lp_kwargs) if ref is not None else None
            kl_in_reward = ref is not None and cfg.algo.kl_placement == algos.KLPlacement.REWARD
            need_old = cfg.algo.num_iterations > 1 or kl_in_reward
            old_logp = batch_logprobs(policy, batch, **lp_kwargs) if need_old else None
            kl_metrics = {}
            if kl_in_reward:
                mask = batch.response_mask
                kl_tok = algos.kl_divergence(old_logp, ref_logp, estimator=cfg.algo.kl_estimator)
                kl_metrics["train/kl"] = algos.masked_mean(kl_tok, mask)
                rewards = algos.kl_shaped_rewards(
                    rewards.to(device), old_logp, ref_logp, mask, coef=cfg.algo.kl_coef, estimator=cfg.algo.kl_estimator
                )
            adv = algos.group_advantages(rewards, G, method=cfg.algo.adv_method, eps=cfg.algo.adv_eps).to(device)
            t_ref = time.perf_counter() - t0

            # 4. updates: each iteration is one optimizer step over the whole batch
            t0 = time.perf_counter()
            loss_ref = None if kl_in_reward else ref_logp  # KL in the loss, or already in the reward
            update = _update(policy, optimizer, scheduler, batch, adv, old_logp, loss_ref, cfg, autocast)
            if update["train/skipped_updates"]:
                skipped_steps += 1
                printer.note(
                    f"step {step + 1}: non-finite loss or gradient (NaN/inf); {update['train/skipped_updates']} of "
                    f"{cfg.algo.num_iterations} updates skipped, weights unchanged by them"
                )
            bad_in_row = bad_in_row + 1 if update["train/skipped_updates"] == cfg.algo.num_iterations else 0
            update["train/skipped_steps"] = skipped_steps
            if cfg.algo.ref_sync_every and (step + 1) % cfg.algo.ref_sync_every == 0:
                ref.load_state_dict(policy.state_dict())  # MindRLHF sync_ref_model: the KL anchor moves
            t_update = time.perf_counter() - t0

            # 5. metrics (rollout/*: everything sampled this step), samples (the trained batch), checkpoint
            result, total = sampled.result, torch.tensor(sampled.result.total)
            lengths = sampled.batch.response_lengths.float()
            metrics = {
                "rollout/reward_mean": total.mean(),
                "rollout/reward_std": total.std(),
                "rollout/accuracy": sum(sampled.acc) / len(sampled.acc),
                "rollout/format_rate": sum(sampled.fmt) / len(sampled.fmt),
                "rollout/zero_std_groups": 1 - algos.informative_groups(sampled.rewards, G).float().mean(),
                "rollout/response_len_mean": lengths.mean(),
                "rollout/response_len_max": lengths.max(),
                "rollout/truncated_frac": sampled.batch.truncated.float().mean(),
                **sample_info,
                **{f"reward/{name}_mean": sum(v) / len(v) for name, v in result.per_rule.items()},
                **{f"reward/{name}_errors": n for name, n in result.errors.items()},
                **({"rollout/overlong_penalty_mean": (sampled.rewards - total).mean()} if cfg.algo.overlong_buffer else {}),
                "train/adv_mean": adv.mean(),
                "train/adv_std": adv.std(),
                **kl_metrics,
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
                            "answer": got.answers[i],
                            "completion": got.said[i],
                            "reward": got.result.total[i],
                            "rewards": {name: v[i] for name, v in got.result.per_rule.items()},
                            "advantage": adv[i],
                            "length": int(batch.response_lengths[i]),
                            "truncated": bool(batch.truncated[i]),
                        }
                    )
            printer.step(step + 1, logged)
            if bad_in_row >= cfg.train.max_bad_steps:
                saved = save(step + 1)  # the skipped updates left the last good weights in place
                raise UserError(
                    f"stopped at step {step + 1}: {bad_in_row} steps in a row had a non-finite loss or gradient "
                    f"(NaN/inf); the last good weights are saved in {saved}; check reward/*_errors and the rewards' "
                    f"range, or lower train.lr, then resume={run_dir}"
                )
            due = (cfg.train.save_every and (step + 1) % cfg.train.save_every == 0) or (
                cfg.train.save_every_min and time.monotonic() - last_save["time"] >= 60 * cfg.train.save_every_min
            )
            if due and step + 1 < cfg.train.steps:
                save(step + 1)
            if stopper.requested and step + 1 < cfg.train.steps:
                return stop_here(step + 1)
        final = save(cfg.train.steps)
        printer.done(run_dir, final, report=cfg.log.report)  # summary; writes RUN/report/ unless log.report=false
    except KeyboardInterrupt:
        saved = ckpt.list_checkpoints(run_dir)
        where = f"last checkpoint {saved[-1]}" if saved else "no checkpoint saved yet"
        printer.note(f"interrupted at step {step + 1}; {where}; metrics are in {run_dir / 'metrics.jsonl'}")
        raise
    finally:
        stopper.restore()
        metrics_log.close()
        samples_log.close()
        printer.stop()
    return run_dir


def accumulate_gradients(policy, batch: RolloutBatch, adv, old_logp, ref_logp, cfg: Config, autocast) -> dict:
    """Backward the loss of the whole rollout batch, ``train.micro_batch_seqs`` rows at a time.

    Every micro-batch's loss uses the token and sequence counts of the whole batch (and the
    constant ``rollout.max_new_tokens`` for Dr. GRPO) as its denominator, so the accumulated
    gradient equals the full-batch gradient for any split. ``ref_logp`` adds the KL term to the
    loss (pass None when the KL sits in the reward); ``batch.logprobs`` with ``algo.tis_cap``
    weighs each token by the truncated trainer/engine probability ratio.

    Returns:
        Detached scalar tensors: sums over the batch (loss, pg_loss, kl, entropy, clip fractions,
        ratio_mean, tis_weight_mean, ...) and extremes (``*_min`` / ``*_max``).
    """
    algo = cfg.algo
    mask = batch.response_mask.float()  # [B, T]
    B = mask.shape[0]
    num_tokens, mb = mask.sum(), cfg.train.micro_batch_seqs
    agg = dict(mode=algo.loss_agg, num_tokens=num_tokens, num_seqs=B, max_len=cfg.rollout.max_new_tokens)
    temperature = cfg.rollout.temperature
    share = shared_prompt_group(mb, batch.group_size) if cfg.train.shared_prompt_forward else 1
    tis = algo.tis_cap is not None and batch.logprobs is not None
    zero = torch.zeros((), device=mask.device)
    sums: dict[str, torch.Tensor] = {}
    extremes: dict[str, torch.Tensor] = {}

    def add(name: str, tok: torch.Tensor, m: torch.Tensor) -> None:  # token mean over the whole batch
        sums[name] = sums.get(name, zero) + (tok.detach().float() * m).sum() / num_tokens

    def extreme(name: str, tok: torch.Tensor, m: torch.Tensor) -> None:
        on = m.bool()
        lo = torch.where(on, tok, torch.full_like(tok, float("inf"))).min()
        hi = torch.where(on, tok, torch.full_like(tok, float("-inf"))).max()
        extremes[f"{name}_min"] = torch.minimum(extremes.get(f"{name}_min", lo), lo)
        extremes[f"{name}_max"] = torch.maximum(extremes.get(f"{name}_max", hi), hi)

    for start in range(0, B, mb):
        rows = slice(start, start + mb)
        Tm = batch.longest(rows)  # the columns after it are padding in every row: cut them (exact)
        cols = slice(0, Tm)
        m = mask[rows, cols]
        with autocast():
            logits = response_logits(policy, **batch.select(rows, Tm), num_response_tokens=Tm, group_size=share)
        logp = algos.token_logprobs(logits, batch.response_ids[rows, cols], temperature=temperature)
        old = old_logp[rows, cols] if old_logp is not None else logp.detach()
        pg_tok, stats = algos.policy_loss(
            logp, old, adv[rows], m, clip_low=algo.clip_low, clip_high=algo.clip_high,
            dual_clip=algo.dual_clip, level=algo.ratio_level,
        )
        if tis:
            weight = algos.truncated_importance_weights(old, batch.logprobs[rows, cols], cap=algo.tis_cap)
            pg_tok = pg_tok * weight
            add("tis_weight_mean", weight, m)
            add("tis_capped_frac", weight >= algo.tis_cap, m)
            extreme("tis_weight", weight, m)
        loss_tok = pg_tok
        if ref_logp is not None:
            kl_tok = algos.kl_divergence(logp, ref_logp[rows, cols], estimator=algo.kl_estimator)
            loss_tok = loss_tok + algo.kl_coef * kl_tok
            add("kl", kl_tok, m)
        if algo.entropy_coef:
            entropy = algos.entropy_from_logits(logits, temperature=temperature)
            loss_tok = loss_tok - algo.entropy_coef * entropy
        else:
            with torch.no_grad():
                entropy = algos.entropy_from_logits(logits.detach(), temperature=temperature)
        loss = algos.aggregate(loss_tok, m, **agg)
        loss.backward()
        with torch.no_grad():
            sums["loss"] = sums.get("loss", zero) + loss.detach()
            sums["pg_loss"] = sums.get("pg_loss", zero) + algos.aggregate(pg_tok.detach(), m, **agg)
            add("entropy", entropy, m)
            add("clip_frac", stats["clipped_low"] | stats["clipped_high"], m)
            add("clip_frac_low", stats["clipped_low"], m)
            add("clip_frac_high", stats["clipped_high"], m)
            if algo.dual_clip is not None:
                add("dual_clip_frac", stats["dual_clipped"], m)
            add("ratio_mean", stats["ratio"], m)
            extreme("ratio", stats["ratio"], m)
    return {**sums, **extremes}


def _update(policy, optimizer, scheduler, batch: RolloutBatch, adv, old_logp, ref_logp, cfg: Config, autocast) -> dict:
    """``algo.num_iterations`` optimizer steps over the rollout batch; returns metrics over them
    (means, and the min/max of the ``*_min`` / ``*_max`` ones).

    An iteration whose loss or gradient norm is not finite takes no optimizer or schedule step
    (its gradients are dropped); ``train/skipped_updates`` counts them."""
    lr = scheduler.get_last_lr()[0]  # the lr this step trains with
    max_norm = cfg.train.max_grad_norm if cfg.train.max_grad_norm > 0 else float("inf")
    totals: dict[str, torch.Tensor] = {}
    grad_norms = []
    skipped = 0
    for _ in range(cfg.algo.num_iterations):
        policy.train()  # dropout as the model defines it; eval mode again before anything samples
        try:
            sums = accumulate_gradients(policy, batch, adv, old_logp, ref_logp, cfg, autocast)
        finally:
            policy.eval()
        for k, v in sums.items():
            combine = torch.minimum if k.endswith("_min") else torch.maximum if k.endswith("_max") else torch.add
            totals[k] = combine(totals[k], v) if k in totals else v
        grad_norms.append(torch.nn.utils.clip_grad_norm_(policy.parameters(), max_norm))
        if torch.isfinite(grad_norms[-1]) and torch.isfinite(sums["loss"]):
            optimizer.step()
            scheduler.step()
        else:  # a NaN/inf loss or gradient: skip this update, weights and AdamW state stay intact
            skipped += 1
        optimizer.zero_grad(set_to_none=True)
    n = cfg.algo.num_iterations
    out = {f"train/{k}": v if k.endswith(("_min", "_max")) else v / n for k, v in totals.items()}
    out["train/grad_norm"] = torch.stack(grad_norms).mean()
    out["train/lr"] = lr
    out["train/skipped_updates"] = skipped
    return out
