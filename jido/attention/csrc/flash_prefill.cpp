// Causal prefill attention on CPU in bf16, FlashAttention's algorithm on oneDNN's brgemm micro-kernels
// (bf16 x bf16 -> float32): one request's queries q [query_len, num_heads, head_dim] at positions first_query...
// against its keys and values [num_kv_heads, num_keys, head_dim] at positions first_key..., causal, optionally in a
// sliding window, optionally soft-capped.
//
// Why: on an AVX-512 BF16 CPU without AMX (Zen 4) PyTorch's CPU flash SDPA runs Gemma 3's heads at a small
// fraction of the rate oneDNN's bf16 GEMMs reach on the same cores
// (benchmarks/results/report-2026-12-04-zen4-w8a8-int-mm.md). Its bf16 -> float32 products do not go
// through oneDNN (held to AVX-512 BF16 by ONEDNN_MAX_CPU_ISA on a Xeon, SDPA kept its AMX speed): likely MKL,
// whose fast paths are Intel's. Here the query heads that share a KV head fold into the rows
// of one GEMM (a tile of 64 queries is 256 rows for 4:1 GQA), each key block is packed once per request for every
// tile, and blocks outside a tile's causal window are never touched. With AMX, MKL is fast and SDPA won on global
// layers and tied on sliding ones, so jido keeps SDPA there
// (benchmarks/results/archive/prefill_attention-2026-12-04-amx-xeon.md).
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
#include <memory>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bf16_bits.h"

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
  // Element strides: between queries and between heads of q, between KV heads and between keys of keys and values
  // (each row's head_dim elements are contiguous). The caller's q and keys are views of its fused QKV projection.
  int64_t q_row, q_head, k_head, k_row, v_head, v_row;
};

// Query i's G heads of the group of KV head h into rows (i - q0) * G .. of a contiguous tile.
inline void copy_query_rows(const Problem& p, const bf16* q, int64_t h, int64_t i, int64_t q0, bf16* tile) {
  for (int64_t g = 0; g < p.group; ++g)
    std::memcpy(tile + ((i - q0) * p.group + g) * p.head_dim, q + i * p.q_row + (h * p.group + g) * p.q_head,
                p.head_dim * sizeof(bf16));
}

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
      const bf16* k = keys + h * p.k_head + k0 * p.k_row;
      const bf16* v = values + h * p.v_head + k0 * p.v_row;
      bf16* kp = k_packed + item * block_elems;
      bf16* vp = v_packed + item * block_elems;
      // K^T: [D, kKeyBlock], keys past the end zero.
      std::fill(scratch.begin(), scratch.end(), bf16(0.f));
      for (int64_t j = 0; j < n; ++j)
        for (int64_t d = 0; d < D; ++d) scratch[d * kKeyBlock + j] = k[j * p.k_row + d];
      pack_vnni(D, kKeyBlock, kKeyBlock, kKeyBlock, scratch.data(), kp);
      // V: [kKeyBlock, D] in panels of kPanel columns (the widest B the packing takes), each packed on its own.
      std::fill(scratch.begin(), scratch.end(), bf16(0.f));
      for (int64_t j = 0; j < n; ++j) std::memcpy(scratch.data() + j * D, v + j * p.v_row, D * sizeof(bf16));
      for (int64_t c = 0; c < D; c += kPanel)
        pack_vnni(kKeyBlock, kPanel, D, kPanel, scratch.data() + c, vp + c * kKeyBlock);
    }
  });
}

// Rounds 16 floats to bf16, to nearest even (the values are finite), as torch's .to(torch.bfloat16) does.
inline void store_bf16x16(f32x16 x, bf16* dst) {
  const jido_bf16::u16x16 r = jido_bf16::round_bits16(x);
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
    copy_query_rows(p, q, h, i, q0, q_tile.data());
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

// The problem the op's arguments describe, checked.
Problem checked_problem(const at::Tensor& out, const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                        double scale, int64_t first_query, int64_t first_key, int64_t window, double softcap,
                        int64_t query_tile) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && keys.scalar_type() == at::kBFloat16 &&
                  values.scalar_type() == at::kBFloat16 && out.scalar_type() == at::kBFloat16,
              "flash_prefill: bfloat16 tensors");
  TORCH_CHECK(q.stride(-1) == 1 && keys.stride(-1) == 1 && values.stride(-1) == 1 && out.is_contiguous(),
              "flash_prefill: contiguous head rows (and a contiguous out)");
  TORCH_CHECK(q.dim() == 3 && keys.dim() == 3 && values.sizes() == keys.sizes() && out.sizes() == q.sizes(),
              "flash_prefill: q [query_len, num_heads, head_dim], keys and values [num_kv_heads, num_keys, head_dim]");
  const int64_t D = q.size(2), H = keys.size(0);
  TORCH_CHECK(keys.size(2) == D && D % kPanel == 0 && q.size(1) % H == 0, "flash_prefill: head sizes");
  TORCH_CHECK(first_key <= first_query && first_query + q.size(0) <= first_key + keys.size(1),
              "flash_prefill: the keys must cover every query's position");
  TORCH_CHECK(query_tile > 0, "flash_prefill: query_tile > 0");
  return Problem{q.size(0), q.size(1), H, D, keys.size(1), q.size(1) / H, first_query, first_key, window,
                 static_cast<float>(scale), static_cast<float>(softcap), (keys.size(1) + kKeyBlock - 1) / kKeyBlock,
                 q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), values.stride(0), values.stride(1)};
}

void flash_prefill(at::Tensor out, const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                   double scale, int64_t first_query, int64_t first_key, int64_t window, double softcap,
                   int64_t query_tile) {
  const Problem p = checked_problem(out, q, keys, values, scale, first_query, first_key, window, softcap, query_tile);
  if (p.query_len == 0) return;
  const int64_t D = p.head_dim, H = p.num_kv_heads;
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

#if defined(__AVX512F__)
// The same attention on AMX tiles (tdpbf16ps), jido's own: oneDNN's brgemm above and PyTorch's SDPA both ran Gemma
// 3's prefill layers well below the rate the tile units reach in oneDNN's own bf16 GEMMs
// (benchmarks/results/prefill_attention-2026-12-05-amx-xeon.md). Per work item (KV head, query tile of `rows`
// query x head rows), per segment of up to kSegment keys:
//   S = Q K^T for every key block the tile sees, all held (rows x segment, float32, in L2);
//   the rows' softmax over the segment in 16-lane vectors: max, P = exp(S - max) rounded to bf16, sum;
//   acc = acc * exp(old max - new max) + P V (P V in tiles, acc in float32; one segment: no rescale).
// Holding a segment's scores replaces FlashAttention's per-block rescale of the output (rows x head_dim floats per
// key block) by one rescale per segment; a 2,000-token global layer is two segments.
//
// Layouts (every tile 16 rows of 64 bytes, so one configuration serves all eight):
//   Q tile: rows (query, head of the group), query-major, zero rows past the last: A tiles of 32 dims.
//   K: blocks of 32 keys, each [2 halves of 16 keys][head_dim / 2][16][2]: a B tile (16 keys, 32 dims) is 1 KiB.
//   V: blocks of 32 keys, each [head_dim / 16][16 key pairs][16 dims][2]: a B tile (32 keys, 16 dims) is 1 KiB.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")
#include "bf16_tiles.h"
namespace amx_tiles {

using bf16_tiles::exp_ps;

constexpr int64_t kKeys = 32;        // keys per block: a P x V multiply's K (pairs of keys in a B tile's rows)
constexpr int64_t kSegment = 1024;   // keys whose scores are held at once
constexpr int64_t kLdS = kSegment + 16;  // row strides of the scores (floats) and weights (bf16): off 4 KiB multiples
constexpr int64_t kLdP = kSegment + 32;

// Tiles 0-3 sum (C), 4-5 hold rows of the left operand (A), 6-7 the packed right operand (B).
inline void configure() { bf16_tiles::configure_full_tiles(8); }

// Keys and values of KV head h into the tile layouts, zero past the last key.
void pack(const Problem& p, int64_t num_blocks, const bf16* keys, const bf16* values, bf16* k_packed,
          bf16* v_packed) {
  const int64_t D = p.head_dim, block_elems = kKeys * D;
  const __m512i pairs_lo = _mm512_set_epi16(47, 15, 46, 14, 45, 13, 44, 12, 43, 11, 42, 10, 41, 9, 40, 8, 39, 7, 38, 6,
                                            37, 5, 36, 4, 35, 3, 34, 2, 33, 1, 32, 0);
  const __m512i pairs_hi = _mm512_add_epi16(pairs_lo, _mm512_set1_epi16(16));
  at::parallel_for(0, p.num_kv_heads * num_blocks, 4, [&](int64_t begin, int64_t end) {
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item / num_blocks, b = item % num_blocks, k0 = b * kKeys;
      const int64_t n = std::min(kKeys, p.num_keys - k0);
      const bf16* k = keys + h * p.k_head + k0 * p.k_row;
      const bf16* v = values + h * p.v_head + k0 * p.v_row;
      uint32_t* kp = reinterpret_cast<uint32_t*>(k_packed + item * block_elems);
      bf16* vp = v_packed + item * block_elems;
      // K: element pairs (2 dims) of key j go to [j / 16][pair][j % 16].
      for (int64_t j = 0; j < kKeys; ++j) {
        uint32_t* dst = kp + (j / 16) * (D / 2) * 16 + j % 16;
        if (j >= n) {
          for (int64_t pr = 0; pr < D / 2; ++pr) dst[pr * 16] = 0;
          continue;
        }
        const uint32_t* src = reinterpret_cast<const uint32_t*>(k + j * p.k_row);
        for (int64_t pr = 0; pr < D / 2; ++pr) dst[pr * 16] = src[pr];
      }
      // V: keys 2i and 2i + 1 interleaved, 32 dims (two 16-dim chunks) at a time.
      const __m512i zero = _mm512_setzero_si512();
      for (int64_t i = 0; i < kKeys / 2; ++i) {
        for (int64_t c = 0; c < D; c += 32) {
          const __m512i a = 2 * i < n ? _mm512_loadu_si512(v + 2 * i * p.v_row + c) : zero;
          const __m512i e = 2 * i + 1 < n ? _mm512_loadu_si512(v + (2 * i + 1) * p.v_row + c) : zero;
          _mm512_storeu_si512(vp + ((c / 16) * 16 + i) * 32, _mm512_permutex2var_epi16(a, pairs_lo, e));
          _mm512_storeu_si512(vp + ((c / 16 + 1) * 16 + i) * 32, _mm512_permutex2var_epi16(a, pairs_hi, e));
        }
      }
    }
  });
}

// A buffer left uninitialized: every element a tile reads was written first. std::vector zeroed the packed keys and
// values and these first, serially, a cost that shows on short prompts (on long ones it is lost in the noise).
template <typename T>
struct Uninit {
  std::unique_ptr<T[]> p;
  explicit Uninit(int64_t n) : p(new T[n]) {}
  T* data() { return p.get(); }
  T* begin() { return p.get(); }
  T& operator[](int64_t i) { return p[i]; }
};

struct Scratch {
  Uninit<bf16> q, probs;
  Uninit<float> scores, acc, m, l;
  explicit Scratch(int64_t rows, int64_t D)
      : q(rows * D), probs(rows * kLdP), scores(rows * kLdS), acc(rows * D), m(rows), l(rows) {}
};

// S for `rows` rows (a multiple of 32) against key blocks [b0, b1): scores[r][(b - b0) * 32 + j].
void scores_tiles(const bf16* q, int64_t rows, int64_t D, const bf16* k_packed, int64_t b0, int64_t b1,
                  float* scores) {
  const int64_t block_elems = kKeys * D, half = (D / 2) * 32;
  for (int64_t b = b0; b < b1; ++b) {
    const bf16* kb = k_packed + b * block_elems;
    float* s = scores + (b - b0) * kKeys;
    for (int64_t r = 0; r < rows; r += 32) {
      _tile_zero(0);
      _tile_zero(1);
      _tile_zero(2);
      _tile_zero(3);
      for (int64_t c = 0; c < D; c += 32) {
        _tile_loadd(4, q + r * D + c, D * 2);
        _tile_loadd(5, q + (r + 16) * D + c, D * 2);
        // K by the streaming load, so that the tile's q rows (32 KiB for 64 rows) are what L1 keeps: faster on
        // sliding and global layers. The same for V in values_tiles measured slower.
        _tile_stream_loadd(6, kb + c * 16, 64);
        _tile_stream_loadd(7, kb + half + c * 16, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, s + r * kLdS, kLdS * 4);
      _tile_stored(1, s + r * kLdS + 16, kLdS * 4);
      _tile_stored(2, s + (r + 16) * kLdS, kLdS * 4);
      _tile_stored(3, s + (r + 16) * kLdS + 16, kLdS * 4);
    }
  }
}

// acc (+)= P V for `rows` rows against key blocks [b0, b1); `add` keeps what acc holds.
void values_tiles(const bf16* probs, int64_t rows, int64_t D, const bf16* v_packed, int64_t b0, int64_t b1,
                  float* acc, bool add) {
  const int64_t block_elems = kKeys * D;
  for (int64_t r = 0; r < rows; r += 32) {
    for (int64_t c = 0; c < D; c += 32) {
      float* a = acc + r * D + c;
      if (add) {
        _tile_loadd(0, a, D * 4);
        _tile_loadd(1, a + 16, D * 4);
        _tile_loadd(2, a + 16 * D, D * 4);
        _tile_loadd(3, a + 16 * D + 16, D * 4);
      } else {
        _tile_zero(0);
        _tile_zero(1);
        _tile_zero(2);
        _tile_zero(3);
      }
      for (int64_t b = b0; b < b1; ++b) {
        const bf16* pb = probs + r * kLdP + (b - b0) * kKeys;
        const bf16* vb = v_packed + b * block_elems + c * 32;
        _tile_loadd(4, pb, kLdP * 2);
        _tile_loadd(5, pb + 16 * kLdP, kLdP * 2);
        _tile_loadd(6, vb, 64);
        _tile_loadd(7, vb + 16 * 32, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
      }
      _tile_stored(0, a, D * 4);
      _tile_stored(1, a + 16, D * 4);
      _tile_stored(2, a + 16 * D, D * 4);
      _tile_stored(3, a + 16 * D + 16, D * 4);
    }
  }
}

// Lanes j .. j + 15 that fall in [lo, hi].
inline __mmask16 lanes_in(int64_t j, int64_t lo, int64_t hi) {
  if (j >= lo && j + 15 <= hi) return 0xffff;
  const __m512i idx = _mm512_add_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                       _mm512_set1_epi32(static_cast<int>(j)));
  return _mm512_cmpge_epi32_mask(idx, _mm512_set1_epi32(static_cast<int>(lo))) &
         _mm512_cmple_epi32_mask(idx, _mm512_set1_epi32(static_cast<int>(hi)));
}

// One row's softmax over its segment of n keys (a multiple of 32), keys [lo, hi] visible (lo > hi: none): folds the
// scaled (and soft-capped) scores into the running max m and sum l, writes the weights (bf16, 0 where hidden) and
// returns the factor that rescales the row's accumulated output. Without a soft-cap the scale is applied inside the
// exponent (scale > 0, so the raw scores' max is the scaled ones' max over the scale).
float softmax_row(const Problem& p, float* s, bf16* prob, int64_t n, int64_t lo, int64_t hi, float* m, float* l) {
  if (lo > hi) {
    std::memset(prob, 0, n * sizeof(bf16));
    return 1.f;
  }
  const int64_t j0 = lo & ~int64_t{15}, j1 = (hi + 16) & ~int64_t{15};  // the 16-lane chunks holding [lo, hi]
  float scale = p.scale;
  if (p.softcap > 0.f) {
    for (int64_t j = lo; j <= hi; ++j) s[j] = std::tanh(s[j] * p.scale / p.softcap) * p.softcap;
    scale = 1.f;
  }
  __m512 mx = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  for (int64_t j = j0; j < j1; j += 16) mx = _mm512_mask_max_ps(mx, lanes_in(j, lo, hi), mx, _mm512_loadu_ps(s + j));
  const float m_new = std::max(*m, _mm512_reduce_max_ps(mx) * scale);
  const float alpha = std::isinf(*m) ? 0.f : std::exp(*m - m_new);
  const __m512 sc = _mm512_set1_ps(scale), shift = _mm512_set1_ps(-m_new);
  __m512 sum = _mm512_setzero_ps();
  std::memset(prob, 0, j0 * sizeof(bf16));
  for (int64_t j = j0; j < j1; j += 16) {
    const __m512 e = _mm512_maskz_mov_ps(lanes_in(j, lo, hi),
                                         exp_ps(_mm512_fmadd_ps(_mm512_loadu_ps(s + j), sc, shift)));
    sum = _mm512_add_ps(sum, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(prob + j), (__m256i)_mm512_cvtneps_pbh(e));
  }
  std::memset(prob + j1, 0, (n - j1) * sizeof(bf16));
  *l = *l * alpha + _mm512_reduce_add_ps(sum);
  *m = m_new;
  return alpha;
}

void attend_tile(const Problem& p, int64_t h, int64_t q0, int64_t q1, const bf16* q, const bf16* k_packed,
                 const bf16* v_packed, bf16* out, Scratch& w) {
  const int64_t D = p.head_dim, G = p.group, rows = (q1 - q0) * G, padded = (rows + 31) & ~int64_t{31};
  for (int64_t i = q0; i < q1; ++i)
    copy_query_rows(p, q, h, i, q0, w.q.data());
  std::fill(w.q.begin() + rows * D, w.q.begin() + padded * D, bf16(0.f));
  std::fill(w.m.begin(), w.m.begin() + rows, -std::numeric_limits<float>::infinity());
  std::fill(w.l.begin(), w.l.begin() + rows, 0.f);
  const int64_t pos0 = p.first_query + q0, pos1 = p.first_query + q1 - 1;  // the tile's first and last query
  const int64_t key_lo = p.window > 0 ? std::max(p.first_key, pos0 - p.window + 1) : p.first_key;
  const int64_t b_first = (key_lo - p.first_key) / kKeys, b_end = (pos1 - p.first_key) / kKeys + 1;
  const int64_t num_blocks = (p.num_keys + kKeys - 1) / kKeys, per_segment = kSegment / kKeys;
  const bf16* kh = k_packed + h * num_blocks * kKeys * D;
  const bf16* vh = v_packed + h * num_blocks * kKeys * D;
  for (int64_t b0 = b_first; b0 < b_end; b0 += per_segment) {
    const int64_t b1 = std::min(b_end, b0 + per_segment), n = (b1 - b0) * kKeys;
    const int64_t kpos0 = p.first_key + b0 * kKeys;  // position of the segment's first key
    scores_tiles(w.q.data(), padded, D, kh, b0, b1, w.scores.data());
    for (int64_t r = 0; r < padded; ++r) {
      bf16* prob = w.probs.data() + r * kLdP;
      if (r >= rows) {
        std::memset(prob, 0, n * sizeof(bf16));
        continue;
      }
      const int64_t pos = pos0 + r / G;
      const int64_t lo = std::max<int64_t>(0, p.window > 0 ? pos - p.window + 1 - kpos0 : 0);
      const int64_t hi = std::min<int64_t>(n - 1, pos - kpos0);
      const float alpha = softmax_row(p, w.scores.data() + r * kLdS, prob, n, lo, hi, &w.m[r], &w.l[r]);
      if (b0 != b_first && alpha != 1.f) {
        float* a = w.acc.data() + r * D;
        const __m512 al = _mm512_set1_ps(alpha);
        for (int64_t d = 0; d < D; d += 16) _mm512_storeu_ps(a + d, _mm512_mul_ps(_mm512_loadu_ps(a + d), al));
      }
    }
    values_tiles(w.probs.data(), padded, D, vh, b0, b1, w.acc.data(), b0 != b_first);
  }
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = q0 + r / G, head = h * G + r % G;
    const __m512 inv = _mm512_set1_ps(1.f / w.l[r]);
    bf16* o = out + (i * p.num_heads + head) * D;
    for (int64_t d = 0; d < D; d += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o + d),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(_mm512_loadu_ps(w.acc.data() + r * D + d), inv)));
  }
}

void prefill(const Problem& p, const bf16* q, const bf16* keys, const bf16* values, bf16* out, int64_t query_tile) {
  const int64_t D = p.head_dim, num_blocks = (p.num_keys + kKeys - 1) / kKeys;
  // Uninit: pack writes every element, zeros past the last key.
  const int64_t packed_elems = p.num_kv_heads * num_blocks * kKeys * D;
  Uninit<bf16> k_packed(packed_elems), v_packed(packed_elems);
  pack(p, num_blocks, keys, values, k_packed.data(), v_packed.data());
  const int64_t num_tiles = (p.query_len + query_tile - 1) / query_tile, items = p.num_kv_heads * num_tiles;
  at::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    Scratch scratch((query_tile * p.group + 31) & ~int64_t{31}, D);
    configure();
    for (int64_t item = begin; item < end; ++item) {
      const int64_t h = item % p.num_kv_heads, k = item / p.num_kv_heads;
      const int64_t tile = k % 2 == 0 ? k / 2 : num_tiles - 1 - k / 2;  // both ends, as flash_prefill's items
      const int64_t q0 = tile * query_tile, q1 = std::min(p.query_len, q0 + query_tile);
      attend_tile(p, h, q0, q1, q, k_packed.data(), v_packed.data(), out, scratch);
    }
    _tile_release();
  });
}

}  // namespace amx_tiles
#pragma GCC pop_options

// Whether this process multiplies bf16 tiles: the CPU has AMX-BF16 and oneDNN runs AMX here (its check is what asks
// Linux for the tile state, process-wide, which the kernel's tiles need too).
bool tiles() {
  return __builtin_cpu_supports("amx-bf16") && __builtin_cpu_supports("avx512bf16") &&
         at::native::cpublas::could_pack(at::kBFloat16);
}
#else
bool tiles() { return false; }
#endif  // __AVX512F__

// flash_prefill's attention on AMX tiles (amx_tiles::prefill), where tiles() holds.
void tile_prefill(at::Tensor out, const at::Tensor& q, const at::Tensor& keys, const at::Tensor& values,
                  double scale, int64_t first_query, int64_t first_key, int64_t window, double softcap,
                  int64_t query_tile) {
  TORCH_CHECK(tiles(), "tile_prefill: this CPU (or this process) cannot multiply AMX-BF16 tiles");
  const Problem p = checked_problem(out, q, keys, values, scale, first_query, first_key, window, softcap, query_tile);
  if (p.query_len == 0) return;
#if defined(__AVX512F__)
  amx_tiles::prefill(p, q.data_ptr<bf16>(), keys.data_ptr<bf16>(), values.data_ptr<bf16>(), out.data_ptr<bf16>(),
               query_tile);
#endif
}

// Whether oneDNN's bf16 packing runs here (AMX): the caller keeps PyTorch's SDPA there, which measured faster.
bool amx() { return at::native::cpublas::could_pack(at::kBFloat16); }

}  // namespace

TORCH_LIBRARY(jido_cpu_prefill, m) {
  m.def("flash_prefill(Tensor(a!) out, Tensor q, Tensor keys, Tensor values, float scale, int first_query, "
        "int first_key, int window, float softcap, int query_tile) -> ()");
  m.def("tile_prefill(Tensor(a!) out, Tensor q, Tensor keys, Tensor values, float scale, int first_query, "
        "int first_key, int window, float softcap, int query_tile) -> ()");
  m.def("amx() -> bool", &amx);
  m.def("tiles() -> bool", &tiles);
}

TORCH_LIBRARY_IMPL(jido_cpu_prefill, CPU, m) {
  m.impl("flash_prefill", &flash_prefill);
  m.impl("tile_prefill", &tile_prefill);
}
