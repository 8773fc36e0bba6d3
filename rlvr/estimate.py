"""Memory estimate of a run from the model's ``config.json`` and the run config; no weights load.

``rlvr estimate`` prints it, and the trainer prints it before training and the measured peak
beside it at the end. Every item is a formula over the model shape and the config, in bytes:

- **parameters**: N × bytes(``model.dtype``). N is counted from the config (Llama/Qwen2-style
  decoder: embeddings, q/k/v/o, gate/up/down, norms, an untied LM head; Qwen2's q/k/v biases),
  exact for these families (a test checks it against the instantiated model).
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
  All of this × 1.4 for backward's temporary buffers and the allocator's slack.
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

Besides the training peak, :func:`load_memory` gives one process's peak while the models load
(the whole policy, the rollout copy built in its dtype, the reference; under FSDP the larger of the
whole policy with the copy before sharding and the shards with the whole reference) and the host RAM
of a node: a GPU worker reads the whole policy in ``model.dtype`` into host memory before moving it,
and under FSDP a background checkpoint stages its shards there (``distributed.async_save``).

The peak is the resident items (runtime, parameters, rollout copy, reference, AdamW, the static KV
cache) plus the larger of the update (gradients + activations) and the rollout (KV cache).

Calibration (README "Memory estimate"): the factors 9/4, 3.3 and 4 bytes were read off the
tensors autograd saves for SmolLM2-135M (``benchmarks/memory_estimate.py``); 1.4 and the
0.7 GiB CPU runtime from the quickstart's peak RSS on this project's 2-core CPU.

On CUDA the total is what ``torch.cuda.max_memory_allocated`` counts: the CUDA context (about
0.5 GiB) and the host process come on top.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from rlvr.choices import Backend, Strategy
from rlvr.config import Config, Switch
from rlvr.errors import UserError

GiB = 2**30
MiB = 2**20
BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}

CPU_RUNTIME_BYTES = int(0.7 * GiB)
"""Python + torch + transformers + tokenizer + prepared prompts, measured on the quickstart:
1,462 MiB RSS after setup minus the 772 MiB of fp32 weights and their bf16 rollout copy."""
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
"""Activations x this = their peak during backward (gradient buffers, allocator slack); quickstart-calibrated."""
DEFAULT_PROMPT_TOKENS = {"arithmetic": 128, "countdown": 160, "files": 512}
"""Assumed rendered prompt length when ``data.max_prompt_tokens`` is 0 (the r1 template's
system prompt makes a built-in task's prompt ~126 tokens with SmolLM2's tokenizer)."""
STATIC_CAPACITY_MULTIPLE = 256
"""The static decode rounds its cache's positions up to a multiple of this (:mod:`rlvr.rollout.static`)."""
ALL_LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True)
class ModelShape:
    """The numbers of a Llama/Qwen2-style decoder that the estimate needs (config.json names)."""

    num_hidden_layers: int
    hidden_size: int
    intermediate_size: int
    num_attention_heads: int
    num_key_value_heads: int
    vocab_size: int
    tie_word_embeddings: bool = True
    head_dim: int = 0
    """0 = hidden_size // num_attention_heads."""
    qkv_bias: bool = False
    """Biases on q/k/v (Qwen2) or on q/k/v/o (Llama's attention_bias)."""
    o_bias: bool = False
    mlp_bias: bool = False
    model_type: str = "llama"
    """config.json's ``model_type``: whether the update's log-probs take the fused LM head
    (:data:`rlvr.models.forward.FUSED_HEAD_MODEL_TYPES`) or the full logits."""

    @property
    def dim(self) -> int:
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def kv_dim(self) -> int:
        return self.num_key_value_heads * self.dim

    def linear_shapes(self) -> dict[str, tuple[int, int]]:
        """(in, out) features of each projection of one layer."""
        H, I, q = self.hidden_size, self.intermediate_size, self.num_attention_heads * self.dim
        return {
            "q_proj": (H, q),
            "k_proj": (H, self.kv_dim),
            "v_proj": (H, self.kv_dim),
            "o_proj": (q, H),
            "gate_proj": (H, I),
            "up_proj": (H, I),
            "down_proj": (I, H),
        }

    def num_params(self) -> int:
        """Every parameter: embeddings (+ untied LM head), per layer projections, biases and two norms,
        the final norm."""
        H, shapes = self.hidden_size, self.linear_shapes()
        layer = sum(i * o for i, o in shapes.values()) + 2 * H
        if self.qkv_bias:
            layer += shapes["q_proj"][1] + 2 * self.kv_dim
        if self.o_bias:
            layer += H
        if self.mlp_bias:
            layer += 2 * self.intermediate_size + H
        embed = self.vocab_size * H * (1 if self.tie_word_embeddings else 2)
        return embed + self.num_hidden_layers * layer + H

    def lora_params(self, rank: int, targets) -> int:
        """Adapter parameters: rank x (in + out) per targeted projection per layer."""
        names = ALL_LINEAR if targets in ("all-linear", ["all-linear"], None) else targets
        shapes = self.linear_shapes()
        unknown = [t for t in names if t not in shapes]
        if unknown:
            raise UserError(
                f"model.lora.target_modules={list(names)}: rlvr estimate knows {', '.join(ALL_LINEAR)} (or all-linear)"
            )
        return self.num_hidden_layers * sum(rank * sum(shapes[t]) for t in names)


# Published config.json values, for `rlvr estimate` when the model directory is not here.
KNOWN_MODELS: dict[str, ModelShape] = {
    "Qwen/Qwen2.5-0.5B": ModelShape(
        24, 896, 4864, 14, 2, 151936, tie_word_embeddings=True, qkv_bias=True, model_type="qwen2"
    ),
    "Qwen/Qwen2.5-1.5B": ModelShape(
        28, 1536, 8960, 12, 2, 151936, tie_word_embeddings=True, qkv_bias=True, model_type="qwen2"
    ),
    "Qwen/Qwen2.5-7B": ModelShape(
        28, 3584, 18944, 28, 4, 152064, tie_word_embeddings=False, qkv_bias=True, model_type="qwen2"
    ),
}


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


def shape_from_config(data: dict, where: str) -> ModelShape:
    """A :class:`ModelShape` from a config.json mapping; one-line error when keys are missing."""
    need = ["num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads", "vocab_size"]
    missing = [k for k in need if not isinstance(data.get(k), int)]
    if missing:
        raise UserError(
            f"{where} has no {', '.join(missing)} (model_type {data.get('model_type')}); "
            "rlvr estimate reads Llama/Qwen2/Mistral-style decoder configs"
        )
    qwen2 = data.get("model_type") == "qwen2"
    attn_bias = bool(data.get("attention_bias", False))
    return ModelShape(
        num_hidden_layers=data["num_hidden_layers"],
        hidden_size=data["hidden_size"],
        intermediate_size=data["intermediate_size"],
        num_attention_heads=data["num_attention_heads"],
        num_key_value_heads=data.get("num_key_value_heads") or data["num_attention_heads"],
        vocab_size=data["vocab_size"],
        tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),  # Llama/Qwen2/Mistral's default
        head_dim=data.get("head_dim") or 0,
        qkv_bias=qwen2 or attn_bias,
        o_bias=attn_bias,
        mlp_bias=bool(data.get("mlp_bias", False)),
        model_type=str(data.get("model_type") or "llama"),
    )


def _known(spec: str) -> tuple[str, ModelShape] | None:
    """The table entry whose name (or its last part) matches the spec's last part, -Instruct ignored."""
    want = Path(spec).name.lower().removesuffix("-instruct")
    for name, shape in KNOWN_MODELS.items():
        if want in (name.lower(), name.split("/")[-1].lower()):
            return name, shape
    return None


def model_shape(spec: str) -> tuple[ModelShape, str]:
    """The shape of ``model.path`` and where it came from; reads config.json only.

    A built-in name or a .gguf resolves as training does (converted into the cache once); a
    directory needs only its config.json; a hub id (``org/name[@revision]``) fetches its config.json
    alone (or reads it from the Hugging Face cache). A spec found neither here nor on the hub is
    looked up in :data:`KNOWN_MODELS` by its last part (``models/Qwen2.5-7B`` -> ``Qwen/Qwen2.5-7B``),
    so a preset is estimated on a machine without its model or a network."""
    from rlvr.models import hub
    from rlvr.models.loading import BUILTIN_MODELS, resolve_model_path

    path = Path(spec).expanduser()
    remote = hub.parse_hub_id(spec)
    if remote is not None:
        try:
            config_file = hub.config_file(remote, f"model.path={spec}")
        except UserError as e:
            known = _known(remote.repo_id)
            if known is None:
                raise UserError(f"{e}; and it is not a known architecture ({', '.join(KNOWN_MODELS)})") from None
            return known[1], f"the published config of {known[0]} ({spec}: no config.json here or from the hub)"
    elif spec not in BUILTIN_MODELS and path.suffix != ".gguf" and not path.exists():
        known = _known(spec)
        if known is None:
            raise UserError(
                f"model.path={spec} not found, and not a known architecture ({', '.join(KNOWN_MODELS)}); "
                "give a model directory (config.json alone is enough), a hub id, a .gguf file or a built-in name"
            )
        return known[1], f"the published config of {known[0]} ({spec} is not here)"
    else:
        config_file = resolve_model_path(spec) / "config.json"
    try:
        data = json.loads(config_file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise UserError(f"{config_file} could not be read as JSON ({e})") from None
    if not isinstance(data, dict):
        raise UserError(f"{config_file} is not a JSON object")
    return shape_from_config(data, str(config_file)), str(config_file)


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
    holds whole at a time beside the shards (:func:`load_memory`)."""

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
    activations = int(BACKWARD_FACTOR * (saved + logits))

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
            + f"{kv_copies / GiB:.2f} GiB of it before x{BACKWARD_FACTOR}",
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


REDUCE = {
    "activations": "train.micro_batch_seqs or train.micro_batch_tokens (smaller) or model.gradient_checkpointing=true",
    "KV cache": "rollout.batch_seqs or rollout.max_new_tokens (smaller)",
    "static KV cache": "rollout.batch_seqs or rollout.max_new_tokens (smaller); it stays allocated through the update "
    "(rollout.static_decode=false decodes dynamically and frees it, at the cost of the compiled step)",
    "CUDA-graph pool": "rollout.batch_seqs (smaller), or rollout.static_decode=false (no compiled step)",
    "AdamW state": "model.lora.rank (LoRA), or offload.params=true and offload.optimizer=true (FSDP on GPUs)",
    "gradients": "model.lora.rank (LoRA)",
    "parameters": "model.lora.rank (LoRA) with a bfloat16 model.dtype",
    "reference": "offload.reference=true (FSDP on GPUs) or algo.kl_coef=0",
    "rollout copy": "rollout.dtype=model.dtype (no copy)",
    "packed weights": "model.packed_weights=false",
}
"""For each estimate item, the config keys that make it smaller."""


def memory_check(est: MemoryEstimate, free_bytes: int, where: str) -> None:
    """UserError when the estimate exceeds the free memory of the device (``where`` names it), with the
    keys that reduce the two largest items; ``train.skip_memory_check=true`` is the way past it."""
    if est.total <= free_bytes:
        return
    raise UserError(
        f"this run needs about {est.total / GiB:.1f} GiB but {where} has {free_bytes / GiB:.1f} GiB free; reduce it "
        f"({_largest_reducible(est)}), or set train.skip_memory_check=true to start anyway"
    )


def ram_warning(est: MemoryEstimate, available_bytes: int | None) -> str | None:
    """A CPU run's warning line when the estimate exceeds the RAM the machine has available, with the
    keys that reduce the two largest items; None when it fits or the RAM is unknown. A warning, not
    the GPU's refusal: on a CPU the estimate is an upper bound (every row at
    ``rollout.max_new_tokens``), and a run past it swaps before it fails."""
    if available_bytes is None or est.total <= available_bytes:
        return None
    return (
        f"warning: this run may need up to {est.total / GiB:.1f} GiB but the machine has "
        f"{available_bytes / GiB:.1f} GiB of RAM available; if it swaps, reduce it ({_largest_reducible(est)})"
    )


def available_ram() -> int | None:
    """Bytes of RAM available to a new process (Linux ``MemAvailable``), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _largest_reducible(est: MemoryEstimate) -> str:
    """The two largest items on the device with the config keys that make each smaller."""
    on_device = (i for i in est.items if i.name in REDUCE and i.bytes and i.phase != "host")
    largest = sorted(on_device, key=lambda i: -i.bytes)[:2]
    return "; ".join(f"{i.name} {i.bytes / GiB:.1f} GiB: {REDUCE[i.name]}" for i in largest)


def estimate_config(cfg: Config, *, device: str | None = None) -> tuple[MemoryEstimate, str]:
    """:func:`estimate` for ``cfg.model.path`` (read as :func:`model_shape` reads it); also returns where the
    shape came from."""
    shape, source = model_shape(cfg.model.path)
    return estimate(cfg, shape, device=device), source


def measured_beside_estimate(peak: dict[str, float], est: MemoryEstimate) -> str:
    """The trainer's last memory line: the measured peak (``peak_memory``'s MiB keys) beside the estimate."""
    from rlvr import metric_names as M

    key, what = (
        (M.CUDA_MAX_ALLOCATED_MIB, "torch.cuda.max_memory_allocated")
        if est.device == "cuda"
        else (M.PEAK_RSS_MIB, "RSS")
    )
    if key not in peak:
        return f"memory: estimated {est.total / GiB:.2f} GiB; the peak was not measured here"
    measured = peak[key] * MiB
    return (
        f"memory: measured peak {measured / GiB:.2f} GiB ({what}) beside the estimate {est.total / GiB:.2f} GiB "
        f"(estimate {100 * (est.total / measured - 1):+.0f} %)"
    )


GPU_HOST_RUNTIME_BYTES = 2 * GiB
"""Assumed, not measured: a GPU worker's host memory besides the weights it reads (Python, torch, the
CUDA and NCCL libraries' host side, tokenizer, prompts); the CPU figure is :data:`CPU_RUNTIME_BYTES`."""
GPUS_PER_NODE = 8
"""Assumed GPUs per node, for how many GPU workers share a node's host RAM."""


@dataclass(frozen=True)
class LoadMemory:
    """What a run needs while its models load, on the device and in host RAM (:func:`load_memory`)."""

    device_peak: int
    """The largest device memory of a worker while the models load (on a CPU: with the runtime)."""
    device_how: str
    host_worker: int
    """Rank 0's host RAM at its peak: the load (rank 0 reads the weights into host memory; unsharded,
    every worker does), or a checkpoint staged for the background write (FSDP); on a CPU the larger of
    that and the training peak."""
    host_how: str
    workers_per_node: int
    host_node: int
    """Rank 0's host RAM, ``workers_per_node - 1`` others', and rank 0's Hugging Face weights while it
    writes them: each process at its own peak, an upper bound."""
    device: str
    hf_write: int = 0
    """Rank 0's Hugging Face weights in host memory while it writes them (FSDP with ``train.save_hf``)."""
    host_other: int = -1
    """Another worker's host RAM at its peak (sharded: it reads no weights); -1 = :attr:`host_worker`."""
    host_other_how: str = ""

    @property
    def others(self) -> int:
        return self.host_worker if self.host_other < 0 else self.host_other

    def lines(self) -> list[str]:
        where = "GPU" if self.device == "cuda" else "RAM"
        k = self.workers_per_node
        sharded = self.host_other >= 0
        out = [f"  {'load peak':17s} {self.device_peak / GiB:8.2f} GiB  one process's {where}: {self.device_how}"]
        if sharded:
            out.append(f"  {'host RAM rank 0':17s} {self.host_worker / GiB:8.2f} GiB  {self.host_how}")
            out.append(f"  {'host RAM others':17s} {self.host_other / GiB:8.2f} GiB  each: {self.host_other_how}")
        else:
            out.append(f"  {'host RAM':17s} {self.host_worker / GiB:8.2f} GiB  one process: {self.host_how}")
        who = f"rank 0 + {k - 1} other{'s' if k > 2 else ''}" if sharded and k > 1 else f"{k} process{'es' * (k > 1)}"
        out.append(
            f"  {'host RAM / node':17s} {self.host_node / GiB:8.2f} GiB  {who} on a node"
            + (f" (of {GPUS_PER_NODE} GPUs, assumed)" if self.device == "cuda" else "")
            + (f", + rank 0's Hugging Face weights {self.hf_write / GiB:.2f} as it writes" if self.hf_write else "")
        )
        return out


def load_memory(cfg: Config, est: MemoryEstimate) -> LoadMemory:
    """The load-time peak of one worker and the host RAM of a node, from the estimate's items.

    Loading, as the trainer does it. Unsharded: every worker reads the whole policy in ``model.dtype``
    into host memory (``from_pretrained``) and moves it to its device; the rollout copy is then built in
    ``rollout.dtype`` directly (no second full-precision copy), and the reference read whole.

    Sharded (FSDP/HSDP, :meth:`~rlvr.distributed.fsdp.ShardedGroup.shard_loaded`): global rank 0 alone
    reads the whole policy in ``model.dtype`` into its host memory, then the reference in its dtype, one
    after the other; every rank builds them on the meta device, allocates its shards (in host memory
    when offloaded) and receives rank 0's weights one tensor at a time, so a device holds its shards
    plus one whole tensor (at most the embeddings) in ``model.dtype``; the whole rollout copy is then
    allocated and filled from the shards, one all-gathered tensor at a time. Rank 0's host peak is the
    larger of the models it reads (beside any offloaded shards) and, with ``distributed.async_save``,
    the copy of its shards that a background checkpoint stages; another worker's is its runtime, its
    offloaded shards and that staged copy. With ``train.save_hf`` rank 0 also holds the Hugging Face
    weights it writes. A node's host RAM is rank 0's + ``workers_per_node - 1`` others' (+ that write),
    each at its own peak."""
    n, N = est.shards, est.params
    item = {i.name: i.bytes for i in est.items}
    on_device = {i.name: i.bytes for i in est.items if i.phase != "host"}
    policy = N * BYTES[cfg.model.dtype]
    copy, ref = item["rollout copy"], item["reference"] * n  # whole: FSDP's items are 1/n
    gb = lambda b: f"{b / GiB:.2f}"  # noqa: E731
    read = max(policy, ref)  # unsharded: by every worker; sharded: by rank 0 alone, one model at a time
    if n > 1:
        shards = on_device.get("parameters", 0) + on_device.get("reference", 0)
        tensor = est.largest * BYTES[cfg.model.dtype]
        device_peak = shards + copy + tensor
        device_how = (
            f"policy + reference shards {gb(shards)} + the whole rollout copy {gb(copy)}, filled from them "
            f"one whole {cfg.model.dtype} tensor at a time ({gb(tensor)})"
        )
    else:
        device_peak = policy + copy + ref
        device_how = f"policy {gb(policy)} + rollout copy {gb(copy)} + reference {gb(ref)}"
    d = cfg.distributed
    staged = 0
    if n > 1 and d.async_save:  # each worker's shards of the policy, AdamW (and a moving reference), in host memory
        staged = item["parameters"] + item["AdamW state"] + (item["reference"] if cfg.algo.ref_sync_every else 0)
    want_hf = cfg.train.save_hf.as_bool()
    hf = (
        copy if n > 1 and (want_hf if want_hf is not None else N < 3_000_000_000) else 0
    )  # checkpoint.SAVE_HF_BELOW_PARAMS
    checkpoint = f"the shards a background checkpoint stages ({gb(staged)})"
    host_other, other_how = -1, ""
    if est.device == "cpu":  # the device is the host
        if n > 1:  # rank 0 reads a whole model beside its shards; the others hold their shards and the copy
            other, first = device_peak + CPU_RUNTIME_BYTES, shards + read + CPU_RUNTIME_BYTES
            device_peak = max(other, first)
            device_how = (
                f"rank 0: its shards {gb(shards)} + the whole {cfg.model.dtype} model it reads ({gb(read)})"
                if first >= other
                else device_how
            ) + " + runtime"
            host_other = max(est.total, other) + staged
            other_how = "the training peak above (the device is the host)" + (
                f" + {gb(staged)} staged for a background checkpoint" if staged else ""
            )
        else:
            device_peak += CPU_RUNTIME_BYTES
            device_how += " + runtime"
        host_worker = max(est.total, device_peak) + staged
        host_how = "the training peak above (the device is the host)" + (
            f" + {gb(staged)} staged for a background checkpoint" if staged else ""
        )
    else:
        runtime = f"~{gb(GPU_HOST_RUNTIME_BYTES)} runtime (assumed)"
        offload = f" + the offloaded shards ({gb(est.host)})" if est.host else ""
        host_worker = GPU_HOST_RUNTIME_BYTES + est.host + max(read, staged)  # offloaded shards: allocated at load
        whole = f"the whole {cfg.model.dtype} policy" + (" or reference" if ref > policy else "")
        host_how = (
            f"{runtime}{offload} + the larger of {whole} it reads ({gb(read)})"
            + (f" and {checkpoint}" if staged else "")
            + ("" if n > 1 else ", before it moves to the GPU")
        )
        if n > 1:
            host_other = GPU_HOST_RUNTIME_BYTES + est.host + staged
            other_how = f"{runtime}{offload}" + (f" + {checkpoint}" if staged else "") + "; it reads no weights"
    if d.backend == Backend.NONE:
        per_node = 1
    elif d.strategy == Strategy.HSDP:
        per_node = d.workers_per_node  # one shard group per node, as its placement group packs it
    elif d.gpus_per_worker > 0:
        per_node = max(1, min(d.num_workers, int(GPUS_PER_NODE // d.gpus_per_worker)))
    else:
        per_node = d.num_workers  # CPU workers: as `distributed.address=local` places them, on one node
    others = host_worker if host_other < 0 else host_other
    return LoadMemory(
        device_peak, device_how, host_worker, host_how, per_node, host_worker + (per_node - 1) * others + hf,
        est.device, hf, host_other, other_how,
    )  # fmt: skip
