"""Equal greedy outputs across arms (harness/grid/outputs.py), unit and through ``harness bench``."""

import json
import os
import subprocess
import sys
from pathlib import Path

from harness.grid.outputs import OUTPUTS_DIFFER, compare_outputs

REPO = Path(__file__).resolve().parent.parent
CORES = ",".join(map(str, sorted(os.sched_getaffinity(0))))


def _run(tag, pass_index, outputs, ok=True):
    return {"tag": tag, "pass_index": pass_index, "ok": ok, "arm_provenance": {"outputs": outputs}}


GROUP = [{"reference": "plain", "arms": ["spec"]}]


def test_equal_outputs_over_every_pass_are_equal():
    runs = [_run("plain", 0, {"a": [1, 2, 3]}), _run("spec", 0, {"a": [1, 2, 3]}),
            _run("plain", 1, {"a": [1, 2, 3]}), _run("spec", 1, {"a": [1, 2, 3]})]
    got = compare_outputs(runs, GROUP)
    assert got["equal"] is True
    assert got["groups"][0]["compared"] == ["plain pass 2", "spec pass 1", "spec pass 2"]
    assert got["groups"][0]["reference_pass"] == 1


def test_a_differing_token_is_reported_with_its_position():
    runs = [_run("plain", 0, {"a": [1, 2, 3], "b": [4, 5]}), _run("spec", 0, {"a": [1, 9, 3], "b": [4, 5, 6]})]
    got = compare_outputs(runs, GROUP)
    assert got["equal"] is False
    assert got["groups"][0]["differ"] == [
        {"arm": "spec", "pass": 1, "prompt": "a", "first_difference": 1},
        {"arm": "spec", "pass": 1, "prompt": "b", "first_difference": 2},  # longer: differs where the other ends
    ]


def test_a_comparison_that_cannot_be_made_is_not_equal():
    no_ref = compare_outputs([_run("plain", 0, {}), _run("spec", 0, {"a": [1]})], GROUP)
    assert no_ref["equal"] is False and "no good pass reported outputs" in no_ref["groups"][0]["missing"][0]
    failed_ref = compare_outputs([_run("plain", 0, {"a": [1]}, ok=False), _run("spec", 0, {"a": [1]})], GROUP)
    assert failed_ref["equal"] is False
    silent = compare_outputs([_run("plain", 0, {"a": [1]}), _run("spec", 0, {})], GROUP)
    assert silent["equal"] is False and silent["groups"][0]["missing"] == ["spec pass 1: no outputs"]


def test_bench_records_and_labels_differing_outputs(tmp_path):
    def arm(tag, tokens):
        code = ("import json; print(json.dumps({'metrics': {'tokens_per_s': 10.0}, "
                f"'provenance': {{'outputs': {{'p': {tokens!r}}}}}}}))")
        return {"tag": tag, "command": [sys.executable, "-c", code], "env": {}}

    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"arms": [arm("plain", [1, 2]), arm("same", [1, 2]), arm("other", [1, 3])],
                                "same_outputs": [{"reference": "plain", "arms": ["same", "other"]}]}))
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "harness", "bench", "--spec", str(spec), "--passes", "2",
                           "--metric", "tokens_per_s", "--cores", CORES, "--out", str(out), "--allow-busy"],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    art = json.loads(out.read_text())
    assert art["same_outputs"]["equal"] is False
    assert {(d["arm"], d["first_difference"]) for d in art["same_outputs"]["groups"][0]["differ"]} == {("other", 1)}
    assert f"{OUTPUTS_DIFFER}: see same_outputs" in art["labels"]
