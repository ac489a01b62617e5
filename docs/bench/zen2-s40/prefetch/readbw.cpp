// best pass TSC cycles per 296 bytes (a Q4_K sub-block tile's share incl. scales: 2368/8) reading BYTES with 2 threads
#include <immintrin.h>
#include <x86intrin.h>
#include <omp.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <cstdint>
int main(int argc, char** argv) {
  const int64_t bytes = atoll(argv[1]); const int passes = atoi(argv[2]);
  std::vector<uint8_t> w(bytes); for (auto& b : w) b = rand();
  double best = 1e300; long long sink = 0;
  for (int p = -1; p < passes; ++p) {
    uint64_t t0 = __rdtsc();
    long long tot = 0;
#pragma omp parallel reduction(+:tot)
    {
      int th = omp_get_thread_num(), nt = omp_get_num_threads();
      int64_t lo = bytes / nt * th, hi = bytes / nt * (th + 1);
      __m256i acc = _mm256_setzero_si256();
      for (int64_t i = lo; i < hi; i += 128) {
        acc = _mm256_add_epi64(acc, _mm256_loadu_si256((const __m256i*)(w.data() + i)));
        acc = _mm256_add_epi64(acc, _mm256_loadu_si256((const __m256i*)(w.data() + i + 32)));
        acc = _mm256_add_epi64(acc, _mm256_loadu_si256((const __m256i*)(w.data() + i + 64)));
        acc = _mm256_add_epi64(acc, _mm256_loadu_si256((const __m256i*)(w.data() + i + 96)));
      }
      tot += _mm256_extract_epi64(acc, 0);
    }
    sink += tot;
    if (p >= 0) best = std::min(best, double(__rdtsc() - t0));
  }
  printf("read: %.1f TSC cycles per 296 B per thread-pair, %.1f GB/s (TSC 2.246 GHz) %lld\n", best / (bytes / 296.0) * 2, bytes / (best / 2.246e9) / 1e9, sink & 1);
}
