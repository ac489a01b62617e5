// The kernel and layer bodies (src/augury/kernels/csrc) without torch, driven by a file of named
// arrays, so that tests/test_portable_cross.py can build them for another CPU (aarch64 with a cross
// compiler, run under qemu-user) and compare their bits with the x86 extension's portable path.
//
//   portable_check ISA IN OUT   ISA: portable, or neon (aarch64 builds); IN: records written by the
//                               test; OUT: records of the results
//
// A record: u32 name length, the name, u8 type (0 f32, 1 i64, 2 u8, 3 bf16 bits), i64 count, the
// values in little-endian order. The test names what it sends: "mm.*" for one matmul, "layer.*" for
// one decoder layer over a cache, "argmax.*" for rows whose greedy pick it checks (see the test for the names).

#include <omp.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "argmax.h"
#include "common.h"
#include "ops_portable.h"
#if defined(__aarch64__)
#include <arm_neon.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>

#include "ops_neon.h"
#endif

namespace {

struct Blob {
  uint8_t type = 0;
  int64_t count = 0;
  std::vector<uint8_t> bytes;
};

constexpr int kElemSize[4] = {4, 8, 1, 2};

[[noreturn]] void fail(const std::string& why) {
  std::fprintf(stderr, "portable_check: %s\n", why.c_str());
  std::exit(2);
}

std::map<std::string, Blob> read_records(const char* path) {
  std::FILE* f = std::fopen(path, "rb");
  if (!f) fail(std::string("cannot open ") + path);
  std::map<std::string, Blob> out;
  uint32_t len;
  while (std::fread(&len, 4, 1, f) == 1) {
    std::string name(len, '\0');
    Blob b;
    if (std::fread(name.data(), 1, len, f) != len || std::fread(&b.type, 1, 1, f) != 1 ||
        std::fread(&b.count, 8, 1, f) != 1 || b.type > 3 || b.count < 0)
      fail("truncated or malformed record " + name);
    b.bytes.resize(b.count * kElemSize[b.type]);
    if (std::fread(b.bytes.data(), 1, b.bytes.size(), f) != b.bytes.size()) fail("truncated values of " + name);
    out[name] = std::move(b);
  }
  std::fclose(f);
  return out;
}

void write_record(std::FILE* f, const std::string& name, uint8_t type, const void* data, int64_t count) {
  const uint32_t len = static_cast<uint32_t>(name.size());
  std::fwrite(&len, 4, 1, f);
  std::fwrite(name.data(), 1, len, f);
  std::fwrite(&type, 1, 1, f);
  std::fwrite(&count, 8, 1, f);
  std::fwrite(data, kElemSize[type], count, f);
}

struct Inputs {
  std::map<std::string, Blob> records;

  bool has(const std::string& name) const { return records.count(name) != 0; }
  Blob& get(const std::string& name, uint8_t type) {
    auto it = records.find(name);
    if (it == records.end()) fail("missing record " + name);
    if (it->second.type != type) fail("record " + name + " has the wrong type");
    return it->second;
  }
  template <typename T> T* data(const std::string& name, uint8_t type) { return reinterpret_cast<T*>(get(name, type).bytes.data()); }
  const float* f32(const std::string& name) { return data<float>(name, 0); }
  const float* f32_or_null(const std::string& name) { return has(name) ? f32(name) : nullptr; }
  const int64_t* i64(const std::string& name) { return data<int64_t>(name, 1); }
  int64_t count(const std::string& name) { return records.at(name).count; }

  // A matrix as the extension's `matrix` builds it: parts "<name>.part<p>" of kinds and rows "<name>.kinds/rows".
  MatDesc matrix(const std::string& name, int64_t n_in) {
    MatDesc m;
    m.n_in = n_in;
    const int64_t parts = count(name + ".kinds");
    const int64_t* kinds = i64(name + ".kinds");
    const int64_t* rows = i64(name + ".rows");
    for (int64_t p = 0; p < parts; ++p) {
      if (kinds[p] < 0 || kinds[p] >= kNumKinds) fail("unknown block kind in " + name);
      m.add(data<uint8_t>(name + ".part" + std::to_string(p), 2), kinds[p], rows[p]);
    }
    return m;
  }
};

// One instruction set's entry points, as gguf_matmul.cpp's IsaFns.
struct Fns {
  void (*matmul)(const float*, int64_t, const MatDesc&, const float*, void*, bool, int64_t);
  void (*layer)(const LayerDesc&, const LayerIO&);
};

Fns isa_fns(const std::string& isa) {
  if (isa == "portable") return {portable::body::matmul, portable::layer::forward};
#if defined(__aarch64__)
  if (isa == "neon") {
    if (!(getauxval(AT_HWCAP) & HWCAP_ASIMDDP)) fail("this CPU has no NEON dot-product instructions");
    return {neon::body::matmul, neon::layer::forward};
  }
#endif
  fail("this build has no " + isa + " variant");
}

void run_matmul(const Fns& fns, Inputs& in, std::FILE* out) {
  const int64_t* shape = in.i64("mm.shape");  // [R, n_in]
  MatDesc m = in.matrix("mm.w", shape[1]);
  std::vector<float> y(shape[0] * m.n_out);
  fns.matmul(in.f32("mm.x"), shape[0], m, in.f32_or_null("mm.bias"), y.data(), false, m.n_out);
  write_record(out, "mm.y", 0, y.data(), static_cast<int64_t>(y.size()));
}

void run_layer(const Fns& fns, Inputs& in, std::FILE* out) {
  const int64_t* shape = in.i64("layer.shape");  // [R, hidden, n_heads, n_kv, head_dim, gelu, slots]
  const float* eps_scale = in.f32("layer.eps_scale");
  LayerDesc L;
  L.hidden = shape[1];
  L.n_heads = shape[2];
  L.n_kv = shape[3];
  L.head_dim = shape[4];
  L.gelu = shape[5] != 0;
  L.eps = eps_scale[0];
  L.scale = eps_scale[1];
  L.attn_norm = in.f32("layer.attn_norm");
  L.mlp_norm = in.f32("layer.mlp_norm");
  L.post_attn_norm = in.f32_or_null("layer.post_attn_norm");
  L.post_mlp_norm = in.f32_or_null("layer.post_mlp_norm");
  L.bqkv = in.f32_or_null("layer.bqkv");
  L.q_norm = in.f32_or_null("layer.q_norm");
  L.k_norm = in.f32_or_null("layer.k_norm");
  const int64_t H = L.hidden, D = L.head_dim;
  L.qkv = in.matrix("layer.qkv", H);
  L.wo = in.matrix("layer.wo", L.n_heads * D);
  L.gate_up = in.matrix("layer.gate_up", H);
  L.inter = L.gate_up.n_out / 2;
  L.down = in.matrix("layer.down", L.inter);

  LayerIO io;
  Blob& x = in.get("layer.x", 0);
  io.x = reinterpret_cast<float*>(x.bytes.data());
  io.R = shape[0];
  Blob& keys = in.get("layer.keys", 3);
  Blob& values = in.get("layer.values", 3);
  io.cache_bf16 = true;
  io.seqs.push_back({keys.bytes.data(), values.bytes.data(), shape[6] * D, D});  // one sequence [n_kv, slots, D]
  io.row_seq = in.i64("layer.row_seq");
  io.row_slot = in.i64("layer.row_slot");
  io.key_lo = in.i64("layer.key_lo");
  io.key_hi = in.i64("layer.key_hi");
  io.extra_off = in.i64("layer.extra_off");
  io.extra_slots = in.i64("layer.extra_slots");
  io.cos = in.f32("layer.cos");
  io.sin = in.f32("layer.sin");
  fns.layer(L, io);
  write_record(out, "layer.x", 0, x.bytes.data(), x.count);
  write_record(out, "layer.keys", 3, keys.bytes.data(), keys.count);
  write_record(out, "layer.values", 3, values.bytes.data(), values.count);
}

// The greedy pick of each row (argmax.h: the same code for every instruction set; -1 for a NaN row).
void run_argmax(Inputs& in, std::FILE* out) {
  const int64_t* shape = in.i64("argmax.shape");  // [N, V]
  const float* x = in.f32("argmax.rows");
  std::vector<int64_t> index(shape[0]);
  for (int64_t r = 0; r < shape[0]; ++r) index[r] = argmax::first_largest(x + r * shape[1], shape[1]);
  write_record(out, "argmax.index", 1, index.data(), shape[0]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) fail("usage: portable_check ISA IN OUT");
  const Fns fns = isa_fns(argv[1]);
  Inputs in{read_records(argv[2])};
  std::FILE* out = std::fopen(argv[3], "wb");
  if (!out) fail(std::string("cannot write ") + argv[3]);
  if (in.has("mm.shape")) run_matmul(fns, in, out);
  if (in.has("layer.shape")) run_layer(fns, in, out);
  if (in.has("argmax.shape")) run_argmax(in, out);
  std::fclose(out);
  return 0;
}
