// Time-stamp cycles per sub-block (32 inputs x 16 columns) of one instruction set's GGUF tile loop,
// without torch or Python: the kernel body on synthetic packed tiles, the best of many passes. A
// buffer that fits in L2 measures the loop's arithmetic, far steadier on a shared VM than a whole
// forward; a buffer of hundreds of MB measures the stream from memory.
//
//   g++ -std=c++17 -O3 -fopenmp -ffp-contract=off -Wno-psabi -Itests/cross/shim \
//       -Isrc/augury/kernels/csrc scripts/kernel_cycles.cpp -o /tmp/kernel_cycles
//   OMP_NUM_THREADS=1 /tmp/kernel_cycles KIND BYTES ROWS PASSES [ISA]   (KIND: 5 Q4_K, 7 Q6_K; see common.h)
//
// Point -I at two copies of csrc/ to compare an old and a new loop, alternating runs. ISA: avx2 (the
// default), avxvnni or avx512, where the CPU runs it.
#include <immintrin.h>
#include <omp.h>
#include <x86intrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "common.h"
#include "ops_portable.h"
#include "ops_avx2.h"
#include "ops_avxvnni.h"
#include "ops_avx512.h"

struct Timing {
  double per_sub;  // cycles a sub-block, all rows
  double kb;       // the tiles' size
};

// The best pass of one body's tile loop (Quant: that body's QuantBuffers; fn: its tile function).
template <class Quant, class TileFn>
static Timing cycles(TileFn fn, int kind, int64_t bytes, int rows, int passes) {
  const Layout L = layout(kind);
  const int64_t n_in = 1536, groups = n_in / L.group_k, tile_bytes = groups * L.group_bytes;
  const int64_t tiles = std::max<int64_t>(1, bytes / tile_bytes);
  std::vector<uint8_t> w(tiles * tile_bytes);
  for (auto& b : w) b = std::rand() & 0x3F;  // any bits time alike; small ones keep the fp16 scales finite
  std::vector<float> x(rows * n_in);
  for (auto& v : x) v = (std::rand() % 2001 - 1000) / 1000.0f;
  Quant q;
  q.reserve(rows, n_in);
  for (int r = 0; r < rows; ++r)
    for (int64_t b = 0; b < n_in / 32; ++b) q.quantize(n_in, x.data() + r * n_in + 32 * b, r, b);
  const auto a = q.rows(n_in);
  std::vector<float> y(rows * 16 * tiles);
  double best = 1e300;
  for (int p = -1; p < passes; ++p) {  // pass -1 warms the threads, the pages and the caches
    const uint64_t t0 = __rdtsc();
#pragma omp parallel for schedule(static)
    for (int64_t t = 0; t < tiles; ++t)
      fn(w.data() + t * tile_bytes, groups, a, rows, 16, nullptr, y.data() + t * 16, false, 16 * tiles);
    if (p >= 0) best = std::min(best, static_cast<double>(__rdtsc() - t0));
  }
  return {best / (static_cast<double>(tiles) * groups * L.subs), tiles * tile_bytes / 1024.0};
}

int main(int argc, char** argv) {
  if (argc != 5 && argc != 6) {
    std::fprintf(stderr, "usage: kernel_cycles KIND BYTES ROWS PASSES [avx2|avxvnni|avx512]\n");
    return 2;
  }
  const int kind = std::atoi(argv[1]);
  const int64_t bytes = std::atoll(argv[2]);
  const int rows = std::atoi(argv[3]), passes = std::atoi(argv[4]);
  const std::string isa = argc == 6 ? argv[5] : "avx2";
  const bool known_isa = isa == "avx2" || isa == "avxvnni" || isa == "avx512";
  if (kind < 0 || kind > 7 || rows < 1 || rows > 64 || passes < 1 || bytes < 1 || !known_isa) {
    std::fprintf(stderr, "kernel_cycles: bad KIND (0-7), ROWS (1-64), PASSES, BYTES or ISA (avx2, avxvnni, avx512)\n");
    return 2;
  }
  const bool runs = isa == "avx2" ? __builtin_cpu_supports("avx2")
                    : isa == "avxvnni" ? __builtin_cpu_supports("avxvnni") : __builtin_cpu_supports("avx512vnni");
  if (!runs) {
    std::fprintf(stderr, "kernel_cycles: this CPU cannot run %s\n", isa.c_str());
    return 2;
  }
  Timing t;
  if (isa == "avx2")
    t = cycles<avx2::body::QuantBuffers>(avx2::body::tile_fn(kind), kind, bytes, rows, passes);
  else if (isa == "avxvnni")
    t = cycles<avxvnni::body::QuantBuffers>(avxvnni::body::tile_fn(kind), kind, bytes, rows, passes);
  else
    t = cycles<avx512::body::QuantBuffers>(avx512::body::tile_fn(kind), kind, bytes, rows, passes);
  std::printf("%s, kind %d, %.0f KB, %d rows, %d threads: %.1f cycles a sub-block (%.1f a row)\n", isa.c_str(), kind,
              t.kb, rows, omp_get_max_threads(), t.per_sub, t.per_sub / rows);
  return 0;
}
