"""The CI gates: omni-quant's setup.py requires the W4A8 kernel when told to (CI), and under CI a skip
that tests/skips.py does not declare, an undeclared xfail, and a test phase that collects nothing fail the suite."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import skips
from conftest import REPO

TESTS = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def setup_py():
    """src/omni_quant/setup.py as a module (its setup() call runs only as __main__)."""
    spec = importlib.util.spec_from_file_location("omni_quant_setup_under_test", REPO / "src/omni_quant/setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


COMPILER_OUTPUT = (
    "[1/5] c++ -MMD -c /repo/src/omni_quant/csrc/gemm_scalar.cpp -o gemm_scalar.o -O3\n"
    "FAILED: gemm_scalar.o\n"
    "/repo/src/omni_quant/csrc/gemm_scalar.cpp:12:1: error: expected ';' before '}' token\n"
    "   12 | }\n"
    "ninja: build stopped: subcommand failed.\n")


class FailingBuild:
    """A build_ext whose compiler fails as torch's ninja build does: the compiler's output on file
    descriptor 1, an exception that does not contain it."""

    def build_extension(self, ext):
        os.write(1, COMPILER_OUTPUT.encode())
        raise RuntimeError("Error compiling objects for extension")


class PassingBuild:
    def build_extension(self, ext):
        os.write(1, b"[5/5] c++ -shared ... -o _w4a8.so\n")


@pytest.mark.parametrize("value, required", [(None, False), ("", False), ("0", False), ("false", False),
                                             ("FALSE", False), ("1", True), ("true", True)])
def test_the_require_switch(setup_py, value, required):
    env = {} if value is None else {setup_py.REQUIRE_ENV: value}
    assert setup_py.kernel_required(env) is required
    assert skips.ci_enabled({} if value is None else {"CI": value}) is required  # CI reads the same way


def test_a_required_kernel_that_fails_to_build_fails_the_install_naming_the_compiler_error(
        setup_py, monkeypatch, capfd):
    monkeypatch.setenv(setup_py.REQUIRE_ENV, "1")
    with pytest.raises(setup_py.KernelBuildError) as failed:
        setup_py.kernel_build_ext(FailingBuild)().build_extension(None)
    message = str(failed.value)
    assert "Error compiling objects for extension" in message and "OMNI_QUANT_REQUIRE_KERNEL=1" in message
    assert "gemm_scalar.cpp:12:1: error: expected ';' before '}' token" in message
    assert "FAILED: gemm_scalar.o" in message
    assert "FAILED: gemm_scalar.o" in capfd.readouterr().out  # the build's own output is passed on


def test_outside_ci_the_failed_build_falls_back_with_its_log_line(setup_py, monkeypatch, capfd):
    monkeypatch.delenv(setup_py.REQUIRE_ENV, raising=False)
    setup_py.kernel_build_ext(FailingBuild)().build_extension(None)  # no exception: the install goes on
    err = capfd.readouterr().err
    assert "building the W4A8 kernel failed (RuntimeError: Error compiling objects for extension)" in err
    assert "installing without it" in err and "error: expected ';' before '}' token" in err


@pytest.mark.parametrize("required", ["0", "1"])
def test_a_kernel_that_builds_passes_in_both_modes(setup_py, monkeypatch, capfd, required):
    monkeypatch.setenv(setup_py.REQUIRE_ENV, required)
    setup_py.kernel_build_ext(PassingBuild)().build_extension(None)
    assert "_w4a8.so" in capfd.readouterr().out


def test_required_without_torch_or_with_the_kernel_switched_off_fails(setup_py, monkeypatch):
    monkeypatch.setenv(setup_py.REQUIRE_ENV, "1")
    monkeypatch.setitem(sys.modules, "torch.utils.cpp_extension", None)  # import fails
    with pytest.raises(setup_py.KernelBuildError, match="torch is not importable at build time"):
        setup_py.kernel_build()
    monkeypatch.setenv("OMNI_QUANT_NO_KERNEL", "1")
    with pytest.raises(setup_py.KernelBuildError, match="contradict"):
        setup_py.kernel_build()
    monkeypatch.setenv(setup_py.REQUIRE_ENV, "0")
    assert setup_py.kernel_build() == ([], {})


def test_the_first_error_lines_of_a_build_log(setup_py):
    assert setup_py.compiler_error_lines(COMPILER_OUTPUT) == [
        "FAILED: gemm_scalar.o",
        "/repo/src/omni_quant/csrc/gemm_scalar.cpp:12:1: error: expected ';' before '}' token"]
    assert setup_py.compiler_error_lines("a\nb\nc\n", limit=2) == ["b", "c"]  # no error line: the tail


INNER_TESTS = '''
import pytest

import skips

HOLDS = skips.declare("test-only-holds", "a machine condition that holds", lambda: True)
ABSENT = skips.declare("test-only-absent", "a machine condition that does not hold", lambda: False)


@HOLDS.mark()
def test_declared_mark():
    pass


def test_declared_call():
    HOLDS.skip_if_holds()


def test_undeclared_call():
    pytest.skip("omni W4A8 kernel not built: no compiler")


@pytest.mark.skipif(True, reason="this CPU is too slow")
def test_undeclared_mark():
    pass


def test_declared_name_but_does_not_hold():
    pytest.skip(ABSENT.reason)


def test_declared_name_other_words():
    pytest.skip("test-only-holds: something else")


@pytest.fixture
def skipping_fixture():
    pytest.skip("fixture says no")


def test_undeclared_in_a_fixture(skipping_fixture):
    pass


@pytest.mark.xfail(reason="known bug", strict=True)
def test_undeclared_xfail():
    assert False


@pytest.mark.xfail(HOLDS.holds(), reason=HOLDS.reason, strict=True)
def test_declared_xfail():
    assert False


def test_passes():
    pass
'''


def _inner_pytest(tmp_path, ci: str | None) -> subprocess.CompletedProcess:
    """A pytest run of INNER_TESTS (and a module that importorskips at collection) with the suite's
    skip policy plugin (tests/skips.py) and ``CI`` as given."""
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(textwrap.dedent(INNER_TESTS))
    (tmp_path / "test_inner_collect.py").write_text('import pytest\n\npytest.importorskip("omni_no_such_module")\n')
    env = {k: v for k, v in os.environ.items() if k != "CI"}
    if ci is not None:
        env["CI"] = ci
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "skips", "-p", "no:cacheprovider", "-rA", "-q",
                           "--continue-on-collection-errors", "--rootdir", str(tmp_path),
                           "-c", str(tmp_path / "pytest.ini"), str(tmp_path)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)


def _outcomes(out: str) -> dict[str, str]:
    """nodeid -> PASSED / FAILED / ERROR / XFAIL, from pytest's -rA summary (SKIPPED lines name no test)."""
    result = {}
    for line in out.splitlines():
        word, _, rest = line.partition(" ")
        if word in ("PASSED", "FAILED", "ERROR", "XFAIL"):
            result[rest.split(" - ")[0].strip()] = word
    return result


def test_under_ci_an_undeclared_skip_fails_naming_the_test_and_the_reason(tmp_path):
    proc = _inner_pytest(tmp_path, "true")
    out = proc.stdout
    assert proc.returncode == 1, out
    for name, reason in (("test_undeclared_call", "omni W4A8 kernel not built: no compiler"),
                         ("test_undeclared_mark", "this CPU is too slow"),
                         ("test_undeclared_in_a_fixture", "fixture says no"),
                         ("test_declared_name_other_words", "test-only-holds: something else")):
        assert f"CI forbids this skip: test_inner.py::{name} skipped ({reason})" in out, out
    assert "test-only-absent does not hold on this machine" in out
    assert "CI forbids this skip: collecting test_inner_collect.py skipped (could not import " in out
    assert ("CI forbids this expected failure (xfail): test_inner.py::test_undeclared_xfail xfailed (known bug): "
            "not one of the machine conditions declared in tests/skips.py") in out, out
    assert _outcomes(out) == {
        "test_inner.py::test_passes": "PASSED",
        "test_inner.py::test_declared_xfail": "XFAIL",
        "test_inner.py::test_undeclared_xfail": "FAILED",
        "test_inner.py::test_undeclared_call": "FAILED",
        "test_inner.py::test_declared_name_but_does_not_hold": "FAILED",
        "test_inner.py::test_declared_name_other_words": "FAILED",
        "test_inner.py::test_undeclared_mark": "ERROR",  # skips in setup (marks, fixtures) fail as errors
        "test_inner.py::test_undeclared_in_a_fixture": "ERROR",
        "test_inner_collect.py": "ERROR",
    }, out
    assert "4 failed, 1 passed, 2 skipped, 1 xfailed, 3 errors" in out, out  # the declared two stay skips


@pytest.mark.parametrize("ci", [None, "0", "false"])
def test_outside_ci_every_skip_stays_a_skip(tmp_path, ci):
    proc = _inner_pytest(tmp_path, ci)
    assert proc.returncode == 0, proc.stdout
    assert "CI forbids" not in proc.stdout
    assert "1 passed, 8 skipped, 2 xfailed" in proc.stdout, proc.stdout


def test_every_declared_condition_is_named_and_decidable():
    """Declared conditions: unique names, a reason each, a predicate that answers on this machine."""
    declared = skips.DECLARED
    assert len(declared) >= 6
    for name, cond in declared.items():
        assert cond.name == name and cond.reason.startswith(f"{name}: ") and cond.why
        assert isinstance(cond.holds(), bool), name
        assert skips.skip_problem(cond.reason) == (None if cond.holds() else
                                                   f"the declared condition {name} does not hold on this machine")
    assert skips.skip_problem("omni W4A8 kernel not built: x") is not None


@pytest.mark.parametrize(("ci", "exit_code", "fails"), [("1", 5, True), ("", 5, False), ("1", 0, False),
                                                         ("", 1, True)])
def test_a_phase_that_collects_nothing_fails_only_under_ci(tmp_path, ci, exit_code, fails):
    """The Makefile's PYTEST_PHASE with a stand-in interpreter exiting ``exit_code`` (5: pytest collected nothing)."""
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexit {exit_code}\n")
    fake.chmod(0o755)
    probe = tmp_path / "probe.mk"
    probe.write_text("probe-phase:\n\t@ok=0; $(call PYTEST_PHASE,not engine,); exit $$ok\n")
    proc = subprocess.run(["make", "-s", "-f", str(REPO / "Makefile"), "-f", str(probe), "probe-phase",
                           f"PY={fake}", f"CI={ci}"], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (proc.returncode != 0) is fails, proc.stdout + proc.stderr
    assert ("pytest phase 'not engine' exited" in proc.stdout) is fails
