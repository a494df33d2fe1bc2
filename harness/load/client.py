"""One client for every OpenAI-compatible server: chat requests from N concurrent streams, timed per chunk.

Used by ``python -m harness run-load`` (streams sweep) and ``python -m harness run-soak`` (a server held
under load); it speaks only the OpenAI HTTP API (``POST /v1/chat/completions``), so omni's server,
llama.cpp's ``llama-server`` and any other server get the same requests.

Per request (:class:`RequestResult`): HTTP status, time to the first content chunk (TTFT), the gaps
between content chunks (inter-token latency as a client sees it: a chunk may carry several tokens, as
with speculative decoding; vLLM's ``benchmarks/serve`` records its ``itl`` the same way), the completion
tokens from the final ``usage`` (``stream_options.include_usage``; the non-streamed body's ``usage``),
whether the client cancelled it (closed the connection after ``cancel_after`` chunks), and the text.

:func:`summarize` turns a list of them into the figures of a sweep point: aggregate tok/s, TTFT and
inter-token latency p50/p99 in ms, and errors by kind.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

__all__ = ["RequestResult", "chat_once", "new_connector", "percentile_ms", "run_closed_loop", "summarize"]


@dataclass
class RequestResult:
    """One request as the client saw it. Times are ``time.perf_counter()`` seconds.

    ``status`` is the HTTP status (None when no response arrived: connection refused or reset, timeout);
    ``error`` a short reason for any failure (a 4xx/5xx body's message, an exception); ``cancelled`` that
    the client closed the stream on purpose, after ``cancel_after`` content chunks (not an error)."""

    index: int
    stream: bool
    max_tokens: int
    sent: float
    status: int | None = None
    error: str | None = None
    cancelled: bool = False
    first: float | None = None
    done: float | None = None
    chunk_times: list[float] = field(default_factory=list)
    completion_tokens: int = 0
    text: str = ""

    @property
    def ok(self) -> bool:
        """Answered 200 and ended normally, or was cancelled by the client after a 200."""
        return self.status == 200 and self.error is None

    @property
    def ttft_s(self) -> float | None:
        """Seconds from sending to the first content chunk (the whole answer when not streamed)."""
        return None if self.first is None else self.first - self.sent

    @property
    def itl_s(self) -> list[float]:
        """Seconds between consecutive content chunks (empty when not streamed)."""
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:], strict=False)]

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready, without the chunk times (kept as their count) and with the text cut to 200 chars."""
        d = asdict(self)
        d["chunks"] = len(d.pop("chunk_times"))
        d["text"] = self.text[:200]
        return d


async def chat_once(session: Any, base: str, body: dict[str, Any], *, index: int = 0, stream: bool = True,
                    cancel_after: int | None = None, timeout_s: float = 600.0) -> RequestResult:
    """Send one ``/v1/chat/completions`` request on an ``aiohttp.ClientSession``; never raises for what a
    server or the network does (that is recorded in the result).

    ``body`` holds the OpenAI fields (``model``, ``messages``, ``max_tokens``, sampling); ``stream`` adds
    ``stream`` and ``stream_options.include_usage``. ``cancel_after``: close the connection after that
    many content chunks (streamed only).
    """
    import aiohttp

    body = {**body, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    res = RequestResult(index=index, stream=stream, max_tokens=int(body.get("max_tokens") or 0),
                        sent=time.perf_counter())
    try:
        async with session.post(base + "/v1/chat/completions", json=body,
                                timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
            res.status = resp.status
            if resp.status != 200:
                res.error = f"HTTP {resp.status}: {(await resp.text())[:300]}"
                res.done = time.perf_counter()
                return res
            if not stream:
                data = await resp.json()
                res.first = res.done = time.perf_counter()
                res.text = (data["choices"][0]["message"].get("content") or "")
                res.completion_tokens = int((data.get("usage") or {}).get("completion_tokens", 0))
                return res
            parts: list[str] = []
            async for raw in resp.content:
                line = raw.decode(errors="replace").strip()
                if not line.startswith("data:"):
                    continue
                payload = line[5:].strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
                if "error" in chunk:
                    res.error = f"stream error: {str(chunk['error'])[:300]}"
                    break
                if chunk.get("usage"):
                    res.completion_tokens = int(chunk["usage"].get("completion_tokens", 0))
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content")
                    if piece:
                        now = time.perf_counter()
                        res.first = res.first or now
                        res.chunk_times.append(now)
                        parts.append(piece)
                if cancel_after is not None and len(res.chunk_times) >= cancel_after:
                    res.cancelled = True
                    break
            res.text = "".join(parts)
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, KeyError, IndexError) as e:
        res.error = f"{type(e).__name__}: {str(e)[:300]}"
    res.done = time.perf_counter()
    return res


async def run_closed_loop(base: str, requests: Iterable[dict[str, Any]], streams: int, *,
                          timeout_s: float = 600.0) -> tuple[list[RequestResult], float]:
    """Send ``requests`` from ``streams`` concurrent clients, each taking the next request when its last one
    ends (a closed loop). Each request is a dict: ``body`` (OpenAI fields), and optionally ``stream``
    (default True) and ``cancel_after``. Returns the results in request order and the wall seconds.

    Raises:
        ValueError: ``streams`` < 1.
    """
    import aiohttp

    if streams < 1:
        raise ValueError(f"streams must be at least 1, got {streams}")
    queue: asyncio.Queue = asyncio.Queue()
    for i, r in enumerate(requests):
        queue.put_nowait((i, r))
    results: dict[int, RequestResult] = {}
    connector = new_connector(streams)

    async with aiohttp.ClientSession(connector=connector) as session:
        async def worker() -> None:
            while True:
                try:
                    i, r = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                results[i] = await chat_once(session, base, r["body"], index=i, stream=r.get("stream", True),
                                             cancel_after=r.get("cancel_after"), timeout_s=timeout_s)

        t = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(streams)))
        wall = time.perf_counter() - t
    return [results[i] for i in sorted(results)], wall


def new_connector(limit: int):
    """An ``aiohttp.TCPConnector`` of at most ``limit`` connections, a new connection per request
    (``force_close``): llama-server closes a connection after a streamed answer, and a kept-alive one then fails
    the next request with "Can not write request body" before the server sees it. A loopback connect costs
    microseconds; every server gets the same."""
    import aiohttp

    return aiohttp.TCPConnector(limit=limit, force_close=True)


def percentile_ms(values_s: list[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100, linear interpolation, numpy's default) of ``values_s`` seconds, in
    milliseconds; None when there are no values."""
    return float(np.percentile(np.asarray(values_s, dtype=np.float64), q) * 1000) if values_s else None


def summarize(results: list[RequestResult], wall_s: float) -> dict[str, Any]:
    """The figures of one load point.

    Returns a dict: ``requests``, ``ok``, ``cancelled``, ``errors_4xx``, ``errors_5xx``, ``errors_other``
    (no HTTP status: connection, timeout, a stream that broke), ``completion_tokens`` (of the requests that
    ended normally, cancelled ones excluded), ``agg_tps`` (those tokens / ``wall_s``, tok/s), ``ttft_p50_ms``,
    ``ttft_p99_ms`` (of the ok streamed requests), ``itl_p50_ms``, ``itl_p99_ms`` (over every gap between
    content chunks of the ok streamed requests), ``tpot_ms`` (mean over ok streamed requests of
    (last chunk - first chunk) / (completion_tokens - 1), ms per token).
    """
    ok = [r for r in results if r.ok]
    whole = [r for r in ok if not r.cancelled]
    streamed = [r for r in ok if r.stream]
    ttft = [r.ttft_s for r in streamed if r.ttft_s is not None]
    itl = [g for r in streamed for g in r.itl_s]
    tpot = [(r.chunk_times[-1] - r.chunk_times[0]) / (r.completion_tokens - 1)
            for r in streamed if not r.cancelled and r.completion_tokens > 1 and len(r.chunk_times) > 1]
    tokens = sum(r.completion_tokens for r in whole)
    return {
        "requests": len(results),
        "ok": len(ok),
        "cancelled": sum(r.cancelled for r in ok),
        "errors_4xx": sum(1 for r in results if r.status is not None and 400 <= r.status < 500),
        "errors_5xx": sum(1 for r in results if r.status is not None and r.status >= 500),
        "errors_other": sum(1 for r in results if r.error is not None and (r.status is None or r.status == 200)),
        "completion_tokens": tokens,
        "wall_s": wall_s,
        "agg_tps": tokens / wall_s if wall_s > 0 else None,
        "ttft_p50_ms": percentile_ms(ttft, 50),
        "ttft_p99_ms": percentile_ms(ttft, 99),
        "itl_p50_ms": percentile_ms(itl, 50),
        "itl_p99_ms": percentile_ms(itl, 99),
        "tpot_ms": float(np.mean(tpot) * 1000) if tpot else None,
    }
