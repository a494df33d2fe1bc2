"""Start-up probes kept across processes: ``_patch_inductor_isa_probe_cache`` and ``_patch_inductor_triton_key_cache``.

The replacements are built from their patches' ``make`` around stand-ins for torch's and Triton's functions (to
count calls) and around Triton's real ``triton_key``; the real engine's warm start running no ISA probe is in
``tests/test_patches_engine.py::test_aot_compile_cache_second_start_loads_instead_of_recompiling``."""

from __future__ import annotations

import os

import pytest

from omni_patches.patches import isa_probe_cache, probe_store, triton_key_cache


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    return tmp_path / "cache" / probe_store.DIRNAME


def _counting(result):
    calls = []

    def check_build(self, code):
        calls.append(str(self))
        return result

    return check_build, calls


def test_an_isa_check_that_passed_is_read_back_and_a_failure_is_checked_again(store, monkeypatch):
    from torch._inductor.cpu_vec_isa import VecAVX2, VecAVX512

    passing, calls = _counting(True)
    (check,) = isa_probe_cache.PATCH.make(passing)
    assert check(VecAVX2(), "int main() {}") and calls == ["avx2"]
    assert check(VecAVX2(), "int main() {}") and calls == ["avx2"], "read back, not checked again"
    assert check(VecAVX2(), "int f() {}") and calls == ["avx2", "avx2"], "other code: another key"
    assert check(VecAVX512(), "int main() {}") and calls[-1] == "avx512"
    monkeypatch.setattr(isa_probe_cache, "cpu_flags", lambda: "fpu avx2")  # another CPU
    assert check(VecAVX2(), "int main() {}") and len(calls) == 4
    assert len([n for n in os.listdir(store) if n.startswith("isa-")]) == 4, "one entry per key"

    failing, failed = _counting(False)
    (check,) = isa_probe_cache.PATCH.make(failing)
    monkeypatch.setattr(isa_probe_cache, "cpu_flags", lambda: "fpu")
    assert not check(VecAVX2(), "int main() {}") and not check(VecAVX2(), "int main() {}")
    assert failed == ["avx2", "avx2"], "a failure (perhaps a probe that timed out) is not stored"


def test_the_isa_key_names_the_machine_and_the_toolchain():
    from torch._inductor.cpu_vec_isa import VecAVX2

    flags = isa_probe_cache.cpu_flags()
    assert "avx2" in flags.split(), "this machine's /proc/cpuinfo flags line"
    key = isa_probe_cache.probe_key(VecAVX2(), "int main() {}")
    assert len(key) == 64 and key == isa_probe_cache.probe_key(VecAVX2(), "int main() {}")


def test_an_unwritable_store_checks_every_time(tmp_path, monkeypatch):
    from torch._inductor.cpu_vec_isa import VecAVX2

    (tmp_path / "cache").write_text("a file where the cache root's directory should be")
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "cache"))
    passing, calls = _counting(True)
    (check,) = isa_probe_cache.PATCH.make(passing)
    assert check(VecAVX2(), "int main() {}") and check(VecAVX2(), "int main() {}")
    assert calls == ["avx2", "avx2"]


def test_the_triton_key_is_triton_s_own_and_read_back(store):
    from triton.runtime.cache import triton_key as real

    (first,) = triton_key_cache.PATCH.make(real)
    value = first()
    assert value == real() and value.startswith(__import__("triton").__version__)
    assert [p.name.split("-")[0] for p in store.iterdir()] == ["triton_key"]

    def must_not_run():
        raise AssertionError("computed again although stored")

    (later,) = triton_key_cache.PATCH.make(must_not_run)  # a later process: reads the stored value
    assert later() == value

    (stored,) = store.iterdir()
    stored.write_text("garbage")  # not Triton's form: computed again and replaced
    (again,) = triton_key_cache.PATCH.make(real)
    assert again() == value and stored.read_text() == value


def test_a_changed_triton_file_changes_the_key(tmp_path):
    pkg = tmp_path / "triton"
    (pkg / "compiler").mkdir(parents=True)
    (pkg / "compiler" / "code.py").write_text("x = 1\n")
    (pkg / "__pycache__").mkdir()
    before = triton_key_cache.install_stamp(str(pkg), "3.6.0")
    (pkg / "__pycache__" / "code.cpython-311.pyc").write_bytes(b"\0")
    assert triton_key_cache.install_stamp(str(pkg), "3.6.0") == before, "Python's bytecode is not Triton's"
    assert triton_key_cache.install_stamp(str(pkg), "3.6.1") != before
    st = os.stat(pkg / "compiler" / "code.py")
    os.utime(pkg / "compiler" / "code.py", ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert triton_key_cache.install_stamp(str(pkg), "3.6.0") != before
    with pytest.raises(OSError):
        triton_key_cache.install_stamp(str(tmp_path / "missing"), "3.6.0")


def test_a_fifo_or_a_device_at_a_store_path_is_a_miss_not_a_hang(store):
    store.mkdir(parents=True)
    os.mkfifo(store / "isa-fifo")
    (store / "isa-zero").symlink_to("/dev/zero")
    (store / "isa-big").write_bytes(b"o" * (probe_store.MAX_BYTES + 1))
    (store / "isa-ok").write_text("ok")
    assert [probe_store.load("isa", k) for k in ("fifo", "zero", "big", "missing", "ok")] == [None] * 4 + ["ok"]
