// The two halves of a Llama-family decoder layer around its attention, each one torch op:
//
//   omni_quant::norm_qkv_rope: (residual +) hidden -> RMSNorm -> QKV projection (+ bias) -> rotary
//                              embedding of q and k; returns (qkv, residual)
//   omni_quant::o_mlp:         attention output -> o_proj -> + residual -> RMSNorm -> gate_up -> SiLU * up
//                              -> down_proj; returns (hidden, residual)
//
// Why: a decode step of a 28-layer model runs about ten small ops per layer between the W4A8 GEMVs
// (norms, rotary embedding, SiLU, views, allocations), each a call from inductor's Python wrapper; on two
// cores those calls cost milliseconds a token (omni_quant/runtime/fused_layers.py). The arithmetic is vLLM 0.28's,
// in the order inductor computes it for bf16 (float32 inside a fused kernel, one rounding to bf16 where the
// eager code rounds): RMSNorm and fused add + RMSNorm as vllm/ir/ops/layernorm.py, rotary embedding as
// RotaryEmbedding.forward_static (vllm/model_executor/layers/rotary_embedding/base.py, common.py),
// SiLU-and-mul as SiluAndMul.forward_native (vllm/model_executor/layers/activation.py). The projections are
// omni_quant::w4a8_linear_sb itself (linear_sb.h), so their bits are the unfused path's.
// The row kernels (RMSNorm, SiLU-and-mul) are in layer_rows_<isa>.cpp (declared in w4a8.h), each built for its
// instruction set as the GEMMs of gemm_<isa>.cpp are.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <c10/util/Exception.h>
#include <torch/library.h>

#include <cmath>
#include <cstring>
#include <tuple>
#include <vector>

#include "linear_sb.h"
#include "w4a8.h"

namespace omni_w4a8 {
namespace {

// bf16 bits -> float (the rotary embedding's plain C++; the row kernels are in the ISA files, w4a8.h).
inline float bf2f(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// float -> bf16 bits, round to nearest even, a NaN kept a quiet NaN (as c10::BFloat16).
inline uint16_t f2bf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
  return static_cast<uint16_t>((u & 0x7fffffffu) > 0x7f800000u ? ((u >> 16) | 0x40u) : rounded);
}

// The row kernels for the op's `isa` argument, as for the linear op (omni_quant.kernels.w4a8.linear): "scalar" the plain
// C++ ones, "avx2" (and "avx2vnni") the AVX2 ones, anything else ("auto", "avx512vnni") the best this CPU runs (its
// flags read once). An ISA the CPU lacks falls to the best it has (the linear op itself refuses it by name).
struct RowFns {
  void (*add_rms)(const uint16_t*, const uint16_t*, const uint16_t*, float, int64_t, uint16_t*, uint16_t*);
  void (*silu_mul)(const uint16_t*, const uint16_t*, int64_t, uint16_t*);
};

const RowFns& row_fns(c10::string_view isa) {
  static const RowFns scalar{add_rms_row_scalar, silu_mul_row_scalar};
  static const RowFns avx2{add_rms_row_avx2, silu_mul_row_avx2};
  static const RowFns avx512{add_rms_row_avx512, silu_mul_row_avx512};
  static const bool has_avx2 = (__builtin_cpu_init(), __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
  static const bool has_avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                                 __builtin_cpu_supports("avx512vl");  // gemm_avx512.cpp's rows need F, BW, VL
  if (isa == "scalar" || !has_avx2) return scalar;
  if (isa == "avx2" || isa == "avx2vnni" || !has_avx512) return avx2;
  return avx512;
}

// Rotary embedding of `heads` heads of one token in place: x [heads, head_size] bf16, cos/sin [rot/2] float.
void rope_heads(uint16_t* x, int64_t heads, int64_t head_size, int64_t rot, bool neox, const float* cos,
                const float* sin) {
  const int64_t half = rot / 2;
  for (int64_t h = 0; h < heads; ++h) {
    uint16_t* q = x + h * head_size;
    for (int64_t j = 0; j < half; ++j) {
      const int64_t i1 = neox ? j : 2 * j, i2 = neox ? j + half : 2 * j + 1;
      const float x1 = bf2f(q[i1]), x2 = bf2f(q[i2]);
      q[i1] = f2bf(x1 * cos[j] - x2 * sin[j]);
      q[i2] = f2bf(x2 * cos[j] + x1 * sin[j]);
    }
  }
}

// fn(r0, r1) over rows [0, m): inline for a few rows (a decode step's: a parallel region costs more than the
// row), across torch's threads otherwise.
template <class Fn>
void for_rows(int64_t m, const Fn& fn) {
  if (m < 8) return fn(0, m);
  at::parallel_for(0, m, 1, fn);
}

const uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr()); }
uint16_t* bits_out(at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

void check_bf16_rows(const at::Tensor& t, const char* name, const char* op) {
  TORCH_CHECK(t.dim() == 2 && t.scalar_type() == at::kBFloat16, op, ": ", name,
              " must be a bfloat16 [tokens, features] tensor, got ", t.scalar_type(), " ", t.sizes());
}

void check_norm_weight(const at::Tensor& w, int64_t n, const char* op) {
  TORCH_CHECK(w.dim() == 1 && w.size(0) == n && w.scalar_type() == at::kBFloat16 && w.is_contiguous(), op,
              ": the RMSNorm weight must be contiguous bfloat16 [", n, "], got ", w.scalar_type(), " ", w.sizes());
}

// (residual_out, normed) of rows x (+ residual): fused add + RMSNorm, rows in parallel.
std::tuple<at::Tensor, at::Tensor> add_rms(const at::Tensor& x, const c10::optional<at::Tensor>& residual,
                                           const at::Tensor& weight, double eps, const RowFns& fns, const char* op) {
  const int64_t m = x.size(0), n = x.size(1);
  check_norm_weight(weight, n, op);
  at::Tensor r;
  if (residual.has_value() && residual->defined()) {
    r = residual->contiguous();
    check_bf16_rows(r, "residual", op);
    TORCH_CHECK(r.sizes() == x.sizes(), op, ": residual is ", r.sizes(), " but hidden_states is ", x.sizes());
  }
  at::Tensor res_out = at::empty_like(x), out = at::empty_like(x);
  const uint16_t *xp = bits(x), *rp = r.defined() ? bits(r) : nullptr, *wp = bits(weight);
  uint16_t *ro = bits_out(res_out), *op_ = bits_out(out);
  const float e = static_cast<float>(eps);
  for_rows(m, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i)
      fns.add_rms(xp + i * n, rp ? rp + i * n : nullptr, wp, e, n, ro + i * n, op_ + i * n);
  });
  return {res_out, out};
}

std::tuple<at::Tensor, at::Tensor> norm_qkv_rope(
    const at::Tensor& hidden_in, const c10::optional<at::Tensor>& residual, const at::Tensor& norm_weight, double eps,
    const at::Tensor& w, const at::Tensor& sb, const c10::optional<at::Tensor>& bias,
    const c10::optional<at::Tensor>& dequant_rows, const at::Tensor& positions, const at::Tensor& cos_sin_cache,
    int64_t num_heads, int64_t num_kv_heads, int64_t head_size, int64_t rotary_dim, bool is_neox,
    c10::string_view isa) {
  const char* op = "omni_quant.norm_qkv_rope";
  const at::Tensor hidden = hidden_in.contiguous();
  check_bf16_rows(hidden, "hidden_states", op);
  const int64_t m = hidden.size(0);
  TORCH_CHECK(positions.dim() == 1 && positions.size(0) == m && positions.scalar_type() == at::kLong, op,
              ": positions must be int64 [", m, "], got ", positions.scalar_type(), " ", positions.sizes());
  TORCH_CHECK(rotary_dim > 0 && rotary_dim % 2 == 0 && rotary_dim <= head_size, op, ": rotary_dim ", rotary_dim,
              " must be even and in (0, head_size=", head_size, "]");
  TORCH_CHECK(cos_sin_cache.dim() == 2 && cos_sin_cache.size(1) == rotary_dim &&
                  (cos_sin_cache.scalar_type() == at::kBFloat16 || cos_sin_cache.scalar_type() == at::kFloat),
              op, ": cos_sin_cache must be bfloat16 or float32 [max_positions, ", rotary_dim, "], got ",
              cos_sin_cache.scalar_type(), " ", cos_sin_cache.sizes());
  auto [res_out, normed] = add_rms(hidden, residual, norm_weight, eps, row_fns(isa), op);
  at::Tensor qkv = w4a8_linear_sb(normed, w, sb, bias, isa, dequant_rows);
  const int64_t width = (num_heads + 2 * num_kv_heads) * head_size;
  TORCH_CHECK(qkv.size(1) == width, op, ": the projection gives ", qkv.size(1), " features, but ", num_heads,
              " + 2 x ", num_kv_heads, " heads of ", head_size, " need ", width);
  const at::Tensor cache = cos_sin_cache.contiguous(), pos_t = positions.contiguous();
  const int64_t max_pos = cache.size(0), half = rotary_dim / 2;
  const int64_t* pos = pos_t.data_ptr<int64_t>();
  for (int64_t t = 0; t < m; ++t)
    TORCH_CHECK(pos[t] >= 0 && pos[t] < max_pos, op, ": position ", pos[t], " of token ", t,
                " is outside the rotary cache's ", max_pos, " positions");
  const bool cache_bf16 = cache.scalar_type() == at::kBFloat16;
  const void* cs = cache.data_ptr();
  uint16_t* qp = bits_out(qkv);
  for_rows(m, [&](int64_t t0, int64_t t1) {
    std::vector<float> cos_sin(rotary_dim);  // this token's cos and sin as float (the cache row, bf16 or float)
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t j = 0; j < rotary_dim; ++j)
        cos_sin[j] = cache_bf16 ? bf2f(static_cast<const uint16_t*>(cs)[pos[t] * rotary_dim + j])
                                : static_cast<const float*>(cs)[pos[t] * rotary_dim + j];
      rope_heads(qp + t * width, num_heads + num_kv_heads, head_size, rotary_dim, is_neox, cos_sin.data(),
                 cos_sin.data() + half);
    }
  });
  return {qkv, res_out};
}

std::tuple<at::Tensor, at::Tensor> o_mlp(
    const at::Tensor& attn_in, const at::Tensor& residual, const at::Tensor& wo, const at::Tensor& sbo,
    const c10::optional<at::Tensor>& bias_o, const c10::optional<at::Tensor>& rows_o, const at::Tensor& norm_weight,
    double eps, const at::Tensor& wgu, const at::Tensor& sbgu, const c10::optional<at::Tensor>& rows_gu,
    const at::Tensor& wd, const at::Tensor& sbd, const c10::optional<at::Tensor>& rows_d, c10::string_view isa) {
  const char* op = "omni_quant.o_mlp";
  const at::Tensor attn = attn_in.contiguous();
  check_bf16_rows(attn, "the attention output", op);
  const at::Tensor o = w4a8_linear_sb(attn, wo, sbo, bias_o, isa, rows_o);
  const RowFns& fns = row_fns(isa);
  auto [res_out, normed] = add_rms(o, residual, norm_weight, eps, fns, op);
  const at::Tensor gu = w4a8_linear_sb(normed, wgu, sbgu, c10::nullopt, isa, rows_gu);
  TORCH_CHECK(gu.size(1) % 2 == 0, op, ": gate_up gives an odd number of features (", gu.size(1), ")");
  const int64_t m = gu.size(0), inter = gu.size(1) / 2;
  at::Tensor act = at::empty({m, inter}, gu.options());
  const uint16_t* g = bits(gu);
  uint16_t* a = bits_out(act);
  for_rows(m, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0; i < r1; ++i) fns.silu_mul(g + i * 2 * inter, g + i * 2 * inter + inter, inter, a + i * inter);
  });
  return {w4a8_linear_sb(act, wd, sbd, c10::nullopt, isa, rows_d), res_out};
}

}  // namespace
}  // namespace omni_w4a8

TORCH_LIBRARY_FRAGMENT(omni_quant, m) {
  m.def("norm_qkv_rope(Tensor hidden_states, Tensor? residual, Tensor norm_weight, float eps, Tensor w, Tensor sb, "
        "Tensor? bias, Tensor? dequant_rows, Tensor positions, Tensor cos_sin_cache, int num_heads, "
        "int num_kv_heads, int head_size, int rotary_dim, bool is_neox, str isa='auto') -> (Tensor, Tensor)");
  m.def("o_mlp(Tensor attn, Tensor residual, Tensor wo, Tensor sbo, Tensor? bias_o, Tensor? rows_o, "
        "Tensor norm_weight, float eps, Tensor wgu, Tensor sbgu, Tensor? rows_gu, Tensor wd, Tensor sbd, "
        "Tensor? rows_d, str isa='auto') -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(omni_quant, CPU, m) {
  m.impl("norm_qkv_rope", &omni_w4a8::norm_qkv_rope);
  m.impl("o_mlp", &omni_w4a8::o_mlp);
}
