"""A tiny document model rendered twice: ``report.md`` (images as relative links) and a
self-contained ``report.html`` (images embedded as base64 data URIs). One source, two renderings,
so the two files never disagree.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path

_MD_SPECIAL = re.compile(r"([\\`*_\[\]#|])")
_CODE_SPAN = re.compile(r"(`[^`\n]+`)")


def _md_plain(text: str, newline: str) -> str:
    text = _MD_SPECIAL.sub(r"\\\1", text)
    return text.replace("<", "&lt;").replace(">", "&gt;").replace("\n", newline)


def md_escape(text: str, newline: str = " ", *, code_spans: bool = True) -> str:
    """Text safe inside a Markdown paragraph/table cell: tags shown literally, no accidental emphasis.

    With ``code_spans``, `x` stays a code span (report prose uses them); its inside is not escaped.
    """
    text = str(text)
    if not code_spans:
        return _md_plain(text, newline)
    return "".join(p if _CODE_SPAN.fullmatch(p) else _md_plain(p, newline) for p in _CODE_SPAN.split(text))


def html_text(text: str) -> str:
    """HTML-escaped text with `x` spans as <code>."""
    return "".join(
        f"<code>{html.escape(p[1:-1])}</code>" if _CODE_SPAN.fullmatch(p) else html.escape(p)
        for p in _CODE_SPAN.split(str(text))
    )


@dataclass
class Sample:
    """A completion with highlighted character spans (reflection phrases)."""

    header: str
    question: str
    text: str
    spans: list[tuple[int, int]] = field(default_factory=list)


@dataclass
class Doc:
    title: str
    blocks: list[tuple] = field(default_factory=list)

    def h2(self, text: str) -> None:
        self.blocks.append(("h2", text))

    def p(self, text: str) -> None:
        self.blocks.append(("p", text))

    def table(self, headers: list[str], rows: list[list]) -> None:
        self.blocks.append(("table", headers, rows))

    def image(self, path: Path, alt: str) -> None:
        self.blocks.append(("img", Path(path), alt))

    def sample(self, sample: Sample) -> None:
        self.blocks.append(("sample", sample))

    # -- renderings ---------------------------------------------------------------------------

    def markdown(self, base: Path) -> str:
        """Markdown; image links are relative to ``base`` (the folder report.md is written to)."""
        out = [f"# {md_escape(self.title)}", ""]
        for kind, *rest in self.blocks:
            if kind == "h2":
                out += [f"## {md_escape(rest[0])}", ""]
            elif kind == "p":
                out += [md_escape(rest[0]), ""]
            elif kind == "table":
                headers, rows = rest
                out.append("| " + " | ".join(md_escape(h) for h in headers) + " |")
                out.append("|" + "|".join(" --- " for _ in headers) + "|")
                out += ["| " + " | ".join(md_escape(c) for c in row) + " |" for row in rows]
                out.append("")
            elif kind == "img":
                path, alt = rest
                rel = path.relative_to(base) if path.is_relative_to(base) else path
                out += [f"![{md_escape(alt)}]({rel.as_posix()})", ""]
            elif kind == "sample":
                s: Sample = rest[0]
                out += [f"**{md_escape(s.header)}**", "", f"*Question:* {md_escape(s.question)}", ""]
                br = "<br>\n> "
                body, at = [], 0
                for a, b in s.spans:
                    body += [
                        md_escape(s.text[at:a], br, code_spans=False),
                        "**" + md_escape(s.text[a:b], br, code_spans=False) + "**",
                    ]
                    at = b
                body.append(md_escape(s.text[at:], br, code_spans=False))
                out += ["> " + "".join(body), ""]
        return "\n".join(out).rstrip() + "\n"

    def html(self) -> str:
        """One self-contained HTML page (inline CSS, PNGs as data URIs)."""
        e = html.escape
        body = [f"<h1>{e(self.title)}</h1>"]
        for kind, *rest in self.blocks:
            if kind == "h2":
                body.append(f"<h2>{e(rest[0])}</h2>")
            elif kind == "p":
                body.append(f"<p>{html_text(rest[0])}</p>")
            elif kind == "table":
                headers, rows = rest
                head = "".join(f"<th>{e(str(h))}</th>" for h in headers)
                trs = "".join("<tr>" + "".join(f"<td>{html_text(c)}</td>" for c in row) + "</tr>" for row in rows)
                body.append(f"<table><thead><tr>{head}</tr></thead><tbody>{trs}</tbody></table>")
            elif kind == "img":
                path, alt = rest
                data = base64.b64encode(Path(path).read_bytes()).decode("ascii")
                body.append(f'<figure><img alt="{e(alt)}" src="data:image/png;base64,{data}"></figure>')
            elif kind == "sample":
                s: Sample = rest[0]
                parts, at = [], 0
                for a, b in s.spans:
                    parts += [e(s.text[at:a]), f"<mark>{e(s.text[a:b])}</mark>"]
                    at = b
                parts.append(e(s.text[at:]))
                body.append(
                    f'<div class="sample"><div class="head">{e(s.header)}</div>'
                    f'<div class="q">Question: {e(s.question)}</div><pre>{"".join(parts)}</pre></div>'
                )
        return _PAGE.format(title=e(self.title), body="\n".join(body))


_PAGE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title}</title>
<style>
body {{ font-family: system-ui, sans-serif; max-width: 1000px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 0.5em 0 1.5em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.7em; text-align: left; font-variant-numeric: tabular-nums; }}
th {{ background: #f2f2f2; }}
figure {{ margin: 1em 0; }} img {{ max-width: 100%; }}
.sample {{ border: 1px solid #ddd; border-radius: 4px; margin: 1em 0; padding: 0.5em 0.8em; }}
.sample .head {{ font-weight: 600; }} .sample .q {{ color: #555; margin: 0.3em 0; }}
.sample pre {{ white-space: pre-wrap; background: #fafafa; padding: 0.5em; margin: 0; }}
mark {{ background: #ffe066; font-weight: 600; }}
</style></head>
<body>
{body}
</body></html>
"""
