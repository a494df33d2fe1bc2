"""``omni-vllm serve --api-key K``: the key on every route but ``/health`` (C33).

vLLM 0.28's own check (``AuthenticationMiddleware``, ``vllm/entrypoints/serve/utils/server_utils.py``) guards
only the paths under ``GUARDED_PREFIX`` (``/v1``, ``/v2``, ``/inference``, ``/cohere``): ``/invocations`` (which its
help says "exposes the same inference capabilities as /v1"), ``/tokenize``, ``/detokenize``, ``/metrics``,
``/pooling``, ``/score`` and the rest answer anyone who can reach the port. ``omni-vllm serve`` adds
:class:`KeyOnEveryRoute` through vLLM's published ``--middleware`` option: with a key configured the way vLLM
reads it (``--api-key``, else ``VLLM_API_KEY``), every HTTP and websocket request needs
``Authorization: Bearer <key>`` except ``GET /health`` (a load balancer's probe) and, when ``OMNI_OPEN_METRICS=1``
says so, ``/metrics`` (a Prometheus scraper without credentials). Without a key it changes nothing. The key
check is vLLM's (sha256 of each key, compared in constant time).

The keys come from the serving process's own parsed arguments (``app.state.args.api_key``, which vLLM's
``build_app`` sets: a vLLM internal, fingerprinted in :mod:`omni_platform.internals` as
``api_key_on_every_route``) or ``VLLM_API_KEY``. When the arguments cannot be read (missing, or ``build_app``
changed) but a key was given on the command line, every request but ``/health`` is refused (closed, not open),
with one warning.
"""

from __future__ import annotations

import hashlib
import logging
import os
import secrets
import sys
from typing import Any

__all__ = ["MIDDLEWARE", "OPEN_PATHS", "KeyOnEveryRoute", "configured_keys", "is_open"]

logger = logging.getLogger("vllm.omni_platform.api_key")

MIDDLEWARE = "omni_platform.api_key.KeyOnEveryRoute"
"""The import path ``omni-vllm serve`` passes to ``--middleware``."""
OPEN_PATHS = ("/health",)
"""Paths a request may reach without the key."""


def is_open(path: str, method: str | None, open_metrics: bool,
            headers: list[tuple[bytes, bytes]] | None = None) -> bool:
    """Whether a request for ``path`` needs no key: ``/health``, ``/metrics`` when ``open_metrics``, and CORS
    preflights: ``OPTIONS`` with both ``Origin`` and ``Access-Control-Request-Method`` (``headers``: the ASGI
    scope's, lower-case names), which vLLM's ``CORSMiddleware`` answers itself without calling any route.
    Any other ``OPTIONS`` needs the key: vLLM's own check lets every ``OPTIONS`` through, and the Prometheus
    app mounted at ``/metrics`` answers it with the metrics."""
    if method == "OPTIONS":
        names = {name.lower() for name, _ in headers or ()}
        if b"origin" in names and b"access-control-request-method" in names:
            return True
    return path in OPEN_PATHS or (open_metrics and path == "/metrics")


def configured_keys(args: Any) -> list[str]:
    """The keys vLLM itself would check: ``args.api_key`` (``--api-key``) when given, else ``VLLM_API_KEY``
    (empty values dropped)."""
    given = getattr(args, "api_key", None) if args is not None else None
    return [k for k in (given or [os.environ.get("VLLM_API_KEY", "")]) if k]


def _bearer(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, param = value.decode("latin-1").partition(" ")
            return param.encode() if scheme.lower() == "bearer" else None
    return None


class KeyOnEveryRoute:
    """Pure ASGI middleware (vLLM's ``--middleware``: built by ``app.add_middleware(KeyOnEveryRoute)``).

    Args:
        app: the next ASGI application.
    """

    def __init__(self, app: Any) -> None:
        self.app = app
        self._hashes: list[bytes] | None = None
        from omni_platform import envs

        self.open_metrics = envs.OMNI_OPEN_METRICS

    def _key_hashes(self, scope: dict) -> list[bytes] | None:
        """sha256 of each configured key; [] when none is; None when they cannot be read but one was given."""
        if self._hashes is None:
            from omni_platform.internals import holds

            state = getattr(scope.get("app"), "state", None)
            args = getattr(state, "args", None) if holds("api_key_on_every_route") else None
            if args is None and any(a == "--api-key" or a.startswith("--api-key=") for a in sys.argv):
                logger.warning("omni: an --api-key was given but the server's arguments cannot be read here; "
                               "every route but /health is refused (omni_platform.api_key)")
                return None
            self._hashes = [hashlib.sha256(k.encode()).digest() for k in configured_keys(args)]
        return self._hashes

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if is_open(path, scope.get("method"), self.open_metrics, scope.get("headers")):
            return await self.app(scope, receive, send)
        hashes = self._key_hashes(scope)
        if hashes == []:
            return await self.app(scope, receive, send)
        given = _bearer(scope.get("headers", []))
        ok = False
        if given is not None and hashes:
            digest = hashlib.sha256(given).digest()
            for h in hashes:
                ok |= secrets.compare_digest(digest, h)
        if ok:
            return await self.app(scope, receive, send)
        if scope["type"] == "websocket":
            return await send({"type": "websocket.close", "code": 1008})
        body = b'{"error": "Unauthorized: this server needs Authorization: Bearer <its --api-key>"}'
        await send({"type": "http.response.start", "status": 401,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
