"""The model shape the memory estimate needs, read from ``config.json`` alone (no weights load).

:class:`ModelShape` holds the numbers of a Llama/Qwen2-style decoder and counts its parameters
(embeddings, q/k/v/o, gate/up/down, norms, an untied LM head; Qwen2's q/k/v biases), exact for these
families (a test checks it against the instantiated model). :func:`model_shape` reads a model path as
training resolves it, and falls back on :data:`KNOWN_MODELS` (published configs) for a model that is
not here.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import UserError

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
