"""The start-up profile (issue 32): phases from time-stamped log lines, and one real start per layout whose
phases, which end at a line the started process logs, sum to within 10% of the launch-to-first-token the
client measured on its own clock (and stay below it)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.startup.phases import END, LAUNCH, MARKERS, Marker, check_total, markers_from_log, phases

REPO = Path(__file__).resolve().parents[1]


def test_the_first_matching_line_of_each_process_is_a_marker_and_unstamped_lines_are_skipped():
    lines = [
        "@100.000000 7 INFO 12-05 [x.py:1] Available plugins for group vllm.platform_plugins:",
        "Loading safetensors checkpoint shards: 100% Completed",  # tqdm: no stamp
        "@101.500000 7 INFO 12-05 [x.py:1] Available plugins for group vllm.platform_plugins:",  # a repeat
        "@102.000000 9 INFO 12-05 [x.py:1] Available plugins for group vllm.platform_plugins:",  # another process
        "@103.250000 9 INFO 12-05 [core.py:1] Starting to load model /m...",
        "@104.000000 9 INFO 12-05 [x.py:1] nothing we mark",
    ]
    got = markers_from_log(lines)
    assert [(m.t, m.pid) for m in got] == [(100.0, 7), (102.0, 9), (103.25, 9)]
    assert got[2].label.startswith("create_weights")


def test_phases_run_from_each_marker_to_the_next_across_processes_and_sum_to_the_span():
    ms = [Marker(10.0, 1, LAUNCH), Marker(12.5, 2, "b"), Marker(11.0, 1, "a"), Marker(15.0, 1, END)]
    got = phases(ms)
    assert [(p.label, p.pid, p.seconds) for p in got] == [(LAUNCH, 1, 1.0), ("a", 1, 1.5), ("b", 2, 2.5)]
    assert sum(p.seconds for p in got) == pytest.approx(5.0)
    assert check_total(got, 5.2) == pytest.approx(0.2 / 5.2)
    with pytest.raises(ValueError, match="5.00 s, the client measured 6.00 s"):
        check_total(got, 6.0)
    with pytest.raises(ValueError, match="at least a launch"):
        phases(ms[:1])


@pytest.mark.engine
@pytest.mark.parametrize("layout", ["llm", "server", "server-forked"])
def test_a_warm_start_is_profiled_by_phase_on_the_real_model(layout, tmp_path):
    """Eager SmolLM2 int4, warm (the cache root is filled by a first, unprofiled start): the phases sum to
    the client's launch-to-first-token within 10% (the command fails otherwise), the weights come from
    the layout file without a repack, and every phase lies in a process of the start."""
    out = tmp_path / "startup.json"
    cmd = [sys.executable, "-m", "harness", "startup", "--model", "smollm2-135m-int4", "--enforce-eager",
           "--cache-root", str(tmp_path / "cache"), "--out", str(out), "--allow-dirty"]
    if layout != "llm":
        cmd.append("--server")
    env = {**os.environ, "OMNI_ENGINE_CORE_FORK": "1" if layout == "server-forked" else "0"}
    run = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=900, env=env)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    art = json.loads(out.read_text())
    assert art["kind"] == "startup_profile" and art["layout"] == layout.split("-")[0] and art["start"] == "warm"
    assert art["preparing_start_s"] is not None  # the empty cache root was filled first
    assert abs(art["total_s"] - art["measured_s"]) <= 0.1 * art["measured_s"]
    # the profile ends at a line the started process logged; the client's clock saw the first token after it
    assert art["phases"][-1]["at_s"] + art["phases"][-1]["seconds"] == pytest.approx(art["total_s"])
    assert 0 < art["measured_s"] - art["total_s"], (art["total_s"], art["measured_s"])
    end = [m for m in art["markers"] if m["label"] == END]
    assert end and ("Received request" if layout != "llm" else "startup: first token") in end[0]["line"]
    labels = [p["label"] for p in art["phases"]]
    assert labels[0] == LAUNCH and any(lb.startswith("create_weights") for lb in labels)
    assert {p["process"] for p in art["phases"]} == ({"front end", "engine core"} if layout != "llm"
                                                     else {"vllm.LLM"})
    log = Path(art["log"]).read_text()
    assert "cpu_int4 layers mapped from" in log and "cpu_int4 layers written to" not in log
    if layout != "llm":  # spawned, the engine core imports vLLM again (its plugin lines); forked, it does not
        core = {int(pid) for pid, role in art["pids"].items() if role == "engine core"}
        imports = [m for m in art["markers"] if m["pid"] in core and m["label"] == MARKERS[0][0]]
        assert core and bool(imports) == (layout == "server")
        assert ("forks its engine core" in log) == (layout == "server-forked")
    assert art["provenance"]["cpu_flags"]


SERVE = ["/venv/bin/omni-vllm", "serve", "model"]


@pytest.mark.parametrize(("argv", "env", "user_set", "want"), [
    (SERVE, {}, False, "fork"),                                          # the server's default: forked
    (["/venv/bin/vllm", "serve", "m"], {}, False, "fork"),              # vLLM's own command too
    (["/x/vllm/entrypoints/openai/api_server.py", "--model", "m"], {}, False, "fork"),
    (SERVE, {"OMNI_ENGINE_CORE_FORK": "0"}, False, "spawn"),            # the switch: vLLM's spawn
    (SERVE, {"VLLM_WORKER_MULTIPROC_METHOD": "spawn"}, True, "spawn"),  # the user's choice wins
    (["my_app.py"], {}, False, "spawn"),           # a user's own process that builds an engine: never forked
    (["/venv/bin/omni-vllm", "bench", "serve"], {}, False, "spawn"),
])
def test_the_command_line_server_forks_its_engine_core(monkeypatch, argv, env, user_set, want):
    import vllm.config  # noqa: F401 - vLLM's platforms imported first, as when vLLM loads the plugin

    from omni_platform.platform import OmniPlatform

    monkeypatch.setattr(sys, "argv", argv)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")  # what CpuPlatform just set
    monkeypatch.setenv("OMNI_AUTO_SET", "")
    monkeypatch.delenv("OMNI_ENGINE_CORE_FORK", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    OmniPlatform._configure_engine_core_start(user_set)
    assert os.environ["VLLM_WORKER_MULTIPROC_METHOD"] == want
