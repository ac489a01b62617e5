// augury's native code on GGUF block weights repacked by augury/kernels/packing.py: the matmul
// y[R, out] = x[R, in] @ W^T (kernel_body.h) and one decoder layer (layer_body.h).
//
// Built at first use by augury/kernels/extension.py (torch.utils.cpp_extension.load).
// The bodies are compiled for AVX-512 VNNI, for AVX2 with AVX-VNNI and for plain AVX2 in
// `#pragma GCC target` regions (x86), for NEON with the dot-product instructions (aarch64), and as
// portable C++ without intrinsics (any CPU); the variant is chosen at run time by cpuid or the
// kernel's hwcaps (or AUGURY_ISA), so the library needs no -march flags and loads on any CPU of its
// architecture.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <omp.h>

#if defined(__x86_64__) || defined(__i386__)
#define AUGURY_X86 1
#include <immintrin.h>
#endif
#if defined(__aarch64__)
#define AUGURY_ARM 1
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <vector>

#include "common.h"
#include "ops_portable.h"
#include "argmax.h"
#include "requantize.h"
#if AUGURY_X86
#include "ops_avx2.h"
#include "ops_avxvnni.h"
#include "ops_avx512.h"
#endif
#if AUGURY_ARM
#include "ops_neon.h"
#endif

// ---------------------------------------------------------------------------------------------

namespace {

bool cpu_has(const std::string& isa) {
  if (isa == "portable") return true;
#if AUGURY_X86
  __builtin_cpu_init();
  if (isa == "avx512")
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vnni");
  if (isa == "avx2") return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  if (isa == "avxvnni") return cpu_has("avx2") && __builtin_cpu_supports("avxvnni");
#endif
#if AUGURY_ARM
  if (isa == "neon") return (getauxval(AT_HWCAP) & HWCAP_ASIMDDP) != 0;
#endif
  return false;
}

std::vector<std::string> available_isas() {
  std::vector<std::string> out;
  for (const char* name : {"avx512", "avxvnni", "avx2", "neon", "portable"})
    if (cpu_has(name)) out.emplace_back(name);
  return out;
}

// One instruction set's entry points: the matmul driver and the transformer layer over its body.
struct IsaFns {
  void (*matmul)(const float*, int64_t, const MatDesc&, const float*, void*, bool, int64_t);
  void (*layer)(const LayerDesc&, const LayerIO&);
};

const IsaFns& isa_fns(const std::string& isa) {
  static const IsaFns portable_fns{portable::body::matmul, portable::layer::forward};
#if AUGURY_X86
  static const IsaFns avx2_fns{avx2::body::matmul, avx2::layer::forward};
  static const IsaFns avxvnni_fns{avxvnni::body::matmul, avxvnni::layer::forward};
  static const IsaFns avx512_fns{avx512::body::matmul, avx512::layer::forward};
#endif
#if AUGURY_ARM
  static const IsaFns neon_fns{neon::body::matmul, neon::layer::forward};
#endif
  const std::string use = isa == "auto" ? available_isas().front() : isa;
  TORCH_CHECK(cpu_has(use), "this CPU cannot run the ", use, " kernel");
#if AUGURY_X86
  if (use == "avx512") return avx512_fns;
  if (use == "avxvnni") return avxvnni_fns;
  if (use == "avx2") return avx2_fns;
#endif
#if AUGURY_ARM
  if (use == "neon") return neon_fns;
#endif
  return portable_fns;
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
  MatDesc m;
  m.n_in = n_in;
  for (size_t p = 0; p < packed.size(); ++p) m.add(packed[p].data_ptr<uint8_t>(), kinds[p], rows[p]);
  const IsaFns& fns = isa_fns(isa);
  fns.matmul(x32.data_ptr<float>(), x.size(0), m, bp, y.data_ptr(), y.scalar_type() == torch::kBFloat16, out);
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
#if AUGURY_X86
  const uint8_t* base = packed.data_ptr<uint8_t>();
  uint16_t* o = reinterpret_cast<uint16_t*>(out.data_ptr());
  const auto fn = avx512::prefill::dequant_fn(static_cast<int>(kind));
  const int64_t count = (n + 15) / 16;
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      fn(base + (tile0 + t) * tile_bytes, groups, n_in, std::min<int64_t>(16, n - 16 * t), o + 16 * t * n_in);
  });
#endif
  return out;
}

using Matrix = std::tuple<std::vector<torch::Tensor>, std::vector<int64_t>, std::vector<int64_t>>;

const float* optional_f32(const c10::optional<torch::Tensor>& t, int64_t n, const char* name,
                          std::vector<torch::Tensor>& keep) {
  if (!t.has_value()) return nullptr;
  TORCH_CHECK(t->scalar_type() == torch::kFloat && t->is_contiguous() && t->numel() == n, name,
              " must be a contiguous float32 tensor of ", n, " values");
  keep.push_back(*t);
  return t->data_ptr<float>();
}

// One decoder layer on GGUF blocks (layer_body.h), built once per layer at load.
class NativeLayer {
 public:
  NativeLayer(const torch::Tensor& attn_norm, const torch::Tensor& mlp_norm, const Matrix& qkv, const Matrix& wo,
              const Matrix& gate_up, const Matrix& down, const c10::optional<torch::Tensor>& bqkv,
              const c10::optional<torch::Tensor>& q_norm, const c10::optional<torch::Tensor>& k_norm,
              const c10::optional<torch::Tensor>& post_attn_norm, const c10::optional<torch::Tensor>& post_mlp_norm,
              int64_t n_heads, int64_t n_kv, int64_t head_dim, double eps, double scale, bool gelu,
              const std::string& isa)
      : fns_(&isa_fns(isa)) {
    TORCH_CHECK(n_heads > 0 && n_kv > 0 && n_heads % n_kv == 0, "bad head counts");
    TORCH_CHECK(head_dim > 0 && head_dim % 16 == 0 && head_dim <= 256, "the native layer takes head sizes of 16..256 in steps of 16");
    LayerDesc& L = desc_;
    L.n_heads = n_heads;
    L.n_kv = n_kv;
    L.head_dim = head_dim;
    L.hidden = attn_norm.numel();
    L.eps = static_cast<float>(eps);
    L.scale = static_cast<float>(scale);
    L.gelu = gelu;
    const int64_t H = L.hidden, D = head_dim;
    L.attn_norm = optional_f32(attn_norm, H, "attn_norm", keep_);
    L.mlp_norm = optional_f32(mlp_norm, H, "mlp_norm", keep_);
    L.post_attn_norm = optional_f32(post_attn_norm, H, "post_attn_norm", keep_);
    L.post_mlp_norm = optional_f32(post_mlp_norm, H, "post_mlp_norm", keep_);
    L.bqkv = optional_f32(bqkv, (n_heads + 2 * n_kv) * D, "bqkv", keep_);
    L.q_norm = optional_f32(q_norm, D, "q_norm", keep_);
    L.k_norm = optional_f32(k_norm, D, "k_norm", keep_);
    L.qkv = matrix(qkv, H, (n_heads + 2 * n_kv) * D, "qkv");
    L.wo = matrix(wo, n_heads * D, H, "wo");
    const int64_t gu_out = total_rows(gate_up);
    TORCH_CHECK(gu_out % 2 == 0, "gate_up has an odd number of rows");
    L.inter = gu_out / 2;
    L.gate_up = matrix(gate_up, H, gu_out, "gate_up");
    L.down = matrix(down, L.inter, H, "down");
  }

  // x [R, hidden] fp32, updated in place; keys/values: per sequence, this layer's [.., n_kv, slots, head_dim].
  void forward(torch::Tensor& x, const std::vector<torch::Tensor>& keys, const std::vector<torch::Tensor>& values,
               const torch::Tensor& row_seq, const torch::Tensor& row_slot, const torch::Tensor& key_lo,
               const torch::Tensor& key_hi, const torch::Tensor& extra_off, const torch::Tensor& extra_slots,
               const torch::Tensor& cos, const torch::Tensor& sin) {
    const LayerDesc& L = desc_;
    TORCH_CHECK(x.scalar_type() == torch::kFloat && x.is_contiguous() && x.dim() == 2 && x.size(1) == L.hidden,
                "x must be a contiguous float32 [rows, ", L.hidden, "] tensor");
    const int64_t R = x.size(0);
    if (R == 0) return;
    for (const torch::Tensor* t : {&row_seq, &row_slot, &key_lo, &key_hi})
      TORCH_CHECK(t->scalar_type() == torch::kLong && t->is_contiguous() && t->numel() == R, "row tables must be int64 [rows]");
    TORCH_CHECK(extra_off.scalar_type() == torch::kLong && extra_off.is_contiguous() && extra_off.numel() == R + 1,
                "extra_off must be int64 [rows + 1]");
    TORCH_CHECK(extra_slots.scalar_type() == torch::kLong && extra_slots.is_contiguous(), "extra_slots must be int64");
    for (const torch::Tensor* t : {&cos, &sin})
      TORCH_CHECK(t->scalar_type() == torch::kFloat && t->is_contiguous() && t->numel() == R * L.head_dim,
                  "cos and sin must be float32 [rows, head_dim]");
    TORCH_CHECK(!keys.empty() && keys.size() == values.size(), "one keys and one values tensor per sequence");
    LayerIO io;
    io.x = x.data_ptr<float>();
    io.R = R;
    io.cache_bf16 = keys[0].scalar_type() == torch::kBFloat16;
    TORCH_CHECK(io.cache_bf16 || keys[0].scalar_type() == torch::kFloat, "the cache must be bfloat16 or float32");
    int64_t slots = -1;
    for (size_t b = 0; b < keys.size(); ++b) {
      const torch::Tensor& k = keys[b];
      const torch::Tensor& v = values[b];
      TORCH_CHECK(k.scalar_type() == keys[0].scalar_type() && v.scalar_type() == k.scalar_type() && k.dim() >= 3 &&
                      k.sizes() == v.sizes() && k.strides() == v.strides(), "cache tensors disagree");
      const int64_t n = k.dim();
      TORCH_CHECK(k.size(n - 3) == L.n_kv && k.size(n - 1) == L.head_dim && k.stride(n - 1) == 1,
                  "cache tensors must be [.., ", L.n_kv, ", slots, ", L.head_dim, "] with unit stride on the last axis");
      slots = b == 0 ? k.size(n - 2) : std::min(slots, k.size(n - 2));
      io.seqs.push_back({k.data_ptr(), v.data_ptr(), k.stride(n - 3), k.stride(n - 2)});
    }
    const int64_t* seq = row_seq.data_ptr<int64_t>();
    const int64_t* slot = row_slot.data_ptr<int64_t>();
    const int64_t* lo = key_lo.data_ptr<int64_t>();
    const int64_t* hi = key_hi.data_ptr<int64_t>();
    const int64_t* off = extra_off.data_ptr<int64_t>();
    const int64_t* extra = extra_slots.data_ptr<int64_t>();
    TORCH_CHECK(off[0] == 0 && off[R] == extra_slots.numel(), "extra_off does not cover extra_slots");
    for (int64_t r = 0; r < R; ++r) {
      TORCH_CHECK(seq[r] >= 0 && seq[r] < static_cast<int64_t>(keys.size()), "row ", r, " names no sequence");
      TORCH_CHECK(slot[r] >= 0 && slot[r] < slots && 0 <= lo[r] && lo[r] <= hi[r] && hi[r] <= slots &&
                      off[r] <= off[r + 1], "row ", r, "'s slots lie outside the cache");
      TORCH_CHECK(hi[r] - lo[r] + off[r + 1] - off[r] > 0, "row ", r, " attends to no key");
      for (int64_t j = off[r]; j < off[r + 1]; ++j)
        TORCH_CHECK(extra[j] >= 0 && extra[j] < slots, "row ", r, "'s slots lie outside the cache");
    }
    io.row_seq = seq;
    io.row_slot = slot;
    io.key_lo = lo;
    io.key_hi = hi;
    io.extra_off = off;
    io.extra_slots = extra;
    io.cos = cos.data_ptr<float>();
    io.sin = sin.data_ptr<float>();
    pybind11::gil_scoped_release unlocked;
    fns_->layer(L, io);
  }

 private:
  static int64_t total_rows(const Matrix& m) {
    int64_t n = 0;
    for (int64_t r : std::get<2>(m)) n += r;
    return n;
  }

  MatDesc matrix(const Matrix& m, int64_t n_in, int64_t n_out, const char* name) {
    const auto& [parts, kinds, rows] = m;
    TORCH_CHECK(!parts.empty() && parts.size() == kinds.size() && kinds.size() == rows.size(), name, ": parts disagree");
    TORCH_CHECK(total_rows(m) == n_out, name, " has ", total_rows(m), " output rows, expected ", n_out);
    MatDesc d;
    d.n_in = n_in;
    for (size_t p = 0; p < parts.size(); ++p) {
      TORCH_CHECK(kinds[p] >= 0 && kinds[p] < kNumKinds, name, ": unknown block kind ", kinds[p]);
      const Layout Lk = layout(static_cast<int>(kinds[p]));
      TORCH_CHECK(n_in % Lk.group_k == 0, name, ": its input size is not a multiple of the block size");
      const int64_t expect = (rows[p] + 15) / 16 * (n_in / Lk.group_k) * Lk.group_bytes;
      TORCH_CHECK(parts[p].scalar_type() == torch::kUInt8 && parts[p].is_contiguous() && parts[p].numel() == expect,
                  name, ": packed part ", p, " has the wrong size or type");
      keep_.push_back(parts[p]);
      d.add(parts[p].data_ptr<uint8_t>(), kinds[p], rows[p]);
    }
    return d;
  }

  const IsaFns* fns_;
  LayerDesc desc_;
  std::vector<torch::Tensor> keep_;
};

// blocks: [n, 32] float32 -> [n, 18] uint8 Q4_0 blocks, each block's scale fitted over `divisors` (requantize.h).
torch::Tensor fit_q4_0(const torch::Tensor& blocks, const std::vector<double>& divisors) {
  TORCH_CHECK(blocks.scalar_type() == torch::kFloat && blocks.dim() == 2 && blocks.size(1) == requantize::kBlock &&
                  blocks.is_contiguous(), "fit_q4_0 needs a contiguous float32 tensor [n, 32]");
  TORCH_CHECK(!divisors.empty(), "fit_q4_0 needs at least one divisor");
  const std::vector<float> grid(divisors.begin(), divisors.end());
  const int64_t n = blocks.size(0);
  torch::Tensor out = torch::empty({n, 18}, torch::dtype(torch::kUInt8));
  const float* x = blocks.data_ptr<float>();
  uint8_t* o = out.data_ptr<uint8_t>();
  at::parallel_for(0, n, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b)
      requantize::fit_q4_0_block(x + b * requantize::kBlock, grid.data(), static_cast<int>(grid.size()), o + b * 18);
  });
  return out;
}

// logits: [N, V] float32, V >= 1 -> [N] int64: each row's first largest value's index, -1 for a row with a NaN.
torch::Tensor first_largest(const torch::Tensor& logits) {
  TORCH_CHECK(logits.scalar_type() == torch::kFloat && logits.dim() == 2 && logits.size(1) > 0 &&
                  logits.stride(1) == 1, "first_largest needs float32 rows [N, V] with V >= 1 and unit stride");
  const int64_t n = logits.size(0), v = logits.size(1), ld = logits.stride(0);
  torch::Tensor out = torch::empty({n}, torch::dtype(torch::kLong));
  const float* x = logits.data_ptr<float>();
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, n, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) o[r] = argmax::first_largest(x + r * ld, v);
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
  m.doc() = "augury's GGUF block matmul (AVX-512 VNNI / AVX2 / NEON dot product / portable C++)";
  m.def("linear", &linear, "y = x @ W^T + bias on repacked GGUF parts", py::arg("x"), py::arg("packed"),
        py::arg("kinds"), py::arg("rows"), py::arg("bias"), py::arg("isa") = "auto",
        // A step's matmuls hold no Python objects: without the GIL, the server's
        // event loop answers (/health, tokenizing) while the scheduler thread verifies.
        py::call_guard<py::gil_scoped_release>());
  m.def("dequantize", &dequantize, "rows of a packed part as bf16 weights (AVX-512)", py::arg("packed"),
        py::arg("kind"), py::arg("rows"), py::arg("n_in"), py::arg("tile0"), py::arg("tiles"),
        py::call_guard<py::gil_scoped_release>());
  m.def("available_isas", &available_isas, "instruction sets this CPU can run, best first");
  py::class_<NativeLayer>(m, "NativeLayer", "one decoder layer on GGUF blocks (layer_body.h)")
      .def(py::init<const torch::Tensor&, const torch::Tensor&, const Matrix&, const Matrix&, const Matrix&,
                    const Matrix&, const c10::optional<torch::Tensor>&, const c10::optional<torch::Tensor>&,
                    const c10::optional<torch::Tensor>&, const c10::optional<torch::Tensor>&,
                    const c10::optional<torch::Tensor>&, int64_t, int64_t, int64_t, double, double, bool,
                    const std::string&>(),
           py::arg("attn_norm"), py::arg("mlp_norm"), py::arg("qkv"), py::arg("wo"), py::arg("gate_up"),
           py::arg("down"), py::arg("bqkv"), py::arg("q_norm"), py::arg("k_norm"), py::arg("post_attn_norm"),
           py::arg("post_mlp_norm"), py::arg("n_heads"), py::arg("n_kv"), py::arg("head_dim"), py::arg("eps"),
           py::arg("scale"), py::arg("gelu"), py::arg("isa"))
      // The GIL is released inside, after the arguments are checked (see forward).
      .def("forward", &NativeLayer::forward, py::arg("x"), py::arg("keys"), py::arg("values"), py::arg("row_seq"),
           py::arg("row_slot"), py::arg("key_lo"), py::arg("key_hi"), py::arg("extra_off"), py::arg("extra_slots"),
           py::arg("cos"), py::arg("sin"));
  m.def("fit_q4_0", &fit_q4_0, "Q4_0 blocks with fitted scales (requantize.h)", py::arg("blocks"),
        py::arg("divisors"), py::call_guard<py::gil_scoped_release>());
  m.def("first_largest", &first_largest, "each row's torch.argmax(-1), or -1 where it holds a NaN (argmax.h)",
        py::arg("logits"), py::call_guard<py::gil_scoped_release>());
  m.def("layout", &layout_of, "(group_k, subs, sub_bytes, group_bytes) of a block kind");
}
