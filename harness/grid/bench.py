"""Side-by-side measurement of arms, with the rules that keep a number honest.

    python -m harness bench --spec ARMS.json [--passes N] [--metric NAME[,NAME...]] [--timeout S]
        [--cores LIST] [--out FILE] [--check EXPECT.json] [--allow-busy] [--allow-dirty]

A spec is ``{"arms": [{"tag", "command", "env"}], "metrics": [NAME, ...], "passes": N, "timeout_s": S,
"shared_cache": false}``: the spec carries what it measures (``metrics``, the first one ranked), how often
(``passes``) and how long an arm pass may take (``timeout_s``, default 900); ``--metric``, ``--passes`` and
``--timeout`` override them for one run. ``--cores`` defaults to the CPUs this process may use, ``--out`` to
``harness/results/<spec name>-<UTC time>.json``. Optionally
``"same_outputs"``: groups of arms whose greedy outputs must equal a reference arm's,
``harness/grid/outputs.py``, recorded as the artifact's ``same_outputs``; and ``"warm_up_start": true``:
each arm is started once before pass 1, unmeasured, so that every judged pass starts from a filled
compile cache, for specs that measure the steady state rather than a cold start); ``command``
is a list (or a string split like a shell would), where ``{python}`` stands for this
interpreter and ``{repo}`` for the repository. Each arm prints one JSON object on its
last stdout line. The first ``--metric`` is the one ranked.

Rules enforced here (docs/methodology.md): arms pinned to ``--cores`` after a
pre-flight idleness check; arm order rotated every pass; a private ``VLLM_CACHE_ROOT``
per arm unless the spec shares one; each arm in its own process group, killed whole on
timeout; failures recorded with their stderr tail; "best" by the metric's declared
direction; no ranking inside the noise; provenance taken before the first pass and
stamped into the artifact, with a label when the code changed during the run.

Exit status: 0 done; 1 the core guard refused; 2 bad arguments, unknown metric, or a headline
artifact (``--out`` in harness/results/) asked for on a dirty tree without ``--allow-dirty``;
3 ``--check`` found a regression.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from harness import REPO, provenance
from harness.grid import guard
from harness.grid.host_probe import HostProbe, spread_label
from harness.grid.judge import judge_runs
from harness.grid.metrics import UnknownMetricError, get_metric
from harness.grid.outputs import OUTPUTS_DIFFER, compare_outputs
from harness.grid.runner import PassResult, run_pass

__all__ = ["FORMAT_VERSION", "arm_provenance_gaps", "check_expectations", "fail_incomplete_passes", "main", "rotation",
           "run_grid"]

FORMAT_VERSION = 2
"""Artifact format. 1: format_version, kind, created_unix, spec, passes, metrics,
runs[], summary{metric: [ArmSummary]}, verdict, provenance, guard[], labels[],
check, retracted, retraction. 2: verdicts{metric: Verdict}, every metric judged (``verdict``
stays, the first metric's)."""


def rotation(n_arms: int, pass_index: int) -> list[int]:
    """Arm indices in the order of pass ``pass_index``: pass p starts at arm p mod n."""
    start = pass_index % n_arms
    return [(start + i) % n_arms for i in range(n_arms)]


def parse_cores(text: str) -> list[int]:
    """``"0-1,3"`` -> ``[0, 1, 3]``."""
    cores: set[int] = set()
    for part in text.split(","):
        if "-" in part:
            a, b = part.split("-")
            cores.update(range(int(a), int(b) + 1))
        elif part:
            cores.add(int(part))
    return sorted(cores)


def _command(arm: dict[str, Any]) -> list[str]:
    cmd = arm["command"]
    parts = shlex.split(cmd) if isinstance(cmd, str) else list(cmd)
    return [p.replace("{python}", sys.executable).replace("{repo}", str(REPO)) for p in parts]


def _progress(line: str) -> None:
    print(line, flush=True)


def run_grid(spec: dict[str, Any], passes: int, cores: list[int], timeout_s: float, cache_base: Path,
             progress=_progress) -> list[PassResult]:
    """Run every arm ``passes`` times in rotated order; failed passes are kept.

    An arm whose pass outlived ``timeout_s`` is not started again: its later passes are recorded
    as failed, naming the pass that timed out (a timeout is the arm's, not the moment's: a rerun
    costs the whole timeout again and ends the same way.

    Before each pass, one reading of the host probe (:mod:`harness.grid.host_probe`, one process for
    the run, pinned to ``cores``) goes into the pass's ``extra.host_sum_gbs``."""
    with HostProbe(cores) as probe:
        return _passes(spec, passes, cores, timeout_s, cache_base, probe, progress)


def _passes(spec: dict, passes: int, cores: list[int], timeout_s: float, cache_base: Path, probe: HostProbe,
            progress) -> list[PassResult]:
    """:func:`run_grid`'s loop, with a reading of ``probe`` before each pass (``extra.host_sum_gbs``)."""
    arms = spec["arms"]
    shared = bool(spec.get("shared_cache", False))
    results: list[PassResult] = []
    timed_out: dict[str, str] = {}
    if spec.get("warm_up_start"):
        for arm in arms:
            r = run_pass(arm["tag"], _command(arm), _arm_env(arm, cache_base, shared), cores, timeout_s, -1, 0)
            progress(f"warm-up start {arm['tag']} (not judged): " + ("done" if r.ok else f"FAILED ({r.reason})"))
    for p in range(passes):
        for position, i in enumerate(rotation(len(arms), p)):
            arm = arms[i]
            if arm["tag"] in timed_out:
                r = PassResult(arm["tag"], p, position, False, None, 0.0,
                               f"not run: {timed_out[arm['tag']]}; a rerun would time out the same way")
                progress(f"pass {p + 1}/{passes} #{position + 1} {arm['tag']}: FAILED ({r.reason})")
                results.append(r)
                continue
            env = _arm_env(arm, cache_base, shared)
            host = probe.read()
            r = run_pass(arm["tag"], _command(arm), env, cores, timeout_s, p, position)
            r.extra["vllm_cache_root"] = env["VLLM_CACHE_ROOT"]
            r.extra["host_sum_gbs"] = host
            progress(f"pass {p + 1}/{passes} #{position + 1} {arm['tag']} (host probe {host} GB/s): "
                     + (", ".join(f"{k}={v:g}" for k, v in r.metrics.items()) if r.ok else f"FAILED ({r.reason})"))
            results.append(r)
            if not r.ok and (r.reason or "").startswith("timeout after"):
                timed_out[arm["tag"]] = f"pass {p + 1} timed out ({r.reason})"
    return results


def _arm_env(arm: dict[str, Any], cache_base: Path, shared: bool) -> dict[str, str]:
    """The arm's environment: ours, its ``env``, and its ``VLLM_CACHE_ROOT`` (private, or the run's shared one)
    unless it sets its own."""
    env = {**os.environ, **{k: str(v) for k, v in arm.get("env", {}).items()}}
    if "VLLM_CACHE_ROOT" not in arm.get("env", {}):
        env["VLLM_CACHE_ROOT"] = str(cache_base / ("shared" if shared else arm["tag"]))
    return env


def _group(name: str) -> str:
    """The metric group a pass must report (a metric's ``one_of``, else the metric itself)."""
    try:
        return get_metric(name).one_of or name
    except UnknownMetricError:
        return name


def fail_incomplete_passes(runs: list[PassResult]) -> None:
    """Mark failed, in place, every good pass that lacks a metric (or every metric of a ``one_of`` group)
    that a good pass of the same arm reported: a measurement that went missing is a failure, never a
    smaller sample. The reason names what is missing and the passes that had it."""
    reported: dict[str, dict[str, list[int]]] = {}
    for r in runs:
        if r.ok:
            for name in r.metrics:
                reported.setdefault(r.tag, {}).setdefault(_group(name), []).append(r.pass_index + 1)
    for r in runs:
        if not r.ok:
            continue
        have = {_group(name) for name in r.metrics}
        missing = {g: p for g, p in reported.get(r.tag, {}).items() if g not in have}
        if missing:
            r.ok = False
            r.reason = "missing metric(s) the arm reported in other passes: " + "; ".join(
                f"{g} (reported in pass {', '.join(map(str, sorted(set(p))))})" for g, p in sorted(missing.items()))


def arm_provenance_gaps(runs: list[PassResult]) -> dict[str, list[str]]:
    """``{tag: [missing ARM_KEYS]}`` over each arm's good passes (what an arm must say about itself:
    :data:`harness.provenance.ARM_KEYS`); arms that report every key are absent."""
    gaps: dict[str, set[str]] = {}
    for r in runs:
        if r.ok:
            missing = provenance.missing_keys(r.arm_provenance, provenance.ARM_KEYS)
            if missing:
                gaps.setdefault(r.tag, set()).update(missing)
    return {tag: sorted(keys) for tag, keys in sorted(gaps.items())}


def check_expectations(summary: dict[str, list[dict]], expect: dict[str, Any]) -> dict[str, Any]:
    """Compare medians with ``expect``: ``{"metrics": {NAME: {"arm", "value", "band_pct"}}}``.

    A gateable metric outside its band in the worse direction is a regression; a
    non-gateable one (end-to-end throughput) is reported as ``ungateable``.
    """
    outcomes = []
    regression = False
    for name, rule in expect.get("metrics", {}).items():
        metric = get_metric(name)
        arm = next((s for s in summary.get(name, []) if s["tag"] == rule["arm"]), None)
        if arm is None or arm["median"] is None:
            outcomes.append({"metric": name, "arm": rule["arm"], "status": "missing"})
            regression = True
            continue
        limit = rule["value"] * (1 + rule["band_pct"] / 100 * (1 if metric.direction.value == "lower" else -1))
        worse = metric.better(limit, arm["median"])
        if not metric.gateable:
            status = "ungateable"
        else:
            status = "regression" if worse else "ok"
            regression |= worse
        outcomes.append({"metric": name, "arm": rule["arm"], "median": arm["median"], "expected": rule["value"],
                         "band_pct": rule["band_pct"], "limit": limit, "status": status})
    return {"regression": regression, "outcomes": outcomes}


def _table(summary: dict[str, list[dict]], metric_names: list[str]) -> str:
    lines = []
    for name in metric_names:
        m = get_metric(name)
        lines.append(f"{name} [{m.unit}, {m.direction.value} is better]")
        lines.append(f"  {'arm':28s} {'n':>2s} {'fail':>4s} {'median':>10s} {'best':>10s} {'min':>10s} "
                     f"{'max':>10s} {'spread%':>8s}")
        for s in summary[name]:
            def f(v):
                return f"{v:10.2f}" if v is not None else f"{'-':>10s}"
            spread = f"{s['spread_pct']:8.1f}" if s["spread_pct"] is not None else f"{'-':>8s}"
            label = f"  [{s['label']}]" if s["label"] else ""
            lines.append(f"  {s['tag']:28s} {s['n']:2d} {s['failed']:4d} {f(s['median'])} {f(s['best'])} "
                         f"{f(s['min'])} {f(s['max'])} {spread}{label}")
    return "\n".join(lines)


DEFAULT_TIMEOUT_S = 900.0


def resolve_settings(args: argparse.Namespace, spec: Any) -> str | None:
    """Fill ``args.metric``, ``args.passes``, ``args.timeout``, ``args.cores`` and ``args.out`` left unset on the
    command line from ``spec`` (``metrics``, ``passes``, ``timeout_s``), this process's CPUs and the spec's name.
    Returns the problem when the spec lacks what the command line did not give, else None."""
    spec = spec if isinstance(spec, dict) else {}
    if args.metric is None:
        metrics = spec.get("metrics")
        if not (isinstance(metrics, list) and metrics and all(isinstance(m, str) for m in metrics)):
            return f"spec {args.spec} has no \"metrics\" (a list of metric names) and --metric was not given"
        args.metric = ",".join(metrics)
    if args.passes is None:
        passes = spec.get("passes")
        if not isinstance(passes, int) or isinstance(passes, bool):
            return f"spec {args.spec} has no \"passes\" (an integer) and --passes was not given"
        args.passes = passes
    if args.timeout is None:
        args.timeout = float(spec.get("timeout_s", DEFAULT_TIMEOUT_S))
    if args.cores is None:
        args.cores = ",".join(str(c) for c in sorted(os.sched_getaffinity(0)))
    if args.out is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        args.out = REPO / "harness" / "results" / f"{args.spec.stem}-{stamp}.json"
    return None


def _validate(args: argparse.Namespace) -> str | None:
    """Everything checkable before the first pass (a grid can take an hour): the problem, or None. Fills the
    settings the command line left to the spec first (:func:`resolve_settings`)."""
    try:
        spec = json.loads(args.spec.read_text())
    except (OSError, ValueError) as e:
        return f"spec {args.spec} is not usable: {type(e).__name__}: {e}"
    problem = resolve_settings(args, spec)
    if problem:
        return problem
    metric_names = [m for m in args.metric.split(",") if m]
    if not metric_names:
        return "--metric names no metric"
    try:
        for m in metric_names:
            get_metric(m)
    except UnknownMetricError as e:
        return str(e)
    arms = spec.get("arms") if isinstance(spec, dict) else None
    if not isinstance(arms, list) or not arms:
        return (f"spec {args.spec} is not usable: expected "
                f"{{\"arms\": [{{\"tag\", \"command\", \"env\"}}, ...]}} with at least one arm")
    seen: set[str] = set()
    for i, a in enumerate(arms):
        if not isinstance(a, dict) or not isinstance(a.get("tag"), str) or not a["tag"]:
            return f"spec arm #{i + 1} needs a non-empty string \"tag\""
        if a["tag"] in seen:
            return f"spec arm tag {a['tag']!r} appears twice; tags must be unique"
        seen.add(a["tag"])
        cmd = a.get("command")
        is_list = isinstance(cmd, list) and cmd and all(isinstance(c, str) for c in cmd)
        if not (isinstance(cmd, str) and cmd.strip()) and not is_list:
            return f"spec arm {a['tag']!r}: \"command\" must be a string or a list of strings"
        if not isinstance(a.get("env", {}), dict):
            return f"spec arm {a['tag']!r}: \"env\" must be an object of NAME: value"
    if args.passes < 1:
        return f"--passes must be >= 1, got {args.passes}"
    try:
        cores = parse_cores(args.cores)
    except ValueError:
        return f"--cores {args.cores!r} is not a CPU list like 0-1 or 0,2"
    if not cores:
        return "--cores names no CPU"
    out_problem = provenance.out_problem(args.out)
    if out_problem:
        return out_problem
    if args.check is not None:
        try:
            expect = json.loads(args.check.read_text())
            for name, rule in expect.get("metrics", {}).items():
                get_metric(name)
                float(rule["value"]), float(rule["band_pct"]), str(rule["arm"])
        except UnknownMetricError as e:
            return f"--check {args.check}: {e}"
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            return (f"--check {args.check} is not usable ({type(e).__name__}: {e}); expected "
                    "{\"metrics\": {NAME: {\"arm\", \"value\", \"band_pct\"}}}")
    return None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m harness bench", description=__doc__.split("\n")[0])
    ap.add_argument("--spec", required=True, type=Path)
    ap.add_argument("--passes", type=int, default=None, help="default: the spec's \"passes\"")
    ap.add_argument("--metric", default=None, help="metric(s) to summarize and judge, comma-separated "
                                                  "(default: the spec's \"metrics\")")
    ap.add_argument("--cores", default=None, help="cores to pin the arms to, e.g. 0-1 (default: this process's)")
    ap.add_argument("--out", type=Path, default=None,
                    help="the artifact (default: harness/results/<spec name>-<UTC time>.json)")
    ap.add_argument("--check", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds per arm pass (default: the spec's \"timeout_s\", else 900)")
    ap.add_argument("--allow-busy", action="store_true")
    provenance.add_allow_dirty(ap)
    ap.add_argument("--max-mean-busy", type=float, default=5.0, help="percent")
    ap.add_argument("--max-core-busy", type=float, default=50.0, help="percent")
    return ap


def _preflight(args: argparse.Namespace, cores: list[int]) -> tuple[list, list[str], int | None]:
    """The core guard: (findings, labels, exit status when the run must not start)."""
    checks = [guard.AffinityCheck(), guard.CoreIdleCheck(args.max_mean_busy, args.max_core_busy)]
    findings = guard.run_checks(cores, checks)
    for f in findings:
        print(f"guard {f.check}: {f.level}: {f.message}")
    labels: list[str] = []
    if any(f.level == "error" for f in findings):
        if not args.allow_busy or any(f.check == "affinity" and f.level == "error" for f in findings):
            print("harness bench: refusing to run (see guard errors; --allow-busy runs anyway on busy cores)",
                  file=sys.stderr)
            return findings, labels, 1
        labels.append("BUSY CORES: run with --allow-busy, numbers are suspect")
    return findings, labels, None


def _run_with_provenance(args, spec, cores, labels: list[str]) -> tuple[list, dict]:
    """The passes, with the code's provenance taken before the first and compared after the last.

    Raises:
        provenance.DirtyTreeError: a headline artifact on a dirty tree without ``--allow-dirty``.
    """
    cache_base = args.out.parent / f"{args.out.stem}.vllm-cache"
    prov, begun = provenance.begin(args.out, cores=cores, allow_dirty=args.allow_dirty, exclude=(cache_base,))
    labels += begun
    runs = run_grid(spec, args.passes, cores, args.timeout, cache_base)
    fail_incomplete_passes(runs)
    host = spread_label([r.extra.get("host_sum_gbs") for r in runs])
    if host:
        labels.append(host)
    provenance.finish(prov, labels, args.out, exclude=(cache_base,))
    return runs, prov


def _artifact(args, spec, metric_names, findings, labels, runs, prov) -> dict[str, Any]:
    """Every metric summarized and judged, in the artifact format ``FORMAT_VERSION``."""
    metrics = [get_metric(m) for m in metric_names]
    summary, verdicts = judge_runs([r.to_dict() for r in runs], [a["tag"] for a in spec["arms"]], metrics)
    reported = sorted({k for r in runs for k in r.metrics})
    artifact: dict[str, Any] = {
        "format_version": FORMAT_VERSION,
        "kind": "bench",
        "created_unix": time.time(),
        "spec_path": str(args.spec),
        "spec": spec,
        "passes": args.passes,
        "metrics": metric_names,
        "timeout_s": args.timeout,
        "guard": [vars(f) for f in findings],
        "labels": labels,
        "runs": [r.to_dict() for r in runs],
        "summary": summary,
        "verdict": verdicts[metrics[0].name],
        "verdicts": verdicts,
        "reported_not_summarized": [k for k in reported if k not in metric_names],
        "provenance": prov,
        "retracted": False,
    }
    missing = provenance.missing_keys(prov, provenance.KEYS)
    if missing:
        labels.append(f"provenance incomplete: {missing}")
    for tag, keys in arm_provenance_gaps(runs).items():
        labels.append(f"ARM PROVENANCE INCOMPLETE: {tag} does not report {', '.join(keys)}")
    if args.check:
        artifact["check"] = check_expectations(summary, json.loads(args.check.read_text()))
    if spec.get("same_outputs"):
        artifact["same_outputs"] = compare_outputs(artifact["runs"], spec["same_outputs"])
        if not artifact["same_outputs"]["equal"]:
            labels.append(f"{OUTPUTS_DIFFER}: see same_outputs")
    return artifact


def _print_summary(artifact: dict, runs, out: Path) -> None:
    print()
    print(_table(artifact["summary"], artifact["metrics"]))
    for name, v in artifact["verdicts"].items():
        print(f"verdict {name}: {v['text']}")
    for label in artifact["labels"]:
        print(f"LABEL: {label}")
    for r in runs:
        if not r.ok:
            print(f"FAILED {r.tag} pass {r.pass_index + 1}: {r.reason}")
    for o in (artifact.get("check") or {}).get("outcomes", []):
        print(f"check {o['metric']} {o['arm']}: {o['status']}")
    print(f"artifact: {out}")


def main(argv: list[str] | None = None) -> int:
    """Command line; see the module docstring for the exit statuses. Validate everything, guard the
    cores, run the passes with provenance, judge every metric, write the artifact, print it."""
    args = _parser().parse_args(argv)
    problem = _validate(args)
    if problem:
        print(f"harness bench: error: {problem}", file=sys.stderr)
        return 2
    spec = json.loads(args.spec.read_text())
    cores = parse_cores(args.cores)
    findings, labels, refused = _preflight(args, cores)
    if refused is not None:
        return refused
    try:
        runs, prov = _run_with_provenance(args, spec, cores, labels)
    except (provenance.DirtyTreeError, provenance.OutPathError) as e:
        print(f"harness bench: error: {e}", file=sys.stderr)
        return 2
    artifact = _artifact(args, spec, [m for m in args.metric.split(",") if m], findings, labels, runs, prov)
    provenance.write_artifact(args.out, artifact)
    _print_summary(artifact, runs, args.out)
    return 3 if (artifact.get("check") or {}).get("regression") else 0


if __name__ == "__main__":
    sys.exit(main())
