"""C40: tool calls through ``omni-vllm serve --enable-auto-tool-choice --tool-call-parser hermes`` on a chat template
in Qwen2.5's tool format (tests/data/hermes_tools.jinja), streamed and not, on the real SmolLM2 int4.

SmolLM2-135M was not trained to call tools, so each request fixes the model's text with vLLM's structured outputs
(a regex over the ``<tool_call>`` block): the model, the sampler and vLLM's grammar run for real, and what is tested is
what the server makes of that text: the parsed calls, their names and arguments, alike streamed and unstreamed, a tool
with no arguments keeping ``{}``; and a conversation that sends the calls and their results back."""

from __future__ import annotations

import json
import re
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import clean_env

pytestmark = pytest.mark.engine

TEMPLATE = Path(__file__).parent / "data" / "hermes_tools.jinja"
TOOLS = [
    {"type": "function", "function": {"name": "get_time", "description": "The time now.",
                                      "parameters": {"type": "object", "properties": {}}}},
    {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
                                      "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                     "required": ["city"]}}},
]
CALLS = {
    "no arguments": [("get_time", {})],
    "one argument": [("get_weather", {"city": "Paris"})],
    "two calls": [("get_time", {}), ("get_weather", {"city": "Oslo"})],
}


@pytest.fixture(scope="module")
def server(int4_model_dir, tmp_path_factory):
    from harness.server_process import Server

    log = tmp_path_factory.mktemp("tools") / "server.log"

    def cmd(port: int) -> list[str]:
        return [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(int4_model_dir), "--port", str(port),
                "--served-model-name", "m", "--enforce-eager", "--max-model-len", "2048",
                "--enable-auto-tool-choice", "--tool-call-parser", "hermes", "--chat-template", str(TEMPLATE)]

    with Server.start(cmd, log, env=clean_env(VLLM_PLUGINS="omni"), timeout_s=600) as s:
        yield s


def _text_of(calls: list[tuple[str, dict]]) -> str:
    return "\n".join("<tool_call>\n" + json.dumps({"name": n, "arguments": a}) + "\n</tool_call>" for n, a in calls)


def _body(calls: list[tuple[str, dict]], **extra) -> dict:
    return {"model": "m", "messages": [{"role": "user", "content": "What time is it, and the weather in Paris?"}],
            "tools": TOOLS, "tool_choice": "auto", "temperature": 0, "max_tokens": 120,
            "structured_outputs": {"regex": re.escape(_text_of(calls))}, **extra}


def _post(server, body: dict):
    return urllib.request.urlopen(urllib.request.Request(
        server.base + "/v1/chat/completions", data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}), timeout=300)


def _plain(server, body: dict) -> dict:
    with _post(server, body) as r:
        choice = json.loads(r.read())["choices"][0]
    msg = choice["message"]
    return {"finish_reason": choice["finish_reason"], "content": msg.get("content") or "",
            "calls": [(c["function"]["name"], c["function"]["arguments"]) for c in msg.get("tool_calls") or []],
            "ids": [c["id"] for c in msg.get("tool_calls") or []]}


def _streamed(server, body: dict) -> dict:
    calls: dict[int, dict] = {}
    content, finish = "", None
    with _post(server, {**body, "stream": True}) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            for c in json.loads(line[6:]).get("choices", []):
                delta = c.get("delta") or {}
                content += delta.get("content") or ""
                finish = c.get("finish_reason") or finish
                for tc in delta.get("tool_calls") or []:
                    got = calls.setdefault(tc["index"], {"name": "", "arguments": "", "id": None})
                    fn = tc.get("function") or {}
                    got["name"] += fn.get("name") or ""
                    got["arguments"] += fn.get("arguments") or ""
                    got["id"] = tc.get("id") or got["id"]
    return {"finish_reason": finish, "content": content,
            "calls": [(calls[i]["name"], calls[i]["arguments"]) for i in sorted(calls)],
            "ids": [calls[i]["id"] for i in sorted(calls)]}


@pytest.mark.parametrize("case", list(CALLS))
def test_tool_calls_parse_alike_streamed_and_not(server, case):
    want = CALLS[case]
    plain, streamed = _plain(server, _body(want)), _streamed(server, _body(want))
    for got in (plain, streamed):
        assert [n for n, _ in got["calls"]] == [n for n, _ in want], got
        assert [json.loads(a) for _, a in got["calls"]] == [a for _, a in want], got
        assert got["finish_reason"] == "tool_calls", got
        assert not got["content"].strip(), got  # the <tool_call> text is not also sent as content
        assert all(got["ids"]), got
    assert streamed["calls"] == plain["calls"]  # the same argument strings, byte for byte
    for (name, args), (_, wanted) in zip(plain["calls"], want, strict=True):
        if not wanted:
            assert args == "{}", (name, args)  # a tool without arguments keeps its {}


def test_calls_and_results_sent_back_render_and_answer(server):
    first = _plain(server, _body(CALLS["two calls"]))
    messages = [{"role": "user", "content": "What time is it, and the weather in Oslo?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": n, "arguments": a}}
                    for i, (n, a) in zip(first["ids"], first["calls"], strict=True)]},
                {"role": "tool", "tool_call_id": first["ids"][0], "content": "12:00"},
                {"role": "tool", "tool_call_id": first["ids"][1], "content": "sunny, 18 C"}]
    with _post(server, {"model": "m", "messages": messages, "tools": TOOLS, "temperature": 0,
                        "max_tokens": 24}) as r:
        answer = json.loads(r.read())
    assert answer["choices"][0]["finish_reason"] in ("stop", "length", "tool_calls"), answer
    assert answer["usage"]["prompt_tokens"] > 100  # the tools, both calls and both results were rendered
