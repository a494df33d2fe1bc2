"""Memory of a process tree, measured as the sum of RssAnon.

RssAnon (``/proc/PID/status``) counts anonymous pages only: a mmap'd checkpoint's file
pages, which VmRSS includes, are not in it, so it measures what a process really
allocated. vLLM keeps the weights in a worker process, two levels below the front end:
the tree's sum is the only honest total (C07).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import psutil

__all__ = ["ProcessMemory", "rss_anon_bytes", "tree_memory"]


@dataclass(frozen=True)
class ProcessMemory:
    """One process: ``pid``, ``role`` (from its title or name), ``rss_anon`` and ``vm_rss`` in bytes."""

    pid: int
    ppid: int
    role: str
    rss_anon: int
    vm_rss: int

    def to_dict(self) -> dict:
        return asdict(self)


def _status_kb(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(f"{key} not in /proc/{pid}/status")


def rss_anon_bytes(pid: int) -> int:
    """RssAnon of ``pid`` in bytes (from ``/proc/PID/status``)."""
    return _status_kb(pid, "RssAnon")


def _role(p: psutil.Process, root_pid: int) -> str:
    """``front_end`` for the root; vLLM's process title (``VLLM::EngineCore`` -> ``EngineCore``); else the name."""
    if p.pid == root_pid:
        return "front_end"
    try:
        joined = " ".join(c for c in p.cmdline() if c).strip()
    except psutil.Error:
        joined = ""
    if joined.startswith("VLLM::"):
        return joined.split()[0].removeprefix("VLLM::")
    if "resource_tracker" in joined:
        return "resource_tracker"
    return p.name()


def tree_memory(root_pid: int) -> list[ProcessMemory]:
    """RssAnon and VmRSS of ``root_pid`` and all its descendants (processes that vanish are skipped)."""
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    out: list[ProcessMemory] = []
    for p in procs:
        try:
            out.append(ProcessMemory(p.pid, p.ppid(), _role(p, root_pid), rss_anon_bytes(p.pid),
                                     _status_kb(p.pid, "VmRSS")))
        except (psutil.Error, OSError, KeyError):
            continue
    return out
