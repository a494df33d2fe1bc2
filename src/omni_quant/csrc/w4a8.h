// omni-quant W4A8 kernel: shared declarations (no torch, no STL: the ISA files are compiled
// with AVX-512 / AVX2 code generation and must not emit inline copies of library functions).
#pragma once
#include <stdint.h>

namespace omni_w4a8 {

// Output channels per block: one 512-bit vector of int32 lanes (two 256-bit vectors on AVX2).
constexpr int64_t kBlockN = 16;

// Everything a kernel call needs. Layouts (see omni_quant/native.py):
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

}  // namespace omni_w4a8
