// A greedy row's token: the first index of a row's largest value, as torch.argmax(-1) names it.
//
// Why here: torch's argmax walks a row one value at a time (83-115 us a 151,936-wide fp32 row on a
// Zen 5, where its amax takes 7 us), and a greedy step reads one row per token it verifies: 16 rows
// were 1.2-1.4 ms of a server's 16-sequence step (docs/benchmarks.md 42). Two passes that the
// compiler vectorises find the same index: the largest value by lanes, then the first place it occurs.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>

namespace argmax {

// GCC's vector types (x86's SSE, Arm's NEON, at the baseline every build has): written as plain loops over
// 16 lanes, GCC 12 kept the comparisons as branches and ran one value at a time (77 us a row).
typedef float F4 __attribute__((vector_size(16)));
typedef int32_t I4 __attribute__((vector_size(16)));
constexpr int kVecs = 4;  // vectors a chunk: four independent chains of comparisons
constexpr int64_t kChunk = 4 * kVecs;

inline F4 load4(const float* p) {
  F4 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline bool any_lane(I4 m) {
  int64_t lo, hi;
  std::memcpy(&lo, &m, 8);
  std::memcpy(&hi, reinterpret_cast<const char*>(&m) + 8, 8);
  return (lo | hi) != 0;
}

// The first i with x[i] the largest of x[0..n) (n >= 1); -1 where a value is NaN (torch names the
// first NaN there: the caller asks torch for that row). -0.0 and +0.0 are equal, as in torch's
// comparisons, so the first of them wins a tie.
inline int64_t first_largest(const float* x, int64_t n) {
  const float lowest = -std::numeric_limits<float>::infinity();
  F4 best[kVecs];
  I4 unordered[kVecs];
  for (int j = 0; j < kVecs; ++j) {
    best[j] = F4{lowest, lowest, lowest, lowest};
    unordered[j] = I4{0, 0, 0, 0};
  }
  int64_t i = 0;
  for (; i + kChunk <= n; i += kChunk)
    for (int j = 0; j < kVecs; ++j) {
      const F4 v = load4(x + i + 4 * j);
      best[j] = v > best[j] ? v : best[j];  // a NaN never replaces a lane's value...
      unordered[j] |= v != v;               // ...and is counted here instead
    }
  float top = lowest;
  bool nan = false;
  for (int j = 0; j < kVecs; ++j) {
    nan |= any_lane(unordered[j]);
    for (int l = 0; l < 4; ++l) top = best[j][l] > top ? best[j][l] : top;
  }
  for (int64_t t = i; t < n; ++t) {
    top = x[t] > top ? x[t] : top;
    nan |= x[t] != x[t];
  }
  if (nan) return -1;
  // The first occurrence: whole chunks are tested at once, the one that holds it value by value.
  const F4 tops = F4{top, top, top, top};
  for (i = 0; i + kChunk <= n; i += kChunk) {
    I4 hit = load4(x + i) == tops;
    for (int j = 1; j < kVecs; ++j) hit |= load4(x + i + 4 * j) == tops;
    if (any_lane(hit)) break;
  }
  for (; i < n; ++i)
    if (x[i] == top) return i;
  return -1;  // unreachable: top is one of the values
}

}  // namespace argmax
