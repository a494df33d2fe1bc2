// W4A8 GEMM for AVX2 CPUs with AVX-VNNI (Alder Lake and later): 256-bit vpdpbusd gives int32
// sums of 4 products directly (gemm_avx2.cpp is the maddubs kernel for AVX2 without VNNI).
// A 64-byte chunk of a block is two 256-bit halves: lanes 0-7 and 8-15.
#pragma GCC target("avx2,fma,avxvnni")
#include <immintrin.h>

#include "w4a8.h"

namespace omni_w4a8 {

#include "avx2_common.inc"

namespace {

template <int MR>
void block_rows(const Args& a, int64_t b, int64_t r0) {
  const int64_t k = a.k, g = a.group_size, groups = k / g, chunks = g / 8;
  const uint8_t* wb = a.w + b * (k / 8) * 64;
  const uint16_t* szb = a.sz + b * groups * 32;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 facc[MR][2];
  for (int r = 0; r < MR; ++r) facc[r][0] = facc[r][1] = _mm256_setzero_ps();
  for (int64_t j = 0; j < groups; ++j) {
    // Low and high nibbles in separate accumulators: two independent chains per half.
    __m256i acc[MR][4];
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = acc[r][2] = acc[r][3] = _mm256_setzero_si256();
    const uint8_t* wj = wb + j * chunks * 64;
    const int8_t* xj = a.xq + r0 * k + j * g;
    for (int64_t c = 0; c < chunks; ++c) {
      _mm_prefetch(reinterpret_cast<const char*>(wj + c * 64 + 2048), _MM_HINT_T0);  // as gemm_avx512.cpp
      __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj + c * 64));
      __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj + c * 64 + 32));
      __m256i lo0 = _mm256_and_si256(v0, low4), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low4);
      __m256i lo1 = _mm256_and_si256(v1, low4), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low4);
      for (int r = 0; r < MR; ++r) {
        const int8_t* xr = xj + r * k + c * 8;
        __m256i xa = _mm256_set1_epi32(load4(xr)), xb = _mm256_set1_epi32(load4(xr + 4));
        acc[r][0] = _mm256_dpbusd_avx_epi32(acc[r][0], lo0, xa);
        acc[r][2] = _mm256_dpbusd_avx_epi32(acc[r][2], hi0, xb);
        acc[r][1] = _mm256_dpbusd_avx_epi32(acc[r][1], lo1, xa);
        acc[r][3] = _mm256_dpbusd_avx_epi32(acc[r][3], hi1, xb);
      }
    }
    const uint16_t* szj = szb + j * 32;
    __m256 s0 = bf16x8_to_f32(szj), s1 = bf16x8_to_f32(szj + 8);
    __m256 z0 = bf16x8_to_f32(szj + 16), z1 = bf16x8_to_f32(szj + 24);
    for (int r = 0; r < MR; ++r) {
      const int64_t rg = (r0 + r) * groups + j;
      __m256i corr = _mm256_set1_epi32(8 * a.xsum[rg]);
      __m256 xs = _mm256_set1_ps(a.xs[rg]), xf = _mm256_set1_ps(a.xf[rg]);
      __m256 t0 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_add_epi32(acc[r][0], acc[r][2]), corr));
      __m256 t1 = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_add_epi32(acc[r][1], acc[r][3]), corr));
      facc[r][0] = _mm256_fmadd_ps(z0, xf, _mm256_fmadd_ps(t0, _mm256_mul_ps(s0, xs), facc[r][0]));
      facc[r][1] = _mm256_fmadd_ps(z1, xf, _mm256_fmadd_ps(t1, _mm256_mul_ps(s1, xs), facc[r][1]));
    }
  }
  const int64_t n0 = b * kBlockN;
  __m256 bias0 = a.bias ? _mm256_loadu_ps(a.bias + n0) : _mm256_setzero_ps();
  __m256 bias1 = a.bias ? _mm256_loadu_ps(a.bias + n0 + 8) : _mm256_setzero_ps();
  for (int r = 0; r < MR; ++r) {
    __m256 y0 = _mm256_add_ps(facc[r][0], bias0), y1 = _mm256_add_ps(facc[r][1], bias1);
    store16(a, (r0 + r) * a.n + n0, y0, y1);
  }
}

}  // namespace

void gemm_avx2vnni(const Args& a, int64_t b0, int64_t b1) {
  for (int64_t b = b0; b < b1; ++b) {
    int64_t r = 0;
    for (; r + 2 <= a.m; r += 2) block_rows<2>(a, b, r);
    if (r < a.m) block_rows<1>(a, b, r);
  }
}

}  // namespace omni_w4a8
