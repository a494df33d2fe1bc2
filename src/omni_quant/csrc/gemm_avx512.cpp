// W4A8 GEMM for CPUs with AVX-512 F/BW/VNNI: vpdpbusd multiplies 4 unsigned 4-bit codes by
// 4 signed int8 activations per 32-bit lane; 16 output channels per vector.
// Only <immintrin.h> and w4a8.h here: this file is compiled for AVX-512 (pragma below).
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512vnni,fma")
#include <immintrin.h>

#include "w4a8.h"

namespace omni_w4a8 {

#include "avx512_common.inc"

namespace {

// Software prefetch distance in the weight stream (bytes ahead of the loads): decode reads the
// weights once from DRAM; measured with python -m harness.kernel_bench (M = 1).
#ifndef OMNI_W4A8_PREFETCH
#define OMNI_W4A8_PREFETCH 2048
#endif
constexpr int64_t kPrefetchBytes = OMNI_W4A8_PREFETCH;

inline int32_t load4(const int8_t* p) {
  int32_t v;
  __builtin_memcpy(&v, p, 4);
  return v;
}

// MR rows of one block; NA int32 accumulators per row. Decode (MR <= 3) keeps four independent
// chains per row: vpdpbusd has a latency of about 5 cycles, one chain per row would bound M = 1 by
// latency, not by memory. At prefill (MR >= 4) there are enough chains across the rows, and two
// per row leave fewer adds for the per-group epilogue, which at group size 32 is a third of the
// work. Each group's first accumulator starts at -8 * xsum (the codes' offset of 8, w = (q - 8) * s
// + z), so no subtraction is left for the epilogue either; the integers are the same, so is y.
// `prefetch`: software prefetch of the weight stream, for calls that read the weights from memory
// once (few rows); at prefill each block's weights are reread from cache by every row tile.
template <int MR, int NA>
void block_rows(const Args& a, int64_t b, int64_t r0, bool prefetch) {
  static_assert(NA == 2 || NA == 4, "two or four accumulators per row");
  const int64_t k = a.k, g = a.group_size, groups = k / g, chunks = g / 8;
  const uint8_t* wb = a.w + b * (k / 8) * 64;
  const uint16_t* szb = a.sz + b * groups * 32;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 facc[MR];
  for (int r = 0; r < MR; ++r) facc[r] = _mm512_setzero_ps();
  for (int64_t j = 0; j < groups; ++j) {
    __m512i acc[MR][NA];
    for (int r = 0; r < MR; ++r) {
      acc[r][0] = _mm512_set1_epi32(-8 * a.xsum[(r0 + r) * groups + j]);
      for (int i = 1; i < NA; ++i) acc[r][i] = _mm512_setzero_si512();
    }
    const uint8_t* wj = wb + j * chunks * 64;
    const int8_t* xj = a.xq + r0 * k + j * g;
    for (int64_t c = 0; c < chunks; c += 2) {  // chunks = group_size / 8 is even (group_size % 16 == 0)
      if (prefetch) {
        _mm_prefetch(reinterpret_cast<const char*>(wj + c * 64 + kPrefetchBytes), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(wj + c * 64 + kPrefetchBytes + 64), _MM_HINT_T0);
      }
      __m512i v0 = _mm512_loadu_si512(wj + c * 64);
      __m512i v1 = _mm512_loadu_si512(wj + c * 64 + 64);
      __m512i lo0 = _mm512_and_si512(v0, low4), hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low4);
      __m512i lo1 = _mm512_and_si512(v1, low4), hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low4);
      for (int r = 0; r < MR; ++r) {
        const int8_t* xr = xj + r * k + c * 8;
        acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], lo0, _mm512_set1_epi32(load4(xr)));
        acc[r][1] = _mm512_dpbusd_epi32(acc[r][1], hi0, _mm512_set1_epi32(load4(xr + 4)));
        acc[r][NA - 2] = _mm512_dpbusd_epi32(acc[r][NA - 2], lo1, _mm512_set1_epi32(load4(xr + 8)));
        acc[r][NA - 1] = _mm512_dpbusd_epi32(acc[r][NA - 1], hi1, _mm512_set1_epi32(load4(xr + 12)));
      }
    }
    __m512 s = bf16x16_to_f32(szb + j * 32);
    __m512 z = bf16x16_to_f32(szb + j * 32 + 16);
    for (int r = 0; r < MR; ++r) {
      const int64_t rg = (r0 + r) * groups + j;
      __m512i sum = _mm512_add_epi32(acc[r][0], acc[r][1]);
      if constexpr (NA == 4) sum = _mm512_add_epi32(sum, _mm512_add_epi32(acc[r][2], acc[r][3]));
      facc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(sum), _mm512_mul_ps(s, _mm512_set1_ps(a.xs[rg])), facc[r]);
      facc[r] = _mm512_fmadd_ps(z, _mm512_set1_ps(a.xf[rg]), facc[r]);
    }
  }
  const int64_t n0 = b * kBlockN;
  __m512 bias = a.bias ? _mm512_loadu_ps(a.bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < MR; ++r) {
    __m512 y = _mm512_add_ps(facc[r], bias);
    const int64_t off = (r0 + r) * a.n + n0;
    if (a.out_bf16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(a.out) + off), f32x16_to_bf16(y));
    } else {
      _mm512_storeu_ps(static_cast<float*>(a.out) + off, y);
    }
  }
}

// Rows in tiles of kRowTile per pass over the thread's blocks (as gemm_avx2.cpp: the tile's int8
// activations stay in L2 while the blocks stream), 8 rows at a time inside a tile (each unpacked
// weight vector feeds 8 rows), then 4, then the rest.
constexpr int64_t kRowTile = 64;
constexpr int64_t kPrefetchMaxRows = 16;  // as harness/kernel_bench.py's MEMORY_BOUND_ROWS

}  // namespace

void gemm_avx512vnni(const Args& a, int64_t b0, int64_t b1) {
  const bool prefetch = a.m <= kPrefetchMaxRows;
  for (int64_t t0 = 0; t0 < a.m; t0 += kRowTile) {
    const int64_t t1 = t0 + kRowTile < a.m ? t0 + kRowTile : a.m;
    for (int64_t b = b0; b < b1; ++b) {
      int64_t r = t0;
      for (; r + 8 <= t1; r += 8) block_rows<8, 2>(a, b, r, prefetch);
      for (; r + 4 <= t1; r += 4) block_rows<4, 2>(a, b, r, prefetch);
      switch (t1 - r) {
        case 3: block_rows<3, 4>(a, b, r, prefetch); break;
        case 2: block_rows<2, 4>(a, b, r, prefetch); break;
        case 1: block_rows<1, 4>(a, b, r, prefetch); break;
        default: break;
      }
    }
  }
}

// ---- Super-block layout (w4a8.h, SbArgs) ---------------------------------------------------------
//
// The AVX2 kernel's algebra (gemm_avx2.cpp) with vpdpbusd: the int32 sum of each sub-block of 32
// input channels (4 chunks) is multiplied by the sub-block's 6-bit scale (vpmulld) and added over
// the 8 sub-blocks (at most 8 * 63 * 32 * 15 * 127 < 2^31), so float work happens once per 256
// input channels: y += xs * (d * sum_j sc_j isum_j - dmin * sum_j m_j bsum_j). The integers are
// the AVX2 kernel's and so is the float order: both give the same bits.
// No software prefetch here, unlike block_rows: on an AVX-512 VNNI EPYC (Zen 4), decoding
// Qwen2.5-Coder-1.5B (all super-blocks) in one process, alternating with and without the
// prefetch per request, the run without it was faster in most pairs; the hardware prefetchers
// follow the one weight stream per thread on their own.
namespace {

template <int MR, int NA>
void sb_block_rows(const SbArgs& a, int64_t b, int64_t r0) {
  static_assert(NA == 1 || NA == 2 || NA == 4, "one, two or four accumulators per row");
  const int64_t k = a.k, sbs = k / kSuperBlock, subs = k / kSubBlock;
  const uint8_t* wb = a.w + b * (k / 8) * 64;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 facc[MR];
  for (int r = 0; r < MR; ++r) facc[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < sbs; ++s) {
    const uint8_t* p = a.sb + (b * sbs + s) * kSbBytes;
    const uint8_t* ws = wb + s * (kSuperBlock / 8) * 64;
    const int8_t* xs0 = a.xq + r0 * k + s * kSuperBlock;
    __m512i isum[MR];
    for (int r = 0; r < MR; ++r) isum[r] = _mm512_setzero_si512();
    for (int j = 0; j < kSuperBlock / kSubBlock; ++j) {
      const uint8_t* wj = ws + j * (kSubBlock / 8) * 64;
      __m512i acc[MR][NA];
      for (int r = 0; r < MR; ++r)
        for (int i = 0; i < NA; ++i) acc[r][i] = _mm512_setzero_si512();
      for (int c = 0; c < kSubBlock / 8; c += 2) {
        __m512i v0 = _mm512_loadu_si512(wj + c * 64);
        __m512i v1 = _mm512_loadu_si512(wj + c * 64 + 64);
        __m512i lo0 = _mm512_and_si512(v0, low4), hi0 = _mm512_and_si512(_mm512_srli_epi16(v0, 4), low4);
        __m512i lo1 = _mm512_and_si512(v1, low4), hi1 = _mm512_and_si512(_mm512_srli_epi16(v1, 4), low4);
        for (int r = 0; r < MR; ++r) {
          const int8_t* xr = xs0 + r * k + j * kSubBlock + c * 8;
          acc[r][0] = _mm512_dpbusd_epi32(acc[r][0], lo0, _mm512_set1_epi32(load4(xr)));
          acc[r][1 % NA] = _mm512_dpbusd_epi32(acc[r][1 % NA], hi0, _mm512_set1_epi32(load4(xr + 4)));
          acc[r][2 % NA] = _mm512_dpbusd_epi32(acc[r][2 % NA], lo1, _mm512_set1_epi32(load4(xr + 8)));
          acc[r][3 % NA] = _mm512_dpbusd_epi32(acc[r][3 % NA], hi1, _mm512_set1_epi32(load4(xr + 12)));
        }
      }
      const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j * kBlockN)));
      for (int r = 0; r < MR; ++r) {
        __m512i sum = acc[r][0];
        for (int i = 1; i < NA; ++i) sum = _mm512_add_epi32(sum, acc[r][i]);
        isum[r] = _mm512_add_epi32(isum[r], _mm512_mullo_epi32(sum, sc));
      }
    }
    // the mins: m of sub-blocks 2q and 2q + 1 in the int16 pair of each channel, times the pair of bsums
    __m512i mn[4];
    for (int q = 0; q < 4; ++q)
      mn[q] = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + q * 32)));
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 256)));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 288)));
    for (int r = 0; r < MR; ++r) {
      const int16_t* bs = a.bsum + (r0 + r) * subs + s * 8;
      __m512i ms = _mm512_setzero_si512();
      for (int q = 0; q < 4; ++q) {
        int32_t pair;
        __builtin_memcpy(&pair, bs + 2 * q, 4);
        ms = _mm512_add_epi32(ms, _mm512_madd_epi16(mn[q], _mm512_set1_epi32(pair)));
      }
      const __m512 t = _mm512_fmsub_ps(d, _mm512_cvtepi32_ps(isum[r]), _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(ms)));
      facc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(a.xs[(r0 + r) * sbs + s]), facc[r]);
    }
  }
  const int64_t n0 = b * kBlockN;
  __m512 bias = a.bias ? _mm512_loadu_ps(a.bias + n0) : _mm512_setzero_ps();
  for (int r = 0; r < MR; ++r) {
    __m512 y = _mm512_add_ps(facc[r], bias);
    const int64_t off = (r0 + r) * a.n + n0;
    if (a.out_bf16) {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint16_t*>(a.out) + off), f32x16_to_bf16(y));
    } else {
      _mm512_storeu_ps(static_cast<float*>(a.out) + off, y);
    }
  }
}

}  // namespace

void gemm_sb_avx512vnni(const SbArgs& a, int64_t b0, int64_t b1) {
  for (int64_t t0 = 0; t0 < a.m; t0 += kRowTile) {
    const int64_t t1 = t0 + kRowTile < a.m ? t0 + kRowTile : a.m;
    for (int64_t b = b0; b < b1; ++b) {
      int64_t r = t0;
      for (; r + 8 <= t1; r += 8) sb_block_rows<8, 1>(a, b, r);
      for (; r + 4 <= t1; r += 4) sb_block_rows<4, 2>(a, b, r);
      switch (t1 - r) {
        case 3: sb_block_rows<3, 4>(a, b, r); break;
        case 2: sb_block_rows<2, 4>(a, b, r); break;
        case 1: sb_block_rows<1, 4>(a, b, r); break;
        default: break;
      }
    }
  }
}

// AVX-512 dequantization (replaces the plain loop on AVX-512 CPUs): per 64-byte chunk,
// unpacklo/hi_epi32(lo, hi) puts lane l's 8 codes (4 low nibbles, then 4 high) next to each
// other; 16 of them at a time become floats, (q - 8) * s + z, and two rows' 8 bf16 each.
// [a x 8, b x 8] with AVX512F only (insertf32x8 would need AVX512DQ, which the dispatch does not check)
static inline __m512 halves(float a, float b) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_set1_ps(a)), _mm256_castps_pd(_mm256_set1_ps(b)), 1));
}

static void dequantize_avx512_by_chunk(const DequantArgs& d, int64_t b0, int64_t b1) {
  const int64_t k = d.k, g = d.group_size, groups = k / g, chunks = g / 8;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512 eight = _mm512_set1_ps(8.f);
  // lane order inside the unpacked vectors: unpacklo holds lanes {0,1,4,5,8,9,12,13}, unpackhi {2,3,6,7,...}
  static const int kLo[8] = {0, 1, 4, 5, 8, 9, 12, 13};
  static const int kHi[8] = {2, 3, 6, 7, 10, 11, 14, 15};
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wb = d.w + b * (k / 8) * 64;
    const uint16_t* szb = d.sz + b * groups * 32;
    for (int64_t j = 0; j < groups; ++j) {
      alignas(64) float s[kBlockN], z[kBlockN];
      _mm512_store_ps(s, bf16x16_to_f32(szb + j * 32));
      _mm512_store_ps(z, bf16x16_to_f32(szb + j * 32 + 16));
      for (int64_t c = 0; c < chunks; ++c) {
        __m512i v = _mm512_loadu_si512(wb + (j * chunks + c) * 64);
        __m512i lo = _mm512_and_si512(v, low4);
        __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
        alignas(64) uint8_t codes[2][64];
        _mm512_store_si512(codes[0], _mm512_unpacklo_epi32(lo, hi));
        _mm512_store_si512(codes[1], _mm512_unpackhi_epi32(lo, hi));
        const int64_t col = (j * chunks + c) * 8;
        for (int h = 0; h < 2; ++h) {
          const int* lanes = h ? kHi : kLo;
          for (int p = 0; p < 4; ++p) {  // 16 codes = lanes[2p] and lanes[2p+1], 8 each
            const int la = lanes[2 * p], lb = lanes[2 * p + 1];
            __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
                _mm_load_si128(reinterpret_cast<const __m128i*>(codes[h] + 16 * p))));
            __m512 sv = halves(s[la], s[lb]), zv = halves(z[la], z[lb]);
            // mul then add, as torch's (q - 8) * s + z: bit-equal to quant_math.dequantize
            __m256i out = f32x16_to_bf16(_mm512_add_ps(_mm512_mul_ps(_mm512_sub_ps(q, eight), sv), zv));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(d.out + (b * kBlockN + la) * k + col),
                             _mm256_castsi256_si128(out));
            _mm_storeu_si128(reinterpret_cast<__m128i*>(d.out + (b * kBlockN + lb) * k + col),
                             _mm256_extracti128_si256(out, 1));
          }
        }
      }
    }
  }
}

// Super-block layout -> bf16 rows (the prefill path's dequantization), AVX-512: per sub-block the
// 4 chunks' dwords are transposed (unpack epi32 / epi64) so that each 128-bit lane holds one output
// channel's 16 bytes, whose nibbles, interleaved by dword, are the channel's 32 codes in column
// order. w = (d sc_j) * q - (dmin m_j): each product in float32, mul then sub, rounded to nearest
// even: the same bits as dequant_sb_rows.inc.
namespace {

// 16 codes (128-bit lane L of `codes`) -> 16 bf16 at dst. G (per-group layout): w = (q - 8) * s + c;
// else (super-blocks): w = q * s - c. Mul, then add or sub: the plain loops' float operations.
template <int L, bool G>
inline void sb_store_lane(__m512i codes, float s, float c, uint16_t* dst) {
  __m512 q = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm512_extracti32x4_epi32(codes, L)));
  __m512 w;
  if constexpr (G) {
    q = _mm512_sub_ps(q, _mm512_set1_ps(8.f));
    w = _mm512_add_ps(_mm512_mul_ps(q, _mm512_set1_ps(s)), _mm512_set1_ps(c));
  } else {
    w = _mm512_sub_ps(_mm512_mul_ps(q, _mm512_set1_ps(s)), _mm512_set1_ps(c));
  }
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), f32x16_to_bf16(w));
}

// Rows 4L + R (L = 0..3) of 32 input channels (4 chunks): u holds their 16 bytes, one 128-bit lane each.
template <int R, bool G = false>
inline void sb_dequant_rows(__m512i u, const float* s, const float* mn, uint16_t* out0, int64_t k) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i lo = _mm512_and_si512(u, low4), hi = _mm512_and_si512(_mm512_srli_epi16(u, 4), low4);
  const __m512i a = _mm512_unpacklo_epi32(lo, hi), b = _mm512_unpackhi_epi32(lo, hi);  // columns 0-15, 16-31
  sb_store_lane<0, G>(a, s[R], mn[R], out0 + R * k);
  sb_store_lane<0, G>(b, s[R], mn[R], out0 + R * k + 16);
  sb_store_lane<1, G>(a, s[4 + R], mn[4 + R], out0 + (4 + R) * k);
  sb_store_lane<1, G>(b, s[4 + R], mn[4 + R], out0 + (4 + R) * k + 16);
  sb_store_lane<2, G>(a, s[8 + R], mn[8 + R], out0 + (8 + R) * k);
  sb_store_lane<2, G>(b, s[8 + R], mn[8 + R], out0 + (8 + R) * k + 16);
  sb_store_lane<3, G>(a, s[12 + R], mn[12 + R], out0 + (12 + R) * k);
  sb_store_lane<3, G>(b, s[12 + R], mn[12 + R], out0 + (12 + R) * k + 16);
}

// 4 chunks (32 input channels of the block's 16 output channels) -> their bf16 at out0 (row stride k).
template <bool G>
inline void dequant_32(const uint8_t* src, const float* s, const float* c, uint16_t* out0, int64_t k) {
  const __m512i v0 = _mm512_loadu_si512(src), v1 = _mm512_loadu_si512(src + 64);
  const __m512i v2 = _mm512_loadu_si512(src + 128), v3 = _mm512_loadu_si512(src + 192);
  const __m512i t0 = _mm512_unpacklo_epi32(v0, v1), t1 = _mm512_unpackhi_epi32(v0, v1);
  const __m512i t2 = _mm512_unpacklo_epi32(v2, v3), t3 = _mm512_unpackhi_epi32(v2, v3);
  sb_dequant_rows<0, G>(_mm512_unpacklo_epi64(t0, t2), s, c, out0, k);
  sb_dequant_rows<1, G>(_mm512_unpackhi_epi64(t0, t2), s, c, out0, k);
  sb_dequant_rows<2, G>(_mm512_unpacklo_epi64(t1, t3), s, c, out0, k);
  sb_dequant_rows<3, G>(_mm512_unpackhi_epi64(t1, t3), s, c, out0, k);
}

}  // namespace

void dequantize_sb_avx512(const SbDequantArgs& d, int64_t b0, int64_t b1) {
  const int64_t k = d.k, sbs = k / kSuperBlock;
  alignas(64) float s[8][kBlockN], mn[8][kBlockN];
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wb = d.w + b * (k / 8) * 64;
    for (int64_t sbi = 0; sbi < sbs; ++sbi) {
      const uint8_t* p = d.sb + (b * sbs + sbi) * kSbBytes;
      const __m512 dd = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 256)));
      const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 288)));
      for (int j = 0; j < 8; ++j) {
        const __m512 sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + j * kBlockN))));
        _mm512_store_ps(s[j], _mm512_mul_ps(dd, sc));
      }
      for (int q = 0; q < 4; ++q) {  // m of sub-blocks 2q, 2q + 1: even and odd bytes of 32
        const __m512i pair = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 128 + q * 32)));
        const __m512 m0 = _mm512_cvtepi32_ps(_mm512_and_si512(pair, _mm512_set1_epi32(0xFFFF)));
        const __m512 m1 = _mm512_cvtepi32_ps(_mm512_srli_epi32(pair, 16));
        _mm512_store_ps(mn[2 * q], _mm512_mul_ps(dm, m0));
        _mm512_store_ps(mn[2 * q + 1], _mm512_mul_ps(dm, m1));
      }
      for (int j = 0; j < 8; ++j) {
        const uint8_t* src = wb + (sbi * (kSuperBlock / 8) + j * 4) * 64;
        dequant_32<false>(src, s[j], mn[j], d.out + b * kBlockN * k + sbi * kSuperBlock + j * kSubBlock, k);
      }
    }
  }
}

// The per-group layout -> bf16 rows: groups of a multiple of 32 input channels through the transposed
// 4-chunk path above (w = (q - 8) * s + z, the same bits as the plain loop); others chunk by chunk.
void dequantize_avx512(const DequantArgs& d, int64_t b0, int64_t b1) {
  const int64_t k = d.k, g = d.group_size, groups = k / g;
  if (g % 32 != 0) return dequantize_avx512_by_chunk(d, b0, b1);
  alignas(64) float s[kBlockN], z[kBlockN];
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wb = d.w + b * (k / 8) * 64;
    const uint16_t* szb = d.sz + b * groups * 32;
    for (int64_t j = 0; j < groups; ++j) {
      _mm512_store_ps(s, bf16x16_to_f32(szb + j * 32));
      _mm512_store_ps(z, bf16x16_to_f32(szb + j * 32 + 16));
      for (int64_t c = 0; c < g / 8; c += 4)
        dequant_32<true>(wb + (j * (g / 8) + c) * 64, s, z, d.out + b * kBlockN * k + j * g + c * 8, k);
    }
  }
}

}  // namespace omni_w4a8
