"""Hugging Face hub model ids (``org/name``, ``org/name@revision``), resolved through huggingface_hub's cache.

A model spec is a hub id only when no local path of that name exists: a local folder always wins,
so ``models/Qwen2.5-7B`` is the folder when it is there and the hub repo ``models/Qwen2.5-7B``
otherwise. Online, the files a causal LM needs are fetched into the hub cache
(``huggingface_hub.constants.HF_HUB_CACHE``: ``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, by default
``~/.cache/huggingface/hub``) and loaded from the cached snapshot; with ``HF_HUB_OFFLINE=1`` the cache
alone is read, so a cache copied from a connected machine (``hf download org/name``) works as is.

Fetched: config.json, generation_config.json, the tokenizer's files and the weights that
transformers loads, safetensors (``model.safetensors`` or its index and shards); PyTorch ``.bin``
weights only when the repo has no safetensors (they are pickles, and twice the download where both
exist). Nothing else (other formats, ``original/`` folders, GGUF files, ONNX exports).

huggingface_hub is imported inside the functions that talk to it.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass
from pathlib import Path

from rlvr.errors import UserError
from rlvr.hub import PART, REVISION, cache_folder, fetch_hint, hub_error, offline, valid_repo

CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "*.model",  # sentencepiece
    "*.tiktoken",
    "chat_template.jinja",
    "chat_template.json",
)
SAFETENSORS = ("model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors")
PYTORCH_BIN = ("pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin")
"""The weight files transformers' ``from_pretrained`` reads, one file or an index and its shards."""

_HUB_ID = re.compile(rf"(?P<repo>{PART}/{PART})(?:@(?P<revision>{REVISION}))?", re.ASCII)


@dataclass(frozen=True)
class HubId:
    repo_id: str
    """``org/name``."""
    revision: str | None = None
    """A branch, tag or commit; None for the repo's default branch (``main``)."""

    @property
    def spec(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def parse_hub_id(spec: str | None) -> HubId | None:
    """The hub id that ``spec`` names (``org/name`` or ``org/name@revision``), or None: a spec that is
    a local path (one that exists), a .gguf file or not of that form is not a hub id."""
    if not spec or Path(spec).expanduser().exists() or spec.endswith(".gguf"):
        return None
    found = _HUB_ID.fullmatch(spec)
    if found is None or not valid_repo(found["repo"]) or found["repo"].endswith(".git"):
        return None
    return HubId(found["repo"], found["revision"])


def pinned(spec: str, path: Path) -> str:
    """``spec`` with the commit that ``path`` (a hub snapshot folder) holds as its revision,
    ``org/name`` -> ``org/name@<commit>``; a spec that is not a hub id, as is. A run records this, so
    that it (and a resume of it) loads the same files whatever the branch holds later."""
    hub = parse_hub_id(spec)
    path = Path(path)
    if hub is None or path.parent.name != "snapshots":
        return spec
    return f"{hub.repo_id}@{path.name}"


def _user_error(hub: HubId, label: str, error: Exception) -> UserError:
    """One line for a huggingface_hub error (:func:`rlvr.hub.hub_error`)."""
    from huggingface_hub.errors import RemoteEntryNotFoundError

    if isinstance(error, RemoteEntryNotFoundError):
        return UserError(f"{label}: the Hugging Face model {hub.repo_id} has no config.json: not a transformers model")
    return hub_error(error, label=label, repo=hub.repo_id, revision=hub.revision, dataset=False)


def _wanted(files: list[str], weights: bool) -> list[str]:
    """The files of a repo listing that a causal LM needs (top level only): config, tokenizer, and
    with ``weights`` the safetensors weights, else the PyTorch ones where the repo has no safetensors."""

    def matching(patterns) -> list[str]:
        return [f for f in files if "/" not in f and any(fnmatch.fnmatchcase(f, p) for p in patterns)]

    wanted = matching(CONFIG_FILES + TOKENIZER_FILES)
    if weights:
        wanted += matching(SAFETENSORS) or matching(PYTORCH_BIN)
    return wanted


def missing_files(folder: Path, *, weights: bool = True) -> list[str]:
    """What a loader would miss in a model folder: config.json, a tokenizer, and with ``weights`` the
    weights (one file, or an index and every shard it lists)."""
    folder = Path(folder)
    missing = [] if (folder / "config.json").is_file() else ["config.json"]
    if not any((folder / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        if not any(folder.glob("*.model")):
            missing.append("the tokenizer (tokenizer.json, tokenizer_config.json)")
    if not weights:
        return missing
    for single, index in ((SAFETENSORS[0], SAFETENSORS[1]), (PYTORCH_BIN[0], PYTORCH_BIN[1])):
        if (folder / single).is_file():
            return missing
        if (folder / index).is_file():
            try:
                shards = set(json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"].values())
            except (OSError, ValueError, KeyError, AttributeError):
                return [*missing, f"a readable {index}"]
            return missing + sorted(s for s in shards if not (folder / s).is_file())
    return [*missing, "the weights (model.safetensors or pytorch_model.bin)"]


def snapshot(hub: HubId, label: str, *, weights: bool = True) -> Path:
    """The local snapshot folder of ``hub``: fetched (what is not cached yet, one line saying so)
    when online, the cache alone under ``HF_HUB_OFFLINE=1`` or when the hub cannot be reached.

    Args:
        label: how the user named it, for errors (``model.path=org/name``).
        weights: fetch the weights too (False: config and tokenizer, for commands that read only those).

    Raises:
        UserError: repo, revision or cached files not found, a gated repo; one line naming the cache.
    """
    from huggingface_hub import HfApi, hf_hub_download, snapshot_download
    from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError
    from huggingface_hub.file_download import repo_folder_name

    cache = cache_folder()
    try:
        if offline():
            folder = Path(snapshot_download(hub.repo_id, revision=hub.revision, local_files_only=True))
        else:
            try:
                info = HfApi().model_info(hub.repo_id, revision=hub.revision)
            except (RepositoryNotFoundError, RevisionNotFoundError):
                raise
            except Exception:  # the hub is not reachable (network, proxy, an outage): what the cache holds
                folder = Path(snapshot_download(hub.repo_id, revision=hub.revision, local_files_only=True))
            else:
                files = _wanted([s.rfilename for s in info.siblings or []], weights)
                if "config.json" not in files:
                    raise UserError(f"{label}: the hub repo {hub.spec} has no config.json: not a transformers model")
                if weights and not any(f.endswith((".safetensors", ".bin")) for f in files):
                    raise UserError(
                        f"{label}: the hub repo {hub.spec} has no weights transformers loads (model.safetensors, "
                        "pytorch_model.bin or their shards); name a repo that has them, or a local folder"
                    )
                have = Path(cache) / repo_folder_name(repo_id=hub.repo_id, repo_type="model") / "snapshots" / info.sha
                if not all((have / f).is_file() for f in files):
                    print(f"fetching {hub.spec} from the Hugging Face hub into {cache}", flush=True)
                # config.json first: a model rlvr refuses is refused before its weights download
                config = hf_hub_download(hub.repo_id, "config.json", revision=info.sha)
                check_no_remote_code(Path(config).parent, label)
                folder = Path(snapshot_download(hub.repo_id, revision=hub.revision, allow_patterns=files))
    except UserError:
        raise
    except Exception as e:
        raise _user_error(hub, label, e) from None
    missing = missing_files(folder, weights=weights)
    if missing:
        how = ("unset HF_HUB_OFFLINE to fetch the rest, or " if offline() else "") + fetch_hint(
            hub.repo_id, hub.revision
        )
        raise UserError(
            f"{label}: the Hugging Face cache {cache} holds only part of {hub.spec} (missing {', '.join(missing)}); "
            + how
        )
    return folder


def cached(hub: HubId, *, weights: bool = True) -> Path | None:
    """``hub``'s snapshot folder when the Hugging Face cache holds what a loader needs (with ``weights``,
    the weights too), else None; never touches the network."""
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(hub.repo_id, revision=hub.revision, local_files_only=True))
    except Exception:  # not cached, or an incomplete snapshot
        return None
    return None if missing_files(folder, weights=weights) else folder


def config_file(hub: HubId, label: str) -> Path:
    """``hub``'s config.json alone (``rlvr estimate``): fetched when online and not cached yet, else the
    cached one. Raises UserError as :func:`snapshot` does."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache

    cached = try_to_load_from_cache(hub.repo_id, "config.json", revision=hub.revision)
    if not isinstance(cached, str) and not offline():
        print(f"fetching {hub.spec}'s config.json from the Hugging Face hub into {cache_folder()}", flush=True)
    try:
        return Path(hf_hub_download(hub.repo_id, "config.json", revision=hub.revision, local_files_only=offline()))
    except Exception as e:
        raise _user_error(hub, label, e) from None


def check_no_remote_code(folder: Path, label: str) -> None:
    """UserError when loading the model would need code from its repo (an ``auto_map``) that transformers has
    no class of its own for: a config.json model_type it lacks (or a causal LM for one that has none), or a
    tokenizer class it lacks. rlvr loads with ``trust_remote_code=False``, always: without this check such a
    folder would end in transformers' multi-line error."""
    config, tokenizer = (_json_object(Path(folder) / name) for name in ("config.json", "tokenizer_config.json"))
    why = _remote_model(config) or _remote_tokenizer(config, tokenizer)
    if why:
        raise UserError(
            f"{label}: this model needs trust_remote_code ({why}); rlvr never runs a model repo's code and has "
            "no switch for it: pick a model transformers supports, or a transformers that has it"
        )


def _json_object(path: Path) -> dict:
    """A JSON file's object; {} when it is missing or not a JSON object (its loader says what is wrong)."""
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _remote_model(config: dict) -> str:
    """Why the model of ``config`` (config.json) needs its repo's code, or ''."""
    auto_map = config.get("auto_map")
    if not auto_map:
        return ""
    import transformers
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    model_type, version = config.get("model_type"), transformers.__version__
    if model_type not in CONFIG_MAPPING_NAMES:
        return (
            f"its config.json maps model_type {model_type} to code in the repo, and transformers {version} has no "
            "such model"
        )
    if (
        isinstance(auto_map, dict)
        and "AutoModelForCausalLM" in auto_map
        and model_type not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    ):
        return (
            f"its config.json maps the causal LM of model_type {model_type} to code in the repo, and transformers "
            f"{version} has no causal LM of that type"
        )
    return ""  # transformers has the architecture itself and loads it without the repo's code


def _remote_tokenizer(config: dict, tokenizer: dict) -> str:
    """Why the tokenizer (tokenizer_config.json, or config.json's ``auto_map``) needs its repo's code, or ''."""
    model_map = config.get("auto_map")
    if not tokenizer.get("auto_map") and not (isinstance(model_map, dict) and "AutoTokenizer" in model_map):
        return ""
    import transformers
    from transformers.models.auto.tokenization_auto import tokenizer_class_from_name

    name = str(tokenizer.get("tokenizer_class") or "").removesuffix("Fast")
    if name and (tokenizer_class_from_name(name) or tokenizer_class_from_name(name + "Fast")):
        return ""  # a class transformers has: it is loaded instead of the repo's code
    return (
        f"its tokenizer_config.json maps the tokenizer{f' {name}' if name else ''} to code in the repo, and "
        f"transformers {transformers.__version__} has no such tokenizer"
    )
