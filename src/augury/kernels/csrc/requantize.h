// Q4_0 blocks with each block's scale fitted (augury/kernels/requantize.py, `fitted`, is the reference).
//
// For each divisor c of the grid the block is rounded at d = m / c (m: its value of largest
// magnitude), and the rounding's least-squares scale sum(x q) / sum(q^2) is kept where it leaves the
// least squared error. The rounding is float32 as torch does it (x * (c / m), round half to even,
// no contraction into fma); the sums are in double, where the 32 products of a float by a small
// integer add up exactly whatever the order (unless a block's values span more than about 2^26 in
// magnitude), so the choice and the scale equal the reference's bit for bit. Plain C++, run once at
// load: about 0.4 us a block a core for eight divisors (docs/benchmarks.md 35).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

namespace requantize {

constexpr int kBlock = 32;

// Round half to even for |v| < 2^22, as nearbyint does, without the libm call the library's baseline
// x86-64 target (no SSE4.1 round instruction) would make: adding 1.5 * 2^23 leaves no fraction bits.
inline float round_even(float v) {
  constexpr float kMagic = 12582912.0f;
  return (v + kMagic) - kMagic;  // strict IEEE (no -ffast-math): the compiler may not fold it away
}

// One block: x[32] -> out[18] (fp16 d, then values 0..15 in the low nibbles and 16..31 in the high).
inline void fit_q4_0_block(const float* x, const float* divisors, int n_divisors, uint8_t* out) {
  int top = 0;
  for (int i = 1; i < kBlock; ++i)
    if (std::fabs(x[i]) > std::fabs(x[top])) top = i;
  const float m = x[top];
  const float safe_m = m == 0.0f ? 1.0f : m;
  double x64[kBlock];
  for (int i = 0; i < kBlock; ++i) x64[i] = x[i];
  double best_gain = -1.0, best_d = 0.0;
  float level[kBlock], best[kBlock];
  for (int i = 0; i < kBlock; ++i) best[i] = 0.0f;
  for (int j = 0; j < n_divisors; ++j) {
    const float s = divisors[j] / safe_m;
    for (int i = 0; i < kBlock; ++i) {
      const float l = round_even(x[i] * s);
      level[i] = std::min(std::max(l, -8.0f), 7.0f);
    }
    // The sums as a tree of halves, each an elementwise loop the compiler vectorizes: exact in double
    // (products of a float by a small integer) and in float (squares of integers up to 64), so the
    // order does not change them.
    double xq[kBlock];
    float qq[kBlock];
    for (int i = 0; i < kBlock; ++i) {
      xq[i] = x64[i] * static_cast<double>(level[i]);
      qq[i] = level[i] * level[i];
    }
    for (int half = kBlock / 2; half >= 1; half /= 2)
      for (int i = 0; i < half; ++i) {
        xq[i] += xq[i + half];
        qq[i] += qq[i + half];
      }
    const double sum_xq = xq[0], sum_qq = qq[0];
    const double gain = sum_qq > 0.0 ? sum_xq * sum_xq / sum_qq : 0.0;
    if (gain > best_gain) {
      best_gain = gain;
      best_d = sum_qq > 0.0 ? sum_xq / sum_qq : 0.0;
      std::memcpy(best, level, sizeof(best));
    }
  }
  const at::Half d = m == 0.0f ? 0.0f : static_cast<float>(best_d);
  std::memcpy(out, &d, 2);
  for (int i = 0; i < kBlock / 2; ++i)
    out[2 + i] = static_cast<uint8_t>(static_cast<int>(best[i]) + 8) |
                 static_cast<uint8_t>((static_cast<int>(best[i + kBlock / 2]) + 8) << 4);
}

}  // namespace requantize
