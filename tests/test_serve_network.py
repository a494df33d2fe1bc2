"""``omni-vllm serve`` on a network (issue 50): loopback unless ``--host`` says otherwise (C34), and an API key that
covers every route but ``/health`` (C33; vLLM 0.28 alone guards /v1, /v2, /inference and /cohere). The argument
handling and the middleware without an engine, then one real server of the bundled SmolLM2."""

from __future__ import annotations

import asyncio
import json
import sys
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace

import pytest

from omni_platform.api_key import MIDDLEWARE, KeyOnEveryRoute
from omni_platform.vllm_cli import LOOPBACK, secure_serve_args

SERVE = ["omni-vllm", "serve", "/m"]


@pytest.mark.parametrize("extra, host_added", [
    ([], True), (["--host", "0.0.0.0"], False), (["--host=10.0.0.2"], False), (["--uds", "/tmp/s.sock"], False)])
def test_serve_listens_on_loopback_unless_a_host_is_given(extra, host_added):
    argv, lines = secure_serve_args([*SERVE, *extra])
    assert (argv[-4:-2] == ["--host", LOOPBACK]) is host_added
    assert any("listening on 127.0.0.1 only" in ln and "--host 0.0.0.0" in ln for ln in lines) is host_added
    assert argv[-2:] == ["--middleware", MIDDLEWARE]  # always: inert without a key


def test_a_host_in_the_config_file_is_the_users_choice(tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("host: 0.0.0.0\nmax-model-len: 512\n")
    argv, lines = secure_serve_args([*SERVE, "--config", str(cfg)])
    assert "--host" not in argv and not any("listening" in ln for ln in lines)


def test_other_commands_are_left_alone():
    assert secure_serve_args(["omni-vllm", "bench", "latency"]) == (["omni-vllm", "bench", "latency"], [])


def test_an_empty_key_is_refused_not_served_open(monkeypatch):
    """``--api-key "$KEY"`` with KEY unset: vLLM would drop the empty key and serve every route open."""
    for argv in ([*SERVE, "--api-key", ""], [*SERVE, "--api-key="], [*SERVE, "--api-key", " "]):
        with pytest.raises(SystemExit, match="--api-key is empty"):
            secure_serve_args(argv)
    monkeypatch.setenv("VLLM_API_KEY", "")
    _, lines = secure_serve_args(list(SERVE))
    assert any("VLLM_API_KEY is set but empty: no key guards this server" in ln for ln in lines)


def test_the_key_line_says_what_it_guards(monkeypatch):
    _, lines = secure_serve_args([*SERVE, "--api-key", "k"])
    assert any("every route but /health" in ln for ln in lines)
    monkeypatch.setenv("OMNI_OPEN_METRICS", "1")
    _, lines = secure_serve_args([*SERVE, "--api-key", "k"])
    assert any("/health and /metrics" in ln for ln in lines)


KEY_K = SimpleNamespace(api_key=["k"])  # the server's parsed arguments with --api-key k


def _call(mw: KeyOnEveryRoute, path: str, key: str | None = None, kind: str = "http", method: str = "GET",
          args=KEY_K, extra_headers: tuple = ()) -> tuple[str, object]:
    """Run one request through the middleware; ("passed", None) when it reached the app, else what was sent."""
    sent: list[dict] = []
    reached: list[str] = []

    async def app(scope, receive, send):
        reached.append(scope["path"])

    async def send(message):
        sent.append(message)

    mw.app = app
    headers = [(b"authorization", f"Bearer {key}".encode())] if key is not None else []
    headers += list(extra_headers)
    scope = {"type": kind, "path": path, "method": method, "headers": headers,
             "app": SimpleNamespace(state=SimpleNamespace(args=args))}
    asyncio.run(mw(scope, None, send))
    if reached:
        return "passed", None
    return ("closed", sent[0]["code"]) if kind == "websocket" else ("status", sent[0]["status"])


ROUTES = ["/v1/models", "/v1/chat/completions", "/invocations", "/inference/v1/generate", "/tokenize", "/detokenize",
          "/metrics", "/version", "/pooling", "/score", "/load", "/ping"]


def test_every_route_but_health_needs_the_key(monkeypatch):
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    mw = KeyOnEveryRoute(None)
    for path in ROUTES:
        assert _call(mw, path) == ("status", 401), path
        assert _call(mw, path, key="wrong") == ("status", 401), path
        assert _call(mw, path, key="k") == ("passed", None), path
    assert _call(mw, "/health") == ("passed", None)
    preflight = ((b"origin", b"http://example.org"), (b"access-control-request-method", b"POST"))
    assert _call(mw, "/v1/models", method="OPTIONS", extra_headers=preflight) == ("passed", None)  # CORS answers it
    # any other OPTIONS needs the key: the Prometheus app at /metrics answers OPTIONS with the metrics
    for path in ("/metrics", "/metrics/", "/v1/models"):
        assert _call(mw, path, method="OPTIONS") == ("status", 401), path
        assert _call(mw, path, method="OPTIONS", extra_headers=preflight[:1]) == ("status", 401), path
    assert _call(mw, "/v1/realtime", kind="websocket") == ("closed", 1008)
    assert _call(KeyOnEveryRoute(None), "/tokenize", args=SimpleNamespace(api_key=None)) == ("passed", None)


def test_metrics_open_only_when_asked_and_the_environment_key_counts(monkeypatch):
    monkeypatch.setenv("OMNI_OPEN_METRICS", "1")
    mw = KeyOnEveryRoute(None)
    assert _call(mw, "/metrics") == ("passed", None)
    assert _call(mw, "/tokenize") == ("status", 401)
    monkeypatch.setenv("VLLM_API_KEY", "env-key")  # vLLM's own fallback when --api-key is not given
    none_given = SimpleNamespace(api_key=None)
    assert _call(KeyOnEveryRoute(None), "/tokenize", args=none_given) == ("status", 401)
    assert _call(KeyOnEveryRoute(None), "/tokenize", key="env-key", args=none_given) == ("passed", None)


def test_unreadable_arguments_with_a_key_on_the_command_line_refuse(monkeypatch):
    """Closed, not open: the server's parsed arguments missing (a changed vLLM) while --api-key was given."""
    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "/m", "--api-key", "k"])
    assert _call(KeyOnEveryRoute(None), "/tokenize", key="k", args=None) == ("status", 401)
    assert _call(KeyOnEveryRoute(None), "/health", args=None) == ("passed", None)


def test_a_changed_build_app_fingerprint_closes_every_route(monkeypatch):
    """The arguments are there, but vLLM's build_app (which puts them there) changed: they are not trusted, and
    with --api-key on the command line every route but /health is refused, key or not."""
    from omni_platform import internals

    monkeypatch.setattr(sys, "argv", ["vllm", "serve", "/m", "--api-key", "k"])
    monkeypatch.setitem(internals.INTERNALS["api_key_on_every_route"].targets,
                        "vllm.entrypoints.openai.api_server:build_app", "0" * 64)
    monkeypatch.setattr(internals, "_VERDICTS", {})
    assert _call(KeyOnEveryRoute(None), "/tokenize", key="k") == ("status", 401)
    assert _call(KeyOnEveryRoute(None), "/health") == ("passed", None)


@pytest.mark.engine
def test_c33_c34_a_real_server_on_loopback_with_its_key_on_every_route(int4_model_dir, tmp_path):
    import psutil

    from conftest import clean_env
    from harness.server_process import Server

    def cmd(port: int) -> list[str]:
        return [str(Path(sys.executable).with_name("omni-vllm")), "serve", str(int4_model_dir), "--port", str(port),
                "--served-model-name", "m", "--api-key", "sekret", "--enforce-eager", "--max-model-len", "512"]

    def status(server, path: str, key: str | None = None, body: dict | None = None, method: str | None = None,
               headers: dict | None = None) -> int:
        req = urllib.request.Request(server.base + path, data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json", **(headers or {}),
                                              **({"Authorization": f"Bearer {key}"} if key else {})}, method=method)
        try:
            with urllib.request.urlopen(req, timeout=120) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    with Server.start(cmd, tmp_path / "server.log", env=clean_env(VLLM_PLUGINS="omni"), timeout_s=600) as server:
        tree = [psutil.Process(server.proc.pid), *psutil.Process(server.proc.pid).children(recursive=True)]
        listening = {(c.laddr.ip, c.laddr.port) for p in tree for c in p.net_connections(kind="inet")
                     if c.status == psutil.CONN_LISTEN}
        assert (LOOPBACK, server.port) in listening and ("0.0.0.0", server.port) not in listening, listening
        tok = {"model": "m", "prompt": "hello"}
        for path, body in [("/v1/models", None), ("/tokenize", tok), ("/detokenize", {"model": "m", "tokens": [1]}),
                           ("/metrics", None), ("/invocations", {"model": "m", "prompt": "hi", "max_tokens": 1}),
                           ("/version", None)]:
            assert status(server, path, body=body) == 401, path
        assert status(server, "/health") == 200
        assert status(server, "/metrics", method="OPTIONS") == 401  # the metrics app answers OPTIONS with data
        preflight = {"Origin": "http://example.org", "Access-Control-Request-Method": "POST"}
        assert status(server, "/v1/models", method="OPTIONS", headers=preflight) == 200  # vLLM's CORS answers
        assert status(server, "/v1/models", key="sekret") == 200
        assert status(server, "/tokenize", key="sekret", body=tok) == 200
        assert status(server, "/metrics", key="sekret") == 200
    log = (tmp_path / "server.log").read_text()
    assert "listening on 127.0.0.1 only" in log and "the API key guards every route but /health" in log


# --- C39: the --name=value and --config forms of serve's model, resolved like the spaced ones ---------------------

def _resolved(monkeypatch, argv):
    from omni_platform import extensions, vllm_cli

    monkeypatch.setattr(extensions, "resolve_model", lambda m: "/cache/conv" if m.endswith(".gguf") else m)
    return vllm_cli._resolve_serve_model(argv)


@pytest.mark.parametrize("argv, want", [
    (["omni-vllm", "serve", "q.gguf", "--served-model-name=m"], ["omni-vllm", "serve", "/cache/conv",
                                                                 "--served-model-name=m"]),
    (["omni-vllm", "serve", "--model=dir/q.gguf"], ["omni-vllm", "serve", "--model=/cache/conv",
                                                    "--served-model-name", "q.gguf"]),
    (["omni-vllm", "serve", "--model", "q.gguf", "--served-model-name", "m"],
     ["omni-vllm", "serve", "--model", "/cache/conv", "--served-model-name", "m"]),
    (["omni-vllm", "serve", "/ckpt", "--served-model-name=m"],
     ["omni-vllm", "serve", "/ckpt", "--served-model-name=m"]),
])
def test_c39_every_form_of_the_model_argument_is_resolved(monkeypatch, argv, want):
    assert _resolved(monkeypatch, argv) == want


def test_c39_a_gguf_named_in_the_config_file_is_resolved_and_keeps_its_name(monkeypatch, tmp_path):
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model: /models/q.gguf\nmax-model-len: 512\n")
    argv = ["omni-vllm", "serve", "--config", str(cfg)]
    assert _resolved(monkeypatch, argv) == [*argv, "--model", "/cache/conv", "--served-model-name", "q.gguf"]
    cfg.write_text("model: /models/q.gguf\nserved-model-name: mine\n")
    assert _resolved(monkeypatch, argv) == [*argv, "--model", "/cache/conv"]  # the config's own name stays
