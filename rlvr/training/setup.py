"""The trainer's setup: everything :meth:`~rlvr.training.trainer.Trainer.setup` does before the first step.

:class:`TrainerSetup` is the half of :class:`rlvr.training.trainer.Trainer` that runs once: the
input checks (:func:`~rlvr.training.preflight.preflight`), the prompts and the memory estimate, the
policy, reference and rollout engine (sharded under FSDP), the update's attention kernel, AdamW and
the lr schedule, the resume, and the run directory's first writes (:meth:`TrainerSetup._begin`). A
rollout worker runs its part of it (:meth:`TrainerSetup.setup_rollout`). The step, the bookkeeping
around it and the checkpoints are :class:`~rlvr.training.trainer.Trainer`'s.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import time

import torch

from rlvr import environments
from rlvr.config import Config, Switch, to_yaml
from rlvr.cpu import LeanUnavailable, PackedLinears, dtype_unpackable, packable, update_attention_kernel
from rlvr.data import PromptStream, prepare_rows
from rlvr.errors import UserError
from rlvr.estimate import available_ram, data_prompt_tokens, estimate, memory_check, model_shape, ram_warning
from rlvr.evaluation.during_training import TrainingEval
from rlvr.jsonl import JsonlWriter, truncate_jsonl
from rlvr.models import context_tokens, load_model, load_tokenizer, lora
from rlvr.models.loading import cast_copy, empty_model, set_checkpointing
from rlvr.models.precision import reference_dtype
from rlvr.models.shared_prefix import kernel_shape, one_pass_applies, use_kernel
from rlvr.rollout import HFRolloutEngine
from rlvr.run_dir import RunDir
from rlvr.tools import Toolbox
from rlvr.tracking import MetricsLogger
from rlvr.tracking.console import StepPrinter
from rlvr.training import checkpoint as ckpt
from rlvr.training.inflight import from_plain
from rlvr.training.loop import adamw, lr_scheduler, rollout_entropy_applies
from rlvr.training.preflight import Checked, preflight, summary_lines
from rlvr.training.replicas import OneProcess


class TrainerSetup:
    """Constructs a trainer and sets it up (:meth:`setup`); :class:`rlvr.training.trainer.Trainer` adds the
    step and what the logging process does around it.

    Args:
        cfg: the run's config (``model.device`` precision is resolved in :meth:`setup` if still ``auto``).
        console: where the progress and notes go (a rich Console; default stderr).
        group: the data-parallel group (:class:`rlvr.training.replicas.OneProcess` by default).
    """

    def __init__(self, cfg: Config, console=None, *, group=None) -> None:
        self.cfg = cfg
        self.console = console
        self.group = OneProcess() if group is None else group
        self.shards = self.group.shards
        """This rank holds a shard of the policy, reference and AdamW state (FSDP), not a replica."""
        self.logs = self.group.rank == 0
        """This process writes the run directory: metrics, samples, evaluations, checkpoints."""
        self.lock = None
        """The run's lock file while this process trains it (rank 0), see :meth:`RunDir.lock`."""
        self.samples: list[dict] = []
        """The last step's rows for samples.jsonl (only on steps that ``log.samples_every`` picks)."""
        self.notes: tuple[str, ...] = ()
        """Lines the caller wants printed after the run's summary (:func:`train`'s ``notes``)."""
        self.inflight = None
        """Asynchronous rollouts: what returns the rollouts made but not yet trained (a checkpoint keeps them)."""
        self.resumed_inflight: list = []
        """Those a resumed checkpoint held (:class:`rlvr.training.inflight.Rollout`), for the driver to train on."""

    def setup(self) -> bool:
        """Checks the inputs (:func:`~rlvr.training.preflight.preflight`: nothing printed or written
        before they pass), prints the run's summary, loads the policy, reference and rollout engine,
        builds the optimizer and lr schedule, and resumes; only then does the run directory change
        (:meth:`_begin`).

        Returns:
            False when the run already holds ``train.steps`` steps: nothing to do (nothing written).
        """
        checked = self._check_inputs()
        cfg = self.cfg
        if checked.nothing_to_do:
            self.printer.note(checked.nothing_to_do_line())
            return False
        lines = self._prepare_prompts(checked.train_split)  # may still fail: before the summary
        head, *summary = summary_lines(checked)
        for line in [head, *(self.notes if self.logs else ()), *summary, *checked.notes, *lines]:
            self.printer.note(line)
        if cfg.log.print_config:
            self.printer.note("resolved config\n" + to_yaml(cfg).rstrip())
        state = self._load_models()
        self._build_optimizer(state)
        self._begin()
        self.stream = PromptStream(len(self.train_rows), cfg.train.prompts_per_step, cfg.seed)
        self.metrics_log = self.samples_log = None
        if self.logs:
            self.metrics_log = MetricsLogger.from_config(
                self.run_dir, cfg.log
            )  # jsonl + TensorBoard/W&B, each failure-isolated
            self.samples_log = JsonlWriter(self.run.samples_file)
        self.bad_in_row = 0  # steps in a row whose every update was skipped
        self.last_save = (self.start_step, time.monotonic())  # (step, monotonic time) of the last checkpoint
        # reward workers started, warm and plugins imported before any time limit runs
        self.scorer.warm((cfg.reward.accuracy_rule,))
        if self.engine.tools is not None:
            self.engine.tools.warm()
        self.printer.start(self.start_step)
        return True

    def setup_rollout(self) -> int:
        """A rollout worker's part of :meth:`setup` (:mod:`rlvr.distributed.rollout_worker`): the checked
        inputs, the prompts, the policy (the checkpoint's when resuming, LoRA's adapter in it) and the
        engine, the scoring pool warm; nothing printed or written, no optimizer or reference. Returns the
        version of its weights: the updates they hold."""
        self.logs = False
        checked = self._check_inputs()
        self._prepare_prompts(checked.train_split)
        self.policy, self.adapter = self._load_policy()
        self.engine = self._build_engine()
        self.stream = PromptStream(len(self.train_rows), self.cfg.train.prompts_per_step, self.cfg.seed)
        self.scorer.warm((self.cfg.reward.accuracy_rule,))
        if self.engine.tools is not None:
            self.engine.tools.warm()
        return self.start_step

    def _check_inputs(self) -> Checked:
        """Config, data, reward, model path, checkpoint and run directory errors (:func:`preflight`),
        then the evaluation set-up."""
        checked = preflight(self.cfg, shards=self.shards, writes=self.logs)
        self.cfg = cfg = checked.cfg
        self.device, self.scorer, self.model_path = checked.device, checked.scorer, checked.model_path
        self.resume_from, self.start_step = checked.resume_from, checked.start_step
        self.run_dir = checked.run_dir
        self.run = RunDir(self.run_dir)
        self.printer = StepPrinter(cfg.train.steps, enabled=cfg.log.progress and self.logs, console=self.console)
        self.evaluator = TrainingEval(
            cfg.eval,
            cfg.data,
            checked.test_rows,
            self.run_dir,
            rollout_max_new_tokens=cfg.rollout.max_new_tokens,
            total_steps=cfg.train.steps,
            scorer=self.scorer,
            seed=cfg.seed,
        )
        random.seed(cfg.seed)
        torch.manual_seed(cfg.seed)
        return checked

    def _begin(self) -> None:
        """The run's first writes, once everything has loaded: a new run's directory and config.yaml
        (an earlier run's outputs removed with ``overwrite=true``); a resume's segment config in
        ``RUN/resumes/`` and its metrics and samples past the checkpoint removed. The other ranks
        start after rank 0 has done this, and only read it."""
        if self.logs:
            self.lock = self.run.lock()  # another process that passed the checks meanwhile stops here
            if self.resume_from is None and self.cfg.overwrite:
                self.run.remove_outputs()
            try:
                resumed_from = None if self.resume_from is None else self.start_step
                # settings only: `--config RUN/resumes/step_N.yaml run_dir=NEW` then starts a new run
                saved = dataclasses.replace(self.cfg, resume=None)
                self.run.write_config(to_yaml(saved), resumed_from=resumed_from)
            except OSError as e:
                raise UserError(
                    f"run_dir={self.run_dir} is not writable ({e.strerror or e}); pick another run_dir="
                ) from None
            if self.resume_from is not None:
                truncate_jsonl(self.run.metrics_file, self.start_step)
                truncate_jsonl(self.run.samples_file, self.start_step)
            for name in ckpt.remove_stale(self.run_dir):  # left by a process killed mid-checkpoint
                self.printer.note(
                    f"removed {self.run.checkpoints_root / name}, a checkpoint a killed run had not finished"
                )
        if self.shards:  # every rank sets up at once (sharding is collective): wait for rank 0's run dir
            self.group.share_run_dir(self.run_dir)

    def _prepare_prompts(self, train_split) -> list[str]:
        """The tokenizer, the rendered and tokenised prompts, the memory estimate and check, and the
        packed-weights check; returns the lines to print with the run's summary."""
        cfg = self.cfg
        self.tokenizer = load_tokenizer(self.model_path)
        context = context_tokens(self.model_path)  # a prompt longer than the model's context is an error
        prepared = prepare_rows(train_split, cfg.data, self.tokenizer, context=context)  # rendered + counted, cached
        self.train_rows, self.prefix = prepared.rows, prepared.template.assistant_prefix
        self.memory_estimate, estimate_lines = self._estimate_memory()
        if cfg.model.packed_weights == Switch.ON:  # before any weights load
            for dtype in dict.fromkeys((cfg.model.dtype, cfg.rollout.dtype)):
                if (why := dtype_unpackable(getattr(torch, dtype))) is not None:
                    raise UserError(f"model.packed_weights=true: {why}; set model.packed_weights=auto or false")
        return [*prepared.notes, *estimate_lines]

    def _estimate_memory(self):
        """(the memory estimate (:mod:`rlvr.estimate`) with the data's longest prompt, its lines) before
        any weights load; the estimate is None if the model's config.json is not one it reads (training
        goes on). On a GPU, a UserError when it exceeds the device's free memory (unless
        ``train.skip_memory_check``); on a CPU, a warning line when it exceeds the available RAM."""
        try:
            est = estimate(
                self.cfg,
                model_shape(str(self.model_path))[0],
                device=self.device.type,
                prompt=data_prompt_tokens(self.train_rows),
            )
        except UserError as e:
            return None, [f"memory estimate: unavailable ({e})"]
        if self.device.type == "cuda" and not self.cfg.train.skip_memory_check:
            free, _ = torch.cuda.mem_get_info(self.device)
            memory_check(est, free, f"{torch.cuda.get_device_name(self.device)} ({self.device})")
        warning = ram_warning(est, available_ram()) if self.device.type == "cpu" else None
        return est, [est.summary()] if warning is None else [est.summary(), warning]

    def _load_models(self) -> dict | None:
        """The policy (from the last checkpoint when resuming), the reference, the engine; returns the
        checkpoint's trainer state when resuming."""
        cfg, note = self.cfg, self.printer.note
        state = None
        if self.resume_from is not None:
            state = ckpt.load_trainer_state(self.resume_from)
            if state["step"] != self.start_step:
                raise UserError(
                    f"resume={cfg.resume}: {self.resume_from} holds the state of step {state['step']}, not of "
                    f"step {self.start_step} as its name says; resume from an unrenamed checkpoint"
                )
        self.policy, self.adapter = self._load_policy()
        if cfg.model.gradient_checkpointing:
            set_checkpointing(self.policy)
            if self.adapter is not None:  # frozen embeddings: checkpointed layers need an input that requires grad
                self.policy.enable_input_require_grads()
            if cfg.train.shared_prompt_forward:
                note("model.gradient_checkpointing: the update runs each prompt per sequence (exact); "
                     "old/ref log-probs still share it")  # fmt: skip
        if self.shards:  # the rollout copy's tree before the policy's is sharded (on meta: no storage yet),
            copy = cast_copy(self.policy, getattr(torch, cfg.rollout.dtype))  # then filled from the shards
            self._shard_models()
            self.engine = self._build_engine(self.group.fill_copy(copy, self.policy))
        else:
            self.ref = self._load_reference()
            self.engine = self._build_engine()
        self.packed = self._training_packs()
        self._install_attention_kernel()
        return state

    def _install_attention_kernel(self) -> None:
        """The update's compiled shared-prompt attention (``train.fused_attention``,
        :mod:`rlvr.cpu.update_attention`) for this process's passes where it applies; with ``auto`` a
        note on a CPU under bf16 autocast where it cannot run, with ``true`` an error saying why."""
        want = self.cfg.train.fused_attention.as_bool()
        use_kernel(None)
        if want is False:
            return
        why, fn = self._why_no_attention_kernel(), None
        if why is None:
            fn, why = update_attention_kernel()
        if fn is not None:
            use_kernel(fn)
            if self.logs:
                self.printer.note("update attention: compiled for AVX512-BF16 (train.fused_attention)")
        elif want:
            raise UserError(f"train.fused_attention=true, but {why}; set train.fused_attention=auto (or false)")
        elif self.logs and self.device.type == "cpu" and self.cfg.model.autocast_bf16 == Switch.ON:
            self.printer.note(f"train.fused_attention=auto: the update's attention runs in torch ({why})")

    def _why_no_attention_kernel(self) -> str | None:
        """Why the compiled update attention cannot run this policy here (before building it), or None."""
        config = self.policy.config
        heads = config.num_attention_heads
        kv = getattr(config, "num_key_value_heads", None) or heads
        d = getattr(config, "head_dim", None) or config.hidden_size // heads
        if self.device.type != "cpu":
            return f"it runs on a CPU and the update runs on {self.device}"
        if self.cfg.model.autocast_bf16 != Switch.ON:
            return "it runs under bf16 autocast and model.autocast_bf16 is off"
        if not one_pass_applies(self.policy):
            return "the model's attention is not sdpa without sliding windows (the one-pass shared prompt)"
        if not kernel_shape(heads, kv, d):
            return f"it has no kernel for head size {d} with {heads} query heads over {kv} key/value heads"
        return None

    def _load_reference(self):
        """The reference model, or None: none is loaded with kl_coef == 0, nor with LoRA (the base with
        the adapter off). Sharded (FSDP/HSDP): read by rank 0 alone and broadcast into every rank's
        shards (:meth:`~rlvr.distributed.fsdp.ShardedGroup.shard_loaded`): bf16 passes on a GPU with
        ``model.autocast_bf16``, its shards in host memory with ``offload.reference``."""
        cfg = self.cfg
        if cfg.algo.kl_coef == 0 or self.adapter is not None:
            return None
        dtype = reference_dtype(cfg.model.dtype, cfg.model.autocast_bf16 == Switch.ON)  # bf16 under autocast
        if not self.shards:
            return load_model(self.model_path, dtype=dtype, device=cfg.model.device).eval().requires_grad_(False)
        bf16 = cfg.model.autocast_bf16 == Switch.ON and self.device.type == "cuda"
        ref = empty_model(self.model_path, dtype=dtype).requires_grad_(False)
        whole = functools.partial(load_model, self.model_path, dtype=dtype)  # rank 0's, in its host memory
        return self.group.shard_loaded(ref, whole, bf16_compute=bf16, offload=cfg.offload.reference)

    def _shard_models(self) -> None:
        """FSDP: shards the policy (built on the meta device) and fills its shards from the weights rank 0
        alone reads, then the reference likewise; turns length buckets, the shared prompt pass and
        forward-only zero-advantage groups off: every rank must run the same passes, as each one
        gathers the weights with the others."""
        cfg = self.cfg
        bf16 = cfg.model.autocast_bf16 == Switch.ON and self.device.type == "cuda"
        whole = functools.partial(load_model, self.model_path, dtype=cfg.model.dtype)  # rank 0's, in host memory
        self.group.shard_loaded(self.policy, whole, bf16_compute=bf16, offload=cfg.offload.params)
        self.ref = self._load_reference()
        # buckets: a data-dependent pass count; a two-pass shared prompt: two forwards per backward, which
        # FSDP2 cannot backward through (the first pass's layers are resharded by then). The one-pass shared
        # prompt (rlvr.models.shared_prefix, sdpa models) is one forward like a plain pass, so it stays on.
        keys = ("length_buckets", "zero_adv_forward_only")
        if not one_pass_applies(self.policy):
            keys += ("shared_prompt_forward",)
        off = [k for k in keys if getattr(cfg.train, k)]
        if off:
            self.cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **dict.fromkeys(off, False)))
            keys = " and ".join(f"train.{k}" for k in off)
            strategy = cfg.distributed.strategy
            self.printer.note(f"distributed.strategy={strategy}: {keys} off (every worker runs the same plain passes)")

    def _build_engine(self, copy=None) -> HFRolloutEngine:
        """The rollout engine (rollout.engine=hf, the one engine built: config rejects vllm) on the policy,
        with a line for each CPU-speed choice it made; sharded, it samples from ``copy``, the whole copy
        filled from the shards. Its static cache (a GPU's decode) holds the data's
        longest prompt plus the longer of the rollout's and the evaluation's responses: one set of buffers
        for the run (a longer evaluation prompt grows it once). With episodes (tools, code feedback, an
        environment) one budget more: a continuation left-pads to its longest row (a prompt and its turns so
        far) and decodes up to another row's remaining budget."""
        cfg, note = self.cfg, self.printer.note
        r = cfg.rollout
        budget = max(r.max_new_tokens, self.evaluator.max_new_tokens)
        episodes = bool(r.tools or r.environment or r.max_turns > 1)
        longest = data_prompt_tokens(self.train_rows)[0] + budget * (2 if episodes else 1)
        try:
            engine = HFRolloutEngine(
                self.policy, self.tokenizer, max_new_tokens=r.max_new_tokens, temperature=r.temperature,
                top_p=r.top_p, top_k=r.top_k, dtype=r.dtype, batch_seqs=r.batch_seqs,
                logprobs=cfg.algo.tis_cap is not None,  # TIS weighs by trainer / engine probabilities
                entropy=rollout_entropy_applies(cfg),  # train/entropy; no pass for groups of all-zero advantages
                tools=Toolbox.from_config(r, cfg.reward.workers),  # None without rollout.tools
                stop=r.stop, packed_weights=cfg.model.packed_weights.as_bool(),
                lean_decode=r.lean_decode.as_bool(), static_decode=r.static_decode.as_bool(),
                static_capacity=longest, gathered=self.shards, copy=copy,
            )  # fmt: skip
        except LeanUnavailable as e:
            raise UserError(f"rollout.lean_decode=true: {e}; set rollout.lean_decode=auto or false") from e
        engine.environment = environments.from_settings(r.environment, toolbox=engine.tools, max_turns=r.max_turns)
        engine.turn_prefix = self.prefix  # data.assistant_prefix opens every turn, as it opens the first
        if engine.unpacked is not None and self.logs:
            note(f"model.packed_weights=auto: the {r.dtype} rollout runs unpacked ({engine.unpacked})")
        if engine.lean is not None and self.logs:
            note(engine.lean.describe())
        return engine

    def _training_packs(self) -> PackedLinears | None:
        """The policy's packed linears for the log-prob passes and the update (:mod:`rlvr.cpu.packed`),
        shared with the engine when it samples from the policy itself; None where they do not apply or
        are off, and under bf16 autocast (whose products run in bf16 on the fly)."""
        want = self.cfg.model.packed_weights.as_bool()
        if want is False or self.shards or self.cfg.model.autocast_bf16 == Switch.ON or not packable(self.policy):
            return None
        if self.engine.model is self.policy and self.engine.packed is not None:
            return self.engine.packed
        return PackedLinears(self.policy)

    def _load_policy(self):
        """(policy, LoRA adapter or None): the model to train, from the last checkpoint when resuming.

        With ``model.lora.rank > 0`` the policy is the base model with a LoRA adapter in it (a new
        one, or the checkpoint's); only the adapter's parameters require grad."""
        cfg, spec = self.cfg, self.cfg.model.lora
        ckpt_dir, dtype, device = self.resume_from, cfg.model.dtype, cfg.model.device
        if not spec.rank and self.shards:  # on the meta device: rank 0 reads the weights as it is sharded
            return empty_model(self.model_path, dtype=dtype), None  # (_shard_models); a resume's come from DCP
        if not spec.rank:
            return load_model(ckpt_dir or self.model_path, dtype=dtype, device=device), None
        base = load_model(self.model_path, dtype=dtype, device=device)
        settings = dict(rank=spec.rank, alpha=spec.alpha, dropout=spec.dropout, target_modules=spec.target_modules)
        if ckpt_dir is not None:
            adapter = lora.load_adapter(base, ckpt_dir, **settings)
        else:
            adapter = lora.add_adapter(base, **settings, base=lora.base_spec(cfg.model.path))
        trainable = sum(p.numel() for p in adapter.model.parameters() if p.requires_grad)
        total = sum(p.numel() for p in adapter.model.parameters())
        self.printer.note(
            f"LoRA rank {spec.rank}: {trainable:,} of {total:,} parameters train ({trainable / total:.2%})"
        )
        return adapter.model, adapter

    def _build_optimizer(self, state: dict | None) -> None:
        """AdamW and the lr schedule; on resume their state, the RNG and a refreshed reference."""
        cfg = self.cfg
        trainable = [p for p in self.policy.parameters() if p.requires_grad]  # with LoRA: the adapter alone
        self.optimizer = adamw(
            trainable, lr=cfg.train.lr, betas=tuple(cfg.train.adam_betas), weight_decay=cfg.train.weight_decay
        )
        self.scheduler = lr_scheduler(
            self.optimizer,
            schedule=cfg.train.lr_schedule,
            warmup_steps=cfg.train.warmup_steps,
            total_steps=cfg.train.steps * cfg.algo.num_iterations,
            min_lr_ratio=cfg.train.min_lr_ratio,
        )
        self.skipped_steps = 0  # steps with a skipped update
        if self.packed is not None:
            self.packed.watch(self.optimizer)  # every optimizer step makes the packed copies stale
        if state is None:  # sharded: the engine's copy was filled from the shards as it was built
            return
        if self.shards:  # the policy, AdamW state (and a moved reference) are in the checkpoint's shards
            ref = self.ref if cfg.algo.ref_sync_every else None
            self.group.load(self.resume_from / ckpt.SHARDED_DIR, self.policy, self.optimizer, ref)
            self.engine.gather_weights()
        else:
            self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        # the saved lr is the old schedule's: a resume that changes train.steps (the cosine's horizon)
        # trains its next step at the new schedule's value (unchanged settings give the same number)
        for group, base, fn in zip(self.optimizer.param_groups, self.scheduler.base_lrs, self.scheduler.lr_lambdas):
            group["lr"] = base * fn(self.scheduler.last_epoch)
        self.scheduler._last_lr = [group["lr"] for group in self.optimizer.param_groups]
        ckpt.set_rng_state(state["rng"])
        self.resumed_inflight = [from_plain(r) for r in state.get("inflight", [])]
        if "ref" in state and not self.shards:  # a reference refreshed from the policy (algo.ref_sync_every)
            self.ref.load_state_dict(state["ref"])
        self.skipped_steps = state.get("skipped_steps", 0)
