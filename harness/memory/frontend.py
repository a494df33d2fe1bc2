"""``omni-vllm serve`` with the ledger inside its front end: the server's own process measured from within.

    python -m harness.memory.frontend OUT.json PORT [--release] -- serve MODEL --port PORT ...

Runs ``omni_platform.vllm_cli.main`` (what the ``omni-vllm`` command runs) in this process, so this
process *is* the server's front end. A daemon thread waits for ``/health``, sends one completion, asks
the engine core's worker for its ledger through vLLM's dev endpoint ``POST /collective_rpc``
(``VLLM_SERVER_DEV_MODE=1`` and ``--worker-extension-cls harness.memory.ledger.LedgerExtension``, which
the caller passes), takes :func:`harness.memory.ledger.account` of this process and reads the tree's other processes
(:func:`harness.memory.ledger.outside`), writes both to
``OUT.json`` and stops the server with SIGINT (its normal shutdown). A failure is written to ``OUT.json``
as ``{"error": ...}`` before the stop, never swallowed.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
import urllib.request

__all__ = ["main"]


def _post(url: str, body: dict, timeout: float = 600) -> bytes:
    req = urllib.request.Request(url, method="POST", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    return urllib.request.urlopen(req, timeout=timeout).read()


def _measure(out: str, port: int, release: bool, deadline_s: float = 1800) -> None:
    base = f"http://127.0.0.1:{port}"
    result: dict = {}
    try:
        t0 = time.monotonic()
        while True:
            try:
                if urllib.request.urlopen(base + "/health", timeout=5).status == 200:
                    break
            except OSError:
                pass
            if time.monotonic() - t0 > deadline_s:
                raise TimeoutError(f"the server on port {port} was not healthy within {deadline_s:.0f} s")
            time.sleep(0.5)
        _post(base + "/v1/completions", {"model": "m", "prompt": "Hello", "max_tokens": 4})
        body = {"method": "omni_ledger", "kwargs": {"release": "1" if release else ""}}
        result["workers"] = json.loads(_post(base + "/collective_rpc", body))["results"]
        from harness.memory.ledger import account, outside
        from harness.memory.tree import tree_memory

        result["front_end"] = account(release=release)
        seen = {w["pid"] for w in result["workers"]} | {os.getpid()}
        result["others"] = [{**outside(p.pid), "role": p.role} for p in tree_memory(os.getpid()) if p.pid not in seen]
    except BaseException:  # noqa: BLE001 - written out for the caller, which fails on it
        result["error"] = traceback.format_exc()
    finally:
        with open(out + ".partial", "w") as f:
            json.dump(result, f)
        os.replace(out + ".partial", out)
        os.kill(os.getpid(), signal.SIGINT)


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    sep = argv.index("--")
    own, serve = argv[:sep], argv[sep + 1:]
    out, port = own[0], int(own[1])
    if os.environ.get("OMNI_LEDGER_TRACEMALLOC") == "1":
        import tracemalloc

        from harness.memory.ledger import TRACE_FRAMES

        tracemalloc.start(TRACE_FRAMES)
    threading.Thread(target=_measure, args=(out, port, "--release" in own), daemon=True,
                     name="omni-ledger").start()
    sys.argv = ["omni-vllm", *serve]
    from omni_platform.vllm_cli import main as omni_vllm

    omni_vllm()


if __name__ == "__main__":
    main()
