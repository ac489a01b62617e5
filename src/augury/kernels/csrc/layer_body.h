// One transformer layer in C++ for a block of 1-64 new rows (decode steps, verification chains and
// trees, server batches): RMSNorm, the fused QKV matmul and bias, per-head q/k norms, RoPE, the KV
// cache write, attention over each row's own key set, the output projection, residual, norm,
// gate/up, SiLU or GELU times up, down, residual. What the decoder's ~50 torch ops per layer do,
// in one call without the GIL (decoder.py keeps that torch path as the reference and fallback).
//
// Included once per instruction set (ops_*.h), after kernel_body.h: the matmuls are that set's
// kernel, and the loops below are plain C++ the compiler vectorises for it. Every reduction runs
// in 16 lanes and then a fixed tree, with no fused multiply-adds (built with -ffp-contract=off),
// so a row's result has the same bits on every instruction set, at any row count and thread count:
// rows never mix, and each row attends to exactly the keys it sees, in slot order.

// The matmul driver over this instruction set's tiles.
inline void matmul(const float* x, int64_t R, const MatDesc& m, const float* bias, void* y, bool bf16_out,
                   int64_t ldy) {
  run_matmul<body::Rows>(x, R, m, bias, y, bf16_out, ldy, body::tile_fn, body::quantize_rows);
}

namespace layer {

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
// Round to nearest even (torch's float -> bfloat16), NaN -> quiet NaN.
inline void store(uint16_t* p, int64_t i, float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  p[i] = v != v ? 0x7FC0 : static_cast<uint16_t>((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// sum_i a[i] * b[i]: lane l sums the terms i = l (mod 16) in order, then the lanes add as a tree.
template <typename T>
inline float dot(const float* a, const T* b, int64_t n) {
  float acc[kLanes] = {0};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) acc[l] += a[i + l] * load(b, i + l);
  for (int l = 0; i + l < n; ++l) acc[l] += a[i + l] * load(b, i + l);
  return lane_total(acc);
}

// out[n] = x * (1 / sqrt(mean(x^2) + eps)) * w (w holds the whole multiplier: gemma's 1 + w is folded in).
inline void rms_norm(const float* x, const float* w, int64_t n, float eps, float* out) {
  const float inv = 1.0f / std::sqrt(dot(x, x, n) / static_cast<float>(n) + eps);
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * inv * w[i];
}

// Rotary embedding, half-split layout, in place: x[d] cos[d] - x[d + h] sin[d], x[d + h] cos[d + h] + x[d] sin[d + h].
inline void rope(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = x[i], b = x[i + half];
    x[i] = a * cos[i] - b * sin[i];
    x[i + half] = b * cos[i + half] + a * sin[i + half];
  }
}

// Slot j of row r's key set: [key_lo, key_hi) first, then its extra (tree) slots.
inline int64_t key_slot(const LayerIO& io, int64_t r, int64_t j) {
  const int64_t span = io.key_hi[r] - io.key_lo[r];
  return j < span ? io.key_lo[r] + j : io.extra_slots[io.extra_off[r] + j - span];
}

// exp(x) for x <= 0 (softmax terms after the max is subtracted), in branch-free arithmetic the
// compiler vectorises: x = n ln2 + f, |f| <= ln2 / 2, e^f by its degree-6 Taylor polynomial
// (relative error < 2e-7 at |f| = ln2 / 2, a few fp32 ulps in all), times 2^n built in the
// exponent bits. Below -87 the result is flushed to 0.
inline float exp_neg(float x) {
  x = std::max(x, -87.0f);
  const float n = (x * 1.44269504f + 12582912.0f) - 12582912.0f;  // round to nearest
  const float f = (x - n * 0.693145752f) - n * 1.42860677e-6f;     // ln2 in two parts
  float p = 1.0f / 720.0f;
  p = p * f + 1.0f / 120.0f;
  p = p * f + 1.0f / 24.0f;
  p = p * f + 1.0f / 6.0f;
  p = p * f + 0.5f;
  p = p * f + 1.0f;
  p = p * f + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}

// 16 fp32 lanes as one value (GCC/Clang vector extension: elementwise IEEE operations that the
// compiler lowers to whatever SIMD the region targets, or to scalar code).
typedef float v16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

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
inline float hsum(v16 v) {
  float a[kLanes];
  std::memcpy(a, &v, 64);
  return lane_total(a);
}

constexpr int kMaxChunks = 16;  // head_dim <= 256

// Row r's attention for the query heads that share KV head kvh: out[g][D] = softmax(q_g . K_j *
// scale) . V_j over the row's key set, for g in the group. Each key and value row is read and
// widened to fp32 once for the whole group (D / 16 vectors), not once per head.
template <typename T>
void attend_group(const LayerDesc& L, const LayerIO& io, int64_t r, int64_t kvh, const float* q, float* out,
                  std::vector<float>& scores) {
  const int64_t D = L.head_dim, group = L.n_heads / L.n_kv, chunks = D / kLanes;
  const CacheRef& c = io.seqs[io.row_seq[r]];
  const T* keys = static_cast<const T*>(c.k) + kvh * c.stride_head;
  const T* values = static_cast<const T*>(c.v) + kvh * c.stride_head;
  const int64_t n = io.key_hi[r] - io.key_lo[r] + io.extra_off[r + 1] - io.extra_off[r];
  scores.resize(group * n);
  v16 row[kMaxChunks];
  for (int64_t j = 0; j < n; ++j) {
    const T* k = keys + key_slot(io, r, j) * c.stride_slot;
    for (int64_t ch = 0; ch < chunks; ++ch) row[ch] = load16(k + kLanes * ch);
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * D;
      v16 acc = load16(qg) * row[0];
      for (int64_t ch = 1; ch < chunks; ++ch) acc += load16(qg + kLanes * ch) * row[ch];
      scores[g * n + j] = hsum(acc) * L.scale;
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores.data() + g * n;
    float top = -INFINITY;
    for (int64_t j = 0; j < n; ++j) top = std::max(top, sg[j]);
    for (int64_t j = 0; j < n; ++j) sg[j] = exp_neg(sg[j] - top);
    for (int64_t d = 0; d < D; ++d) out[g * D + d] = 0.0f;
  }
  for (int64_t j = 0; j < n; ++j) {
    const T* v = values + key_slot(io, r, j) * c.stride_slot;
    for (int64_t ch = 0; ch < chunks; ++ch) row[ch] = load16(v + kLanes * ch);
    for (int64_t g = 0; g < group; ++g) {
      const v16 p = v16{} + scores[g * n + j];
      float* og = out + g * D;
      for (int64_t ch = 0; ch < chunks; ++ch) store16(og + kLanes * ch, load16(og + kLanes * ch) + p * row[ch]);
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const float* sg = scores.data() + g * n;
    float acc[kLanes] = {0};
    int64_t j = 0;
    for (; j + kLanes <= n; j += kLanes)
      for (int l = 0; l < kLanes; ++l) acc[l] += sg[j + l];
    for (int l = 0; j + l < n; ++l) acc[l] += sg[j + l];
    const float inv = 1.0f / lane_total(acc);
    for (int64_t d = 0; d < D; ++d) out[g * D + d] *= inv;
  }
}

template <typename T>
void write_kv(const LayerDesc& L, const LayerIO& io, const float* qkv, int64_t n_qkv) {
  const int64_t D = L.head_dim, q_size = L.n_heads * D, kv_size = L.n_kv * D;
  for (int64_t r = 0; r < io.R; ++r) {
    const CacheRef& c = io.seqs[io.row_seq[r]];
    const float* k = qkv + r * n_qkv + q_size;
    const float* v = k + kv_size;
    for (int64_t h = 0; h < L.n_kv; ++h) {
      T* kd = static_cast<T*>(c.k) + h * c.stride_head + io.row_slot[r] * c.stride_slot;
      T* vd = static_cast<T*>(c.v) + h * c.stride_head + io.row_slot[r] * c.stride_slot;
      for (int64_t d = 0; d < D; ++d) {
        store(kd, d, k[h * D + d]);
        store(vd, d, v[h * D + d]);
      }
    }
  }
}

inline float activation(float g, bool gelu) {
  if (gelu) return 0.5f * g * (1.0f + std::tanh(0.7978845608028654f * (g + 0.044715f * g * g * g)));
  return g / (1.0f + std::exp(-g));
}

// Scratch reused by every call on a thread (no allocation per call once grown).
struct Scratch {
  std::vector<float> h, qkv, attn, proj, gu, act;
};

inline Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

inline void forward(const LayerDesc& L, const LayerIO& io) {
  // A reference, not the thread-local itself: the attention threads below must see the caller's buffers.
  Scratch& s = scratch();
  const int64_t R = io.R, H = L.hidden, D = L.head_dim, I = L.inter;
  const int64_t n_q = L.n_heads * D, n_qkv = (L.n_heads + 2 * L.n_kv) * D;
  s.h.resize(R * H);
  s.qkv.resize(R * n_qkv);
  s.attn.resize(R * n_q);
  s.proj.resize(R * H);
  s.gu.resize(R * 2 * I);
  s.act.resize(R * I);

  // Attention: norm, qkv (+ bias), q/k norms, RoPE, cache write, each row over its keys, output.
  for (int64_t r = 0; r < R; ++r) rms_norm(io.x + r * H, L.attn_norm, H, L.eps, s.h.data() + r * H);
  matmul(s.h.data(), R, L.qkv, L.bqkv, s.qkv.data(), false, n_qkv);
  for (int64_t r = 0; r < R; ++r) {
    float* row = s.qkv.data() + r * n_qkv;
    for (int64_t h = 0; h < L.n_heads + L.n_kv; ++h) {  // q heads, then k heads
      float* x = row + h * D;
      const float* w = h < L.n_heads ? L.q_norm : L.k_norm;
      if (w != nullptr) rms_norm(x, w, D, L.eps, x);
      rope(x, io.cos + r * D, io.sin + r * D, D);
    }
  }
  if (io.cache_bf16) write_kv<uint16_t>(L, io, s.qkv.data(), n_qkv);
  else write_kv<float>(L, io, s.qkv.data(), n_qkv);
  const int64_t group = L.n_heads / L.n_kv;
  at::parallel_for(0, R * L.n_kv, 1, [&](int64_t begin, int64_t end) {
    static thread_local std::vector<float> scores;
    for (int64_t i = begin; i < end; ++i) {
      const int64_t r = i / L.n_kv, kvh = i % L.n_kv;
      const float* q = s.qkv.data() + r * n_qkv + kvh * group * D;
      float* out = s.attn.data() + r * n_q + kvh * group * D;
      if (io.cache_bf16) attend_group<uint16_t>(L, io, r, kvh, q, out, scores);
      else attend_group<float>(L, io, r, kvh, q, out, scores);
    }
  });
  matmul(s.attn.data(), R, L.wo, nullptr, s.proj.data(), false, H);
  for (int64_t r = 0; r < R; ++r) {
    float* p = s.proj.data() + r * H;
    if (L.post_attn_norm != nullptr) rms_norm(p, L.post_attn_norm, H, L.eps, p);
    for (int64_t i = 0; i < H; ++i) io.x[r * H + i] += p[i];
  }

  // MLP: norm, gate/up, act(gate) * up, down, (post norm), residual.
  for (int64_t r = 0; r < R; ++r) rms_norm(io.x + r * H, L.mlp_norm, H, L.eps, s.h.data() + r * H);
  matmul(s.h.data(), R, L.gate_up, nullptr, s.gu.data(), false, 2 * I);
  for (int64_t r = 0; r < R; ++r)
    for (int64_t i = 0; i < I; ++i)
      s.act[r * I + i] = activation(s.gu[r * 2 * I + i], L.gelu) * s.gu[r * 2 * I + I + i];
  matmul(s.act.data(), R, L.down, nullptr, s.proj.data(), false, H);
  for (int64_t r = 0; r < R; ++r) {
    float* p = s.proj.data() + r * H;
    if (L.post_mlp_norm != nullptr) rms_norm(p, L.post_mlp_norm, H, L.eps, p);
    for (int64_t i = 0; i < H; ++i) io.x[r * H + i] += p[i];
  }
}

}  // namespace layer
