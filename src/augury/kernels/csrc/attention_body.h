// The attention of the native layer (layer_body.h includes this file inside its namespace, after
// lanes_body.h): each row's queries against its key set in the KV cache,
// softmax, and the values weighed by it, for pieces of rows that share one pass over the cache.
// Every sum runs in 16 lanes and a fixed tree, with no fused multiply-adds, so a row has the same
// bits on every instruction set, at any row count and in any piece.

// Slot j of row r's key set: [key_lo, key_hi) first, then its extra (tree) slots.
inline int64_t key_slot(const LayerIO& io, int64_t r, int64_t j) {
  const int64_t span = io.key_hi[r] - io.key_lo[r];
  return j < span ? io.key_lo[r] + j : io.extra_slots[io.extra_off[r] + j - span];
}

// The attention's vectors at the instruction set's own width: 16 lanes (v16) as kParts native vectors,
// lane by lane the same arithmetic. GCC lowers the 64-byte v16 on AVX2 through the stack (its sums
// go out as ymm and come back as xmm pairs), so the loops over keys use these instead.
constexpr int kW = ops::kVecFloats, kParts = kLanes / kW;
typedef float vw __attribute__((vector_size(4 * kW)));
typedef uint16_t u16w __attribute__((vector_size(2 * kW)));
typedef uint32_t u32w __attribute__((vector_size(4 * kW)));
inline vw loadw(const float* p) { vw v; std::memcpy(&v, p, sizeof(vw)); return v; }
inline vw loadw(const uint16_t* p) {
  u16w h;
  std::memcpy(&h, p, sizeof(u16w));
  const u32w bits = __builtin_convertvector(h, u32w) << 16;
  vw v;
  std::memcpy(&v, &bits, sizeof(vw));
  return v;
}
inline void storew(float* p, vw v) { std::memcpy(p, &v, sizeof(vw)); }
inline vw splatw(float c) { return splat_as<vw>(c); }

// lane_total's steps below width kW on one native vector: lane l of step w adds lane l + w (a
// shuffle brings it down), so lane 0 ends with the same sum; the other lanes are not used.
template <int W>
inline vw lane_tree(vw v) {
  if constexpr (W == 0) return v;
  else return lane_tree<W / 2>(v + pick(v, lanes_from<W, kW>(std::make_integer_sequence<int, kW>{})));
}

// 16 lanes held as kParts native vectors, down to one: the steps of lane_total of width kW and above,
// which add whole vectors.
inline vw fold_parts(vw* acc) {
  for (int w = kParts / 2; w >= 1; w /= 2)
    for (int p = 0; p < w; ++p) acc[p] += acc[p + w];
  return acc[0];
}

// 16 lanes held as kParts native vectors, summed as lane_total sums them: the whole vectors first,
// the rest on the first vector's lanes.
inline float parts_total(vw* acc) { return lane_tree<kW / 2>(fold_parts(acc))[0]; }

// Keys whose values are widened to fp32 at a time (kKeyBlock * head_dim floats, L1-resident), and
// the native vectors of one head's output held in registers over them: each is a chain of additions
// over the keys, so at least 8 run side by side (on AVX-512 a whole 128-wide head, where 4 were held
// before; docs/benchmarks.md 41 measures this with the other changes of 41b).
constexpr int64_t kKeyBlock = 32;
constexpr int kHeld = std::max(8, 64 / kW);

// out[h][C native vectors] += sum over the block's keys j, in order, of p[h][j] * v[j] (v: row stride D),
// for NH heads of a KV group at once: each value vector is read once for all of them.
template <int C, int NH>
inline void weigh_values(const float* const (&p)[NH], const float* v, int64_t nj, int64_t D, float* const (&out)[NH]) {
  vw acc[NH][C];
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < C; ++c) acc[h][c] = loadw(out[h] + kW * c);
  for (int64_t j = 0; j < nj; ++j) {
    vw pj[NH];
    for (int h = 0; h < NH; ++h) pj[h] = splatw(p[h][j]);
    for (int c = 0; c < C; ++c) {
      const vw vj = loadw(v + j * D + kW * c);
      for (int h = 0; h < NH; ++h) acc[h][c] += pj[h] * vj;
    }
  }
  for (int h = 0; h < NH; ++h)
    for (int c = 0; c < C; ++c) storew(out[h] + kW * c, acc[h][c]);
}

// Lane o of a fold step of half-width H (below): vectors a and b hold blocks of 2H lanes, one block
// a sum; the result holds blocks of H, a's blocks first. Hi picks each block's upper half.
template <int H, bool Hi>
constexpr int fold_lane(int o) {
  const int per = kW / (2 * H), b = o / H, from_b = b >= per ? 1 : 0;
  return from_b * kW + (b - from_b * per) * 2 * H + o % H + (Hi ? H : 0);
}
template <int H, bool Hi, int... O>
constexpr std::integer_sequence<int, fold_lane<H, Hi>(O)...> fold_lanes(std::integer_sequence<int, O...>) {
  return {};
}

// kW sums at once: v[t] (count = kW native vectors, one a sum) -> lane t of the result, each by
// lane_tree's additions in its order (lane m of a block + lane m + H, for H = kW / 2 down to 1),
// two sums' blocks to a vector, where lane_tree spends a shuffle and an add a step on every sum.
template <int H>
inline vw fold_sums(vw* v, int count) {
  constexpr auto lanes = std::make_integer_sequence<int, kW>{};
  for (int m = 0; m < count / 2; ++m)
    v[m] = pick2(v[2 * m], v[2 * m + 1], fold_lanes<H, false>(lanes)) +
           pick2(v[2 * m], v[2 * m + 1], fold_lanes<H, true>(lanes));
  if constexpr (H == 1) return v[0];
  else return fold_sums<H / 2>(v, count / 2);
}

// q . k's products (k widened, D floats) in 16 lanes held as kParts native vectors: lane l sums the
// terms d = l (mod 16) in order.
inline void key_products(const float* q, const float* k, int64_t D, vw* acc) {
  for (int p = 0; p < kParts; ++p) acc[p] = loadw(q + kW * p) * loadw(k + kW * p);
  for (int64_t i = kParts; i < D / kW; i += kParts)
    for (int p = 0; p < kParts; ++p) acc[p] += loadw(q + kW * (i + p)) * loadw(k + kW * (i + p));
}

// q . k * scale for one key, summed as parts_total sums.
inline float key_score(const float* q, const float* k, int64_t D, float scale) {
  vw acc[kParts];
  key_products(q, k, D, acc);
  return parts_total(acc) * scale;
}

// Keys whose products block_scores sums side by side (kParts native vectors each, 16 in all: on
// AVX-512 a whole block of 16 keys, 3-8% faster than 8 at 5 and 16 rows; on AVX2 8 keys, as fast as 4).
constexpr int kScoreKeys = kW < 16 / kParts ? kW : 16 / kParts;

// The same for kW keys at once (k: kW widened keys, row stride D): out[t] = q . k_t * scale, each
// sum's products and additions as key_score's, the lane trees folded together. One key's sum is a
// chain of D / kLanes additions; kScoreKeys keys' chains are interleaved so that the adders do not
// wait on one (on AVX-512, one key at a time, perf found the loop on its additions; docs/benchmarks.md 41b).
inline void block_scores(const float* q, const float* k, int64_t D, float scale, float* out) {
  vw sums[kW];
  for (int t0 = 0; t0 < kW; t0 += kScoreKeys) {
    const float* kt = k + t0 * D;
    vw acc[kScoreKeys][kParts];
    for (int t = 0; t < kScoreKeys; ++t)
      for (int p = 0; p < kParts; ++p) acc[t][p] = loadw(q + kW * p) * loadw(kt + t * D + kW * p);
    for (int64_t i = kParts; i < D / kW; i += kParts)
      for (int p = 0; p < kParts; ++p) {
        const vw qp = loadw(q + kW * (i + p));
        for (int t = 0; t < kScoreKeys; ++t) acc[t][p] += qp * loadw(kt + t * D + kW * (i + p));
      }
    for (int t = 0; t < kScoreKeys; ++t) sums[t0 + t] = fold_parts(acc[t]);
  }
  storew(out, fold_sums<kW / 2>(sums, kW) * splatw(scale));
}

// Rows of one sequence that share a pass over its cache (kMaxPiece), and the scores a piece may hold.
constexpr int64_t kMaxPiece = 16;
constexpr int64_t kPieceFloats = int64_t(1) << 21;  // 8 MB

// One thread's attention buffers: a piece's scores, and keys and values widened to fp32.
struct AttnScratch {
  std::vector<float> scores, keys, values;
};

// Rows [r0, r0 + nr) of one sequence (a piece), for the query heads that share KV head kvh:
// out[g][D] = softmax(q_g . K_j * scale) . V_j over each row's key set. One pass over the cache
// serves the piece: a block of keys (kW) or values (kKeyBlock) is read and widened to fp32 once, and
// every row whose slot range holds it uses it; the keys one row alone sees (its range's ragged ends,
// its tree slots) are read for that row. A row's sums are those of the 16-lane form above, in the
// same order (a score's lanes and tree as parts_total's; out[d] = (((0 + p_0 v_0[d]) + p_1 v_1[d])
// + ...) in key order), so its bits do not depend on the rows it shares a piece with.
template <typename T>
void attend_rows(const LayerDesc& L, const LayerIO& io, int64_t r0, int64_t nr, int64_t kvh, const float* qkv,
                 int64_t n_qkv, float* attn, int64_t n_q, AttnScratch& s) {
  const int64_t D = L.head_dim, group = L.n_heads / L.n_kv, parts = D / kW;
  const CacheRef& c = io.seqs[io.row_seq[r0]];
  const T* keys = static_cast<const T*>(c.k) + kvh * c.stride_head;
  const T* values = static_cast<const T*>(c.v) + kvh * c.stride_head;
  auto widen = [&](const T* base, int64_t slot, float* to) {
    const T* from = base + slot * c.stride_slot;
    if constexpr (std::is_same_v<T, uint16_t>) ops::widen_bf16(from, to, D);  // one widening load a vector
    else for (int64_t i = 0; i < parts; ++i) storew(to + kW * i, loadw(from + kW * i));
  };
  // Row i's key count and scores' offset, and the slots [lo, hi) the rows' ranges span.
  int64_t n[kMaxPiece], off[kMaxPiece + 1], lo = INT64_MAX, hi = INT64_MIN;
  off[0] = 0;
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t r = r0 + i;
    n[i] = io.key_hi[r] - io.key_lo[r] + io.extra_off[r + 1] - io.extra_off[r];
    off[i + 1] = off[i] + group * n[i];
    if (io.key_hi[r] > io.key_lo[r]) {
      lo = std::min(lo, io.key_lo[r]);
      hi = std::max(hi, io.key_hi[r]);
    }
  }
  if (lo > hi) lo = hi = 0;  // no row has a range: only tree slots
  s.scores.resize(off[nr]);
  s.keys.resize(kW * D);
  s.values.resize(kKeyBlock * D);
  float* kb = s.keys.data();
  float* vb = s.values.data();
  auto query = [&](int64_t i, int64_t g) { return qkv + (r0 + i) * n_qkv + (kvh * group + g) * D; };
  auto scores = [&](int64_t i, int64_t g) { return s.scores.data() + off[i] + g * n[i]; };
  // Row i's slots in whole blocks of kW counted from lo, [a[i], e[i]) (empty where it holds none).
  int64_t a[kMaxPiece], e[kMaxPiece];
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t r = r0 + i;
    a[i] = std::min(lo + (io.key_lo[r] - lo + kW - 1) / kW * kW, io.key_hi[r]);
    e[i] = std::max(a[i], lo + (io.key_hi[r] - lo) / kW * kW);
  }

  for (int64_t s0 = lo; s0 + kW <= hi; s0 += kW) {
    bool widened = false;
    for (int64_t i = 0; i < nr; ++i) {
      if (s0 < a[i] || s0 + kW > e[i]) continue;
      if (!widened)
        for (int t = 0; t < kW; ++t) widen(keys, s0 + t, kb + t * D);
      widened = true;
      for (int64_t g = 0; g < group; ++g)
        block_scores(query(i, g), kb, D, L.scale, scores(i, g) + s0 - io.key_lo[r0 + i]);
    }
  }
  // Each row's keys outside its blocks, one at a time: its range's ragged ends, then its tree slots.
  for (int64_t i = 0; i < nr; ++i) {
    const int64_t r = r0 + i, first = io.key_lo[r], span = io.key_hi[r] - first;
    auto score = [&](int64_t j, int64_t slot) {
      widen(keys, slot, kb);
      for (int64_t g = 0; g < group; ++g) scores(i, g)[j] = key_score(query(i, g), kb, D, L.scale);
    };
    for (int64_t slot = first; slot < a[i]; ++slot) score(slot - first, slot);
    for (int64_t slot = e[i]; slot < io.key_hi[r]; ++slot) score(slot - first, slot);
    for (int64_t j = span; j < n[i]; ++j) score(j, key_slot(io, r, j));
  }

  for (int64_t i = 0; i < nr; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      float* sg = scores(i, g);
      vw most = splatw(-INFINITY);
      int64_t j = 0;
      for (; j + kW <= n[i]; j += kW) {
        const vw x = loadw(sg + j);
        most = most < x ? x : most;
      }
      float top = -INFINITY;
      for (int l = 0; l < kW; ++l) top = std::max(top, most[l]);
      for (; j < n[i]; ++j) top = std::max(top, sg[j]);
      for (j = 0; j + kW <= n[i]; j += kW) storew(sg + j, exp_neg(loadw(sg + j) - splatw(top)));
      for (; j < n[i]; ++j) sg[j] = exp_neg(sg[j] - top);
      float* out = attn + (r0 + i) * n_q + (kvh * group + g) * D;
      for (int64_t d = 0; d < D; ++d) out[d] = 0.0f;
    }
  }

  // out += p_j v_j over a widened run of values (row stride D) for every head of row i: two heads at a
  // time where kHeld vectors hold a whole head (the values are read half as often).
  auto weigh = [&](int64_t i, int64_t j, const float* v, int64_t nj) {
    int64_t g0 = 0;
    if (parts == kHeld)
      for (; g0 + 1 < group; g0 += 2) {
        float* og = attn + (r0 + i) * n_q + (kvh * group + g0) * D;
        weigh_values<kHeld, 2>({scores(i, g0) + j, scores(i, g0 + 1) + j}, v, nj, D, {og, og + D});
      }
    for (int64_t g = g0; g < group; ++g) {
      const float* p = scores(i, g) + j;
      float* og = attn + (r0 + i) * n_q + (kvh * group + g) * D;
      int64_t k = 0;
      for (; k + kHeld <= parts; k += kHeld) weigh_values<kHeld, 1>({p}, v + kW * k, nj, D, {og + kW * k});
      for (; k + kHeld / 2 <= parts; k += kHeld / 2) weigh_values<kHeld / 2, 1>({p}, v + kW * k, nj, D, {og + kW * k});
      for (; k < parts; ++k) weigh_values<1, 1>({p}, v + kW * k, nj, D, {og + kW * k});
    }
  };
  for (int64_t v0 = lo; v0 < hi; v0 += kKeyBlock) {
    const int64_t nj = std::min(kKeyBlock, hi - v0);
    bool widened = false;
    for (int64_t i = 0; i < nr; ++i) {
      const int64_t r = r0 + i, a = std::max(v0, io.key_lo[r]), e = std::min(v0 + nj, io.key_hi[r]);
      if (a >= e) continue;
      if (!widened)
        for (int64_t j = 0; j < nj; ++j) widen(values, v0 + j, vb + j * D);
      widened = true;
      weigh(i, a - io.key_lo[r], vb + (a - v0) * D, e - a);
    }
  }
  for (int64_t i = 0; i < nr; ++i) {  // tree slots, after the range: key order
    const int64_t r = r0 + i, span = io.key_hi[r] - io.key_lo[r];
    for (int64_t j0 = span; j0 < n[i]; j0 += kKeyBlock) {
      const int64_t nj = std::min(kKeyBlock, n[i] - j0);
      for (int64_t j = 0; j < nj; ++j) widen(values, key_slot(io, r, j0 + j), vb + j * D);
      weigh(i, j0, vb, nj);
    }
  }

  for (int64_t i = 0; i < nr; ++i) {
    for (int64_t g = 0; g < group; ++g) {
      const float* sg = scores(i, g);
      float acc[kLanes] = {0};
      int64_t j = 0;
      for (; j + kLanes <= n[i]; j += kLanes)
        for (int l = 0; l < kLanes; ++l) acc[l] += sg[j + l];
      for (int l = 0; j + l < n[i]; ++l) acc[l] += sg[j + l];
      const float inv = 1.0f / lane_total(acc);
      float* out = attn + (r0 + i) * n_q + (kvh * group + g) * D;
      for (int64_t d = 0; d < D; ++d) out[d] *= inv;
    }
  }
}

// Where the attention's pieces start (ascending, ending with R): runs of rows of one sequence, cut
// to kMaxPiece rows, to kPieceFloats of scores, and short enough that each of nt threads gets a
// (piece, KV head) where the rows allow it.
inline void cut_pieces(const LayerDesc& L, const LayerIO& io, int64_t nt, std::vector<int64_t>& starts) {
  const int64_t R = io.R, group = L.n_heads / L.n_kv;
  int64_t most_keys = 1;
  for (int64_t r = 0; r < R; ++r)
    most_keys = std::max(most_keys, io.key_hi[r] - io.key_lo[r] + io.extra_off[r + 1] - io.extra_off[r]);
  const int64_t by_threads = (R * L.n_kv + nt - 1) / nt;
  const int64_t cap = std::max<int64_t>(1, std::min({kMaxPiece, by_threads, kPieceFloats / (group * most_keys)}));
  starts.clear();
  for (int64_t r = 0; r < R; ++r)
    if (starts.empty() || io.row_seq[r] != io.row_seq[starts.back()] || r - starts.back() >= cap) starts.push_back(r);
  starts.push_back(R);
}
