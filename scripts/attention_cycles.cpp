// Time-stamp cycles of one instruction set's attention (layer::attend_rows) for one layer of
// Qwen2.5-1.5B's shape (12 query heads, 2 KV heads of 128, bf16 cache), without torch or Python: R
// new rows of each of S sequences over ctx cached keys, one thread, the best of many passes. The
// checksum of the outputs is printed so that two builds can be seen to give the same bits.
//
//   g++ -std=c++17 -O3 -fopenmp -ffp-contract=off -Wno-psabi -Itests/cross/shim \
//       -Isrc/augury/kernels/csrc scripts/attention_cycles.cpp -o /tmp/attention_cycles
//   OMP_NUM_THREADS=1 /tmp/attention_cycles ROWS CTX PASSES [ISA [SEQS]]   (ISA: avx512 or avx2)
//
// Point -I at two copies of csrc/ to compare an old and a new loop, alternating runs.
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

template <class Scratch, class Fn>
double run(Fn fn, int R, int ctx, int passes, int seqs) {
  const int64_t H = 12, KV = 2, D = 128, slots = ctx + R;
  LayerDesc L; L.n_heads = H; L.n_kv = KV; L.head_dim = D; L.scale = 1.0f / std::sqrt(128.0f);
  std::vector<std::vector<uint16_t>> kc(seqs), vc(seqs);
  LayerIO io; io.R = R * seqs; io.cache_bf16 = true;
  for (int s = 0; s < seqs; ++s) {
    kc[s].resize(KV * slots * D); vc[s].resize(KV * slots * D);
    for (auto& b : kc[s]) b = bf16_bits((std::rand() % 2001 - 1000) / 1000.0f);
    for (auto& b : vc[s]) b = bf16_bits((std::rand() % 2001 - 1000) / 1000.0f);
    io.seqs.push_back({kc[s].data(), vc[s].data(), slots * D, D});
  }
  const int64_t n_qkv = (H + 2 * KV) * D, n_q = H * D;
  std::vector<float> qkv(io.R * n_qkv), attn(io.R * n_q);
  for (auto& v : qkv) v = (std::rand() % 2001 - 1000) / 1000.0f;
  std::vector<int64_t> row_seq(io.R), row_slot(io.R), lo(io.R), hi(io.R), eoff(io.R + 1, 0);
  for (int s = 0; s < seqs; ++s)
    for (int r = 0; r < R; ++r) { int i = s * R + r; row_seq[i] = s; row_slot[i] = ctx + r; lo[i] = 0; hi[i] = ctx + r + 1; }
  io.row_seq = row_seq.data(); io.row_slot = row_slot.data(); io.key_lo = lo.data(); io.key_hi = hi.data();
  io.extra_off = eoff.data(); io.extra_slots = eoff.data();
  Scratch sc;
  double best = 1e300;
  for (int p = -1; p < passes; ++p) {
    const uint64_t t0 = __rdtsc();
    for (int s = 0; s < seqs; ++s)
      for (int64_t kvh = 0; kvh < KV; ++kvh) fn(L, io, s * R, R, kvh, qkv.data(), n_qkv, attn.data(), n_q, sc);
    if (p >= 0) best = std::min(best, double(__rdtsc() - t0));
  }
  double chk = 0; for (float v : attn) chk += v;
  std::fprintf(stderr, "checksum %.9g\n", chk);
  return best;
}

int main(int argc, char** argv) {
  const int R = std::atoi(argv[1]), ctx = std::atoi(argv[2]), passes = std::atoi(argv[3]);
  const std::string isa = argc > 4 ? argv[4] : "avx512";
  const int seqs = argc > 5 ? std::atoi(argv[5]) : 1;
  double c;
  if (isa == "avx512") c = run<avx512::layer::AttnScratch>(avx512::layer::attend_rows<uint16_t>, R, ctx, passes, seqs);
  else c = run<avx2::layer::AttnScratch>(avx2::layer::attend_rows<uint16_t>, R, ctx, passes, seqs);
  std::printf("%s rows %d x %d seqs ctx %d: %.0f kcycles a layer (%.1f a row)\n", isa.c_str(), R, seqs, ctx, c / 1e3, c / 1e3 / (R * seqs));
}
