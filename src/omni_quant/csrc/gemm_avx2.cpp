// W4A8 GEMM for AVX2 CPUs without VNNI (AMD Zen 1-3, Intel Haswell to Skylake client).
//
// vpmaddubsw multiplies the unsigned 4-bit codes by the signed int8 activations and adds pairs
// into int16 lanes: |pair| <= 2 * 15 * 127 = 3810, no saturation. A chunk (8 input channels)
// adds two such pairs to each int16 lane (low and high nibbles), at most 7620; F chunks are summed
// in int16 (F = 4: at most 30480 < 32767) before one vpmaddwd by ones widens them to int32.
// The straightforward form widens after every vpmaddubsw, twice the multiply-port work: on a
// 2-core Zen 3 this kernel is multiply-bound from M = 2 on, so that halving is the prefill speed.
//
// Rows are taken 4 at a time (each weight vector, once unpacked, feeds 4 rows), and at prefill
// in tiles of kRowTile rows per pass over the thread's weights, so that the tile's int8
// activations stay in L2 while the weights stream.
#pragma GCC target("avx2,fma,f16c")
#include <immintrin.h>

#include "w4a8.h"

namespace omni_w4a8 {

#include "avx2_common.inc"

namespace {

constexpr int64_t kRowTile = 64;
alignas(32) const int16_t kOnes16[32] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                                         1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1};
constexpr int64_t kPrefetchBytes = 2048;  // as gemm_avx512.cpp

// The int32 sums of one group for MR rows: isum[r][h][l] = sum over the group's input channels
// of q * xq for output channel 8h + l of the block, row r. F: chunks summed in int16 before
// widening (4, or 2 when the group has 2 (mod 4) chunks).
// mult: null (widen by ones), or int16 [chunks / F][2][16], the multipliers of each F chunks'
// int16 sums (the super-block layout's sub-block scales, each in both int16 lanes of a channel).
template <int MR, int F>
inline void group_sums(const uint8_t* wj, const int8_t* xj, int64_t k, int64_t chunks, int32_t (*isum)[2][8],
                       const int16_t* mult = nullptr) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i wide[MR][2];
  for (int r = 0; r < MR; ++r) wide[r][0] = wide[r][1] = _mm256_setzero_si256();
  for (int64_t c0 = 0; c0 < chunks; c0 += F) {
    __m256i acc[MR][2];  // int16 lanes
    for (int r = 0; r < MR; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_si256();
    for (int f = 0; f < F; ++f) {
      const int64_t c = c0 + f;
      _mm_prefetch(reinterpret_cast<const char*>(wj + c * 64 + kPrefetchBytes), _MM_HINT_T0);
      __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj + c * 64));
      __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj + c * 64 + 32));
      __m256i lo0 = _mm256_and_si256(v0, low4), hi0 = _mm256_and_si256(_mm256_srli_epi16(v0, 4), low4);
      __m256i lo1 = _mm256_and_si256(v1, low4), hi1 = _mm256_and_si256(_mm256_srli_epi16(v1, 4), low4);
      for (int r = 0; r < MR; ++r) {
        const int8_t* xr = xj + r * k + c * 8;
        __m256i xa = _mm256_set1_epi32(load4(xr)), xb = _mm256_set1_epi32(load4(xr + 4));
        acc[r][0] = _mm256_add_epi16(acc[r][0], _mm256_add_epi16(_mm256_maddubs_epi16(lo0, xa),
                                                                 _mm256_maddubs_epi16(hi0, xb)));
        acc[r][1] = _mm256_add_epi16(acc[r][1], _mm256_add_epi16(_mm256_maddubs_epi16(lo1, xa),
                                                                 _mm256_maddubs_epi16(hi1, xb)));
      }
    }
    __m256i m0 = ones, m1 = ones;
    if (mult) {
      m0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(mult + (c0 / F) * 32));
      m1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(mult + (c0 / F) * 32 + 16));
    }
    for (int r = 0; r < MR; ++r) {
      wide[r][0] = _mm256_add_epi32(wide[r][0], _mm256_madd_epi16(acc[r][0], m0));
      wide[r][1] = _mm256_add_epi32(wide[r][1], _mm256_madd_epi16(acc[r][1], m1));
    }
  }
  for (int r = 0; r < MR; ++r)
    for (int h = 0; h < 2; ++h) _mm256_store_si256(reinterpret_cast<__m256i*>(isum[r][h]), wide[r][h]);
}

// Four rows, the prefill case, in assembly: with intrinsics GCC 12 hoists the loads and multiplies
// of several chunks ahead and spills the accumulators (measured 1.5-2x slower). Registers:
// ymm0-7 the int16 accumulators acc(r, h) = ymm(2r + h), ymm8-11 the codes (low/high nibbles of
// the two halves), ymm12-15 broadcast activations and products.
// mult, mult_stride: the int16 multipliers of each F chunks' sums, [2][16] (halves 0, 1) at mult,
// advancing by mult_stride bytes per F chunks (0: the same multipliers throughout, e.g. ones).
template <int F>
inline void group_sums4(const uint8_t* wj, const int8_t* xj, int64_t k, int64_t chunks, int32_t (*isum)[2][8],
                        const int16_t* mult, int64_t mult_stride) {
  static const int8_t kLow4[32] __attribute__((aligned(32))) = {
      15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15,
      15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15};
  for (int r = 0; r < 4; ++r)
    for (int h = 0; h < 2; ++h) _mm256_store_si256(reinterpret_cast<__m256i*>(isum[r][h]), _mm256_setzero_si256());
  const int64_t k3 = 3 * k;
  int64_t blocks = chunks / F;
  const uint8_t* w = wj;
  const int8_t* x = xj;
#define OMNI_ROW(XA, XB, A0, A1)                       \
  "vpbroadcastd " XA ", %%ymm12\n\t"                   \
  "vpbroadcastd " XB ", %%ymm13\n\t"                   \
  "vpmaddubsw %%ymm12, %%ymm8, %%ymm14\n\t"            \
  "vpmaddubsw %%ymm13, %%ymm9, %%ymm15\n\t"            \
  "vpaddw %%ymm14, %%" A0 ", %%" A0 "\n\t"             \
  "vpaddw %%ymm15, %%" A0 ", %%" A0 "\n\t"             \
  "vpmaddubsw %%ymm12, %%ymm10, %%ymm14\n\t"           \
  "vpmaddubsw %%ymm13, %%ymm11, %%ymm15\n\t"           \
  "vpaddw %%ymm14, %%" A1 ", %%" A1 "\n\t"             \
  "vpaddw %%ymm15, %%" A1 ", %%" A1 "\n\t"
#define OMNI_FLUSH(A, OFF, MOFF)                       \
  "vpmaddwd " MOFF "(%[mult]), %%" A ", %%" A "\n\t"   \
  "vpaddd " OFF "(%[isum]), %%" A ", %%" A "\n\t"      \
  "vmovdqa %%" A ", " OFF "(%[isum])\n\t"
  __asm__ volatile(
      "1:\n\t"
      "vpxor %%xmm0, %%xmm0, %%xmm0\n\t"
      "vpxor %%xmm1, %%xmm1, %%xmm1\n\t"
      "vpxor %%xmm2, %%xmm2, %%xmm2\n\t"
      "vpxor %%xmm3, %%xmm3, %%xmm3\n\t"
      "vpxor %%xmm4, %%xmm4, %%xmm4\n\t"
      "vpxor %%xmm5, %%xmm5, %%xmm5\n\t"
      "vpxor %%xmm6, %%xmm6, %%xmm6\n\t"
      "vpxor %%xmm7, %%xmm7, %%xmm7\n\t"
      "mov %[f], %%eax\n\t"
      "2:\n\t"
      "prefetcht0 2048(%[w])\n\t"
      "vmovdqu (%[w]), %%ymm8\n\t"
      "vmovdqu 32(%[w]), %%ymm10\n\t"
      "vpsrlw $4, %%ymm8, %%ymm9\n\t"
      "vpsrlw $4, %%ymm10, %%ymm11\n\t"
      "vmovdqa %[low4], %%ymm14\n\t"  // one load of the mask, not four (vector loads: 2 a cycle)
      "vpand %%ymm14, %%ymm8, %%ymm8\n\t"
      "vpand %%ymm14, %%ymm9, %%ymm9\n\t"
      "vpand %%ymm14, %%ymm10, %%ymm10\n\t"
      "vpand %%ymm14, %%ymm11, %%ymm11\n\t"
      OMNI_ROW("(%[x])", "4(%[x])", "ymm0", "ymm1")
      OMNI_ROW("(%[x],%[k],1)", "4(%[x],%[k],1)", "ymm2", "ymm3")
      OMNI_ROW("(%[x],%[k],2)", "4(%[x],%[k],2)", "ymm4", "ymm5")
      OMNI_ROW("(%[x],%[k3],1)", "4(%[x],%[k3],1)", "ymm6", "ymm7")
      "add $64, %[w]\n\t"
      "add $8, %[x]\n\t"
      "dec %%eax\n\t"
      "jnz 2b\n\t"
      OMNI_FLUSH("ymm0", "0", "0") OMNI_FLUSH("ymm1", "32", "32") OMNI_FLUSH("ymm2", "64", "0")
      OMNI_FLUSH("ymm3", "96", "32") OMNI_FLUSH("ymm4", "128", "0") OMNI_FLUSH("ymm5", "160", "32")
      OMNI_FLUSH("ymm6", "192", "0") OMNI_FLUSH("ymm7", "224", "32")
      "add %[mstride], %[mult]\n\t"
      "dec %[blocks]\n\t"
      "jnz 1b\n\t"
      : [w] "+r"(w), [x] "+r"(x), [blocks] "+r"(blocks), [mult] "+r"(mult)
      : [k] "r"(k), [k3] "r"(k3), [f] "i"(F), [isum] "r"(&isum[0][0][0]), [low4] "m"(*reinterpret_cast<const __m256i*>(kLow4)),
        [mstride] "r"(mult_stride)
      : "rax", "memory", "cc", "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
        "xmm10", "xmm11", "xmm12", "xmm13", "xmm14", "xmm15");
#undef OMNI_ROW
#undef OMNI_FLUSH
}

template <int MR, int F>
void block_rows(const Args& a, int64_t b, int64_t r0) {
  const int64_t k = a.k, g = a.group_size, groups = k / g, chunks = g / 8;
  const uint8_t* wb = a.w + b * (k / 8) * 64;
  const uint16_t* szb = a.sz + b * groups * 32;
  const int8_t* x0 = a.xq + r0 * k;
  alignas(32) int32_t isum[MR][2][8];
  __m256 facc[MR][2];
  for (int r = 0; r < MR; ++r) facc[r][0] = facc[r][1] = _mm256_setzero_ps();
  for (int64_t j = 0; j < groups; ++j) {
    if constexpr (MR == 4) {
      group_sums4<F>(wb + j * chunks * 64, x0 + j * g, k, chunks, isum, kOnes16, 0);
    } else {
      group_sums<MR, F>(wb + j * chunks * 64, x0 + j * g, k, chunks, isum);
    }
    const uint16_t* szj = szb + j * 32;
    const __m256 s[2] = {bf16x8_to_f32(szj), bf16x8_to_f32(szj + 8)};
    const __m256 z[2] = {bf16x8_to_f32(szj + 16), bf16x8_to_f32(szj + 24)};
    for (int r = 0; r < MR; ++r) {
      const int64_t rg = (r0 + r) * groups + j;
      const __m256i corr = _mm256_set1_epi32(8 * a.xsum[rg]);
      const __m256 xs = _mm256_set1_ps(a.xs[rg]), xf = _mm256_set1_ps(a.xf[rg]);
      for (int h = 0; h < 2; ++h) {
        __m256 t = _mm256_cvtepi32_ps(_mm256_sub_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(isum[r][h])), corr));
        facc[r][h] = _mm256_fmadd_ps(z[h], xf, _mm256_fmadd_ps(t, _mm256_mul_ps(s[h], xs), facc[r][h]));
      }
    }
  }
  const int64_t n0 = b * kBlockN;
  __m256 bias0 = a.bias ? _mm256_loadu_ps(a.bias + n0) : _mm256_setzero_ps();
  __m256 bias1 = a.bias ? _mm256_loadu_ps(a.bias + n0 + 8) : _mm256_setzero_ps();
  for (int r = 0; r < MR; ++r)
    store16(a, (r0 + r) * a.n + n0, _mm256_add_ps(facc[r][0], bias0), _mm256_add_ps(facc[r][1], bias1));
}

template <int F>
void gemm_tiles(const Args& a, int64_t b0, int64_t b1) {
  for (int64_t t0 = 0; t0 < a.m; t0 += kRowTile) {
    const int64_t t1 = t0 + kRowTile < a.m ? t0 + kRowTile : a.m;
    for (int64_t b = b0; b < b1; ++b) {
      int64_t r = t0;
      for (; r + 4 <= t1; r += 4) block_rows<4, F>(a, b, r);
      switch (t1 - r) {
        case 3: block_rows<3, F>(a, b, r); break;
        case 2: block_rows<2, F>(a, b, r); break;
        case 1: block_rows<1, F>(a, b, r); break;
        default: break;
      }
    }
  }
}

}  // namespace

void gemm_avx2(const Args& a, int64_t b0, int64_t b1) {
  // group_size is a multiple of 16, so a group has an even number of 8-channel chunks
  if ((a.group_size / 8) % 4 == 0) {
    gemm_tiles<4>(a, b0, b1);
  } else {
    gemm_tiles<2>(a, b0, b1);
  }
}

// ---- Super-block layout (w4a8.h, SbArgs): Q4_K's arrangement -------------------------------------
//
// The same int16 sums of 4 chunks (one sub-block of 32 input channels) are widened by vpmaddwd with
// the sub-block's 6-bit scale instead of ones, so the 8 sub-blocks of a super-block add up in int32
// (at most 8 * 2 * 30480 * 63 < 2^31) and float work happens once per 256 input channels:
//   y += xs * (d * sum_j sc_j isum_j  -  dmin * sum_j m_j bsum_j)
// (xs: the activations' scale per super-block, bsum_j: the int sum of their sub-block j), the
// mins' sum by vpmaddwd on int16 pairs as well. llama.cpp's Q4_K x Q8_K dot product
// (ggml-cpu/arch/x86/quants.c) has the same algebra.

namespace {

struct alignas(32) SbConsts {
  int16_t sc16[8][2][16];  // sub-block j, half h: channel 8h + i in int16 lanes 2i and 2i + 1
  __m256i mn16[4][2];      // mins of sub-blocks 2p, 2p + 1 in int16 lanes 2i, 2i + 1 (channel 8h + i)
  __m256 d[2], dmin[2];
};

inline void sb_consts(const uint8_t* p, SbConsts& c) {
  for (int j = 0; j < 8; ++j)
    for (int h = 0; h < 2; ++h) {
      __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + j * kBlockN + 8 * h)));
      _mm256_store_si256(reinterpret_cast<__m256i*>(c.sc16[j][h]), _mm256_or_si256(v, _mm256_slli_epi32(v, 16)));
    }
  for (int q = 0; q < 4; ++q)
    for (int h = 0; h < 2; ++h)
      c.mn16[q][h] = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 128 + q * 32 + h * 16)));
  for (int h = 0; h < 2; ++h) {
    c.d[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 256 + 16 * h)));
    c.dmin[h] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 288 + 16 * h)));
  }
}

// Every super-block's constants are unpacked once per block and row tile, and its 2 KiB of codes stay
// in L1 while all the tile's rows pass over them; the tile's float sums wait in memory (facc, 4 KiB)
// between super-blocks. Against one pass over the block's super-blocks per 4 rows (kernel revision 7:
// constants unpacked each time, codes reread from L2) it is faster at prefill and the same at M = 1
// (docs/cpu_int4.md, the kernel matrix).
constexpr int64_t kSbMaxTile = 64;
constexpr int64_t kSbTileBytes = 256 * 1024;  // the tile's int8 activations: half a Zen 3 L2

// Rows per tile for K input channels: kSbTileBytes of activations, 8..kSbMaxTile, a multiple of 4.
int64_t sb_row_tile(int64_t k) {
  const int64_t t = kSbTileBytes / k / 4 * 4;
  return t < 8 ? 8 : t > kSbMaxTile ? kSbMaxTile : t;
}

// MR rows from r0, super-block s of block b: facc[r][0..15] += xs * (d * sum_j sc_j isum_j - dmin * sum_j m_j bsum_j).
template <int MR>
inline void sb_rows(const SbArgs& a, const SbConsts& c, const uint8_t* ws, int64_t r0, int64_t s, float* facc) {
  const int64_t k = a.k, sbs = k / kSuperBlock, subs = k / kSubBlock;
  alignas(32) int32_t isum[MR][2][8];
  const int8_t* x0 = a.xq + r0 * k + s * kSuperBlock;
  if constexpr (MR == 4) {
    group_sums4<4>(ws, x0, k, kSuperBlock / 8, isum, &c.sc16[0][0][0], 64);
  } else {
    group_sums<MR, 4>(ws, x0, k, kSuperBlock / 8, isum, &c.sc16[0][0][0]);
  }
  for (int r = 0; r < MR; ++r) {
    const int16_t* bs = a.bsum + (r0 + r) * subs + s * 8;
    __m256i ms[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int q = 0; q < 4; ++q) {
      int32_t pair;
      __builtin_memcpy(&pair, bs + 2 * q, 4);
      const __m256i bp = _mm256_set1_epi32(pair);
      ms[0] = _mm256_add_epi32(ms[0], _mm256_madd_epi16(c.mn16[q][0], bp));
      ms[1] = _mm256_add_epi32(ms[1], _mm256_madd_epi16(c.mn16[q][1], bp));
    }
    const __m256 xs = _mm256_set1_ps(a.xs[(r0 + r) * sbs + s]);
    for (int h = 0; h < 2; ++h) {
      const __m256 t = _mm256_fmsub_ps(
          c.d[h], _mm256_cvtepi32_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(isum[r][h]))),
          _mm256_mul_ps(c.dmin[h], _mm256_cvtepi32_ps(ms[h])));
      float* f = facc + r * kBlockN + 8 * h;
      _mm256_store_ps(f, _mm256_fmadd_ps(t, xs, _mm256_load_ps(f)));
    }
  }
}

// Rows [t0, t1) (at most kSbMaxTile) of output block b; facc: float [kSbMaxTile][16], 32-byte aligned.
void sb_tile(const SbArgs& a, int64_t b, int64_t t0, int64_t t1, float* facc) {
  const int64_t k = a.k, sbs = k / kSuperBlock, rows = t1 - t0;
  for (int64_t i = 0; i < rows * kBlockN; i += 8) _mm256_store_ps(facc + i, _mm256_setzero_ps());
  SbConsts c;
  for (int64_t s = 0; s < sbs; ++s) {
    sb_consts(a.sb + (b * sbs + s) * kSbBytes, c);
    const uint8_t* ws = a.w + b * (k / 8) * 64 + s * (kSuperBlock / 8) * 64;
    int64_t r = t0;
    for (; r + 4 <= t1; r += 4) sb_rows<4>(a, c, ws, r, s, facc + (r - t0) * kBlockN);
    float* f = facc + (r - t0) * kBlockN;
    switch (t1 - r) {
      case 3: sb_rows<3>(a, c, ws, r, s, f); break;
      case 2: sb_rows<2>(a, c, ws, r, s, f); break;
      case 1: sb_rows<1>(a, c, ws, r, s, f); break;
      default: break;
    }
  }
  const int64_t n0 = b * kBlockN;
  const __m256 bias0 = a.bias ? _mm256_loadu_ps(a.bias + n0) : _mm256_setzero_ps();
  const __m256 bias1 = a.bias ? _mm256_loadu_ps(a.bias + n0 + 8) : _mm256_setzero_ps();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t off = (t0 + r) * a.n + n0;
    const __m256 y0 = _mm256_add_ps(_mm256_load_ps(facc + r * kBlockN), bias0);
    const __m256 y1 = _mm256_add_ps(_mm256_load_ps(facc + r * kBlockN + 8), bias1);
    if (a.out_bf16) {
      uint16_t* o = static_cast<uint16_t*>(a.out) + off;
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o), f32x8_to_bf16(y0));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(o + 8), f32x8_to_bf16(y1));
    } else {
      _mm256_storeu_ps(static_cast<float*>(a.out) + off, y0);
      _mm256_storeu_ps(static_cast<float*>(a.out) + off + 8, y1);
    }
  }
}

}  // namespace

void gemm_sb_avx2(const SbArgs& a, int64_t b0, int64_t b1) {
  const int64_t tile = sb_row_tile(a.k);
  alignas(32) float facc[kSbMaxTile * kBlockN];
  for (int64_t t0 = 0; t0 < a.m; t0 += tile) {
    const int64_t t1 = t0 + tile < a.m ? t0 + tile : a.m;
    for (int64_t b = b0; b < b1; ++b) sb_tile(a, b, t0, t1, facc);
  }
}

static float f16_to_f32(uint16_t h) { return _cvtsh_ss(h); }

#define DEQUANT_SB_FN dequantize_sb_avx2
#include "dequant_sb_rows.inc"
#undef DEQUANT_SB_FN

// Activations -> int8 per (row, group), vectorized by hand: plain loops carry their max and sum
// reductions in one scalar register each (GCC does not reorder float reductions): about 100 us for
// one row of K = 8960, as long as the GEMV itself. Same results as quantize_rows_scalar: scale
// max|x| / 127, round half away from zero, clamp to +-127; only the float sum xf is added in
// another order.
void quantize_rows_avx2(const QuantArgs& q, int64_t r0, int64_t r1) {
  const int64_t k = q.k, g = q.group_size, groups = k / g;
  const __m256 sign = _mm256_set1_ps(-0.f), half = _mm256_set1_ps(0.5f);
  const __m256 lim = _mm256_set1_ps(127.f), nlim = _mm256_set1_ps(-127.f);
  alignas(32) float buf[256];  // one group as float (group_size <= 256, a multiple of 16)
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j = 0; j < groups; ++j) {
      const int64_t base = r * k + j * g;
      __m256 vmax = _mm256_setzero_ps(), vsum0 = _mm256_setzero_ps(), vsum1 = _mm256_setzero_ps();
      for (int64_t i = 0; i < g; i += 16) {
        __m256 a, b;
        if (q.x_bf16) {
          const uint16_t* src = static_cast<const uint16_t*>(q.x) + base + i;
          a = bf16x8_to_f32(src);
          b = bf16x8_to_f32(src + 8);
        } else {
          const float* src = static_cast<const float*>(q.x) + base + i;
          a = _mm256_loadu_ps(src);
          b = _mm256_loadu_ps(src + 8);
        }
        _mm256_store_ps(buf + i, a);
        _mm256_store_ps(buf + i + 8, b);
        vmax = _mm256_max_ps(vmax, _mm256_max_ps(_mm256_andnot_ps(sign, a), _mm256_andnot_ps(sign, b)));
        vsum0 = _mm256_add_ps(vsum0, a);
        vsum1 = _mm256_add_ps(vsum1, b);
      }
      alignas(32) float lanes[8];
      _mm256_store_ps(lanes, vmax);
      float amax = 0.f;
      for (int l = 0; l < 8; ++l) amax = lanes[l] > amax ? lanes[l] : amax;
      _mm256_store_ps(lanes, _mm256_add_ps(vsum0, vsum1));
      float sum = 0.f;
      for (int l = 0; l < 8; ++l) sum += lanes[l];
      float scale = amax / 127.f;
      // max_ps drops NaN: the super-block layout has no float sum in its arithmetic to carry a NaN or inf
      // into y (the per-group layout's xf does), so its scale does (0 * sum is 0 for finite sums)
      if (q.bsum) scale += 0.f * sum;
      const __m256 inv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
      __m256i isum = _mm256_setzero_si256(), sub = _mm256_setzero_si256();
      int8_t* dst = q.xq + base;
      for (int64_t i = 0; i < g; i += 16) {
        __m256i iv[2];
        for (int h = 0; h < 2; ++h) {
          __m256 v = _mm256_mul_ps(_mm256_load_ps(buf + i + 8 * h), inv);
          v = _mm256_add_ps(v, _mm256_or_ps(half, _mm256_and_ps(v, sign)));  // +-0.5, then truncate
          iv[h] = _mm256_cvttps_epi32(_mm256_min_ps(_mm256_max_ps(v, nlim), lim));
          isum = _mm256_add_epi32(isum, iv[h]);
          sub = _mm256_add_epi32(sub, iv[h]);
        }
        if (q.bsum && (i + 16) % kSubBlock == 0) {  // super-block layout: the int sum of each sub-block
          alignas(32) int32_t sl[8];
          _mm256_store_si256(reinterpret_cast<__m256i*>(sl), sub);
          q.bsum[(r * groups + j) * (g / kSubBlock) + i / kSubBlock] =
              static_cast<int16_t>(sl[0] + sl[1] + sl[2] + sl[3] + sl[4] + sl[5] + sl[6] + sl[7]);
          sub = _mm256_setzero_si256();
        }
        // 16 int32 -> 16 int8: packs work per 128-bit lane, the permute puts them in order
        __m256i w16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(iv[0], iv[1]), 0xD8);
        __m128i b8 = _mm_packs_epi16(_mm256_castsi256_si128(w16), _mm256_extracti128_si256(w16, 1));
        _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i), b8);
      }
      alignas(32) int32_t ilanes[8];
      _mm256_store_si256(reinterpret_cast<__m256i*>(ilanes), isum);
      int32_t total = 0;
      for (int l = 0; l < 8; ++l) total += ilanes[l];
      q.xs[r * groups + j] = scale;
      q.xsum[r * groups + j] = total;
      q.xf[r * groups + j] = sum;
    }
  }
}

#define DEQUANT_FN dequantize_avx2
#include "dequant_rows.inc"
#undef DEQUANT_FN

}  // namespace omni_w4a8
