"""Run one arm pass: pinned to the given cores, in its own process group, with a timeout.

An arm prints its metrics as one JSON object on the last line of its stdout. A pass
that exits non-zero, prints no JSON, reports a metric value that is not a finite number
(``null``, a string, a bool, NaN) or outlives its timeout is a failed pass, recorded
with the reason (for a non-zero exit, the first exception its stderr names) and the tail of
its stderr; on timeout the whole process group is
killed (vLLM's engine core and workers included), never left running (C10).
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["PassResult", "run_pass"]

from harness import REPO
from harness.server_process import stop_group

TAIL_LINES = 30


@dataclass
class PassResult:
    """One pass of one arm: ``ok`` with ``metrics``, or not ok with ``reason`` and ``stderr_tail``."""

    tag: str
    pass_index: int
    position: int
    ok: bool
    exit_status: int | None
    seconds: float
    reason: str | None = None
    stderr_tail: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    arm_provenance: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _tail(path: str, n: int = TAIL_LINES) -> str:
    with open(path, errors="replace") as f:
        return "".join(f.readlines()[-n:])


_ERROR_LINE = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (\S.*)$")


def first_error(path: str, limit: int = 300) -> str | None:
    """The first line of the file at ``path`` that names an exception with its message, from the
    exception's name on (``AttributeError: '_OpNamespace' '_C' object has no attribute ...``), at most
    ``limit`` characters; ``None`` when there is none.

    The first, not the last: a vLLM engine that fails in its worker logs the worker's exception and
    then the front end's generic ``RuntimeError: Engine core initialization failed``, and the 30-line
    tail a failed pass keeps (``stderr_tail``) often holds only the latter."""
    with open(path, errors="replace") as f:
        for line in f:
            m = _ERROR_LINE.search(line.rstrip("\n"))
            if m:
                return m.group(0)[:limit]
    return None


def run_pass(tag: str, command: list[str], env: dict[str, str], cores: list[int], timeout_s: float,
             pass_index: int, position: int) -> PassResult:
    """Run ``command`` once and parse its last stdout line as the metrics JSON.

    The child is pinned with ``sched_setaffinity(cores)`` and leads a new session
    (its own process group), so that a timeout can kill everything it started.
    """
    with tempfile.TemporaryDirectory(prefix=f"arm-{tag}-") as tmp:
        out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        start = time.monotonic()
        with open(out_path, "w") as out, open(err_path, "w") as err:
            try:
                proc = subprocess.Popen(  # in the repository: arms run `python -m harness run-...`
                    command, env=env, stdout=out, stderr=err, start_new_session=True, cwd=REPO,
                    preexec_fn=lambda: os.sched_setaffinity(0, cores),
                )
            except OSError as e:
                return PassResult(tag, pass_index, position, False, None, 0.0, f"could not start: {e}")
            try:
                status = proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                stop_group(proc, grace_s=5.0)
                return PassResult(tag, pass_index, position, False, proc.returncode, time.monotonic() - start,
                                  f"timeout after {timeout_s:g} s; process group {proc.pid} killed",
                                  _tail(err_path))
            finally:
                stop_group(proc, grace_s=5.0)  # stragglers the arm left behind
        seconds = time.monotonic() - start
        if status != 0:
            cause = first_error(err_path)
            return PassResult(tag, pass_index, position, False, status, seconds,
                              f"exit status {status}" + (f" ({cause})" if cause else ""), _tail(err_path))
        with open(out_path, errors="replace") as f:
            lines = [ln for ln in f.read().splitlines() if ln.strip()]
        try:
            payload = json.loads(lines[-1])
            if not isinstance(payload, dict):
                raise ValueError("not a JSON object")
        except (IndexError, ValueError) as e:
            why = "it printed nothing on stdout" if isinstance(e, IndexError) else str(e)
            return PassResult(tag, pass_index, position, False, status, seconds,
                              f"last stdout line is not a JSON object ({why})", _tail(err_path))
        raw = payload.get("metrics", payload)
        if not isinstance(raw, dict):
            return PassResult(tag, pass_index, position, False, status, seconds,
                              "\"metrics\" is not a JSON object", _tail(err_path))
        not_numbers = {k: v for k, v in raw.items() if not isinstance(v, (int, float)) or isinstance(v, bool)}
        if not_numbers:
            shown = ", ".join(f"{k}={json.dumps(v)[:60]}" for k, v in sorted(not_numbers.items()))
            return PassResult(tag, pass_index, position, False, status, seconds,
                              f"metric value(s) not a number: {shown}; an arm that cannot measure a metric "
                              "must fail or leave the metric out, never report a placeholder", _tail(err_path))
        huge = sorted(k for k, v in raw.items() if isinstance(v, int) and abs(v) > 2 ** 1023)
        metrics = {k: float(v) for k, v in raw.items() if k not in huge}
        bad = sorted([*huge, *(k for k, v in metrics.items() if not math.isfinite(v))])
        if bad:
            return PassResult(tag, pass_index, position, False, status, seconds,
                              f"non-finite metric(s) {bad}: not a measurement", _tail(err_path))
        arm_prov = payload.get("provenance", {})
        if not isinstance(arm_prov, dict) or not isinstance(arm_prov.get("measured_differently", {}), dict):
            return PassResult(tag, pass_index, position, False, status, seconds,
                              "\"provenance\" (and its \"measured_differently\") must be JSON objects, got "
                              f"{json.dumps(arm_prov)[:80]}", _tail(err_path))
        return PassResult(tag, pass_index, position, True, status, seconds, metrics=metrics,
                          arm_provenance=arm_prov,
                          extra={k: v for k, v in payload.items() if k not in ("metrics", "provenance")}
                          if "metrics" in payload else {})
