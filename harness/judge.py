"""Per-arm summaries and the ranking rule, with "not significant" as a first-class result.

Rules (docs/methodology.md):
- fewer than two good passes of an arm: "single pass, not a result", never ranked;
- a ranking of the two leading arms only when the gap between their medians exceeds
  both arms' spreads and the metric's declared noise band; otherwise NOT A RANKING.
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass

from harness.metrics import Metric

__all__ = ["ArmSummary", "Verdict", "judge", "summarize"]

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

    ``spread_pct`` is (max - min) / median x 100.
    """
    if not values:
        # an arm that never reports a metric (llama.cpp has no 8-stream run) has not failed
        return ArmSummary(tag, 0, failed, None, None, None, None, None, "no good pass" if failed else "not reported")
    med = statistics.median(values)
    lo, hi = min(values), max(values)
    spread = (hi - lo) / abs(med) * 100 if med else float("inf")
    label = "single pass, not a result" if len(values) < 2 else None
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
    if len(ranked) < 2:
        return Verdict(None, False, "NOT A RANKING: fewer than two arms with at least two good passes")
    reverse = metric.direction.value == "higher"
    ranked.sort(key=lambda s: s.median, reverse=reverse)
    first, second = ranked[0], ranked[1]
    gap_pct, needed = _gap(first, second, metric)
    if gap_pct <= needed:
        return Verdict(
            None,
            False,
            f"NOT A RANKING: {first.tag} vs {second.tag} differ by {gap_pct:.1f}%, inside {needed:.1f}% "
            f"(noise band {metric.noise_pct:g}% or spread); separate them with {metric.separate_with}",
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
    return Verdict([s.tag for s in order], True, text)  # ``ranking`` lists only the separated leaders


def _gap(a: ArmSummary, b: ArmSummary, metric: Metric) -> tuple[float, float]:
    """(gap between two medians in % of the second, the gap needed: max of noise band and spreads)."""
    gap = abs(a.median - b.median) / abs(b.median) * 100 if b.median else float("inf")
    return gap, max(metric.noise_pct, a.spread_pct or 0.0, b.spread_pct or 0.0)
