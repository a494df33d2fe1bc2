"""The paired benchmark (harness/paired): its statistics, and the whole runner against stub servers
whose true speeds are known while the host they share slows down during the run (injected drift).

What this shows: separate medians of one arm move by a third between the halves of the run, while the
paired ratio of two arms stays at their true ratio and the verdict names the slower one; two equal arms
are not separated."""

import json
import subprocess
import sys
import time

import pytest

from harness import REPO
from harness.paired.run import analyse, block_order, decode_tps, load_spec
from harness.paired.stats import bootstrap_median_interval, judge_ratios


def test_the_interval_holds_the_median_and_narrows_with_tighter_ratios():
    wide = [0.8, 0.9, 1.0, 1.1, 1.2, 0.85, 1.15]
    tight = [0.99, 1.0, 1.01, 1.0, 0.995, 1.005, 1.0]
    lo_w, hi_w = bootstrap_median_interval(wide)
    lo_t, hi_t = bootstrap_median_interval(tight)
    assert lo_w <= 1.0 <= hi_w and lo_t <= 1.0 <= hi_t
    assert hi_t - lo_t < (hi_w - lo_w) / 5
    assert bootstrap_median_interval(wide) == (lo_w, hi_w)  # fixed seed: recomputable


@pytest.mark.parametrize("ratios, verdict, holds", [
    ([0.90, 0.91, 0.89, 0.90, 0.92, 0.88], "slower", False),
    ([1.20, 1.22, 1.19, 1.21, 1.18, 1.20], "faster", True),
    ([0.99, 1.01, 1.00, 0.995, 1.005, 1.0], "not separated", True),
    ([0.975, 0.98, 0.985, 0.98, 0.975, 0.98], "not separated", True),
    ([0.955, 0.96, 0.965, 0.96, 0.955, 0.96], "slower", False),
])
def test_the_verdict_claims_a_difference_only_outside_the_band(ratios, verdict, holds):
    v = judge_ratios("b", "a", "prose", ratios, band_pct=3.0, floor=0.97)
    assert v.verdict == verdict
    assert v.holds_floor is holds
    assert v.low <= v.median <= v.high


@pytest.mark.parametrize("bad", [[1.0], [1.0, 0.0], [1.0, float("nan")], [1.0, -2.0]])
def test_ratios_that_cannot_be_bootstrapped_are_refused(bad):
    with pytest.raises(ValueError):
        bootstrap_median_interval(bad)


def test_decode_rate_and_order():
    assert decode_tps(11, 1.0, 2.0) == 10.0
    assert decode_tps(1, 1.0, 2.0) is None and decode_tps(5, 2.0, 2.0) is None and decode_tps(5, None, 2.0) is None
    assert block_order(["a", "b", "c"], 0) == ["a", "b", "c"]
    assert block_order(["a", "b", "c"], 1) == ["c", "b", "a"]


def test_a_block_without_a_rate_is_dropped_and_named():
    blocks = [{"round": r, "workload": "w", "prompt": "p", "arms": {
        "a": {"tg_tps": 10.0, "text": "x"}, "b": {"tg_tps": None if r == 0 else 9.0, "text": "x" if r else "y"}}}
        for r in range(4)]
    out = analyse(blocks, ["a", "b"], "a", band_pct=3.0, floor=0.97, rounds=4)
    assert out["dropped"] == ["round 0 p: no tg_tps from b"]
    (v,) = out["verdicts"]
    assert v["ratios"] == [0.9, 0.9, 0.9]
    assert out["same_text"]["b"] == {"equal": False, "blocks": 4, "differ": ["round 0 p"], "reference": "a"}


def test_comparisons_judge_peer_pairs_against_their_own_floor_and_references_choose_the_text():
    rates = {"off": 10.0, "spec": 30.0, "peer": 9.0, "peer-spec": 18.0}
    blocks = [{"round": r, "workload": "edit", "prompt": "p", "arms": {
        t: {"tg_tps": v * (1 + 0.01 * r), "text": "omni" if t in ("off", "spec") else f"llama{r == 1}"}
        for t, v in rates.items()}} for r in range(4)]
    out = analyse(blocks, list(rates), "off", band_pct=3.0, floor=0.97, rounds=4,
                  comparisons=[{"arm": "spec", "baseline": "peer", "floor": 3.0},
                               {"arm": "spec", "baseline": "peer-spec", "floor": 1.5}],
                  references={"peer": None, "peer-spec": "peer"})
    by = {(v["arm"], v["baseline"]): v for v in out["verdicts"]}
    assert len(by) == 5
    assert by[("spec", "peer")]["median"] == pytest.approx(30 / 9)
    assert by[("spec", "peer")]["floor"] == 3.0 and by[("spec", "peer")]["holds_floor"]
    assert by[("spec", "peer-spec")]["median"] == pytest.approx(30 / 18) and by[("spec", "peer-spec")]["holds_floor"]
    assert by[("peer", "off")]["verdict"] == "slower" and not by[("peer", "off")]["holds_floor"]
    assert "peer" not in out["same_text"]
    assert out["same_text"]["spec"]["equal"] and out["same_text"]["spec"]["reference"] == "off"
    assert out["same_text"]["peer-spec"] == {"equal": True, "blocks": 4, "differ": [], "reference": "peer"}


def test_paired_runner_recovers_the_true_ratio_while_the_host_drifts(tmp_path):
    epoch = time.time()
    drift = 0.08  # the shared host slows by 8% of its starting speed every second of the run

    def stub(speed):
        return {"kind": "command", "extra": f"{{python}} -m harness.paired.stub_server --port {{port}} "
                                            f"--speed {speed} --token-ms 6 --drift-epoch {epoch} "
                                            f"--drift-per-s {drift}"}

    spec = {"description": "test", "baseline": "base", "rounds": 12, "max_tokens": 32, "settle_s": 0.0,
            "workloads": ["prose"],
            "arms": [{"tag": "base", "server": stub(1.0)}, {"tag": "same", "server": stub(1.0)},
                     {"tag": "slow", "server": stub(0.9)}]}
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    out = tmp_path / "paired.json"
    proc = subprocess.run([sys.executable, "-m", "harness", "paired", "--spec", str(path), "--out", str(out),
                           "--allow-busy"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    art = json.loads(out.read_text())
    assert art["kind"] == "paired" and len(art["blocks"]) == 12
    by = {(v["arm"], v["workload"]): v for v in art["verdicts"]}
    assert set(by) == {("same", "prose"), ("slow", "prose")}
    for w in ("prose",):
        slow, same = by[("slow", w)], by[("same", w)]
        assert slow["median"] == pytest.approx(0.9, abs=0.03)
        assert slow["verdict"] == "slower" and not slow["holds_floor"]
        assert same["median"] == pytest.approx(1.0, abs=0.03)
        assert same["verdict"] == "not separated" and same["holds_floor"]
        # what separate runs would see: the baseline's own median moved with the host ...
        halves = art["drift"]["halves"]["base"][w]
        assert halves["second"] < 0.85 * halves["first"]
        # ... while the paired ratio stayed where it was
        assert slow["median_first_half"] == pytest.approx(slow["median_second_half"], abs=0.03)
    assert all(s["equal"] for s in art["same_text"].values())
    assert "paired: slow / base on prose" in proc.stdout


def test_a_spec_without_its_baseline_among_the_arms_is_refused(tmp_path):
    path = tmp_path / "spec.json"
    path.write_text(json.dumps({"baseline": "x", "arms": [{"tag": "a", "server": {}}, {"tag": "b", "server": {}}]}))
    proc = subprocess.run([sys.executable, "-m", "harness", "paired", "--spec", str(path), "--out",
                           str(tmp_path / "o.json")], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "baseline 'x' is not one of the arms ['a', 'b']" in proc.stderr


@pytest.mark.parametrize("spec", sorted((REPO / "harness" / "specs").glob("paired_*.json")), ids=lambda p: p.name)
def test_every_paired_spec_loads(spec):
    loaded = load_spec(spec)
    assert loaded["baseline"] in [a["tag"] for a in loaded["arms"]]


def test_a_comparison_naming_no_arm_is_refused(tmp_path):
    bad = tmp_path / "s.json"
    bad.write_text(json.dumps({"baseline": "a", "arms": [{"tag": "a", "server": {}}, {"tag": "b", "server": {}}],
                               "comparisons": [{"arm": "a", "baseline": "c"}]}))
    with pytest.raises(ValueError, match="comparison"):
        load_spec(bad)
