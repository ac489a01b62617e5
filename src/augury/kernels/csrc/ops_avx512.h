// Included by gguf_matmul.cpp (after common.h): one instruction set's vector operations and the
// kernel and layer bodies compiled over them.
#pragma once

// ---------------------------------------------------------------------------------------------
// AVX-512 with VNNI: one vpdpbusd multiplies 16 columns x 4 values of one row.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
namespace avx512 {
namespace ops {

struct I { __m512i v; };
struct F { __m512 v; };
// Floats in one native vector register (one zmm): the width of the attention's loops (layer_body.h).
constexpr int kVecFloats = 16;
constexpr int kQ8Zero = 128;  // u8 (value + 128) x s8, minus 128 * sum(xq)
// 32 zmm registers: 8 for a sub-block's quants, 8 row accumulators, the rest for the scaling.
constexpr int kHeldRows = 8;

inline I load(const uint8_t* p) { return {_mm512_loadu_si512(p)}; }
inline I set1_u8(uint8_t b) { return {_mm512_set1_epi8(static_cast<char>(b))}; }
inline I and_(I a, I b) { return {_mm512_and_si512(a.v, b.v)}; }
inline I or_and(I a, I b, I m) { return {_mm512_ternarylogic_epi32(a.v, b.v, m.v, 0xF8)}; }  // a | (b & m)
template <int N> inline I srl16(I a) { return {_mm512_srli_epi16(a.v, N)}; }
template <int N> inline I sll16(I a) { return {_mm512_slli_epi16(a.v, N)}; }
inline I zero_i() { return {_mm512_setzero_si512()}; }
inline void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T0); }
inline I bcast_i32(const int32_t* p) { return {_mm512_set1_epi32(*p)}; }
inline I add_i(I a, I b) { return {_mm512_add_epi32(a.v, b.v)}; }

template <bool Q8> struct W { __m512i v[8]; };
template <bool Q8, bool Shared = true> inline W<Q8> prepare(const I* w) {
  W<Q8> r;
  for (int g = 0; g < 8; ++g) r.v[g] = w[g].v;
  return r;
}
template <bool Q8> inline I dot(I acc, const W<Q8>& w, int g, const int8_t* x) {
  int32_t xv;
  std::memcpy(&xv, x, 4);
  return {_mm512_dpbusd_epi32(acc.v, w.v[g], _mm512_set1_epi32(xv))};
}

constexpr bool kSums16 = false;  // vpdpbusd widens to 32 bits itself
// A row's products in two independent chains (32 registers hold the second): see kernel_body.h's dots.
constexpr int kProductChains = 2;
template <int MAXQ, bool Q8> I dots16(I, const W<Q8>&, int, int, const int8_t*);

inline F zero_f() { return {_mm512_setzero_ps()}; }
inline F load_f(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void store_f(float* p, F v) { _mm512_storeu_ps(p, v.v); }
inline F bcast_f(float f) { return {_mm512_set1_ps(f)}; }
inline F add(F a, F b) { return {_mm512_add_ps(a.v, b.v)}; }
inline F mul(F a, F b) { return {_mm512_mul_ps(a.v, b.v)}; }
inline F fma(F a, F b, F c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline F fnma(F a, F b, F c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }
inline F cvt(I a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline F load_f16(const uint8_t* p) { return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))}; }
inline F load_u8f(const uint8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline F load_s8f(const uint8_t* p) {
  return {_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))))};
}
inline __mmask16 first(int64_t n) { return n >= 16 ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << n) - 1); }
inline F load_partial_f(const float* p, int64_t n) { return {_mm512_maskz_loadu_ps(first(n), p)}; }
inline void store_partial_f(float* p, F v, int64_t n) { _mm512_mask_storeu_ps(p, first(n), v.v); }
// Round to nearest even on the bits (what torch's float -> bfloat16 does), NaN -> quiet NaN.
inline __m256i bf16_bits(F v) {
  const __m512i bits = _mm512_castps_si512(v.v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v.v, v.v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}
inline void store_bf16(uint16_t* p, F v, int64_t n) { _mm256_mask_storeu_epi16(p, first(n), bf16_bits(v)); }

// to[0..n) = the bf16 values from[0..n) as fp32 (n a multiple of 16): the attention's keys and values.
inline void widen_bf16(const uint16_t* from, float* to, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __m512i h = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(from + i)));
    _mm512_storeu_si512(to + i, _mm512_slli_epi32(h, 16));
  }
}

inline float amax32(const float* x) {
  const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x)), b = _mm512_abs_ps(_mm512_loadu_ps(x + 16));
  return _mm512_reduce_max_ps(_mm512_max_ps(a, b));
}
inline void quant32(const float* x, float inv, int8_t* q, int32_t* s0, int32_t* s1) {
  const __m512 iv = _mm512_set1_ps(inv);
  const __m512i a = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x), iv));
  const __m512i b = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + 16), iv));
  *s0 = _mm512_reduce_add_epi32(a);
  *s1 = _mm512_reduce_add_epi32(b);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q), _mm512_cvtepi32_epi8(a));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(q + 16), _mm512_cvtepi32_epi8(b));
}

}  // namespace ops
#include "kernel_body.h"
#include "layer_body.h"

// Prefill: long blocks are compute bound, where a bf16 matmul library with a matrix unit (oneDNN
// with AMX here) beats the int8 vector kernel; this writes tiles back as bf16 [rows, in] weights for it.
// Each value is w = scale * (q - zero) + min with one rounding, like the reference's dequantization,
// then rounded to bf16 as torch rounds.
namespace prefill {

using ops::F;

template <int KIND>
static void dequant_tile(const uint8_t* tile, int64_t groups, int64_t n_in, int64_t n_rows, uint16_t* out) {
  constexpr Layout L = layout(KIND);
  constexpr int kZero = KIND == Q4_0 ? 8 : KIND == Q5_0 ? 16 : KIND == Q8_0 ? 128 : KIND == Q6_K ? 32 : 0;
  constexpr bool kSubMin = KIND == Q4_K || KIND == Q5_K;  // mins subtracted
  constexpr bool kAddMin = KIND == Q4_1 || KIND == Q5_1;
  // Lane l of the 16 quants in bytes [16p, 16p + 16) of a vector belongs to column 4p + l / 4.
  __m512i spread[4];
  for (int p = 0; p < 4; ++p)
    spread[p] = _mm512_setr_epi32(4 * p, 4 * p, 4 * p, 4 * p, 4 * p + 1, 4 * p + 1, 4 * p + 1, 4 * p + 1,
                                  4 * p + 2, 4 * p + 2, 4 * p + 2, 4 * p + 2, 4 * p + 3, 4 * p + 3, 4 * p + 3, 4 * p + 3);
  for (int64_t grp = 0; grp < groups; ++grp) {
    const uint8_t* gp = tile + grp * L.group_bytes;
    const uint8_t* sp = gp + L.subs * L.sub_bytes;
    F d, dmin;
    body::group_scales<KIND>(sp, d, dmin);
    for (int s = 0; s < L.subs; ++s) {
      ops::I w[8];
      body::unpack<KIND>(gp + s * L.sub_bytes, w);
      const body::SubScales sc = body::sub_scales<KIND>(sp, d, dmin, s);
      const int64_t k0 = (grp * L.subs + s) * 32;
      for (int p = 0; p < 4; ++p) {
        const __m512 a0 = _mm512_permutexvar_ps(spread[p], sc.sa.v);
        const __m512 a1 = KIND == Q6_K ? _mm512_permutexvar_ps(spread[p], sc.sb.v) : a0;
        __m512 m = _mm512_permutexvar_ps(spread[p], sc.mn.v);
        if constexpr (kSubMin) m = _mm512_sub_ps(_mm512_setzero_ps(), m);
        // v[g]: qword j = column 4p + j, values 4g .. 4g + 3 (as bf16).
        __m256i v[8];
        for (int g = 0; g < 8; ++g) {
          __m128i bytes = _mm512_extracti32x4_epi32(w[g].v, 0);
          if (p == 1) bytes = _mm512_extracti32x4_epi32(w[g].v, 1);
          if (p == 2) bytes = _mm512_extracti32x4_epi32(w[g].v, 2);
          if (p == 3) bytes = _mm512_extracti32x4_epi32(w[g].v, 3);
          __m512i q = _mm512_cvtepu8_epi32(bytes);
          if constexpr (kZero != 0) q = _mm512_sub_epi32(q, _mm512_set1_epi32(kZero));
          const __m512 a = g < 4 ? a0 : a1;
          const __m512 f = kSubMin || kAddMin ? _mm512_fmadd_ps(_mm512_cvtepi32_ps(q), a, m)
                                              : _mm512_mul_ps(_mm512_cvtepi32_ps(q), a);
          v[g] = ops::bf16_bits({f});
        }
        // Transpose 8 x 4 qwords so that each column's 32 values are one 64-byte store.
        __m512i z[4];
        for (int h = 0; h < 4; ++h) z[h] = _mm512_inserti64x4(_mm512_castsi256_si512(v[2 * h]), v[2 * h + 1], 1);
        for (int pair = 0; pair < 2; ++pair) {
          const __m512i idx = pair == 0 ? _mm512_setr_epi64(0, 4, 8, 12, 1, 5, 9, 13)
                                        : _mm512_setr_epi64(2, 6, 10, 14, 3, 7, 11, 15);
          const __m512i lo = _mm512_permutex2var_epi64(z[0], idx, z[1]);  // values 0-15 of two columns
          const __m512i hi = _mm512_permutex2var_epi64(z[2], idx, z[3]);  // values 16-31
          const int64_t col = 4 * p + 2 * pair;
          if (col < n_rows) _mm512_storeu_si512(out + col * n_in + k0, _mm512_shuffle_i64x2(lo, hi, 0x44));
          if (col + 1 < n_rows) _mm512_storeu_si512(out + (col + 1) * n_in + k0, _mm512_shuffle_i64x2(lo, hi, 0xEE));
        }
      }
    }
  }
}

using DequantFn = void (*)(const uint8_t*, int64_t, int64_t, int64_t, uint16_t*);

static DequantFn dequant_fn(int kind) {
  switch (kind) {
    case Q4_0: return dequant_tile<Q4_0>;
    case Q4_1: return dequant_tile<Q4_1>;
    case Q5_0: return dequant_tile<Q5_0>;
    case Q5_1: return dequant_tile<Q5_1>;
    case Q8_0: return dequant_tile<Q8_0>;
    case Q4_K: return dequant_tile<Q4_K>;
    case Q5_K: return dequant_tile<Q5_K>;
    case Q6_K: return dequant_tile<Q6_K>;
  }
  return nullptr;
}

}  // namespace prefill
}  // namespace avx512
#pragma GCC pop_options
