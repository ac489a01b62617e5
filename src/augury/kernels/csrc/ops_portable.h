// Included by gguf_matmul.cpp (after common.h): one instruction set's vector operations and the
// kernel and layer bodies compiled over them.
#pragma once

// ---------------------------------------------------------------------------------------------
// Portable: the same kernel body over plain C++ arrays, no intrinsics (any CPU with a C++17
// compiler; the compiler vectorises the loops for whatever SIMD it targets). A 16-column vector
// is 64 bytes as in the AVX-512 variant, with the same u8 x s8 products and the same fp32
// operations in the same order (fused where the others fuse, through std::fma), so its results
// are bitwise those of the AVX-512 and AVX2 variants.
namespace portable {
namespace ops {

struct I { uint8_t b[64]; };  // 64 bytes, or 32 u16 / 16 i32 lanes (read through memcpy)
struct F { float v[16]; };
// Floats in one native vector register (what any SIMD unit holds; scalar code where there is none):
// the width of the attention's loops (layer_body.h).
constexpr int kVecFloats = 4;
constexpr int kQ8Zero = 128;  // u8 (value + 128) x s8, minus 128 * sum(xq), as the AVX-512 variant
constexpr int kHeldRows = 8;  // no register file to respect: the accumulators are plain arrays

inline void lanes32(const I& a, int32_t* out) { std::memcpy(out, a.b, 64); }
inline I from32(const int32_t* v) { I r; std::memcpy(r.b, v, 64); return r; }

inline I load(const uint8_t* p) { I r; std::memcpy(r.b, p, 64); return r; }
inline I set1_u8(uint8_t v) { I r; std::memset(r.b, v, 64); return r; }
inline I and_(I a, I b) { for (int i = 0; i < 64; ++i) a.b[i] &= b.b[i]; return a; }
inline I or_and(I a, I b, I m) { for (int i = 0; i < 64; ++i) a.b[i] |= b.b[i] & m.b[i]; return a; }
template <int N> inline I srl16(I a) {
  uint16_t h[32];
  std::memcpy(h, a.b, 64);
  for (int i = 0; i < 32; ++i) h[i] = static_cast<uint16_t>(h[i] >> N);
  std::memcpy(a.b, h, 64);
  return a;
}
template <int N> inline I sll16(I a) {
  uint16_t h[32];
  std::memcpy(h, a.b, 64);
  for (int i = 0; i < 32; ++i) h[i] = static_cast<uint16_t>(h[i] << N);
  std::memcpy(a.b, h, 64);
  return a;
}
inline I zero_i() { return set1_u8(0); }
inline void prefetch(const uint8_t* p) {
#if defined(__GNUC__)
  __builtin_prefetch(p);
#else
  (void)p;
#endif
}
inline I bcast_i32(const int32_t* p) { int32_t v[16]; for (int i = 0; i < 16; ++i) v[i] = *p; return from32(v); }
inline I add_i(I a, I b) {
  int32_t x[16], y[16];
  lanes32(a, x);
  lanes32(b, y);
  for (int i = 0; i < 16; ++i) x[i] += y[i];
  return from32(x);
}

template <bool Q8> struct W { I v[8]; };
template <bool Q8, bool Shared = true> inline W<Q8> prepare(const I* w) {
  W<Q8> r;
  for (int g = 0; g < 8; ++g) r.v[g] = w[g];
  return r;
}
// acc[c] += sum_i w[g][4c + i] * x[i]: column c's 4 values against the row's 4 (u8 x s8, exact).
template <bool Q8> inline I dot(I acc, const W<Q8>& w, int g, const int8_t* x) {
  int32_t s[16];
  lanes32(acc, s);
  const uint8_t* q = w.v[g].b;
  for (int c = 0; c < 16; ++c)
    s[c] += q[4 * c] * x[0] + q[4 * c + 1] * x[1] + q[4 * c + 2] * x[2] + q[4 * c + 3] * x[3];
  return from32(s);
}

constexpr bool kSums16 = false;
constexpr int kProductChains = 1;  // kernel_body.h's dots
template <int MAXQ, bool Q8> I dots16(I, const W<Q8>&, int, int, const int8_t*);

inline F zero_f() { F r; for (float& f : r.v) f = 0.0f; return r; }
inline F load_f(const float* p) { F r; std::memcpy(r.v, p, 64); return r; }
inline void store_f(float* p, F v) { std::memcpy(p, v.v, 64); }
inline F bcast_f(float f) { F r; for (float& x : r.v) x = f; return r; }
inline F add(F a, F b) { for (int i = 0; i < 16; ++i) a.v[i] += b.v[i]; return a; }
inline F mul(F a, F b) { for (int i = 0; i < 16; ++i) a.v[i] *= b.v[i]; return a; }
inline F fma(F a, F b, F c) { for (int i = 0; i < 16; ++i) c.v[i] = std::fma(a.v[i], b.v[i], c.v[i]); return c; }
inline F fnma(F a, F b, F c) { for (int i = 0; i < 16; ++i) c.v[i] = std::fma(-a.v[i], b.v[i], c.v[i]); return c; }
inline F cvt(I a) { int32_t s[16]; lanes32(a, s); F r; for (int i = 0; i < 16; ++i) r.v[i] = static_cast<float>(s[i]); return r; }
// IEEE half -> float, exact (subnormals, infinities and NaN included).
inline float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: normalise
    int e = -1;
    uint32_t m = man;
    do { ++e; m <<= 1; } while ((m & 0x400) == 0);
    bits = sign | ((112 - e) << 23) | ((m & 0x3FF) << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline F load_f16(const uint8_t* p) {
  uint16_t h[16];
  std::memcpy(h, p, 32);
  F r;
  for (int i = 0; i < 16; ++i) r.v[i] = half_to_float(h[i]);
  return r;
}
inline F load_u8f(const uint8_t* p) { F r; for (int i = 0; i < 16; ++i) r.v[i] = static_cast<float>(p[i]); return r; }
inline F load_s8f(const uint8_t* p) {
  F r;
  for (int i = 0; i < 16; ++i) r.v[i] = static_cast<float>(static_cast<int8_t>(p[i]));
  return r;
}
inline F load_partial_f(const float* p, int64_t n) {
  F r = zero_f();
  std::memcpy(r.v, p, sizeof(float) * std::min<int64_t>(n, 16));
  return r;
}
inline void store_partial_f(float* p, F v, int64_t n) { std::memcpy(p, v.v, sizeof(float) * std::min<int64_t>(n, 16)); }
inline void store_bf16(uint16_t* p, F v, int64_t n) {
  for (int64_t i = 0; i < std::min<int64_t>(n, 16); ++i) p[i] = bf16_bits(v.v[i]);
}

// to[0..n) = the bf16 values from[0..n) as fp32: the attention's keys and values.
inline void widen_bf16(const uint16_t* from, float* to, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t bits = static_cast<uint32_t>(from[i]) << 16;
    std::memcpy(to + i, &bits, 4);
  }
}

inline float amax32(const float* x) {
  float m = 0.0f;
  for (int i = 0; i < 32; ++i) m = std::max(m, std::fabs(x[i]));
  return m;
}
// xq[0..32) = round-half-even(x * inv) (the default rounding mode, as cvtps2dq); s0, s1: sums of each 16.
inline void quant32(const float* x, float inv, int8_t* q, int32_t* s0, int32_t* s1) {
  int32_t a = 0, b = 0;
  for (int i = 0; i < 32; ++i) {
    const float scaled = x[i] * inv;
    const int32_t v = static_cast<int32_t>(std::nearbyint(scaled));
    q[i] = static_cast<int8_t>(v);
    (i < 16 ? a : b) += v;
  }
  *s0 = a;
  *s1 = b;
}

}  // namespace ops
#include "kernel_body.h"
#include "layer_body.h"
}  // namespace portable
