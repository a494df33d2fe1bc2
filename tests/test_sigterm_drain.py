"""C28: SIGTERM to ``omni-vllm serve --shutdown-timeout 20`` while a request streams.

Sent to the server's main process only, as a process manager (systemd, docker stop) sends it. The stream
finishes (vLLM drains in-flight requests for up to ``--shutdown-timeout`` seconds) or ends with a clean
error, the server exits within 30 s, and no process of it is left (engine core, worker, and omni's
orphan watchdog included)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import psutil
import pytest

from conftest import clean_env
from harness.server_process import free_port, stop_group, wait_healthy

pytestmark = pytest.mark.engine


def test_c28_sigterm_lets_the_stream_finish_and_leaves_no_process(int4_model_dir, tmp_path):
    port, log = free_port(), tmp_path / "server.log"
    cmd = [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(int4_model_dir), "--enforce-eager",
           "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "512", "--shutdown-timeout", "20"]
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, env=clean_env(VLLM_PLUGINS="omni"), stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/health", 600, log)
        tree = [proc.pid] + [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
        events: list[dict] = []
        ended: dict = {}
        first = threading.Event()

        def stream():
            body = {"model": str(int4_model_dir), "prompt": "Once upon a time", "max_tokens": 300,
                    "temperature": 0.0, "ignore_eos": True, "stream": True}
            req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=120) as r:
                    for raw in r:
                        line = raw.decode().strip()
                        if line == "data: [DONE]":
                            ended["done"] = True
                        elif line.startswith("data: "):
                            events.append(json.loads(line[len("data: "):]))
                            first.set()
            except Exception as e:  # noqa: BLE001 - recorded: the test asserts on it
                ended["error"] = repr(e)
            first.set()

        reader = threading.Thread(target=stream)
        reader.start()
        assert first.wait(120), "no streamed event"
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
        exited = time.monotonic() - sent
        reader.join(timeout=30)
        # what of the tree is still alive 25 s after the server exited, before anything else is signalled
        procs = []
        for pid in tree[1:]:
            try:
                procs.append(psutil.Process(pid))
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(procs, timeout=25)
        left = [p.pid for p in alive]
    finally:
        stop_group(proc)
    text = "".join(e["choices"][0]["text"] for e in events if e.get("choices"))
    reasons = [e["choices"][0].get("finish_reason") for e in events if e.get("choices")]
    print(f"SIGTERM: exit {proc.returncode} after {exited:.1f} s; stream {len(events)} events, finish {reasons[-1:]}, "
          f"{ended}")
    assert exited < 30, f"the server took {exited:.1f} s to exit"
    assert ended.get("done") and reasons[-1] == "length", (ended, reasons[-3:], log.read_text()[-2000:])
    assert len(text) > 0
    assert not left, f"processes of the server left: {left}"
