// W4A8 GEMM for AVX2 CPUs without VNNI: vpmaddubsw (u8 x s8 -> int16 pairs, at most
// 2 * 15 * 127, no saturation) then vpmaddwd by ones (-> int32 sums of 4).
#pragma GCC target("avx2,fma")
#include <immintrin.h>

#include "w4a8.h"

namespace omni_w4a8 {

static inline __m256i dot4_avx2(__m256i acc, __m256i u8, __m256i s8) {
  __m256i pairs = _mm256_maddubs_epi16(u8, s8);
  return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
}

#define GEMM_FN gemm_avx2
#define DOT4 dot4_avx2
#include "kernel_avx2.inc"
#undef DOT4
#undef GEMM_FN

#define QUANT_FN quantize_rows_avx2
#include "quant_rows.inc"
#undef QUANT_FN

#define DEQUANT_FN dequantize_avx2
#include "dequant_rows.inc"
#undef DEQUANT_FN

}  // namespace omni_w4a8
