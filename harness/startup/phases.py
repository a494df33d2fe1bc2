"""A start-up's timeline from time-stamped log lines: markers per process, phases between them.

Every vLLM (and omni) log line carries the process id and a wall-clock timestamp in microseconds when
``VLLM_LOGGING_PREFIX`` is :data:`LOG_PREFIX` (vLLM puts the prefix in front of its log format,
``vllm/logger.py`` 0.28, so ``%(created)`` and ``%(process)`` are expanded by ``logging``). A *marker*
is the first line of a process that matches one of :data:`MARKERS`, plus the process's launch
(``psutil`` create time) and, for the server, the client's /health answer. Sorted by time across the
processes, consecutive markers bound the *phases*: each phase is named by the marker that begins it,
so the phases cover the launch to the first request (:data:`END`, a line the started process logs) with
no remainder by construction, and :func:`check_total` compares their sum with the launch-to-first-token
the client measured on its own clock, which the profile does not use (within 10%).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

LAUNCH = "process start: the interpreter and imports up to vLLM's platform plugins (none when forked)"
"""The label of a process's launch marker (its create time)."""
FIRST_REQUEST = "the first request (8-token prompt, one token)"
END = "(end: the first request served: its first token in vllm.LLM, its arrival at the server's engine)"
"""The label of the last marker, a line the started process logs itself (never the client's clock): the
profiled ``vllm.LLM`` script's "first token" line, or the server's "Received request" line
(``--enable-log-requests``), which precedes the first token by the request's own prefill and HTTP."""

__all__ = ["END", "FIRST_REQUEST", "LAUNCH", "LOG_PREFIX", "MARKERS", "Marker", "Phase", "check_total",
           "markers_from_log", "phases"]

LOG_PREFIX = "@%(created).6f %(process)d "
"""``VLLM_LOGGING_PREFIX`` for a profiled start: ``@<unix seconds> <pid> `` before every log line."""

_LINE = re.compile(r"@(\d+\.\d+) (\d+) ")

MARKERS: tuple[tuple[str, str], ...] = (
    # (what begins at the first line matching, regex); the order is only the order of the table
    ("vLLM's platform plugins loaded; the rest of vLLM imported (torch, transformers, entry points)",
     r"Available plugins for group vllm\.platform_plugins"),
    ("omni's patches applied; engine arguments and model config (HF config, architecture)",
     r"omni-patches: applied"),
    ("vLLM config resolved (scheduler, compilation, omni's defaults); the engine core starts (a process of its "
     "own in the server)",
     r"Resolved architecture:"),
    ("worker and distributed init", r"Initializing a V1 LLM engine"),
    ("create_weights, the layout file, checkpoint read", r"Starting to load model"),
    ("omni's kernel choice per layer shape", r"omni-quant: cpu_int4 \["),
    ("process_weights_after_loading and the release of load memory", r"Loading weights took"),
    ("KV cache budget and profile run", r"for KV cache on node"),
    ("torch.compile (Dynamo trace, AOT load or Inductor compile)",
     r"Warming up model for the compilation|omni-patches: warming up the compiled model|"
     r"Dynamo bytecode transform|Compiling a graph for"),
    ("compiled warm-up runs (the dummy forward and sampler pass)",
     r"Directly load AOT compilation|Directly load the compiled|torch\.compile takes"),
    ("after the warm-up (vLLM's gc.collect, the release of memory)", r"Warming up done"),
    ("KV cache allocation", r"GPU KV cache size"),
    ("engine ready; the front end's tokenizer, chat template and API routes",
     r"init engine \(profile, create kv cache, warmup model\) took"),
    ("HTTP server start and the first health check", r"Starting vLLM server on|Available routes are"),
    # the profiled vllm.LLM script's own lines (harness/startup/child.py)
    ("vllm.LLM(): engine arguments and config", r"startup: imports done"),
    (FIRST_REQUEST, r"startup: LLM ready"),
    (END, r"startup: first token|Received request "),
)
"""``(phase that begins there, pattern)`` for the log lines that bound phases; searched in every line."""


@dataclass(frozen=True)
class Marker:
    """One point of a start-up: ``t`` (unix seconds), ``pid``, ``label`` (the phase it begins), ``line``
    (the log line, or None for points the harness took itself)."""

    t: float
    pid: int
    label: str
    line: str | None = None


@dataclass(frozen=True)
class Phase:
    """``label`` from ``start`` to ``end`` (unix seconds) in process ``pid``; ``seconds`` = end - start."""

    label: str
    pid: int
    start: float
    end: float

    @property
    def seconds(self) -> float:
        return self.end - self.start


def markers_from_log(lines: Iterable[str]) -> list[Marker]:
    """The first line of each process matching each of :data:`MARKERS` (lines without the
    :data:`LOG_PREFIX` stamp are skipped: tqdm bars, C++ warnings)."""
    compiled = [(label, re.compile(rx)) for label, rx in MARKERS]
    seen: set[tuple[int, str]] = set()
    out: list[Marker] = []
    for line in lines:
        m = _LINE.search(line)
        if not m:
            continue
        t, pid = float(m.group(1)), int(m.group(2))
        text = line[m.end():]
        for label, rx in compiled:
            if (pid, label) not in seen and rx.search(text):
                seen.add((pid, label))
                out.append(Marker(t, pid, label, text.strip()[:200]))
                break
    return out


def phases(markers: Iterable[Marker]) -> list[Phase]:
    """Consecutive markers, sorted by time across processes, as phases named by the earlier one.

    Raises:
        ValueError: fewer than two markers.
    """
    ordered = sorted(markers, key=lambda m: m.t)
    if len(ordered) < 2:
        raise ValueError(f"a timeline needs at least a launch and a first token; got {len(ordered)} marker(s)")
    return [Phase(a.label, a.pid, a.t, b.t) for a, b in zip(ordered[:-1], ordered[1:], strict=True)]


def check_total(timeline: list[Phase], measured_s: float, tolerance: float = 0.10) -> float:
    """The relative gap between the phases' sum and ``measured_s`` (the client's launch to first token, s).

    Raises:
        ValueError: the gap is above ``tolerance`` (the message gives both figures).
    """
    total = sum(p.seconds for p in timeline)
    gap = abs(total - measured_s) / measured_s
    if gap > tolerance:
        raise ValueError(f"the phases sum to {total:.2f} s, the client measured {measured_s:.2f} s "
                         f"({gap:.0%} apart, more than {tolerance:.0%})")
    return gap
