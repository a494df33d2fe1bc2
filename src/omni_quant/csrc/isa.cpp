// The CPU's instruction set, read at run time: which W4A8 kernel runs (isa.h).
#include "isa.h"

#include <c10/util/Exception.h>

namespace omni_w4a8 {

bool supported(const std::string& isa) {
  __builtin_cpu_init();
  if (isa == "scalar") return true;
  if (isa == "avx2")  // f16c: the super-block layout's fp16 scales (every AVX2 CPU has it)
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (isa == "avx2vnni") return supported("avx2") && __builtin_cpu_supports("avxvnni");
  if (isa == "avx512vnni")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni") &&
           __builtin_cpu_supports("fma");
  return false;
}

std::string best_isa() {
  static const std::string best = [] {  // the CPU does not change: resolve once, not on every call
    for (const char* isa : {"avx512vnni", "avx2vnni", "avx2"})
      if (supported(isa)) return std::string(isa);
    return std::string("scalar");
  }();
  return best;
}

std::string resolve_isa(c10::string_view isa_arg) {
  std::string isa(isa_arg.data(), isa_arg.size());
  if (isa == "auto") isa = best_isa();
  TORCH_CHECK(supported(isa), "omni_quant: this CPU cannot run the '", isa,
              "' kernel (choose one of omni_quant.kernels.w4a8.supported_isas())");
  return isa;
}

}  // namespace omni_w4a8
