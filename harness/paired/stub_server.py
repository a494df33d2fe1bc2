"""An OpenAI-shaped chat server whose decode speed is chosen, with a host drift injected: the stub engine
the paired benchmark's tests measure (``tests/test_paired.py``).

    python -m harness.paired.stub_server --port P --speed 0.9 --token-ms 4 --drift-epoch T0 \
        --drift-per-s 0.5

Answers ``GET /health`` and ``POST /v1/chat/completions`` (streamed: one SSE chunk a token, then a chunk
with ``usage`` and ``[DONE]``; not streamed: one body). Each token takes
``token_ms / speed * (1 + drift_per_s * (now - drift_epoch))`` milliseconds (slept): ``speed`` is the
arm's true speed relative to another stub, the drift term a host whose bandwidth falls linearly with
time, the same for every stub given the same epoch. The text is ``max_tokens`` copies of ``"tok "``, so
greedy outputs of two stubs are equal. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["main", "token_seconds"]


def token_seconds(token_ms: float, speed: float, drift_epoch: float, drift_per_s: float, now: float) -> float:
    """Seconds one token takes at wall time ``now`` (``time.time()``): ``token_ms`` / 1000 / ``speed``,
    stretched by ``1 + drift_per_s * (now - drift_epoch)`` (the host slowing down)."""
    return token_ms / 1000.0 / speed * (1.0 + drift_per_s * max(0.0, now - drift_epoch))


def _handler(args):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a) -> None:  # quiet
            pass

        def do_GET(self) -> None:  # noqa: N802 (http.server's name)
            status = 200 if self.path == "/health" else 404
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/v1/chat/completions":
                self.send_response(404)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            n = int(body.get("max_tokens") or 16)
            if not body.get("stream"):
                for _ in range(n):
                    time.sleep(token_seconds(args.token_ms, args.speed, args.drift_epoch, args.drift_per_s,
                                             time.time()))
                data = json.dumps({"choices": [{"message": {"content": "tok " * n}}],
                                   "usage": {"completion_tokens": n}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                return
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for _ in range(n):
                time.sleep(token_seconds(args.token_ms, args.speed, args.drift_epoch, args.drift_per_s, time.time()))
                self._event({"choices": [{"delta": {"content": "tok "}}]})
            self._event({"choices": [], "usage": {"completion_tokens": n}})
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _event(self, obj: dict) -> None:
            self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
            self.wfile.flush()

    return Handler


def main(argv: list[str] | None = None) -> int:
    """Serve on 127.0.0.1:``--port`` until killed."""
    ap = argparse.ArgumentParser(prog="python -m harness.paired.stub_server", description=__doc__.split("\n")[0])
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--speed", type=float, default=1.0, help="relative decode speed (> 0)")
    ap.add_argument("--token-ms", type=float, default=4.0, help="milliseconds a token at speed 1, no drift")
    ap.add_argument("--drift-epoch", type=float, default=0.0, help="time.time() at which the drift starts")
    ap.add_argument("--drift-per-s", type=float, default=0.0, help="fractional slow-down per second of wall time")
    args = ap.parse_args(argv)
    if args.speed <= 0 or args.token_ms <= 0:
        ap.error("--speed and --token-ms must be > 0")
    ThreadingHTTPServer(("127.0.0.1", args.port), _handler(args)).serve_forever()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
