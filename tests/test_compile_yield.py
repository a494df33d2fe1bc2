"""omni_platform.compile_yield on real processes: a background group is stopped while a server tree is busy,
goes on once it has been idle, and is never left stopped when the front end that stopped it is killed."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import psutil

from omni_platform.compile_yield import Yielder

# a stand-in for the background compile: a session leader that passes SIGCONT to its group, and a child
_GROUP = textwrap.dedent("""
    import subprocess, sys, time
    from omni_platform.compile_yield import resume_group_on_sigcont
    resume_group_on_sigcont()
    child = subprocess.Popen([sys.executable, "-c", "import time\\nwhile True: time.sleep(0.05)"])
    print(child.pid, flush=True)
    while True:
        time.sleep(0.05)
""")


def _states(pids: list[int]) -> set[str]:
    return {psutil.Process(p).status() for p in pids}


def _wait_for(pred, timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def _group_members(leader: subprocess.Popen) -> list[int]:
    return [leader.pid, int(leader.stdout.readline())]


def test_the_group_stops_while_the_server_is_busy_and_goes_on_after_it_idles():
    group = subprocess.Popen([sys.executable, "-c", _GROUP], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
    server = subprocess.Popen([sys.executable, "-c", "import time\nt = time.monotonic() + 1.5\n"
                               "while time.monotonic() < t: pass\ntime.sleep(60)"])
    try:
        members = _group_members(group)
        y = Yielder(group.pid, root=server.pid, idle_s=0.5)
        seen_stopped, t_stop, t_cont = False, None, None
        t0 = time.monotonic()
        while time.monotonic() - t0 < 6.0:
            y.step(time.monotonic())
            if y.stopped and not seen_stopped:
                assert _wait_for(lambda: _states(members) == {psutil.STATUS_STOPPED}, 5)
                seen_stopped, t_stop = True, time.monotonic() - t0
            if seen_stopped and not y.stopped and t_cont is None:
                t_cont = time.monotonic() - t0
                assert _wait_for(lambda: psutil.STATUS_STOPPED not in _states(members), 5)
            time.sleep(0.1)
        assert seen_stopped and t_stop < 1.5, "the busy server's first samples stop the group"
        assert t_cont is not None and t_cont >= 1.5 + 0.5 - 0.2, "the group goes on only after the idle period"
        assert y.stops == 1
    finally:
        for p in (server, group):
            p.kill()
        subprocess.run(["pkill", "-KILL", "-g", str(group.pid)], check=False)


def test_a_killed_front_end_leaves_no_stopped_compile():
    """The front end stops the group, then dies by SIGKILL: the kernel's PR_SET_PDEATHSIG SIGCONT reaches the
    leader, whose handler continues the rest of its group."""
    front = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal, subprocess, sys, time
        from omni_platform.compile_yield import continue_when_parent_dies
        g = subprocess.Popen([sys.executable, "-c", {_GROUP!r}], stdout=subprocess.PIPE, text=True,
                             start_new_session=True, preexec_fn=continue_when_parent_dies)
        print(g.pid, g.stdout.readline().strip(), flush=True)
        time.sleep(0.5)
        os.killpg(g.pid, signal.SIGSTOP)
        print("stopped", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    members = [int(x) for x in front.stdout.readline().split()]
    try:
        assert front.stdout.readline().strip() == "stopped"
        assert _wait_for(lambda: _states(members) == {psutil.STATUS_STOPPED}, 5)
        front.kill()
        front.wait()
        assert _wait_for(lambda: psutil.STATUS_STOPPED not in _states(members), 10), _states(members)
    finally:
        front.kill()
        for pid in members:
            try:
                psutil.Process(pid).kill()
            except psutil.NoSuchProcess:
                pass


def test_an_adopted_compile_is_not_left_stopped_when_its_adopter_dies():
    """A second server adopts a compile another front end started (its PR_SET_PDEATHSIG names that one): the
    adopter's guardian continues the group when the adopter dies by SIGKILL."""
    group = subprocess.Popen([sys.executable, "-c", _GROUP], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)  # no parent-death signal toward the adopter
    members = _group_members(group)
    front = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import os, signal, time
        from omni_platform.compile_yield import start_guardian
        start_guardian({group.pid})
        time.sleep(0.5)
        os.killpg({group.pid}, signal.SIGSTOP)
        print("stopped", flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert front.stdout.readline().strip() == "stopped"
        assert _wait_for(lambda: _states(members) == {psutil.STATUS_STOPPED}, 5)
        time.sleep(1.5)
        assert _states(members) == {psutil.STATUS_STOPPED}, "the guardian leaves the group alone while its parent lives"
        front.kill()
        front.wait()
        assert _wait_for(lambda: psutil.STATUS_STOPPED not in _states(members), 10), _states(members)
    finally:
        front.kill()
        group.kill()
        subprocess.run(["pkill", "-KILL", "-g", str(group.pid)], check=False)
