// Row kernels of the fused decoder-layer ops (fused_layer_ops.cpp, declared in w4a8.h) in plain C++: RMSNorm
// (with the residual add) and SiLU-and-mul on bf16 rows; the reference of the vector ones, and their tails.
#include "w4a8.h"

namespace omni_w4a8 {

#include "scalar_common.inc"

// ---- Row kernels of the fused decoder-layer ops (w4a8.h) ---------------------------------------

// float -> bf16, round to nearest even, a NaN kept a quiet NaN (as c10::BFloat16).
static uint16_t f32_to_bf16_quiet(float f) {
  uint32_t i;
  __builtin_memcpy(&i, &f, 4);
  return (i & 0x7FFFFFFFu) > 0x7F800000u ? static_cast<uint16_t>((i >> 16) | 0x40u) : f32_to_bf16(f);
}

// Cephes' expf: range reduction by ln 2 (in two parts), degree-5 polynomial on [-ln2/2, ln2/2].
static float exp_cephes(float x) {
  x = x < -87.33654f ? -87.33654f : (x > 88.0f ? 88.0f : x);  // 2^n stays a normal float
  const float n = __builtin_floorf(x * 1.44269504088896341f + 0.5f);
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float y = 1.9875691500e-4f;
  y = y * r + 1.3981999507e-3f;
  y = y * r + 8.3334519073e-3f;
  y = y * r + 4.1665795894e-2f;
  y = y * r + 1.6666665459e-1f;
  y = y * r + 5.0000001201e-1f;
  y = y * (r * r) + r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  __builtin_memcpy(&scale, &bits, 4);
  return y * scale;
}

void add_rms_row_scalar(const uint16_t* x, const uint16_t* r, const uint16_t* w, float eps, int64_t n,
                        uint16_t* res_out, uint16_t* out) {
  float ss = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const float s = r ? bf16_to_f32(x[i]) + bf16_to_f32(r[i]) : bf16_to_f32(x[i]);
    ss += s * s;
  }
  const float inv = 1.0f / __builtin_sqrtf(ss / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    const float s = r ? bf16_to_f32(x[i]) + bf16_to_f32(r[i]) : bf16_to_f32(x[i]);
    res_out[i] = r ? f32_to_bf16_quiet(s) : x[i];
    out[i] = f32_to_bf16_quiet(bf16_to_f32(f32_to_bf16_quiet(s * inv)) * bf16_to_f32(w[i]));
  }
}

void silu_mul_row_scalar(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out) {
  for (int64_t i = 0; i < n; ++i) {
    const float a = bf16_to_f32(g[i]);
    out[i] = f32_to_bf16_quiet(a / (exp_cephes(-a) + 1.0f) * bf16_to_f32(u[i]));
  }
}

}  // namespace omni_w4a8
