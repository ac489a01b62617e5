// The native layer's numbers in lanes (layer_body.h includes this file inside its namespace, before
// the attention and the layer that both use it): 16 fp32 lanes and their fixed summation tree, bf16
// loads and stores, lanes picked by constant indices, and a branch-free exp for softmax terms.
// Everything here is plain C++ (GCC/Clang vector extensions) that each instruction set's region
// compiles for itself, the same operations in the same order, so the bits do not depend on it.

constexpr int kLanes = 16;

inline float lane_total(float* acc) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) acc[l] += acc[l + w];
  return acc[0];
}

inline float load(const float* p, int64_t i) { return p[i]; }
inline float load(const uint16_t* p, int64_t i) {
  const uint32_t bits = static_cast<uint32_t>(p[i]) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline void store(float* p, int64_t i, float v) { p[i] = v; }
inline void store(uint16_t* p, int64_t i, float v) { p[i] = bf16_bits(v); }

// 16 fp32 lanes as one value (GCC/Clang vector extension: elementwise IEEE operations that the
// compiler lowers to whatever SIMD the region targets, or to scalar code).
typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

// Written out lane by lane, not as `v16{} + c`: inside a loop GCC built that from 16 scalar stores and
// a reload (measured in the attention before its loops moved to the native width, docs/benchmarks.md 14b).
inline v16 splat(float c) { return v16{c, c, c, c, c, c, c, c, c, c, c, c, c, c, c, c}; }

// exp(x) for x <= 0 (softmax terms after the max is subtracted), in branch-free arithmetic the
// compiler vectorises: x = n ln2 + f, |f| <= ln2 / 2, e^f by its degree-6 Taylor polynomial
// (relative error < 2e-7 at |f| = ln2 / 2, a few fp32 ulps in all), times 2^n built in the
// exponent bits. Below -87 the result is flushed to 0.
// Written once for a float and for any float vector (16 lanes, or the native width): the same
// operations in the same order, so every lane has the scalar's bits.
inline float at_least(float x, float lo) { return std::max(x, lo); }

// Lanes picked by constant indices (GCC's __builtin_shuffle since 4.7, Clang's
// __builtin_shufflevector): one register shuffle, where a loop over the lanes went through memory.
// pick2 indexes a's lanes, then b's; pick picks from one vector.
template <typename V, int... I>
inline V pick2(V a, V b, std::integer_sequence<int, I...>) {
#if defined(__clang__)
  return __builtin_shufflevector(a, b, I...);
#else
  typedef int32_t iv __attribute__((vector_size(sizeof(V))));
  return __builtin_shuffle(a, b, iv{I...});
#endif
}
template <typename V, int... I>
inline V pick(V v, std::integer_sequence<int, I...> lanes) { return pick2(v, v, lanes); }
template <int... I>
constexpr std::integer_sequence<int, (I * 0)...> all_lane0(std::integer_sequence<int, I...>) { return {}; }
template <int W, int N, int... I>
constexpr std::integer_sequence<int, ((I + W) % N)...> lanes_from(std::integer_sequence<int, I...>) { return {}; }

// c in every lane: a broadcast (a loop storing each lane compiled to 16 masked broadcasts on AVX-512).
template <typename V> inline V splat_as(float c) {
  V v{};
  v[0] = c;
  return pick(v, all_lane0(std::make_integer_sequence<int, sizeof(V) / sizeof(float)>{}));
}
template <typename V> inline V at_least(V x, float lo) { return x < splat_as<V>(lo) ? splat_as<V>(lo) : x; }
inline float pow2(float n) {  // 2^n for an integral n in [-126, 127], from its exponent bits
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}
template <typename V> inline V pow2(V n) {
  typedef int32_t iv __attribute__((vector_size(sizeof(V))));
  const iv bits = (__builtin_convertvector(n, iv) + 127) << 23;
  V out;
  std::memcpy(&out, &bits, sizeof(V));
  return out;
}

template <typename V>
inline V exp_neg(V x) {
  x = at_least(x, -87.0f);
  const V n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest
  const V f = (x - n * 0.693145752f) - n * 1.42860677e-6f;     // ln2 in two parts
  V p = V{} + 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  return p * pow2(n);
}


inline v16 load16(const float* p) { v16 v; std::memcpy(&v, p, 64); return v; }
inline v16 load16(const uint16_t* p) {
  u16x16 h;
  std::memcpy(&h, p, 32);
  const u32x16 bits = __builtin_convertvector(h, u32x16) << 16;
  v16 v;
  std::memcpy(&v, &bits, 64);
  return v;
}
inline void store16(float* p, v16 v) { std::memcpy(p, &v, 64); }
