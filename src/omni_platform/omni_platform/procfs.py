"""One reader of ``/proc/PID/status`` fields, shared by the platform, omni-patches and the harness.

A field that is missing raises: a measurement must never turn "could not read" into a number
(a missing ``RssAnon`` read as 0 MiB would win every lower-is-better memory comparison).
"""

from __future__ import annotations

__all__ = ["ProcFieldMissing", "status_bytes"]


class ProcFieldMissing(KeyError):
    """``/proc/PID/status`` has no such field (a kernel without it, or not a process status file)."""


def status_bytes(field: str, pid: int | str = "self") -> int:
    """``field`` of ``/proc/PID/status`` (a ``kB`` line such as ``RssAnon`` or ``VmRSS``), in bytes.

    Raises:
        ProcFieldMissing: the file has no ``field:`` line.
        OSError: the process is gone (``FileNotFoundError``) or not readable (``PermissionError``).
    """
    path = f"/proc/{pid}/status"
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                parts = line.split()
                if len(parts) != 3 or parts[2] != "kB":
                    raise ProcFieldMissing(f"{path}: {field} is not a kB value: {line.strip()!r}")
                return int(parts[1]) * 1024
    raise ProcFieldMissing(f"{path} has no {field} line")
