"""Every relative link in README.md and docs/**/*.md resolves.

A link ``[text](target)`` (or an image, or a reference definition ``[label]: target``) whose target is
not a URL must name a file or directory that exists, relative to the file that links to it; a
``#anchor`` must match a heading of the target Markdown file (or of the linking file itself, for
``(#anchor)``) under GitHub's slug rules: the heading's text lower-cased, punctuation removed,
spaces turned into hyphens, and ``-1``, ``-2``, ... appended to repeated slugs.
"""

from __future__ import annotations

import re
import unicodedata
from functools import lru_cache
from pathlib import Path
from urllib.parse import unquote

ROOT = Path(__file__).resolve().parents[1]

_FENCE = re.compile(r"^\s{0,3}(`{3,}|~{3,})")
_HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
_INLINE_CODE = re.compile(r"(`+)(.+?)\1")
_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*(<[^>]*>|[^)\s]+)(?:\s+(?:\"[^\"]*\"|'[^']*'))?\s*\)")
_REF_DEF = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*(<[^>]*>|\S+)")
_EXTERNAL = re.compile(r"^(?:[a-zA-Z][a-zA-Z0-9+.-]*:|//)")  # http:, https:, mailto:, ...


def doc_files() -> list[Path]:
    files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
    return [f for f in files if f.is_file()]


def _prose_lines(text: str):
    """(line number, line) for lines outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        match = _FENCE.match(line)
        if match:
            marker = match.group(1)
            if fence is None:
                fence = marker
            elif marker[0] == fence[0] and len(marker) >= len(fence):
                fence = None
            continue
        if fence is None:
            yield number, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading (before de-duplication)."""
    text = _INLINE_CODE.sub(lambda m: m.group(2), heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.strip().lower()
    kept = []
    for ch in text:
        if ch in " -_" or unicodedata.category(ch)[0] in "LN":
            kept.append(ch)
        elif unicodedata.category(ch) in ("Mn", "Mc", "Pc"):
            kept.append(ch)
    return "".join(kept).replace(" ", "-")


@lru_cache(maxsize=None)
def anchors(path: Path) -> frozenset[str]:
    seen: dict[str, int] = {}
    result = set()
    for _, line in _prose_lines(path.read_text(encoding="utf-8")):
        match = _HEADING.match(line)
        if not match:
            continue
        slug = github_slug(match.group(2))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        result.add(slug if count == 0 else f"{slug}-{count}")
    return frozenset(result)


def links(path: Path):
    """(line number, target) of every link in the file's prose."""
    for number, line in _prose_lines(path.read_text(encoding="utf-8")):
        prose = _INLINE_CODE.sub(lambda m: " " * len(m.group(0)), line)
        for match in _LINK.finditer(prose):
            yield number, match.group(1)
        ref = _REF_DEF.match(prose)
        if ref:
            yield number, ref.group(1)


def broken_links() -> list[str]:
    problems = []
    for source in doc_files():
        where = source.relative_to(ROOT)
        for number, raw in links(source):
            target = raw[1:-1] if raw.startswith("<") and raw.endswith(">") else raw
            if not target or _EXTERNAL.match(target):
                continue
            file_part, _, anchor = target.partition("#")
            resolved = (source.parent / unquote(file_part)).resolve() if file_part else source
            if not resolved.exists():
                problems.append(f"{where}:{number}: {raw}: no such file {file_part!r}")
                continue
            if not anchor:
                continue
            if resolved.is_dir() or resolved.suffix.lower() != ".md":
                problems.append(f"{where}:{number}: {raw}: an anchor into a file that is not Markdown")
                continue
            if unquote(anchor).lower() not in anchors(resolved):
                name = resolved.relative_to(ROOT) if resolved.is_relative_to(ROOT) else resolved
                problems.append(f"{where}:{number}: {raw}: {name} has no heading with the slug {anchor!r}")
    return problems


def test_github_slug_rules():
    assert github_slug("Weight sync") == "weight-sync"
    assert github_slug("GPU run (H200): the 7B recipe") == "gpu-run-h200-the-7b-recipe"
    assert github_slug("`agentrl bench learner`: fp32 and bf16") == "agentrl-bench-learner-fp32-and-bf16"
    assert github_slug("ZeRO-2 against ZeRO-3 at 7B") == "zero-2-against-zero-3-at-7b"
    assert github_slug("skip_zero_advantage, 1.03") == "skip_zero_advantage-103"


def test_every_relative_link_in_the_docs_resolves():
    problems = broken_links()
    assert not problems, "broken relative links in the docs:\n  " + "\n  ".join(problems)
