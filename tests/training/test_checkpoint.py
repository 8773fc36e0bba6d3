"""Checkpoints (atomic HF dirs, ``last`` link, pruning) and RNG state. Finding checkpoints and the
run's JSONL files are tests/test_run_dir.py's."""

import os
import random

import pytest
import torch

from rlvr.errors import UserError
from rlvr.models.tiny import tiny_model, tiny_tokenizer
from rlvr.run_dir import RunDir
from rlvr.training.checkpoint import load_trainer_state, rng_state, save_checkpoint, set_rng_state


def last_checkpoint(run_dir):
    return RunDir(run_dir).resume_checkpoint()


def list_checkpoints(run_dir):
    return RunDir(run_dir).checkpoints()


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def _model(seed=0):
    return tiny_model(seed=seed, layers=1, hidden=16)


def _state_dicts_equal(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    return all(torch.equal(sa[k], sb[k]) for k in sa)


def _entries(run_dir):
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def test_save_writes_a_loadable_hf_dir_with_identical_weights(tmp_path, tok):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = _model(seed=3)
    path = save_checkpoint(tmp_path, 5, model, tok, {"step": 5, "note": "x"})
    assert path == tmp_path / "checkpoints" / "step_000005"
    assert (path / "config.json").is_file()
    assert (path / "model.safetensors").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(str(path))
    assert _state_dicts_equal(model, loaded)
    assert not _state_dicts_equal(_model(seed=4), loaded)  # the comparison can fail
    tok2 = AutoTokenizer.from_pretrained(str(path))
    assert tok2("what is 2 + 3").input_ids == tok("what is 2 + 3").input_ids
    assert load_trainer_state(path) == {"step": 5, "note": "x"}


def test_last_points_to_newest_and_no_tmp_left(tmp_path, tok):
    model = _model()
    for step in (1, 2, 10):
        save_checkpoint(tmp_path, step, model, tok, {"step": step})
        last = tmp_path / "checkpoints" / "last"
        assert last.is_symlink()
        assert os.readlink(last) == f"step_{step:06d}"  # relative: the run dir can be moved
        assert last_checkpoint(tmp_path) == (tmp_path / "checkpoints" / f"step_{step:06d}").resolve()
    assert _entries(tmp_path) == ["last", "step_000001", "step_000002", "step_000010"]
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000001", "step_000002", "step_000010"]


def test_saving_the_same_step_twice_replaces_it(tmp_path, tok):
    from transformers import AutoModelForCausalLM

    save_checkpoint(tmp_path, 4, _model(seed=1), tok, {"step": 4, "v": 1})
    second = _model(seed=2)
    path = save_checkpoint(tmp_path, 4, second, tok, {"step": 4, "v": 2})
    assert _entries(tmp_path) == ["last", "step_000004"]  # no .old / .tmp leftovers
    assert load_trainer_state(path)["v"] == 2
    assert _state_dicts_equal(second, AutoModelForCausalLM.from_pretrained(str(path)))
    assert last_checkpoint(tmp_path) == path.resolve()


def test_keep_prunes_older_checkpoints(tmp_path, tok):
    model = _model()
    for step in (2, 4, 6, 8):
        save_checkpoint(tmp_path, step, model, tok, {"step": step}, keep=2)
    assert _entries(tmp_path) == ["last", "step_000006", "step_000008"]
    assert last_checkpoint(tmp_path).name == "step_000008"


def test_keep_zero_keeps_all(tmp_path, tok):
    model = _model()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, tok, {"step": step}, keep=0)
    assert len(list_checkpoints(tmp_path)) == 3


def test_stale_tmp_dir_from_a_crash_is_ignored_and_replaced(tmp_path, tok):
    root = tmp_path / "checkpoints"
    stale = root / f".step_000003.tmp-{os.getpid()}"
    stale.mkdir(parents=True)
    (stale / "junk").write_text("half written")
    # a crashed, incomplete step dir (no trainer state) is not a checkpoint
    (root / "step_000009").mkdir()
    assert list_checkpoints(tmp_path) == []
    save_checkpoint(tmp_path, 3, _model(), tok, {"step": 3})
    assert not stale.exists()
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step_000003"]
    assert last_checkpoint(tmp_path).name == "step_000003"


def _draws():
    return torch.rand(6), [random.random() for _ in range(4)], torch.randint(0, 1000, (5,))


def test_rng_state_round_trip():
    torch.manual_seed(123)
    random.seed(123)
    _draws()  # move away from the seeded start
    state = rng_state()
    first = _draws()
    second = _draws()
    assert not torch.equal(first[0], second[0])  # the generators do advance
    set_rng_state(state)
    again = _draws()
    assert torch.equal(first[0], again[0])
    assert first[1] == again[1]
    assert torch.equal(first[2], again[2])


def test_rng_state_survives_a_checkpoint(tmp_path, tok):
    random.seed(7)
    torch.manual_seed(7)
    state = rng_state()
    expected = _draws()
    path = save_checkpoint(tmp_path, 1, _model(), tok, {"step": 1, "rng": state})
    _draws()
    set_rng_state(load_trainer_state(path)["rng"])
    got = _draws()
    assert torch.equal(expected[0], got[0]) and expected[1] == got[1]


@pytest.mark.parametrize("killed_at", ["swap", "rename_into_place", "after_swap"])
def test_resaving_a_step_never_leaves_last_pointing_nowhere(tmp_path, tok, monkeypatch, killed_at):
    """A kill anywhere in re-saving a step leaves `last` on a complete checkpoint: the old one
    before the swap, the new one after it (`last` must never point nowhere)."""
    import contextlib

    from rlvr.training import checkpoint

    save_checkpoint(tmp_path, 2, _model(0), tok, {"step": 2, "v": "old"})
    final = tmp_path / "checkpoints" / "step_000002"
    real_rmtree, real_replace = checkpoint.shutil.rmtree, checkpoint.os.replace

    def kill(*args, **kwargs):
        raise KeyboardInterrupt

    def rmtree(path, *args, **kwargs):  # only the deletion of the old copy after the swap is a kill point
        return real_rmtree(path, *args, **kwargs) if kwargs.get("ignore_errors") else kill()

    def replace(src, dst):  # moving the new checkpoint into the step's name is a kill point
        return kill() if os.fspath(dst) == os.fspath(final) and ".tmp-" in os.fspath(src) else real_replace(src, dst)

    if killed_at == "swap":
        monkeypatch.setattr(checkpoint, "_exchange", kill, raising=False)
    elif killed_at == "rename_into_place":
        monkeypatch.setattr(checkpoint.os, "replace", replace)
    else:
        monkeypatch.setattr(checkpoint.shutil, "rmtree", rmtree)
    with contextlib.suppress(KeyboardInterrupt):
        save_checkpoint(tmp_path, 2, _model(1), tok, {"step": 2, "v": "new"})
    monkeypatch.undo()
    last = tmp_path / "checkpoints" / "last"
    assert last.resolve().is_dir() and (last / "model.safetensors").is_file()
    assert load_trainer_state(last)["v"] in ("old", "new")


def test_remove_stale_deletes_what_a_killed_save_left(tmp_path, tok):
    from rlvr.training.checkpoint import remove_stale

    save_checkpoint(tmp_path, 1, _model(0), tok, {"step": 1})
    root = tmp_path / "checkpoints"
    for name in (".step_000002.tmp-4242", ".step_000001.old-4242"):
        (root / name).mkdir()
        (root / name / "model.safetensors").write_bytes(b"half")
    os.symlink("step_000001", root / ".last.tmp-4242")
    assert remove_stale(tmp_path) == [".last.tmp-4242", ".step_000001.old-4242", ".step_000002.tmp-4242"]
    assert _entries(tmp_path) == ["last", "step_000001"]
    assert remove_stale(tmp_path) == []


def test_a_full_disk_during_a_save_is_one_line_and_keeps_the_previous_checkpoint(tmp_path, tok, monkeypatch):
    import errno

    from rlvr.training import checkpoint as ckpt

    model = _model()
    save_checkpoint(tmp_path, 1, model, tok, {"step": 1})

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt.torch, "save", full)
    with pytest.raises(
        UserError, match=r"no space left .* writing step_000002 \(last complete checkpoint: step_000001\)"
    ):
        save_checkpoint(tmp_path, 2, model, tok, {"step": 2})
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["last", "step_000001"]  # no .tmp left
    assert last_checkpoint(tmp_path).name == "step_000001"


class _RunsCode:
    """A pickle that runs code when loaded: it writes a marker file."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.marker),))


def test_a_trainer_state_that_would_run_code_is_refused_in_one_line(tmp_path, monkeypatch):
    """Issue 62.1: resume reads trainer_state.pt with weights_only=True; a shared run directory whose
    state pickles code is refused before anything runs; RLVR_TRUST_CHECKPOINT=1 is the explicit way."""
    import torch

    from rlvr.errors import UserError
    from rlvr.training import checkpoint as ckpt

    marker = tmp_path / "ran"
    ck = tmp_path / "step_000001"
    ck.mkdir()
    torch.save({"step": 1, "payload": _RunsCode(marker)}, ck / ckpt.STATE_FILE)
    monkeypatch.delenv(ckpt.TRUST_ENV, raising=False)
    with pytest.raises(UserError, match="holds more than tensors and plain containers.*RLVR_TRUST_CHECKPOINT=1"):
        ckpt.load_trainer_state(ck)
    assert not marker.exists()
    torch.save({"step": 1, "rng": {"torch": torch.get_rng_state(), "python": __import__("random").getstate()}},
               ck / ckpt.STATE_FILE)  # fmt: skip
    assert ckpt.load_trainer_state(ck)["step"] == 1  # a plain state loads as before
