"""A directory made read-only for a test, for root too: mode 0555, and the immutable attribute
(``chattr +i``, ext4/xfs/btrfs) when the mode alone does not stop this user (root ignores modes)."""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path


def _writable(d: Path) -> bool:
    probe = d / ".write-probe"
    try:
        probe.write_bytes(b"")
    except OSError:
        return False
    probe.unlink()
    return True


@contextlib.contextmanager
def read_only(d: Path) -> Iterator[Path]:
    """``d`` unwritable inside the block, restored after it.

    Raises:
        AssertionError: neither the mode nor ``chattr +i`` makes ``d`` unwritable here (the message says so).
    """
    d.chmod(0o555)
    immutable = False
    try:
        if _writable(d):
            immutable = subprocess.run(["chattr", "+i", str(d)], capture_output=True).returncode == 0
        assert not _writable(d), f"cannot make {d} read-only here (mode 0555 ignored, chattr +i failed)"
        yield d
    finally:
        if immutable:
            subprocess.run(["chattr", "-i", str(d)], check=True)
        d.chmod(0o755)
