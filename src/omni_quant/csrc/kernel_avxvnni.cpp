// W4A8 GEMM for AVX2 CPUs with AVX-VNNI (Alder Lake and later): 256-bit vpdpbusd.
#pragma GCC target("avx2,fma,avxvnni")
#include <immintrin.h>

#include "w4a8.h"

namespace omni_w4a8 {

#define GEMM_FN gemm_avx2vnni
#define DOT4 _mm256_dpbusd_avx_epi32
#include "kernel_avx2.inc"
#undef DOT4
#undef GEMM_FN

}  // namespace omni_w4a8
