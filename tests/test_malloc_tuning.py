"""omni_platform.malloc_tuning: glibc's mmap threshold fixed, so freed temporaries leave RssAnon."""

import json
import os
import subprocess
import sys

MiB = 1 << 20

_CODE = """
import ctypes, json, os
from omni_platform.procfs import status_bytes
applied = None
if os.environ.get("APPLY") == "1":
    from omni_platform.malloc_tuning import apply
    applied = apply()
# what vLLM's start-up does: a 24 MiB temporary freed (the dynamic threshold rises to 24 MiB) ...
big = ctypes.create_string_buffer(24 << 20); del big
# ... then temporaries of 4 MiB, touched and freed, with a small live object after each (no trim at top)
keep = []
for i in range(40):
    b = ctypes.create_string_buffer(4 << 20); keep.append(ctypes.create_string_buffer(64)); del b
env = os.environ.get("MALLOC_MMAP_THRESHOLD_")
print(json.dumps({"rss_anon": status_bytes("RssAnon"), "applied": applied, "env": env}))
"""


def _run(apply: bool, **env) -> dict:
    environ = {k: v for k, v in os.environ.items() if k not in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}
    environ.update(APPLY="1" if apply else "0", **env)
    out = subprocess.run([sys.executable, "-c", _CODE], env=environ, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_freed_temporaries_leave_rss_anon_with_the_threshold_fixed():
    before = _run(apply=False)
    after = _run(apply=True)
    assert after["applied"] == 1 << 20 and after["env"] == str(1 << 20), "children inherit it through glibc's tunable"
    assert before["rss_anon"] - after["rss_anon"] >= 2 * MiB, (before, after)


def test_zero_and_the_users_own_tuning_leave_glibc_alone():
    assert _run(apply=True, OMNI_MALLOC_MMAP_THRESHOLD="0")["applied"] is None
    mine = _run(apply=True, MALLOC_MMAP_THRESHOLD_="65536")
    assert mine["applied"] is None and mine["env"] == "65536"
    assert _run(apply=True, GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")["applied"] is None


_TRIM_CODE = """
import ctypes, json, os, threading, time
from omni_platform import malloc_tuning
from omni_platform.procfs import status_bytes
from omni_platform.malloc_tuning import start_trimmer
started = start_trimmer() if os.environ.get("TRIM") == "1" else False
# fragment the heap: 100 KiB chunks (below the mmap threshold), every other one kept, the rest freed
chunks = [ctypes.create_string_buffer(100 << 10) for _ in range(400)]
keep = chunks[::2]; del chunks
# a trim that began after the frees has finished (OMNI_MALLOC_TRIM_S=1); without the trimmer, the same wait
target, deadline = malloc_tuning.trims_done + 2, time.monotonic() + 30
while (malloc_tuning.trims_done < target if started else time.monotonic() < deadline - 28) \
        and time.monotonic() < deadline:
    time.sleep(0.05)
assert not started or malloc_tuning.trims_done >= target, "the trimmer ran no trim in 30 s"
pid = os.fork()
if pid == 0:
    names = [t.name for t in threading.enumerate()]
    os._exit(0 if "omni-malloc-trim" in names or not started else 3)
_, status = os.waitpid(pid, 0)
print(json.dumps({"started": started, "rss_anon": status_bytes("RssAnon"), "child": os.waitstatus_to_exitcode(status),
                  "threads": [t.name for t in threading.enumerate()]}))
"""


def _trim_run(trim: bool) -> dict:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "OMNI_"))}
    environ.update(TRIM="1" if trim else "0", OMNI_MALLOC_TRIM_S="1")
    out = subprocess.run([sys.executable, "-c", _TRIM_CODE], env=environ, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_trimmer_returns_the_free_pages_inside_the_heap_and_follows_a_fork():
    plain, trimmed = _trim_run(False), _trim_run(True)
    assert trimmed["started"] and "omni-malloc-trim" in trimmed["threads"]
    assert trimmed["child"] == 0, "the forked child has no trimming thread"
    # 200 freed 100 KiB chunks between live ones: about 20 MiB resident without trimming, returned with it
    assert plain["rss_anon"] - trimmed["rss_anon"] > 10 * MiB, (plain, trimmed)
