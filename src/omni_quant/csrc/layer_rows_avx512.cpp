// Row kernels of the fused decoder-layer ops (fused_layer_ops.cpp, declared in w4a8.h) for CPUs with AVX-512:
// RMSNorm (with the residual add) and SiLU-and-mul on bf16 rows, 16 lanes. Only <immintrin.h> and w4a8.h here:
// this file is compiled for AVX-512 (pragma below), as gemm_avx512.cpp.
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma")
#include <immintrin.h>

#include "w4a8.h"

namespace omni_w4a8 {

#include "avx512_common.inc"

// ---- Row kernels of the fused decoder-layer ops (w4a8.h): 16 lanes ----------------------------------

namespace {

// bf16 bits of 16 floats into p: f32x16_to_bf16 (round to nearest even), a NaN lane a quiet NaN.
inline void store_bf16x16(uint16_t* p, __m512 v) {
  const __m256i quiet = _mm512_cvtepi32_epi16(
      _mm512_or_si512(_mm512_srli_epi32(_mm512_castps_si512(v), 16), _mm512_set1_epi32(0x40)));
  const __m256i bf = _mm256_mask_blend_epi16(static_cast<__mmask16>(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q)),
                                             f32x16_to_bf16(v), quiet);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf);
}

inline __m512 floor16(__m512 v) { return _mm512_roundscale_ps(v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }

// exp_cephes of gemm_scalar.cpp, lane by lane.
inline __m512 exp_cephes_avx512(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.33654f)), _mm512_set1_ps(88.0f));
  const __m512 n = floor16(_mm512_add_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _mm512_set1_ps(0.5f)));
  __m512 r = _mm512_sub_ps(x, _mm512_mul_ps(n, _mm512_set1_ps(0.693359375f)));
  r = _mm512_add_ps(r, _mm512_mul_ps(n, _mm512_set1_ps(2.12194440e-4f)));
  __m512 y = _mm512_set1_ps(1.9875691500e-4f);
  y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(1.3981999507e-3f));
  y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(8.3334519073e-3f));
  y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(4.1665795894e-2f));
  y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(1.6666665459e-1f));
  y = _mm512_add_ps(_mm512_mul_ps(y, r), _mm512_set1_ps(5.0000001201e-1f));
  y = _mm512_add_ps(_mm512_add_ps(_mm512_mul_ps(y, _mm512_mul_ps(r, r)), r), _mm512_set1_ps(1.0f));
  return _mm512_mul_ps(y, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23)));
}

}  // namespace

void add_rms_row_avx512(const uint16_t* x, const uint16_t* r, const uint16_t* w, float eps, int64_t n,
                      uint16_t* res_out, uint16_t* out) {
  if (n % 16) return add_rms_row_scalar(x, r, w, eps, n, res_out, out);
  __m512 acc = _mm512_set1_ps(0.f);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 s = r ? _mm512_add_ps(bf16x16_to_f32(x + i), bf16x16_to_f32(r + i)) : bf16x16_to_f32(x + i);
    acc = _mm512_add_ps(acc, _mm512_mul_ps(s, s));
  }
  const __m512 inv = _mm512_set1_ps(1.0f / __builtin_sqrtf(_mm512_reduce_add_ps(acc) / static_cast<float>(n) + eps));
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 s = r ? _mm512_add_ps(bf16x16_to_f32(x + i), bf16x16_to_f32(r + i)) : bf16x16_to_f32(x + i);
    if (r) {
      store_bf16x16(res_out + i, s);
    } else {
      __builtin_memcpy(res_out + i, x + i, 16 * sizeof(uint16_t));
    }
    uint16_t normed[16];
    store_bf16x16(normed, _mm512_mul_ps(s, inv));
    store_bf16x16(out + i, _mm512_mul_ps(bf16x16_to_f32(normed), bf16x16_to_f32(w + i)));
  }
}

void silu_mul_row_avx512(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = bf16x16_to_f32(g + i);
    const __m512 e = exp_cephes_avx512(_mm512_sub_ps(_mm512_set1_ps(0.f), a));
    store_bf16x16(out + i, _mm512_mul_ps(_mm512_div_ps(a, _mm512_add_ps(e, _mm512_set1_ps(1.0f))), bf16x16_to_f32(u + i)));
  }
  silu_mul_row_scalar(g + i, u + i, n - i, out + i);
}

}  // namespace omni_w4a8
