"""Ratios of paired measurements, their bootstrap interval and the verdict a default is decided by.

Why pairs: the hosts we measure on change their read bandwidth by up to 80% between passes (the host
probe, ``harness/grid/host_probe.py``), so medians of separate runs of two settings differ by whatever
the host did between them. Two servers loaded at once that take turns, one request each, see the same
host state within a pair; the ratio of a pair cancels what the host did, and the order alternating
(A B, then B A) cancels a drift that is linear over a pair.

A ratio is ``arm / baseline`` of a higher-is-better metric (tok/s): above 1 the arm is faster. The
interval is a percentile bootstrap of the median ratio (Efron & Tibshirani, *An Introduction to the
Bootstrap*, 1993, ch. 13), resampling whole pairs with a fixed seed so that an artifact can be
recomputed exactly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

__all__ = ["PairVerdict", "bootstrap_median_interval", "judge_ratios"]

BOOTSTRAP_RESAMPLES = 4000
BOOTSTRAP_SEED = 20261206


def bootstrap_median_interval(ratios: list[float], confidence: float = 0.95, *,
                              resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED
                              ) -> tuple[float, float]:
    """Percentile bootstrap interval of the median of ``ratios``: ``(low, high)``.

    Args:
        ratios: one positive finite value per pair (at least 2).
        confidence: the interval's coverage, 0 < confidence < 1 (0.95: the 2.5th and 97.5th percentiles
            of the resampled medians).

    Raises:
        ValueError: fewer than 2 ratios, a ratio that is not positive and finite, or a confidence outside (0, 1).
    """
    x = np.asarray(ratios, dtype=np.float64)
    if x.size < 2:
        raise ValueError(f"a bootstrap interval needs at least 2 pairs, got {x.size}")
    if not np.all(np.isfinite(x)) or np.any(x <= 0):
        raise ValueError(f"ratios must be positive and finite: {ratios}")
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must be inside (0, 1), got {confidence}")
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(resamples, x.size))
    medians = np.median(x[idx], axis=1)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(medians, [tail, 100 - tail])
    return float(low), float(high)


@dataclass(frozen=True)
class PairVerdict:
    """One arm against the baseline on one workload.

    ``ratios``: arm / baseline per pair; ``median``, ``low``, ``high``: the median ratio and its 95%
    bootstrap interval; ``band_pct``: the band around 1 inside which no difference is claimed;
    ``verdict``: ``faster`` (low > 1 + band), ``slower`` (high < 1 - band) or ``not separated``;
    ``floor``: the lowest ratio a default may show (the interval's ``low`` must reach it), and
    ``holds_floor`` whether it does."""

    arm: str
    baseline: str
    workload: str
    ratios: list[float]
    median: float
    low: float
    high: float
    band_pct: float
    verdict: str
    floor: float
    holds_floor: bool

    def to_dict(self) -> dict:
        """JSON-ready."""
        return asdict(self)

    def line(self) -> str:
        """One line for a person: ``arm/baseline on workload: median [low, high] verdict``."""
        return (f"{self.arm} / {self.baseline} on {self.workload}: {self.median:.3f} "
                f"[{self.low:.3f}, {self.high:.3f}] over {len(self.ratios)} pairs: {self.verdict}; "
                f"floor {self.floor:.2f} {'held' if self.holds_floor else 'NOT held'}")


def judge_ratios(arm: str, baseline: str, workload: str, ratios: list[float], *, band_pct: float,
                 floor: float) -> PairVerdict:
    """The verdict on ``ratios`` (arm / baseline, higher is better for the arm).

    The arm is ``faster`` only when the whole interval lies above ``1 + band_pct/100``, ``slower`` only
    when it lies below ``1 - band_pct/100``; otherwise the pairs do not separate the two.

    Raises:
        ValueError: as :func:`bootstrap_median_interval`, or a negative band.
    """
    if band_pct < 0:
        raise ValueError(f"band_pct must be >= 0, got {band_pct}")
    low, high = bootstrap_median_interval(ratios)
    band = band_pct / 100
    verdict = "faster" if low > 1 + band else "slower" if high < 1 - band else "not separated"
    return PairVerdict(arm, baseline, workload, [float(r) for r in ratios], float(np.median(ratios)), low, high,
                       band_pct, verdict, floor, low >= floor)
