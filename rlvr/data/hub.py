"""Data sets on the Hugging Face Hub, by name: ``org/name``, ``org/name:config``, either with ``@revision``.

``openai/gsm8k:main``, ``HuggingFaceH4/MATH-500``, ``agentica-org/DeepScaleR-Preview-Dataset@<commit>``
are resolved in two steps:

1. ``huggingface_hub.snapshot_download(repo_type="dataset")`` brings the repository's files into the
   Hugging Face cache (``$HF_HUB_CACHE``, by default ``$HF_HOME/hub`` = ``~/.cache/huggingface/hub``)
   and returns the folder of one commit: downloaded when online, the cache alone with
   ``HF_HUB_OFFLINE=1``. The folder's name is that commit, which the run records
   (``openai/gsm8k:main@<commit>``) so that a repeat or a resume reads the same bytes.
2. ``datasets.load_dataset_builder`` on that local folder says which files form which split of the
   chosen config, exactly as ``load_dataset(name, config)`` would: the README's YAML ``configs:``
   (``data_files`` per split, ``data_dir``, ``default: true``) where it has them, else the Hub's
   default patterns (``train-00000-of-00001.parquet``, ``data/test.jsonl``, ``train/…``). It reads
   no data.

rlvr then reads those files with its own readers (:mod:`rlvr.data.files`), as it reads local files.
Not ``datasets.load_dataset``: that converts every file to Arrow in a second cache, where an answer
``42`` becomes ``42.0`` when another row has ``4.5``, a broken JSONL line loses its line number, and
``data.on_bad_row=skip`` could not skip it; here the Hub cache is the only copy, one folder a user
can copy to a machine without a network, and presets, split names and bad-row handling are the ones
local files get.

A name that is also a local path is the local path. The whole repository at that commit is fetched,
as ``hf download`` would.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from rlvr import hub
from rlvr.errors import UserError
from rlvr.hub import PART, REVISION, valid_repo

NAME = re.compile(rf"(?P<repo>{PART}/{PART})(?::(?P<config>[\w.-]+))?(?:@(?P<revision>{REVISION}))?", re.ASCII)
"""``org/name[:config][@revision]``: a Hub repository id, a config name, a branch, tag or commit."""


@dataclass(frozen=True)
class HubName:
    """A parsed ``org/name[:config][@revision]``."""

    repo: str
    config: str | None = None
    revision: str | None = None

    def __str__(self) -> str:
        return self.repo + (f":{self.config}" if self.config else "") + (f"@{self.revision}" if self.revision else "")


def parse(text: str) -> HubName | None:
    """``text`` as a Hub data set name, or None when it does not have that form.

    Example: ``parse("openai/gsm8k:main")`` -> ``HubName("openai/gsm8k", "main", None)``.
    """
    m = NAME.fullmatch(text.strip())
    if m is None or not valid_repo(m["repo"]):
        return None
    return HubName(m["repo"], m["config"], m["revision"])


@dataclass(frozen=True)
class Snapshot:
    """A data set at one commit, in the local cache.

    Attributes:
        name: as given.
        folder: the snapshot folder (``.../datasets--org--name/snapshots/<commit>``).
        splits: split name -> its data files, in the order ``load_dataset`` reads them (of the config
            named, else of the data set's only or default one).
    """

    name: HubName
    folder: Path
    splits: dict[str, list[Path]] = field(default_factory=dict)

    @property
    def commit(self) -> str:
        return self.folder.name

    @property
    def pinned(self) -> str:
        """The name at this snapshot's commit: ``org/name:config@<commit>``."""
        return str(HubName(self.name.repo, self.name.config, self.commit))


def resolve(name: HubName, *, label: str | None = None) -> Snapshot:
    """The snapshot of ``name``: from the cache, or downloaded into it when online.

    Resolved once per process and cache folder, so a run's train and test splits (and the config it
    records) come from one commit.

    Args:
        name: the data set.
        label: how errors quote it (``data.path=openai/gsm8k``); the name alone by default.

    Raises:
        UserError: one line naming the data set, the cache folder and how to fetch it (not cached
            while offline or unreachable); or the data set, config, split or revision does not exist.
    """
    key = (name, str(hub.cache_folder()))
    if key not in _RESOLVED:
        folder = _download(name, key[1], label or str(name))
        kwargs = _config(name, folder, label or str(name))
        _RESOLVED[key] = Snapshot(name, folder, _split_files(folder, kwargs, label or str(name)))
    return _RESOLVED[key]


_RESOLVED: dict[tuple[HubName, str], Snapshot] = {}
"""(name, cache folder) -> its snapshot, for this process."""


def _download(name: HubName, cache: str, label: str) -> Path:
    from huggingface_hub import snapshot_download

    try:
        only_cache = hub.offline()  # no network: the cache alone, at once (no retries with back-off)
        return Path(
            snapshot_download(
                name.repo, repo_type="dataset", revision=name.revision, cache_dir=cache, local_files_only=only_cache
            )
        )
    except Exception as e:  # an HTTP error of the Hub, a proxy that refuses, a full disk: one line each
        raise hub.hub_error(e, label=label, repo=name.repo, revision=name.revision, dataset=True) from None


def _card_configs(folder: Path) -> dict[str, dict]:
    """Config name -> its entry in the README's YAML ``configs:`` list ({} without one)."""
    from huggingface_hub.repocard import metadata_load

    readme = folder / "README.md"
    try:
        meta = metadata_load(readme) if readme.is_file() else None
    except (ValueError, OSError, UnicodeDecodeError):  # a broken card: the default patterns apply
        meta = None
    configs = (meta or {}).get("configs") or []
    return {str(c["config_name"]): c for c in configs if isinstance(c, dict) and "config_name" in c}


def _config(name: HubName, folder: Path, label: str) -> dict:
    """The ``load_dataset_builder`` arguments that select the config ``name`` asks for."""
    configs = _card_configs(folder)
    if name.config is None:
        default = [n for n, c in configs.items() if c.get("default")]
        if len(configs) > 1 and not default:
            raise UserError(
                f"{label}: the data set has several configs ({', '.join(configs)}); name one, "
                f"e.g. {HubName(name.repo, next(iter(configs)), name.revision)}"
            )
        return {}  # the only config, the default one, or the file patterns
    if name.config in configs:
        return {"name": name.config}
    if (folder / name.config).is_dir():  # not in the card: a folder of that name holds the config's files
        return {"data_dir": name.config}
    have = f"its configs: {', '.join(configs)}" if configs else "it has no configs and no folder of that name"
    raise UserError(f"{label}: the data set {name.repo} has no config '{name.config}' ({have})")


def _split_files(folder: Path, kwargs: dict, label: str) -> dict[str, list[Path]]:
    """Split -> files, as ``load_dataset`` picks them from the snapshot (no data is read)."""
    import datasets

    from rlvr.models.loading import cache_dir

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(datasets.logging.CRITICAL)
    try:
        builder = datasets.load_dataset_builder(str(folder), cache_dir=str(cache_dir() / "datasets"), **kwargs)
    except Exception as e:  # no data files, an unknown layout: datasets says which
        raise UserError(f"{label}: cannot tell which files of {folder} form the data set ({hub.reason(e)})") from None
    files = builder.config.data_files or {}
    return {str(split): [Path(f) for f in paths] for split, paths in files.items() if paths}
