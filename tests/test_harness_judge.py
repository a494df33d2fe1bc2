"""Judgement logic of the harness with synthetic numbers (no engine)."""

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from harness.grid.bench import check_expectations, rotation
from harness.grid.judge import judge, summarize
from harness.grid.metrics import METRICS, Direction, UnknownMetricError, get_metric


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
    assert v.ranking is None and "harness profile" in v.text


def test_memory_inside_the_noise_names_the_memory_ledger():
    m = get_metric("rss_anon_tree_mb")
    v = judge([summarize("a", [1000.0, 1001.0], 0, m), summarize("b", [1002.0, 1003.0], 0, m)], m)
    assert v.ranking is None and "harness ledger" in v.text and "harness profile" not in v.text


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


@pytest.mark.parametrize("bad", [-3.0, 0.0, float("nan"), float("inf"), "12", True])
def test_a_value_the_metric_declares_invalid_is_a_failed_pass(bad):
    m = get_metric("tg_tps")
    s = summarize("a", [10.0, 10.2, bad], 0, m)
    assert s.n == 2 and s.failed == 1 and "invalid value(s) dropped" in s.label


def test_a_missing_memory_reading_of_zero_never_wins():
    m = get_metric("rss_anon_tree_mb")
    v = judge([summarize("read", [900.0, 901.0], 0, m), summarize("defaulted", [0.0, 0.0], 0, m)], m)
    assert v.ranking is None and "not judged: defaulted (0 good pass(es), 2 failed" in v.text


def test_a_spread_above_the_noise_band_is_labelled_unstable():
    s = summarize("a", [100.0, 130.0, 110.0], 0, get_metric("tg_tps"))
    assert s.label.startswith("unstable: spread 27.3% > noise band 5%")


def test_the_verdict_names_every_excluded_arm_and_failed_pass():
    m = get_metric("tg_tps")
    v = judge([summarize("a", [100.0, 101.0], 1, m), summarize("b", [50.0, 50.5], 0, m),
               summarize("c", [70.0], 2, m), summarize("d", [], 3, m), summarize("llama", [], 0, m)], m)
    assert v.ranking == ["a", "b"]
    assert "not judged: c (1 good pass(es), 2 failed: single pass, not a result)" in v.text
    assert "d (0 good pass(es), 3 failed: no good pass)" in v.text
    assert "failed passes: a 1 (judged on 2 good)" in v.text
    assert "not reported by: llama;" in v.text  # reports nothing by design, failed nothing: named, not dropped


def _artifact(tmp_path, fmt=2):
    import json

    runs = [{"tag": t, "ok": True, "pass_index": i, "metrics": {"tg_tps": v, "rss_anon_tree_mb": r},
             "arm_provenance": {"measured_differently": {"rss_anon_tree_mb": "one process"}} if t == "l" else {}}
            for i in range(2) for t, v, r in (("o", 20.0 + i * 0.1, 3000.0), ("l", 11.0 + i * 0.1, 160.0))]
    data = {"format_version": fmt, "kind": "bench", "spec": {"arms": [{"tag": "o"}, {"tag": "l"}]},
            "metrics": ["tg_tps", "rss_anon_tree_mb"], "runs": runs, "labels": [],
            "summary": {}, "verdict": {"text": "old"}}
    path = tmp_path / "a.json"
    path.write_text(json.dumps(data))
    return path


def test_rejudge_judges_every_metric_and_names_what_is_measured_differently(tmp_path):
    import json

    from harness.artifacts.results import rejudge

    path = _artifact(tmp_path, fmt=1)
    verdicts = rejudge(path, write=True)
    assert set(verdicts) == {"tg_tps", "rss_anon_tree_mb"}
    assert verdicts["tg_tps"]["ranking"] == ["o", "l"]
    assert "measured differently: l (one process)" in verdicts["rss_anon_tree_mb"]["text"]
    stored = json.loads(path.read_text())
    assert stored["verdicts"] == verdicts and stored["rejudged"][0]["previous_verdicts"] == {"tg_tps": {"text": "old"}}


def test_an_artifact_of_an_unknown_format_is_refused(tmp_path):
    from harness.artifacts.results import main

    assert main(["rejudge", str(_artifact(tmp_path, fmt=99))]) == 2


def test_the_plot_marks_panels_it_did_not_judge(tmp_path, monkeypatch):
    """A format-1 artifact judged only its first metric: the other panel says NOT JUDGED."""
    import json

    from harness.artifacts import results

    path = _artifact(tmp_path, fmt=1)
    data = json.loads(path.read_text())
    data["summary"] = {m: [{"tag": t, "n": 2, "median": 1.0, "min": 1.0, "max": 1.0} for t in ("o", "l")]
                       for m in data["metrics"]}
    path.write_text(json.dumps(data))
    titles = []
    import matplotlib.axes

    real = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, t, **kw: (titles.append(t), real(ax, t, **kw)))
    results.plot(path)
    assert "old" in titles[0] and "NOT JUDGED" in titles[1]
