"""A mapped layout file changed under a running engine: never a wrong token, never a silent crash (C37).

The layout cache (:mod:`omni_quant.runtime.layout_cache`) serves a model's cpu_int4 weights from a
``MAP_SHARED`` mapping of its layout file. What happens to that file while an engine maps it:

- *deleted*, or *replaced by rename* (how omni itself writes it: ``write_layout``'s temporary file and
  ``os.replace``): the mapping keeps the old inode, the engine keeps serving the bytes it checked, and the
  next start finds the file missing (writes it again) or checks the new one against its key;
- *truncated or written in place* (``truncate``, ``dd conv=notrunc``, an editor saving over it): the mapped
  pages are the file's. A truncated page faults with ``SIGBUS`` (the process dies with no Python message);
  a rewritten one changes the weights under the kernels, and the tokens with them.

:func:`guard` takes a Linux read lease on the mapped file (``fcntl(F_SETLEASE, F_RDLCK)``, man 2 fcntl,
"Leases"): an ``open`` for writing or a ``truncate`` of it by any process then blocks in the kernel, for up
to ``/proc/sys/fs/lease-break-time`` seconds (45 by default), while the lease holder gets ``SIGIO`` (an
``open`` with ``O_NONBLOCK``, as coreutils' ``truncate`` and ``touch`` do, fails at once with ``EAGAIN`` and
breaks the lease all the same: the lease cannot tell a ``touch`` from a write). The handler removes the path
while it still names the mapped inode (the blocked writer already holds that inode and writes into it, now
nameless), names the file and what to do, then ends this process (``SystemExit`` in the main thread, and
``os._exit`` :data:`EXIT_AFTER_S` seconds later if something swallowed it); the lease goes with the process,
and only then does the writer's call proceed. So the weights never change under a running engine, and the
next start, finding no file, writes it again: a file written in place keeps its size and header, which is
all ``layout_file.open_layout`` checks (the tensor bytes carry no checksum), so it must not be left for the
next start to map. A server's front end sees its engine core exit and stops.

Where no lease can be taken (another user's file without ``CAP_LEASE``, a file system without leases such
as NFS, a file open for writing elsewhere, a load outside the main thread), a daemon thread compares the
file's size and modification time with the mapped ones every :data:`POLL_S` seconds and, on a change,
removes the path and ends the process the same way; a change between two looks can reach a step (said in
the log line that names the guard).
"""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EXIT_AFTER_S", "F_GETLEASE", "F_SETLEASE", "POLL_S", "Guarded", "guard", "guarded"]

logger = logging.getLogger("vllm.omni_quant.layout")

F_SETLEASE = getattr(fcntl, "F_SETLEASE", 1024)
"""``fcntl`` command (Linux ``include/uapi/linux/fcntl.h``: ``F_LINUX_SPECIFIC_BASE + 0``)."""
F_GETLEASE = getattr(fcntl, "F_GETLEASE", 1025)
EXIT_AFTER_S = 5.0
"""Seconds between the message and ``os._exit`` when the ``SystemExit`` did not end the process."""
POLL_S = 1.0
"""Seconds between two looks at the file where no lease could be taken."""


@dataclass
class Guarded:
    """One guarded file: ``path``, ``fd`` (the leased descriptor, or -1), ``how`` ("lease" or "watch")."""

    path: Path
    fd: int
    how: str
    size: int
    mtime_ns: int
    ino: int
    dev: int = -1


_guarded: list[Guarded] = []
_handler_installed = False
_lock = threading.Lock()


def guarded() -> list[Guarded]:
    """The files this process guards (for reports and tests)."""
    return list(_guarded)


def _remove(g: Guarded) -> str:
    """Unlink ``g.path`` while it still names the mapped inode; what became of it, for the message."""
    try:
        st = os.stat(g.path)
        if (st.st_ino, st.st_dev) != (g.ino, g.dev if g.dev >= 0 else st.st_dev):
            return "the path now names another file, left as it is"
        os.unlink(g.path)
        return "the file is removed (a writer already holding it writes into the removed file)"
    except FileNotFoundError:
        return "the file is gone already"
    except OSError as exc:
        return (f"it could not be removed ({exc.strerror or exc}): delete it before the next start, which would "
                "otherwise map it as it is now")


def _message(path: Path, what: str, removed: str) -> str:
    return (f"omni-quant: the layout file {path} was {what} while this engine computes from its mapping; {removed}; "
            "this process exits now so that no token is computed from changed weights (C37). Start it again: the "
            "next start writes the file again. Do not open files under omni-layouts/ for writing (even `touch`); "
            "`omni-quant cache prune` or deleting the file is safe")


def _stop(message: str, in_main_thread: bool) -> None:
    logger.error("%s", message)
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass

    def backstop() -> None:
        time.sleep(EXIT_AFTER_S)
        os._exit(70)

    threading.Thread(target=backstop, name="omni-layout-exit", daemon=True).start()
    if in_main_thread:
        raise SystemExit(70)
    os._exit(70)


def _on_sigio(signum, frame) -> None:
    for g in list(_guarded):
        if g.how != "lease":
            continue
        try:
            state = fcntl.fcntl(g.fd, F_GETLEASE)
        except OSError:
            continue
        if state != fcntl.F_RDLCK:  # being broken: the holder's target type is F_UNLCK
            _stop(_message(g.path, "opened for writing or truncated by another process", _remove(g)), True)
    if callable(_previous_sigio):
        _previous_sigio(signum, frame)


_previous_sigio = None


def _watch(g: Guarded) -> None:
    while True:
        time.sleep(POLL_S)
        try:
            st = os.stat(g.path)
        except FileNotFoundError:
            continue  # deleted: the mapping keeps the old inode
        except OSError:
            continue
        if st.st_ino != g.ino:
            continue  # replaced by rename: ours is intact
        if st.st_size != g.size or st.st_mtime_ns != g.mtime_ns:
            _stop(_message(g.path, "truncated or written in place", _remove(g)), False)


def guard(path: Path, ino: int | None = None) -> Guarded | None:
    """Guard the mapped layout file ``path`` (inode ``ino`` when known: the one mapped) for this process's
    life. Returns what it set up, or None when ``path`` is no longer the mapped file (replaced by rename
    already: the mapping is safe as it is). Never raises: a guard that cannot be set up is logged."""
    global _handler_installed, _previous_sigio
    path = Path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as exc:
        logger.info("omni-quant: layout file %s not guarded (%s)", path, exc)
        return None
    st = os.fstat(fd)
    if ino is not None and st.st_ino != ino:
        os.close(fd)
        return None
    g = Guarded(path, fd, "lease", st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)
    why = None
    if threading.current_thread() is not threading.main_thread():
        why = "the model loads outside the main thread (no signal handler there)"
    else:
        with _lock:
            if not _handler_installed:
                _previous_sigio = signal.signal(signal.SIGIO, _on_sigio)
                _handler_installed = True
        try:
            fcntl.fcntl(fd, F_SETLEASE, fcntl.F_RDLCK)
        except OSError as exc:
            why = f"no read lease ({exc.strerror or exc})"
    if why is not None:
        os.close(fd)
        g.fd, g.how = -1, "watch"
        threading.Thread(target=_watch, args=(g,), name="omni-layout-watch", daemon=True).start()
        logger.info("omni-quant: layout file %s watched every %.0f s for changes in place: %s; a change between "
                    "two looks can reach a step", path, POLL_S, why)
    else:
        logger.info("omni-quant: layout file %s guarded by a read lease: a write or truncation of it ends this "
                    "process before it takes effect", path)
    _guarded.append(g)
    return g
