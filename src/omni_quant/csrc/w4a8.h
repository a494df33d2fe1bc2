// omni-quant W4A8 kernel: shared declarations (no torch, no STL: the ISA files are compiled
// with AVX-512 / AVX2 code generation and must not emit inline copies of library functions).
#pragma once
#include <stdint.h>

namespace omni_w4a8 {

// Output channels per block: one 512-bit vector of int32 lanes (two 256-bit vectors on AVX2).
constexpr int64_t kBlockN = 16;

// Everything a kernel call needs. Layouts (see omni_quant/kernels/w4a8.py):
//   w     uint8 [N/16, K/8, 16, 4]: byte i of lane n in chunk c holds the 4-bit codes of input
//         channels 8c+i (low nibble) and 8c+4+i (high nibble), codes 0..15, w = (q - 8) * s + z.
//   sz    uint16 (bf16 bits) [N/16, G, 2, 16]: per group the 16 scales, then the 16 float zeros.
//   xq    int8 [M, K]: activations quantized per (row, weight group), symmetric.
//   xs    float [M, G]: activation scale per (row, group); xsum int32 [M, G]: sum of xq in the
//         group; xf float [M, G]: exact float sum of the activations in the group.
//   bias  float [N] or null; out: [M, N] float32 (out_bf16 == 0) or bf16 bits (out_bf16 == 1).
struct Args {
  const uint8_t* w;
  const uint16_t* sz;
  const int8_t* xq;
  const float* xs;
  const int32_t* xsum;
  const float* xf;
  const float* bias;
  void* out;
  int64_t m, n, k, group_size;
  int out_bf16;
};

// Activations: x [M, K] float32 (x_bf16 == 0) or bf16 bits (x_bf16 == 1) -> xq, xs, xsum, xf,
// rows [r0, r1).
struct QuantArgs {
  const void* x;
  int x_bf16;
  int8_t* xq;
  float* xs;
  int32_t* xsum;
  float* xf;
  int64_t k, group_size;
  int16_t* bsum;  // or null; super-block layout: int sum of xq per (row, sub-block of 32)
};

// Super-block layout (Q4_K's arrangement; omni_quant/kernels/w4a8.py repack_super_block): per output
// channel and super-block of 256 input channels, w = d * sc_j * q - dmin * m_j for sub-block j of 32
// (codes q 0..15, 6-bit integer sc_j and m_j, fp16 d and dmin). Per block of 16 output channels
// and super-block, kSbBytes bytes:
//   [0, 128)    sc[j][l]        uint8, sub-block j 0..7, channel l 0..15
//   [128, 256)  m[p][l][2]      uint8, m of sub-blocks 2p and 2p + 1 of channel l (p 0..3)
//   [256, 288)  d[l]            fp16 bits
//   [288, 320)  dmin[l]         fp16 bits
constexpr int64_t kSuperBlock = 256;
constexpr int64_t kSubBlock = 32;
constexpr int64_t kSbBytes = 320;

// One super-block-layout call: w as Args::w, sb uint8 [N/16, K/256, kSbBytes]; activations
// quantized per (row, super-block) (xs float [M, K/256]) with bsum int16 [M, K/32].
struct SbArgs {
  const uint8_t* w;
  const uint8_t* sb;
  const int8_t* xq;
  const float* xs;
  const int16_t* bsum;
  const float* bias;
  void* out;
  int64_t m, n, k;
  int out_bf16;
};

struct SbDequantArgs {
  const uint8_t* w;
  const uint8_t* sb;
  uint16_t* out;
  int64_t k;
};

// Dequantization of blocks [b0, b1) of the kernel's layout to bf16 bits out [N, K] (prefill path:
// a bf16 GEMM on the dequantized weight, no second resident copy).
struct DequantArgs {
  const uint8_t* w;
  const uint16_t* sz;
  uint16_t* out;
  int64_t k, group_size;
};

// Each computes output blocks [b0, b1) (block = 16 output channels) for all M rows.
void gemm_avx512vnni(const Args& a, int64_t b0, int64_t b1);
void gemm_avx2vnni(const Args& a, int64_t b0, int64_t b1);
void gemm_avx2(const Args& a, int64_t b0, int64_t b1);
void gemm_scalar(const Args& a, int64_t b0, int64_t b1);

void quantize_rows_avx2(const QuantArgs& q, int64_t r0, int64_t r1);
void quantize_rows_scalar(const QuantArgs& q, int64_t r0, int64_t r1);

void dequantize_avx512(const DequantArgs& d, int64_t b0, int64_t b1);
void dequantize_avx2(const DequantArgs& d, int64_t b0, int64_t b1);
void dequantize_scalar(const DequantArgs& d, int64_t b0, int64_t b1);

// Super-block layout: GEMM of output blocks [b0, b1), and dequantization to bf16.
void gemm_sb_avx512vnni(const SbArgs& a, int64_t b0, int64_t b1);
void gemm_sb_avx2(const SbArgs& a, int64_t b0, int64_t b1);
void gemm_sb_scalar(const SbArgs& a, int64_t b0, int64_t b1);
void dequantize_sb_avx512(const SbDequantArgs& d, int64_t b0, int64_t b1);
void dequantize_sb_avx2(const SbDequantArgs& d, int64_t b0, int64_t b1);
void dequantize_sb_scalar(const SbDequantArgs& d, int64_t b0, int64_t b1);

// Row kernels of the fused decoder-layer ops (fused_layer_ops.cpp), bf16 bits in and out, one row of n:
//   add_rms_row:  s = x (+ r) in float; res_out = bf16(s) (x itself without r);
//                 out = bf16(bf16(s / sqrt(mean(s^2) + eps)) * w)   (vLLM's fused add + RMSNorm)
//   silu_mul_row: out = bf16(g / (1 + exp(-g)) * u)                  (vLLM's SiLU-and-mul)
// float inside, one rounding to bf16 where vLLM's eager code rounds; NaN stays a quiet NaN. exp is Cephes'
// expf polynomial (within 2 ulp on [-87.3, 88]). The vector versions differ from the scalar one only in the
// order of the sum of squares (lanes, then across them), and run the scalar one for a tail or a row
// whose length is no multiple of their lanes.
void add_rms_row_avx512(const uint16_t* x, const uint16_t* r, const uint16_t* w, float eps, int64_t n,
                        uint16_t* res_out, uint16_t* out);
void add_rms_row_avx2(const uint16_t* x, const uint16_t* r, const uint16_t* w, float eps, int64_t n,
                      uint16_t* res_out, uint16_t* out);
void add_rms_row_scalar(const uint16_t* x, const uint16_t* r, const uint16_t* w, float eps, int64_t n,
                        uint16_t* res_out, uint16_t* out);
void silu_mul_row_avx512(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out);
void silu_mul_row_avx2(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out);
void silu_mul_row_scalar(const uint16_t* g, const uint16_t* u, int64_t n, uint16_t* out);

}  // namespace omni_w4a8
