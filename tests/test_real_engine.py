"""The real model in the real process layouts: omni's default (one process) and vLLM's (front end, engine core,
worker)."""

import json
import os
import re

import pytest

import skips
from conftest import clean_env, needs_default_layout, run_engine
from omni_platform import PLATFORM_QUALNAME as OMNI

pytestmark = pytest.mark.engine

PROMPTS = [
    "Once upon a time",
    "The three primary colors are",
    "def fibonacci(n):",
]
MiB = 1 << 20


def _physical_cores() -> int:
    from vllm.utils.cpu_resource_utils import get_allowed_cpu_list

    return len({c.physical_core for c in get_allowed_cpu_list()})


@pytest.fixture(scope="module")
def default_run(real_model, tmp_path_factory):
    """OmniPlatform with vLLM's default settings (eager only), activation log on, and
    VLLM_PLUGINS unset: omni activates all the same."""
    log = tmp_path_factory.mktemp("activation") / "activation.jsonl"
    config = {"llm": {"model": str(real_model), "enforce_eager": True}, "prompts": PROMPTS[:1], "max_tokens": 16}
    run = run_engine(config, clean_env(OMNI_ACTIVATION_LOG=str(log)))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return run, records


@pytest.fixture(scope="module")
def three_process_run(real_model, tmp_path_factory):
    """The user asks for vLLM's own layout (VLLM_ENABLE_V1_MULTIPROCESSING=1) and sets the step budget."""
    log = tmp_path_factory.mktemp("activation3") / "activation.jsonl"
    config = {"llm": {"model": str(real_model), "enforce_eager": True, "max_num_batched_tokens": 1024,
                      "max_num_seqs": 4},
              "prompts": PROMPTS[:1], "max_tokens": 16}
    run = run_engine(config, clean_env(OMNI_ACTIVATION_LOG=str(log), VLLM_ENABLE_V1_MULTIPROCESSING="1"))
    records = [json.loads(line) for line in log.read_text().splitlines()]
    return run, records


@needs_default_layout
def test_default_layout_runs_vllm_llm_in_one_process(default_run):
    run, records = default_run
    assert {r["pid"] for r in records} == {run["pid"]}, "omni activated in no other process"
    (worker,) = run["workers"]
    assert worker["pid"] == run["pid"] and worker["platform"] == OMNI
    assert worker["extensions"] == ["patches", "quant"]
    assert "omni: process layout: worker inside the engine core" in run.log
    n = _physical_cores()
    assert worker["torch_threads"] == n, "the in-process worker uses every allowed core"
    assert f"omni: {n} torch threads for the in-process worker" in run.log


def test_user_multiprocessing_keeps_front_end_engine_core_and_worker(three_process_run, default_run):
    """Greedy output of vLLM's layout equals the default run's (whatever layout that one ran in)."""
    run, records = three_process_run
    by_pid = {r["pid"]: r for r in records}
    front = by_pid[run["pid"]]
    (worker,) = run["workers"]
    assert worker["platform"] == OMNI
    engine_core = by_pid[worker["ppid"]]
    assert engine_core["ppid"] == front["pid"], "the worker's parent is a child of the front end"
    assert engine_core["process_name"] == "EngineCore"
    assert worker["pid"] in by_pid
    for r in (front, engine_core, by_pid[worker["pid"]]):
        assert r["platform"] == OMNI
        assert r["extensions"] == ["patches", "quant"]
    assert "VLLM_ENABLE_V1_MULTIPROCESSING=1 set by the user" in run.log
    assert run["token_ids"] == default_run[0]["token_ids"], "greedy output equal in both layouts"


def test_small_machine_step_budget_default_and_user_override(default_run, three_process_run):
    run, _ = default_run
    skips.MORE_CORES_THAN_FEW.skip_if_holds()  # the step budget default applies on machines with <= 4 cores
    assert "omni-patches: default max_num_batched_tokens=512 max_num_seqs=8" in run.log
    assert "Chunked prefill is enabled with max_num_batched_tokens=512." in run.log
    user = three_process_run[0]
    assert "Chunked prefill is enabled with max_num_batched_tokens=1024." in user.log
    assert re.search(r"sized from max_model_len=8192 x max_num_seqs=4 ", user.log)


def test_c03_default_settings_start_with_a_sized_kv_cache(default_run):
    """C03: the node reports less memory than the machine; stock defaults refuse to start."""
    run, _ = default_run
    m = re.search(r"omni: kv_cache_memory_bytes=(\d+) \((\d+) blocks\) sized from max_model_len=8192 "
                  r"x max_num_seqs=(\d+)", run.log)
    assert m, "the log says how the KV budget was sized"
    (worker,) = run["workers"]
    assert worker["kv_cache"]["num_blocks"] == int(m.group(2))
    assert worker["kv_cache"]["bytes"] == int(m.group(1))
    assert run["texts"][0].strip(), "it generated text"


@pytest.fixture(scope="module")
def same_settings():
    """Settings both arms share so that only the platform differs."""
    return dict(
        # OMNI_IR_CPU_NORMS=0: omni's C++ norms (on by default in eager mode) round differently
        # from vLLM's native ones; they are checked against them in test_ir_kernels.
        # VLLM_CPU_ATTN_SPLIT_KV=0: omni's default (batch-invariant attention), set for stock vLLM too,
        # whose default splits a sequence's KV among threads and sums in another order.
        env=dict(VLLM_CPU_OMP_THREADS_BIND=",".join(map(str, sorted(os.sched_getaffinity(0)))),
                 VLLM_CPU_NUM_OF_RESERVED_CPU="0", OMNI_IR_CPU_NORMS="0", VLLM_CPU_ATTN_SPLIT_KV="0"),
        llm=dict(enforce_eager=True, kv_cache_memory_bytes=256 * MiB, max_model_len=512, seed=0),
    )


def test_greedy_64_tokens_equal_stock_vllm(real_model, same_settings):
    """In bf16 the overlay changes no numerics: token-for-token equal to stock vLLM."""
    config = {"llm": {"model": str(real_model), **same_settings["llm"]}, "prompts": PROMPTS, "max_tokens": 64}
    omni = run_engine(config, clean_env(VLLM_PLUGINS="omni", **same_settings["env"]))
    # stock in one process too (omni's layout for vllm.LLM): the layout changes no numerics, and vLLM's
    # three-process start costs about 25 s more on two cores
    stock = run_engine(config, clean_env(VLLM_PLUGINS="", VLLM_ENABLE_V1_MULTIPROCESSING="0", **same_settings["env"]))
    assert omni["workers"][0]["platform"] == OMNI
    assert "Platform plugin omni is activated" not in stock.log
    assert all(len(t) == 64 for t in omni["token_ids"])
    assert omni["token_ids"] == stock["token_ids"]


@needs_default_layout
def test_server_runs_in_two_processes_and_answers_like_vllm_llm(real_model, default_run, tmp_path):
    """`omni-vllm serve` (eager): front end + engine core holding the worker; same greedy text."""
    import socket
    import subprocess
    import sys
    import time
    import urllib.error
    import urllib.request
    from pathlib import Path

    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(real_model), "--enforce-eager",
           "--host", "127.0.0.1", "--port", str(port), "--max-num-seqs", "4"]
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log_f:
        proc = subprocess.Popen(cmd, env=clean_env(VLLM_PLUGINS="omni"), stdout=log_f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        deadline = time.monotonic() + 600
        while True:
            assert proc.poll() is None, log_path.read_text()[-3000:]
            assert time.monotonic() < deadline, "server not healthy in 600 s"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        # Python's spawn start method adds its resource_tracker helper (no vLLM code runs in it).
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)
                             if "multiprocessing.resource_tracker" not in " ".join(c.cmdline())]
        body = json.dumps({"model": str(real_model), "prompt": PROMPTS[0], "max_tokens": 16,
                           "temperature": 0.0}).encode()
        req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        bad = urllib.request.Request(
            f"http://127.0.0.1:{port}/v1/completions", headers={"Content-Type": "application/json"},
            data=json.dumps({"model": str(real_model), "prompt": "Hi", "max_tokens": 4, "min_tokens": 2,
                             "stop_token_ids": [10**6]}).encode())
        with pytest.raises(urllib.error.HTTPError) as refused:  # C12: refused at the door, engine unharmed
            urllib.request.urlopen(bad, timeout=120)
        assert refused.value.code == 400
        assert "stop_token_ids holds token id 1000000" in refused.value.read().decode()
        bad.data = json.dumps({"model": str(real_model), "prompt": "Hi", "max_tokens": 4,
                               "allowed_token_ids": [5, 49152]}).encode()
        with pytest.raises(urllib.error.HTTPError) as refused:  # checked before vLLM's own verify
            urllib.request.urlopen(bad, timeout=120)
        assert refused.value.code == 400
        assert "allowed_token_ids holds token id 49152, outside this model's vocabulary of 49152" \
            in refused.value.read().decode()
        with urllib.request.urlopen(req, timeout=120) as r:
            text = json.loads(r.read())["choices"][0]["text"]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    log = log_path.read_text()
    assert len(tree) == 2, f"front end + engine core, got pids {tree}"
    assert "omni: process layout: worker inside the engine core" in log
    assert text == default_run[0]["texts"][0]
    if _physical_cores() <= 4:
        assert "Chunked prefill is enabled with max_num_batched_tokens=512." in log
    assert re.search(r"sized from max_model_len=8192 x max_num_seqs=4 ", log), "--max-num-seqs given wins"
