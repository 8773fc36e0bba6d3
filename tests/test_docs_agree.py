"""One source per fact across the README, the docs and the commands: the preset lists are the presets
in rlvr/configs, the quickstart's times appear only in the README's results table, and no page or
error message contradicts what has run on a GPU or how the R1-Zero presets find their model."""

from __future__ import annotations

import re
from pathlib import Path

from rlvr.config import PRESETS_DIR

ROOT = Path(__file__).resolve().parent.parent
PRESETS = {p.stem for p in PRESETS_DIR.glob("*.yaml")}


def _names(text: str) -> set[str]:
    """Backticked names in ``text``, with ``a_{x,y}`` expanded to ``a_x``, ``a_y``."""
    out = set()
    for name in re.findall(r"`([a-z0-9_.{},]+)`", text):
        m = re.fullmatch(r"(.*)\{(.*)\}(.*)", name)
        out |= {m.group(1) + part + m.group(3) for part in m.group(2).split(",")} if m else {name}
    return out


def test_the_preset_lists_are_the_presets_in_rlvr_configs():
    readme_row = next(line for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("| `train` |"))
    usage = " ".join((ROOT / "docs" / "usage.md").read_text().split())
    paragraph = usage[usage.index("`--config` takes a YAML file") :].split(". Overrides are")[0]
    for where, text in (("README.md's train row", readme_row), ("docs/usage.md", paragraph)):
        named = _names(text)
        assert PRESETS <= named, f"{where} leaves out {sorted(PRESETS - named)}"
        stale = {n for n in named if re.fullmatch(r"(r1_zero|arithmetic)_[a-z0-9_.]+", n)} - PRESETS
        assert not stale, f"{where} names presets that are gone: {sorted(stale)}"
    from rlvr.commands.train import TRAIN_HELP

    assert PRESETS <= set(re.findall(r"[a-z0-9_.]+", TRAIN_HELP))


def test_quickstart_times_only_in_the_readmes_results_table():
    minutes = re.compile(r"\d(?:\.\d+)?(?:–\d+(?:\.\d+)?)? ?min\b")
    for page in ("README.md", "docs/index.md", "docs/usage.md", "docs/contributing.md"):
        for n, line in enumerate((ROOT / page).read_text().splitlines(), 1):
            if "quickstart" in line.lower() and minutes.search(line):
                assert page == "README.md" and line.lstrip().startswith("|"), f"{page}:{n}: a quickstart time"


def test_no_page_or_error_says_rlvr_never_ran_on_a_gpu():
    from rlvr.config import load_config
    from rlvr.errors import UserError

    assert "One GPU has run" in (ROOT / "README.md").read_text()
    for page in ("docs/index.md", "docs/usage.md", "docs/distributed.md", "docs/precision-and-speed.md"):
        text = " ".join((ROOT / page).read_text().split())
        assert "has not been run on a GPU yet" not in text and "rlvr has never run on a GPU" not in text, page
    try:
        load_config(None, ["rollout.engine=vllm"])
    except UserError as e:
        assert "has not run on one" not in str(e) and "not built yet" in str(e)


def test_the_r1_zero_presets_take_hub_names_everywhere():
    usage = " ".join((ROOT / "docs" / "usage.md").read_text().split())
    assert "which need a local model directory" not in usage and "by Hub name" in usage
    for name in ("r1_zero_qwen25_0.5b", "r1_zero_qwen25_7b", "r1_zero_qwen25_7b_lora"):
        text = (PRESETS_DIR / f"{name}.yaml").read_text()
        assert re.search(r"^\s+path: Qwen/Qwen2\.5-", text, re.MULTILINE) or "defaults:" in text, name


def test_the_notes_sections_that_code_and_docs_name_exist():
    """A docstring or page that points to ``benchmarks/NOTES.md`` ("Some section") names a heading there."""
    headings = " ".join(
        line.lower() for line in (ROOT / "benchmarks" / "NOTES.md").read_text().splitlines() if line.startswith("#")
    )
    pages = [*(ROOT / "rlvr").rglob("*.py"), *(ROOT / "rlvr").rglob("*.c"), *(ROOT / "docs").glob("*.md")]
    missing = []
    for page in pages:
        text = " ".join(page.read_text().split())
        for quoted in re.findall(r'NOTES\.md`{0,2}\)?,? \(?((?:"[^"]+",? ?)+)', text):
            for name in re.findall(r'"([^"]+)"', quoted):
                if name.rstrip(".,").lower() not in headings:
                    missing.append(f"{page.relative_to(ROOT)}: {name}")
    assert not missing, f"benchmarks/NOTES.md has no heading for: {missing}"
