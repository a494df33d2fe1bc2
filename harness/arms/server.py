"""The OpenAI-server side of ``python -m harness run-vllm --server``: measured from the client, streamed.

Launches ``omni-vllm serve MODEL`` (vLLM's own ``vllm serve`` command line) on a free
loopback port in a new session, waits for ``/health``, and measures what a client sees:

- ``start_cold_s`` / ``start_warm_s``: launch (``Popen``) to the first streamed token of
  the first request, in seconds;
- ``pp_tps``: ``prompt_len`` / seconds of a non-streamed request that prefills
  ``prompt_len`` tokens and generates one (HTTP round trip included);
- ``tg_tps``: ``completion_tokens - 1`` / (last - first streamed token) of one stream of
  ``gen_len`` tokens after a ``context_len``-token prompt, greedy, ``ignore_eos``;
- ``agg_tg_tps``: ``concurrency`` streams at once, total generated tokens / seconds;
- ``rss_anon_tree_mb``: RssAnon of the server's process tree at ready, MiB (Python's
  ``multiprocessing.resource_tracker`` helper included: it is part of what runs).

The server's whole process group is stopped (SIGTERM, then SIGKILL after 30 s) whatever
happens. Prompts are fixed token ids (the same as ``harness.arms.vllm``'s).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

__all__ = ["measure_server", "serve_command"]

MiB = 1 << 20


def _post(base: str, body: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        return json.loads(r.read())


def _stream(base: str, body: dict[str, Any], timeout_s: float = 600) -> tuple[list[float], int]:
    """Stream a completion; return the arrival time of each chunk with text and the completion tokens."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    req = urllib.request.Request(base + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    times: list[float] = []
    tokens = 0
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                times.append(time.perf_counter())
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    return times, tokens


def serve_command(model: str, port: int, args: Any) -> list[str]:
    """``omni-vllm serve`` of ``model`` on 127.0.0.1:``port`` as model ``m``, with the harness's engine recipe
    from ``args`` (``harness.arms.vllm``'s options); the server arm and the start-up profile launch the same."""
    from harness.models.recipe import EngineRecipe

    return [str(Path(sys.executable).with_name("omni-vllm")), "serve", model, "--served-model-name", "m",
            "--host", "127.0.0.1", "--port", str(port), "--disable-log-stats",
            *EngineRecipe.from_args(model, args).serve_args()]


def measure_server(model: str, args: Any, prompt: Any, cold: bool, log: Path) -> tuple[dict, dict]:
    """Run the server measurements; return ``(metrics, provenance)``.

    ``args`` carries ``harness.arms.vllm``'s options; ``prompt(n, offset)`` makes token ids.

    Raises:
        RuntimeError: the server exited or was not healthy within ``args.server_timeout`` s.
        AssertionError: a request generated fewer tokens than asked for.
    """
    from harness.arms.start import metric_name
    from harness.memory.peak import TreePeak
    from harness.memory.tree import tree_memory, tree_metrics
    from harness.server_process import free_port, stop_group, wait_healthy

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = serve_command(model, port, args)
    greedy = {"model": "m", "temperature": 0.0, "ignore_eos": True}
    log.parent.mkdir(parents=True, exist_ok=True)
    launched = time.perf_counter()
    with open(log, "w") as log_f:
        proc = subprocess.Popen(cmd, stdout=log_f, stderr=subprocess.STDOUT, start_new_session=True)
    peak = TreePeak(proc.pid).start()
    try:
        wait_healthy(proc, base + "/health", args.server_timeout, log)
        first, _ = _stream(base, {**greedy, "prompt": prompt(8, 99), "max_tokens": 4})
        start_s = first[0] - launched
        tree_ready = tree_memory(proc.pid, pss=True)
        peak.stop()
        t = time.perf_counter()
        out = _post(base, {**greedy, "prompt": prompt(args.prompt_len, 1), "max_tokens": 1})
        pp_s = time.perf_counter() - t
        assert out["usage"]["completion_tokens"] == 1, out["usage"]
        times, n = _stream(base, {**greedy, "prompt": prompt(args.context_len, 2), "max_tokens": args.gen_len})
        assert n == args.gen_len and len(times) >= 2, (n, len(times))
        tg = (n - 1) / (times[-1] - times[0])
        results: list[int] = [0] * args.concurrency
        errors: list[BaseException] = []

        def one(i: int) -> None:
            try:
                results[i] = _stream(base, {**greedy, "prompt": prompt(args.context_len, 10 + i),
                                            "max_tokens": args.gen_len})[1]
            except BaseException as e:  # noqa: BLE001 - re-raised below in the main thread
                errors.append(e)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(args.concurrency)]
        t = time.perf_counter()
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        agg_s = time.perf_counter() - t
        if errors:
            raise errors[0]
        assert all(r == args.gen_len for r in results), results
    finally:
        stop_group(proc)
    compile_ahead = wait_for_compile_ahead(args.server_timeout)
    metrics = {
        "pp_tps": args.prompt_len / pp_s,
        "tg_tps": tg,
        "agg_tg_tps": sum(results) / agg_s,
        metric_name(cold): start_s,
        **tree_metrics(tree_ready),  # rss_anon_tree_mb, rss_file_tree_mb, rss_total_tree_mb
        **peak.metrics(),  # peak_anon_tree_mb, peak_total_tree_mb: launch to first token
    }
    omni_lines = [ln.split("] ", 1)[-1] for ln in log.read_text(errors="replace").splitlines() if "omni" in ln]
    unseen = "not observable from the client; the server's own log lines are in omni_log"
    provenance = {
        # ARM_KEYS the client cannot see inside the engine core: present, None, and said so
        "platform": None, "worker_threads": None, "worker_cpus": None, "head_dtype": None, "patches": None,
        "not_observed": unseen,
        "server_command": cmd,
        "processes_ready": [p.to_dict() for p in tree_ready],
        "start_peak": peak.hwm(),
        "omni_log": omni_lines[-30:],
        "compile_ahead": compile_ahead,
    }
    return metrics, provenance


def wait_for_compile_ahead(timeout_s: float, cache_root: Path | None = None) -> dict[str, Any]:
    """Wait (unmeasured) until the background compile a first ``omni-vllm serve`` started has exited, so that it
    competes with no later measurement: every process named in a ``*.pid`` file of
    ``$VLLM_CACHE_ROOT/omni_compile_ahead`` (``omni_platform.compile_ahead``; ``cache_root`` in place of
    ``$VLLM_CACHE_ROOT`` when given). Returns ``{"waited_s", "pids",
    "markers"}`` (the configurations compiled so far).

    Raises:
        RuntimeError: a background compile still ran after ``timeout_s`` seconds.
    """
    import os

    import psutil

    from omni_platform.compile_ahead import marker_dir

    root = cache_root / "omni_compile_ahead" if cache_root is not None else marker_dir()
    pids = []
    for f in root.glob("*.pid") if root.is_dir() else ():
        try:
            pids.append(int(f.read_text()))
        except (OSError, ValueError):
            continue
    t = time.perf_counter()
    alive = [p for p in pids if psutil.pid_exists(p)]
    while alive:
        if time.perf_counter() - t > timeout_s:
            raise RuntimeError(f"the background compile {alive} still ran after {timeout_s:.0f} s (log in {root})")
        time.sleep(1.0)
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return {"waited_s": time.perf_counter() - t, "pids": pids, "root": os.fspath(root),
            "markers": sorted(m.name for m in root.glob("*.json")) if root.is_dir() else []}
