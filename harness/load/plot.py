"""Plots of load artifacts: ``python -m harness plot-load ARTIFACT.json [--out FILE.png]``.

A streams sweep (arms of ``run-load``): aggregate tok/s and p99 TTFT against concurrent streams, one line per
arm (the median over good passes, min-max as a band). A soak (arms of ``run-soak``): the server tree's RssAnon
(MiB) against time and TTFT p99 per window, one line per arm, from each arm's first good pass. The title
carries the artifact's name and labels. Written beside the artifact (``.png``) unless ``--out`` says where.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

__all__ = ["main", "plot_load", "sweep_series"]


def sweep_series(data: dict) -> dict[str, dict[str, list[tuple[int, float, float, float]]]]:
    """``{tag: {"load_tps": [(streams, median, min, max)], "ttft_p99_ms": [...]}}`` from a bench artifact's
    summary of ``load_tps_cN`` and ``ttft_p99_ms_cN`` metrics, sorted by streams."""
    out: dict[str, dict[str, list]] = {}
    for name, rows in (data.get("summary") or {}).items():
        m = re.fullmatch(r"(load_tps|ttft_p99_ms)_c(\d+)", name)
        if not m:
            continue
        for r in rows:
            if r.get("median") is not None:
                out.setdefault(r["tag"], {}).setdefault(m.group(1), []).append(
                    (int(m.group(2)), r["median"], r["min"], r["max"]))
    for series in out.values():
        for v in series.values():
            v.sort()
    return out


def plot_load(path: Path, out: Path | None = None) -> Path:
    """Draw ``path`` (a bench artifact of ``run-load`` or ``run-soak`` arms) as a PNG; return its path.

    Raises:
        ValueError: the artifact holds neither sweep metrics nor a good soak pass.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(path.read_text())
    labels = " | ".join(str(x).split(":")[0] for x in data.get("labels") or [])
    series = sweep_series(data)
    soaks = {}
    for r in data.get("runs") or []:
        prov = r.get("arm_provenance") or {}
        if r.get("ok") and "rss_samples" in prov and r["tag"] not in soaks:
            soaks[r["tag"]] = prov
    if not series and not soaks:
        raise ValueError(f"{path} holds no load_tps_cN / ttft_p99_ms_cN summary and no good run-soak pass")
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.5))
    if series:
        for tag, s in sorted(series.items()):
            for ax, key in zip(axes, ("load_tps", "ttft_p99_ms"), strict=True):
                pts = s.get(key) or []
                if pts:
                    x = [p[0] for p in pts]
                    ax.plot(x, [p[1] for p in pts], marker="o", label=tag)
                    ax.fill_between(x, [p[2] for p in pts], [p[3] for p in pts], alpha=0.15)
        for ax, ylabel in zip(axes, ("aggregate tok/s (higher is better)", "TTFT p99, ms (lower is better)"),
                              strict=True):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("concurrent streams")
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    else:
        for tag, prov in sorted(soaks.items()):
            samples = prov["rss_samples"]
            axes[0].plot([s["t_s"] / 60 for s in samples], [s["rss_anon_bytes"] / 2**20 for s in samples],
                         marker=".", label=tag)
            rows = [w for w in prov["windows"] if w.get("ttft_p99_ms") is not None]
            axes[1].plot([w["start_s"] / 60 for w in rows], [w["ttft_p99_ms"] for w in rows], marker="o", label=tag)
        axes[0].set_ylabel("server tree RssAnon, MiB")
        axes[1].set_ylabel("TTFT p99 per window, ms")
        for ax in axes:
            ax.set_xlabel("minutes into the soak")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(f"{path.name}" + (f"\n{labels}" if labels else ""), fontsize=9)
    fig.tight_layout()
    out = out or path.with_suffix(".png")
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m harness plot-load", description=__doc__.split("\n")[0])
    ap.add_argument("artifact", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    try:
        print(plot_load(args.artifact, args.out))
    except (ValueError, OSError, json.JSONDecodeError) as e:
        print(f"plot-load: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
