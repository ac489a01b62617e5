// Included by gguf_matmul.cpp (after common.h) on aarch64: one instruction set's vector operations
// and the kernel and layer bodies compiled over them.
#pragma once

// ---------------------------------------------------------------------------------------------
// NEON with the dot-product extension (Armv8.2 and later: Graviton 2+, Apple M1+, Cortex-A76+,
// Raspberry Pi 5): a 16-column vector is four 128-bit registers (columns 0-3, 4-7, 8-11, 12-15).
// SDOT adds, per 32-bit lane, the products of 4 signed bytes with 4 signed bytes, which is
// column c's 4 quants against the row's 4 values in the kernel's layout. Every format's quants
// are below 128 (Q8_0's are stored as value + 128 and turned back into signed bytes), so s8 x s8
// is exact, as VNNI's u8 x s8 is on AVX-512. The integers, and the fp32 operations after them in
// the same order, are the portable variant's, so the results are bitwise its results.
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+dotprod")
namespace neon {
namespace ops {

struct I { int8x16_t v[4]; };
struct F { float32x4_t v[4]; };
// Floats in one native vector register (one q register): the width of the attention's loops (layer_body.h).
constexpr int kVecFloats = 4;
// Q8_0's quants become signed values (no zero point); every other format's are below 128 already.
constexpr int kQ8Zero = 0;
// 32 registers of 128 bits hold one sub-block's quants (8 vectors x 4): row accumulators stay in
// memory, as on AVX2. Not tuned: no Arm CPU has timed this variant (it was checked under qemu).
constexpr int kHeldRows = 0;

inline I load(const uint8_t* p) {
  I r;
  for (int j = 0; j < 4; ++j) r.v[j] = vreinterpretq_s8_u8(vld1q_u8(p + 16 * j));
  return r;
}
inline I set1_u8(uint8_t b) { const int8x16_t v = vreinterpretq_s8_u8(vdupq_n_u8(b)); return {{v, v, v, v}}; }
inline I and_(I a, I b) { for (int j = 0; j < 4; ++j) a.v[j] = vandq_s8(a.v[j], b.v[j]); return a; }
inline I or_and(I a, I b, I m) { for (int j = 0; j < 4; ++j) a.v[j] = vorrq_s8(a.v[j], vandq_s8(b.v[j], m.v[j])); return a; }
template <int N> inline I srl16(I a) {
  for (int j = 0; j < 4; ++j) a.v[j] = vreinterpretq_s8_u16(vshrq_n_u16(vreinterpretq_u16_s8(a.v[j]), N));
  return a;
}
template <int N> inline I sll16(I a) {
  for (int j = 0; j < 4; ++j) a.v[j] = vreinterpretq_s8_u16(vshlq_n_u16(vreinterpretq_u16_s8(a.v[j]), N));
  return a;
}
inline I zero_i() { const int8x16_t z = vdupq_n_s8(0); return {{z, z, z, z}}; }
inline void prefetch(const uint8_t* p) { __builtin_prefetch(p); }
inline I bcast_i32(const int32_t* p) { const int8x16_t v = vreinterpretq_s8_s32(vdupq_n_s32(*p)); return {{v, v, v, v}}; }
inline I add_i(I a, I b) {
  for (int j = 0; j < 4; ++j)
    a.v[j] = vreinterpretq_s8_s32(vaddq_s32(vreinterpretq_s32_s8(a.v[j]), vreinterpretq_s32_s8(b.v[j])));
  return a;
}

template <bool Q8> struct W { int8x16_t v[8][4]; };
template <bool Q8, bool Shared = true> inline W<Q8> prepare(const I* w) {
  W<Q8> r;
  const int8x16_t flip = vreinterpretq_s8_u8(vdupq_n_u8(0x80));
  for (int g = 0; g < 8; ++g)
    for (int j = 0; j < 4; ++j) r.v[g][j] = Q8 ? veorq_s8(w[g].v[j], flip) : w[g].v[j];
  return r;
}
// acc[c] += sum_i w[g][4c + i] * x[i]: column c's 4 values against the row's 4 (s8 x s8, exact).
template <bool Q8> inline I dot(I acc, const W<Q8>& w, int g, const int8_t* x) {
  int32_t xv;
  std::memcpy(&xv, x, 4);
  const int8x16_t xb = vreinterpretq_s8_s32(vdupq_n_s32(xv));
  for (int j = 0; j < 4; ++j)
    acc.v[j] = vreinterpretq_s8_s32(vdotq_s32(vreinterpretq_s32_s8(acc.v[j]), w.v[g][j], xb));
  return acc;
}

constexpr bool kSums16 = false;  // SDOT widens to 32 bits itself
constexpr int kProductChains = 1;  // not measured on a NEON core (kernel_body.h's dots)
template <int MAXQ, bool Q8> I dots16(I, const W<Q8>&, int, int, const int8_t*);

inline F zero_f() { const float32x4_t z = vdupq_n_f32(0.0f); return {{z, z, z, z}}; }
inline F load_f(const float* p) { F r; for (int j = 0; j < 4; ++j) r.v[j] = vld1q_f32(p + 4 * j); return r; }
inline void store_f(float* p, F v) { for (int j = 0; j < 4; ++j) vst1q_f32(p + 4 * j, v.v[j]); }
inline F bcast_f(float f) { const float32x4_t v = vdupq_n_f32(f); return {{v, v, v, v}}; }
inline F add(F a, F b) { for (int j = 0; j < 4; ++j) a.v[j] = vaddq_f32(a.v[j], b.v[j]); return a; }
inline F mul(F a, F b) { for (int j = 0; j < 4; ++j) a.v[j] = vmulq_f32(a.v[j], b.v[j]); return a; }
// a * b + c and c - a * b, each rounded once (as std::fma in the portable variant).
inline F fma(F a, F b, F c) { for (int j = 0; j < 4; ++j) c.v[j] = vfmaq_f32(c.v[j], a.v[j], b.v[j]); return c; }
inline F fnma(F a, F b, F c) { for (int j = 0; j < 4; ++j) c.v[j] = vfmsq_f32(c.v[j], a.v[j], b.v[j]); return c; }
inline F cvt(I a) {
  F r;
  for (int j = 0; j < 4; ++j) r.v[j] = vcvtq_f32_s32(vreinterpretq_s32_s8(a.v[j]));
  return r;
}
inline F load_f16(const uint8_t* p) {
  F r;
  for (int j = 0; j < 4; ++j) r.v[j] = vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(reinterpret_cast<const uint16_t*>(p + 8 * j))));
  return r;
}
inline F load_u8f(const uint8_t* p) {
  const uint8x16_t b = vld1q_u8(p);
  const uint16x8_t lo = vmovl_u8(vget_low_u8(b)), hi = vmovl_u8(vget_high_u8(b));
  return {{vcvtq_f32_u32(vmovl_u16(vget_low_u16(lo))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(lo))),
           vcvtq_f32_u32(vmovl_u16(vget_low_u16(hi))), vcvtq_f32_u32(vmovl_u16(vget_high_u16(hi)))}};
}
inline F load_s8f(const uint8_t* p) {
  const int8x16_t b = vreinterpretq_s8_u8(vld1q_u8(p));
  const int16x8_t lo = vmovl_s8(vget_low_s8(b)), hi = vmovl_s8(vget_high_s8(b));
  return {{vcvtq_f32_s32(vmovl_s16(vget_low_s16(lo))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(lo))),
           vcvtq_f32_s32(vmovl_s16(vget_low_s16(hi))), vcvtq_f32_s32(vmovl_s16(vget_high_s16(hi)))}};
}
inline F load_partial_f(const float* p, int64_t n) {
  if (n >= 16) return load_f(p);
  alignas(16) float t[16] = {0};
  std::memcpy(t, p, sizeof(float) * n);
  return load_f(t);
}
inline void store_partial_f(float* p, F v, int64_t n) {
  if (n >= 16) return store_f(p, v);
  alignas(16) float t[16];
  store_f(t, v);
  std::memcpy(p, t, sizeof(float) * n);
}
inline void store_bf16(uint16_t* p, F v, int64_t n) {
  alignas(16) float t[16];
  store_f(t, v);
  for (int64_t i = 0; i < std::min<int64_t>(n, 16); ++i) p[i] = bf16_bits(t[i]);
}

// to[0..n) = the bf16 values from[0..n) as fp32 (n a multiple of 4): the attention's keys and values.
inline void widen_bf16(const uint16_t* from, float* to, int64_t n) {
  for (int64_t i = 0; i < n; i += 4) vst1q_f32(to + i, vreinterpretq_f32_u32(vshll_n_u16(vld1_u16(from + i), 16)));
}

inline float amax32(const float* x) {
  float32x4_t m = vabsq_f32(vld1q_f32(x));
  for (int i = 4; i < 32; i += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + i)));
  return vmaxvq_f32(m);
}
// xq[0..32) = round-half-even(x * inv) (FCVTNS); s0, s1: sums of the first and second 16 quants.
inline void quant32(const float* x, float inv, int8_t* q, int32_t* s0, int32_t* s1) {
  const float32x4_t iv = vdupq_n_f32(inv);
  int32x4_t v[8];
  for (int i = 0; i < 8; ++i) v[i] = vcvtnq_s32_f32(vmulq_f32(vld1q_f32(x + 4 * i), iv));
  *s0 = vaddvq_s32(vaddq_s32(vaddq_s32(v[0], v[1]), vaddq_s32(v[2], v[3])));
  *s1 = vaddvq_s32(vaddq_s32(vaddq_s32(v[4], v[5]), vaddq_s32(v[6], v[7])));
  for (int h = 0; h < 2; ++h) {
    const int16x8_t a = vcombine_s16(vmovn_s32(v[4 * h]), vmovn_s32(v[4 * h + 1]));
    const int16x8_t b = vcombine_s16(vmovn_s32(v[4 * h + 2]), vmovn_s32(v[4 * h + 3]));
    vst1q_s8(q + 16 * h, vcombine_s8(vmovn_s16(a), vmovn_s16(b)));
  }
}

}  // namespace ops
#include "kernel_body.h"
#include "layer_body.h"
}  // namespace neon
#pragma GCC pop_options
