"""``benchmarks/results/SUMMARY.md`` from the result files, and README.md's results table from it.

    python benchmarks/summary.py           # rewrite both
    python benchmarks/summary.py --check   # exit 1 where either differs from what the files give now

For each benchmark and kind of machine the summary takes the newest result in ``results/`` (a
``quickstart_runs.py`` series is all seeds of one tag) and writes its headline numbers, the date and
the files. Its first table, one row per kind of machine, is what README.md shows between its
``results table`` markers, copied from SUMMARY.md; ``tests/test_readme_numbers.py`` and
``tests/benchmarks/test_summary.py`` fail when either file is not what this script writes.

Newest means the latest date, then the latest time on that date: ``started_utc`` where the file has
one, else :data:`LEGACY`. The kind of machine is read from the file where it says (``cpu``,
``dispatch``, ``machine.device``), else from :data:`LEGACY`, else from its name (``zen5``,
``AVX2-dispatch``). Files written before the scripts recorded the time and the CPU carry neither; for
the ones this summary shows, LEGACY holds the time their commit landed (``git log``, UTC) and the
CPU the docs name for them. Older files the docs cite are listed last, not summarised.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"
ROOT = RESULTS.parents[1]
SUMMARY = RESULTS / "SUMMARY.md"
README = ROOT / "README.md"
BEGIN, END = "<!-- results table: benchmarks/summary.py -->", "<!-- end of results table -->"

KINDS = {
    "Zen 5": "AMD EPYC Zen 5, 2 cores, AVX512-BF16, no AMX",
    "Zen 4": "AMD EPYC Zen 4, 2 cores, AVX512-BF16, no AMX",
    "AVX2 dispatch": "AVX2 dispatch on an AVX-512 EPYC, 2 cores (AVX2's kernels, not an AVX2 CPU's speed)",
    "AVX2 only": "AMD EPYC without AVX-512 (AVX2 only), 2 cores",
    "GPU": "a GPU",
}
LEGACY = {  # series -> (kind, when its commit landed, UTC): files that record neither
    "quickstart-AVX512-zen5-fusedattn": ("Zen 5", "2026-11-28 23:58"),
    "quickstart-AVX512-segment-kernel": ("Zen 4", "2026-11-27 09:12"),
    "quickstart-AVX2-zen5-avx2-fwdonly": ("AVX2 dispatch", "2026-11-27 16:29"),
    "vs_trl-2026-11-27-AVX512-zen5-rolloutentropy-10steps": ("Zen 5", "2026-11-27 23:28"),
    "vs_trl-2026-11-27-AVX512-10steps-segments": ("Zen 4", "2026-11-27 08:49"),
    "vs_trl-2026-11-27-AVX2-dispatch-zen5-10steps": ("AVX2 dispatch", "2026-11-27 17:11"),
    "roofline-AVX2-dispatch-zen5-fwdonly": ("AVX2 dispatch", "2026-11-27 16:29"),
    "tool_runs-AVX512-steps20": ("Zen 5", "2026-11-26 16:21"),
    "tool_runs-AVX512-steps20-seeds12": ("Zen 5", "2026-11-27 22:27"),
    "tool_runs-AVX2-choice-vs-forced-steps20": ("AVX2 only", "2026-11-29 11:06"),
    "code_runs-AVX2-steps10": ("AVX2 only", "2026-11-29 12:16"),
}
DEV = (  # benchmarks/dev/'s result prefixes, newest files listed as they are
    "update_ab",
    "update_ops",
    "update_attention",
    "long_answers",
    "remove_padding",
    "update_tokens",
    "update_speed",
    "profile_update",
    "fused_logprobs",
    "packed_products",
    "reward_throughput",
    "data_prepare",
    "sandbox",
    "sharded_load",
    "fsdp_builtin",
)


class Result:
    """One result file, or the seeds of one series (``NAME-seed<N>[-DATE].json``), with its kind and time."""

    def __init__(self, paths: list[Path]):
        self.paths = sorted(paths, key=lambda p: p.name)
        self.data = [json.loads(p.read_text()) for p in self.paths]
        first = self.paths[0].name
        self.series = re.sub(r"-seed\d+", "", first.removesuffix(".json"))
        self.series = re.sub(r"-20\d\d-\d\d-\d\d$", "", self.series) if "-seed" in first else self.series
        figure = re.match(r"quickstart_20\d\d-", first)  # quickstart_figures.py's numbers of one run
        self.benchmark = "quickstart_figures" if figure else re.match(r"[a-z_]+", first).group(0).removesuffix("_")
        d = self.data[0]
        legacy_kind, legacy_when = LEGACY.get(self.series, (None, ""))
        date = d.get("date") or _date_in(first) or legacy_when[:10]
        self.when = f"{date} {d.get('started_utc', '')[11:16] or legacy_when[11:]}".strip()
        self.kind = _kind(first, d) or legacy_kind or _kind_from_name(first, d)

    @property
    def date(self) -> str:
        return self.when[:10] or "—"

    def files(self) -> str:
        names = [p.name for p in self.paths]
        if len(names) > 1:
            pattern = re.sub(r"seed\d+", "seed*", names[0])
            return f"`{pattern}` ({len(names)} seeds)"
        return f"`{names[0]}`"

    def values(self, *keys: str) -> list:
        out = []
        for d in self.data:
            for key in keys:
                d = d.get(key, {}) if isinstance(d, dict) else {}
            out.append(d)
        return [v for v in out if v not in ({}, None)]


def _date_in(name: str) -> str:
    m = re.search(r"20\d\d-\d\d-\d\d", name)
    return m.group(0) if m else ""


def _kind(name: str, d: dict) -> str | None:
    """The kind the file itself records: a GPU, AVX2 dispatch, or the CPU family (AMD's 25, 26)."""
    machine = d.get("machine") if isinstance(d.get("machine"), dict) else {}
    if machine.get("device") == "cuda" or machine.get("gpu") or name.startswith("gpu_check"):
        return "GPU"
    if d.get("dispatch") == "avx2":
        return "AVX2 dispatch"
    cpu = d.get("cpu") if isinstance(d.get("cpu"), dict) else machine.get("cpu")
    if isinstance(cpu, dict) and cpu.get("vendor_id") == "AuthenticAMD":
        family, model = int(cpu.get("cpu family", 0)), int(cpu.get("model", 0))
        if family == 26:
            return "Zen 5"
        if family == 25:
            return "Zen 4" if model >= 16 else "AVX2 only"  # Zen 3 (models 0-15) has no AVX-512
    if isinstance(cpu, dict) and cpu.get("model name"):
        return cpu["model name"]  # another CPU: a kind of its own, named as /proc/cpuinfo names it
    return None


def _kind_from_name(name: str, d: dict) -> str:
    """Files named before the CPU was recorded: ``zen5`` and ``dispatch`` in the name say it; other
    AVX-512 files count as Zen 4's (those of 2026-11-23..25 ran on other hosts, and none is the newest
    of its kind), other AVX2 ones as a real AVX2 CPU's."""
    machine = d.get("machine") if isinstance(d.get("machine"), dict) else {}
    named = re.search(r"-(AVX2|AVX512)\b", name)
    capability = d.get("cpu_capability") or machine.get("cpu_capability") or (named.group(1) if named else "")
    if capability == "AVX2":
        quickstart_avx2 = name.startswith("quickstart-AVX2")  # quickstart_runs.py --avx2 on an AVX-512 CPU
        return "AVX2 dispatch" if "dispatch" in name or quickstart_avx2 else "AVX2 only"
    return "Zen 5" if "zen5" in name else "Zen 4"


def kinds(results: list[Result]) -> list[str]:
    """The kinds of :data:`KINDS`, then any other a file names, the GPU last."""
    others = sorted({r.kind for r in results} - set(KINDS))
    return [k for k in KINDS if k != "GPU"] + others + ["GPU"]


def load() -> list[Result]:
    groups: dict[str, list[Path]] = {}
    for path in sorted(RESULTS.glob("*.json")):
        key = re.sub(r"-seed\d+", "-seed*", path.name)
        groups.setdefault(key, []).append(path)
    return [Result(paths) for paths in groups.values()]


def newest(results: list[Result], benchmark: str, kind: str, keep=lambda r: True) -> Result | None:
    found = [r for r in results if r.benchmark == benchmark and r.kind == kind and keep(r)]
    return max(found, key=lambda r: r.when) if found else None


def _span(values: list[float], fmt: str = "{:.2f}") -> str:
    lo, hi = fmt.format(min(values)), fmt.format(max(values))
    return lo if lo == hi else f"{lo}–{hi}"


# -- the quickstart: quickstart_runs.py series and clean-clone checks --------------------------------------


def _default_config(r: Result) -> bool:
    return all(not d.get("overrides") for d in r.data)


def quickstart(results: list[Result], kind: str) -> dict | None:
    """The newest quickstart of ``kind`` in the preset as it is: a quickstart_runs.py series or a check."""
    series = newest(results, "quickstart", kind, _default_config)
    check = newest(results, "clean_clone", kind)
    r = max((x for x in (series, check) if x), key=lambda x: x.when, default=None)
    if r is None:
        return None
    if r is check:
        q = r.data[0]["quickstart"]
        minutes, seconds = divmod(q["total_s"], 60)
        return {
            "result": r,
            "total": f"{minutes} min {seconds:02d} s (`{q['command']}`, one run)",
            "train_min": f"{q['train_min']:.1f}",
            "s_per_step": f"{q['s_per_step']:.1f}",
            "accuracy": f"{q['accuracy_start']:.2f} → {q['accuracy_end']:.2f}",
            "eval": f"{q['eval_before']['accuracy']:.2f} → {q['eval_after']['accuracy']:.2f}",
            "peak_rss": f"{q['peak_rss_gib']:.2f} GiB",
        }
    n = len(r.data)
    seeds = f"{n} seeds" if n > 1 else f"seed {r.data[0]['seed']}"
    return {
        "result": r,
        "total": f"{_span(r.values('wall_min'))} min ({seeds})",
        "train_min": _span(r.values("train_min")),
        "s_per_step": _span(r.values("s_per_step"), "{:.1f}"),
        "update_s": _span(r.values("update_s_per_step"), "{:.1f}"),
        "accuracy": f"{_span(r.values('accuracy_first10'), '{:.3f}')} → {_span(r.values('accuracy_last10'), '{:.3f}')}",
        "eval": f"{_span(r.values('eval_before', 'accuracy'))} → {_span(r.values('eval_after', 'accuracy'))}",
        "peak_rss": f"{_span(r.values('peak_rss_gb'))} GiB",
    }


# -- rlvr against TRL: vs_trl.py files and clean-clone checks --------------------------------------------


def vs_trl(results: list[Result], kind: str) -> dict | None:
    """The newest rlvr ÷ TRL step of ``kind``: a vs_trl.py result with both sides, or a check."""
    run = newest(results, "vs_trl", kind, lambda r: r.data[0].get("ratio") and "trl" in r.data[0])
    check = newest(results, "clean_clone", kind, lambda r: "vs_trl" in r.data[0])
    r = max((x for x in (run, check) if x), key=lambda x: x.when, default=None)
    if r is None:
        return None
    if r is check:
        v = r.data[0]["vs_trl"]
        rlvr, trl = v["rlvr_s_per_step"], v["trl_s_per_step"]
        how = f"{v['precision']}, a reward that varies"
        return {"result": r, "ratio": rlvr / trl, "rlvr": rlvr, "trl": trl, "how": how, "per_token": None}
    d = r.data[0]
    s = d["settings"]
    per_token = d["rlvr"]["s_per_gen_token"] / d["trl"]["s_per_gen_token"]
    how = f"{s['precision']}, {s['steps']} steps"
    rss = f"{d['rlvr']['peak_rss_mib'] / 1024:.1f} / {d['trl']['peak_rss_mib'] / 1024:.1f} GiB"
    return {
        "result": r,
        "ratio": d["ratio"],
        "rlvr": d["rlvr"]["s_per_step"],
        "trl": d["trl"]["s_per_step"],
        "how": how,
        "per_token": per_token,
        "rss": rss,
    }


# -- the tables ------------------------------------------------------------------------------------------


def machine_table(results: list[Result]) -> list[str]:
    """One row per kind of machine: the README's table."""
    rows = [
        "| machine | quickstart, in all | training | strict accuracy → greedy eval | rlvr ÷ TRL, s/step | "
        "peak RSS | measured |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in kinds(results):
        if kind == "GPU":
            rows.append(gpu_row(results))
            continue
        text, q, t = KINDS.get(kind, kind), quickstart(results, kind), vs_trl(results, kind)
        if q is None and t is None:
            continue
        qcells = (
            [q["total"], f"{q['train_min']} min, {q['s_per_step']} s/step", f"{q['accuracy']}; eval {q['eval']}", None]
            + [q["peak_rss"]]
            if q
            else ["not measured with today's code", "—", "—", None, "—"]
        )
        qcells[3] = f"{t['ratio']:.2f}× ({t['rlvr']:.1f} / {t['trl']:.1f} s; {t['how']})" if t else "—"
        sources = dict.fromkeys(f"{x['result'].date}: {x['result'].files()}" for x in (q, t) if x)
        measured = "; ".join(sources)
        rows.append(f"| {text} | " + " | ".join(qcells) + f" | {measured} |")
    return rows


def gpu_row(results: list[Result]) -> str:
    checks = sorted((r for r in results if r.benchmark == "gpu_check"), key=lambda r: r.when)
    if not checks:
        return (
            f"| {KINDS['GPU']} | not measured with today's code | — | — | — | — | no GPU lent since the "
            "static decode was rebuilt: `python3 benchmarks/gpu_check.py` measures it (decode, vs TRL, a "
            "7B-shaped step against the estimate, FSDP2) |"
        )
    r = checks[-1]
    return f"| {r.data[0].get('device', KINDS['GPU'])} | see the check | — | — | — | — | {r.date}: {r.files()} |"


def quickstart_table(results: list[Result]) -> list[str]:
    rows = [
        "| machine | in all | training, min | s/step (update) | strict accuracy, steps 1–10 → 31–40 | "
        "greedy eval | peak RSS | date | files |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for benchmark, label in (("quickstart", ""), ("clean_clone", ", a clean-clone check")):
        for kind in kinds(results):
            q = quickstart([x for x in results if x.benchmark == benchmark], kind)
            if q:
                r, update = q["result"], f" ({q['update_s']})" if "update_s" in q else ""
                rows.append(
                    f"| {kind}{label} | {q['total']} | {q['train_min']} | {q['s_per_step']}{update} | {q['accuracy']} "
                    f"| {q['eval']} | {q['peak_rss']} | {r.date} | {r.files()} |"
                )
    return rows


def vs_trl_table(results: list[Result]) -> list[str]:
    rows = [
        "| machine | rlvr ÷ TRL | per generated token | rlvr / TRL s/step | settings | peak RSS, rlvr / TRL "
        "| date | file |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for kind in kinds(results):
        t = vs_trl([x for x in results if x.benchmark == "vs_trl"], kind)
        if t:
            r = t["result"]
            rows.append(
                f"| {kind} | {t['ratio']:.3f} | {t['per_token']:.3f} | {t['rlvr']:.2f} / {t['trl']:.2f} | {t['how']} "
                f"| {t['rss']} | {r.date} | {r.files()} |"
            )
    return rows


def roofline_table(results: list[Result]) -> list[str]:
    """Per kind, the runs measured against the floor on the newest date: the phases' fraction of it."""
    rows = [
        "| machine | the run | rollout, % of floor | update, % of floor | date | files |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for kind in kinds(results):
        runs = [r for r in results if r.benchmark == "roofline" and r.kind == kind and r.data[0].get("run")]
        if not runs:
            continue
        day = max(r.date for r in runs)
        for r in sorted((r for r in runs if r.date == day), key=lambda r: r.series):
            pct = {
                phase: [100 * v for v in r.values("phases", phase, "fraction_of_floor") if isinstance(v, float)]
                for phase in ("rollout", "update")
            }
            what = re.sub(r"^roofline-(AVX\w*?-(?=[a-z]))?", "", r.series)
            cells = [_span(pct[p], "{:.1f}") if pct[p] else "—" for p in ("rollout", "update")]
            rows.append(f"| {kind} | {what} | {cells[0]} | {cells[1]} | {r.date} | {r.files()} |")
    return rows


def decode_table(results: list[Result]) -> list[str]:
    rows = [
        "| device | model, rows × limit | ms / decode step | of the byte floor | date | file |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    decodes = [r for r in results if r.benchmark == "decode"]
    day = max((r.date for r in decodes), default=None)
    for r in (r for r in decodes if r.date == day):
        d, s = r.data[0], r.data[0]["summary"]
        model = d["settings"].get("model", "?")
        shape = f"{model}, {s['rows']} × {d['settings'].get('max_new_tokens', '?')}"
        device = d["machine"].get("gpu") or f"CPU ({d['machine'].get('cpu_capability')})"
        rows.append(
            f"| {device} | {shape} | {s['ms_per_decode_step']:.1f} | {100 * s['fraction_of_floor']:.0f} % "
            f"| {r.date} | {r.files()} |"
        )
    return rows


def learning_table(results: list[Result]) -> list[str]:
    """tool_runs.py and code_runs.py: each file's presets, held-out greedy accuracy before → after."""
    rows = [
        "| recipe | machine | held-out greedy accuracy, before → after | date | file |",
        "| --- | --- | --- | --- | --- |",
    ]
    for r in sorted((r for r in results if r.benchmark in ("tool_runs", "code_runs")), key=lambda r: r.when):
        for name, m in r.data[0]["mean"].items():
            if "eval_accuracy_after" in m:
                acc = f"{m.get('eval_accuracy_before', float('nan')):.2f} → {m['eval_accuracy_after']:.2f}"
            else:
                acc = f"→ {m['eval_turns1_accuracy_after']:.3f} (1 turn), {m['eval_turns3_accuracy_after']:.3f} (3)"
            seeds = m.get("seeds", [])
            seeds = f"seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}"
            rows.append(f"| `{name}` ({seeds}) | {r.kind} | {acc} | {r.date} | {r.files()} |")
    return rows


def async_table(results: list[Result]) -> list[str]:
    """async_runs.py: per file and mode, the mean step, its phases, the trainers' wait, the overlap, the push."""
    rows = [
        "| config | mode | machine | s/step | rollout s | update s | wait s | overlap | push s | accuracy first → last "
        "| greedy eval | date | file |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    fmt = lambda v, spec="{:.2f}": "—" if v is None else spec.format(v)  # noqa: E731
    for r in sorted((r for r in results if r.benchmark == "async_runs"), key=lambda r: r.when):
        d = r.data[0]
        config = " ".join([d.get("config", ""), *d.get("overrides", [])]).replace("|", "/")
        for mode, m in d["by_mode"].items():
            seeds = m.get("seeds", [])
            rows.append(
                f"| `{config}` | {mode} ({len(seeds)} seed{'s' if len(seeds) > 1 else ''}) | {r.kind} "
                f"| {fmt(m.get('step_s_mean'), '{:.1f}')} | {fmt(m.get('rollout_s_mean'), '{:.1f}')} "
                f"| {fmt(m.get('update_s_mean'), '{:.1f}')} | {fmt(m.get('wait_rollout_s_mean'))} "
                f"| {fmt(m.get('overlap_frac_mean'), '{:.0%}')} | {fmt(m.get('weight_push_s_mean'))} "
                f"| {fmt(m.get('accuracy_first'))} → {fmt(m.get('accuracy_last'))} | {fmt(m.get('eval_after'))} "
                f"| {r.date} | {r.files()} |"
            )
    projections = [r for r in results if r.benchmark == "async_model"]
    if projections:
        rows += ["", "Projections of `benchmarks/async_model.py` (a model, not a measurement): " + ", ".join(
            r.files() for r in sorted(projections, key=lambda r: r.series)
        )]  # fmt: skip
    return rows


def dev_table(results: list[Result]) -> list[str]:
    rows = ["| `benchmarks/dev/` script | newest result files | date |", "| --- | --- | --- |"]
    for prefix in DEV:
        found = [r for r in results if r.benchmark == prefix]
        if found:
            day = max(r.date for r in found)
            files = ", ".join(r.files() for r in sorted(found, key=lambda r: r.series) if r.date == day)
            rows.append(f"| `{prefix}.py` | {files} | {day} |")
    return rows


def render() -> str:
    results = load()
    lines = [
        "# Results summary",
        "",
        "Written by `python benchmarks/summary.py` from the files in this folder; do not edit by hand",
        "(`tests/benchmarks/test_summary.py` fails when it differs from what the script writes). Each",
        "row is the newest result of its benchmark on that kind of machine; the files hold how each was",
        "run, `../NOTES.md` what was learned, and git history every earlier run.",
        "",
        "## By kind of machine",
        "",
        "The quickstart is `make quickstart` (the `quickstart` preset; `auto` precision: bf16 autocast where",
        "bf16 products pay, else float32); rlvr ÷ TRL is `benchmarks/vs_trl.py`'s step time, rlvr's over",
        "TRL 1.16's on equal work. README.md shows this table.",
        "",
        BEGIN,
        *machine_table(results),
        END,
        "",
        "## Quickstart (`benchmarks/quickstart_runs.py`), the preset as it is",
        "",
        *quickstart_table(results),
        "",
        "## rlvr against TRL (`benchmarks/vs_trl.py`)",
        "",
        *vs_trl_table(results),
        "",
        "## Against the roofline (`benchmarks/roofline.py --run`)",
        "",
        *roofline_table(results),
        "",
        "## The rollout engine alone (`benchmarks/decode.py`)",
        "",
        *decode_table(results),
        "",
        "## Tools and code (`benchmarks/tool_runs.py`, `benchmarks/code_runs.py`)",
        "",
        *learning_table(results),
        "",
        "## Asynchronous rollouts (`benchmarks/async_runs.py`, `benchmarks/async_model.py`)",
        "",
        *async_table(results),
        "",
        "## The GPU check (`benchmarks/gpu_check.py`)",
        "",
        gpu_note(results),
        "",
        "## Micro-benchmarks (`benchmarks/dev/`)",
        "",
        *dev_table(results),
        "",
        "## Kept because the docs cite them",
        "",
        "Older results that a page names; newer ones above supersede them.",
        "",
        *cited_list(results),
        "",
        "The learning runs and ablations the docs show keep their run folders: `ablations/`,",
        "`arithmetic_hard/`, `gsm8k/`.",
    ]
    return "\n".join(lines) + "\n"


def gpu_note(results: list[Result]) -> str:
    checks = [r for r in results if r.benchmark == "gpu_check"]
    if not checks:
        return "None yet: whoever is first lent a GPU runs `python3 benchmarks/gpu_check.py` and adds its files here."
    return "\n".join(f"- {r.date}: {r.files()} (and its `.md`)" for r in sorted(checks, key=lambda r: r.when))


def cited_list(results: list[Result]) -> list[str]:
    """Every series not shown in the tables above, by benchmark."""
    body = "\n".join(
        machine_table(results)
        + quickstart_table(results)
        + vs_trl_table(results)
        + roofline_table(results)
        + decode_table(results)
        + learning_table(results)
        + async_table(results)
        + dev_table(results)
    )
    by_benchmark: dict[str, list[str]] = {}
    for r in sorted(results, key=lambda r: r.series):
        if r.files() in body or r.benchmark in ("clean_clone", "gpu_check"):
            continue
        by_benchmark.setdefault(r.benchmark, []).append(r.files())
    return [f"- {b}: " + ", ".join(names) for b, names in sorted(by_benchmark.items())]


def readme_block(summary: str) -> str:
    """The machine table as SUMMARY.md holds it, markers included: what README.md shows."""
    return summary[summary.index(BEGIN) : summary.index(END) + len(END)]


def with_readme_block(readme: str, summary: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise SystemExit(f"README.md has no {BEGIN} ... {END} markers")
    return readme[: readme.index(BEGIN)] + readme_block(summary) + readme[readme.index(END) + len(END) :]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="only compare; exit 1 where a file differs")
    args = ap.parse_args()
    summary = render()
    readme = with_readme_block(README.read_text(), summary)
    stale = [p for p, text in ((SUMMARY, summary), (README, readme)) if not p.exists() or p.read_text() != text]
    if args.check:
        for p in stale:
            print(f"{p.relative_to(ROOT)} is not what benchmarks/summary.py writes: run it", file=sys.stderr)
        sys.exit(1 if stale else 0)
    SUMMARY.write_text(summary)
    README.write_text(readme)
    for p in stale:
        print(f"wrote {p.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
