"""The OpenAI-server side of ``python -m harness run-vllm --server``: measured from the client, streamed.

Launches ``omni-vllm serve MODEL`` (vLLM's own ``vllm serve`` command line) as a
:class:`harness.server_process.Server`, waits for ``/health``, and measures what a client sees:

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

import sys
import time
from pathlib import Path
from typing import Any

from harness.server_process import Server, concurrent_seconds, post_json, stream_times

__all__ = ["kill_compile_ahead", "measure_server", "serve_command", "wait_for_compile_ahead"]

MiB = 1 << 20


def _post(base: str, body: dict[str, Any], timeout_s: float = 600) -> dict[str, Any]:
    return post_json(base + "/v1/completions", body, timeout_s)


def _stream(base: str, body: dict[str, Any], timeout_s: float = 600) -> tuple[list[float], int]:
    """Stream a completion; return the arrival time of each chunk with text and the completion tokens."""
    times, usage = stream_times(base + "/v1/completions", {**body, "stream_options": {"include_usage": True}},
                                timeout_s)
    return times, (usage or {}).get("completion_tokens", 0)


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
    greedy = {"model": "m", "temperature": 0.0, "ignore_eos": True}
    server = Server.start(lambda port: serve_command(model, port, args), log, timeout_s=None)
    base, cmd, proc = server.base, server.command, server.proc
    peak = TreePeak(proc.pid).start()
    try:
        server.wait_healthy(args.server_timeout)
        first, _ = _stream(base, {**greedy, "prompt": prompt(8, 99), "max_tokens": 4})
        start_s = first[0] - server.launched
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

        def one(i: int) -> None:
            body = {**greedy, "prompt": prompt(args.context_len, 10 + i), "max_tokens": args.gen_len}
            results[i] = _stream(base, body)[1]

        agg_s = concurrent_seconds(one, args.concurrency)
        assert all(r == args.gen_len for r in results), results
    finally:
        server.stop()
    compile_ahead = (kill_compile_ahead() if getattr(args, "first_start", False)
                     else wait_for_compile_ahead(args.server_timeout))
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


def _compile_ahead_pids(root: Path) -> list[int]:
    pids = []
    for f in root.glob("*.pid") if root.is_dir() else ():
        try:
            pids.append(int(f.read_text()))
        except (OSError, ValueError):
            continue
    return pids


def kill_compile_ahead() -> dict[str, Any]:
    """SIGKILL the process group of every background compile named under ``$VLLM_CACHE_ROOT/omni_compile_ahead``
    (``--first-start`` passes: the next pass must start from nothing, with no compile beside it). Returns
    ``{"killed": [pids], "root"}``."""
    import os
    import signal

    from omni_platform.compile_ahead import marker_dir

    root = marker_dir()
    killed = []
    for pid in _compile_ahead_pids(root):
        try:
            os.killpg(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            continue
    return {"killed": killed, "root": os.fspath(root)}


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
    pids = _compile_ahead_pids(root)
    t = time.perf_counter()
    alive = [p for p in pids if psutil.pid_exists(p)]
    while alive:
        if time.perf_counter() - t > timeout_s:
            raise RuntimeError(f"the background compile {alive} still ran after {timeout_s:.0f} s (log in {root})")
        time.sleep(1.0)
        alive = [p for p in alive if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
    return {"waited_s": time.perf_counter() - t, "pids": pids, "root": os.fspath(root),
            "markers": sorted(m.name for m in root.glob("*.json")) if root.is_dir() else []}
