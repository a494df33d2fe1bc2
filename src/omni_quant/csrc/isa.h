// Which of omni's kernels this CPU runs: read at run time (__builtin_cpu_supports), never at build time.
// Defined in isa.cpp; used by the linear ops (linear_ops.cpp), the fused layers and the bindings.
#pragma once
#include <c10/util/string_view.h>

#include <string>

namespace omni_w4a8 {

// Whether this CPU can run the kernel of `isa` ("avx512vnni", "avx2vnni", "avx2", "scalar").
bool supported(const std::string& isa);
// The fastest kernel this CPU runs (resolved once).
std::string best_isa();
// `isa_arg` ("auto" or a name) as a kernel this CPU runs; a TORCH_CHECK error names the choices otherwise.
std::string resolve_isa(c10::string_view isa_arg);

}  // namespace omni_w4a8
