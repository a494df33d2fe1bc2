"""Published results: list them, plot one, retract one (never delete).

    python -m harness results list [--dir harness/results]
    python -m harness results plot FILE [--out PNG]
    python -m harness results retract FILE --reason TEXT [--superseded-by FILE]
    python -m harness results supersede FILE --by FILE
    python -m harness results rejudge FILE [--write]   # every metric again, with today's judge

A retracted artifact keeps all its data and gains ``"retracted": true`` with the
reason, the superseding file and the time; ``list`` shows both kinds.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

__all__ = ["KNOWN_FORMATS", "compare", "list_results", "main", "plot", "rejudge", "render_docs", "retract",
           "supersede", "table"]

from harness import RESULTS_DIR

KNOWN_FORMATS = (1, 2)  # harness/grid/bench.py FORMAT_VERSION's history


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"{path} is not a harness artifact (not JSON: {e})") from None
    if isinstance(data, dict) and data.get("kind") in MEASUREMENT_KINDS:
        return data  # fidelity, bits per weight, kernel matrix: no judged passes, no format history
    if not isinstance(data, dict) or "format_version" not in data:
        raise ValueError(f"{path} is not a harness artifact (no format_version)")
    if data.get("kind", "bench") == "bench" and data["format_version"] not in KNOWN_FORMATS:
        raise ValueError(f"{path} has format_version {data['format_version']!r}; this harness reads "
                         f"{', '.join(map(str, KNOWN_FORMATS))} (a newer harness wrote it?)")
    return data


MEASUREMENT_KINDS = ("fidelity", "bits_per_weight", "kernel_matrix")
"""Artifacts of the harness's other commands (fidelity, bpw, kernels), listed beside the bench runs."""


def _measurement_summary(data: dict) -> str | None:
    """One line for ``results list`` of a fidelity or bits-per-weight artifact (None for other kinds)."""
    if data.get("kind") == "fidelity":
        r = data["result"]
        return (f"fidelity: top-1 {r['top1_agreement']:.3f}, mean KL {r['mean_kl_top20']:.3f} "
                f"({r['positions']} positions)")
    if data.get("kind") == "bits_per_weight":
        return "bits per weight: " + ", ".join(f"{Path(r['path']).name} {r['bits_per_weight']:.2f}"
                                               for r in data["rows"])
    if data.get("kind") == "kernel_matrix":
        return f"kernel matrix: {len(data.get('results') or [])} rows (python -m harness kernels table FILE)"
    return None


TABLE_BEGIN = "<!-- results-table: "
TABLE_END = "<!-- /results-table -->"


def table(path: Path, metrics: list[str] | None = None, source: str | None = None) -> str:
    """Markdown of a bench artifact: one row per arm, the median of each metric (``-`` where the arm
    has none; ``n=1`` marked), then the judge's verdict for each metric, each naming the artifact
    (``source``, default ``path``) on its own line, and the artifact's labels.
    The only way figures enter README and docs (``docs`` regenerates them; a test compares)."""
    from harness.grid.judge import judge_runs
    from harness.grid.metrics import get_metric

    data = _load(path)
    names = metrics or data["metrics"]
    unknown = [m for m in names if m not in data["metrics"]]
    if unknown:
        raise ValueError(f"{path} did not summarize {unknown}; it has {data['metrics']}")
    tags = [a["tag"] for a in data["spec"]["arms"]]
    summary, verdicts = judge_runs(data["runs"], tags, [get_metric(m) for m in names])
    head = "| arm | " + " | ".join(f"`{m}` ({get_metric(m).unit})" for m in names) + " |"
    lines = [head, "|---|" + "---|" * len(names)]
    for i, tag in enumerate(tags):
        cells = []
        for m in names:
            row = summary[m][i]
            if row["median"] is None:
                cells.append("-")
            else:
                unstable = (row["label"] or "").startswith("unstable")
                mark = " (1 pass)" if row["n"] == 1 else " (unstable)" if unstable else ""
                cells.append(f"{row['median']:.2f}{mark}")
        lines.append(f"| `{tag}` | " + " | ".join(cells) + " |")
    lines.append("")
    lines += [f"- `{m}` (`{source or path}`): {verdicts[m]['text']}" for m in names]
    if data.get("labels"):
        lines.append(f"- labels: {'; '.join(_label_names(data['labels']))}")
    return "\n".join(lines)


def fidelity_table(paths: list[Path]) -> str:
    """Markdown of fidelity artifacts (``python -m harness fidelity --out``) and bits-per-weight artifacts
    (``python -m harness bpw --out``): one row per model, its recipe, bits per weight (from the files),
    teacher-forced top-1 agreement and mean KL against bf16, and the artifact it comes from.

    Raises:
        ValueError: a path that is neither kind of artifact."""
    lines = ["| model | recipe | bits per weight | top-1 | mean KL (top-20) | artifact |", "|---|---|---|---|---|---|"]
    repo = RESULTS_DIR.parent.parent
    for path in paths:
        try:
            data = json.loads((repo / path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise ValueError(f"{path}: not a readable artifact ({e})") from None
        kind = data.get("kind") if isinstance(data, dict) else None
        if kind == "fidelity":
            r, bits = data["result"], data.get("test_bits_per_weight") or {}
            bpw = f"{bits['bits_per_weight']:.2f}" if bits.get("bits_per_weight") else "-"
            lines.append(f"| {Path(r['ref']).name} | {bits.get('recipe') or '-'} | {bpw} | {r['top1_agreement']:.3f} "
                         f"| {r['mean_kl_top20']:.3f} | `{path}` |")
        elif kind == "bits_per_weight":
            for row in data["rows"]:
                types = ", ".join(f"{n} {t}" for t, n in sorted(row["types"].items()))
                lines.append(f"| {Path(row['path']).name} | {row.get('recipe') or row['format']} ({types}) "
                             f"| {row['bits_per_weight']:.2f} | - | - | `{path}` |")
        else:
            raise ValueError(f"{path}: a {kind!r} artifact, not a fidelity or bits-per-weight one")
    return "\n".join(lines)


def render_docs(files: list[Path], write: bool = True) -> list[Path]:
    """Regenerate every table between ``<!-- results-table: ARTIFACT [metrics=a,b] -->`` and
    ``<!-- /results-table -->`` in ``files`` (artifact paths relative to the repository; several
    fidelity or bits-per-weight artifacts make one :func:`fidelity_table`), and tag every artifact
    mention in prose with the artifact's labels (:func:`harness.artifacts.prose.tag_mentions`);
    return the files whose text changed (rewritten when ``write``)."""
    from harness.artifacts.prose import tag_mentions

    repo = RESULTS_DIR.parent.parent
    changed = []
    for f in files:
        text = f.read_text()
        out, pos = [], 0
        while (start := text.find(TABLE_BEGIN, pos)) != -1:
            head_end = text.index("-->", start) + 3
            end = text.index(TABLE_END, head_end)
            spec = text[start + len(TABLE_BEGIN):head_end - 3].split()
            metrics = next((a.split("=", 1)[1].split(",") for a in spec[1:] if a.startswith("metrics=")), None)
            arts = [a for a in spec if not a.startswith("metrics=")]
            kind = json.loads((repo / arts[0]).read_text()).get("kind", "bench")
            body = table(repo / arts[0], metrics, arts[0]) if kind == "bench" else fidelity_table(arts)
            out += [text[pos:head_end], "\n", body, "\n"]
            pos = end
        out.append(text[pos:])
        new = tag_mentions(_patch_tables("".join(out)), repo)
        if new != text:
            changed.append(f)
            if write:
                f.write_text(new)
    return changed


PATCHES_BEGIN = "<!-- patches-table: "
PATCHES_END = "<!-- /patches-table -->"


def _patch_tables(text: str) -> str:
    """``text`` with every table between ``<!-- patches-table: declared|tests ... -->`` and
    ``<!-- /patches-table -->`` replaced by :func:`omni_patches.patches.docs_tables`' (docs/stability.md)."""
    if PATCHES_BEGIN not in text:
        return text
    from omni_patches.patches import docs_tables

    tables = dict(zip(("declared", "tests"), docs_tables(), strict=True))
    out, pos = [], 0
    while (start := text.find(PATCHES_BEGIN, pos)) != -1:
        head_end = text.index("-->", start) + 3
        kind = text[start + len(PATCHES_BEGIN):head_end - 3].split()[0]
        end = text.index(PATCHES_END, head_end)
        out += [text[pos:head_end], "\n", tables[kind], "\n"]
        pos = end
    out.append(text[pos:])
    return "".join(out)


def compare(path: Path, metric: str, a: str, b: str) -> dict:
    """The judge's verdict on exactly two arms of a stored bench artifact for one metric (what a
    doc needs before it quotes a pair of numbers): ``{"a": summary, "b": summary, "verdict": ...}``.

    Raises:
        ValueError: not a bench artifact, the metric was not summarized, or an arm is not in it.
    """
    from harness.grid.judge import judge_runs
    from harness.grid.metrics import get_metric

    data = _load(path)
    if data.get("kind") != "bench" or metric not in data.get("metrics", []):
        raise ValueError(f"{path} is not a bench artifact that summarized {metric!r}")
    tags = [t["tag"] for t in data["spec"]["arms"]]
    for t in (a, b):
        if t not in tags:
            raise ValueError(f"{path} has no arm {t!r}; arms: {', '.join(tags)}")
    summary, verdicts = judge_runs(data["runs"], [a, b], [get_metric(metric)])
    return {"a": summary[metric][0], "b": summary[metric][1], "verdict": verdicts[metric]}


def rejudge(path: Path, write: bool = False) -> dict[str, dict]:
    """Every metric of a stored bench artifact judged again from its runs by the current judge.

    With ``write``, the artifact gains ``verdicts``, ``summary`` and a ``rejudged`` record (the
    verdicts it had, and when), atomically; its runs are not touched.

    Raises:
        ValueError: not a bench artifact.
    """
    from harness.grid.judge import judge_runs
    from harness.grid.metrics import get_metric

    data = _load(path)
    if data.get("kind") != "bench":
        raise ValueError(f"{path} is a {data.get('kind')!r} artifact; only bench artifacts have verdicts")
    tags = [a["tag"] for a in data["spec"]["arms"]]
    summary, verdicts = judge_runs(data["runs"], tags, [get_metric(m) for m in data["metrics"]])
    if write:
        before = data.get("verdicts") or {data["metrics"][0]: data.get("verdict")}
        data.setdefault("rejudged", []).append({"unix": time.time(), "previous_verdicts": before})
        data["summary"], data["verdicts"] = summary, verdicts
        _write(path, data)
    return verdicts


def list_results(directory: Path = RESULTS_DIR) -> list[dict]:
    """One row per artifact in ``directory``.

    Keys: file, kind, created_unix, git_sha, verdict, ok_passes, failed_passes, labels,
    retracted, retraction (reason, superseded_by, retracted_unix). An unreadable file
    gets a row whose verdict says why.

    Raises:
        ValueError: ``directory`` is not a directory.
    """
    if not directory.is_dir():
        raise ValueError(f"{directory} is not a directory of results")
    rows = []
    for path in sorted(directory.glob("*.json")):
        try:
            data = _load(path)
        except (ValueError, OSError) as e:
            rows.append(_unreadable_row(path.name, str(e)))
            continue
        try:
            runs = data.get("runs") or []
            rows.append({
                "file": path.name,
                "kind": data.get("kind"),
                "created_unix": data.get("created_unix"),
                "git_sha": (data.get("provenance") or {}).get("git_sha"),
                "verdict": (data.get("verdict") or {}).get("text") or _measurement_summary(data),
                "ok_passes": sum(1 for r in runs if r.get("ok")),
                "failed_passes": sum(1 for r in runs if not r.get("ok")),
                "labels": [str(label) for label in data.get("labels") or []],
                "retracted": bool(data.get("retracted")),
                "retraction": data.get("retraction") or ({"reason": "?"} if data.get("retracted") else None),
            })
        except (AttributeError, TypeError) as e:
            rows.append(_unreadable_row(path.name, f"malformed artifact ({e})"))
    return rows


def _unreadable_row(name: str, why: str) -> dict:
    return {"file": name, "kind": None, "created_unix": None, "git_sha": None, "verdict": f"UNREADABLE: {why}",
            "ok_passes": 0, "failed_passes": 0, "labels": [], "retracted": False, "retraction": None}


def _write(path: Path, data: dict) -> None:
    """Replace ``path`` with ``data`` atomically (a reader sees the old or the new file, never half)."""
    tmp = path.with_suffix(path.suffix + ".partial")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)


def _label_names(labels: list) -> list[str]:
    """``"BUSY CORES: run with ..."`` -> ``"BUSY CORES"``."""
    return [str(label).split(":")[0] for label in labels]


def _check_replacement(path: Path, by: str) -> None:
    """``by`` (absolute, or relative to ``path``'s directory) is another, published artifact."""
    target = Path(by) if Path(by).is_absolute() else path.parent / by
    if target.resolve() == path.resolve():
        raise ValueError(f"{path} cannot supersede itself")
    try:
        data = _load(target)
    except OSError as e:
        raise ValueError(f"superseding artifact {target} cannot be read ({e}); --by is relative to "
                         f"{path.parent}") from None
    if data.get("retracted"):
        raise ValueError(f"superseding artifact {target} is itself retracted; name the one that replaced it")


def retract(path: Path, reason: str, superseded_by: str | None) -> dict:
    """Mark ``path`` retracted in place (atomically); its data stays.

    Raises:
        ValueError: no reason given, the file is not an artifact, already retracted, or
            ``superseded_by`` is not another published artifact.
    """
    if not reason.strip():
        raise ValueError("a retraction needs a reason")
    data = _load(path)
    if data.get("retracted"):
        raise ValueError(f"{path} is already retracted: {data.get('retraction')}")
    if superseded_by:
        _check_replacement(path, superseded_by)
    data["retracted"] = True
    data["retraction"] = {"reason": reason, "superseded_by": superseded_by, "retracted_unix": time.time()}
    _write(path, data)
    return data


def supersede(path: Path, by: str) -> dict:
    """Name the artifact that supersedes the already retracted ``path`` (atomically).

    For a retraction made before its replacement existed. The reason and the data stay.

    Raises:
        ValueError: ``path`` is not an artifact, is not retracted, or already names a
            superseding artifact; ``by`` is itself, missing, not an artifact, or retracted.
    """
    data = _load(path)
    if not data.get("retracted"):
        raise ValueError(f"{path} is not retracted; use `retract {path} --reason ... --superseded-by {by}`")
    if not isinstance(data.get("retraction"), dict):
        data["retraction"] = {"reason": None}
    if data["retraction"].get("superseded_by"):
        raise ValueError(f"{path} is already superseded by {data['retraction']['superseded_by']}")
    _check_replacement(path, by)
    data["retraction"]["superseded_by"] = by
    data["retraction"]["superseded_unix"] = time.time()
    _write(path, data)
    return data


def _measured_differently(data: dict) -> dict[str, dict[str, str]]:
    """``{tag: {metric: how}}`` from the runs' provenance: arms whose runner says a metric is not
    measured as vLLM's arms measure it (llama.cpp's RssAnon of one process beside a mmapped GGUF)."""
    out: dict[str, dict[str, str]] = {}
    for r in data.get("runs") or []:
        how = (r.get("arm_provenance") or {}).get("measured_differently") or {}
        if how:
            out.setdefault(r["tag"], {}).update(how)
    return out


def plot(path: Path, out: Path | None = None) -> Path:
    """Draw each summarized metric as bars of the arms' medians with min-max whiskers (PNG).

    Each panel carries its own verdict; a panel the artifact's judge did not judge (format 1
    judged only the first metric) says NOT JUDGED. Bars of arms that measure a metric
    differently (their runner says how) are hatched, with the note under the panel. The title
    carries the artifact's labels (BUSY CORES, CODE CHANGED ...).

    Raises:
        ValueError: not an artifact, or no arm has a good pass to draw.
    """
    import textwrap

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from harness.grid.metrics import get_metric

    data = _load(path)
    names = data["metrics"]
    if not any(r.get("median") is not None for name in names for r in data["summary"][name]):
        raise ValueError(f"{path} has no good pass to plot (every pass failed or reported nothing); "
                         f"see its runs[].reason")
    verdicts = data.get("verdicts") or {names[0]: data.get("verdict")}
    different = _measured_differently(data)
    fig, axes = plt.subplots(1, len(names), figsize=(4.6 * len(names), 4.8), squeeze=False)
    for ax, name in zip(axes[0], names, strict=True):
        m = get_metric(name)
        rows = [r for r in data["summary"][name] if r["median"] is not None]
        tags = [r["tag"] for r in rows]
        med = [r["median"] for r in rows]
        err = [[r["median"] - r["min"] for r in rows], [r["max"] - r["median"] for r in rows]]
        hatch = [("//" if name in different.get(t, {}) else "") for t in tags]
        bars = ax.bar(range(len(rows)), med, yerr=err, capsize=4, color="#4c72b0")
        for bar, h in zip(bars, hatch, strict=True):
            if h:
                bar.set_hatch(h)
                bar.set_facecolor("#a0a0a0")
        ax.set_xticks(range(len(rows)), tags, rotation=25, ha="right", fontsize=8)
        verdict = (verdicts.get(name) or {}).get("text") or "NOT JUDGED: the artifact's judge did not rank this metric"
        ax.set_title(f"{name} ({m.direction.value} is better)\n" + "\n".join(textwrap.wrap(verdict, 60)[:4]),
                     fontsize=7)
        ax.set_ylabel(m.unit)
        notes = [f"{t}: {different[t][name]}" for t in tags if name in different.get(t, {})]
        if notes:
            ax.set_xlabel("hatched, measured differently: " + "; ".join(notes), fontsize=6, wrap=True)
        for i, r in enumerate(rows):
            ax.annotate(f"n={r['n']}", (i, 0), textcoords="offset points", xytext=(0, 3), ha="center", fontsize=7,
                        color="white")
    title = ""
    if data.get("labels"):
        title = " | ".join(_label_names(data["labels"]))
    if data.get("retracted"):
        title = "RETRACTED: " + str((data.get("retraction") or {}).get("reason"))
    fig.suptitle(f"{path.name}\n{title}", fontsize=8)
    fig.tight_layout()
    out = out or path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def _state(row: dict) -> str:
    """How ``list`` shows a row: retracted, no result (no good pass), or published with its labels."""
    if row["retracted"]:
        by = (row["retraction"] or {}).get("superseded_by")
        return f"RETRACTED ({(row['retraction'] or {}).get('reason')})" + (f", superseded by {by}" if by else "")
    if row["kind"] is None:
        return "unreadable"
    if row["kind"] in MEASUREMENT_KINDS:
        return f"published ({row['kind']}: a measurement, no judged passes)"
    if row["ok_passes"] == 0:
        return f"NO RESULT (all {row['failed_passes']} passes failed)"
    labels = _label_names(row["labels"])
    return "published" + (f" [{'; '.join(labels)}]" if labels else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness results", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    p_list = sub.add_parser("list")
    p_list.add_argument("--dir", type=Path, default=RESULTS_DIR)
    p_plot = sub.add_parser("plot")
    p_plot.add_argument("file", type=Path)
    p_plot.add_argument("--out", type=Path, default=None)
    p_ret = sub.add_parser("retract")
    p_ret.add_argument("file", type=Path)
    p_ret.add_argument("--reason", required=True)
    p_ret.add_argument("--superseded-by", default=None)
    p_sup = sub.add_parser("supersede")
    p_sup.add_argument("file", type=Path)
    p_sup.add_argument("--by", required=True, help="the superseding artifact (relative to FILE's directory)")
    p_cmp = sub.add_parser("compare")
    p_cmp.add_argument("file", type=Path)
    p_cmp.add_argument("metric")
    p_cmp.add_argument("arms", nargs=2)
    p_tab = sub.add_parser("table")
    p_tab.add_argument("file", type=Path)
    p_tab.add_argument("--metrics", default=None)
    p_doc = sub.add_parser("docs")
    p_doc.add_argument("files", type=Path, nargs="*")
    p_rej = sub.add_parser("rejudge")
    p_rej.add_argument("file", type=Path)
    p_rej.add_argument("--write", action="store_true", help="store the new verdicts in the artifact")
    args = ap.parse_args(argv)
    try:
        if args.cmd == "list":
            for r in list_results(args.dir):
                print(f"{r['file']}\n    {_state(r)}\n    {r['verdict']}")
        elif args.cmd == "plot":
            print(plot(args.file, args.out))
        elif args.cmd == "table":
            print(table(args.file, args.metrics.split(",") if args.metrics else None))
        elif args.cmd == "docs":
            repo = RESULTS_DIR.parent.parent
            files = args.files or [repo / "README.md", *sorted((repo / "docs").glob("*.md"))]
            for f in render_docs(files):
                print(f"regenerated tables in {f}")
        elif args.cmd == "compare":
            c = compare(args.file, args.metric, *args.arms)
            print(f"{args.metric}: {c['a']['tag']} median {c['a']['median']} vs {c['b']['tag']} median "
                  f"{c['b']['median']}: {c['verdict']['text']}")
        elif args.cmd == "rejudge":
            for name, v in rejudge(args.file, args.write).items():
                print(f"{name}: {v['text']}")
        elif args.cmd == "supersede":
            supersede(args.file, args.by)
            print(f"{args.file} superseded by {args.by}")
        else:
            retract(args.file, args.reason, args.superseded_by)
            print(f"retracted {args.file}")
    except (ValueError, OSError, KeyError) as e:
        print(f"results.py: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
