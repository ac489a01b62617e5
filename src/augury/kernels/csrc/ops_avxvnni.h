// Included by gguf_matmul.cpp (after ops_avx2.h): one instruction set's vector operations and the
// kernel and layer bodies compiled over them.
#pragma once

// ---------------------------------------------------------------------------------------------
// AVX2 with AVX-VNNI (the VEX-coded 256-bit vpdpbusd: Intel since Alder Lake, many of them without
// AVX-512; AMD since Zen 5). Everything is AVX2's (ops_avx2.h) except the products: one vpdpbusd
// multiplies 8 columns x 4 values of one row and adds them into 32-bit sums, where AVX2 needs
// vpmaddubsw, a 16-bit add and, now and then, vpmaddwd and a 32-bit add. The integer sums are exact
// either way, so this variant's bits are AVX2's.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avxvnni")
namespace avxvnni {
namespace ops {

using namespace avx2::ops;  // AVX2's types and operations (inlined into this target's code)

constexpr bool kSums16 = false;  // vpdpbusd widens to 32 bits itself

// Q8_0 keeps AVX2's form (|w| as u8 times x with w's sign as s8), with no zero point.
template <bool Q8> inline I dot(I acc, const W<Q8>& w, int g, const int8_t* x) {
  int32_t xv;
  std::memcpy(&xv, x, 4);
  const __m256i xb = _mm256_set1_epi32(xv);
  if constexpr (Q8)
    return {_mm256_dpbusd_avx_epi32(acc.lo, w.lo[g], _mm256_sign_epi8(xb, w.slo[g])),
            _mm256_dpbusd_avx_epi32(acc.hi, w.hi[g], _mm256_sign_epi8(xb, w.shi[g]))};
  else
    return {_mm256_dpbusd_avx_epi32(acc.lo, w.lo[g], xb), _mm256_dpbusd_avx_epi32(acc.hi, w.hi[g], xb)};
}

}  // namespace ops
#include "kernel_body.h"
#include "layer_body.h"
}  // namespace avxvnni
#pragma GCC pop_options
