"""Requests clients send to a real ``omni-vllm serve`` of the bundled SmolLM2 with omni's defaults (speculation
included), one server for the module:

- C41: a streamed chat completion says what the same request unstreamed says: a stop string that spans two tokens,
  log-probabilities with ``top_logprobs``, ``max_completion_tokens``, ``n`` = 2 with a seed, and the usage counts
  (``stream_options.include_usage``);
- C42: a prompt of 8160 tokens with ``max_model_len`` 8192 (SmolLM2's whole context) answers, prefilled in chunks
  of omni's step budget, and the server's memory grows by no more than that context's KV cache and one step's
  activations."""

from __future__ import annotations

import json
import sys
import urllib.request
from pathlib import Path

import pytest

from conftest import clean_env

pytestmark = pytest.mark.engine

QUESTION = [{"role": "user", "content": "Write three sentences about the sea."}]
MAX_LEN = 8192
MiB = 1 << 20


@pytest.fixture(scope="module")
def server(int4_model_dir, tmp_path_factory):
    from harness.server_process import Server

    log = tmp_path_factory.mktemp("parity") / "server.log"

    def cmd(port: int) -> list[str]:
        return [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(int4_model_dir), "--port", str(port),
                "--served-model-name", "m", "--enforce-eager", "--max-model-len", str(MAX_LEN)]

    with Server.start(cmd, log, env=clean_env(VLLM_PLUGINS="omni"), timeout_s=600) as s:
        yield s


def _plain(server, body: dict) -> dict:
    req = urllib.request.Request(server.base + "/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def _streamed(server, body: dict) -> dict:
    """The streamed answer folded into the unstreamed shape: each choice's text, finish reason and logprobs
    content, and the usage of the last event."""
    req = urllib.request.Request(server.base + "/v1/chat/completions",
                                 data=json.dumps({**body, "stream": True,
                                                  "stream_options": {"include_usage": True}}).encode(),
                                 headers={"Content-Type": "application/json"})
    choices: dict[int, dict] = {}
    usage = None
    with urllib.request.urlopen(req, timeout=300) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            usage = event.get("usage") or usage
            for c in event.get("choices", []):
                got = choices.setdefault(c["index"], {"text": "", "finish_reason": None, "logprobs": []})
                got["text"] += (c.get("delta") or {}).get("content") or ""
                got["finish_reason"] = c.get("finish_reason") or got["finish_reason"]
                got["logprobs"] += ((c.get("logprobs") or {}).get("content") or [])
    return {"choices": [choices[i] for i in sorted(choices)], "usage": usage}


def _fold(answer: dict) -> dict:
    return {"choices": [{"text": c["message"]["content"], "finish_reason": c["finish_reason"],
                         "logprobs": (c.get("logprobs") or {}).get("content") or []} for c in answer["choices"]],
            "usage": answer["usage"]}


def _same(server, body: dict) -> dict:
    plain, streamed = _fold(_plain(server, body)), _streamed(server, body)
    assert [c["text"] for c in streamed["choices"]] == [c["text"] for c in plain["choices"]]
    assert [c["finish_reason"] for c in streamed["choices"]] == [c["finish_reason"] for c in plain["choices"]]
    counts = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert [streamed["usage"][k] for k in counts] == [plain["usage"][k] for k in counts], (streamed, plain)
    return plain


def test_logprobs_with_top_logprobs_are_the_same_streamed(server):
    body = {"model": "m", "messages": QUESTION, "max_tokens": 24, "temperature": 0.0, "logprobs": True,
            "top_logprobs": 3}
    plain, streamed = _fold(_plain(server, body)), _streamed(server, body)
    want, got = plain["choices"][0]["logprobs"], streamed["choices"][0]["logprobs"]
    assert len(want) == len(got) == plain["usage"]["completion_tokens"] == 24
    for a, b in zip(want, got, strict=True):
        assert a["token"] == b["token"] and a["logprob"] == pytest.approx(b["logprob"], abs=1e-6)
        assert [t["token"] for t in a["top_logprobs"]] == [t["token"] for t in b["top_logprobs"]]
        assert len(a["top_logprobs"]) == 3


def test_a_stop_string_across_two_tokens_ends_both_alike(server):
    probe = _fold(_plain(server, {"model": "m", "messages": QUESTION, "max_tokens": 40, "temperature": 0.0,
                                  "logprobs": True}))
    tokens = [t["token"] for t in probe["choices"][0]["logprobs"]]
    i = next(k for k in range(4, len(tokens) - 1) if len(tokens[k]) >= 2 and len(tokens[k + 1]) >= 2)
    stop = tokens[i][-2:] + tokens[i + 1][:2]  # the end of one token and the start of the next
    plain = _same(server, {"model": "m", "messages": QUESTION, "max_tokens": 40, "temperature": 0.0,
                           "stop": [stop]})
    assert plain["choices"][0]["finish_reason"] == "stop" and stop not in plain["choices"][0]["text"]
    assert probe["choices"][0]["text"].startswith(plain["choices"][0]["text"])


def test_max_completion_tokens_and_the_usage_counts(server):
    plain = _same(server, {"model": "m", "messages": QUESTION, "max_completion_tokens": 7, "temperature": 0.0})
    assert plain["usage"]["completion_tokens"] == 7 and plain["choices"][0]["finish_reason"] == "length"
    assert plain["usage"]["total_tokens"] == plain["usage"]["prompt_tokens"] + 7


def test_two_seeded_samples_are_the_same_streamed(server):
    plain = _same(server, {"model": "m", "messages": QUESTION, "max_tokens": 20, "temperature": 0.9, "seed": 7,
                           "n": 2})
    assert len(plain["choices"]) == 2 and plain["usage"]["completion_tokens"] <= 40


def test_c42_a_prompt_near_the_context_answers_with_memory_bounded(server, int4_model_dir):
    from harness.memory.tree import tree_memory

    cfg = json.loads((int4_model_dir / "config.json").read_text())
    head = cfg["hidden_size"] // cfg["num_attention_heads"]
    kv_per_token = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * head * 2  # K and V, bf16: bytes
    before = sum(p.rss_anon for p in tree_memory(server.proc.pid))
    prompt = [(i * 7919) % 40000 + 100 for i in range(MAX_LEN - 32)]
    req = urllib.request.Request(server.base + "/v1/completions", headers={"Content-Type": "application/json"},
                                 data=json.dumps({"model": "m", "prompt": prompt, "max_tokens": 16,
                                                  "temperature": 0.0, "ignore_eos": True}).encode())
    with urllib.request.urlopen(req, timeout=900) as r:
        answer = json.loads(r.read())
    after = sum(p.rss_anon for p in tree_memory(server.proc.pid))
    assert (answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"]) == (MAX_LEN - 32, 16)
    assert "Chunked prefill is enabled with max_num_batched_tokens=512" in server.log.read_text()
    bound = kv_per_token * MAX_LEN + 256 * MiB  # the context's KV pages and one 512-token step's activations
    print(f"C42: tree RssAnon {before / MiB:.1f} -> {after / MiB:.1f} MiB, bound +{bound / MiB:.1f} MiB")
    assert after - before <= bound, (before, after, bound)
