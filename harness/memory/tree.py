"""Memory of a process tree, measured as the sum of RssAnon.

RssAnon (``/proc/PID/status``) counts anonymous pages only: a mmap'd checkpoint's file
pages, which VmRSS includes, are not in it, so it measures what a process really
allocated. vLLM keeps the weights in a worker process, two levels below the front end:
the tree's sum is the only honest total (C07).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import psutil

from omni_platform.procfs import status_bytes

__all__ = ["MemoryReadError", "ProcessMemory", "anon_huge_bytes", "file_pmd_mapped_bytes", "pss_bytes", "rollup_bytes",
           "rss_anon_bytes", "tree_memory", "tree_metrics"]


class MemoryReadError(RuntimeError):
    """A live process of the measured tree could not be read: the measurement has no value."""


@dataclass(frozen=True)
class ProcessMemory:
    """One process: ``pid``, ``role`` (from its title or name), and in bytes ``rss_anon`` (private
    anonymous pages: what it allocated), ``vm_rss``, ``rss_file`` (resident pages of mapped files: an
    mmap'd checkpoint) and ``rss_shmem`` (shared memory), all from ``/proc/PID/status``; ``pss`` (its
    proportional share of every resident page: a page N processes map counts 1/N in each), from
    ``/proc/PID/smaps_rollup``, when asked for."""

    pid: int
    ppid: int
    role: str
    rss_anon: int
    vm_rss: int
    rss_file: int = 0
    rss_shmem: int = 0
    pss: int | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def rss_anon_bytes(pid: int) -> int:
    """RssAnon of ``pid`` in bytes (from ``/proc/PID/status``).

    Raises:
        omni_platform.procfs.ProcFieldMissing: no RssAnon line (never read as 0).
        OSError: the process is gone or not readable.
    """
    return status_bytes("RssAnon", pid)


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


def pss_bytes(pid: int) -> int:
    """``Pss`` of ``pid`` in bytes, from ``/proc/PID/smaps_rollup`` (Linux 4.14+).

    Raises:
        OSError: the process is gone or the file unreadable.
        KeyError: the file has no ``Pss:`` line.
    """
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024  # kB
    raise KeyError(f"/proc/{pid}/smaps_rollup has no Pss line")


def tree_memory(root_pid: int, pss: bool = False) -> list[ProcessMemory]:
    """RssAnon, VmRSS, RssFile and RssShmem of ``root_pid`` and all its descendants (and ``pss`` with
    ``pss=True``: the kernel walks every page table for it, too slow for a sampler).

    A process that exits between the listing and the read, or is a zombie, is left out (it holds
    no memory any more); one that is there but cannot be read is an error, not a smaller sum.

    Raises:
        MemoryReadError: a process of the tree is alive and its ``/proc/PID/status`` unreadable
            or without the fields (the message names the pid).
    """
    try:
        root = psutil.Process(root_pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []
    out: list[ProcessMemory] = []
    for p in procs:
        try:
            if p.status() == psutil.STATUS_ZOMBIE:
                continue  # exited, not yet reaped: it holds no memory, and its status has no Rss lines
            out.append(ProcessMemory(p.pid, p.ppid(), _role(p, root_pid), rss_anon_bytes(p.pid),
                                     status_bytes("VmRSS", p.pid), status_bytes("RssFile", p.pid),
                                     status_bytes("RssShmem", p.pid), pss_bytes(p.pid) if pss else None))
        except (psutil.NoSuchProcess, FileNotFoundError, ProcessLookupError):
            continue  # gone
        except (psutil.Error, OSError, KeyError) as exc:
            raise MemoryReadError(f"process {p.pid} of the tree of {root_pid} cannot be measured: "
                                  f"{type(exc).__name__}: {exc}") from exc
    return out


def tree_metrics(tree: list[ProcessMemory]) -> dict[str, float]:
    """The tree's memory as metrics, MiB: ``rss_anon_tree_mb`` (what the processes allocated),
    ``rss_file_tree_mb`` (resident pages of the files they map: llama.cpp's and OpenVINO's weights
    live here) and ``rss_total_tree_mb`` (anonymous + file + shared: what a user's ``free`` sees them
    hold). File pages two processes share are counted once per process (an upper bound for a tree);
    ``pss_tree_mb`` (when every process has ``pss``) counts each page once across the tree: what the tree
    costs the machine (mapped weights two processes share, pages a fork shares until written)."""
    mib = float(1 << 20)
    anon = sum(p.rss_anon for p in tree)
    file = sum(p.rss_file for p in tree)
    shmem = sum(p.rss_shmem for p in tree)
    out = {"rss_anon_tree_mb": anon / mib, "rss_file_tree_mb": file / mib,
           "rss_total_tree_mb": (anon + file + shmem) / mib}
    if tree and all(p.pss is not None for p in tree):
        out["pss_tree_mb"] = sum(p.pss for p in tree) / mib
    return out


def rollup_bytes(field: str, rollup: Path = Path("/proc/self/smaps_rollup")) -> int | None:
    """One ``kB`` field of a process's ``/proc/PID/smaps_rollup`` (``AnonHugePages``, ``FilePmdMapped``...),
    in bytes, or None where the file or the field is absent."""
    try:
        for line in rollup.read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    except (OSError, ValueError, IndexError):
        return None
    return None


def anon_huge_bytes(rollup: Path = Path("/proc/self/smaps_rollup")) -> int | None:
    """Bytes of this process's anonymous memory on transparent huge pages (``AnonHugePages`` of
    ``/proc/self/smaps_rollup``), or None where the file or the field is absent."""
    return rollup_bytes("AnonHugePages", rollup)


def file_pmd_mapped_bytes(rollup: Path = Path("/proc/self/smaps_rollup")) -> int | None:
    """Bytes of file pages this process maps with 2 MiB page-table entries (``FilePmdMapped``: for omni,
    the layout file's weights on large folios, docs/cpu_int4.md "Huge pages"), or None where absent."""
    return rollup_bytes("FilePmdMapped", rollup)
