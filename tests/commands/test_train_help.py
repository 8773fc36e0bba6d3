"""`rlvr train --help` lists what a newcomer needs first: the presets and the run keys."""

from __future__ import annotations

import pytest

from rlvr.cli import main
from rlvr.config import PRESETS_DIR


def test_train_help_lists_presets_and_run_keys(capsys):
    with pytest.raises(SystemExit) as done:
        main(["train", "--help"])
    assert done.value.code == 0
    out = " ".join(capsys.readouterr().out.split())
    for preset in sorted(p.stem for p in PRESETS_DIR.glob("*.yaml")):
        assert preset in out, preset
    for key in ("run_dir=DIR", "resume=RUN", "overwrite=true", "seed=N", "--print-config"):
        assert key in out, key
