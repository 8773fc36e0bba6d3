"""The root of the config tree, :class:`Config`: its sections, the run's own keys (``run_dir``,
``seed``, ``resume``, ``overwrite``), and in ``__post_init__`` the checks that span sections.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.choices import Backend
from rlvr.config.sections import (
    AlgoConfig,
    DataConfig,
    DistributedConfig,
    EvalConfig,
    LogConfig,
    ModelConfig,
    OffloadConfig,
    RewardConfig,
    RolloutConfig,
    Switch,
    TrainConfig,
    _check,
)


def _micro_batch_misfit(seqs: int, train: TrainConfig, autocast_bf16: Switch) -> str | None:
    """The first of ``train.micro_batch_seqs`` and (when set, and bf16 autocast may run:
    ``model.autocast_bf16`` not false) ``train.micro_batch_seqs_bf16`` that does not split ``seqs``
    sequences into equal passes nor takes them in one (a micro-batch of at least ``seqs``), as
    ``key=value``; None when both do, or when rows are packed by tokens instead."""
    if train.micro_batch_tokens > 0:
        return None
    keys = ("micro_batch_seqs",) if autocast_bf16 == Switch.OFF else ("micro_batch_seqs", "micro_batch_seqs_bf16")
    for key in keys:
        mb = getattr(train, key)
        if mb and seqs % mb and mb < seqs:
            return f"train.{key}={mb}"
    return None


@dataclass(frozen=True)
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    data: DataConfig = field(default_factory=DataConfig)
    """Prompts and answers."""
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Sampling."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Rule rewards."""
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    """Advantages and losses."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimizer and loop."""
    offload: OffloadConfig = field(default_factory=OffloadConfig)
    """Moving the sharded policy, its optimizer state and the reference to host memory (FSDP on GPUs)."""
    log: LogConfig = field(default_factory=LogConfig)
    """Logging."""
    eval: EvalConfig = field(default_factory=EvalConfig)
    """Evaluation during training."""
    distributed: DistributedConfig = field(default_factory=DistributedConfig)
    """Data-parallel training on Ray."""
    run_dir: str = "runs/quickstart"
    """Run directory: config.yaml, metrics.jsonl, samples.jsonl, checkpoints/ (with resume=, the resumed run's own)."""
    seed: int = 0
    """Seed of model init noise, sampling and data order."""
    resume: str | None = None
    """Run directory to continue, in place, from its last checkpoint (model, optimizer, scheduler, step, RNG, data position); its overrides are kept in RUN/resumes/step_N.yaml."""
    overwrite: bool = False
    """Start a new run in run_dir even though it holds one: its metrics, samples, checkpoints, evals, events and report are deleted first."""

    def __post_init__(self) -> None:
        seqs = self.train.prompts_per_step * self.rollout.samples_per_prompt
        misfit = _micro_batch_misfit(seqs, self.train, self.model.autocast_bf16)
        _check(
            misfit is None,
            f"train.prompts_per_step * rollout.samples_per_prompt = {seqs} sequences per step is not divisible "
            f"by {misfit}; pick a divisor of {seqs} (or {seqs} or more: one pass)",
        )
        _check(
            self.algo.overlong_buffer <= self.rollout.max_new_tokens,
            f"algo.overlong_buffer={self.algo.overlong_buffer} is longer than rollout.max_new_tokens="
            f"{self.rollout.max_new_tokens}; the buffer is the last part of that budget",
        )
        _check(
            self.model.lora.rank == 0 or self.algo.ref_sync_every == 0,
            "algo.ref_sync_every copies the policy into a separate reference, but with model.lora.rank > 0 the "
            "reference is the base model with the adapter off; set algo.ref_sync_every=0 (or model.lora.rank=0)",
        )
        _check(
            self.model.packed_weights != Switch.ON or not self.model.device.startswith("cuda"),
            f"model.packed_weights=true packs weights for a CPU, but model.device={self.model.device}; "
            "set model.packed_weights=auto (or false)",
        )
        _check(
            not (self.rollout.lean_decode == Switch.ON and self.rollout.static_decode == Switch.ON),
            "rollout.lean_decode=true and rollout.static_decode=true are two decoders; turn one to auto (or false)",
        )
        if self.rollout.lean_decode == Switch.ON:
            lean = "rollout.lean_decode=true decodes a float32 Llama/Qwen2 model on packed CPU weights"
            _check(
                self.model.packed_weights != Switch.OFF and not self.model.device.startswith("cuda"),
                f"{lean}, but model.packed_weights={self.model.packed_weights} and model.device={self.model.device}; "
                "set rollout.lean_decode=auto (or false)",
            )
            _check(
                self.rollout.dtype != "bfloat16",
                f"{lean}, but rollout.dtype=bfloat16; set rollout.dtype=float32 (or auto), or rollout.lean_decode=auto",
            )
            _check(
                self.model.lora.rank == 0,
                f"{lean}, but model.lora.rank={self.model.lora.rank} wraps the linear layers; set rollout.lean_decode=auto",
            )
        if self.distributed.backend == Backend.RAY:
            self._check_distributed()
        self._check_offload()

    def _check_distributed(self) -> None:
        N, P = self.distributed.num_workers, self.train.prompts_per_step
        _check(
            P % N == 0,
            f"train.prompts_per_step={P} is not divisible by distributed.num_workers={N}; each worker takes whole "
            f"groups, so pick a multiple of {N}",
        )
        seqs = P // N * self.rollout.samples_per_prompt
        misfit = _micro_batch_misfit(seqs, self.train, self.model.autocast_bf16)
        _check(
            misfit is None,
            f"each of the {N} workers trains on {seqs} sequences per step, not divisible by "
            f"{misfit}; pick a divisor of {seqs} (or {seqs} or more: one pass)",
        )
        on_gpu = self.distributed.gpus_per_worker > 0
        _check(
            on_gpu == self.model.device.startswith("cuda") or self.model.device == "auto",
            f"model.device={self.model.device} with distributed.gpus_per_worker={self.distributed.gpus_per_worker}: "
            "give GPU workers model.device=cuda (or auto), CPU workers model.device=cpu (or auto)",
        )
        if self.distributed.strategy.shards:
            _check(
                self.train.micro_batch_tokens == 0,
                f"distributed.strategy={self.distributed.strategy} runs the same passes on every worker, but "
                f"train.micro_batch_tokens={self.train.micro_batch_tokens} packs each worker's rows into a "
                "data-dependent number of passes; set train.micro_batch_tokens=0 (or distributed.strategy=ddp)",
            )
            _check(
                self.model.lora.rank == 0,
                f"distributed.strategy={self.distributed.strategy} shards full-parameter training, but "
                f"model.lora.rank={self.model.lora.rank}: "
                "a LoRA run trains a small adapter on a frozen base; use distributed.strategy=ddp (or model.lora.rank=0)",
            )

    def _check_offload(self) -> None:
        """offload.params (with offload.optimizer) and offload.reference are FSDP2's CPUOffloadPolicy:
        shards to move off a GPU."""
        d = self.distributed
        if self.offload.reference:
            _check(
                d.backend == Backend.RAY and d.strategy.shards,
                f"offload.reference=true moves the reference's FSDP2 shards to host memory (CPUOffloadPolicy), but "
                f"distributed.strategy={d.strategy} with distributed.backend={d.backend} shards nothing; set "
                "distributed.backend=ray and distributed.strategy=fsdp or hsdp (num_workers=1 is fine)",
            )
            _check(
                d.gpus_per_worker > 0,
                "offload.reference=true moves the reference's shards off a GPU, but distributed.gpus_per_worker=0 "
                "trains on the CPU, where they already live in host memory; set distributed.gpus_per_worker=1 "
                "(or offload.reference=false)",
            )
            _check(
                self.algo.kl_coef > 0,
                "offload.reference=true, but algo.kl_coef=0 loads no reference; set offload.reference=false "
                "(or algo.kl_coef > 0)",
            )
        if not self.offload.params:
            return
        _check(
            d.backend == Backend.RAY and d.strategy.shards,
            f"offload.params=true moves FSDP2's shards to host memory (CPUOffloadPolicy), but distributed.strategy="
            f"{d.strategy} with distributed.backend={d.backend} shards nothing; set distributed.backend=ray and "
            "distributed.strategy=fsdp or hsdp (num_workers=1 is fine)",
        )
        _check(
            d.gpus_per_worker > 0,
            "offload.params=true moves the shards off a GPU, but distributed.gpus_per_worker=0 trains on the CPU, "
            "where they already live in host memory; set distributed.gpus_per_worker=1 "
            "(or offload.params=false and offload.optimizer=false)",
        )

    @property
    def seqs_per_step(self) -> int:
        return self.train.prompts_per_step * self.rollout.samples_per_prompt
