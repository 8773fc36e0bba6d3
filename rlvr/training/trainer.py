"""The GRPO trainer: ``setup()``, then ``step()`` per step, ``save()`` and ``finish()``; :func:`train` loops over them.

One step reads top to bottom like nanoGPT's train.py: prompts -> rollout -> rewards ->
advantages -> fixed log-probs -> updates -> metrics. :meth:`Trainer.step` is the compute that a
data-parallel worker runs on its shard of prompts; :meth:`Trainer.record` is the bookkeeping of
the process that logs (evaluation, metrics, samples, checkpoints). The math lives in
:mod:`rlvr.algos`, one update in :mod:`rlvr.training.loop`, and what ``setup()`` does before the
first step (checks, models, optimizer, resume) in :mod:`rlvr.training.setup`.
"""

from __future__ import annotations

import contextlib
import functools
import time
from pathlib import Path

import torch

from rlvr import algos
from rlvr import metric_names as M
from rlvr.analysis.report import build_report
from rlvr.choices import Backend
from rlvr.config import Config, Switch
from rlvr.errors import UserError
from rlvr.estimate import measured_beside_estimate
from rlvr.evaluation.during_training import describe as eval_line
from rlvr.models.forward import shared_prompt_group
from rlvr.rollout import RolloutBatch
from rlvr.tracking import peak_memory, train_state_bytes
from rlvr.training import checkpoint as ckpt
from rlvr.training.inflight import to_plain
from rlvr.training.loop import batch_logprobs, update_policy
from rlvr.training.sampling import Scored, collect, rollout_metrics
from rlvr.training.setup import TrainerSetup
from rlvr.training.signals import GracefulStop


def train(cfg: Config, *, console=None, notes: tuple[str, ...] = ()) -> Path:
    """Run GRPO in this process as configured; returns the run directory (:func:`run`). ``notes``: lines
    printed after the run's summary (e.g. why ``rlvr train`` chose its run directory).

    ``distributed.backend=ray`` runs on Ray workers instead: ``rlvr.distributed.train``, or
    ``rlvr.commands.train.run_training``, which picks between the two as ``rlvr train`` does."""
    if cfg.distributed.backend == Backend.RAY:
        raise UserError(
            "distributed.backend=ray trains on Ray workers: call rlvr.distributed.train(cfg) or "
            "rlvr.commands.train.run_training(cfg) (what `rlvr train` does), not rlvr.training.train"
        )
    trainer = Trainer(cfg, console=console)
    trainer.notes = tuple(notes)
    return run(trainer)


def run(trainer) -> Path:
    """The training loop over any trainer with :class:`Trainer`'s methods (this process's, or
    :class:`rlvr.distributed.RayTrainer`, whose steps run on data-parallel Ray workers, each a
    :class:`Trainer` of its rank); returns the run directory.

    SIGINT/SIGTERM finish the step, save a checkpoint and return; a second one stops at once
    (``KeyboardInterrupt``), with what the last checkpoint holds noted."""
    if not trainer.setup():
        return trainer.run_dir
    steps, step = trainer.cfg.train.steps, trainer.start_step
    stopper = GracefulStop(trainer.printer.note)
    try:
        stopper.install()
        trainer.evaluate_start()
        if stopper.requested:  # during the first evaluation: it finished, and step 0 is saved
            return trainer.stop(step, stopper.requested)
        for step in range(trainer.start_step, steps):
            trainer.record(step + 1, trainer.step(step))
            if stopper.requested and step + 1 < steps:
                return trainer.stop(step + 1, stopper.requested)
        trainer.finish()
    except KeyboardInterrupt:
        trainer.interrupted(step)
        raise
    finally:
        stopper.restore()
        trainer.close()
    return trainer.run_dir


class Trainer(TrainerSetup):
    """One GRPO run: :meth:`setup`; :meth:`step` then :meth:`record` per step; :meth:`finish`; :meth:`close`.

    :meth:`step` is what a data-parallel worker runs on its shard: its prompts (``prompts=``)
    and the loss denominators (:meth:`loss_denominators`) are inputs, not buried in it.
    :meth:`evaluate_start`, :meth:`record`, :meth:`save`, :meth:`stop` and :meth:`finish` are the
    logging process's: evaluation, metrics and samples, console, checkpoints.

    Under Ray each data-parallel worker holds one, with its rank's ``group``: every rank loads the
    models and runs :meth:`step` on its shard; only rank 0 writes the run directory and runs the
    logging process's methods.

    ``Trainer(cfg, console=None, *, group=None)`` and :meth:`setup` are
    :class:`~rlvr.training.setup.TrainerSetup`'s (:mod:`rlvr.training.setup`); this module is the rest.
    """

    # -- one step --------------------------------------------------------------------------

    def autocast(self):
        """The update's and log-probs' autocast context (bf16 with ``model.autocast_bf16``).

        Sharded (FSDP/HSDP), autocast's cache of bf16 weight copies is off: the weights it would cache
        are the gathered whole ones, so the cache would keep a bf16 copy of the whole model alive
        through each micro-batch (14 GiB at 7B) after FSDP has resharded every layer; without it each
        use casts again (under checkpointing, one layer's weights at a time)."""
        if self.cfg.model.autocast_bf16 != Switch.ON:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, cache_enabled=not self.shards)

    def step(
        self, step: int, prompts: list[int] | None = None, *, first_group: int = 0, collected: tuple | None = None
    ) -> dict:
        """One GRPO step: rollout and rewards, fixed log-probs, advantages, ``algo.num_iterations`` updates.

        Args:
            step: 0-based step; with ``seed`` it picks the step's prompts (and dynamic-sampling extras).
            prompts: row indices of the prompts to sample, G samples each; default the step's batch
                of the prompt stream. A data-parallel worker passes its shard (whole groups).
            first_group: index of ``prompts[0]`` in the step's batch (a worker's shard offset); with
                ``seed`` and ``step`` it seeds each sequence's sampling.
            collected: (this rank's scored groups, the step's :class:`Sampled`, info) that a rollout
                worker made (:mod:`rlvr.distributed.rollout_worker`): trained on instead of sampling.

        Returns:
            The step's metrics (:mod:`rlvr.metric_names`), tensors and floats; the sinks make floats.
            On a data-parallel worker they cover the whole global batch (every rank gets them).
        """
        cfg, t_step = self.cfg, time.perf_counter()
        # 1-2. prompts -> rollout -> rewards on what the assistant said (DAPO dynamic sampling
        #      may draw extra prompts; the rollout/* metrics cover everything sampled)
        got, sampled, info = collected or self._sample(step, prompts, first_group)
        t_rollout, t_reward = info.pop("rollout_s"), info.pop("reward_s")
        batch = self._to_device(got.batch)

        # 3. log-probs that stay fixed during the updates; KL in the reward; advantages
        packed = self.packed.active if self.packed is not None else contextlib.nullcontext
        t0 = time.perf_counter()
        with packed():
            rewards, old_logp, loss_ref, kl_metrics = self._fixed_logprobs(batch, got.rewards)
        all_adv, adv = self._advantages(rewards)
        t_ref = time.perf_counter() - t0

        # 4. updates: each iteration is one optimizer step over the whole batch
        t0 = time.perf_counter()
        with packed():  # each optimizer step inside marks the copies stale; the next forward repacks them
            update = self._update(step, batch, adv, old_logp, loss_ref)
        if self.shards:  # the engine's whole copy, from the updated shards (every rank together)
            self.engine.gather_weights()
        t_update = time.perf_counter() - t0

        # 5. metrics (rollout/*: everything sampled this step, by every rank); samples (the trained batch)
        group = self.group
        self.samples = [row for rows in group.gather(self._sample_rows(step + 1, got, adv)) for row in rows]
        return {
            **rollout_metrics(sampled, info, overlong=bool(cfg.algo.overlong_buffer)),
            M.ADV_MEAN: all_adv.mean(),
            M.ADV_STD: all_adv.std(),
            **kl_metrics,
            **update,
            M.TIME_ROLLOUT_S: t_rollout,
            M.TIME_REWARD_S: t_reward,
            M.TIME_REFERENCE_S: t_ref,
            M.TIME_UPDATE_S: t_update,
            M.TIME_STEP_S: time.perf_counter() - t_step,
            M.GEN_TOKENS_PER_S: sampled.response_lengths.float().sum() / max(t_rollout, 1e-9),
            M.TRAIN_STATE_MIB: train_state_bytes(self.policy, self.optimizer) / 2**20,
            **peak_memory(self.device),
        }

    def pushed_weights(self) -> dict:
        """What a rollout worker loads after each update: the rollout engine's copy of every weight that
        trains (with LoRA the adapter's alone), in the rollout dtype, refreshed from the policy first
        (under FSDP the step gathered it already)."""
        self.engine.sync_weights()
        trainable = {n for n, p in self.policy.named_parameters() if p.requires_grad}
        return self.engine.pushed(trainable)

    def _sample(self, step: int, prompts: list[int] | None, first_group: int):
        """:func:`collect` of the step's groups (default its batch of the stream) from the policy's current weights."""
        prompts = self.stream.batch(step) if prompts is None else prompts
        self.engine.sync_weights()
        kw = dict(prefix=self.prefix, first_group=first_group, group=self.group)
        return collect(self.engine, self.scorer, self.train_rows, prompts, step, self.cfg, **kw)

    def _advantages(self, rewards):
        """(advantages of the global batch, of this rank's sequences), both [B] on the device.

        Computed over every rank's rewards, so a whole-batch statistic (``reinforce_pp``'s std)
        is the step's, as in one process; each rank holds an equal, contiguous share of the groups."""
        cfg, group = self.cfg, self.group
        B = rewards.shape[0]
        every = torch.cat(group.gather(rewards.cpu())) if group.world_size > 1 else rewards
        adv = algos.group_advantages(
            every, cfg.rollout.samples_per_prompt, method=cfg.algo.adv_method, eps=cfg.algo.adv_eps
        )
        adv = adv.to(self.device)
        return adv, adv[group.rank * B : (group.rank + 1) * B]

    def _to_device(self, batch: RolloutBatch) -> RolloutBatch:
        batch.input_ids, batch.attention_mask = batch.input_ids.to(self.device), batch.attention_mask.to(self.device)
        batch.response_mask = batch.response_mask.to(self.device)
        if batch.logprobs is not None:
            batch.logprobs = batch.logprobs.to(self.device)
        if batch.entropy is not None:
            batch.entropy = batch.entropy.to(self.device)
        return batch

    def _fixed_logprobs(self, batch: RolloutBatch, rewards):
        """(rewards, old_logp, ref_logp for the loss, KL metrics): the reference's and the sampling
        policy's [B, T] log-probs (each None when nothing needs it); with ``algo.kl_placement=reward``
        the KL is subtracted from the rewards and the loss gets no reference."""
        cfg, mb = self.cfg, min(self.cfg.train.micro_batch_seqs, batch.input_ids.shape[0])
        share = shared_prompt_group(mb, cfg.rollout.samples_per_prompt) if cfg.train.shared_prompt_forward else 1
        lp = dict(
            micro_batch_seqs=mb,
            group_size=share,
            temperature=cfg.rollout.temperature,
            autocast=self.autocast,
            length_buckets=cfg.train.length_buckets,
            micro_batch_tokens=cfg.train.logprob_tokens,
            remove_padding=cfg.train.remove_padding,
        )
        ref_logp = None
        if cfg.algo.kl_coef > 0:
            with self.reference() as ref:
                ref_logp = batch_logprobs(ref, batch, **lp)
        kl_in_reward = ref_logp is not None and cfg.algo.kl_placement == algos.KLPlacement.REWARD
        need_old = cfg.algo.num_iterations > 1 or kl_in_reward
        old_logp = batch_logprobs(self.policy, batch, **lp) if need_old else None
        if not kl_in_reward:
            return rewards, old_logp, ref_logp, {}
        mask, estimator = batch.response_mask, cfg.algo.kl_estimator
        kl_tok = algos.kl_divergence(old_logp, ref_logp, estimator=estimator)
        kl = self.group.sum((kl_tok * mask).sum()) / self.group.sum(mask.sum()).clamp(
            min=1
        )  # algos.masked_mean, global
        rewards = algos.kl_shaped_rewards(
            rewards.to(self.device), old_logp, ref_logp, mask, coef=cfg.algo.kl_coef, estimator=estimator
        )
        return rewards, old_logp, None, {M.KL: kl}

    @contextlib.contextmanager
    def reference(self):
        """The reference model for a block: the loaded copy, or with LoRA the policy with its adapter
        off (the base weights themselves: no second copy). Under FSDP its root's weights (embeddings, LM
        head, final norm) are resharded after the block: FSDP2 keeps a root gathered after a forward,
        for the backward that training runs next, but the reference has none."""
        if self.adapter is None:
            try:
                yield self.ref
            finally:
                if self.shards and self.ref is not None:
                    self.group.reshard(self.ref)
            return
        with self.adapter.disabled():
            yield self.policy

    def loss_denominators(self, batch: RolloutBatch):
        """(response tokens, sequences) of the step, what every micro-batch's loss divides by.

        One process: its own batch. A data-parallel worker returns the sums over all workers, so
        that N workers take the update of one process with the same global batch."""
        counts = torch.stack(
            [batch.response_mask.float().sum(), torch.tensor(float(batch.response_mask.shape[0]), device=self.device)]
        )
        num_tokens, num_seqs = self.group.sum(counts)  # exact: float32 counts up to 2**24
        return num_tokens, int(num_seqs)

    def _update(self, step: int, batch: RolloutBatch, adv, old_logp, ref_logp) -> dict:
        """The step's updates, counting the skipped (non-finite) ones; refreshes the reference when due."""
        cfg = self.cfg
        num_tokens, num_seqs = self.loss_denominators(batch)
        update = update_policy(
            self.policy,
            self.optimizer,
            self.scheduler,
            batch,
            adv,
            old_logp,
            ref_logp,
            cfg,
            self.autocast,
            num_tokens=num_tokens,
            num_seqs=num_seqs,
            group=self.group,
        )
        skipped = update[M.SKIPPED_UPDATES]
        if skipped:
            self.skipped_steps += 1
            self.printer.note(
                f"step {step + 1}: non-finite loss or gradient (NaN/inf); {skipped} of "
                f"{cfg.algo.num_iterations} updates skipped, weights unchanged by them"
            )
        self.bad_in_row = self.bad_in_row + 1 if skipped == cfg.algo.num_iterations else 0
        update[M.SKIPPED_STEPS] = self.skipped_steps
        if cfg.algo.ref_sync_every and (step + 1) % cfg.algo.ref_sync_every == 0:
            self.ref.load_state_dict(self.policy.state_dict())  # MindRLHF sync_ref_model: the KL anchor moves
        return update

    def _sample_rows(self, step: int, got: Scored, adv) -> list[dict]:
        """samples.jsonl rows of the trained batch after ``step`` steps, on the steps ``log.samples_every`` picks."""
        every, G = self.cfg.log.samples_every, self.cfg.rollout.samples_per_prompt
        if not (every and step % every == 0):
            return []
        batch = got.batch
        return [
            {
                "step": step,
                "question": got.rows[i // G]["question"],
                "answer": got.answers[i],
                "completion": got.said[i],
                "reward": got.result.total[i],
                "rewards": {name: v[i] for name, v in got.result.per_rule.items()},
                "advantage": adv[i],
                "length": int(batch.response_lengths[i]),
                "truncated": bool(batch.truncated[i]),
                **({} if batch.tool_calls is None else {"tool_calls": batch.tool_calls[i]}),
                **({} if batch.turns is None or batch.tool_calls is not None else {"turns": batch.turns[i]}),
            }
            for i in range(len(batch.texts))
        ]

    # -- what the logging process does around the steps ------------------------------------

    def _evaluate(self, step: int) -> dict | None:
        """The evaluation after ``step`` steps when due, else None. Every rank calls it: each evaluates
        a share of the rows, and rank 0 writes the whole result and gets its metrics (the others None)."""
        if not self.evaluator.due(step):
            return None
        return self.evaluator.run(self.engine, self.tokenizer, step, self.group)

    def evaluate_start(self) -> None:
        """The before of before/after: RUN/eval/step_000000 and TensorBoard step 0 (not a resume)."""
        before = self._evaluate(0) if self.resume_from is None else None
        if before is not None:
            for k, v in before.items():  # not a metrics.jsonl row: its rows are training steps 1..N
                self.metrics_log.tb.add_scalar(k, v, 0)
            self.printer.note(eval_line(0, before))

    def record(self, step: int, metrics: dict) -> None:
        """After ``step`` steps: evaluation when due, the metrics line, samples, the console line,
        the bad-step limit, and the periodic checkpoint.

        Raises:
            UserError: ``train.max_bad_steps`` steps in a row had only non-finite updates (saved first).
        """
        cfg = self.cfg
        evaluated = self._evaluate(step)  # after the update: the weights saved as step_{step}; every rank
        if not (self.logs or self.shards):  # a data-parallel replica: its share of the evaluation is all
            return
        if self.logs:  # under FSDP every rank comes here, for the checkpoints' collectives
            if evaluated is not None:
                metrics.update(evaluated)
                self.printer.note(eval_line(step, metrics))
            logged = self.metrics_log.log(step, metrics)
            for row in self.samples:
                self.samples_log.write(row)
            self.printer.step(step, logged)
        if self.bad_in_row >= cfg.train.max_bad_steps:
            saved = self.save(step)  # the skipped updates left the last good weights in place
            raise UserError(
                f"stopped at step {step}: {self.bad_in_row} steps in a row had a non-finite loss or gradient "
                f"(NaN/inf); the last good weights are saved in {saved}; check reward/*_errors and the rewards' "
                f"range, or lower train.lr, then resume={self.run_dir}"
            )
        due = (cfg.train.save_every and step % cfg.train.save_every == 0) or (
            cfg.train.save_every_min and time.monotonic() - self.last_save[1] >= 60 * cfg.train.save_every_min
        )
        if self.shards:  # rank 0's clock decides for every rank
            due = self.group.broadcast(bool(due))
        if due and step < cfg.train.steps:
            self.save(step, background=cfg.distributed.async_save)

    def save(self, step: int, *, background: bool = False) -> Path:
        """Checkpoint after ``step`` steps: weights (with LoRA the adapter alone), tokenizer, optimizer,
        schedule, RNG, counters. Under FSDP every rank calls it (:meth:`_save_sharded`), and with
        ``background`` the shards are written while training goes on (the checkpoint is in place once
        whole; elsewhere ``background`` changes nothing)."""
        self.last_save = (step, time.monotonic())
        trainer_state = {
            "step": step,
            "scheduler": self.scheduler.state_dict(),
            "rng": ckpt.rng_state(),
            "skipped_steps": self.skipped_steps,
        }
        if self.logs and self.inflight is not None:  # made ahead, not yet trained: a resume trains on them
            trainer_state["inflight"] = [to_plain(r) for r in self.inflight()]
        if self.shards:
            return self._save_sharded(step, trainer_state, background=background)
        trainer_state["optimizer"] = self.optimizer.state_dict()
        if self.cfg.algo.ref_sync_every:  # the reference is no longer the starting model: keep it
            trainer_state["ref"] = self.ref.state_dict()
        weights = self.policy if self.adapter is None else self.adapter
        return ckpt.save_checkpoint(
            self.run_dir, step, weights, self.tokenizer, trainer_state, keep=self.cfg.train.keep_checkpoints
        )

    def _save_sharded(self, step: int, trainer_state: dict, *, background: bool = False) -> Path:
        """FSDP's checkpoint, in rank 0's staging folder: rank 0 writes the config, tokenizer and trainer
        state, and with ``train.save_hf`` the rollout engine's whole copy as a Hugging Face model (in
        ``rollout.dtype``: already gathered, so no gather and no full-precision copy in host memory);
        every rank writes its shards (``fsdp/``, torch.distributed.checkpoint, with ``background`` in a
        thread); then rank 0 renames the folder into place."""
        group, cfg = self.group, self.cfg
        group.wait_saved()  # one checkpoint at a time: the previous one is whole and in place first
        tmp = Path(group.broadcast(str(ckpt.staging_dir(self.run_dir, step)) if self.logs else None))
        commit = None
        if self.logs:
            hf = ckpt.save_hf(cfg.train.save_hf, self.policy)
            ckpt.save_checkpoint(
                self.run_dir, step, self.engine.model if hf else self.policy, self.tokenizer, trainer_state,
                tmp=tmp, weights=hf, commit=False,
            )  # fmt: skip
            commit = functools.partial(ckpt.commit_checkpoint, self.run_dir, step, tmp, cfg.train.keep_checkpoints)
        ref = self.ref if cfg.algo.ref_sync_every else None
        group.save(tmp / ckpt.SHARDED_DIR, self.policy, self.optimizer, ref, background=background, then=commit)
        if not background:
            group.barrier()  # no rank goes on before it is in place
        return self.run.checkpoint_dir(step)

    def stop(self, step: int, signal_name: str) -> Path:
        """Stopped by a signal after ``step`` steps: saves them (unless just saved) and says how to continue."""
        self._wait_saved()  # a checkpoint of this step written in the background: in place first
        saved = self.save(step) if self.last_save[0] != step or step == 0 else self.run.resume_checkpoint()
        self.printer.note(
            f"stopped by {signal_name} after step {step}; checkpoint {saved}; "
            f"continue with: rlvr train resume={self.run_dir}"
        )
        return self.run_dir

    def interrupted(self, step: int) -> None:
        """A second signal (or Ctrl-C outside the handlers) during ``step``: notes what is saved."""
        saved = self.run.checkpoints()
        where = f"last checkpoint {saved[-1]}" if saved else "no checkpoint saved yet"
        self.printer.note(f"interrupted at step {step + 1}; {where}; metrics are in {self.run.metrics_file}")

    def finish(self) -> Path:
        """The final checkpoint, the summary, and RUN/report/ unless ``log.report=false``; returns the checkpoint."""
        final = self.save(self.cfg.train.steps)
        if not self.logs:  # an FSDP rank: it took part in the checkpoint
            return final
        self.printer.done(self.run_dir, final)
        if self.memory_estimate is not None:
            self.printer.note(measured_beside_estimate(peak_memory(self.device), self.memory_estimate))
        if not self.cfg.log.report:
            self.printer.note(f"report: not written (log.report=false); `rlvr report {self.run_dir}` writes it")
            return final
        try:
            out = build_report(self.run_dir)
        except Exception as e:  # the run is saved; a failed report must not turn it into a failure
            self.printer.note(
                f"warning: the report failed ({type(e).__name__}: {e}); retry with `rlvr report {self.run_dir}`"
            )
        else:
            self.printer.note(f"report: {out / 'report.html'} (and report.md; plots in {out / 'plots'})")
        return final

    def _wait_saved(self) -> None:
        """Under FSDP, waits for a checkpoint being written in the background (every rank together)."""
        if self.shards:
            self.group.wait_saved()

    def close(self) -> None:
        """Closes the metrics and samples sinks and the progress bar, and lets go of the run's lock; a
        checkpoint still being written in the background is finished first (it is, after a clean end);
        if that write failed, the rest is still closed and the failure raised after."""
        try:
            self._wait_saved()
        finally:
            if self.metrics_log is not None:
                self.metrics_log.close()
                self.samples_log.close()
            if self.lock is not None:
                self.lock.close()
                self.lock = None
            self.printer.stop()
