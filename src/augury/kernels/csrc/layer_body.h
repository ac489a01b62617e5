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

namespace layer {

#include "lanes_body.h"

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

#include "attention_body.h"

// Row r's keys and values of KV head kvh (after RoPE) into its cache slot.
template <typename T>
void write_kv(const LayerDesc& L, const LayerIO& io, const float* qkv, int64_t n_qkv, int64_t r, int64_t kvh) {
  const int64_t D = L.head_dim;
  const CacheRef& c = io.seqs[io.row_seq[r]];
  const float* k = qkv + r * n_qkv + (L.n_heads + kvh) * D;
  const float* v = k + L.n_kv * D;
  T* kd = static_cast<T*>(c.k) + kvh * c.stride_head + io.row_slot[r] * c.stride_slot;
  T* vd = static_cast<T*>(c.v) + kvh * c.stride_head + io.row_slot[r] * c.stride_slot;
  for (int64_t d = 0; d < D; ++d) {
    store(kd, d, k[d]);
    store(vd, d, v[d]);
  }
}

inline v16 abs16(v16 x) { return x < splat(0.0f) ? -x : x; }

// act(gate) * up on 16 lanes, from e^-|t| alone (no overflow at any input):
//   silu(g) = g * sigmoid(g), sigmoid(g) = 1 / (1 + e^-g) for g >= 0, e^g / (1 + e^g) below;
//   gelu(g) = g / 2 * (1 + tanh(y)), y = sqrt(2 / pi) (g + 0.044715 g^3), tanh(y) = sign(y) (1 - e^-2|y|) / (1 + e^-2|y|).
inline v16 act_times_up(v16 g, v16 up, bool gelu) {
  if (gelu) {
    const v16 y = (g + g * g * g * 0.044715f) * 0.7978845608028654f;
    const v16 e = exp_neg(abs16(y) * -2.0f);
    const v16 t = (1.0f - e) / (1.0f + e);
    return g * 0.5f * (1.0f + (y < splat(0.0f) ? -t : t)) * up;
  }
  const v16 e = exp_neg(-abs16(g));
  const v16 sig = g < splat(0.0f) ? e / (1.0f + e) : 1.0f / (1.0f + e);
  return g * sig * up;
}

// One layer's activations in fp32 and its quantized matmul inputs, reused by every call on a
// thread (no allocation per call once grown).
struct Scratch {
  std::vector<float> h, qkv, attn, proj, gu;
  body::QuantBuffers quant;
  TileQueue qkv_tiles, wo_tiles, gate_up_tiles, down_tiles;  // each matmul's tiles, shared by stealing
  std::vector<int64_t> pieces;  // where the attention's pieces of rows start (cut_pieces)
};

inline Scratch& scratch() {
  static thread_local Scratch s;
  return s;
}

inline void barrier() {
#pragma omp barrier
}

// Thread th of nt's part of one layer (below), between barriers: every phase splits its rows,
// heads or blocks between the threads, and no result depends on the split.
inline void forward_part(const LayerDesc& L, const LayerIO& io, Scratch& s, int64_t th, int64_t nt) {
  const int64_t R = io.R, H = L.hidden, D = L.head_dim, I = L.inter;
  const int64_t n_q = L.n_heads * D, n_qkv = (L.n_heads + 2 * L.n_kv) * D;
  int64_t lo, hi;
  // Thread th's rows of a per-row phase (a norm needs its whole row).
  auto rows = [&](auto&& fn) {
    for (int64_t r = th; r < R; r += nt) fn(r);
  };
  auto quantize_row = [&](const float* x, int64_t n, int64_t r) {
    for (int64_t b = 0; b < n / 32; ++b) s.quant.quantize(n, x + r * n + 32 * b, r, b);
  };
  auto matmul = [&](const MatDesc& m, TileQueue& tiles, const float* bias, float* y, int64_t ldy) {
    matmul_share(s.quant.rows(m.n_in), R, m, bias, y, false, ldy, body::tile_fn, th, tiles);
  };

  // Attention: norm, qkv (+ bias), q/k norms, RoPE, cache write, each row over its keys, output.
  rows([&](int64_t r) {
    rms_norm(io.x + r * H, L.attn_norm, H, L.eps, s.h.data() + r * H);
    quantize_row(s.h.data(), H, r);
  });
  barrier();
  matmul(L.qkv, s.qkv_tiles, L.bqkv, s.qkv.data(), n_qkv);
  barrier();
  const int64_t heads = L.n_heads + L.n_kv;  // q heads, then k heads
  share(R * heads, th, nt, lo, hi);
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t r = i / heads, h = i % heads;
    float* x = s.qkv.data() + r * n_qkv + h * D;
    const float* w = h < L.n_heads ? L.q_norm : L.k_norm;
    if (w != nullptr) rms_norm(x, w, D, L.eps, x);
    rope(x, io.cos + r * D, io.sin + r * D, D);
    if (h >= L.n_heads) {
      if (io.cache_bf16) write_kv<uint16_t>(L, io, s.qkv.data(), n_qkv, r, h - L.n_heads);
      else write_kv<float>(L, io, s.qkv.data(), n_qkv, r, h - L.n_heads);
    }
  }
  barrier();
  static thread_local AttnScratch attn_scratch;
  const int64_t pieces = static_cast<int64_t>(s.pieces.size()) - 1;
  share(pieces * L.n_kv, th, nt, lo, hi);
  for (int64_t i = lo; i < hi; ++i) {  // a KV head's pieces on one thread where the count allows
    const int64_t kvh = i / pieces, p = i % pieces, r0 = s.pieces[p], nr = s.pieces[p + 1] - r0;
    if (io.cache_bf16) attend_rows<uint16_t>(L, io, r0, nr, kvh, s.qkv.data(), n_qkv, s.attn.data(), n_q, attn_scratch);
    else attend_rows<float>(L, io, r0, nr, kvh, s.qkv.data(), n_qkv, s.attn.data(), n_q, attn_scratch);
  }
  barrier();
  share(R * (n_q / 32), th, nt, lo, hi);
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t r = i / (n_q / 32), b = i % (n_q / 32);
    s.quant.quantize(n_q, s.attn.data() + r * n_q + 32 * b, r, b);
  }
  barrier();
  matmul(L.wo, s.wo_tiles, nullptr, s.proj.data(), H);
  barrier();

  // MLP: (post norm), residual, norm, gate/up, act(gate) * up, down, (post norm), residual.
  rows([&](int64_t r) {
    float* p = s.proj.data() + r * H;
    if (L.post_attn_norm != nullptr) rms_norm(p, L.post_attn_norm, H, L.eps, p);
    for (int64_t i = 0; i < H; ++i) io.x[r * H + i] += p[i];
    rms_norm(io.x + r * H, L.mlp_norm, H, L.eps, s.h.data() + r * H);
    quantize_row(s.h.data(), H, r);
  });
  barrier();
  matmul(L.gate_up, s.gate_up_tiles, nullptr, s.gu.data(), 2 * I);
  barrier();
  share(R * (I / 32), th, nt, lo, hi);
  for (int64_t i = lo; i < hi; ++i) {
    const int64_t r = i / (I / 32), b = i % (I / 32);
    const float* g = s.gu.data() + r * 2 * I + 32 * b;
    alignas(64) float act[32];
    for (int half = 0; half < 2; ++half)
      store16(act + kLanes * half, act_times_up(load16(g + kLanes * half), load16(g + I + kLanes * half), L.gelu));
    s.quant.quantize(I, act, r, b);
  }
  barrier();
  matmul(L.down, s.down_tiles, nullptr, s.proj.data(), H);
  barrier();
  rows([&](int64_t r) {
    float* p = s.proj.data() + r * H;
    if (L.post_mlp_norm != nullptr) rms_norm(p, L.post_mlp_norm, H, L.eps, p);
    for (int64_t i = 0; i < H; ++i) io.x[r * H + i] += p[i];
  });
}

// One layer for io.R rows in one parallel region: the matmuls' tiles, the heads and the blocks are
// shared between the threads phase by phase, with a barrier between phases, instead of a fork and
// a join per matmul and serial work between them.
inline void forward(const LayerDesc& L, const LayerIO& io) {
  Scratch& s = scratch();  // the caller's: every thread of the region works in these buffers
  const int64_t R = io.R, H = L.hidden, n_q = L.n_heads * L.head_dim, I = L.inter;
  s.h.resize(R * H);
  s.qkv.resize(R * (L.n_heads + 2 * L.n_kv) * L.head_dim);
  s.attn.resize(R * n_q);
  s.proj.resize(R * H);
  s.gu.resize(R * 2 * I);
  s.quant.reserve(R, std::max({H, n_q, I}));  // grown here, before the threads share it
  const int nt = std::max(1, at::get_num_threads());
  s.qkv_tiles.reset(L.qkv, nt);  // a team smaller than nt leaves shares with no owner: the others steal them
  s.wo_tiles.reset(L.wo, nt);
  s.gate_up_tiles.reset(L.gate_up, nt);
  s.down_tiles.reset(L.down, nt);
  cut_pieces(L, io, nt, s.pieces);
#pragma omp parallel num_threads(nt)
  forward_part(L, io, s, omp_get_thread_num(), omp_get_num_threads());
}

}  // namespace layer
