// omni_quant::w4a8_linear_sb as a C++ function, for the other translation units of the extension
// (fused_layer_ops.cpp calls it without a dispatcher round trip). Defined in linear_ops.cpp.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/util/Optional.h>
#include <c10/util/string_view.h>

namespace omni_w4a8 {

// x bf16/float32 [M, K] contiguous -> [M, N] in x's dtype; w, sb the super-block layout
// (omni_quant.kernels.w4a8.repack_super_blocks); bias optional [N]; dequant_rows optional int64 [1]
// (rows from which a request takes the dequantize + bf16 GEMM path; 0 or none: never).
at::Tensor w4a8_linear_sb(const at::Tensor& x, const at::Tensor& w, const at::Tensor& sb,
                          const c10::optional<at::Tensor>& bias, c10::string_view isa_arg,
                          const c10::optional<at::Tensor>& dequant_rows);

}  // namespace omni_w4a8
