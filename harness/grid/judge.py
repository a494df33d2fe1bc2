"""Per-arm summaries and the ranking rule, with "not significant" as a first-class result.

Rules (docs/methodology.md):
- a value the metric declares invalid (not finite, not positive) is a failed pass, named;
- fewer than two good passes of an arm: "single pass, not a result", never ranked, and the
  verdict names it among the excluded arms with its failed passes;
- a spread above the metric's noise band is labelled "unstable";
- a ranking of the two leading arms only when the gap between their medians exceeds
  both arms' spreads and the metric's declared noise band; otherwise NOT A RANKING.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from harness.grid.metrics import Metric

__all__ = ["ArmSummary", "Verdict", "judge", "judge_runs", "summarize"]

@dataclass(frozen=True)
class ArmSummary:
    """Statistics of one arm's good passes for one metric (values in the metric's unit)."""

    tag: str
    n: int
    failed: int
    median: float | None
    best: float | None
    min: float | None
    max: float | None
    spread_pct: float | None
    label: str | None

    def to_dict(self) -> dict:
        return asdict(self)


def summarize(tag: str, values: list[float], failed: int, metric: Metric) -> ArmSummary:
    """Summarize the good passes ``values`` of arm ``tag``; ``failed`` counts failed passes.

    A value the metric declares invalid counts as a failed pass. ``spread_pct`` is
    (max - min) / median x 100; above the metric's noise band the arm is labelled unstable.
    """
    bad = [metric.invalid(v) for v in values]
    failed += sum(1 for b in bad if b)
    values = [v for v, b in zip(values, bad, strict=True) if not b]
    if not values:
        # an arm that never reports a metric (llama.cpp has no 8-stream run) has not failed
        why = "; ".join(dict.fromkeys(b for b in bad if b))
        label = ("no good pass" + (f" (invalid: {why})" if why else "")) if failed else "not reported"
        return ArmSummary(tag, 0, failed, None, None, None, None, None, label)
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    spread = (hi - lo) / abs(med) * 100 if med else float("inf")
    if len(values) < 2:
        label = "single pass, not a result"
    elif spread > metric.noise_pct:
        label = f"unstable: spread {spread:.1f}% > noise band {metric.noise_pct:g}%"
    else:
        label = None
    if any(bad):
        label = "; ".join(x for x in (label, f"invalid value(s) dropped: {'; '.join(b for b in bad if b)}") if x)
    return ArmSummary(tag, len(values), failed, med, metric.best(values), lo, hi, spread, label)


@dataclass(frozen=True)
class Verdict:
    """The comparison outcome: ``ranking`` (best first) or ``None`` with the reason."""

    ranking: list[str] | None
    significant: bool
    text: str

    def to_dict(self) -> dict:
        return asdict(self)


def judge(summaries: list[ArmSummary], metric: Metric) -> Verdict:
    """Rank the arms by median in the metric's direction, if the leaders are separable.

    The gap between the two leading medians, in percent of the runner-up's median, must
    exceed the noise band and both leaders' spreads; otherwise the result says
    NOT A RANKING and names the tool that can separate them.
    """
    ranked = [s for s in summaries if s.n >= 2 and s.median is not None]
    excluded = _excluded(summaries)
    if len(ranked) < 2:
        alone = f"; judged alone: {ranked[0].tag} ({ranked[0].n} good passes)" if ranked else ""
        return Verdict(None, False, "NOT A RANKING: fewer than two arms with at least two good passes" + alone
                       + excluded)
    reverse = metric.direction.value == "higher"
    ranked.sort(key=lambda s: s.median, reverse=reverse)
    first, second = ranked[0], ranked[1]
    gap_pct, needed = _gap(first, second, metric)
    if gap_pct <= needed:
        return Verdict(
            None,
            False,
            f"NOT A RANKING: {first.tag} vs {second.tag} differ by {gap_pct:.1f}%, inside {needed:.1f}% "
            f"(noise band {metric.noise_pct:g}% or spread); separate them with {metric.separate_with}"
            + (f"; behind them, not ranked: {', '.join(s.tag for s in ranked[2:])}" if ranked[2:] else "")
            + excluded,
        )
    # Extend the order only while each next pair is separable too; the rest is not ranked.
    cut = len(ranked)
    for i, (a, b) in enumerate(zip(ranked, ranked[1:], strict=False)):
        g, n = _gap(a, b, metric)
        if g <= n:
            cut = i  # a and b (and everything after) are one group, unranked
            break
    order = ranked[:cut] if cut < len(ranked) else ranked
    rest = [s.tag for s in ranked[len(order):]]
    text = (f"ranking ({metric.direction.value} is better): {' > '.join(s.tag for s in order)}"
            f"{' > {' + ', '.join(rest) + '}' if rest else ''}; "
            f"leader gap {gap_pct:.1f}% > {needed:.1f}% (max of noise band {metric.noise_pct:g}% and both spreads)")
    if rest:
        text += "; the arms in braces are not ranked among themselves (inside the noise)"
    return Verdict([s.tag for s in order], True, text + excluded)  # ``ranking``: only the separated leaders


def _excluded(summaries: list[ArmSummary]) -> str:
    """``"; not judged: ARM (why), ...; not reported by: ARM, ...; failed passes: ARM N, ..."``, or
    ``""``: every arm left out of the comparison, with why, and every failed pass of the arms in it,
    so that every arm of the run appears in every verdict. An arm that reports nothing for this
    metric (llama.cpp has no 8-stream run) and failed no pass is named as not reporting it."""
    left_out, silent, failures = [], [], []
    for s in summaries:
        if s.n >= 2 and s.median is not None:
            if s.failed:
                failures.append(f"{s.tag} {s.failed} (judged on {s.n} good)")
        elif s.n or s.failed:
            left_out.append(f"{s.tag} ({s.n} good pass(es), {s.failed} failed: {s.label})")
        else:
            silent.append(s.tag)
    text = f"; not judged: {', '.join(left_out)}" if left_out else ""
    text += f"; not reported by: {', '.join(silent)}" if silent else ""
    return text + (f"; failed passes: {', '.join(failures)}" if failures else "")


def _gap(a: ArmSummary, b: ArmSummary, metric: Metric) -> tuple[float, float]:
    """(gap between two medians in % of the second, the gap needed: max of noise band and spreads)."""
    gap = abs(a.median - b.median) / abs(b.median) * 100 if b.median else float("inf")
    return gap, max(metric.noise_pct, a.spread_pct or 0.0, b.spread_pct or 0.0)


def judge_runs(runs: list[dict], tags: list[str],
               metrics: list[Metric]) -> tuple[dict[str, list[dict]], dict[str, dict]]:
    """Summaries and verdicts of every metric from an artifact's ``runs`` (dicts with ``tag``,
    ``ok``, ``metrics``): ``({metric: [ArmSummary dict per tag]}, {metric: Verdict dict})``.

    The one path from passes to verdicts: the harness at the end of a run and
    ``results.py rejudge`` on a stored artifact."""
    summary: dict[str, list[dict]] = {}
    verdicts: dict[str, dict] = {}
    for m in metrics:
        rows = []
        for tag in tags:
            good = [r["metrics"][m.name] for r in runs if r["tag"] == tag and r["ok"] and m.name in r["metrics"]]
            failed = sum(1 for r in runs if r["tag"] == tag and not r["ok"])
            rows.append(summarize(tag, good, failed, m))
        summary[m.name] = [r.to_dict() for r in rows]
        verdict = judge(rows, m).to_dict()
        how = {r["tag"]: (r.get("arm_provenance") or {}).get("measured_differently", {}).get(m.name)
               for r in runs if r["ok"] and m.name in r["metrics"]}  # only arms that reported the metric
        how = {t: h for t, h in how.items() if h}
        if how:
            verdict["text"] += "; measured differently: " + "; ".join(f"{t} ({h})" for t, h in sorted(how.items()))
        verdicts[m.name] = verdict
    return summary, verdicts
