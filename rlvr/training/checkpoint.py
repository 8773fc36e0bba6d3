"""Atomic checkpoints: Hugging Face model directories plus the trainer state beside the weights.

Where they go (``RUN/checkpoints/step_000020``, ``RUN/checkpoints/last``) and how they are found
again is :class:`rlvr.run_dir.RunDir`'s. Here: a checkpoint is written under a temporary name
and renamed, and ``last`` is swapped with an atomic rename, so a crash at any moment leaves the
previous checkpoint intact.
"""

from __future__ import annotations

import ctypes
import errno
import os
import random
import re
import shutil
from pathlib import Path

import torch
from safetensors import safe_open

from rlvr.errors import UserError
from rlvr.models import loading
from rlvr.run_dir import STATE_FILE, RunDir, remove_path, step_name

SHARDED_DIR = loading.SHARDED_DIR
"""The folder of an FSDP checkpoint that holds the sharded state (policy, AdamW, a moved reference),
a ``torch.distributed.checkpoint`` directory."""

SAVE_HF_BELOW_PARAMS = 3_000_000_000
"""``train.save_hf=auto`` gathers a whole Hugging Face copy into FSDP checkpoints below this size."""


def is_sharded(ckpt: Path) -> bool:
    """Whether a checkpoint was saved by an FSDP run (it holds the sharded state)."""
    return (Path(ckpt) / SHARDED_DIR).is_dir()


def save_hf(setting, model) -> bool:
    """Whether an FSDP checkpoint also holds a Hugging Face model: ``train.save_hf`` (a Switch),
    ``auto`` for models under :data:`SAVE_HF_BELOW_PARAMS` parameters."""
    want = setting.as_bool()
    return want if want is not None else sum(p.numel() for p in model.parameters()) < SAVE_HF_BELOW_PARAMS


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux ``renameat2(RENAME_EXCHANGE)``); False where unsupported."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
        return False
    raise OSError(err, os.strerror(err), str(a))


def remove_stale(run_dir: Path) -> list[str]:
    """Delete the temporary checkpoint files a killed process left (``.step_*.tmp-PID``,
    ``.step_*.old-PID``, ``.last.tmp-PID``); returns their names. Call before a run writes."""
    root = RunDir(run_dir).checkpoints_root
    if not root.is_dir():
        return []
    stale = [p for p in root.iterdir() if re.match(r"^\.(step_\d+\.(tmp|old)|last\.tmp)-\d+$", p.name)]
    for p in stale:
        remove_path(p)
    return sorted(p.name for p in stale)


def staging_dir(run_dir: Path, step: int) -> Path:
    """A new, empty temporary folder for the checkpoint of ``step`` (``.step_N.tmp-PID``): a checkpoint
    is written there, then renamed into place by :func:`save_checkpoint`."""
    root = RunDir(run_dir).checkpoints_root
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{step_name(step)}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    return tmp


def save_checkpoint(
    run_dir: Path,
    step: int,
    model,
    tokenizer,
    trainer_state: dict,
    *,
    keep: int = 0,
    tmp: Path | None = None,
    state_dict: dict | None = None,
    weights: bool = True,
    commit: bool = True,
) -> Path:
    """Write ``RUN/checkpoints/step_{step}`` atomically, point ``last`` at it, prune old ones.

    Args:
        model: what has ``save_pretrained``: a Hugging Face model, or a LoRA adapter
            (:class:`rlvr.models.lora.Adapted`, which writes the adapter alone).
        keep: keep this many newest step checkpoints (0 = all).
        tmp: a :func:`staging_dir` that already holds, or will hold, part of the checkpoint (an FSDP
            run's shards); default a new one.
        state_dict: the weights to write instead of ``model``'s own.
        weights: False writes the model's config and no weights (an FSDP run without ``train.save_hf``).
        commit: False leaves the files in ``tmp`` and returns it; :func:`commit_checkpoint` renames it
            into place once the rest is written (an FSDP run's shards, in the background).
    """
    run = RunDir(run_dir)
    root = run.checkpoints_root
    name = step_name(step)
    final = run.checkpoint_dir(step)
    tmp = tmp or staging_dir(run_dir, step)
    try:
        if weights:
            extra = {} if state_dict is None else {"state_dict": state_dict}
            model.save_pretrained(tmp, safe_serialization=True, **extra)
        else:
            model.config.save_pretrained(tmp)
            if getattr(model, "generation_config", None) is not None:
                model.generation_config.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        torch.save(trainer_state, tmp / STATE_FILE)
        for f in tmp.rglob("*"):
            if f.is_file():
                with open(f, "rb") as fh:
                    os.fsync(fh.fileno())
    except OSError as e:  # a full disk or quota: the half-written copy goes, the previous checkpoint stays
        shutil.rmtree(tmp, ignore_errors=True)
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        kept = run.last_link.resolve().name if run.last_link.is_dir() else "none yet"
        raise UserError(
            f"no space left on the device of {root} while writing {name} (last complete checkpoint: {kept}); "
            f"free space there, then continue with resume={run.path}"
        ) from None
    if not commit:
        return tmp
    commit_checkpoint(run_dir, step, tmp, keep)
    return final


def commit_checkpoint(run_dir: Path, step: int, tmp: Path, keep: int = 0) -> Path:
    """Renames a whole checkpoint ``tmp`` into place as ``step_{step}``, swaps ``last`` to it and
    prunes the old ones (all but ``keep``, 0 = none); returns where it now is."""
    run = RunDir(run_dir)
    root, name, final = run.checkpoints_root, step_name(step), run.checkpoint_dir(step)
    if final.exists():  # the same step saved again: swap, so that `last` never points nowhere
        if _exchange(tmp, final):
            shutil.rmtree(tmp)  # now the old content
        else:  # no atomic swap here (not Linux, or the filesystem lacks it): a rename window remains
            old = root / f".{name}.old-{os.getpid()}"
            os.replace(final, old)
            os.replace(tmp, final)
            shutil.rmtree(old)
    else:
        os.replace(tmp, final)
    link_tmp = root / f".last.tmp-{os.getpid()}"
    if link_tmp.is_symlink() or link_tmp.exists():
        link_tmp.unlink()
    os.symlink(name, link_tmp)
    os.replace(link_tmp, run.last_link)
    _fsync_dir(root)
    if keep:
        for old in run.checkpoints()[:-keep]:
            shutil.rmtree(old)
    return final


def checkpoint_bytes(model_path: Path, dtype: str = "float32", *, lora_rank: int = 0, lora_targets=()) -> int:
    """About how many bytes one checkpoint of this model takes: the weights in ``dtype`` plus AdamW's
    two moment tensors of the same size (tokenizer and config files are small). Parameters are
    counted from the safetensors headers, without loading the weights; other formats by file size.
    With ``lora_rank`` only the adapter is saved: r * (in + out) float32 parameters per weight
    matrix of a ``lora_targets`` layer."""
    per = 4 if lora_rank else 2 if dtype in ("bfloat16", "float16") else 4
    params = 0
    for f in Path(model_path).glob("*.safetensors"):
        with safe_open(str(f), framework="pt") as st:
            for key in st.keys():
                shape = st.get_slice(key).get_shape()
                if lora_rank:
                    layer = key.rsplit(".", 2)[-2] if key.endswith(".weight") else ""
                    params += lora_rank * sum(shape) if len(shape) == 2 and layer in lora_targets else 0
                    continue
                n = 1
                for d in shape:
                    n *= d
                params += n
    if not params:  # .bin or other weights: assume 4 bytes a parameter on disk
        params = sum(f.stat().st_size for f in Path(model_path).glob("*.bin")) // 4
    return 3 * per * params


TRUST_ENV = "RLVR_TRUST_CHECKPOINT"
"""Set to 1 to load a trainer state that holds more than tensors and plain containers (full unpickling:
only for a checkpoint from a source you trust)."""


def load_trainer_state(ckpt: Path) -> dict:
    """The trainer state (step, schedule, optimizer, RNG, counters) of a checkpoint, read with
    ``weights_only=True``: tensors, numbers, strings and plain containers only, so a shared or downloaded
    run directory cannot run code on resume. A state that needs more (an old or a foreign file) is one
    line naming what it holds, unless :data:`TRUST_ENV` is 1, which unpickles it fully with a warning."""
    import os
    import pickle
    import sys

    path = Path(ckpt) / STATE_FILE
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        if os.environ.get(TRUST_ENV) != "1":
            import re

            found = re.search(r"GLOBAL (\S+)", str(e))
            held = f" (it names {found.group(1)})" if found else ""
            raise UserError(
                f"{path} holds more than tensors and plain containers{held}: loading it could run code. "
                f"If you trust where it came from, set {TRUST_ENV}=1 to load it anyway"
            ) from None
        print(f"warning: {TRUST_ENV}=1: unpickling {path} fully (it can run code)", file=sys.stderr, flush=True)
        return torch.load(path, map_location="cpu", weights_only=False)


def rng_state() -> dict:
    """Every RNG the run draws from: torch (CPU and CUDA) and Python's ``random``."""
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
