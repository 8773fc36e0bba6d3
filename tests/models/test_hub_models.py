"""Hub names for models (``org/name[@revision]``) without a network: a hub-style cache built in a
temporary ``HF_HOME`` (a tiny model under ``models--org--name/snapshots/<commit>/`` and ``refs/main``)
read with ``HF_HUB_OFFLINE=1``; the online path with huggingface_hub's calls replaced by fakes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import httpx2
import huggingface_hub
import pytest
from huggingface_hub import constants
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError
from tiny_run import FORMAT_REWARD, tiny_args

from rlvr.cli import main
from rlvr.errors import UserError
from rlvr.estimate import model_shape
from rlvr.models import hub, resolve_model_path
from rlvr.models.tiny import save_tiny_model

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def cache_model(hub_cache: Path, repo: str = "org/name", commit: str = COMMIT, source: Path | None = None) -> Path:
    """A model in ``hub_cache`` as huggingface_hub lays it out (files in place of blob links); its snapshot."""
    folder = hub_cache / f"models--{repo.replace('/', '--')}"
    snapshot = folder / "snapshots" / commit
    if source is None:
        save_tiny_model(snapshot)
    else:
        shutil.copytree(source, snapshot)
    (folder / "refs").mkdir(exist_ok=True)
    (folder / "refs" / "main").write_text(commit)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch) -> Path:
    """An empty hub cache in a temporary HF_HOME, offline. huggingface_hub reads its environment once,
    at import, so its constants are set too."""
    home = tmp_path / "hf"
    monkeypatch.setenv("HF_HOME", str(home))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(home / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("RLVR_CACHE", str(tmp_path / "rlvr_cache"))
    (home / "hub").mkdir(parents=True)
    return home / "hub"


@pytest.fixture(scope="module")
def tiny_source(tmp_path_factory) -> Path:
    return save_tiny_model(tmp_path_factory.mktemp("hub_src") / "m")


@pytest.mark.parametrize(
    "spec, expected",
    [
        ("org/name", ("org/name", None)),
        ("Qwen/Qwen2.5-7B", ("Qwen/Qwen2.5-7B", None)),
        ("org/name@v1.0", ("org/name", "v1.0")),
        ("org/name@refs/pr/3", ("org/name", "refs/pr/3")),
        (f"org/name@{COMMIT}", ("org/name", COMMIT)),
        ("name", None),  # a bare name is a missing local folder, not a hub id
        ("a/b/c", None),
        ("./org/name", None),
        ("/org/name", None),
        ("~/org/name", None),
        ("org/name.gguf", None),
        ("org/na--me", None),
        ("org/name@", None),
        ("smollm2-135m-instruct", None),
    ],
)
def test_hub_id_syntax(spec, expected):
    found = hub.parse_hub_id(spec)
    assert (found and (found.repo_id, found.revision)) == expected


def test_a_local_folder_wins_over_the_hub_id(tmp_path, monkeypatch, hub_cache):
    cache_model(hub_cache)
    monkeypatch.chdir(tmp_path)
    local = tmp_path / "org" / "name"
    local.mkdir(parents=True)
    (local / "config.json").write_text("{}")
    assert hub.parse_hub_id("org/name") is None
    assert resolve_model_path("org/name") == Path("org/name")


def test_a_cached_repo_resolves_offline_and_pins_its_commit(hub_cache, tiny_source):
    snapshot = cache_model(hub_cache, source=tiny_source)
    for spec in ("org/name", "org/name@main", f"org/name@{COMMIT}"):
        assert resolve_model_path(spec) == snapshot, spec
        assert hub.pinned(spec, snapshot) == f"org/name@{COMMIT}"
    assert hub.pinned("smollm2-135m-instruct", snapshot) == "smollm2-135m-instruct"
    shape, source = model_shape("org/name")  # config.json from the cache
    assert shape.num_hidden_layers == 2 and source == str(snapshot / "config.json")


@pytest.mark.parametrize("spec", ["org/other", "org/name@v2"])
def test_a_repo_missing_from_the_cache_is_one_line(hub_cache, tiny_source, spec):
    cache_model(hub_cache, source=tiny_source)
    with pytest.raises(UserError) as e:
        resolve_model_path(spec)
    line = str(e.value)
    assert "\n" not in line and f"model.path={spec} not found" in line and str(hub_cache) in line, line
    assert "HF_HUB_OFFLINE" in line and "hf download org/" in line and "local folder" in line, line
    if "@" in spec:
        assert "--revision v2" in line


def test_a_partly_cached_repo_names_what_is_missing(hub_cache, tiny_source):
    snapshot = cache_model(hub_cache, source=tiny_source)
    (snapshot / "model.safetensors").unlink()  # as after `rlvr estimate`, which fetches config.json alone
    with pytest.raises(UserError, match="holds only part of org/name .*missing the weights"):
        resolve_model_path("org/name")
    assert resolve_model_path("org/name", weights=False) == snapshot  # tokenizer and config are there
    assert hub.cached(hub.parse_hub_id("org/name"), weights=False) == snapshot
    assert hub.cached(hub.parse_hub_id("org/name")) is None
    index = {"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}
    (snapshot / "model.safetensors.index.json").write_text(json.dumps(index))
    (snapshot / "model-00001-of-00002.safetensors").write_bytes(b"")
    assert hub.missing_files(snapshot) == ["model-00002-of-00002.safetensors"]


def test_a_model_that_needs_remote_code_is_refused(hub_cache, tiny_source):
    snapshot = cache_model(hub_cache, source=tiny_source)
    config = json.loads((snapshot / "config.json").read_text())
    with_code = {**config, "model_type": "my_own_arch", "auto_map": {"AutoConfig": "modeling.MyConfig"}}
    (snapshot / "config.json").write_text(json.dumps(with_code))
    with pytest.raises(UserError) as e:
        resolve_model_path("org/name")
    assert "\n" not in str(e.value) and "trust_remote_code" in str(e.value) and "my_own_arch" in str(e.value)
    # an auto_map beside an architecture transformers has is loaded with transformers' own code
    (snapshot / "config.json").write_text(json.dumps({**config, "auto_map": {"AutoConfig": "modeling.MyConfig"}}))
    assert resolve_model_path("org/name") == snapshot


def test_only_what_a_causal_lm_needs_is_fetched():
    listing = [
        "config.json",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "merges.txt",
        "vocab.json",
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
        "pytorch_model.bin",
        "consolidated.safetensors",
        "original/tokenizer.model",
        "onnx/model.onnx",
        "README.md",
        "model.gguf",
    ]
    wanted = hub._wanted(listing, weights=True)
    assert sorted(wanted) == sorted(listing[:9])
    assert hub._wanted(listing, weights=False) == listing[:6]
    bin_only = ["config.json", "pytorch_model.bin", "tokenizer.model"]
    assert sorted(hub._wanted(bin_only, weights=True)) == sorted(bin_only)  # .bin only where there is no safetensors


def _http_error(cls, status: int):
    request = httpx2.Request("GET", "https://huggingface.co/api/models/org/name")
    return cls(f"{status} error", response=httpx2.Response(status, request=request))


@pytest.fixture
def online(hub_cache, tiny_source, monkeypatch):
    """huggingface_hub online, its calls answered from ``tiny_source`` as a repo at COMMIT; the calls
    made are recorded in the returned dict (the hub's host counts as reachable: no probe)."""
    import rlvr.hub

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(rlvr.hub, "unreachable", lambda: None)
    calls: dict = {"model_info": [], "snapshot_download": []}
    files = sorted(p.name for p in tiny_source.iterdir()) + ["pytorch_model.bin", "README.md"]

    def model_info(self, repo_id, *, revision=None, **kw):
        calls["model_info"].append((repo_id, revision))
        if "error" in calls:
            raise calls["error"]
        return SimpleNamespace(sha=COMMIT, siblings=[SimpleNamespace(rfilename=f) for f in files])

    def fetch(names, repo_id):
        snapshot = hub_cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / COMMIT
        snapshot.mkdir(parents=True, exist_ok=True)
        for name in names:
            shutil.copy(tiny_source / name, snapshot / name)
        return snapshot

    def hf_hub_download(repo_id, filename, *, revision=None, **kw):
        snapshot = fetch([filename], repo_id)
        if revision != COMMIT:  # a branch: huggingface_hub records the commit it points to
            (snapshot.parents[1] / "refs").mkdir(exist_ok=True)
            (snapshot.parents[1] / "refs" / (revision or "main")).write_text(COMMIT)
        return str(snapshot / filename)

    cached_only = huggingface_hub.snapshot_download  # the real one: what the cache holds

    def snapshot_download(repo_id, *, revision=None, allow_patterns=None, local_files_only=False, **kw):
        calls["snapshot_download"].append(allow_patterns)
        if "download_error" in calls:
            raise calls["download_error"]
        if local_files_only:
            return cached_only(repo_id, revision=revision, local_files_only=True)
        snapshot = fetch(allow_patterns, repo_id)
        (snapshot.parents[1] / "refs").mkdir(exist_ok=True)
        (snapshot.parents[1] / "refs" / (revision or "main")).write_text(COMMIT)
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", hf_hub_download)
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    return calls


def test_online_a_repo_is_fetched_once_with_one_line(online, hub_cache, capsys):
    path = resolve_model_path("org/name")
    out = capsys.readouterr().out
    assert out == f"fetching org/name from the Hugging Face hub into {hub_cache}\n"
    assert "pytorch_model.bin" not in online["snapshot_download"][0]  # safetensors are there
    assert "README.md" not in online["snapshot_download"][0]
    assert (path / "model.safetensors").is_file() and hub.pinned("org/name", path) == f"org/name@{COMMIT}"
    assert resolve_model_path("org/name") == path
    assert capsys.readouterr().out == ""  # cached: nothing more to fetch, nothing said


@pytest.mark.parametrize(
    "spec, error, needles",
    [
        ("org/name", _http_error(RepositoryNotFoundError, 404), ["no Hugging Face model org/name", "hf auth login"]),
        ("org/name@v9", _http_error(RevisionNotFoundError, 404), ["has no revision v9", "drop @v9"]),
        ("org/name", httpx2.ConnectError("no route to host"), ["could not be reached", "hf download org/name"]),
    ],
)
def test_online_errors_are_one_line(online, hub_cache, spec, error, needles):
    online["error"] = error
    with pytest.raises(UserError) as e:
        resolve_model_path(spec)
    line = str(e.value)
    assert "\n" not in line and str(hub_cache) in line, line
    for needle in needles:
        assert needle in line, line


def test_online_a_repo_without_transformers_weights_is_one_line(online, monkeypatch):
    def gguf_repo(self, repo_id, *, revision=None, **kw):
        names = ["config.json", "tokenizer.json", "model-Q4_K_M.gguf"]
        return SimpleNamespace(sha=COMMIT, siblings=[SimpleNamespace(rfilename=f) for f in names])

    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", gguf_repo)
    with pytest.raises(UserError, match="has no weights transformers loads") as e:
        resolve_model_path("org/name")
    assert "\n" not in str(e.value) and online["snapshot_download"] == []


def test_online_a_gated_repo_says_how_to_get_access(online, hub_cache):
    online["download_error"] = _http_error(GatedRepoError, 403)
    with pytest.raises(UserError) as e:
        resolve_model_path("org/name")
    line = str(e.value)
    assert "gated" in line and "https://huggingface.co/org/name" in line and "hf auth login" in line, line
    assert str(hub_cache) in line


def test_online_an_unreachable_hub_falls_back_to_the_cache(online, hub_cache, tiny_source):
    snapshot = cache_model(hub_cache, source=tiny_source)
    online["error"] = httpx2.ConnectError("no route to host")
    assert resolve_model_path("org/name") == snapshot


def test_estimate_fetches_config_json_alone(online, hub_cache, capsys):
    shape, source = model_shape("org/name")
    assert shape.num_hidden_layers == 2 and Path(source).name == "config.json"
    assert capsys.readouterr().out == f"fetching org/name's config.json from the Hugging Face hub into {hub_cache}\n"
    # `rlvr estimate`: the tokenizer (for the data's prompt lengths) only from the cache, never fetched
    assert main(["estimate", "model.path=org/name", "model.device=cpu"]) == 0
    out = capsys.readouterr().out
    assert "fetching" not in out and "the tokenizer of org/name is not in the Hugging Face cache" in out, out
    assert all(patterns is None for patterns in online["snapshot_download"])  # cache look-ups, no download
    assert [p.name for p in Path(source).parent.iterdir()] == ["config.json"]


def test_a_resume_naming_the_repo_loads_the_revision_the_run_recorded(hub_cache, tiny_source, tmp_path):
    from rlvr.config import load_config
    from rlvr.training.preflight import _model

    first = cache_model(hub_cache, source=tiny_source)
    newer = cache_model(hub_cache, commit="f" * 40, source=tiny_source)  # main moved on since the run
    assert resolve_model_path("org/name") == newer
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(f"model:\n  path: org/name@{COMMIT}\n")
    path, cfg = _model(load_config(None, ["model.path=org/name", f"resume={run}"]))
    assert path == first and cfg.model.path == f"org/name@{COMMIT}"
    path, cfg = _model(load_config(None, ["model.path=org/name"]))  # a new run: main as it is now
    assert path == newer and cfg.model.path == "org/name@" + "f" * 40


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")  # peft on transformers 5
def test_train_eval_and_estimate_on_a_hub_name(hub_cache, tiny_source, tmp_path, monkeypatch, capsys):
    """`rlvr train model.path=org/name` (LoRA, one step) records the commit; `rlvr eval` of the run merges
    the adapter into the cached base; `rlvr eval -m` and `rlvr estimate` take the name; a missing repo
    is one line and exit 2."""
    monkeypatch.chdir(tmp_path)
    cache_model(hub_cache, source=tiny_source)
    run = tmp_path / "run"
    extra = (*FORMAT_REWARD, "train.steps=1", "model.lora.rank=2", "eval.at_start=false", "eval.at_end=false")
    assert main(["train", *tiny_args("org/name", run, *extra)]) == 0, capsys.readouterr().err
    config = (run / "config.yaml").read_text()
    assert f"path: org/name@{COMMIT}" in config
    adapter = json.loads((run / "checkpoints" / "last" / "adapter_config.json").read_text())
    assert (adapter["base_model_name_or_path"], adapter["revision"]) == ("org/name", COMMIT)

    plain = ["--data", "arithmetic", "--limit", "2", "--template", "plain", "--system", ""]
    plain += ["--max-new-tokens", "4", "--device", "cpu", "--dtype", "float32"]
    for i, model in enumerate((str(run), "org/name")):
        capsys.readouterr()
        assert main(["eval", "-m", model, *plain, "-o", f"ev{i}"]) == 0, capsys.readouterr().err
        assert json.loads((tmp_path / f"ev{i}" / "summary.json").read_text())["n"] == 2

    capsys.readouterr()
    assert main(["estimate", "model.path=org/name", "model.device=cpu"]) == 0
    assert "shape from " + str(hub_cache) in capsys.readouterr().out

    for argv in (
        ["train", *tiny_args("org/missing", tmp_path / "r2", *FORMAT_REWARD)],
        ["eval", "-m", "org/missing", *plain],
    ):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "org/missing not found" in err and str(hub_cache) in err, err
