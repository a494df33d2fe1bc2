// Wall time inside the two linear ops (w4a8_linear, w4a8_linear_sb), summed over calls from any thread: what a
// decode step spends in the W4A8 GEMVs, read by omni_quant.kernels.w4a8.linear_clock() so that a benchmark can
// split a step into GEMV time and the rest without a profiler. Two steady_clock reads a call (tens of ns
// against a GEMV's tens of us).
#pragma once
#include <atomic>
#include <chrono>
#include <cstdint>

namespace omni_w4a8 {

extern std::atomic<int64_t> g_linear_ns, g_linear_calls;  // defined in linear_ops.cpp

struct LinearClock {
  std::chrono::steady_clock::time_point t0 = std::chrono::steady_clock::now();
  ~LinearClock() {
    const auto dt = std::chrono::steady_clock::now() - t0;
    g_linear_ns.fetch_add(std::chrono::duration_cast<std::chrono::nanoseconds>(dt).count(), std::memory_order_relaxed);
    g_linear_calls.fetch_add(1, std::memory_order_relaxed);
  }
};

}  // namespace omni_w4a8
