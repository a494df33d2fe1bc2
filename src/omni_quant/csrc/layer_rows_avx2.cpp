// Row kernels of the fused decoder-layer ops (fused_layer_ops.cpp, declared in w4a8.h) for AVX2 CPUs: RMSNorm
// (with the residual add) and SiLU-and-mul on bf16 rows, 8 lanes. Compiled for AVX2 (pragma below), as
// gemm_avx2.cpp.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "w4a8.h"

namespace omni_w4a8 {

#include "avx2_common.inc"

// ---- Row kernels of the fused decoder-layer ops (w4a8.h): 8 lanes ----------------------------------

namespace {

// bf16 bits of 8 floats into p: f32x8_to_bf16 (round to nearest even), a NaN lane a quiet NaN.
inline void store_bf16x8(uint16_t* p, __m256 v) {
  const __m256i q = _mm256_or_si256(_mm256_srli_epi32(_mm256_castps_si256(v), 16), _mm256_set1_epi32(0x40));
  const __m128i quiet = _mm_packus_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
  const __m256i m = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  const __m128i nan16 = _mm_packs_epi32(_mm256_castsi256_si128(m), _mm256_extracti128_si256(m, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm_blendv_epi8(f32x8_to_bf16(v), quiet, nan16));
}

inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// exp_cephes of gemm_scalar.cpp, lane by lane.
inline __m256 exp_cephes_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.33654f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_floor_ps(_mm256_add_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _mm256_set1_ps(0.5f)));
  __m256 r = _mm256_sub_ps(x, _mm256_mul_ps(n, _mm256_set1_ps(0.693359375f)));
  r = _mm256_add_ps(r, _mm256_mul_ps(n, _mm256_set1_ps(2.12194440e-4f)));
  __m256 y = _mm256_set1_ps(1.9875691500e-4f);
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(1.3981999507e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(8.3334519073e-3f));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(4.1665795894e-2f));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(1.6666665459e-1f));
  y = _mm256_add_ps(_mm256_mul_ps(y, r), _mm256_set1_ps(5.0000001201e-1f));
  y = _mm256_add_ps(_mm256_add_ps(_mm256_mul_ps(y, _mm256_mul_ps(r, r)), r), _mm256_set1_ps(1.0f));
  return _mm256_mul_ps(y, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23)));
}

}  // namespace

void add_rms_row_avx2(const uint16_t* x, const uint16_t* r, const uint16_t* w, float eps, int64_t n,
                      uint16_t* res_out, uint16_t* out) {
  if (n % 8) return add_rms_row_scalar(x, r, w, eps, n, res_out, out);
  __m256 acc = _mm256_set1_ps(0.f);
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 s = r ? _mm256_add_ps(bf16x8_to_f32(x + i), bf16x8_to_f32(r + i)) : bf16x8_to_f32(x + i);
    acc = _mm256_add_ps(acc, _mm256_mul_ps(s, s));
  }
  const __m256 inv = _mm256_set1_ps(1.0f / __builtin_sqrtf(hsum8(acc) / static_cast<float>(n) + eps));
  for (int64_t i = 0; i < n; i += 8) {
    const __m256 s = r ? _mm256_add_ps(bf16x8_to_f32(x + i), bf16x8_to_f32(r + i)) : bf16x8_to_f32(x + i);
    if (r) {
      store_bf16x8(res_out + i, s);
    } else {
      __builtin_memcpy(res_out + i, x + i, 8 * sizeof(uint16_t));
    }
    uint16_t normed[8];
    store_bf16x8(normed, _mm256_mul_ps(s, inv));
    store_bf16x8(out + i, _mm256_mul_ps(bf16x8_to_f32(normed), bf16x8_to_f32(w + i)));
  }
}

void silu_mul_row_avx2(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 a = bf16x8_to_f32(g + i);
    const __m256 e = exp_cephes_avx2(_mm256_sub_ps(_mm256_set1_ps(0.f), a));
    store_bf16x8(out + i, _mm256_mul_ps(_mm256_div_ps(a, _mm256_add_ps(e, _mm256_set1_ps(1.0f))), bf16x8_to_f32(u + i)));
  }
  silu_mul_row_scalar(g + i, u + i, n - i, out + i);
}

}  // namespace omni_w4a8
