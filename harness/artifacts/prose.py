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
  in its own unit or converted (us to ms, bytes to MiB/GiB/GB).
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
        for block in _paragraphs(text):
            values: set[float] = set()
            named: list[str] = []  # in order, once each
            for _, line in block:
                for rel, _tag in MENTION.findall(line):
                    data = _load(repo, rel)
                    if data is not None and rel not in named:
                        named.append(rel)
                        _values(data, values)
            if not named:
                continue
            scaled = {v * k for v in values for k in SCALES}
            for i, line in block:
                for fig in FIGURE.findall(MENTION.sub("", line)):
                    places = len(fig.split(".")[1])
                    if not any(round(v, places) == float(fig) for v in scaled):
                        problems.append(f"{f.relative_to(repo)}:{i}: {fig} is in none of {', '.join(named)}")
    return problems
