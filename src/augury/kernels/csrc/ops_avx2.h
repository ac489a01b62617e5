// Included by gguf_matmul.cpp (after common.h): one instruction set's vector operations and the
// kernel and layer bodies compiled over them.
#pragma once

// ---------------------------------------------------------------------------------------------
// AVX2: a 16-column vector is a pair of 256-bit registers (columns 0-7, 8-15).
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
namespace ops {

struct I { __m256i lo, hi; };
struct F { __m256 lo, hi; };
// Floats in one native vector register (one ymm): the width of the attention's loops (layer_body.h).
constexpr int kVecFloats = 8;
// Q8_0's quants are stored as value + 128; this variant multiplies the signed values
// (|w| times x with w's sign, the u8 x s8 form without overflow), so no zero point.
constexpr int kQ8Zero = 0;
// 16 ymm registers hold a sub-block's quants already: row accumulators stay in memory.
constexpr int kHeldRows = 0;

inline I load(const uint8_t* p) {
  return {_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)),
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32))};
}
inline I set1_u8(uint8_t b) { const __m256i v = _mm256_set1_epi8(static_cast<char>(b)); return {v, v}; }
inline I and_(I a, I b) { return {_mm256_and_si256(a.lo, b.lo), _mm256_and_si256(a.hi, b.hi)}; }
inline I or_and(I a, I b, I m) {
  return {_mm256_or_si256(a.lo, _mm256_and_si256(b.lo, m.lo)), _mm256_or_si256(a.hi, _mm256_and_si256(b.hi, m.hi))};
}
template <int N> inline I srl16(I a) { return {_mm256_srli_epi16(a.lo, N), _mm256_srli_epi16(a.hi, N)}; }
template <int N> inline I sll16(I a) { return {_mm256_slli_epi16(a.lo, N), _mm256_slli_epi16(a.hi, N)}; }
inline I zero_i() { return {_mm256_setzero_si256(), _mm256_setzero_si256()}; }
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
inline I bcast_i32(const int32_t* p) { const __m256i v = _mm256_set1_epi32(*p); return {v, v}; }
inline I add_i(I a, I b) { return {_mm256_add_epi32(a.lo, b.lo), _mm256_add_epi32(a.hi, b.hi)}; }

template <bool Q8> struct W { __m256i lo[8], hi[8], slo[8], shi[8]; };
template <bool Q8, bool Shared = true> inline W<Q8> prepare(const I* w) {
  W<Q8> r;
  for (int g = 0; g < 8; ++g) {
    if constexpr (Q8) {
      const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));
      r.slo[g] = _mm256_xor_si256(w[g].lo, flip);
      r.shi[g] = _mm256_xor_si256(w[g].hi, flip);
      r.lo[g] = _mm256_abs_epi8(r.slo[g]);
      r.hi[g] = _mm256_abs_epi8(r.shi[g]);
    } else {
      r.lo[g] = w[g].lo;
      r.hi[g] = w[g].hi;
    }
  }
  // 16 ymm cannot hold both halves and a row's temporaries: the hi half goes to memory (L1) here, for
  // the rows to read as operands, which leaves registers for the lo half across the row loop.
  if constexpr (Shared) asm volatile("" : : "r"(r.hi) : "memory");
  return r;
}
template <bool Q8> inline I dot(I acc, const W<Q8>& w, int g, const int8_t* x) {
  int32_t xv;
  std::memcpy(&xv, x, 4);
  const __m256i xb = _mm256_set1_epi32(xv);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i lo, hi;
  if constexpr (Q8) {
    lo = _mm256_maddubs_epi16(w.lo[g], _mm256_sign_epi8(xb, w.slo[g]));
    hi = _mm256_maddubs_epi16(w.hi[g], _mm256_sign_epi8(xb, w.shi[g]));
  } else {
    lo = _mm256_maddubs_epi16(w.lo[g], xb);
    hi = _mm256_maddubs_epi16(w.hi[g], xb);
  }
  return {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(lo, ones)), _mm256_add_epi32(acc.hi, _mm256_madd_epi16(hi, ones))};
}

// maddubs gives 16-bit sums of two u8 x s8 products (|xq| <= 127), so with quants <= MAXQ
// `per` = 32767 / (2 * 127 * MAXQ) of them add up in 16 bits without overflow (8 for 4-bit
// quants, 4 for 5-bit, 2 for 6-bit, 1 for Q8_0) before one madd widens them: the same exact
// integers as widening each, with about a third of the instructions.
constexpr bool kSums16 = true;
// One chain of products a row (kernel_body.h's dots; AVX-VNNI inherits it): with 16 registers a second
// accumulator cost AVX-VNNI 8 rows 10.5 -> 11.7 cycles a row and sub-block (docs/benchmarks.md 39).
constexpr int kProductChains = 1;
//
// The empty asm statements pin the sums' order: without them GCC re-associates the (exact, so
// reorderable) 16-bit adds into trees that keep every product live at once, spilling the quants to
// the stack and reloading them for every row (llvm-mca -mcpu=znver3 on the Q4_K row loop: 18.6
// cycles a row and sub-block with the trees, 14.1 pinned; docs/benchmarks.md 14).
template <int MAXQ, bool Q8> inline I dots16(I acc, const W<Q8>& w, int g0, int n, const int8_t* x) {
  constexpr int per = 32767 / (2 * 127 * MAXQ) > 0 ? 32767 / (2 * 127 * MAXQ) : 1;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int g = g0; g < g0 + n; g += per) {
    __m256i lo = _mm256_setzero_si256(), hi = _mm256_setzero_si256();
    for (int k = g; k < std::min(g + per, g0 + n); ++k) {
      int32_t xv;
      std::memcpy(&xv, x + 4 * (k - g0), 4);
      const __m256i xb = _mm256_set1_epi32(xv);
      if constexpr (Q8) {
        lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(w.lo[k], _mm256_sign_epi8(xb, w.slo[k])));
        hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(w.hi[k], _mm256_sign_epi8(xb, w.shi[k])));
      } else {
        lo = _mm256_add_epi16(lo, _mm256_maddubs_epi16(w.lo[k], xb));
        hi = _mm256_add_epi16(hi, _mm256_maddubs_epi16(w.hi[k], xb));
      }
      asm volatile("" : "+x"(lo), "+x"(hi));
    }
    acc = {_mm256_add_epi32(acc.lo, _mm256_madd_epi16(lo, ones)), _mm256_add_epi32(acc.hi, _mm256_madd_epi16(hi, ones))};
    asm volatile("" : "+x"(acc.lo), "+x"(acc.hi));
  }
  return acc;
}

inline F zero_f() { return {_mm256_setzero_ps(), _mm256_setzero_ps()}; }
inline F load_f(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void store_f(float* p, F v) { _mm256_storeu_ps(p, v.lo); _mm256_storeu_ps(p + 8, v.hi); }
inline F bcast_f(float f) { const __m256 v = _mm256_set1_ps(f); return {v, v}; }
inline F add(F a, F b) { return {_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)}; }
inline F mul(F a, F b) { return {_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)}; }
inline F fma(F a, F b, F c) { return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)}; }
inline F fnma(F a, F b, F c) { return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)}; }
inline F cvt(I a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline F load_f16(const uint8_t* p) {
  return {_mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))),
          _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16)))};
}
inline F load_u8f(const uint8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
          _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))))};
}
inline F load_s8f(const uint8_t* p) {
  return {_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))),
          _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + 8))))};
}
inline F load_partial_f(const float* p, int64_t n) {
  if (n >= 16) return load_f(p);
  alignas(32) float t[16] = {0};
  std::memcpy(t, p, sizeof(float) * n);
  return load_f(t);
}
inline void store_partial_f(float* p, F v, int64_t n) {
  if (n >= 16) return store_f(p, v);
  alignas(32) float t[16];
  store_f(t, v);
  std::memcpy(p, t, sizeof(float) * n);
}
inline void store_bf16(uint16_t* p, F v, int64_t n) {
  alignas(32) float t[16];
  store_f(t, v);
  for (int64_t i = 0; i < std::min<int64_t>(n, 16); ++i) p[i] = bf16_bits(t[i]);
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_shuffle_ps(m, m, 1));
  return _mm_cvtss_f32(m);
}
inline int32_t hsum_i(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}
// to[0..n) = the bf16 values from[0..n) as fp32 (n a multiple of 8): the attention's keys and values.
inline void widen_bf16(const uint16_t* from, float* to, int64_t n) {
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i h = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(from + i)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(to + i), _mm256_slli_epi32(h, 16));
  }
}
inline float amax32(const float* x) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  __m256 m = _mm256_andnot_ps(sign, _mm256_loadu_ps(x));
  for (int i = 8; i < 32; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i)));
  return hmax(m);
}
// xq[0..32) = round-half-even(x * inv); s0, s1: sums of the first and second 16 quants.
inline void quant32(const float* x, float inv, int8_t* q, int32_t* s0, int32_t* s1) {
  const __m256 iv = _mm256_set1_ps(inv);
  __m256i v[4];
  for (int i = 0; i < 4; ++i) v[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * i), iv));
  *s0 = hsum_i(_mm256_add_epi32(v[0], v[1]));
  *s1 = hsum_i(_mm256_add_epi32(v[2], v[3]));
  const __m256i w01 = _mm256_packs_epi32(v[0], v[1]);  // lanes interleaved by 128 bits
  const __m256i w23 = _mm256_packs_epi32(v[2], v[3]);
  __m256i b = _mm256_packs_epi16(w01, w23);
  b = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), b);
}

}  // namespace ops
#include "kernel_body.h"
#include "layer_body.h"
}  // namespace avx2
#pragma GCC pop_options
