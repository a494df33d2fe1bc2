// The linear torch ops of omni_quant, as C++ functions (defined in linear_ops.cpp, registered in bindings.cpp).
// Layouts: omni_quant.kernels.w4a8.repack (per group) and repack_super_blocks; see w4a8.h.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

namespace omni_w4a8 {

// x bf16/float32 [M, K] -> [M, N] in x's dtype; w uint8 [N/16, K/8, 16, 4], sz bf16 [N/16, K/group_size, 2, 16].
at::Tensor w4a8_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sz, int64_t group_size,
                       const c10::optional<at::Tensor>& bias, c10::string_view isa_arg,
                       const c10::optional<at::Tensor>& dequant_rows);
// The per-group layout -> bf16 [N, K].
at::Tensor dequantize(const at::Tensor& w, const at::Tensor& sz, int64_t group_size, c10::string_view isa_arg);
// The super-block layout -> bf16 [N, K].
at::Tensor dequantize_sb(const at::Tensor& w, const at::Tensor& sb, c10::string_view isa_arg);

}  // namespace omni_w4a8
