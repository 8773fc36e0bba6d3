"""The README's quickstart figure and the numbers beside it come from one run: the newest results file
that benchmarks/quickstart_figures.py wrote holds both the numbers and the digest of the figure it drew,
so a figure regenerated without the numbers (or the reverse) fails here. The headline table is
benchmarks/results/SUMMARY.md's, which benchmarks/summary.py writes from the result files and copies."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def newest_results() -> dict:
    files = sorted((ROOT / "benchmarks" / "results").glob("quickstart_2*.json"))
    assert files, "no benchmarks/results/quickstart_DATE_KIND.json: run benchmarks/quickstart_figures.py"
    return max((json.loads(f.read_text()) for f in files), key=lambda r: r["started_utc"])


def test_the_figure_is_the_one_drawn_with_the_numbers():
    r = newest_results()
    figure = ROOT / r["figure"]
    assert hashlib.sha256(figure.read_bytes()).hexdigest() == r["figure_sha256"], (
        f"{figure} was not drawn by the run of the newest results file; rerun benchmarks/quickstart_figures.py"
    )
    assert r["figure"] in (ROOT / "README.md").read_text()


def test_the_readme_quotes_the_newest_run():
    r, readme = newest_results(), " ".join((ROOT / "README.md").read_text().split())
    n = r["steps"]
    quoted = [
        f"strict accuracy {r['accuracy_first10']:.3f} over steps 1–10 and {r['accuracy_last10']:.3f} over steps "
        f"{n - 9}–{n}",
        f"{r['eval_before']['accuracy']:.3f} → {r['eval_after']['accuracy']:.3f}",
        f"{r['train_min']:.1f} min of training ({r['s_per_step']:.1f} s/step)",
        f"{r['total_min']:.1f} min in all",
        f"peak RSS {r['peak_rss_gib']:.2f} GiB",
        r["date"],
    ]
    missing = [q for q in quoted if q not in readme]
    assert not missing, f"README.md does not quote the newest quickstart run: {missing}"


def test_the_readmes_results_table_is_the_summarys():
    """README.md's headline table is benchmarks/results/SUMMARY.md's, copied by benchmarks/summary.py."""
    import sys

    sys.path.insert(0, str(ROOT / "benchmarks"))
    import summary

    readme, table = (ROOT / "README.md").read_text(), summary.readme_block(summary.SUMMARY.read_text())
    assert table in readme, "README.md's results table is not SUMMARY.md's: run `python benchmarks/summary.py`"
    assert readme.count(summary.BEGIN) == 1 and readme.count(summary.END) == 1
    # the negative control: one digit changed in the README's copy no longer matches, and the script restores it
    pos = readme.index(table) + table.index(" GiB") - 1
    assert readme[pos].isdigit()
    changed = readme[:pos] + str((int(readme[pos]) + 1) % 10) + readme[pos + 1 :]
    assert table not in changed
    assert summary.with_readme_block(changed, summary.SUMMARY.read_text()) == readme
