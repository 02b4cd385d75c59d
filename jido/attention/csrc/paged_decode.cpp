// Paged decode attention on CPU: one query token per request, keys and values read in place from their
// cache blocks (layout [2, num_blocks, num_kv_heads, block_size, width]), never gathered.
//
// The cache holds float32 or bf16 rows (width = head_dim), or quantized ones (int8, fp8 e4m3 or e5m2:
// width = head_dim + 4, the values then the bytes of their float32 scale). A quantized row's scale is
// folded into its score (q . k_t * scale_t) and into its softmax weight (p_t * scale_t), so the inner
// loops multiply raw values converted to float, and nothing is dequantized into memory.
//
// Work is split into (request, kv head, split of consecutive blocks) items so that one long request
// still keeps every thread busy; each item keeps a running max m, sum l and unnormalized output acc
// (the online softmax of FlashAttention), and a second pass merges the splits by log-sum-exp:
//   m = max_s m_s,  l = sum_s l_s exp(m_s - m),  out = sum_s acc_s exp(m_s - m) / l.
// The query heads that share a KV head (GQA/MQA) are handled together, so each key and value row is
// read once per KV head. Threads come from ATen's pool (at::parallel_for), the same the model uses.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

inline float to_float(float x) { return x; }
inline float to_float(uint16_t bf16_bits) {
  uint32_t bits = static_cast<uint32_t>(bf16_bits) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// fp8 values (torch's float8_e4m3fn and float8_e5m2 bits), decoded with integer ops that vectorize: the
// exponent and mantissa bits move into float32's places unchanged, which gives the value times
// 2^(kBias - 127) for normal and subnormal numbers alike (fp8 subnormals become float32 subnormals), and one
// multiply restores it. NaN never occurs: writes clamp to the format's largest finite value.
struct E4M3 { uint8_t bits; };
struct E5M2 { uint8_t bits; };

// 2^e, exactly, for a normal float32 exponent (folded to a constant where e is one).
inline float exp2i(int e) {
  const uint32_t bits = static_cast<uint32_t>(e + 127) << 23;
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

template <int kMant, int kBias>
inline float fp8_to_float(uint8_t b) {
  const uint32_t bits = (static_cast<uint32_t>(b & 0x80) << 24) | (static_cast<uint32_t>(b & 0x7f) << (23 - kMant));
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out * exp2i(127 - kBias);
}
inline float to_float(int8_t x) { return static_cast<float>(x); }
inline float to_float(E4M3 x) { return fp8_to_float<3, 7>(x.bits); }
inline float to_float(E5M2 x) { return fp8_to_float<2, 15>(x.bits); }

// Quantized cache element types carry a float32 scale after the head_dim values of each row.
template <typename T> constexpr bool kQuantized = false;
template <> constexpr bool kQuantized<int8_t> = true;
template <> constexpr bool kQuantized<E4M3> = true;
template <> constexpr bool kQuantized<E5M2> = true;

template <typename T>
inline float row_scale(const T* row, int64_t head_dim) {
  if constexpr (!kQuantized<T>) {
    return 1.f;
  } else {
    float scale;
    std::memcpy(&scale, row + head_dim, sizeof(scale));  // rows are not 4-byte aligned
    return scale;
  }
}

inline void store(float x, float* dst) { *dst = x; }
// Rounds to the nearest bf16, ties to even, as torch's .to(torch.bfloat16) does.
inline void store(float x, uint16_t* dst) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  *dst = std::isnan(x) ? 0x7fc0 : static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

template <typename T>
inline void axpy(float a, const T* x, float* y, int64_t n) {
#pragma omp simd
  for (int64_t d = 0; d < n; ++d) y[d] += a * to_float(x[d]);
}

struct Shape {
  int64_t num_blocks, num_kv_heads, block_size, head_dim, width, group, max_blocks;  // width: elements per row
  int64_t window;  // 0: no sliding window
  float scale, softcap;  // softcap 0: none
};

// First and one-past-last visible key of a request whose query sits at seq_len - 1.
inline void visible_range(const Shape& s, int64_t seq_len, int64_t* first, int64_t* end) {
  *first = s.window > 0 ? std::max<int64_t>(0, seq_len - s.window) : 0;
  *end = seq_len;
}

constexpr int64_t kLanes = 16;  // one AVX-512 register of floats (two AVX2 ones)

// Scores of keys t_lo..t_hi-1 of one block for G query heads: s[g * bs + t] = q_g . k_t. Each key row is
// loaded once for all G heads, and G x kLanes partial sums keep the FMA chains independent.
template <int G, typename T>
inline void block_scores(const float* q, const T* k, int64_t t_lo, int64_t t_hi, int64_t D, int64_t W, int64_t bs,
                         float* s) {
  for (int64_t t = t_lo; t < t_hi; ++t) {
    const T* kt = k + t * W;
    float part[G][kLanes] = {};
    int64_t d0 = 0;
    for (; d0 + kLanes <= D; d0 += kLanes) {
#pragma omp simd
      for (int64_t j = 0; j < kLanes; ++j) {
        const float kd = to_float(kt[d0 + j]);
        for (int g = 0; g < G; ++g) part[g][j] += q[g * D + d0 + j] * kd;
      }
    }
    for (int g = 0; g < G; ++g) {
      float x = 0.f;
      for (int64_t j = 0; j < kLanes; ++j) x += part[g][j];
      for (int64_t d = d0; d < D; ++d) x += q[g * D + d] * to_float(kt[d]);
      s[g * bs + t] = x * row_scale(kt, D);
    }
  }
}

// acc_g += sum_t p[g * bs + t] * v_t for G heads, each value row loaded once.
template <int G, typename T>
inline void block_values(const float* p, const T* v, int64_t t_lo, int64_t t_hi, int64_t D, int64_t W, int64_t bs,
                         float* acc) {
  for (int64_t t = t_lo; t < t_hi; ++t) {
    const T* vt = v + t * W;
    const float scale = row_scale(vt, D);
    float pt[G];
    for (int g = 0; g < G; ++g) pt[g] = p[g * bs + t] * scale;
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) {
      const float vd = to_float(vt[d]);
      for (int g = 0; g < G; ++g) acc[g * D + d] += pt[g] * vd;
    }
  }
}

// One item: G query heads sharing kv head h of one request, over blocks [blk_lo, blk_hi) of its table.
// Writes the running max m, sum l [G] and unnormalized output acc [G, D].
template <int G, typename T>
void attend_split(const Shape& s, const T* cache, const int32_t* table, int64_t seq_len, const float* q,
                  int64_t h, int64_t blk_lo, int64_t blk_hi, float* m, float* l, float* acc) {
  const int64_t D = s.head_dim, W = s.width, bs = s.block_size;
  int64_t first, end;
  visible_range(s, seq_len, &first, &end);
  std::vector<float> scores(G * bs);
  for (int g = 0; g < G; ++g) m[g] = -std::numeric_limits<float>::infinity(), l[g] = 0.f;
  std::fill(acc, acc + G * D, 0.f);
  const int64_t plane = s.num_blocks * s.num_kv_heads * bs * W;  // keys, then values
  for (int64_t blk = blk_lo; blk < blk_hi; ++blk) {
    const int64_t t_lo = std::max(first, blk * bs) - blk * bs, t_hi = std::min(end, (blk + 1) * bs) - blk * bs;
    if (t_lo >= t_hi) continue;
    const T* k = cache + (static_cast<int64_t>(table[blk]) * s.num_kv_heads + h) * bs * W;
    const T* v = k + plane;
    block_scores<G>(q, k, t_lo, t_hi, D, W, bs, scores.data());
    for (int g = 0; g < G; ++g) {
      float* sg = scores.data() + g * bs;
      float block_max = -std::numeric_limits<float>::infinity();
      for (int64_t t = t_lo; t < t_hi; ++t) {
        if (s.softcap > 0.f) sg[t] = s.softcap * std::tanh(sg[t] / s.softcap);
        block_max = std::max(block_max, sg[t]);
      }
      const float m_new = std::max(m[g], block_max);
      if (m_new > m[g]) {  // rescale what was summed under the old max
        const float alpha = std::exp(m[g] - m_new);
        l[g] *= alpha;
        float* acc_g = acc + g * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc_g[d] *= alpha;
        m[g] = m_new;
      }
      for (int64_t t = t_lo; t < t_hi; ++t) {
        sg[t] = std::exp(sg[t] - m_new);
        l[g] += sg[t];
      }
    }
    block_values<G>(scores.data(), v, t_lo, t_hi, D, W, bs, acc);
  }
}

// All `group` heads of one item: groups of 1, 2, 4, 8 or 16 heads in one pass, any other count head by head.
template <typename T>
void attend_heads(const Shape& s, const T* cache, const int32_t* table, int64_t seq_len, const float* q,
                  int64_t h, int64_t blk_lo, int64_t blk_hi, float* m, float* l, float* acc) {
  const int64_t D = s.head_dim;
  switch (s.group) {
    case 1: return attend_split<1>(s, cache, table, seq_len, q, h, blk_lo, blk_hi, m, l, acc);
    case 2: return attend_split<2>(s, cache, table, seq_len, q, h, blk_lo, blk_hi, m, l, acc);
    case 4: return attend_split<4>(s, cache, table, seq_len, q, h, blk_lo, blk_hi, m, l, acc);
    case 8: return attend_split<8>(s, cache, table, seq_len, q, h, blk_lo, blk_hi, m, l, acc);
    case 16: return attend_split<16>(s, cache, table, seq_len, q, h, blk_lo, blk_hi, m, l, acc);
    default:
      for (int64_t g = 0; g < s.group; ++g)
        attend_split<1>(s, cache, table, seq_len, q + g * D, h, blk_lo, blk_hi, m + g, l + g, acc + g * D);
  }
}

template <typename T, typename C>
void decode(const Shape& s, T* out, const T* q_in, const C* cache, const int32_t* tables, const int32_t* seq_lens,
            int64_t num_reqs, int64_t blocks_per_split) {
  const int64_t D = s.head_dim, G = s.group, H = s.num_kv_heads, bs = s.block_size;
  // Items per request: its visible blocks cut into splits of equal size, at most blocks_per_split blocks each, and
  // at least enough of them that a batch of fewer (request, kv head) pairs than threads keeps every thread busy.
  // Equal sizes matter: a 512-token window spans 33 blocks of 16, which splits of 32 cut 32 + 1, leaving one
  // thread all the work (a batch-1 decode at 1,024 tokens of context: 20.9 -> 19.0 ms a step on 2 cores).
  const int64_t pairs = std::max<int64_t>(1, num_reqs * H);  // NOTE: a step may hand over no decode rows
  const int64_t min_splits = (at::get_num_threads() + pairs - 1) / pairs;
  std::vector<int64_t> first_blk(num_reqs), num_splits(num_reqs), split_blocks(num_reqs), item_start(num_reqs + 1, 0);
  for (int64_t b = 0; b < num_reqs; ++b) {
    int64_t first, end;
    visible_range(s, seq_lens[b], &first, &end);
    first_blk[b] = first / bs;
    const int64_t nblk = (end - 1) / bs + 1 - first_blk[b];
    const int64_t splits = std::min(nblk, std::max((nblk + blocks_per_split - 1) / blocks_per_split, min_splits));
    split_blocks[b] = (nblk + splits - 1) / splits;
    num_splits[b] = (nblk + split_blocks[b] - 1) / split_blocks[b];  // none empty
    item_start[b + 1] = item_start[b] + num_splits[b] * H;
  }
  const int64_t num_items = item_start[num_reqs];
  std::vector<float> ms(num_items * G), ls(num_items * G), accs(num_items * G * D);
  std::vector<int64_t> item_req(num_items);
  for (int64_t b = 0; b < num_reqs; ++b)
    for (int64_t i = item_start[b]; i < item_start[b + 1]; ++i) item_req[i] = b;

  at::parallel_for(0, num_items, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> q(G * D);
    for (int64_t i = lo; i < hi; ++i) {
      const int64_t b = item_req[i], local = i - item_start[b];
      const int64_t h = local / num_splits[b], split = local % num_splits[b];
      const T* qh = q_in + (b * H + h) * G * D;  // query heads h*G .. h*G+G-1
      for (int64_t x = 0; x < G * D; ++x) q[x] = to_float(qh[x]) * s.scale;
      const int64_t seq_len = seq_lens[b];
      const int64_t blk_lo = first_blk[b] + split * split_blocks[b];
      const int64_t blk_hi = std::min(blk_lo + split_blocks[b], (seq_len - 1) / bs + 1);
      attend_heads(s, cache, tables + b * s.max_blocks, seq_len, q.data(), h, blk_lo, blk_hi, &ms[i * G],
                   &ls[i * G], &accs[i * G * D]);
    }
  });

  // Merge each (request, kv head)'s splits by log-sum-exp and normalize once.
  at::parallel_for(0, num_reqs * H, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> o(D);
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H, n = num_splits[b];
      const int64_t i0 = item_start[b] + h * n;
      for (int64_t g = 0; g < G; ++g) {
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t j = 0; j < n; ++j) m = std::max(m, ms[(i0 + j) * G + g]);
        float l = 0.f;
        std::fill(o.begin(), o.end(), 0.f);
        for (int64_t j = 0; j < n; ++j) {
          const int64_t i = i0 + j;
          if (ls[i * G + g] == 0.f) continue;  // a split with no visible key
          const float w = std::exp(ms[i * G + g] - m);
          l += ls[i * G + g] * w;
          axpy(w, &accs[(i * G + g) * D], o.data(), D);
        }
        T* dst = out + ((b * H + h) * G + g) * D;
        for (int64_t d = 0; d < D; ++d) store(o[d] / l, dst + d);
      }
    }
  });
}

// The cache's element type: the query's (float32, bf16), or a quantized one.
template <typename T>
void decode_cache(const Shape& s, T* out, const T* q, const at::Tensor& kv_cache, const int32_t* tables,
                  const int32_t* lens, int64_t num_reqs, int64_t blocks_per_split) {
  const void* cache = kv_cache.data_ptr();
  switch (kv_cache.scalar_type()) {
    case at::ScalarType::Char:
      return decode(s, out, q, static_cast<const int8_t*>(cache), tables, lens, num_reqs, blocks_per_split);
    case at::ScalarType::Float8_e4m3fn:
      return decode(s, out, q, static_cast<const E4M3*>(cache), tables, lens, num_reqs, blocks_per_split);
    case at::ScalarType::Float8_e5m2:
      return decode(s, out, q, static_cast<const E5M2*>(cache), tables, lens, num_reqs, blocks_per_split);
    default:
      return decode(s, out, q, static_cast<const T*>(cache), tables, lens, num_reqs, blocks_per_split);
  }
}

void paged_decode(at::Tensor out, const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                  const at::Tensor& seq_lens, double scale, int64_t window, double softcap, int64_t blocks_per_split) {
  TORCH_CHECK(q.is_contiguous() && kv_cache.is_contiguous() && out.is_contiguous(), "paged_decode: contiguous tensors");
  TORCH_CHECK(block_tables.is_contiguous() && seq_lens.is_contiguous(), "paged_decode: contiguous tables");
  TORCH_CHECK(block_tables.scalar_type() == at::kInt && seq_lens.scalar_type() == at::kInt, "paged_decode: int32 tables");
  TORCH_CHECK(out.scalar_type() == q.scalar_type(), "paged_decode: out in q's dtype");
  const auto cache_type = kv_cache.scalar_type();
  const bool quantized = cache_type == at::ScalarType::Char || cache_type == at::ScalarType::Float8_e4m3fn ||
                         cache_type == at::ScalarType::Float8_e5m2;
  TORCH_CHECK(quantized || cache_type == q.scalar_type(), "paged_decode: cache in q's dtype, int8 or fp8");
  TORCH_CHECK(kv_cache.dim() == 5 && kv_cache.size(0) == 2 && q.dim() == 3, "paged_decode: shapes");
  TORCH_CHECK(blocks_per_split > 0, "paged_decode: blocks_per_split > 0");
  const int64_t num_reqs = q.size(0), num_heads = q.size(1), H = kv_cache.size(2), D = q.size(2);
  TORCH_CHECK(num_heads % H == 0 && kv_cache.size(4) == D + (quantized ? 4 : 0), "paged_decode: head counts");
  Shape s{kv_cache.size(1), H, kv_cache.size(3), D, kv_cache.size(4), num_heads / H, block_tables.size(1),
          window, static_cast<float>(scale), static_cast<float>(softcap)};
  if (num_reqs == 0) return;
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  if (q.scalar_type() == at::kFloat) {
    decode_cache(s, out.data_ptr<float>(), q.data_ptr<float>(), kv_cache, tables, lens, num_reqs, blocks_per_split);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "paged_decode: float32 or bfloat16");
    auto bits = [](const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); };
    decode_cache(s, bits(out), bits(q), kv_cache, tables, lens, num_reqs, blocks_per_split);
  }
}

// This step's keys and values into their slots of a cache of their own dtype: k, v [tokens, kv_heads * head_dim]
// (rows may be strided, as splits of the fused QKV output are), token t to block slot[t] / block_size, offset
// slot[t] % block_size, each (token, kv head) row one copy. The PyTorch path (tiled_backend.write_kv) does this
// with ~8 ATen ops per layer, ~40 us of a batch-1 decode layer.
template <typename I>
void copy_rows(char* cache, const char* k, const char* v, const I* slots, int64_t tokens, const at::Tensor& kv_cache,
               int64_t k_stride, int64_t v_stride, int64_t row_bytes) {
  const int64_t num_blocks = kv_cache.size(1), H = kv_cache.size(2), block_size = kv_cache.size(3);
  const int64_t half = num_blocks * H * block_size * row_bytes;  // bytes of the keys' half of the cache
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = static_cast<int64_t>(slots[t]);
    TORCH_CHECK(slot >= 0 && slot < num_blocks * block_size, "write_kv: slot ", slot, " is outside the cache");
    const int64_t block = slot / block_size, offset = slot % block_size;
    for (int64_t h = 0; h < H; ++h) {
      const int64_t dst = ((block * H + h) * block_size + offset) * row_bytes;
      std::memcpy(cache + dst, k + t * k_stride + h * row_bytes, row_bytes);
      std::memcpy(cache + half + dst, v + t * v_stride + h * row_bytes, row_bytes);
    }
  }
}

void write_kv(at::Tensor kv_cache, const at::Tensor& k, const at::Tensor& v, const at::Tensor& slot_mapping) {
  TORCH_CHECK(kv_cache.is_contiguous() && kv_cache.dim() == 5 && kv_cache.size(0) == 2, "write_kv: cache shape");
  TORCH_CHECK(k.scalar_type() == kv_cache.scalar_type() && v.scalar_type() == kv_cache.scalar_type(),
              "write_kv: keys and values in the cache's dtype");
  const int64_t tokens = k.size(0), H = kv_cache.size(2), D = kv_cache.size(4);
  TORCH_CHECK(k.dim() == 2 && v.dim() == 2 && k.size(1) == H * D && v.sizes() == k.sizes() && k.stride(1) == 1 &&
                  v.stride(1) == 1, "write_kv: k and v must be [tokens, kv_heads * head_dim], rows contiguous");
  TORCH_CHECK(slot_mapping.dim() == 1 && slot_mapping.size(0) == tokens && slot_mapping.is_contiguous(),
              "write_kv: one slot per token");
  const int64_t elem = kv_cache.element_size(), row_bytes = D * elem;
  char* cache = static_cast<char*>(kv_cache.data_ptr());
  const char* kp = static_cast<const char*>(k.data_ptr());
  const char* vp = static_cast<const char*>(v.data_ptr());
  if (slot_mapping.scalar_type() == at::kLong) {
    copy_rows(cache, kp, vp, slot_mapping.data_ptr<int64_t>(), tokens, kv_cache, k.stride(0) * elem,
              v.stride(0) * elem, row_bytes);
  } else {
    TORCH_CHECK(slot_mapping.scalar_type() == at::kInt, "write_kv: int32 or int64 slots");
    copy_rows(cache, kp, vp, slot_mapping.data_ptr<int32_t>(), tokens, kv_cache, k.stride(0) * elem,
              v.stride(0) * elem, row_bytes);
  }
}

}  // namespace

TORCH_LIBRARY(jido_cpu_attn, m) {
  m.def("paged_decode(Tensor(a!) out, Tensor q, Tensor kv_cache, Tensor block_tables, Tensor seq_lens, float scale, "
        "int window, float softcap, int blocks_per_split) -> ()");
  m.def("write_kv(Tensor(a!) kv_cache, Tensor k, Tensor v, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(jido_cpu_attn, CPU, m) {
  m.impl("paged_decode", &paged_decode);
  m.impl("write_kv", &write_kv);
}
