"""LoRA adapters through peft: add one to a base model, load a saved one, merge one into plain weights.

The trainer trains the Hugging Face model with LoRA layers injected (:class:`Adapted`'s ``model``):
the rollout engine, the log-probs and the update run on it exactly as on a full model. The peft
wrapper around it (``peft``) saves and loads the adapter (``adapter_config.json`` +
``adapter_model.safetensors``) and switches it off for the reference log-probs, so the reference is
the base weights themselves and no second copy is loaded. peft is imported only here, and only
when LoRA is on.
"""

from __future__ import annotations

import contextlib
import json
import warnings
from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import UserError
from rlvr.models import hub
from rlvr.models.loading import BUILTIN_MODELS, load_model, resolve_device, resolve_model_path

ADAPTER_CONFIG = "adapter_config.json"


def is_adapter_dir(path: Path) -> bool:
    """A LoRA checkpoint: an adapter without full weights of its own."""
    path = Path(path)
    return (path / ADAPTER_CONFIG).is_file() and not (path / "config.json").is_file()


def base_spec(spec: str) -> str:
    """What a checkpoint records as its base model: a built-in name or a hub id as is (a run's
    ``model.path`` pins a hub id to its commit, ``org/name@<commit>``), a path made absolute, so that
    eval/export find it from any working directory."""
    if spec in BUILTIN_MODELS or hub.parse_hub_id(spec) is not None:
        return spec
    return str(Path(spec).expanduser().resolve())


def _peft():
    try:
        import peft
    except ImportError:
        raise UserError("LoRA needs peft: run `pip install peft`") from None
    return peft


@contextlib.contextmanager
def _quiet():
    """peft asks transformers for ``is_gradient_checkpointing``, which transformers 5 warns is
    deprecated (a FutureWarning per call, nothing the user can act on)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*gradient_checkpointing.*deprecated", category=FutureWarning)
        yield


@dataclass
class Adapted:
    """A base model with a LoRA adapter: ``model`` to run and train, ``peft`` to save and disable it."""

    model: object
    """The Hugging Face model with LoRA layers in it; only the adapter's parameters require grad."""
    peft: object
    """The ``peft.PeftModel`` around ``model``: ``save_pretrained``, ``disable_adapter``."""

    def save_pretrained(self, path, **kwargs) -> None:
        """adapter_config.json + adapter_model.safetensors (peft also writes a stub model card: dropped).

        The embeddings never train, so peft is told not to save them; left to decide, it would look the
        recorded base up (on the Hub, for a built-in name) to see whether the vocabulary changed."""
        self.peft.save_pretrained(str(path), save_embedding_layers=False, **kwargs)
        (Path(path) / "README.md").unlink(missing_ok=True)

    def disabled(self):
        """A block in which ``model`` computes the base model's outputs (adapter off), bit for bit."""
        return self.peft.disable_adapter()


def add_adapter(model, *, rank: int, alpha: float, dropout: float, target_modules: list[str], base: str) -> Adapted:
    """Wrap ``model`` in a fresh LoRA adapter (A random, B = 0: outputs equal the base model's).

    Args:
        base: the base model spec the adapter records (``adapter_config.json``'s
            ``base_model_name_or_path``), see :func:`base_spec`. A hub id's revision goes to peft's
            own ``revision`` field, so that peft and other tools read ``org/name`` as the hub id it is.
    """
    peft = _peft()
    targets = list(target_modules)
    config = peft.LoraConfig(
        r=rank,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules="all-linear" if targets == ["all-linear"] else targets,  # peft takes it as a string
        bias="none",
        task_type="CAUSAL_LM",
    )
    try:
        with _quiet():
            wrapped = peft.get_peft_model(model, config)
    except ValueError as e:
        raise UserError(
            f"model.lora.target_modules={list(target_modules)}: {str(e).splitlines()[0]} "
            "(name the model's linear layers, e.g. q_proj, v_proj)"
        ) from None
    remote = hub.parse_hub_id(base)
    saved = wrapped.peft_config["default"]
    saved.base_model_name_or_path = base if remote is None else remote.repo_id
    saved.revision = None if remote is None else remote.revision
    return Adapted(wrapped.get_base_model(), wrapped)


def saved_settings(adapter_dir: Path) -> dict:
    """rank, alpha, dropout and target_modules (sorted) of a saved adapter, as ``model.lora`` names them."""
    saved = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    targets = saved.get("target_modules") or []
    return {
        "rank": saved.get("r"),
        "alpha": saved.get("lora_alpha"),
        "dropout": saved.get("lora_dropout"),
        "target_modules": sorted([targets] if isinstance(targets, str) else targets),
    }


def load_adapter(
    model, adapter_dir: Path, *, rank: int, alpha: float, dropout: float, target_modules: list[str]
) -> Adapted:
    """``model`` (the base) with the adapter saved in ``adapter_dir``, trainable (a resumed run).

    Raises:
        UserError: the saved adapter's settings are not the given ones (a resume that changed ``model.lora``).
    """
    want = {"rank": rank, "alpha": alpha, "dropout": dropout, "target_modules": sorted(target_modules)}
    saved = saved_settings(adapter_dir)
    if want["target_modules"] == ["all-linear"]:  # peft saves the layers all-linear named, not the words
        want["target_modules"] = saved["target_modules"]
    changed = [f"model.lora.{k}={want[k]} (saved: {saved[k]})" for k in want if saved[k] != want[k]]
    if changed:
        raise UserError(
            f"{adapter_dir} holds an adapter with other settings: {', '.join(changed)}; resume with the saved ones"
        )
    peft = _peft()
    with _quiet():
        wrapped = peft.PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=True)
    return Adapted(wrapped.get_base_model(), wrapped)


def adapter_base(adapter_dir: Path, fallback: str | None = None) -> Path:
    """The local HF directory of an adapter's base model: the one ``adapter_config.json`` records,
    else ``fallback`` (the run's ``model.path``); built-in names resolve to their converted copy, hub
    ids (at the recorded ``revision``) to their snapshot in the Hugging Face cache."""
    saved = json.loads((Path(adapter_dir) / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    recorded, revision = saved.get("base_model_name_or_path"), saved.get("revision")
    if recorded and revision and hub.parse_hub_id(recorded) is not None and "@" not in recorded:
        recorded = f"{recorded}@{revision}"
    tried = []
    for spec in (recorded, fallback):
        if not spec or spec in tried:
            continue
        tried.append(spec)
        if spec in BUILTIN_MODELS or Path(spec).expanduser().exists() or hub.parse_hub_id(spec) is not None:
            return resolve_model_path(spec)
    raise UserError(
        f"LoRA checkpoint {adapter_dir}: its base model ({' or '.join(tried) or 'none recorded'}) is not found; "
        f"put it back at that path, or set base_model_name_or_path in {Path(adapter_dir) / ADAPTER_CONFIG}"
    )


def load_merged(adapter_dir: Path, *, base: Path, dtype: str = "float32", device: str = "cpu"):
    """A plain model: the base weights with the adapter merged in (``merge_and_unload``)."""
    peft = _peft()
    model = load_model(base, dtype=dtype, device="cpu")
    try:
        with _quiet():
            merged = peft.PeftModel.from_pretrained(model, str(adapter_dir)).merge_and_unload()
    except (OSError, ValueError, KeyError) as e:
        raise UserError(f"could not load LoRA checkpoint {adapter_dir}: {str(e).splitlines()[0]}") from None
    return merged.to(resolve_device(device))
