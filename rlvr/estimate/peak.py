"""The training peak of a run, item by item (:func:`estimate`), from the model shape and the run config.

Every item is a formula over the model shape and the config, in bytes:

- **parameters**: N × bytes(``model.dtype``), N counted from the config
  (:meth:`~rlvr.estimate.shapes.ModelShape.num_params`, exact for Llama/Qwen2-style decoders).
- **rollout copy**: N × bytes(rollout dtype) when ``rollout.dtype`` differs from ``model.dtype``
  (the bf16 generation copy of an fp32 policy); none when they match (the weights are shared).
- **packed weights** (CPU, ``model.packed_weights`` not false; :mod:`rlvr.cpu.packed`): every
  linear weight and the LM head (LoRA's adapter included) once more in the rollout dtype, and,
  without bf16 autocast on a CPU where the packed update pays (AVX-512), the policy's once more
  (its transpose, for the update's backward; twice when the rollout samples from a copy of another
  dtype); with ``rollout.lean_decode`` on a float32 rollout without LoRA, every linear weight and
  the LM head once more in the compiled decode kernels' layout where they run (a C compiler, and a
  kernel for the attention's shape), else each layer's q, k and v weights once more as one packed
  matrix.
- **reference model**: N × bytes(its dtype) when ``algo.kl_coef > 0``: bfloat16 under bf16 autocast,
  else ``model.dtype`` (:func:`rlvr.models.precision.reference_dtype`); none with LoRA (the reference
  is the base with the adapter disabled). Under FSDP its root is resharded after each pass, so only
  its shard stays resident.
- **AdamW state**: 2 moments × trainable params × bytes(``model.dtype``) (fp32 by default).
- **gradients**: trainable params × bytes(``model.dtype``), live during the update.
- **activations** of one micro-batch, live during its backward: the tensors autograd saves, about
  ``layers × tokens × (9·hidden + 4·intermediate)`` elements of ``a`` bytes (a = 4 in fp32, 3.3
  under bf16 autocast: matmul inputs are bf16, norms and residuals fp32), where tokens = the
  micro-batch's prompt tokens (once per group with ``train.shared_prompt_forward``) plus its
  response tokens; the shared prompt's key/values repeated to every row add
  ``layers × b × prompt × 2 × (hidden + kv_dim)`` elements. Two of the nine hidden-sized elements are
  the keys and values repeated to every query head (sdpa with a mask repeats them and backward keeps
  the copies); a CUDA update of packed rows attends with no mask, where sdpa's grouped-query kernels keep
  ``2 × kv_dim`` instead (:data:`ACT_ELEMENTS_KV_COPIES`). With gradient checkpointing only
  each layer's input is saved (``layers × tokens × hidden`` fp32) plus one layer's activations
  while it is recomputed. Under bf16 autocast the bf16 copies of the weights (N × 2 bytes) are
  cached for the pass; LoRA's frozen base weights are instead cast again by each forward pass
  and saved per pass (:func:`autocast_weight_copies`). Plus the log-probs' share: for a model whose
  head the update fuses with the log-probs (:func:`fused_head`, Llama/Qwen2/Mistral and kin), what
  :func:`fused_head_bytes` counts: the float32 logits only when they are small enough to be kept
  (at most 256 MiB), two or three tiles, the hidden states' and (full fine-tuning) the head weight's
  float32 gradients. For other models the logits: ``b × T × V`` in the
  logits dtype, the float32 copy :func:`rlvr.algos.token_logprobs` keeps per row for backward,
  and both of their gradients. With ``train.micro_batch_tokens`` (rows packed, each with its own
  prompt) tokens = the budget (or one whole row, when longer), the logits those of
  ``tokens × T / (prompt + T)`` response tokens (rows of the prompt length assumed throughout and
  whole responses; a data set of shorter prompts fits more responses in a pass), their gradient
  once more (backward joins the chunks the log-probs ran in); sdpa attends row by row, with no
  mask (an eager model's ``tokens × tokens`` block mask is not counted).
  All of this × 1.2 on a CPU, × 1.4 on a GPU, for backward's temporary buffers and the allocator's
  slack (:data:`CPU_BACKWARD_FACTOR`, :data:`BACKWARD_FACTOR`).
- **KV cache** of the rollout: ``2 × layers × kv_heads × head_dim × rows × (prompt + new tokens)
  × bytes(rollout dtype)``, rows = min(``rollout.batch_seqs``, the step's sequences), or the
  evaluation's rows when larger. The dynamic decode (a CPU's) frees it before the update.
- **static KV cache** of the static decode (:func:`static_decodes`: a CUDA device unless
  ``rollout.static_decode=false``, a CPU with ``true``): one cache kept for the whole run and reused by
  every rollout and evaluation, so that the compiled CUDA graphs keep their addresses; it therefore
  stays allocated through the update (resident). ``2 × layers × kv_heads × head_dim × rows × capacity
  × bytes(rollout dtype)``, rows = ``(rollout.batch_seqs // G) × G`` (at least G), capacity = prompt +
  the longer of the rollout's and the evaluation's new tokens, rounded up to
  :data:`STATIC_CAPACITY_MULTIPLE`; plus its boolean attention mask (rows × capacity) and int64
  response (rows × new tokens). The rollout then holds no other cache.
- **CUDA-graph pool** (CUDA, static decode: the step is compiled and captured): the private memory
  pool of its CUDA graphs, which stays reserved for the run: as large as the step's transients, about
  :data:`GRAPH_POOL_VOCAB_TENSORS` float32 ``rows × vocab`` tensors (logits, log-softmax, the sampler's)
  plus one layer's activations. The step's attention copies no keys or values
  (:mod:`rlvr.models.gqa_decode`); with transformers' compiled attention the pool would also hold one
  layer's keys and values repeated per query head (about 2.8 GB at 7B, 64 rows × 3,072 positions).
- **runtime** (CPU only): Python, torch, transformers, the tokenizer and the prompts.

The peak is the resident items (runtime, parameters, rollout copy, reference, AdamW, the static KV
cache) plus the larger of the update (gradients + activations) and the rollout (KV cache).

Calibration (README "Memory estimate"): the factors 9/4, 3.3 and 4 bytes were read off the
tensors autograd saves for SmolLM2-135M (``benchmarks/memory_estimate.py``); 1.2 and the
0.48 GiB CPU runtime from the quickstart's measured RSS on this project's 2-core CPU (1.4 on a GPU is
the earlier CPU fit, unmeasured there).

On CUDA the total is what ``torch.cuda.max_memory_allocated`` counts: the CUDA context (about
0.5 GiB) and the host process come on top.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from rlvr.choices import Backend, Strategy
from rlvr.config import Config, Switch
from rlvr.estimate.shapes import ModelShape, model_shape

GiB = 2**30
MiB = 2**20
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

CPU_RUNTIME_BYTES = int(0.48 * GiB)
"""Python + torch + transformers + rlvr + the reward pool's handle + tokenizer + prepared prompts: the RSS
of a process that did all of that for the quickstart and loaded no weights (0.484 GiB; 2026-11-29, a
2-core AVX2 EPYC, torch 2.13; the earlier 0.7 GiB was an older code's RSS after setup minus its weights)."""
ACT_ELEMENTS_HIDDEN = 9
"""Saved elements per token and layer, per unit of hidden size (norms, q/k/v/o inputs, residuals, and the
keys and values repeated to every query head: :data:`ACT_ELEMENTS_KV_COPIES` of the nine)."""
ACT_ELEMENTS_KV_COPIES = 2
"""Of :data:`ACT_ELEMENTS_HIDDEN`: the keys and the values repeated to every query head (``heads × head_dim``
= hidden each). sdpa given a mask repeats them (``repeat_kv``) and autograd keeps the copies for backward;
the calibration model (SmolLM2, 3 query heads per key/value head) counted them. A CUDA update of packed
rows attends with no mask, and sdpa's grouped-query kernels keep the unrepeated ``kv_dim`` instead."""
GRAPH_POOL_VOCAB_TENSORS = 4
"""float32 ``[rows, vocab]`` tensors the compiled decode step holds at its peak (the logits, their
log-softmax, the sampler's probabilities and their sort), the largest of its transients: its CUDA
graphs' private pool keeps that much reserved for the run. Counted, not yet measured on a GPU."""
ACT_ELEMENTS_INTERMEDIATE = 4
"""Saved elements per token and layer, per unit of intermediate size (gate, up, act, product)."""
ACT_BYTES_FP32 = 4.0
ACT_BYTES_AUTOCAST = 3.3
"""Mean bytes per saved element under bf16 autocast (measured 64.2 / 77.7 of the fp32 bytes, x 4)."""
BACKWARD_FACTOR = 1.4
"""Activations x this = their peak during backward (gradient buffers, allocator slack) on a GPU: the
earlier CPU calibration, kept where nothing has measured it yet (conservative)."""
CPU_BACKWARD_FACTOR = 1.2
"""The same on a CPU, refit on the quickstart's measured peak RSS with today's update (2026-11-29, a 2-core
AVX2 EPYC, float32: 4.26–4.31 GiB over 3 and 10 steps): the estimate reads 4.73 GiB, +10 %. (1.4 read
5.17 GiB, +20 %.) The bf16-autocast path of AVX512-BF16 CPUs (5.95 GiB measured by a clean-clone check)
reads about 7.2 GiB with it, +22 %: not measurable on this project's AVX2 machine."""
DEFAULT_PROMPT_TOKENS = {"arithmetic": 128, "countdown": 160, "files": 512}
"""Assumed rendered prompt length when ``data.max_prompt_tokens`` is 0 (the r1 template's
system prompt makes a built-in task's prompt ~126 tokens with SmolLM2's tokenizer)."""
STATIC_CAPACITY_MULTIPLE = 256
"""The static decode rounds its cache's positions up to a multiple of this (:mod:`rlvr.rollout.static`)."""


def fused_head(shape: ModelShape) -> bool:
    """Whether the update computes this model's log-probs by the fused LM head (no [b, T, V] logits)."""
    from rlvr.models.forward import FUSED_HEAD_MODEL_TYPES  # torch: only when an estimate is made

    return shape.model_type in FUSED_HEAD_MODEL_TYPES


def fused_head_bytes(tokens: int, vocab: int, hidden: int, *, autocast: bool, head_trains: bool) -> int:
    """What :func:`rlvr.algos.lm_head_logprobs` holds for ``tokens`` response tokens at its peak (the
    backward): the logits when they fit :data:`~rlvr.algos.logprobs.HEAD_KEEP_LOGITS_BYTES` (kept for
    the backward: float32, or under autocast the bf16 product), else nothing of them; two float32
    tiles (three under autocast, the product's own dtype) of :data:`~rlvr.algos.logprobs.HEAD_CHUNK_TOKENS` ×
    :data:`~rlvr.algos.logprobs.HEAD_CHUNK_VOCAB`; the float32 gradient of the hidden states; and
    the float32 gradient of the head's weight while the head trains (not under LoRA)."""
    from rlvr.algos.logprobs import HEAD_CHUNK_TOKENS, HEAD_CHUNK_VOCAB, HEAD_KEEP_LOGITS_BYTES

    logits = tokens * vocab * (2 if autocast else 4)
    kept = logits if logits <= HEAD_KEEP_LOGITS_BYTES else 0
    tile = min(tokens, HEAD_CHUNK_TOKENS) * min(vocab, HEAD_CHUNK_VOCAB)
    tiles = tile * (4 + 4 + (2 if autocast else 0))
    return kept + tiles + tokens * hidden * 4 + (vocab * hidden * 4 if head_trains else 0)


@dataclass(frozen=True)
class Item:
    name: str
    bytes: int
    phase: str
    """resident (held all run), update (during backward) or rollout (during generation) on the device;
    host: held all run in host memory instead (offloaded, :func:`offloaded`), not in the device's peak."""
    how: str


@dataclass(frozen=True)
class MemoryEstimate:
    items: list[Item]
    device: str
    """cpu or cuda."""
    params: int
    trainable: int
    notes: list[str] = field(default_factory=list)
    shards: int = 1
    """Workers the model is sharded over (``distributed.strategy=fsdp``): the figures are one worker's."""
    largest: int = 0
    """Elements of the model's largest tensor (the embeddings, vocab x hidden): what sharded loading
    holds whole at a time beside the shards (:func:`~rlvr.estimate.load.load_memory`)."""

    def phase(self, phase: str) -> int:
        return sum(i.bytes for i in self.items if i.phase == phase)

    @property
    def total(self) -> int:
        """Resident items plus the larger of the update and the rollout."""
        return self.phase("resident") + max(self.phase("update"), self.phase("rollout"))

    @property
    def host(self) -> int:
        """What is kept in host memory instead of on the device (``offload.params``, ``offload.reference``)."""
        return self.phase("host")

    def hardware(self) -> str:
        """What the total means: the smallest common RAM or GPU size that holds it."""
        need = self.total / GiB
        if self.device == "cuda":
            for size in (8, 12, 16, 24, 40, 48, 80, 94, 141, 192):
                if need <= 0.95 * size:  # the CUDA context and fragmentation take the rest
                    each = f" per worker ({self.shards} FSDP shards)" if self.shards > 1 else ""
                    return f"fits one {size} GiB GPU{each} (plus ~0.5 GiB CUDA context)"
            if self.shards > 1:
                return f"needs {need:.0f} GiB per GPU: more than any single GPU holds; add workers or lower the update"
            return (
                f"needs {need:.0f} GiB in one process: more than any single GPU holds; shard it over GPUs "
                "(distributed.strategy=fsdp) or train a LoRA adapter"
            )
        for size in (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024):
            if need <= 0.9 * size:  # room for the OS and the reward workers
                return f"fits a machine with {size} GiB RAM"
        return f"needs {need:.0f} GiB of RAM"

    def lines(self) -> list[str]:
        """The itemised table, the total and the hardware line."""
        each = f"; per worker of {self.shards}, sharded by FSDP" if self.shards > 1 else ""
        out = [
            f"memory estimate ({self.device}; {self.params / 1e6:,.0f}M parameters, "
            f"{self.trainable / 1e6:,.1f}M trained{each})"
        ]
        for item in self.items:
            out.append(f"  {item.name:17s} {item.bytes / GiB:8.2f} GiB  {item.phase:8s} {item.how}")
        out.append(f"  {'peak':17s} {self.total / GiB:8.2f} GiB  = resident + max(update, rollout)")
        if self.host:
            out.append(f"  {'host (offload)':17s} {self.host / GiB:8.2f} GiB  the host items, in pinned host memory")
        out.append(f"  {self.hardware()}")
        out += [f"  note: {n}" for n in self.notes]
        return out

    def summary(self) -> str:
        """One line for the trainer's console."""
        parts = ", ".join(f"{i.name} {i.bytes / GiB:.2f}" for i in self.items if i.bytes and i.phase != "host")
        what = "RSS" if self.device == "cpu" else "CUDA allocated"
        return f"memory estimate: {self.total / GiB:.2f} GiB peak {what} ({parts} GiB); {self.hardware()}"


def _device_kind(device: str) -> str:
    if device == "auto":
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    return "cuda" if device.startswith("cuda") else "cpu"


def _packed_update() -> bool:
    from rlvr.cpu import packed_training_pays  # torch: imported only where a CPU estimate needs it

    return packed_training_pays()


def _packs(dtype: str) -> bool:
    """Whether oneDNN packs ``dtype`` weights on this CPU (:func:`rlvr.cpu.packed.dtype_unpackable`)."""
    import torch  # imported only where a CPU estimate needs it

    from rlvr.cpu import dtype_unpackable

    return dtype_unpackable(getattr(torch, dtype)) is None


def _decode_kernels(shape: ModelShape) -> bool:
    """Whether lean decode runs on the compiled kernels here (:mod:`rlvr.cpu.kernels`: built, at
    most once per process, and with a kernel for this attention shape)."""
    from rlvr.cpu import decode_kernels  # torch: imported only where a CPU estimate needs it

    k = decode_kernels()
    return k is not None and k.supports(shape.num_attention_heads, shape.num_key_value_heads, shape.dim)


def _precision(cfg: Config, device: str) -> tuple[str, bool]:
    """(rollout dtype, autocast on) as training resolves ``auto``; a CUDA device is assumed to have bf16."""
    if cfg.rollout.dtype != "auto" and cfg.model.autocast_bf16 != Switch.AUTO:
        return cfg.rollout.dtype, cfg.model.autocast_bf16 == Switch.ON
    if device == "cuda":
        native = pays = True
    else:
        from rlvr.models.precision import cpu_bf16

        support = cpu_bf16()
        native, pays = support.native, support.trains_bf16
    rollout = cfg.rollout.dtype if cfg.rollout.dtype != "auto" else ("bfloat16" if native else "float32")
    autocast = cfg.model.autocast_bf16 == Switch.ON or (cfg.model.autocast_bf16 == Switch.AUTO and pays)
    return rollout, autocast


def static_decodes(cfg: Config, device: str) -> bool:
    """Whether the rollout decodes on the static cache, as ``HFRolloutEngine`` decides: ``rollout.static_decode``
    auto = on a CUDA device, true = anywhere; never with ``rollout.lean_decode=true``."""
    on = cfg.rollout.static_decode == Switch.ON or (cfg.rollout.static_decode == Switch.AUTO and device == "cuda")
    return on and cfg.rollout.lean_decode != Switch.ON


def lora_settings(cfg: Config) -> tuple[int, object]:
    """(rank, target_modules) of ``model.lora``; rank 0 = full fine-tuning (also before LoRA exists)."""
    lora = getattr(cfg.model, "lora", None)
    rank = int(getattr(lora, "rank", 0) or 0)
    return rank, getattr(lora, "target_modules", None)


def prompt_tokens(cfg: Config) -> tuple[int, str]:
    """The prompt length the estimate assumes, and why."""
    if cfg.data.max_prompt_tokens:
        return cfg.data.max_prompt_tokens, "data.max_prompt_tokens"
    n = DEFAULT_PROMPT_TOKENS[cfg.data.task]
    return n, f"assumed for data.task={cfg.data.task}; set data.max_prompt_tokens to bound it"


def autocast_weight_copies(
    shape: ModelShape, *, lora_params: int, passes: int, checkpointed: bool, sharded: bool = False
) -> int:
    """Bytes of the bf16 weight copies that bf16 autocast leaves alive through one micro-batch's backward.

    Autocast caches its cast of a float32 weight for the whole autocast block only when the weight
    requires grad. Full fine-tuning (``lora_params=0``): every weight once, N x 2 bytes, however
    many forward passes read it (the shared prompt's two) and under checkpointing too (the cache
    outlives the checkpointed layers).

    A frozen weight, LoRA's base, is not cached: each forward pass casts it again, and autograd
    saves the copy for the backward (the input's gradient needs it). Without checkpointing that is
    N x 2 per micro-batch for the one pass, and with the shared prompt (``passes=2``) the layers'
    projections once more: measured with SmolLM2-135M, micro-batch 8 of 126 + 48 tokens, bf16
    autocast (weight-shaped tensors that autograd saves): full fine-tuning 256.5 MiB = N x 2 with
    or without sharing; LoRA r16 266 MiB unshared and 468 MiB shared = N x 2 + 202.5 MiB of
    projections + the adapter. Under checkpointing the layers save no copy: the LM head's (vocab x
    hidden; measured 54 MiB of saved copies, the head's) stays, and one layer's projections while
    that layer is recomputed. The adapter's own weights require grad: cached once, ``lora_params`` x 2.

    Sharded (FSDP/HSDP, ``sharded``), the trainer turns autocast's cache off (``Trainer.autocast``):
    every weight is then cast at each use like a frozen one, so the rules for LoRA's base apply to
    the whole model.
    """
    N = shape.num_params()
    if not lora_params and not sharded:
        return N * 2
    projections = sum(i * o for i, o in shape.linear_shapes().values())  # of one layer
    if checkpointed:
        frozen = shape.vocab_size * shape.hidden_size + projections
    else:
        frozen = N + (passes - 1) * shape.num_hidden_layers * projections
    return (frozen + lora_params) * 2


def estimate(
    cfg: Config, shape: ModelShape, *, device: str | None = None, prompt: tuple[int, str] | None = None
) -> MemoryEstimate:
    """The itemised peak memory of training ``cfg`` on a model of ``shape``.

    Args:
        cfg: the run config (``auto`` precision is resolved as training would, for ``device``).
        shape: the model's shape (:func:`model_shape`).
        device: cpu or cuda; default from ``model.device``.
        prompt: (prompt length in tokens, where it comes from), e.g. the longest prompt of the data
            as the tokenizer renders it (:func:`data_prompt_tokens`); default :func:`prompt_tokens`.
    """
    device = device or _device_kind(cfg.model.device)
    rollout_dtype, autocast = _precision(cfg, device)
    w = BYTES[cfg.model.dtype]
    L, H, I, V = shape.num_hidden_layers, shape.hidden_size, shape.intermediate_size, shape.vocab_size
    N = shape.num_params()
    rank, targets = lora_settings(cfg)
    trainable = shape.lora_params(rank, targets) if rank else N
    Lp, why_prompt = prompt if prompt is not None else prompt_tokens(cfg)
    T, G = cfg.rollout.max_new_tokens, cfg.rollout.samples_per_prompt
    b = min(cfg.train.micro_batch(autocast), cfg.seqs_per_step // cfg.distributed.num_workers)  # >= all: one pass
    ckpt = cfg.model.gradient_checkpointing
    n = shard_count(cfg)  # FSDP: 1/n of each
    of = f", 1/{n} shard" if n > 1 else ""

    # the update of one micro-batch (see the module docstring)
    share = 1
    budget = cfg.train.micro_batch_tokens
    if budget:  # packed rows, each with its own prompt: a pass holds the budget (a longer row runs alone)
        tokens = max(budget, Lp + T)
        responses = tokens * T // (Lp + T)  # rows of the assumed shape; shorter prompts fit more responses
    else:
        # checkpointing runs the update per row; so does FSDP (the trainer turns the shared pass off)
        if cfg.train.shared_prompt_forward and not ckpt and n == 1:
            share = G if b % G == 0 else b if G % b == 0 else 1  # = models.forward.shared_prompt_group
        tokens, responses = (b // share) * Lp + b * T, b * T
    a = ACT_BYTES_AUTOCAST if autocast else ACT_BYTES_FP32
    per_token_layer = ACT_ELEMENTS_HIDDEN * H + ACT_ELEMENTS_INTERMEDIATE * I
    repeats = device != "cuda" or not budget  # packed rows on CUDA: sdpa's grouped-query kernels, no copies
    if not repeats:
        per_token_layer -= ACT_ELEMENTS_KV_COPIES * (H - shape.kv_dim)
    kv_copies = (1 if ckpt else L) * tokens * ACT_ELEMENTS_KV_COPIES * (H if repeats else shape.kv_dim) * a
    if ckpt:
        saved = L * tokens * H * 4 + tokens * per_token_layer * a
    else:
        saved = L * tokens * per_token_layer * a
        if share > 1:
            saved += L * b * Lp * 2 * (H + shape.kv_dim) * (2 if autocast else 4)
    if autocast:
        saved += autocast_weight_copies(
            shape,
            lora_params=trainable if rank else 0,
            passes=2 if share > 1 else 1,
            checkpointed=ckpt,
            sharded=cfg.distributed.backend == Backend.RAY and cfg.distributed.strategy.shards,
        )
    logits_bytes = 2 if autocast else 4
    if fused_head(shape):
        logits = fused_head_bytes(responses, V, H, autocast=autocast, head_trains=not rank)
    else:
        logits = responses * V * (2 * logits_bytes + 2 * 4)
        if budget:  # the log-probs run in chunks of the packed logits, whose gradients backward joins in one more
            logits += responses * V * logits_bytes
    factor = CPU_BACKWARD_FACTOR if device == "cpu" else BACKWARD_FACTOR
    activations = int(factor * (saved + logits))

    # generation: the training rollout, or the evaluation when it generates more rows at once
    rows = min(cfg.rollout.batch_seqs, cfg.seqs_per_step)
    eval_rows = min(cfg.rollout.batch_seqs, cfg.eval.batch_prompts * cfg.eval.samples)
    eval_T = cfg.eval.max_new_tokens or T
    kv_tokens = max(rows * (Lp + T), eval_rows * (Lp + eval_T))
    kv = 2 * L * shape.kv_dim * kv_tokens * BYTES[rollout_dtype]
    # the static decode keeps one cache for the run (fixed addresses for its CUDA graphs): resident, even
    # through the update; sized for whole groups of batch_seqs and the longest prompt + response of either
    static = static_decodes(cfg, device)
    static_rows = max(G, cfg.rollout.batch_seqs // G * G)
    new_tokens = max(T, eval_T)
    capacity = -(-(Lp + new_tokens) // STATIC_CAPACITY_MULTIPLE) * STATIC_CAPACITY_MULTIPLE
    static_kv = 2 * L * shape.kv_dim * static_rows * capacity * BYTES[rollout_dtype]
    static_kv += static_rows * (capacity + 8 * new_tokens)  # the bool attention mask (1 B), the int64 response
    # compiled on CUDA: the step's CUDA graphs keep a private pool as large as its transients (no KV copies:
    # rlvr.models.gqa_decode); the logits' float32 [rows, vocab] tensors dominate, one layer's activations besides
    graph_pool = static_rows * (GRAPH_POOL_VOCAB_TENSORS * V * 4 + 4 * (H + I) * BYTES[rollout_dtype])

    items = []
    if device == "cpu":
        items.append(
            Item("runtime", CPU_RUNTIME_BYTES, "resident", "Python, torch, transformers, tokenizer, prompts (measured)")
        )
    items.append(Item("parameters", N * w // n, "resident", f"{N:,} x {w} B ({cfg.model.dtype}){of}"))
    copy = rollout_dtype != cfg.model.dtype or n > 1  # FSDP: the engine keeps a whole copy, gathered per step
    items.append(
        Item(
            "rollout copy",
            N * BYTES[rollout_dtype] if copy else 0,
            "resident",
            f"whole {rollout_dtype} generation copy" if copy else f"none: rollout shares the {cfg.model.dtype} weights",
        )
    )
    # oneDNN-packed linear weights (rlvr.cpu.packed): the rollout model's; the policy's W and W^T for the update
    on = device == "cpu" and cfg.model.packed_weights != Switch.OFF
    linear = L * sum(i * o for i, o in shape.linear_shapes().values()) + V * H
    linear += shape.lora_params(rank, targets) if rank else 0
    copies = {rollout_dtype: 1} if on and _packs(rollout_dtype) else {}
    if (
        on and not autocast and n == 1 and _packed_update() and _packs(cfg.model.dtype)
    ):  # the update multiplies by packed W and W^T too
        copies[cfg.model.dtype] = copies.get(cfg.model.dtype, 0) + (1 if cfg.model.dtype == rollout_dtype else 2)
    packed = sum(linear * BYTES[d] * n for d, n in copies.items())
    how_packed = (
        (
            " + ".join(f"{n} {d} cop{'y' if n == 1 else 'ies'}" for d, n in copies.items())
            + " of the linear weights and LM head (model.packed_weights)"
        )
        if copies
        else ("none (model.packed_weights=false, not a CPU, or a dtype oneDNN cannot pack here)")
    )
    if on and cfg.rollout.lean_decode != Switch.OFF and rollout_dtype == "float32" and not rank:
        if _decode_kernels(shape):  # rollout.lean_decode's compiled products: every linear weight in their layout
            packed += linear * BYTES["float32"]
            how_packed += ", + all of them in the compiled decode kernels' layout (rollout.lean_decode)"
        else:  # q, k and v packed once more as one matrix
            shapes = shape.linear_shapes()
            packed += (
                L
                * sum(i * o for name, (i, o) in shapes.items() if name in ("q_proj", "k_proj", "v_proj"))
                * BYTES["float32"]
            )
            how_packed += ", + [q; k; v] for rollout.lean_decode"
    items.append(Item("packed weights", packed, "resident", how_packed))
    if rank:
        ref, how_ref = 0, "none: LoRA's reference is the base with the adapter off"
    elif cfg.algo.kl_coef > 0:
        from rlvr.models.precision import reference_dtype  # torch: imported only where a reference is estimated

        rd = reference_dtype(cfg.model.dtype, autocast)  # bf16 under autocast: it never trains
        ref = N * BYTES[rd] // n
        how_ref = f"a second copy in {rd} (algo.kl_coef={cfg.algo.kl_coef:g}){of}"
        how_ref += "; its root resharded after each pass" if n > 1 else ""
    else:
        ref, how_ref = 0, "none (algo.kl_coef=0)"
    items.append(Item("reference", ref, "resident", how_ref))
    what = f"LoRA rank {rank}: {trainable:,}" if rank else f"{trainable:,}"
    items.append(
        Item("AdamW state", 2 * trainable * w // n, "resident", f"2 moments x {what} trained params x {w} B{of}")
    )
    items.append(Item("gradients", trainable * w // n, "update", f"{what} trained params x {w} B{of}"))
    if n > 1:  # the root's weights (embeddings, head) stay gathered through a pass, one layer at a time besides
        g = 2 if autocast and device == "cuda" else w  # FSDP's bf16 mixed precision gathers bf16 on a GPU
        layer = sum(i * o for i, o in shape.linear_shapes().values())
        root = V * H * (1 if shape.tie_word_embeddings else 2)
        items.append(
            Item("FSDP gathers", (root + 2 * layer) * g, "update", f"embeddings/head + 2 decoder layers whole, {g} B")
        )
    items.append(
        Item(
            "activations",
            activations,
            "update",
            (
                f"micro-batch {tokens} tokens packed (rows of up to {Lp} prompt + {T} response)"
                if budget
                else f"micro-batch {b} seqs x ({Lp} prompt + {T} response) tokens"
            )
            + (", checkpointed" if ckpt else f", prompt shared by {share}" if share > 1 else "")
            + (", bf16 autocast" if autocast else ", fp32")
            + f"; log-probs {logits / GiB:.2f} GiB and keys/values"
            + (" repeated per query head " if repeats else " (grouped-query sdpa, unrepeated) ")
            + f"{kv_copies / GiB:.2f} GiB of it before x{factor}",
        )
    )
    if static:
        items.append(
            Item(
                "static KV cache",
                static_kv,
                "resident",
                f"{static_rows} rows x {capacity} positions ({Lp} prompt + {new_tokens} response, rounded up), "
                f"{rollout_dtype}, + mask and response; kept through the update (rollout.static_decode)",
            )
        )
        if device == "cuda":
            items.append(
                Item(
                    "CUDA-graph pool",
                    graph_pool,
                    "resident",
                    f"the compiled step's transients, {static_rows} rows: {GRAPH_POOL_VOCAB_TENSORS} float32 "
                    f"[rows, {V}] (logits, sampling) + one layer's activations; reserved for the run",
                )
            )
        items.append(Item("KV cache", 0, "rollout", "none besides the static KV cache"))
    else:
        items.append(
            Item(
                "KV cache",
                kv,
                "rollout",
                f"{max(rows, eval_rows)} rows x up to {Lp + new_tokens} tokens, {rollout_dtype}; freed for the update",
            )
        )
    notes = [f"prompt length {Lp} tokens: {why_prompt}"]
    if n > 1:
        notes.append(f"FSDP: with train.save_hf rank 0 writes its whole {rollout_dtype} rollout copy, no gather")
    if device == "cuda" and "auto" in (cfg.rollout.dtype, cfg.model.autocast_bf16.value):
        notes.append("precision auto read as a GPU with bf16")
    largest = shape.vocab_size * shape.hidden_size
    return MemoryEstimate(offloaded(cfg, device, items), device, N, trainable, notes, shards=n, largest=largest)


def offloaded(cfg: Config, device: str, items: list[Item]) -> list[Item]:
    """``items`` with a GPU worker's shards moved to host memory (FSDP2's CPUOffloadPolicy, pinned):
    the parameters, gradients and AdamW state under ``offload.params``, the reference under
    ``offload.reference``. The GPU keeps the layers being gathered (the ``FSDP gathers`` item, which
    the reference's passes gather no more than; a layer's unsharded gradient, until it is
    reduce-scattered and copied to the host, is not counted), the rollout copy and the activations."""
    if device != "cuda":
        return items
    moved = {"parameters": "offload.params", "gradients": "offload.params", "AdamW state": "offload.params"}
    moved = {k: v for k, v in moved.items() if cfg.offload.params}
    if cfg.offload.reference:
        moved["reference"] = "offload.reference"
    return [Item(i.name, i.bytes, "host", f"{i.how}; {moved[i.name]}") if i.name in moved else i for i in items]


def shard_count(cfg: Config) -> int:
    """Workers each weight, gradient and AdamW state is split over: every worker under FSDP, one
    node's under HSDP (its shards are replicated across nodes), none (1) under DDP."""
    d = cfg.distributed
    return {Strategy.FSDP: d.num_workers, Strategy.HSDP: d.workers_per_node}.get(d.strategy, 1)


def data_prompt_tokens(rows: list[dict]) -> tuple[int, str]:
    """(the longest rendered prompt of prepared rows, why): what the estimate should assume once the
    data has been read (the activations and KV cache peak at the longest prompt)."""
    longest = max((int(r["prompt_tokens"]) for r in rows), default=0)
    return longest, f"the longest of the {len(rows):,} training prompts, as the tokenizer renders them"


def estimate_config(cfg: Config, *, device: str | None = None) -> tuple[MemoryEstimate, str]:
    """:func:`estimate` for ``cfg.model.path`` (read as :func:`model_shape` reads it); also returns where the
    shape came from."""
    shape, source = model_shape(cfg.model.path)
    return estimate(cfg, shape, device=device), source
