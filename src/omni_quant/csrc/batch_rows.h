// The engine step's request boundaries, asked of Python (omni_quant.runtime.batch_rows) by the linear ops so
// that a request's numbers do not depend on the requests batched with it (C09). Defined in batch_rows.cpp.
#pragma once
#include <cstdint>
#include <vector>

namespace omni_w4a8 {

// {0, s1, ..., m}: the first row of each request among a call's m rows. Takes the GIL. On a Python error or
// a malformed answer, {0, m}, and the reason logged once.
std::vector<int64_t> sequence_bounds(int64_t m);

}  // namespace omni_w4a8
