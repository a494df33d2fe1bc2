"""The load client (harness/load/client.py) against a stub OpenAI server: counts, percentiles, cancellation and
error accounting; the servers' command lines; the soak's random requests and memory slope."""

from __future__ import annotations

import asyncio
import json
import random
import socket
import threading

import numpy as np
import pytest
from aiohttp import web

from harness.load.client import run_closed_loop, summarize
from harness.load.servers import ServerSpec, server_command
from harness.load.soak import random_request, rss_slope_kib_per_request, windows
from harness.load.sweep import requests_for

CHUNK_S = 0.01


def _stub_app() -> web.Application:
    """An OpenAI-shaped chat server: the user text picks the behaviour ("fail500", "fail400", "break"); otherwise
    ``max_tokens`` chunks of one word, CHUNK_S apart, and the usage at the end."""

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        text = body["messages"][-1]["content"]
        if text == "fail500":
            return web.json_response({"error": {"message": "boom"}}, status=500)
        if text == "fail400":
            return web.json_response({"error": {"message": "bad"}}, status=400)
        n = int(body["max_tokens"])
        if not body.get("stream"):
            await asyncio.sleep(CHUNK_S * n)
            return web.json_response({"choices": [{"message": {"content": "w " * n}}],
                                      "usage": {"completion_tokens": n}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(n):
                await asyncio.sleep(CHUNK_S)
                if text == "break" and i == 2:
                    await resp.write(b"data: {not json\n\n")
                    return resp
                await resp.write(f"data: {json.dumps({'choices': [{'delta': {'content': 'w '}}]})}\n\n".encode())
            await resp.write(f"data: {json.dumps({'choices': [], 'usage': {'completion_tokens': n}})}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
            if text == "close":  # as llama-server does: the connection ends with the stream, without saying so
                await resp.write_eof()
                request.transport.close()
        except ConnectionResetError:
            pass
        return resp

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


@pytest.fixture(scope="module")
def stub() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(_stub_app())
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{port}"
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)


def _req(text: str, n: int = 5, stream: bool = True, cancel_after: int | None = None) -> dict:
    return {"body": {"model": "m", "messages": [{"role": "user", "content": text}], "max_tokens": n},
            "stream": stream, "cancel_after": cancel_after}


def test_counts_errors_cancellation_and_tokens(stub: str) -> None:
    reqs = [_req("hi", 5), _req("hi", 7, stream=False), _req("fail500"), _req("fail400"), _req("break"),
            _req("hi", 20, cancel_after=3), _req("hi", 4)]
    results, wall = asyncio.run(run_closed_loop(stub, reqs, streams=3))
    assert [r.index for r in results] == list(range(len(reqs)))
    s = summarize(results, wall)
    assert s["requests"] == 7
    assert s["errors_5xx"] == 1 and s["errors_4xx"] == 1
    assert s["errors_other"] == 1, [r.error for r in results]  # the broken stream: a 200 that did not end well
    assert "JSONDecodeError" in results[4].error
    assert s["cancelled"] == 1 and results[5].cancelled and len(results[5].chunk_times) == 3
    assert s["ok"] == 4  # two whole streams, one non-streamed, one cancelled after a 200
    assert s["completion_tokens"] == 5 + 7 + 4  # the cancelled request's tokens are not counted
    assert s["agg_tps"] == pytest.approx(16 / wall)
    assert results[0].text == "w " * 5 and results[1].completion_tokens == 7
    assert "boom" in results[2].error and results[2].status == 500


def test_a_server_closing_the_connection_after_a_stream_fails_no_request(stub: str) -> None:
    results, wall = asyncio.run(run_closed_loop(stub, [_req("close", 3), _req("hi", 3), _req("close", 3),
                                                       _req("hi", 3, stream=False)], streams=1))
    assert [r.error for r in results] == [None] * 4 and summarize(results, wall)["ok"] == 4


def test_percentiles_are_of_the_streamed_gaps(stub: str) -> None:
    results, wall = asyncio.run(run_closed_loop(stub, [_req("hi", 11) for _ in range(4)], streams=2))
    s = summarize(results, wall)
    gaps = [g for r in results for g in r.itl_s]
    assert len(gaps) == 4 * 10
    assert s["itl_p50_ms"] == pytest.approx(float(np.percentile(gaps, 50)) * 1000)
    assert s["itl_p99_ms"] >= s["itl_p50_ms"] >= CHUNK_S * 1000 * 0.9
    ttft = [r.first - r.sent for r in results]
    assert s["ttft_p99_ms"] == pytest.approx(float(np.percentile(ttft, 99)) * 1000)
    # two streams at a time, two rounds: the wall time is at least two requests' worth of chunks
    assert wall >= 2 * 11 * CHUNK_S


def test_refused_connection_is_an_error_not_an_exception() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    results, wall = asyncio.run(run_closed_loop(f"http://127.0.0.1:{port}", [_req("hi")], streams=1))
    s = summarize(results, wall)
    assert s["errors_other"] == 1 and s["ok"] == 0 and results[0].status is None
    with pytest.raises(ValueError, match="at least 1"):
        asyncio.run(run_closed_loop("http://127.0.0.1:1", [], streams=0))


def test_llama_server_command_line_from_the_spec() -> None:
    spec = ServerSpec("llama-server", "/m/q.gguf", extra="-fa on --cache-ram 0", ctx_per_slot=2048,
                      binary="/opt/llama-server")
    cmd = server_command(spec, port=8123, slots=8, threads=2)
    assert cmd[:3] == ["/opt/llama-server", "-m", "/m/q.gguf"]
    joined = " ".join(cmd)
    assert "--port 8123" in joined and "-t 2 -tb 2" in joined
    assert "-np 8" in joined and "-c 16384" in joined  # -c is the total over the slots
    assert cmd[-4:] == ["-fa", "on", "--cache-ram", "0"]
    omni = server_command(ServerSpec("omni", "/ckpt", extra="--max-model-len 2048"), port=9000, slots=8)
    assert omni[1:3] == ["serve", "/ckpt"] and "-np" not in omni and omni[-2:] == ["--max-model-len", "2048"]
    own = server_command(ServerSpec("llama-server", "/m/q.gguf", ctx_per_slot=None, binary="/b"), port=1, slots=8)
    assert "-c" not in own and "-np" not in own  # llama-server's own defaults: the GGUF's context, its slots
    with pytest.raises(ValueError, match="not one of"):
        ServerSpec("tgi", "/m")


def test_sweep_requests_are_the_workload_prompts_in_turn() -> None:
    reqs = requests_for(4, 2, 64, ("edit", "prose"))
    assert len(reqs) == 8 and all(r["body"]["max_tokens"] == 64 and r["body"]["ignore_eos"] for r in reqs)
    texts = [r["body"]["messages"][-1]["content"] for r in reqs]
    assert texts[0] == texts[3] != texts[1] != texts[2] != texts[0]  # three prompts (two edits, one prose), in turn


def test_distinct_sweep_requests_share_no_prefix_past_the_template() -> None:
    """``--distinct-prompts``: every request opens with a system message of its own, so the rendered chats of two
    requests part within their first line, whatever prompt of the workload follows."""
    from transformers import AutoTokenizer

    from harness.models.registry import fetch

    reqs = requests_for(4, 2, 64, ("edit", "prose"), distinct=True)
    firsts = [r["body"]["messages"][0] for r in reqs]
    assert all(m["role"] == "system" for m in firsts) and len({m["content"] for m in firsts}) == 8
    assert [r["body"]["messages"][1:] for r in reqs] == [r["body"]["messages"] for r in requests_for(4, 2, 64,
                                                                                                     ("edit", "prose"))]
    tok = AutoTokenizer.from_pretrained(str(fetch("smollm2-135m-int4")))
    ids = [tok.apply_chat_template(r["body"]["messages"], tokenize=False) for r in reqs[:4]]
    common = min(len(_common_prefix(a, b)) for a in ids for b in ids if a != b)
    assert common < 43, common  # characters: the template's opening and "Session 04-0000"
    other_level = {m["content"] for m in (r["body"]["messages"][0] for r in requests_for(2, 2, 64, ("edit",),
                                                                                          distinct=True))}
    assert not other_level & {m["content"] for m in firsts}  # another stream count: none of the same sessions


def _common_prefix(a: str, b: str) -> str:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return a[:n]


def test_soak_requests_are_seeded_and_bounded() -> None:
    from harness.workloads.prompts import all_prompts

    prompts = all_prompts()
    a = [random_request(random.Random(7), prompts, 64, 0.1) for _ in range(1)]
    b = [random_request(random.Random(7), prompts, 64, 0.1) for _ in range(1)]
    assert a == b
    rng = random.Random(1)
    many = [random_request(rng, prompts, 64, 0.1) for _ in range(2000)]
    assert all(8 <= r["body"]["max_tokens"] <= 64 for r in many)
    cancelled = sum(r["cancel_after"] is not None for r in many)
    assert 140 <= cancelled <= 260  # about 10%
    assert all(r["stream"] for r in many if r["cancel_after"] is not None)
    assert {r["body"]["temperature"] for r in many} == {0.0, 0.8}


def test_rss_slope_counts_only_after_warmup() -> None:
    samples = [{"t_s": 0, "requests_done": 0, "rss_anon_bytes": 0},  # warm-up growth, ignored
               *({"t_s": 60 + 30 * i, "requests_done": 100 * i, "rss_anon_bytes": 10**9 + 2048 * 100 * i}
                 for i in range(5))]
    assert rss_slope_kib_per_request(samples, 60) == pytest.approx(2.0)
    assert rss_slope_kib_per_request(samples[:3], 60) is None  # too few samples after warm-up


def test_windows_split_by_send_time(stub: str) -> None:
    results, wall = asyncio.run(run_closed_loop(stub, [_req("hi", 3), _req("fail500")], streams=1))
    rows = windows(results, results[0].sent, window_s=3600)
    assert rows == [{"window": 0, "start_s": 0.0, "requests": 2, "ok": 1, "errors": 1,
                     "ttft_p50_ms": pytest.approx(results[0].ttft_s * 1000),
                     "ttft_p99_ms": pytest.approx(results[0].ttft_s * 1000)}]


class _SteppedStub:
    """A stepped engine like OpenVINO's ContinuousBatchingPipeline: one token per running request per step, for
    ``max_tokens`` steps; a request whose text is "fail" raises at submit. Records how many ran at once."""

    def __init__(self) -> None:
        self.running: dict[int, int] = {}
        self.most = 0
        self.t = 0.0

    def submit(self, i: int, r: dict) -> int:
        if r["body"]["messages"][-1]["content"] == "fail":
            raise RuntimeError("refused")
        self.running[i] = int(r["body"]["max_tokens"])
        self.most = max(self.most, len(self.running))
        return i

    def step(self) -> None:
        self.t += 0.01
        for i in self.running:
            self.running[i] -= 1

    def poll(self, i: int) -> tuple[int, bool]:
        left = self.running[i]
        if left <= 0:
            del self.running[i]
        return 1, left <= 0


def test_the_stepped_closed_loop_keeps_n_running_and_times_each_step() -> None:
    from harness.load.openvino_cb import drive_closed_loop

    stub = _SteppedStub()
    reqs = [{"body": {"messages": [{"role": "user", "content": "fail" if i == 3 else "x"}], "max_tokens": 5 + i}}
            for i in range(10)]
    results, wall = drive_closed_loop(stub.submit, stub.step, stub.poll, reqs, 4, clock=lambda: stub.t)
    assert stub.most == 4 and [r.index for r in results] == list(range(10))
    assert [r.completion_tokens for r in results] == [5 + i if i != 3 else 0 for i in range(10)]
    assert results[3].error == "RuntimeError: refused" and not results[3].ok
    s = summarize(results, wall)
    assert (s["requests"], s["ok"], s["errors_other"]) == (10, 9, 1)  # refused at submit: no status, an error
    assert s["itl_p50_ms"] == pytest.approx(10.0) and s["ttft_p50_ms"] == pytest.approx(10.0)
    assert s["completion_tokens"] == sum(5 + i for i in range(10) if i != 3)
    with pytest.raises(ValueError, match="at least 1"):
        drive_closed_loop(stub.submit, stub.step, stub.poll, reqs, 0)
