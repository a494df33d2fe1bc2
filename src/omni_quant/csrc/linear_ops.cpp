// The linear torch ops of omni_quant (linear_ops.h): the W4A8 GEMM on the per-group and the super-block layouts,
// their dequantization, and the switch to a bf16 GEMM for long requests; the kernel the CPU runs (isa.h) picks
// the ISA file's functions (w4a8.h). Registered in bindings.cpp.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <c10/util/Exception.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <vector>

#include "batch_rows.h"
#include "isa.h"
#include "linear_clock.h"
#include "linear_ops.h"
#include "linear_sb.h"
#include "w4a8.h"

namespace omni_w4a8 {

std::atomic<int64_t> g_linear_ns{0}, g_linear_calls{0};

namespace {

using GemmFn = void (*)(const Args&, int64_t, int64_t);
using QuantFn = void (*)(const QuantArgs&, int64_t, int64_t);
using DequantFn = void (*)(const DequantArgs&, int64_t, int64_t);

void pick(const std::string& isa, GemmFn* gemm, QuantFn* quant, DequantFn* dequant) {
  if (isa == "avx512vnni") {
    *gemm = gemm_avx512vnni;
    *quant = quantize_rows_avx2;  // AVX-512 CPUs run the AVX2 quantizer: the GEMM is what differs
    *dequant = dequantize_avx512;
  } else if (isa == "avx2vnni") {
    *gemm = gemm_avx2vnni;
    *quant = quantize_rows_avx2;
    *dequant = dequantize_avx2;
  } else if (isa == "avx2") {
    *gemm = gemm_avx2;
    *quant = quantize_rows_avx2;
    *dequant = dequantize_avx2;
  } else {
    *gemm = gemm_scalar;
    *quant = quantize_rows_scalar;
    *dequant = dequantize_scalar;
  }
}

// Degenerate shapes are refused before any arithmetic: K = 0 would divide by zero in the kernels
// (SIGFPE), N = 0 leaves nothing to compute. k is x's K (or w's, for dequantization).
void check_sizes(const at::Tensor& w, int64_t k) {
  TORCH_CHECK(k > 0, "omni_quant: K (input channels) must be positive, got K=", k);
  TORCH_CHECK(w.size(0) > 0, "omni_quant: N (output channels) must be positive, got w of shape ", w.sizes(),
              " (N/16 = ", w.size(0), ")");
}

void check_weights(const at::Tensor& w, const at::Tensor& sz, int64_t k, int64_t group_size) {
  TORCH_CHECK(w.dim() == 4 && w.scalar_type() == at::kByte && w.size(2) == kBlockN && w.size(3) == 4 &&
                  w.is_contiguous(),
              "omni_quant: w must be contiguous uint8 [N/16, K/8, 16, 4] (omni_quant.kernels.w4a8.repack)");
  check_sizes(w, k);
  TORCH_CHECK(w.size(1) * 8 == k, "omni_quant: x has K=", k, " but w was packed for K=", w.size(1) * 8);
  TORCH_CHECK(group_size % 16 == 0 && group_size > 0 && group_size <= 256 && k % group_size == 0,
              "omni_quant: group_size ", group_size, " must be a positive multiple of 16, <= 256, dividing K=", k);
  TORCH_CHECK(sz.scalar_type() == at::kBFloat16 && sz.is_contiguous() && sz.dim() == 4 &&
                  sz.size(0) == w.size(0) && sz.size(1) == k / group_size && sz.size(2) == 2 && sz.size(3) == kBlockN,
              "omni_quant: sz must be contiguous bfloat16 [N/16, K/group_size, 2, 16] = [", w.size(0), ", ",
              k / group_size, ", 2, 16] (got ", sz.sizes(), "; is group_size=", group_size, " the one it was packed with?)");
}

// The kernel's layout -> bf16 [N, K] into `out` (the caller's tensor, or the prefill scratch).
at::Tensor dequantize_into(const at::Tensor& w, const at::Tensor& sz, int64_t group_size, const std::string& isa,
                           at::Tensor out) {
  const int64_t k = w.size(1) * 8;
  GemmFn gemm;
  QuantFn quant;
  DequantFn dq;
  pick(isa, &gemm, &quant, &dq);
  DequantArgs d{w.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(sz.data_ptr()),
                reinterpret_cast<uint16_t*>(out.data_ptr()), k, group_size};
  at::parallel_for(0, w.size(0), 1, [&](int64_t b0, int64_t b1) { dq(d, b0, b1); });
  return out;
}

}  // namespace

at::Tensor dequantize(const at::Tensor& w, const at::Tensor& sz, int64_t group_size, c10::string_view isa_arg) {
  const std::string isa = resolve_isa(isa_arg);
  TORCH_CHECK(w.dim() == 4, "omni_quant: w must be contiguous uint8 [N/16, K/8, 16, 4] (omni_quant.kernels.w4a8.repack)");
  check_weights(w, sz, w.size(1) * 8, group_size);
  return dequantize_into(w, sz, group_size, isa,
                         at::empty({w.size(0) * kBlockN, w.size(1) * 8}, w.options().dtype(at::kBFloat16)));
}

namespace {

// One bf16 buffer for the prefill path, reused across calls and layers and grown to the largest
// layer that takes the path: a fresh allocation of tens of MiB per call costs its page faults
// (measured: 20 ms to dequantize Qwen2.5-1.5B's gate_up_proj into new memory). Engines call a
// layer at a time; the mutex keeps concurrent callers (tests) correct.
std::mutex scratch_mutex;
at::Tensor scratch;

at::Tensor scratch_for(int64_t n, int64_t k) {
  if (!scratch.defined() || scratch.numel() < n * k) scratch = at::empty({n * k}, at::TensorOptions().dtype(at::kBFloat16));
  return scratch.narrow(0, 0, n * k).view({n, k});
}

// How many equal pieces to cut each activation row into for quantization: 1 when the rows alone
// keep the threads busy or the row is short; else the largest count <= the threads that divides
// the groups and leaves each piece at least kMinPieceElems elements.
constexpr int64_t kMinPieceElems = 2048;

int64_t quant_pieces(int64_t m, int64_t groups, int64_t group_size) {
  const int64_t threads = at::get_num_threads();
  if (m >= threads) return 1;
  for (int64_t p = threads; p > 1; --p)
    if (groups % p == 0 && (groups / p) * group_size >= kMinPieceElems) return p;
  return 1;
}

// One allocation for a call's quantized activations (an allocator call each cost about 1.5 us at
// decode, 5 per layer): int8 xq [M, K], then float xs and xf, int32 xsum [M, groups], and for the
// super-block layout int16 bsum [M, K / 32], each 64-byte aligned.
struct QuantBuffers {
  at::Tensor storage;
  int8_t* xq;
  float* xs;
  float* xf;
  int32_t* xsum;
  int16_t* bsum;

  QuantBuffers(const at::Tensor& like, int64_t m, int64_t k, int64_t groups, bool sub_sums) {
    auto up = [](int64_t bytes) { return (bytes + 63) / 64 * 64; };
    const int64_t a = up(m * k), b = up(m * groups * 4), bs = sub_sums ? up(m * (k / kSubBlock) * 2) : 0;
    storage = at::empty({a + 3 * b + bs + 64}, like.options().dtype(at::kByte));
    uint8_t* p = storage.data_ptr<uint8_t>();
    p += (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64;
    xq = reinterpret_cast<int8_t*>(p);
    xs = reinterpret_cast<float*>(p + a);
    xf = reinterpret_cast<float*>(p + a + b);
    xsum = reinterpret_cast<int32_t*>(p + a + 2 * b);
    bsum = sub_sums ? reinterpret_cast<int16_t*>(p + a + 3 * b) : nullptr;
  }
};

// The W4A8 kernel on x [M, K] into out [M, N] (contiguous rows of the caller's tensors); bias
// float32 [N] or undefined.
void native_into(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sz, int64_t group_size,
                 const at::Tensor& b, const std::string& isa, at::Tensor out) {
  const int64_t m = x.size(0), k = x.size(1), n = out.size(1), groups = k / group_size;
  if (m == 0) return;
  QuantBuffers buf(x, m, k, groups, false);

  GemmFn gemm;
  QuantFn quant;
  DequantFn dq;
  pick(isa, &gemm, &quant, &dq);
  // Groups are quantized independently, and a row of K is laid out as `pieces` rows of K / pieces
  // (x, xq row-major; xs, xsum, xf [M, groups]): at decode (M = 1) a long row is split across the
  // threads instead of running on one while the others wait (down_proj, K = 8960: 280 groups).
  const int64_t pieces = quant_pieces(m, groups, group_size);
  QuantArgs qa{x.data_ptr(), x.scalar_type() == at::kBFloat16 ? 1 : 0, buf.xq, buf.xs, buf.xsum, buf.xf, k / pieces,
               group_size, nullptr};
  at::parallel_for(0, m * pieces, pieces > 1 ? 1 : std::max<int64_t>(1, 65536 / k),
                   [&](int64_t r0, int64_t r1) { quant(qa, r0, r1); });

  Args a{w.data_ptr<uint8_t>(), reinterpret_cast<const uint16_t*>(sz.data_ptr()), buf.xq, buf.xs, buf.xsum, buf.xf,
         b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr(), m, n, k, group_size,
         x.scalar_type() == at::kBFloat16 ? 1 : 0};
  at::parallel_for(0, w.size(0), 1, [&](int64_t b0, int64_t b1) { gemm(a, b0, b1); });
}

int64_t dequant_min_rows_of(const c10::optional<at::Tensor>& dequant_rows, const char* op) {
  // A tensor, not an int: a compiled graph then reads the measured row count at run time
  // instead of baking the value it was traced with into the cached artifact.
  if (!dequant_rows.has_value() || !dequant_rows->defined()) return 0;
  TORCH_CHECK(dequant_rows->numel() == 1 && dequant_rows->scalar_type() == at::kLong, op,
              ": dequant_rows must be one int64");
  return dequant_rows->item<int64_t>();
}

at::Tensor float_bias(const c10::optional<at::Tensor>& bias, int64_t n, const char* op) {
  at::Tensor b;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == n, op, ": bias has ", bias->numel(), " elements, N=", n);
    b = bias->to(at::kFloat).contiguous();
  }
  return b;
}

void check_x(const at::Tensor& x, const char* op) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), op, ": x must be a contiguous [M, K] tensor");
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, op,
              ": x must be bfloat16 or float32, got ", x.scalar_type());
}

// x [M, K] -> out [M, N] by `native(r0, r1)` (the integer kernel on rows [r0, r1) into out) or, for
// the rows of a request of at least dequant_min_rows rows (0: never), a bf16 GEMM on the weight that
// `dequant(scratch)` writes into the prefill scratch: many rows make the GEMM compute-bound, and a
// bf16 GEMM (AMX / AVX512-BF16 where the CPU has them) can beat the integer kernel. Chosen per
// sequence, not for the call's rows, so a request's numbers do not depend on the requests it is
// batched with (omni_quant/runtime/batch_rows.py).
template <class Native, class Dequant>
void switched_into(const at::Tensor& x, const at::Tensor& b, int64_t dequant_min_rows, at::Tensor out,
                   Native native, Dequant dequant) {
  const int64_t m = x.size(0), k = x.size(1), n = out.size(1);
  if (m == 0) return;
  if (dequant_min_rows > 0 && m >= dequant_min_rows) {
    const std::vector<int64_t> bounds = sequence_bounds(m);
    bool any_long = false;
    for (size_t i = 1; i < bounds.size(); ++i) any_long = any_long || bounds[i] - bounds[i - 1] >= dequant_min_rows;
    if (any_long) {
      std::lock_guard<std::mutex> guard(scratch_mutex);
      at::Tensor wd = dequant(scratch_for(n, k));
      c10::optional<at::Tensor> b16;
      if (b.defined()) b16 = b.to(at::kBFloat16);
      int64_t short_from = -1;  // first row of the pending run of short requests
      for (size_t i = 1; i < bounds.size(); ++i) {
        const int64_t r0 = bounds[i - 1], rows = bounds[i] - r0;
        if (rows < dequant_min_rows) {
          if (short_from < 0) short_from = r0;
          continue;
        }
        if (short_from >= 0) native(short_from, r0);
        short_from = -1;
        out.narrow(0, r0, rows).copy_(at::linear(x.narrow(0, r0, rows).to(at::kBFloat16), wd, b16));
      }
      if (short_from >= 0) native(short_from, m);
      return;
    }
  }
  native(0, m);
}

}  // namespace

at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sz, int64_t group_size,
                       const c10::optional<at::Tensor>& bias, c10::string_view isa_arg,
                       const c10::optional<at::Tensor>& dequant_rows) {
  const char* op = "omni_quant.w4a8_linear";
  const LinearClock clock;
  const std::string isa = resolve_isa(isa_arg);
  check_x(x, op);
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0) * kBlockN;
  check_weights(w, sz, k, group_size);
  const at::Tensor b = float_bias(bias, n, op);
  at::Tensor out = at::empty({m, n}, x.options());
  switched_into(
      x, b, dequant_min_rows_of(dequant_rows, op), out,
      [&](int64_t r0, int64_t r1) {
        if (r0 == 0 && r1 == m) return native_into(x, w, sz, group_size, b, isa, out);  // no narrow: decode's path
        native_into(x.narrow(0, r0, r1 - r0), w, sz, group_size, b, isa, out.narrow(0, r0, r1 - r0));
      },
      [&](at::Tensor scratch) { return dequantize_into(w, sz, group_size, isa, scratch); });
  return out;
}

namespace {

// ---- The super-block layout (w4a8.h, SbArgs) ------------------------------------------------------

// Its kernels: the AVX-512 VNNI one where asked for, the AVX2 one on every other AVX2 CPU (AVX-VNNI
// ones included), else plain C++; dequantization likewise. Activations: the AVX2 quantizer on every AVX2 CPU.
bool sb_vector(const std::string& isa) { return isa != "scalar"; }
using SbGemmFn = void (*)(const SbArgs&, int64_t, int64_t);
SbGemmFn sb_gemm(const std::string& isa) {
  if (isa == "avx512vnni") return gemm_sb_avx512vnni;
  return sb_vector(isa) ? gemm_sb_avx2 : gemm_sb_scalar;
}

void check_sb(const at::Tensor& w, const at::Tensor& sb, int64_t k) {
  TORCH_CHECK(w.dim() == 4 && w.scalar_type() == at::kByte && w.size(2) == kBlockN && w.size(3) == 4 &&
                  w.is_contiguous(),
              "omni_quant: w must be contiguous uint8 [N/16, K/8, 16, 4] (omni_quant.kernels.w4a8.repack_super_blocks)");
  check_sizes(w, k);
  TORCH_CHECK(w.size(1) * 8 == k, "omni_quant: x has K=", k, " but w was packed for K=", w.size(1) * 8);
  TORCH_CHECK(k % kSuperBlock == 0, "omni_quant: the super-block layout needs K a multiple of 256, got K=", k);
  TORCH_CHECK(sb.scalar_type() == at::kByte && sb.is_contiguous() && sb.dim() == 3 && sb.size(0) == w.size(0) &&
                  sb.size(1) == k / kSuperBlock && sb.size(2) == kSbBytes,
              "omni_quant: sb must be contiguous uint8 [N/16, K/256, ", kSbBytes, "] = [", w.size(0), ", ",
              k / kSuperBlock, ", ", kSbBytes, "] (got ", sb.scalar_type(), " ", sb.sizes(),
              sb.is_contiguous() ? "" : ", not contiguous", ")");
}

at::Tensor dequantize_sb_into(const at::Tensor& w, const at::Tensor& sb, const std::string& isa, at::Tensor out) {
  SbDequantArgs d{w.data_ptr<uint8_t>(), sb.data_ptr<uint8_t>(), reinterpret_cast<uint16_t*>(out.data_ptr()),
                  w.size(1) * 8};
  auto fn = isa == "avx512vnni" ? dequantize_sb_avx512 : sb_vector(isa) ? dequantize_sb_avx2 : dequantize_sb_scalar;
  at::parallel_for(0, w.size(0), 1, [&](int64_t b0, int64_t b1) { fn(d, b0, b1); });
  return out;
}

}  // namespace

at::Tensor dequantize_sb(const at::Tensor& w, const at::Tensor& sb, c10::string_view isa_arg) {
  const std::string isa = resolve_isa(isa_arg);
  TORCH_CHECK(w.dim() == 4, "omni_quant: w must be contiguous uint8 [N/16, K/8, 16, 4]");
  check_sb(w, sb, w.size(1) * 8);
  return dequantize_sb_into(w, sb, isa, at::empty({w.size(0) * kBlockN, w.size(1) * 8}, w.options().dtype(at::kBFloat16)));
}

namespace {

// Activations quantized per (row, super-block): each super-block is independent, so [M, K] is
// quantized as M * K / 256 rows of 256 (decode's one row spreads over the threads as well).
void native_sb_into(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sb, const at::Tensor& b,
                    const std::string& isa, at::Tensor out) {
  const int64_t m = x.size(0), k = x.size(1), n = out.size(1), sbs = k / kSuperBlock;
  if (m == 0) return;
  QuantBuffers buf(x, m, k, sbs, true);
  QuantArgs qa{x.data_ptr(), x.scalar_type() == at::kBFloat16 ? 1 : 0, buf.xq, buf.xs, buf.xsum, buf.xf, kSuperBlock,
               kSuperBlock, buf.bsum};
  auto quant = sb_vector(isa) ? quantize_rows_avx2 : quantize_rows_scalar;
  at::parallel_for(0, m * sbs, kMinPieceElems / kSuperBlock, [&](int64_t r0, int64_t r1) { quant(qa, r0, r1); });
  SbArgs a{w.data_ptr<uint8_t>(), sb.data_ptr<uint8_t>(), buf.xq, buf.xs, buf.bsum,
           b.defined() ? b.data_ptr<float>() : nullptr, out.data_ptr(), m, n, k, x.scalar_type() == at::kBFloat16 ? 1 : 0};
  const SbGemmFn gemm = sb_gemm(isa);
  at::parallel_for(0, w.size(0), 1, [&](int64_t b0, int64_t b1) { gemm(a, b0, b1); });
}

}  // namespace

// Declared in linear_sb.h: the fused decoder-layer ops (fused_layer_ops.cpp) call it directly.
at::Tensor w4a8_linear_sb(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sb,
                          const c10::optional<at::Tensor>& bias, c10::string_view isa_arg,
                          const c10::optional<at::Tensor>& dequant_rows) {
  const char* op = "omni_quant.w4a8_linear_sb";
  const LinearClock clock;
  const std::string isa = resolve_isa(isa_arg);
  check_x(x, op);
  const int64_t m = x.size(0), k = x.size(1), n = w.size(0) * kBlockN;
  check_sb(w, sb, k);
  const at::Tensor b = float_bias(bias, n, op);
  at::Tensor out = at::empty({m, n}, x.options());
  switched_into(
      x, b, dequant_min_rows_of(dequant_rows, op), out,
      [&](int64_t r0, int64_t r1) {
        if (r0 == 0 && r1 == m) return native_sb_into(x, w, sb, b, isa, out);  // no narrow: decode's path
        native_sb_into(x.narrow(0, r0, r1 - r0), w, sb, b, isa, out.narrow(0, r0, r1 - r0));
      },
      [&](at::Tensor scratch) { return dequantize_sb_into(w, sb, isa, scratch); });
  return out;
}

}  // namespace omni_w4a8

