// y[R, out] = x[R, in] @ W^T on GGUF block weights repacked by augury/kernels/packing.py.
//
// Built at first use by augury/kernels/extension.py (torch.utils.cpp_extension.load).
// The kernel body (kernel_body.h) is compiled twice, for AVX-512 VNNI and for AVX2,
// in `#pragma GCC target` regions, and the variant is chosen at run time by cpuid, so
// the library itself needs no -march flags and loads on any x86-64 CPU.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

// Block formats, numbered as augury/kernels/packing.py numbers them.
enum Kind : int { Q4_0 = 0, Q4_1 = 1, Q5_0 = 2, Q5_1 = 3, Q8_0 = 4, Q4_K = 5, Q5_K = 6, Q6_K = 7 };
constexpr int kNumKinds = 8;

// The repacked layout of one group of one 16-column tile (see kernel_body.h).
struct Layout {
  int group_k;      // `in` values per group
  int subs;         // sub-blocks of 32 `in` values per group
  int sub_bytes;    // quant bytes per sub-block (16 columns x 32 values)
  int group_bytes;  // quants of all sub-blocks, then the group's scales
};

constexpr Layout layout(int kind) {
  switch (kind) {
    case Q4_0: return {32, 1, 256, 256 + 32};            // nibbles | d f16[16]
    case Q4_1: return {32, 1, 256, 256 + 64};            // nibbles | d f16[16] | m f16[16]
    case Q5_0: return {32, 1, 320, 320 + 32};            // nibbles, 5th bits | d
    case Q5_1: return {32, 1, 320, 320 + 64};            // nibbles, 5th bits | d | m
    case Q8_0: return {32, 1, 512, 512 + 32};            // bytes (value + 128) | d
    case Q4_K: return {256, 8, 256, 8 * 256 + 320};      // | sc u8[8][16] m u8[8][16] d f16[16] dmin f16[16]
    case Q5_K: return {256, 8, 320, 8 * 320 + 320};      // same scales as Q4_K
    case Q6_K: return {256, 8, 384, 8 * 384 + 288};      // nibbles, 2 planes of high bits | sc s8[16][16] d f16[16]
  }
  return {0, 0, 0, 0};
}

// ---------------------------------------------------------------------------------------------
// AVX2: a 16-column vector is a pair of 256-bit registers (columns 0-7, 8-15).
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace avx2 {
namespace ops {

struct I { __m256i lo, hi; };
struct F { __m256 lo, hi; };
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
template <bool Q8> inline W<Q8> prepare(const I* w) {
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
  for (int64_t i = 0; i < std::min<int64_t>(n, 16); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &t[i], 4);
    p[i] = (t[i] != t[i]) ? 0x7FC0 : static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
  }
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
}  // namespace avx2
#pragma GCC pop_options

// ---------------------------------------------------------------------------------------------
// AVX-512 with VNNI: one vpdpbusd multiplies 16 columns x 4 values of one row.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")
namespace avx512 {
namespace ops {

struct I { __m512i v; };
struct F { __m512 v; };
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
template <bool Q8> inline W<Q8> prepare(const I* w) {
  W<Q8> r;
  for (int g = 0; g < 8; ++g) r.v[g] = w[g].v;
  return r;
}
template <bool Q8> inline I dot(I acc, const W<Q8>& w, int g, const int8_t* x) {
  int32_t xv;
  std::memcpy(&xv, x, 4);
  return {_mm512_dpbusd_epi32(acc.v, w.v[g], _mm512_set1_epi32(xv))};
}

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

// ---------------------------------------------------------------------------------------------

namespace {

bool cpu_has(const std::string& isa) {
  __builtin_cpu_init();
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return false;
}

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (const char* name : {"avx512", "avx2"})
    if (cpu_has(name)) out.emplace_back(name);
  return out;
}

template <typename Rows, typename TileFn, typename Quantize>
void run(const torch::Tensor& x32, const std::vector<torch::Tensor>& packed, const std::vector<int64_t>& kinds,
         const std::vector<int64_t>& rows, const float* bias, torch::Tensor& y, TileFn (*tile_fn)(int),
         Quantize quantize) {
  const int64_t R = x32.size(0), n_in = x32.size(1), nb = n_in / 32;
  std::vector<int8_t> xq(R * n_in);
  std::vector<float> dx(R * nb), xsum(R * nb);
  std::vector<int32_t> off8(R * nb), off16(R * nb), offq8(R * nb), off32h(2 * R * nb);
  quantize(x32.data_ptr<float>(), R, n_in, xq.data(), dx.data(), xsum.data(), off8.data(), off16.data(),
           offq8.data(), off32h.data());
  const Rows a{xq.data(), dx.data(), xsum.data(), off8.data(), off16.data(), offq8.data(), off32h.data(), n_in, nb};

  // Every tile of every part, with its cost in bytes, so threads get equal shares of the bytes.
  struct Tile { int part; int64_t index; };
  std::vector<Tile> tiles;
  std::vector<int64_t> cost_end;
  std::vector<int64_t> col0(packed.size());
  std::vector<const uint8_t*> bases(packed.size());
  int64_t cols = 0, total = 0;
  for (size_t p = 0; p < packed.size(); ++p) {
    col0[p] = cols;
    bases[p] = packed[p].data_ptr<uint8_t>();
    cols += rows[p];
    const Layout L = layout(static_cast<int>(kinds[p]));
    const int64_t groups = n_in / L.group_k, bytes = groups * L.group_bytes;
    for (int64_t t = 0; t < (rows[p] + 15) / 16; ++t) {
      tiles.push_back({static_cast<int>(p), t});
      total += bytes;
      cost_end.push_back(total);
    }
  }
  const int64_t ldy = y.size(1);
  const bool bf16_out = y.scalar_type() == torch::kBFloat16;
  char* ybase = static_cast<char*>(y.data_ptr());
  const int64_t esize = y.element_size();
  const int64_t nthreads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), static_cast<int64_t>(tiles.size())));
  at::parallel_for(0, nthreads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t th = begin; th < end; ++th) {
      // Tiles whose cost ends in this thread's share of [0, total).
      const int64_t lo_cost = total * th / nthreads, hi_cost = total * (th + 1) / nthreads;
      auto first = std::upper_bound(cost_end.begin(), cost_end.end(), lo_cost) - cost_end.begin();
      auto last = std::upper_bound(cost_end.begin(), cost_end.end(), hi_cost) - cost_end.begin();
      if (th == nthreads - 1) last = static_cast<int64_t>(tiles.size());
      for (int64_t i = first; i < last; ++i) {
        const Tile& t = tiles[i];
        const int kind = static_cast<int>(kinds[t.part]);
        const Layout L = layout(kind);
        const int64_t groups = n_in / L.group_k;
        const uint8_t* base = bases[t.part] + t.index * groups * L.group_bytes;
        const int64_t c = col0[t.part] + 16 * t.index;
        const int64_t n_cols = std::min<int64_t>(16, rows[t.part] - 16 * t.index);
        tile_fn(kind)(base, groups, a, R, n_cols, bias ? bias + c : nullptr, ybase + c * esize, bf16_out, ldy);
      }
    }
  });
}

torch::Tensor linear(const torch::Tensor& x, const std::vector<torch::Tensor>& packed, const std::vector<int64_t>& kinds,
                     const std::vector<int64_t>& rows, const c10::optional<torch::Tensor>& bias, const std::string& isa) {
  TORCH_CHECK(x.dim() == 2, "x must be [rows, in]");
  TORCH_CHECK(x.scalar_type() == torch::kFloat || x.scalar_type() == torch::kBFloat16, "x must be float32 or bfloat16");
  TORCH_CHECK(packed.size() == kinds.size() && kinds.size() == rows.size() && !packed.empty(), "parts disagree");
  const int64_t n_in = x.size(1);
  TORCH_CHECK(n_in % 32 == 0, "in must be a multiple of 32");
  int64_t out = 0;
  for (size_t p = 0; p < packed.size(); ++p) {
    TORCH_CHECK(kinds[p] >= 0 && kinds[p] < kNumKinds, "unknown block kind ", kinds[p]);
    const Layout L = layout(static_cast<int>(kinds[p]));
    TORCH_CHECK(n_in % L.group_k == 0, "in is not a multiple of the block size");
    const int64_t expect = (rows[p] + 15) / 16 * (n_in / L.group_k) * L.group_bytes;
    TORCH_CHECK(packed[p].scalar_type() == torch::kUInt8 && packed[p].is_contiguous() && packed[p].numel() == expect,
                "packed part ", p, " has the wrong size or type");
    out += rows[p];
  }
  const torch::Tensor x32 = x.to(torch::kFloat).contiguous();
  torch::Tensor b32;
  if (bias.has_value()) {
    b32 = bias->to(torch::kFloat).contiguous();
    TORCH_CHECK(b32.numel() == out, "bias has ", b32.numel(), " values for ", out, " outputs");
  }
  torch::Tensor y = torch::empty({x.size(0), out}, x.options());
  if (x.size(0) == 0) return y;
  const float* bp = bias.has_value() ? b32.data_ptr<float>() : nullptr;
  const std::string use = isa == "auto" ? (cpu_has("avx512") ? "avx512" : "avx2") : isa;
  TORCH_CHECK(cpu_has(use), "this CPU cannot run the ", use, " kernel");
  if (use == "avx512")
    run<avx512::body::Rows>(x32, packed, kinds, rows, bp, y, avx512::body::tile_fn, avx512::body::quantize_rows);
  else
    run<avx2::body::Rows>(x32, packed, kinds, rows, bp, y, avx2::body::tile_fn, avx2::body::quantize_rows);
  return y;
}

// Rows [16 * tile0, 16 * tile0 + n) of one packed part (n = min(16 * tiles, rows - 16 * tile0)) as bf16 [n, in].
torch::Tensor dequantize(const torch::Tensor& packed, int64_t kind, int64_t rows, int64_t n_in, int64_t tile0,
                         int64_t tiles) {
  TORCH_CHECK(cpu_has("avx512"), "dequantize needs AVX-512");
  TORCH_CHECK(kind >= 0 && kind < kNumKinds, "unknown block kind ", kind);
  const Layout L = layout(static_cast<int>(kind));
  TORCH_CHECK(n_in % L.group_k == 0, "in is not a multiple of the block size");
  const int64_t groups = n_in / L.group_k, tile_bytes = groups * L.group_bytes;
  TORCH_CHECK(packed.scalar_type() == torch::kUInt8 && packed.is_contiguous() &&
                  packed.numel() == (rows + 15) / 16 * tile_bytes, "packed part has the wrong size or type");
  TORCH_CHECK(tile0 >= 0 && tiles >= 0 && 16 * tile0 <= rows, "tile range out of bounds");
  const int64_t n = std::max<int64_t>(0, std::min<int64_t>(16 * tiles, rows - 16 * tile0));
  torch::Tensor out = torch::empty({n, n_in}, torch::dtype(torch::kBFloat16));
  const uint8_t* base = packed.data_ptr<uint8_t>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  const auto fn = avx512::prefill::dequant_fn(static_cast<int>(kind));
  const int64_t count = (n + 15) / 16;
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      fn(base + (tile0 + t) * tile_bytes, groups, n_in, std::min<int64_t>(16, n - 16 * t), o + 16 * t * n_in);
  });
  return out;
}

std::vector<int64_t> layout_of(int64_t kind) {
  TORCH_CHECK(kind >= 0 && kind < kNumKinds, "unknown block kind ", kind);
  const Layout L = layout(static_cast<int>(kind));
  return {L.group_k, L.subs, L.sub_bytes, L.group_bytes};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "augury's GGUF block matmul (AVX-512 VNNI / AVX2)";
  m.def("linear", &linear, "y = x @ W^T + bias on repacked GGUF parts", py::arg("x"), py::arg("packed"),
        py::arg("kinds"), py::arg("rows"), py::arg("bias"), py::arg("isa") = "auto",
        // A step's matmuls hold no Python objects: without the GIL, the server's
        // event loop answers (/health, tokenizing) while the scheduler thread verifies.
        py::call_guard<py::gil_scoped_release>());
  m.def("dequantize", &dequantize, "rows of a packed part as bf16 weights (AVX-512)", py::arg("packed"),
        py::arg("kind"), py::arg("rows"), py::arg("n_in"), py::arg("tile0"), py::arg("tiles"),
        py::call_guard<py::gil_scoped_release>());
  m.def("available_isas", &available_isas, "instruction sets this CPU can run, best first");
  m.def("layout", &layout_of, "(group_k, subs, sub_bytes, group_bytes) of a block kind");
}
