// W4A8 GEMM in plain C++: the reference the vector kernels are tested against, and the path
// for x86 CPUs without AVX2. Same arithmetic (int32 sums per group, float per group).
#include "w4a8.h"

namespace omni_w4a8 {

#include "scalar_common.inc"

// IEEE half -> float (normals, subnormals, zero; no inf/NaN: the converter refuses them).
static float f16_to_f32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  int32_t exp = (h >> 10) & 0x1F;
  uint32_t mant = h & 0x3FF, bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalize
      exp = 1;
      while (!(mant & 0x400)) {
        mant <<= 1;
        --exp;
      }
      bits = sign | static_cast<uint32_t>(exp + 112) << 23 | (mant & 0x3FF) << 13;
    }
  } else {
    bits = sign | static_cast<uint32_t>(exp + 112) << 23 | mant << 13;
  }
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}


// y (+ bias) of output channel n of row r, float32 or bf16 (Args and SbArgs alike).
template <class A>
static void store_one(const A& a, int64_t r, int64_t n, float y) {
  if (a.bias) y += a.bias[n];
  if (a.out_bf16) {
    static_cast<uint16_t*>(a.out)[r * a.n + n] = f32_to_bf16(y);
  } else {
    static_cast<float*>(a.out)[r * a.n + n] = y;
  }
}

void gemm_scalar(const Args& a, int64_t b0, int64_t b1) {
  const int64_t k = a.k, g = a.group_size, groups = k / g;
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wb = a.w + b * (k / 8) * 64;
    const uint16_t* szb = a.sz + b * groups * 32;
    for (int64_t r = 0; r < a.m; ++r) {
      for (int64_t lane = 0; lane < kBlockN; ++lane) {
        float y = 0.f;
        for (int64_t j = 0; j < groups; ++j) {
          int32_t acc = 0;
          for (int64_t kk = j * g; kk < (j + 1) * g; ++kk) {
            const int64_t c = kk / 8, i = kk % 8;
            const uint8_t byte = wb[c * 64 + lane * 4 + (i & 3)];
            const int32_t q = i < 4 ? (byte & 0x0F) : (byte >> 4);
            acc += q * a.xq[r * k + kk];
          }
          const int64_t rg = r * groups + j;
          const float s = bf16_to_f32(szb[j * 32 + lane]), z = bf16_to_f32(szb[j * 32 + 16 + lane]);
          y += static_cast<float>(acc - 8 * a.xsum[rg]) * (s * a.xs[rg]) + z * a.xf[rg];
        }
        store_one(a, r, b * kBlockN + lane, y);
      }
    }
  }
}

// Activations -> int8 per (row, group): scale max|x| / 127, round half away from zero, clamp to +-127
// (gemm_avx2.cpp has the vectorized form every AVX2 and AVX-512 CPU runs).
void quantize_rows_scalar(const QuantArgs& q, int64_t r0, int64_t r1) {
  const int64_t k = q.k, g = q.group_size, groups = k / g;
  float buf[256];  // one group of activations as float (group_size <= 256)
  for (int64_t r = r0; r < r1; ++r) {
    for (int64_t j = 0; j < groups; ++j) {
      const int64_t base = r * k + j * g;
      if (q.x_bf16) {
        const uint16_t* src = static_cast<const uint16_t*>(q.x) + base;
        for (int64_t i = 0; i < g; ++i) {
          uint32_t bits = static_cast<uint32_t>(src[i]) << 16;
          float f;
          __builtin_memcpy(&f, &bits, 4);
          buf[i] = f;
        }
      } else {
        const float* src = static_cast<const float*>(q.x) + base;
        for (int64_t i = 0; i < g; ++i) buf[i] = src[i];
      }
      float amax = 0.f, sum = 0.f;
      for (int64_t i = 0; i < g; ++i) {
        float v = buf[i] < 0.f ? -buf[i] : buf[i];
        amax = v > amax ? v : amax;
        sum += buf[i];
      }
      float scale = amax / 127.f;
      if (q.bsum) scale += 0.f * sum;  // a NaN or inf activation reaches y (as gemm_avx2.cpp)
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      int32_t isum = 0;
      int8_t* dst = q.xq + base;
      for (int64_t i = 0; i < g; ++i) {
        float v = buf[i] * inv;
        int32_t iv = static_cast<int32_t>(v >= 0.f ? v + 0.5f : v - 0.5f);  // round half away from zero
        iv = iv > 127 ? 127 : (iv < -127 ? -127 : iv);
        dst[i] = static_cast<int8_t>(iv);
        isum += iv;
      }
      if (q.bsum)  // super-block layout: the int sum of each sub-block of 32
        for (int64_t s = 0; s < g / kSubBlock; ++s) {
          int32_t t = 0;
          for (int64_t i = 0; i < kSubBlock; ++i) t += dst[s * kSubBlock + i];
          q.bsum[(r * groups + j) * (g / kSubBlock) + s] = static_cast<int16_t>(t);
        }
      q.xs[r * groups + j] = scale;
      q.xsum[r * groups + j] = isum;
      q.xf[r * groups + j] = sum;
    }
  }
}

// Super-block layout in plain C++ (the reference of gemm_sb_avx2): per super-block the integer sums
// sum_j sc_j * sum_{k in j} q xq and sum_j m_j * bsum_j, then one float step.
void gemm_sb_scalar(const SbArgs& a, int64_t b0, int64_t b1) {
  const int64_t k = a.k, sbs = k / kSuperBlock;
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* wb = a.w + b * (k / 8) * 64;
    for (int64_t r = 0; r < a.m; ++r) {
      for (int64_t lane = 0; lane < kBlockN; ++lane) {
        float y = 0.f;
        for (int64_t s = 0; s < sbs; ++s) {
          const uint8_t* p = a.sb + (b * sbs + s) * kSbBytes;
          int32_t isum = 0, msum = 0;
          for (int64_t j = 0; j < kSuperBlock / kSubBlock; ++j) {
            int32_t acc = 0;
            for (int64_t kk = s * kSuperBlock + j * kSubBlock; kk < s * kSuperBlock + (j + 1) * kSubBlock; ++kk) {
              const int64_t c = kk / 8, i = kk % 8;
              const uint8_t byte = wb[c * 64 + lane * 4 + (i & 3)];
              acc += (i < 4 ? (byte & 0x0F) : (byte >> 4)) * a.xq[r * k + kk];
            }
            isum += acc * p[j * kBlockN + lane];
            msum += p[128 + (j / 2) * 32 + lane * 2 + (j % 2)] * a.bsum[r * (k / kSubBlock) + s * 8 + j];
          }
          uint16_t dh, mh;
          __builtin_memcpy(&dh, p + 256 + 2 * lane, 2);
          __builtin_memcpy(&mh, p + 288 + 2 * lane, 2);
          y += a.xs[r * sbs + s] * (f16_to_f32(dh) * static_cast<float>(isum) - f16_to_f32(mh) * static_cast<float>(msum));
        }
        store_one(a, r, b * kBlockN + lane, y);
      }
    }
  }
}

#define DEQUANT_SB_FN dequantize_sb_scalar
#include "dequant_sb_rows.inc"
#undef DEQUANT_SB_FN

#define DEQUANT_FN dequantize_scalar
#include "dequant_rows.inc"
#undef DEQUANT_FN

}  // namespace omni_w4a8
