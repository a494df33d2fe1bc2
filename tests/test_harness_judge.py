"""Judgement logic of the harness with synthetic numbers (no engine)."""

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.bench_harness import check_expectations, rotation
from harness.judge import judge, summarize
from harness.metrics import METRICS, Direction, UnknownMetricError, get_metric


def test_rotation_is_pinned():
    assert [rotation(3, p) for p in range(4)] == [[0, 1, 2], [1, 2, 0], [2, 0, 1], [0, 1, 2]]


def test_c11_direction_comes_from_the_declaration():
    tps, rss = get_metric("tokens_per_s"), get_metric("rss_anon_tree_mb")
    assert tps.direction is Direction.HIGHER and rss.direction is Direction.LOWER
    assert tps.best([3.0, 9.0, 5.0]) == 9.0
    assert rss.best([3.0, 9.0, 5.0]) == 3.0


def test_unknown_metric_asks_for_its_direction():
    with pytest.raises(UnknownMetricError) as e:
        get_metric("tokens_per_second_maybe")
    assert "declare it with its direction" in str(e.value)


def test_single_pass_is_not_a_result():
    s = summarize("a", [10.0], 0, get_metric("tg_tps"))
    assert s.label == "single pass, not a result"
    v = judge([s, summarize("b", [20.0, 21.0], 0, get_metric("tg_tps"))], get_metric("tg_tps"))
    assert v.ranking is None and v.text.startswith("NOT A RANKING")


def test_clear_gap_is_ranked_by_direction():
    m = get_metric("rss_anon_tree_mb")
    v = judge([summarize("big", [900.0, 905.0, 902.0], 0, m), summarize("small", [300.0, 301.0, 302.0], 0, m)], m)
    assert v.ranking == ["small", "big"]


def test_gap_inside_the_spread_is_not_a_ranking_and_names_the_profiler():
    m = get_metric("tg_tps")
    v = judge([summarize("a", [40.0, 60.0], 0, m), summarize("b", [45.0, 56.0], 0, m)], m)
    assert v.ranking is None and "profile_step" in v.text


def test_memory_inside_the_noise_names_the_memory_ledger():
    m = get_metric("rss_anon_tree_mb")
    v = judge([summarize("a", [1000.0, 1001.0], 0, m), summarize("b", [1002.0, 1003.0], 0, m)], m)
    assert v.ranking is None and "memory_ledger" in v.text and "profile_step" not in v.text


@given(
    st.sampled_from(sorted(METRICS)),
    st.floats(1.0, 1e4),
    st.floats(0.0, 1.0),
    st.lists(st.floats(-0.5, 0.5), min_size=2, max_size=5),
    st.lists(st.floats(-0.5, 0.5), min_size=2, max_size=5),
)
def test_never_a_ranking_when_the_gap_is_inside_the_band(name, base, gap_frac, jit_a, jit_b):
    m = get_metric(name)
    gap = base * m.noise_pct / 100 * gap_frac  # a gap no larger than the noise band
    a = [base + base * m.noise_pct / 100 * 0.01 * j for j in jit_a]
    b = [base + gap + base * m.noise_pct / 100 * 0.01 * j for j in jit_b]
    sa, sb = summarize("a", a, 0, m), summarize("b", b, 0, m)
    assume(abs(sa.median - sb.median) / min(sa.median, sb.median) * 100 <= m.noise_pct)
    assert judge([sa, sb], m).ranking is None


def _summary(metric, tag, median):
    return {metric: [{"tag": tag, "median": median}]}


def test_check_flags_a_gateable_regression_and_reports_ungateable():
    rule = {"metrics": {"rss_anon_tree_mb": {"arm": "x", "value": 500, "band_pct": 5}}}
    assert check_expectations(_summary("rss_anon_tree_mb", "x", 520), rule)["regression"] is False
    assert check_expectations(_summary("rss_anon_tree_mb", "x", 530), rule)["regression"] is True
    rule = {"metrics": {"tg_tps": {"arm": "x", "value": 100, "band_pct": 5}}}
    out = check_expectations(_summary("tg_tps", "x", 10), rule)
    assert out["regression"] is False and out["outcomes"][0]["status"] == "ungateable"


def test_order_stops_at_the_first_pair_inside_the_noise():
    m = get_metric("tg_tps")
    v = judge([summarize("fast", [60.0, 61.0], 0, m), summarize("mid", [20.0, 22.0], 0, m),
               summarize("slow", [19.5, 21.0], 0, m)], m)
    assert v.ranking == ["fast"]
    assert "fast > {mid, slow}" in v.text and "not ranked among themselves" in v.text


def test_an_arm_that_never_reports_a_metric_is_not_called_failed():
    m = get_metric("agg_tg_tps")
    assert summarize("llamacpp", [], 0, m).label == "not reported"
    assert summarize("broken", [], 2, m).label == "no good pass"
