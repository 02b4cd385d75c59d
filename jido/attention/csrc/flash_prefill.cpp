// Causal prefill attention on CPU in bf16, FlashAttention's algorithm on oneDNN's brgemm micro-kernels
// (bf16 x bf16 -> float32): one request's queries q [query_len, num_heads, head_dim] at positions first_query...
// against its keys and values [num_kv_heads, num_keys, head_dim] at positions first_key..., causal, optionally in a
// sliding window, optionally soft-capped.
//
// Why: on an AVX-512 BF16 CPU without AMX (Zen 4) PyTorch's CPU flash SDPA runs Gemma 3's heads at 65 GFLOP/s
// (a 2,000-token causal layer) to ~110 GFLOP/s (sliding-window tiles), where oneDNN's bf16 GEMMs reach 410 on the
// same two cores (benchmarks/results/w8a8-int-mm-zen4-2026-12-04.md). Its bf16 -> float32 products do not go
// through oneDNN (held to AVX-512 BF16 by ONEDNN_MAX_CPU_ISA on a Xeon, SDPA kept its AMX speed): likely MKL,
// whose fast paths are Intel's. Here the query heads that share a KV head fold into the rows
// of one GEMM (a tile of 64 queries is 256 rows for 4:1 GQA), each key block is packed once per request for every
// tile, and blocks outside a tile's causal window are never touched. With AMX, MKL is fast and SDPA won on global
// layers (7.7 against 13.8 ms at 2,000 tokens) and tied on sliding ones, so jido keeps SDPA there
// (benchmarks/results/prefill-attention-2026-12-04.md).
//
// Per work item (KV head, query tile), per key block of kKeyBlock keys:
//   S = Q K^T (bf16 x bf16 -> float32, brgemm), scaled (and soft-capped), masked by position,
//   online softmax: m_new = max(m, rowmax S), alpha = exp(m - m_new), P = exp(S - m_new), l = l alpha + rowsum P,
//   acc = acc alpha + P V (P rounded to bf16, brgemm accumulating in float32);
// out = acc / l, rounded to bf16. Items are ordered from both ends of the query range so that a static split
// between threads gives each the same share of a causal prompt's work.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/native/CPUBlas.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

using bf16 = at::BFloat16;

constexpr int64_t kKeyBlock = 64;  // keys per block: even (bf16 VNNI packs pairs of rows), at most kPanel
constexpr int64_t kPanel = 64;  // the widest packed B (columns) oneDNN's bf16 packing takes

typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));

inline f32x16 splat16(float x) { return f32x16{x, x, x, x, x, x, x, x, x, x, x, x, x, x, x, x}; }

// exp(x) for x <= 0 in 16 lanes: x = n ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-6 polynomial (relative
// error ~2e-7), 2^n put into the exponent bits. Inputs below -87 give ~1e-38 instead of 0: callers zero the
// scores they mask.
inline f32x16 exp16(f32x16 x) {
  const f32x16 lo = splat16(-87.f);
  x = x < lo ? lo : x;
  const f32x16 magic = splat16(12582912.f);  // 1.5 * 2^23: adding it rounds to an integer
  const f32x16 n = (x * 1.44269504f + magic) - magic;
  const f32x16 r = x - n * 0.693359375f - n * -2.12194440e-4f;
  f32x16 p = splat16(1.f / 720.f);
  p = p * r + 1.f / 120.f;
  p = p * r + 1.f / 24.f;
  p = p * r + 1.f / 6.f;
  p = p * r + 0.5f;
  p = p * r + 1.f;
  p = p * r + 1.f;
  const i32x16 bits = (__builtin_convertvector(n, i32x16) + 127) << 23;
  return p * reinterpret_cast<f32x16>(bits);
}

inline f32x16 load16(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline void store16(f32x16 v, float* p) { std::memcpy(p, &v, sizeof(v)); }

struct Problem {
  int64_t query_len, num_heads, num_kv_heads, head_dim, num_keys, group;
  int64_t first_query, first_key, window;  // window 0: none
  float scale, softcap;  // softcap 0: none
  int64_t num_blocks;  // key blocks of kKeyBlock
};

// B [K, N] (row stride ld_in) into the brgemm's bf16 VNNI layout: pairs of rows interleaved, [K / 2][ld_out][2].
// With AMX oneDNN's own packing does this (and may pick another layout); without, oneDNN refuses to pack, but its
// AVX-512 BF16 brgemm reads this layout.
void pack_vnni(int64_t K, int64_t N, int64_t ld_in, int64_t ld_out, const bf16* in, bf16* out) {
  if (at::native::cpublas::could_pack(at::kBFloat16)) {
    at::native::cpublas::pack(K, N, ld_in, ld_out, at::kBFloat16, at::kBFloat16, in, out);
    return;
  }
  for (int64_t k = 0; k < K; k += 2)
    for (int64_t n = 0; n < N; ++n) {
      out[(k / 2) * ld_out * 2 + n * 2] = in[k * ld_in + n];
      out[(k / 2) * ld_out * 2 + n * 2 + 1] = in[(k + 1) * ld_in + n];
    }
}

// Keys and values of every key block in the brgemm's packed (VNNI) layout, per KV head: K^T blocks
// [head_dim, kKeyBlock] and V blocks [kKeyBlock, head_dim], zero-padded past the last key.
void pack_keys_values(const Problem& p, const bf16* keys, const bf16* values, bf16* k_packed, bf16* v_packed) {
  const int64_t D = p.head_dim, block_elems = kKeyBlock * D;
  at::parallel_for(0, p.num_kv_heads * p.num_blocks, 1, [&](int64_t begin, int64_t end) {
    std::vector<bf16> scratch(block_elems);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / p.num_blocks, b = item % p.num_blocks;
      const int64_t k0 = b * kKeyBlock, n = std::min(kKeyBlock, p.num_keys - k0);
      const bf16* k = keys + (h * p.num_keys + k0) * D;
      const bf16* v = values + (h * p.num_keys + k0) * D;
      bf16* kp = k_packed + item * block_elems;
      bf16* vp = v_packed + item * block_elems;
      // K^T: [D, kKeyBlock], keys past the end zero.
      std::fill(scratch.begin(), scratch.end(), bf16(0.f));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) scratch[d * kKeyBlock + j] = k[j * D + d];
      pack_vnni(D, kKeyBlock, kKeyBlock, kKeyBlock, scratch.data(), kp);
      // V: [kKeyBlock, D] in panels of kPanel columns (the widest B the packing takes), each packed on its own.
      std::fill(scratch.begin(), scratch.end(), bf16(0.f));
      std::memcpy(scratch.data(), v, n * D * sizeof(bf16));
      for (int64_t c = 0; c < D; c += kPanel)
        pack_vnni(kKeyBlock, kPanel, D, kPanel, scratch.data() + c, vp + c * kKeyBlock);
    }
  });
}

// Rounds 16 floats to bf16, to nearest even (the values are finite), as torch's .to(torch.bfloat16) does.
inline void store_bf16x16(f32x16 x, bf16* dst) {
  typedef uint32_t u32x16 __attribute__((vector_size(64)));
  typedef uint16_t u16x16 __attribute__((vector_size(32)));
  const u32x16 u = reinterpret_cast<u32x16>(x);
  const u16x16 r = __builtin_convertvector((u + 0x7fff + ((u >> 16) & 1)) >> 16, u16x16);
  std::memcpy(dst, &r, sizeof(r));
}

inline float lane_max(f32x16 v) {
  float out = v[0];
  for (int i = 1; i < 16; ++i) out = std::max(out, v[i]);
  return out;
}

// One query row's scores of one key block: scaled, soft-capped, keys [lo, hi] visible. Folds them into the row's
// running max m and sum l, writes the weights (bf16, 0 where hidden) to prob and returns the factor that rescales
// the row's output accumulator.
inline float softmax_block(const Problem& p, float* s, bf16* prob, int64_t lo, int64_t hi, float* m, float* l) {
  const int64_t n = kKeyBlock;
  if (p.softcap > 0.f) {
    for (int64_t j = lo; j <= hi; ++j) s[j] = std::tanh(s[j] * p.scale / p.softcap) * p.softcap;
  } else {
    const f32x16 sc = splat16(p.scale);
    for (int64_t j = 0; j < n; j += 16) store16(load16(s + j) * sc, s + j);
  }
  float block_max = -std::numeric_limits<float>::infinity();
  if (lo == 0 && hi == n - 1) {
    f32x16 mx = load16(s);
    for (int64_t j = 16; j < n; j += 16) {
      const f32x16 x = load16(s + j);
      mx = x > mx ? x : mx;
    }
    block_max = lane_max(mx);
  } else {
    for (int64_t j = lo; j <= hi; ++j) block_max = std::max(block_max, s[j]);
  }
  const float m_new = std::max(*m, block_max);
  const float alpha = std::isinf(*m) ? 0.f : std::exp(*m - m_new);
  const f32x16 shift = splat16(m_new);
  for (int64_t j = 0; j < n; j += 16) store16(exp16(load16(s + j) - shift), s + j);
  for (int64_t j = 0; j < lo; ++j) s[j] = 0.f;
  for (int64_t j = hi + 1; j < n; ++j) s[j] = 0.f;
  f32x16 sum = splat16(0.f);
  for (int64_t j = 0; j < n; j += 16) {
    const f32x16 e = load16(s + j);
    sum += e;
    store_bf16x16(e, prob + j);
  }
  float total = 0.f;
  for (int i = 0; i < 16; ++i) total += sum[i];
  *l = *l * alpha + total;
  *m = m_new;
  return alpha;
}

void attend_tile(const Problem& p, int64_t h, int64_t q0, int64_t q1, const bf16* q, const bf16* k_packed,
                 const bf16* v_packed, bf16* out, std::vector<bf16>& q_tile, std::vector<float>& scores,
                 std::vector<bf16>& probs, std::vector<float>& acc, std::vector<float>& m, std::vector<float>& l) {
  const int64_t D = p.head_dim, G = p.group, rows = (q1 - q0) * G, block_elems = kKeyBlock * D;
  // Rows are (query, head of the group), query-major: row r is query q0 + r / G.
  for (int64_t i = q0; i < q1; ++i)
    std::memcpy(q_tile.data() + (i - q0) * G * D, q + (i * p.num_heads + h * G) * D, G * D * sizeof(bf16));
  std::fill(acc.begin(), acc.begin() + rows * D, 0.f);
  std::fill(m.begin(), m.begin() + rows, -std::numeric_limits<float>::infinity());
  std::fill(l.begin(), l.begin() + rows, 0.f);
  const int64_t pos0 = p.first_query + q0, pos1 = p.first_query + q1 - 1;  // the tile's first and last query
  const int64_t key_lo = p.window > 0 ? std::max(p.first_key, pos0 - p.window + 1) : p.first_key;
  const int64_t b0 = (key_lo - p.first_key) / kKeyBlock, b1 = (pos1 - p.first_key) / kKeyBlock;
  const bf16* kh = k_packed + h * p.num_blocks * block_elems;
  const bf16* vh = v_packed + h * p.num_blocks * block_elems;
  for (int64_t b = b0; b <= b1; ++b) {
    at::native::cpublas::brgemm(rows, kKeyBlock, D, D, kKeyBlock, kKeyBlock, false, q_tile.data(),
                                kh + b * block_elems, scores.data());
    const int64_t kpos0 = p.first_key + b * kKeyBlock;  // position of the block's first key
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t pos = pos0 + r / G;
      const int64_t lo = std::max<int64_t>(0, p.window > 0 ? pos - p.window + 1 - kpos0 : 0);
      const int64_t hi = std::min<int64_t>(kKeyBlock - 1, pos - kpos0);
      float* s = scores.data() + r * kKeyBlock;
      bf16* pr = probs.data() + r * kKeyBlock;
      float* a = acc.data() + r * D;
      if (lo > hi) {  // this row sees none of the block's keys
        std::fill(pr, pr + kKeyBlock, bf16(0.f));
        continue;
      }
      const float alpha = softmax_block(p, s, pr, lo, hi, &m[r], &l[r]);
      if (alpha != 1.f) {
        const f32x16 al = splat16(alpha);
        for (int64_t d = 0; d < D; d += 16) store16(load16(a + d) * al, a + d);
      }
    }
    for (int64_t c = 0; c < D; c += kPanel)
      at::native::cpublas::brgemm(rows, kPanel, kKeyBlock, kKeyBlock, kPanel, D, true, probs.data(),
                                  vh + b * block_elems + c * kKeyBlock, acc.data() + c);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = q0 + r / G, head = h * G + r % G;
    const float inv = 1.f / l[r];
    bf16* o = out + (i * p.num_heads + head) * D;
    for (int64_t d = 0; d < D; ++d) o[d] = bf16(acc[r * D + d] * inv);
  }
}

void flash_prefill(at::Tensor out, const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                   double scale, int64_t first_query, int64_t first_key, int64_t window, double softcap,
                   int64_t query_tile) {

  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && keys.scalar_type() == at::kBFloat16 &&
                  values.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16,
              "flash_prefill: bfloat16 tensors");
  TORCH_CHECK(q.is_contiguous() && keys.is_contiguous() && values.is_contiguous() && out.is_contiguous(),
              "flash_prefill: contiguous tensors");
  TORCH_CHECK(q.dim() == 3 && keys.dim() == 3 && values.sizes() == keys.sizes() && out.sizes() == q.sizes(),
              "flash_prefill: q [query_len, num_heads, head_dim], keys and values [num_kv_heads, num_keys, head_dim]");
  const int64_t D = q.size(2), H = keys.size(0);
  TORCH_CHECK(keys.size(2) == D && D % kPanel == 0 && q.size(1) % H == 0, "flash_prefill: head sizes");
  TORCH_CHECK(first_key <= first_query && first_query + q.size(0) <= first_key + keys.size(1),
              "flash_prefill: the keys must cover every query's position");
  TORCH_CHECK(query_tile > 0, "flash_prefill: query_tile > 0");
  Problem p{q.size(0), q.size(1), H, D, keys.size(1), q.size(1) / H, first_query, first_key, window,
            static_cast<float>(scale), static_cast<float>(softcap), (keys.size(1) + kKeyBlock - 1) / kKeyBlock};
  if (p.query_len == 0) return;
  const int64_t block_elems = kKeyBlock * D;
  std::vector<bf16> k_packed(H * p.num_blocks * block_elems), v_packed(H * p.num_blocks * block_elems);
  pack_keys_values(p, keys.data_ptr<bf16>(), values.data_ptr<bf16>(), k_packed.data(), v_packed.data());
  const int64_t num_tiles = (p.query_len + query_tile - 1) / query_tile, items = H * num_tiles;
  const bf16* qp = q.data_ptr<bf16>();
  bf16* op = out.data_ptr<bf16>();
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    const int64_t rows = query_tile * p.group;
    std::vector<bf16> q_tile(rows * D), probs(rows * kKeyBlock);
    std::vector<float> scores(rows * kKeyBlock), acc(rows * D), m(rows), l(rows);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item % H, k = item / H;
      // 0, n-1, 1, n-2, ...: a contiguous range of items holds cheap early tiles and costly late ones alike.
      const int64_t tile = k % 2 == 0 ? k / 2 : num_tiles - 1 - k / 2;
      const int64_t q0 = tile * query_tile, q1 = std::min(p.query_len, q0 + query_tile);
      attend_tile(p, h, q0, q1, qp, k_packed.data(), v_packed.data(), op, q_tile, scores, probs, acc, m, l);
    }
    at::native::cpublas::brgemm_release();
  });
}

// Whether oneDNN's bf16 packing runs here (AMX): the caller keeps PyTorch's SDPA there, which measured faster.
bool amx() { return at::native::cpublas::could_pack(at::kBFloat16); }

}  // namespace

TORCH_LIBRARY(jido_cpu_prefill, m) {
  m.def("flash_prefill(Tensor(a!) out, Tensor q, Tensor keys, Tensor values, float scale, int first_query, "
        "int first_key, int window, float softcap, int query_tile) -> ()");
  m.def("amx() -> bool", &amx);
}

TORCH_LIBRARY_IMPL(jido_cpu_prefill, CPU, m) { m.impl("flash_prefill", &flash_prefill); }
