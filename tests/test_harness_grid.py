"""harness.grid.bench end to end with synthetic arms: tiny Python commands that print JSON."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.grid import guard
from harness.provenance import KEYS

REPO = Path(__file__).resolve().parent.parent
BENCH = [sys.executable, "-m", "harness", "bench"]  # run in REPO (cwd=REPO)
CORES = ",".join(map(str, sorted(os.sched_getaffinity(0))))


def _arm(tag, code, env=None):
    return {"tag": tag, "command": [sys.executable, "-c", code], "env": env or {}}


def _bench(tmp_path, arms, *extra, passes=3, metric="tokens_per_s", **spec_extra):
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"arms": arms, **spec_extra}))
    out = tmp_path / "out.json"
    proc = subprocess.run([*BENCH, "--spec", str(spec), "--passes", str(passes), "--metric", metric,
                           "--cores", CORES, "--out", str(out), "--allow-busy", *extra],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_rotation_failures_caches_and_provenance(tmp_path):
    log = tmp_path / "order.log"
    record = (f"import json, os, sys; open({str(log)!r}, 'a')"
              ".write(os.environ['TAG'] + ' ' + os.environ['VLLM_CACHE_ROOT'] + '\\n');"
              " print(json.dumps({'tokens_per_s': float(os.environ['V'])}))")
    arms = [
        _arm("a", record, {"TAG": "a", "V": "100"}),
        _arm("b", record, {"TAG": "b", "V": "50"}),
        _arm("boom", "import sys; sys.stderr.write('kaboom on stderr\\n'); sys.exit(3)"),
    ]
    proc, art = _bench(tmp_path, arms)
    assert proc.returncode == 0, proc.stderr
    lines = [ln.split() for ln in log.read_text().splitlines()]
    assert [t for t, _ in lines] == ["a", "b", "b", "a", "a", "b"]  # boom sits between them in the rotation
    caches = {t: c for t, c in lines}
    assert caches["a"] != caches["b"], "each arm has its own VLLM_CACHE_ROOT"
    runs = art["runs"]
    assert [r["tag"] for r in runs] == ["a", "b", "boom", "b", "boom", "a", "boom", "a", "b"]
    failed = [r for r in runs if not r["ok"]]
    assert len(failed) == 3 and all(r["reason"] == "exit status 3" and "kaboom" in r["stderr_tail"] for r in failed)
    assert art["verdict"]["ranking"] == ["a", "b"]
    assert {s["tag"]: s["failed"] for s in art["summary"]["tokens_per_s"]}["boom"] == 3
    assert not [k for k in KEYS if k not in art["provenance"]]
    assert art["provenance"]["git_sha"] and isinstance(art["provenance"]["git_dirty"], bool)
    assert "FAILED boom" in proc.stdout
    # the host probe read the arms' cores before every pass, failed ones too
    assert all(isinstance(r["extra"]["host_sum_gbs"], float) and r["extra"]["host_sum_gbs"] > 0 for r in runs)


def test_host_readings_that_spread_label_the_artifact():
    from harness.grid.host_probe import LABEL, spread_label

    assert spread_label([29.0, 38.0, None, 30.0]).startswith(f"{LABEL}: the host probe read 29.0 to 38.0 GB/s")
    assert spread_label([29.0, 33.0, 30.0]) is None  # inside 15%
    assert spread_label([None, 30.0]) is None and spread_label([]) is None


def test_shared_cache_on_purpose(tmp_path):
    code = "import json, os; print(json.dumps({'tokens_per_s': 1.0, 'root': os.environ['VLLM_CACHE_ROOT']}))"
    proc, art = _bench(tmp_path, [_arm("a", code), _arm("b", code)], passes=1, shared_cache=True)
    assert proc.returncode == 0
    assert len({r["extra"]["vllm_cache_root"] for r in art["runs"]}) == 1


def test_c10_timeout_kills_the_whole_group_and_the_grid_goes_on(tmp_path):
    pidfile = tmp_path / "child.pid"
    hang = ("import subprocess, sys, time; "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)']);"
            f" open({str(pidfile)!r}, 'w').write(str(c.pid)); sys.stderr.write('hanging now\\n'); sys.stderr.flush();"
            " time.sleep(600)")
    ok = "import json; print(json.dumps({'tokens_per_s': 5.0}))"
    t = time.monotonic()
    proc, art = _bench(tmp_path, [_arm("hang", hang), _arm("ok", ok)], "--timeout", "3", passes=2)
    assert time.monotonic() - t < 120
    assert proc.returncode == 0
    hung = [r for r in art["runs"] if r["tag"] == "hang"]
    assert len(hung) == 2 and "timeout after 3 s" in hung[0]["reason"] and "hanging now" in hung[0]["stderr_tail"]
    # not started again: the later pass names the one that timed out
    assert hung[1]["reason"].startswith("not run: pass 1 timed out (timeout after 3 s")
    child = int(pidfile.read_text())

    def gone() -> bool:
        try:
            return Path(f"/proc/{child}/stat").read_text().split()[2] == "Z"
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 10
    while not gone() and time.monotonic() < deadline:  # the group was killed; the kernel reaps it
        time.sleep(0.05)
    assert gone(), f"the hung arm's child {child} outlived the timeout by 10 s"
    assert [r["ok"] for r in art["runs"] if r["tag"] == "ok"] == [True, True]


def test_a_warm_up_start_runs_each_arm_once_before_the_passes_and_is_not_judged(tmp_path):
    log = tmp_path / "starts.log"
    record = (f"import json, os; open({str(log)!r}, 'a').write(os.environ['TAG'] + ' '"
              " + os.environ['VLLM_CACHE_ROOT'] + '\\n'); print(json.dumps({'tokens_per_s': 5.0}))")
    proc, art = _bench(tmp_path, [_arm("a", record, {"TAG": "a"}), _arm("b", record, {"TAG": "b"})],
                       passes=2, warm_up_start=True)
    assert proc.returncode == 0, proc.stderr
    starts = [line.split() for line in log.read_text().splitlines()]
    assert [tag for tag, _ in starts] == ["a", "b", "a", "b", "b", "a"]  # the warm-ups, then the rotated passes
    assert {tag: root for tag, root in starts[:2]} == {tag: root for tag, root in starts[2:4]}  # the same caches
    assert [(r["tag"], r["pass_index"]) for r in art["runs"]] == [("a", 0), ("b", 0), ("b", 1), ("a", 1)]
    assert "warm-up start a (not judged): done" in proc.stdout


def test_single_pass_label_and_unknown_metric(tmp_path):
    ok = "import json; print(json.dumps({'tokens_per_s': 5.0}))"
    proc, art = _bench(tmp_path, [_arm("x", ok), _arm("y", ok)], passes=1)
    assert "single pass, not a result" in proc.stdout
    assert art["verdict"]["ranking"] is None
    proc, art = _bench(tmp_path, [_arm("x", ok)], passes=1, metric="tokens_per_sec")
    assert proc.returncode == 2 and "declare it with its direction" in proc.stderr


def test_check_exit_codes(tmp_path):
    code = "import json; print(json.dumps({'rss_anon_tree_mb': 600.0, 'tg_tps': 1.0}))"
    expect = tmp_path / "expect.json"
    expect.write_text(json.dumps({"metrics": {"rss_anon_tree_mb": {"arm": "x", "value": 500, "band_pct": 5},
                                              "tg_tps": {"arm": "x", "value": 100, "band_pct": 5}}}))
    proc, art = _bench(tmp_path, [_arm("x", code)], "--check", str(expect), passes=2,
                       metric="rss_anon_tree_mb,tg_tps")
    assert proc.returncode == 3
    statuses = {o["metric"]: o["status"] for o in art["check"]["outcomes"]}
    assert statuses == {"rss_anon_tree_mb": "regression", "tg_tps": "ungateable"}


def test_guard_with_canned_samples():
    busy = guard.CoreIdleCheck(sampler=lambda w: [80.0, 0.0])
    found = busy.run(cores=[0, 1])
    assert {f.level for f in found} == {"error"} and any("busy cores" in f.message for f in found)
    quiet = guard.CoreIdleCheck(sampler=lambda w: [1.0, 2.0])
    assert [f.level for f in quiet.run(cores=[0, 1])] == ["advice"]
    samples = iter([[90.0, 0.0], [3.0, 0.0]])  # one burst is forgiven: min of the two windows
    burst = guard.CoreIdleCheck(sampler=lambda w: next(samples))
    assert [f.level for f in burst.run(cores=[0, 1])] == ["advice"]
    mean = guard.CoreIdleCheck(sampler=lambda w: [20.0, 20.0])
    assert any("mean utilisation" in f.message for f in mean.run(cores=[0, 1]))


def test_guard_refuses_a_really_busy_core(tmp_path):
    core = max(os.sched_getaffinity(0))
    spin = subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", "while True: pass"])
    try:
        spinning, deadline = psutil.Process(spin.pid), time.monotonic() + 30
        while spinning.cpu_times().user < 0.5 and time.monotonic() < deadline:  # it has been spinning a while
            time.sleep(0.05)
        spec = tmp_path / "spec.json"
        spec.write_text(json.dumps({"arms": [_arm("x", "print('{\"tokens_per_s\": 1}')")]}))
        args = [*BENCH, "--spec", str(spec), "--passes", "1", "--metric", "tokens_per_s", "--cores", str(core),
                "--out", str(tmp_path / "o.json")]
        refused = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=REPO)
        assert refused.returncode == 1 and "refusing" in refused.stderr
        assert not (tmp_path / "o.json").exists()
        allowed = subprocess.run([*args, "--allow-busy"], capture_output=True, text=True, timeout=120)
        assert allowed.returncode == 0
        assert json.loads((tmp_path / "o.json").read_text())["labels"][0].startswith("BUSY CORES")
    finally:
        spin.kill()
        spin.wait()


def test_results_list_plot_and_retract(tmp_path, monkeypatch):
    ok = "import json; print(json.dumps({'tokens_per_s': 5.0}))"
    _, art = _bench(tmp_path, [_arm("x", ok), _arm("y", ok)], passes=2)
    monkeypatch.chdir(REPO)  # python -m harness runs from the repository
    results = [sys.executable, "-m", "harness", "results"]
    out = tmp_path / "out.json"
    png = subprocess.run([*results, "plot", str(out)], capture_output=True, text=True, timeout=120)
    assert png.returncode == 0 and Path(png.stdout.strip()).read_bytes()[:4] == b"\x89PNG"
    before = json.loads(out.read_text())
    (tmp_path / "new.json").write_text(out.read_text())  # the replacement must exist and be published
    r = subprocess.run([*results, "retract", str(out), "--reason", "cores were busy", "--superseded-by", "new.json"],
                       capture_output=True, text=True)
    assert r.returncode == 0
    after = json.loads(out.read_text())
    assert after["retracted"] is True and after["retraction"]["superseded_by"] == "new.json"
    assert after["runs"] == before["runs"], "retraction keeps the data"
    again = subprocess.run([*results, "retract", str(out), "--reason", "x"], capture_output=True, text=True)
    assert again.returncode == 2 and "already retracted" in again.stderr
    listing = subprocess.run([*results, "list", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert "RETRACTED (cores were busy)" in listing.stdout
    again = subprocess.run([*results, "supersede", str(out), "--by", "other.json"], capture_output=True, text=True)
    assert again.returncode == 2 and "already superseded by new.json" in again.stderr


def test_supersede_a_retraction_made_before_its_replacement(tmp_path, monkeypatch):
    ok = "import json; print(json.dumps({'tokens_per_s': 5.0}))"
    _bench(tmp_path, [_arm("x", ok), _arm("y", ok)], passes=2)
    old, new = tmp_path / "old.json", tmp_path / "new.json"
    (tmp_path / "out.json").rename(old)
    monkeypatch.chdir(REPO)  # python -m harness runs from the repository
    results = [sys.executable, "-m", "harness", "results"]
    early = subprocess.run([*results, "supersede", str(old), "--by", "new.json"], capture_output=True, text=True)
    assert early.returncode == 2 and "is not retracted" in early.stderr
    subprocess.run([*results, "retract", str(old), "--reason", "judge bug"], check=True, capture_output=True)
    missing = subprocess.run([*results, "supersede", str(old), "--by", "new.json"], capture_output=True, text=True)
    assert missing.returncode == 2 and "new.json" in missing.stderr, "the replacement must exist"
    _bench(tmp_path, [_arm("x", ok), _arm("y", ok)], passes=2)
    (tmp_path / "out.json").rename(new)
    before = json.loads(old.read_text())
    done = subprocess.run([*results, "supersede", str(old), "--by", "new.json"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    after = json.loads(old.read_text())
    assert after["retraction"]["superseded_by"] == "new.json" and after["retraction"]["reason"] == "judge bug"
    assert after["runs"] == before["runs"]


def test_non_finite_metrics_are_failed_passes_not_winners(tmp_path):
    inf = "print('{\"tokens_per_s\": Infinity}')"
    nan = "print('{\"tokens_per_s\": NaN}')"
    ok = "print('{\"tokens_per_s\": 5.0}')"
    proc, art = _bench(tmp_path, [_arm("inf", inf), _arm("nan", nan), _arm("ok", ok)], passes=2)
    assert proc.returncode == 0
    bad = [r for r in art["runs"] if r["tag"] in ("inf", "nan")]
    assert bad and all(not r["ok"] and "non-finite" in r["reason"] for r in bad)
    assert art["verdict"]["ranking"] is None
    json.loads((tmp_path / "out.json").read_text(), parse_constant=lambda c: pytest.fail(f"{c} in artifact"))


@pytest.mark.parametrize(("value", "shown"), [("None", "null"), ("'fast'", '"fast"'), ("True", "true")])
def test_a_non_numeric_metric_fails_its_pass_end_to_end(tmp_path, value, shown):
    """``null``, a string or a bool is a failed pass with the value named, never a dropped metric (the
    arm then has no good pass, and the verdict says so instead of losing it)."""
    odd = f"import json; print(json.dumps({{'tokens_per_s': {value}, 'rss_anon_tree_mb': 5.0}}))"
    ok = "import json, os; print(json.dumps({'tokens_per_s': float(os.environ['V']), 'rss_anon_tree_mb': 5.0}))"
    arms = [_arm("odd", odd), _arm("a", ok, {"V": "9"}), _arm("b", ok, {"V": "3"})]
    proc, art = _bench(tmp_path, arms, passes=2)
    assert proc.returncode == 0, proc.stderr
    odd_runs = [r for r in art["runs"] if r["tag"] == "odd"]
    assert odd_runs and all(not r["ok"] and f"not a number: tokens_per_s={shown}" in r["reason"]
                            for r in odd_runs), odd_runs
    assert art["verdict"]["ranking"] == ["a", "b"]
    assert "not judged: odd (0 good pass(es), 2 failed" in art["verdict"]["text"]
    assert "FAILED odd pass 1: metric value(s) not a number" in proc.stdout


def test_a_pass_missing_a_metric_its_arm_reported_elsewhere_fails(tmp_path):
    """The metric that went missing in one pass fails that pass; start_cold_s / start_warm_s are one group
    (the first start reports cold, later ones warm) and an arm that never reports a metric is named."""
    flaky = ("import json, os, pathlib; f = pathlib.Path(os.environ['VLLM_CACHE_ROOT']) / 'n';"
             " n = int(f.read_text()) if f.exists() else 0; f.parent.mkdir(parents=True, exist_ok=True);"
             " f.write_text(str(n + 1)); m = {'tokens_per_s': 4.0 + n};"
             " m.update({'start_cold_s' if n == 0 else 'start_warm_s': 1.0 + n});"
             " m.update({} if n == 1 else {'rss_anon_tree_mb': 10.0}); print(json.dumps(m))")
    plain = "print('{\"tokens_per_s\": 1.0}')"
    proc, art = _bench(tmp_path, [_arm("flaky", flaky), _arm("plain", plain)], passes=3,
                       metric="tokens_per_s,rss_anon_tree_mb,start_warm_s")
    assert proc.returncode == 0, proc.stderr
    flaky_runs = sorted((r for r in art["runs"] if r["tag"] == "flaky"), key=lambda r: r["pass_index"])
    assert [r["ok"] for r in flaky_runs] == [True, False, True]
    assert flaky_runs[1]["reason"] == ("missing metric(s) the arm reported in other passes: "
                                       "rss_anon_tree_mb (reported in pass 1, 3)")
    assert "not reported by: plain" in art["verdicts"]["rss_anon_tree_mb"]["text"]
    assert "not reported by: plain" in art["verdicts"]["start_warm_s"]["text"]


def test_an_arm_that_leaves_out_its_provenance_is_labelled(tmp_path):
    arm = _arm("bare", "print('{\"metrics\": {\"tokens_per_s\": 2.0}, \"provenance\": {\"platform\": \"x\"}}')")
    proc, art = _bench(tmp_path, [arm], passes=2)
    assert proc.returncode == 0, proc.stderr
    label = next(lb for lb in art["labels"] if lb.startswith("ARM PROVENANCE INCOMPLETE: bare"))
    assert "model_sha256" in label and "platform" not in label


@pytest.mark.parametrize("case", ["no_arms", "env_list", "command_int", "cores", "check_missing", "out_dir"])
def test_bad_arguments_are_refused_before_any_pass(tmp_path, case):
    marker = tmp_path / "ran"
    arm = _arm("x", f"open({str(marker)!r}, 'w'); print('{{\"tokens_per_s\": 1}}')")
    arms, extra, cores = [arm], [], CORES
    if case == "no_arms":
        arms = []
    elif case == "env_list":
        arms = [{**arm, "env": ["A"]}]
    elif case == "command_int":
        arms = [{**arm, "command": 5}]
    elif case == "cores":
        cores = "abc"
    elif case == "check_missing":
        extra = ["--check", str(tmp_path / "missing.json")]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"arms": arms}))
    out = tmp_path / ("outdir" if case == "out_dir" else "out.json")
    if case == "out_dir":
        out.mkdir()
    proc = subprocess.run([*BENCH, "--spec", str(spec), "--passes", "1", "--metric", "tokens_per_s", "--cores", cores,
                           "--out", str(out), "--allow-busy", *extra], capture_output=True, text=True, timeout=120,
                          cwd=REPO)
    assert proc.returncode == 2, proc.stderr
    assert "harness bench: error:" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists(), "no arm may run before the arguments are known good"


def _harness_copy(root: Path, git: bool) -> tuple[Path, str | None]:
    import shutil

    shutil.copytree(REPO / "harness", root / "harness", ignore=shutil.ignore_patterns("results", "__pycache__"))
    if not git:
        return root, None
    cmd = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    subprocess.run([*cmd, "init", "-q"], check=True)
    subprocess.run([*cmd, "add", "-A"], check=True)
    subprocess.run([*cmd, "commit", "-qm", "x"], check=True)
    return root, subprocess.run([*cmd, "rev-parse", "HEAD"], capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.parametrize("case", ["quiet_out_inside", "tracked_edit", "untracked_edit", "no_git"])
def test_code_changed_during_a_run_is_labelled(tmp_path, case):
    """Provenance is taken before the first pass; code edited while the arms run is labelled,
    the run's own output is not a code change, and a tree git cannot read is said so."""
    repo, head = _harness_copy(tmp_path / "repo", git=case != "no_git")
    out = tmp_path / "out.json"
    target = repo / "harness" / "grid" / "metrics.py"
    if case == "quiet_out_inside":
        out = repo / "runs" / "out.json"  # the artifact and its caches land inside the checkout
    if case == "untracked_edit":
        target = repo / "harness" / "scratch_mod.py"
        target.write_text("x = 1\n")  # untracked before the run
    write = (f"import json, os; open({str(target)!r}, 'a').write('# edited\\n');"
             " os.makedirs(os.environ['VLLM_CACHE_ROOT'], exist_ok=True);"
             " print(json.dumps({'tokens_per_s': 1.0}))")
    quiet = ("import json, os; os.makedirs(os.environ['VLLM_CACHE_ROOT'], exist_ok=True);"
             " print(json.dumps({'tokens_per_s': 1.0}))")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"arms": [_arm("a", quiet if case in ("quiet_out_inside", "no_git") else write)]}))
    proc = subprocess.run([*BENCH, "--spec", str(spec),
                           "--passes", "2", "--metric", "tokens_per_s", "--cores", CORES, "--out", str(out),
                           "--allow-busy"], capture_output=True, text=True, timeout=300, cwd=repo)
    assert proc.returncode == 0, proc.stderr
    art = json.loads(out.read_text())
    prov, labels = art["provenance"], art["labels"]
    changed = any(label.startswith("CODE CHANGED DURING RUN") for label in labels)
    if case == "no_git":
        assert prov["git_sha"] is None and prov["git_dirty"] is None and prov["git_state"] is None
        assert any(label.startswith("NO GIT PROVENANCE") for label in labels) and not changed
        return
    assert prov["git_sha"] == head, "stamped as it was before the first pass"
    assert prov["git_dirty"] is (case == "untracked_edit")
    assert changed is (case != "quiet_out_inside"), labels
    assert ("git_state_end" in prov) is changed


def test_results_list_says_no_result_and_plot_names_a_bad_file(tmp_path, monkeypatch):
    fail = "import sys; sys.exit(4)"
    proc, art = _bench(tmp_path, [_arm("x", fail)], passes=2)
    assert proc.returncode == 0 and not any(r["ok"] for r in art["runs"])
    monkeypatch.chdir(REPO)  # python -m harness runs from the repository
    results = [sys.executable, "-m", "harness", "results"]
    listing = subprocess.run([*results, "list", "--dir", str(tmp_path)], capture_output=True, text=True)
    lines = listing.stdout.splitlines()
    state = lines[lines.index("out.json") + 1]
    assert "NO RESULT (all 2 passes failed)" in state and "published" not in state
    empty = subprocess.run([*results, "plot", str(tmp_path / "out.json")], capture_output=True, text=True, timeout=120)
    assert empty.returncode == 2 and "no good pass to plot" in empty.stderr
    bad = tmp_path / "notes.json"
    bad.write_text("this is not json")
    plot = subprocess.run([*results, "plot", str(bad)], capture_output=True, text=True, timeout=120)
    assert plot.returncode == 2 and str(bad) in plot.stderr and "not JSON" in plot.stderr


def test_replacements_must_be_other_published_artifacts_and_bad_rows_do_not_stop_list(tmp_path, monkeypatch):
    ok = "import json; print(json.dumps({'tokens_per_s': 5.0}))"
    monkeypatch.chdir(REPO)  # python -m harness runs from the repository
    results = [sys.executable, "-m", "harness", "results"]
    names = []
    for name in ("a.json", "b.json", "c.json"):
        _bench(tmp_path, [_arm("x", ok), _arm("y", ok)], passes=2)
        (tmp_path / "out.json").rename(tmp_path / name)
        names.append(tmp_path / name)
    a, b, c = names

    def run(*args):
        return subprocess.run([*results, *map(str, args)], capture_output=True, text=True)

    r = run("retract", a, "--reason", "x", "--superseded-by", "missing.json")
    assert r.returncode == 2 and "missing.json" in r.stderr and json.loads(a.read_text())["retracted"] is False
    assert run("retract", b, "--reason", "y").returncode == 0
    r = run("retract", a, "--reason", "x", "--superseded-by", "b.json")
    assert r.returncode == 2 and "itself retracted" in r.stderr
    assert run("retract", a, "--reason", "x").returncode == 0
    r = run("supersede", a, "--by", "a.json")
    assert r.returncode == 2 and "cannot supersede itself" in r.stderr
    assert run("supersede", a, "--by", "c.json").returncode == 0
    bad = json.loads(c.read_text()) | {"provenance": None, "runs": ["x"], "labels": [3]}
    (tmp_path / "d.json").write_text(json.dumps(bad))
    fidelity = {"kind": "fidelity", "result": {"top1_agreement": 0.9, "mean_kl_top20": 0.2, "positions": 512}}
    (tmp_path / "e.json").write_text(json.dumps(fidelity))  # another command's artifact: listed, not judged
    listing = run("list", "--dir", tmp_path)
    assert listing.returncode == 0, listing.stderr
    out = listing.stdout.splitlines()
    assert "UNREADABLE: malformed artifact" in out[out.index("d.json") + 2]
    assert "superseded by c.json" in out[out.index("a.json") + 1]
    assert out[out.index("e.json") + 1:out.index("e.json") + 3] == [
        "    published (fidelity: a measurement, no judged passes)",
        "    fidelity: top-1 0.900, mean KL 0.200 (512 positions)"]


def test_a_failed_pass_names_the_first_exception_its_stderr_shows(tmp_path):
    """The user-size run on an AVX2 CPU: stock vLLM's GPTQ arm died in its worker (AttributeError:
    no _C.cpu_gemm_wna16) and the kept 30-line tail held only the front end's generic RuntimeError.
    The reason now names the first exception of the whole stderr."""
    noise = "".join(f"(Worker) INFO line {i}\n" for i in range(60))
    code = ("import sys; sys.stderr.write(\"(Worker pid=1) ERROR x.py:1] AttributeError: '_OpNamespace' '_C' "
            "object has no attribute 'cpu_gemm_wna16'\\n\" + " + repr(noise) + " + "
            "'RuntimeError: Engine core initialization failed.\\n'); sys.exit(1)")
    proc, art = _bench(tmp_path, [_arm("gptq", code), _arm("ok", "print('{\"tokens_per_s\": 5.0}')")], passes=2)
    assert proc.returncode == 0, proc.stderr
    failed = [r for r in art["runs"] if r["tag"] == "gptq"]
    assert failed and all(r["reason"] == "exit status 1 (AttributeError: '_OpNamespace' '_C' object has no "
                          "attribute 'cpu_gemm_wna16')" for r in failed), failed[0]["reason"]
    assert all("cpu_gemm_wna16" not in r["stderr_tail"] for r in failed), "the tail alone would not have said"


def test_an_arm_whose_output_cannot_be_judged_fails_its_pass_and_the_run_is_kept(tmp_path):
    """An integer too large for a float, or a provenance that is not an object, fails that pass with the
    reason; the grid goes on, the artifact is written and every arm is named in the verdict."""
    huge = "print('{\"tokens_per_s\": 1' + '0' * 400 + '}')"
    prov = "print('{\"metrics\": {\"tokens_per_s\": 10}, \"provenance\": 5}')"
    ok = "print('{\"tokens_per_s\": 7.0}')"
    proc, art = _bench(tmp_path, [_arm("huge", huge), _arm("prov", prov), _arm("ok", ok)], passes=2)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    reasons = {r["tag"]: r["reason"] for r in art["runs"] if not r["ok"]}
    assert "non-finite metric(s) ['tokens_per_s']" in reasons["huge"]
    assert '"provenance" (and its "measured_differently") must be JSON objects, got 5' in reasons["prov"]
    text = art["verdict"]["text"]
    assert "judged alone: ok" in text and "huge (0 good pass(es), 2 failed" in text and "prov (0 good" in text


def test_out_is_checked_before_any_pass_and_a_published_artifact_is_never_overwritten(tmp_path):
    marker = tmp_path / "ran"
    arm = _arm("x", f"open({str(marker)!r}, 'w'); print('{{\"tokens_per_s\": 1}}')")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"arms": [arm]}))
    (tmp_path / "afile").write_text("x")
    published = sorted((REPO / "harness" / "results").glob("decode_vs_llamacpp-*.json"))[0]
    for out, words in ((tmp_path / "afile" / "x.json", "is a file, not a directory"),
                       (published, "is a published artifact, never overwritten")):
        before = published.read_bytes()
        proc = subprocess.run([*BENCH, "--spec", str(spec), "--passes", "1", "--metric", "tokens_per_s", "--cores",
                               CORES, "--out", str(out), "--allow-busy"], capture_output=True, text=True, timeout=120,
                              cwd=REPO)
        assert proc.returncode == 2 and words in proc.stderr, proc.stderr
        assert not marker.exists() and published.read_bytes() == before


def test_a_spec_carries_its_metrics_passes_and_timeout(tmp_path):
    """``python -m harness bench --spec X`` alone: the spec says what to measure, how often and how long a pass may
    take; ``--passes`` on the command line overrides the spec for one run; a spec without them is refused."""
    arm = _arm("a", "print('{\"tokens_per_s\": 5, \"rss_anon_tree_mb\": 7}')")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"arms": [arm], "metrics": ["tokens_per_s", "rss_anon_tree_mb"], "passes": 2,
                                "timeout_s": 77}))
    out = tmp_path / "out.json"
    run = [*BENCH, "--spec", str(spec), "--out", str(out), "--allow-busy"]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    art = json.loads(out.read_text())
    assert (art["metrics"], art["passes"], art["timeout_s"]) == (["tokens_per_s", "rss_anon_tree_mb"], 2, 77.0)
    assert len(art["runs"]) == 2
    out.unlink()
    proc = subprocess.run([*run, "--passes", "1"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0 and json.loads(out.read_text())["passes"] == 1, proc.stderr
    spec.write_text(json.dumps({"arms": [arm], "passes": 2}))
    proc = subprocess.run(run, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2 and 'has no "metrics"' in proc.stderr, proc.stderr


def test_every_bench_spec_carries_known_metrics_and_its_passes():
    """The Makefile and docs run ``python -m harness bench --spec X`` alone: each spec (the paired ones have their
    own runner) names metrics the judge knows, its passes and its timeout."""
    from harness.grid.metrics import get_metric

    specs = [p for p in sorted((REPO / "harness" / "specs").glob("*.json"))
             if "rounds" not in json.loads(p.read_text())]
    assert specs
    for p in specs:
        spec = json.loads(p.read_text())
        assert spec.get("metrics") and isinstance(spec.get("passes"), int) and spec["passes"] >= 1, p.name
        assert float(spec.get("timeout_s", 900)) > 0, p.name
        for m in spec["metrics"]:
            get_metric(m)
