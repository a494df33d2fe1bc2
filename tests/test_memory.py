"""RssAnon, RssFile and RssShmem over a process tree (harness.memory.tree)."""

import os
import subprocess
import sys

from harness.memory.tree import rss_anon_bytes, tree_memory, tree_metrics

MiB = 1 << 20


def test_rss_anon_ignores_mmapped_file_pages_that_vmrss_counts(tmp_path):
    data = tmp_path / "weights.bin"
    data.write_bytes(os.urandom(64 * MiB))
    code = (
        "import mmap, sys, time\n"
        f"f = open({str(data)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "s = sum(m[i] for i in range(0, len(m), 4096))\n"
        "print('ready', flush=True); time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        (me,) = [m for m in tree_memory(p.pid) if m.pid == p.pid]
        assert me.vm_rss - me.rss_anon >= 60 * MiB, "VmRSS counts the mapped file"
        assert me.rss_anon < 40 * MiB, "RssAnon does not"
        assert me.rss_file >= 60 * MiB, "RssFile does: the mapped weights a user's free still sees"
        sums = tree_metrics([me])
        assert sums["rss_file_tree_mb"] >= 60 and sums["rss_anon_tree_mb"] < 40
        assert sums["rss_total_tree_mb"] == (me.rss_anon + me.rss_file + me.rss_shmem) / MiB
    finally:
        p.kill()
        p.wait()


def test_tree_sums_children(tmp_path):
    code = (
        "import subprocess, sys, time\n"
        "c = subprocess.Popen([sys.executable, '-c',"
        " 'x = bytearray(48 << 20); import time; print(1, flush=True); time.sleep(60)'],"
        " stdout=subprocess.PIPE)\n"
        "c.stdout.readline(); print('ready', flush=True); time.sleep(60)\n"
    )
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        tree = tree_memory(p.pid)
        assert len(tree) == 2
        child = [m for m in tree if m.pid != p.pid][0]
        assert child.ppid == p.pid and child.rss_anon >= 48 * MiB
        assert abs(rss_anon_bytes(child.pid) - child.rss_anon) < 4 * MiB
    finally:
        for proc in tree_memory(p.pid)[1:]:
            os.kill(proc.pid, 9)
        p.kill()
        p.wait()


def test_tree_peak_sees_a_transient_allocation_the_steady_state_does_not():
    """A child allocates 200 MiB, frees it, and waits: the sampled peak holds it, the end state does not."""
    from harness.memory.peak import TreePeak

    code = ("import sys, time\n"
            "x = bytearray(200 << 20); x[::4096] = b'x' * len(x[::4096]); time.sleep(0.5); del x\n"
            "print('freed', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        with TreePeak(p.pid, interval_s=0.02) as peak:
            assert p.stdout.readline().strip() == "freed"
        m = peak.metrics()
        (now,) = tree_memory(p.pid)
        assert m["peak_anon_tree_mb"] >= 200, m
        assert now.rss_anon < 100 * MiB, "the end state no longer holds the 200 MiB"
        assert m["peak_total_tree_mb"] >= m["peak_anon_tree_mb"]
        assert peak.hwm()["vm_hwm"][str(p.pid)]["vm_hwm"] >= 200 * MiB, "VmHWM, the process's own peak"
    finally:
        p.kill()
        p.wait()


def test_tree_peak_without_a_sample_is_an_error_not_zero():
    import pytest

    from harness.memory.peak import TreePeak
    from harness.memory.tree import MemoryReadError

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    peak = TreePeak(p.pid).start().stop()
    with pytest.raises(MemoryReadError, match="no memory sample"):
        peak.metrics()
    with pytest.raises(ValueError, match="interval_s"):
        TreePeak(os.getpid(), interval_s=0)


def test_the_ledger_of_a_plain_process_names_its_tensors_stacks_and_heap():
    """harness.memory.ledger.account in a fresh Python: a 96 MiB tensor, 3 threads, a 40 MiB bytearray
    (Python object > 512 B: malloc) and 200k small objects (pymalloc); at most 10% unexplained."""
    code = ("import json, threading, time, torch\n"
            "from harness.memory.ledger import account\n"
            "t = torch.ones(24 << 20)\n"
            "b = bytearray(40 << 20); b[::4096] = b'x' * len(b[::4096])\n"
            "small = [str(i) * 3 for i in range(200_000)]\n"
            "ev = threading.Event(); ths = [threading.Thread(target=ev.wait) for _ in range(3)]\n"
            "[th.start() for th in ths]\n"
            "a = account(release=True); ev.set()\n"
            "print(json.dumps(a))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    a = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    items = a["items"]
    assert items["tensors"] >= 96 * MiB, items
    assert items["malloc_other"] >= 40 * MiB, "the bytearray is malloc'd and not a tensor"
    assert items["python_arenas"] >= 8 * MiB, "200k small strings live in pymalloc's arenas"
    assert a["anon_by_kind"].get("thread_stack", 0) > 0, a["anon_by_kind"]
    assert abs(a["unexplained"]) <= 0.10 * a["rss_anon"], a
    assert a["released"]["returned"] == a["released"]["rss_anon_before"] - a["released"]["rss_anon_after"]


def test_pss_counts_a_file_two_processes_map_once(tmp_path):
    """Two processes reading the same 64 MiB mapped file: RssFile counts it in each, Pss half in each."""
    data = tmp_path / "weights.bin"
    data.write_bytes(os.urandom(64 * MiB))
    script = tmp_path / "share.py"
    script.write_text(
        "import mmap, subprocess, sys, time\n"
        f"f = open({str(data)!r}, 'rb'); m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)\n"
        "s = sum(m[i] for i in range(0, len(m), 4096))\n"
        "if len(sys.argv) < 2:\n"
        "    c = subprocess.Popen([sys.executable, __file__, 'child'], stdout=subprocess.PIPE, text=True)\n"
        "    c.stdout.readline()\n"
        "print('ready', flush=True); time.sleep(60)\n")
    p = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        tree = tree_memory(p.pid, pss=True)
        assert len(tree) == 2, tree
        m = tree_metrics(tree)
        assert m["rss_file_tree_mb"] >= 120, "each process counts the whole file in its RssFile"
        assert m["pss_tree_mb"] <= m["rss_total_tree_mb"] - 50, m
        assert tree_metrics(tree_memory(p.pid)).get("pss_tree_mb") is None, "Pss only when asked"
    finally:
        for c in __import__("psutil").Process(p.pid).children(recursive=True):
            c.kill()
        p.kill()
        p.wait()
