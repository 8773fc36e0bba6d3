"""Hugging Face Hub names: what models and data sets share.

The cache folder, offline mode, how to bring a repository onto a machine without a network, and
huggingface_hub's errors as one line each. :mod:`rlvr.models.hub` (model ids, the files a causal LM
needs) and :mod:`rlvr.data.hub` (data set names with a config, their splits) build on it, so a fix to
an error message or to the offline rule lands once. huggingface_hub is imported inside the functions
(``import rlvr.config`` and ``rlvr --help`` stay light).
"""

from __future__ import annotations

import functools
import os
import re
import socket
import sys
from pathlib import Path
from urllib.parse import urlparse

from rlvr.errors import UserError

PART = r"[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?"
"""The Hub's rule for an organisation or a repository name."""
REVISION = r"[\w./-]+"
"""A branch, tag or commit."""


def valid_repo(repo: str) -> bool:
    """``org/name`` as the Hub allows it (no ``..`` or ``--``, which its cache folders use)."""
    return re.fullmatch(f"{PART}/{PART}", repo, re.ASCII) is not None and ".." not in repo and "--" not in repo


def cache_folder() -> Path:
    """The cache huggingface_hub reads and writes: ``$HF_HUB_CACHE``, by default ``$HF_HOME/hub``
    (``~/.cache/huggingface/hub``)."""
    from huggingface_hub import constants

    return Path(constants.HF_HUB_CACHE)


PROBE_TIMEOUT_S = 3.0
"""How long :func:`unreachable` waits for the hub's host to answer. huggingface_hub retries each
request with back-off, so without the probe a machine with no network spent 27.5 s on six requests
before ``rlvr estimate`` fell back to a model's published shape."""


@functools.cache
def unreachable() -> str | None:
    """Why the hub cannot be reached from here (its host does not resolve, or refuses or ignores a
    connection within :data:`PROBE_TIMEOUT_S`), or None where it answers. Tried once per process, and
    said once on stderr: then only the cache is read, as under ``HF_HUB_OFFLINE=1``, which skips this."""
    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    url = urlparse(endpoint)
    host, port = url.hostname or "huggingface.co", url.port or (80 if url.scheme == "http" else 443)
    try:
        socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
        return None
    except OSError as e:
        why = f"{host}:{port} did not answer ({e.strerror or type(e).__name__})"
    print(
        f"the Hugging Face hub is not reachable ({why}): reading its cache only; HF_HUB_OFFLINE=1 skips this check",
        file=sys.stderr,
        flush=True,
    )
    return why


def offline() -> bool:
    """Only the cache is read: ``HF_HUB_OFFLINE=1``, or the hub cannot be reached (:func:`unreachable`)."""
    from huggingface_hub import constants

    return constants.is_offline_mode() or unreachable() is not None


def _kind(dataset: bool) -> str:
    return "Hugging Face data set" if dataset else "Hugging Face model"


def fetch_hint(repo: str, revision: str | None = None, *, dataset: bool = False) -> str:
    """How to put ``repo`` into the cache on a machine with a network, and carry it here."""
    flags = (" --repo-type dataset" if dataset else "") + (f" --revision {revision}" if revision else "")
    local = "a local file or folder" if dataset else "a local folder"
    return (
        f"fetch it on a connected machine with `hf download {repo}{flags}` and copy its hub cache "
        f"(~/.cache/huggingface/hub) to {cache_folder()}, or give {local}"
    )


def reason(e: BaseException) -> str:
    """An exception's type and first line, for the end of a one-line error."""
    first = (str(e).strip().splitlines() or [""])[0]
    return f"{type(e).__name__}: {first[:160]}" if first else type(e).__name__


def hub_error(error: BaseException, *, label: str, repo: str, revision: str | None, dataset: bool) -> UserError:
    """One line for a huggingface_hub error: what is wrong with the repository, the cache, the fix.

    Args:
        error: what ``snapshot_download``, ``hf_hub_download`` or ``model_info`` raised.
        label: how the user named it (``model.path=org/name``, ``data.path=org/name:main``).
        repo, revision: the repository and the revision asked for.
        dataset: a data set repository (else a model).
    """
    from huggingface_hub.errors import (
        GatedRepoError,
        HFValidationError,
        IncompleteSnapshotError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    kind, cache, spec = _kind(dataset), cache_folder(), repo + (f"@{revision}" if revision else "")
    url = f"https://huggingface.co/{'datasets/' if dataset else ''}{repo}"
    if isinstance(error, GatedRepoError):
        return UserError(
            f"{label}: the {kind} {repo} is gated: accept its terms at {url}, log in with `hf auth login` "
            f"(or set HF_TOKEN) and run again; it is fetched into {cache}"
        )
    if isinstance(error, RepositoryNotFoundError):
        return UserError(
            f"{label} not found: no local path of that name, and no {kind} {repo} (check the name; a private "
            f"one needs `hf auth login` or HF_TOKEN); nothing was fetched into {cache}"
        )
    if isinstance(error, RevisionNotFoundError):
        return UserError(
            f"{label}: the {kind} {repo} has no revision {revision}; give a branch, tag or commit it has "
            f"(or drop @{revision} for its default branch); nothing was fetched into {cache}"
        )
    if isinstance(error, IncompleteSnapshotError):
        how = fetch_hint(repo, revision, dataset=dataset)
        return UserError(f"{label}: the cache {cache} holds only part of the {kind} {spec}; {how}")
    if isinstance(error, LocalEntryNotFoundError):
        from huggingface_hub import constants

        if constants.is_offline_mode():
            why = "HF_HUB_OFFLINE=1: unset it where the Hub is reachable to fetch it, or"
        else:
            why = f"the Hub could not be reached ({unreachable() or reason(error.__cause__ or error)}):"
        return UserError(
            f"{label} not found: no local path of that name, and the {kind} {spec} is not in the Hugging Face "
            f"cache {cache} ({why} {fetch_hint(repo, revision, dataset=dataset)})"
        )
    if isinstance(error, HFValidationError):
        return UserError(f"{label}: not a local path nor a valid {kind} name ({reason(error)})")
    return UserError(f"{label}: could not fetch the {kind} {spec} into {cache} ({reason(error)})")
