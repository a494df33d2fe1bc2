"""C13: no orphans. A process vLLM spawned exits when its parent is killed, SIGKILL included
(omni_platform.lifeline, started by the general plugin), and the port is free for a restart."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import REPO, clean_env
from harness.server_process import free_port, wait_healthy

C13_LIMIT_S = 20.0


def _gone_within(pids: list[int], limit_s: float) -> float | None:
    """Seconds until none of ``pids`` is alive (zombies count as gone), or None after ``limit_s``."""
    start = time.monotonic()
    while time.monotonic() - start < limit_s:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return time.monotonic() - start
        time.sleep(0.2)
    return None


def test_a_spawned_child_exits_when_its_parent_is_killed(tmp_path):
    pid_file = tmp_path / "child.pid"
    parent = textwrap.dedent(f"""
        import multiprocessing, time

        def child(path):
            from omni_platform.lifeline import watch_parent
            assert watch_parent(period_s=0.2, grace_s=1.0)
            open(path, "w").write(str(__import__("os").getpid()))
            time.sleep(600)

        if __name__ == "__main__":
            from omni_platform.lifeline import watch_parent
            assert not watch_parent(), "the front end is nobody's child: no watchdog"
            multiprocessing.set_start_method("spawn")
            multiprocessing.Process(target=child, args=({str(pid_file)!r},)).start()
            time.sleep(600)
    """)
    script = tmp_path / "parent.py"  # spawn imports the child's function from a file, not from -c
    script.write_text(parent)
    proc = subprocess.Popen([sys.executable, str(script)], env=clean_env(), cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        while not pid_file.exists() or not pid_file.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, "child did not start"
            time.sleep(0.1)
        child = int(pid_file.read_text())
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        took = _gone_within([child], 10.0)
        assert took is not None, "the child outlived its SIGKILLed parent by 10 s"
    finally:
        if proc.poll() is None:
            proc.kill()


def _tree(pid: int) -> list[int]:
    return [pid] + [c.pid for c in psutil.Process(pid).children(recursive=True)]


def _serve(model: Path, port: int, log: Path, fork: bool = False) -> subprocess.Popen:
    cmd = [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(model), "--enforce-eager",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512"]
    with open(log, "a") as f:
        return subprocess.Popen(cmd, env=clean_env(VLLM_PLUGINS="omni", OMNI_ENGINE_CORE_FORK="1" if fork else "0"),
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def _kill_tree(pids: list[int]) -> None:
    for p in pids:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.mark.engine
@pytest.mark.parametrize("fork", [False, True], ids=["spawned", "forked"])
def test_c13_sigkill_of_the_server_leaves_no_process_and_the_port_restarts(int4_model_dir, tmp_path, fork):
    """Idle, then while streaming: kill -9 of `omni-vllm serve`; its engine core is gone within 20 s, spawned
    (OMNI_ENGINE_CORE_FORK=0) or forked (the default: the watchdog follows the fork).
    The second server listens on the port of the first one killed: nothing held it."""
    port = free_port()
    log = tmp_path / "server.log"
    times = []
    for busy in (False, True):
        proc = _serve(int4_model_dir, port, log, fork)  # busy: the same port the idle server held when killed
        tree = [proc.pid]
        try:
            wait_healthy(proc, f"http://127.0.0.1:{port}/health", 600, log)
            tree = _tree(proc.pid)
            assert len(tree) >= 2, f"front end and engine core expected, got {tree}"
            stream = None
            if busy:
                body = json.dumps({"model": str(int4_model_dir), "prompt": "Once upon a time", "max_tokens": 400,
                                   "ignore_eos": True, "stream": True}).encode()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                stream = urllib.request.urlopen(req, timeout=120)
                assert stream.readline()  # generating now
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            took = _gone_within(tree, C13_LIMIT_S)
            assert took is not None, f"processes {tree} outlived the SIGKILLed server by {C13_LIMIT_S} s"
            times.append(took)
            if stream is not None:
                stream.close()
        finally:
            _kill_tree(tree)
    print(f"C13 server: engine gone {times[0]:.1f} s after SIGKILL (idle), {times[1]:.1f} s (streaming)")


@pytest.mark.engine
def test_c13_sigkill_of_a_vllm_llm_script_leaves_no_process(int4_model_dir, tmp_path):
    """vLLM's own three-process layout (the engine core and worker are children): kill -9 of the
    script while it generates; both are gone within 20 s."""
    ready = tmp_path / "ready"
    script = textwrap.dedent(f"""
        from vllm import LLM, SamplingParams
        if __name__ == "__main__":
            llm = LLM(model={str(int4_model_dir)!r}, enforce_eager=True, max_model_len=512,
                      kv_cache_memory_bytes=64 << 20)
            while True:
                llm.generate(["Once upon a time"], SamplingParams(max_tokens=200, ignore_eos=True), use_tqdm=False)
                open({str(ready)!r}, "w").write("1")  # one generation done: the next one is running
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], env=clean_env(VLLM_PLUGINS="omni",
                            VLLM_ENABLE_V1_MULTIPROCESSING="1"), stdout=subprocess.DEVNULL,
                            stderr=open(tmp_path / "llm.log", "w"), cwd=REPO, start_new_session=True)
    tree = [proc.pid]
    try:
        deadline = time.monotonic() + 600
        while not ready.exists():
            assert proc.poll() is None, (tmp_path / "llm.log").read_text()[-3000:]
            assert time.monotonic() < deadline
            time.sleep(0.5)
        tree = _tree(proc.pid)
        assert len(tree) >= 3, f"script, engine core and worker expected, got {tree}"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        took = _gone_within(tree, C13_LIMIT_S)
        assert took is not None, f"processes {tree} outlived the SIGKILLed script by {C13_LIMIT_S} s"
        print(f"C13 vllm.LLM: engine core and worker gone {took:.1f} s after SIGKILL")
    finally:
        _kill_tree(tree)
