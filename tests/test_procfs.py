"""omni_platform.procfs and the harness's tree memory: canned /proc text through a fake open that
refuses any path it was not given (pyperf's way), so these run anywhere."""

import builtins
import io

import pytest

from omni_platform import procfs

STATUS = "Name:\tpython\nVmRSS:\t  204800 kB\nRssAnon:\t  102400 kB\nRssFile:\t 10 kB\n"


@pytest.fixture
def proc(monkeypatch):
    files: dict[str, str] = {}
    real_open = builtins.open

    def fake_open(path, *args, **kwargs):
        path = str(path)
        if path.startswith("/proc/"):
            if path not in files:
                raise FileNotFoundError(path)
            return io.StringIO(files[path])
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", fake_open)
    return files


def test_fields_in_bytes(proc):
    proc["/proc/42/status"] = STATUS
    assert procfs.status_bytes("RssAnon", 42) == 102400 * 1024
    assert procfs.status_bytes("VmRSS", 42) == 204800 * 1024


def test_a_missing_field_raises_instead_of_reading_zero(proc):
    proc["/proc/42/status"] = "Name:\tpython\nVmRSS:\t 1 kB\n"  # a kernel without RssAnon
    with pytest.raises(procfs.ProcFieldMissing, match="/proc/42/status has no RssAnon line"):
        procfs.status_bytes("RssAnon", 42)
    proc["/proc/43/status"] = "RssAnon:\t 12 pages\n"
    with pytest.raises(procfs.ProcFieldMissing, match="not a kB value"):
        procfs.status_bytes("RssAnon", 43)


def test_a_gone_process_is_an_os_error(proc):
    with pytest.raises(FileNotFoundError):
        procfs.status_bytes("RssAnon", 7)


def test_tree_memory_refuses_a_live_process_it_cannot_read(monkeypatch):
    """harness.memory.tree: a live process without RssAnon fails the measurement (C07), naming the pid."""
    import os

    from harness.memory import tree as memory

    def no_field(field, pid="self"):
        raise procfs.ProcFieldMissing(f"/proc/{pid}/status has no {field} line")

    monkeypatch.setattr(memory, "status_bytes", no_field)
    with pytest.raises(memory.MemoryReadError, match=f"process {os.getpid()} .* no RssAnon"):
        memory.tree_memory(os.getpid())
