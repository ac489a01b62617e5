// The two pieces of ATen/Parallel.h the kernel and layer bodies use, over OpenMP, so that
// portable_check.cpp compiles them without torch (for a cross-compiled build on another CPU).
#pragma once

#include <omp.h>

#include <cstdint>

namespace at {

inline int get_num_threads() { return omp_get_max_threads(); }

// f(begin, end) over chunks of [begin, end) on the OpenMP threads (grain ignored: the bodies pass 1).
template <typename F>
void parallel_for(int64_t begin, int64_t end, int64_t /*grain*/, const F& f) {
#pragma omp parallel for schedule(static, 1)
  for (int64_t i = begin; i < end; ++i) f(i, i + 1);
}

}  // namespace at
