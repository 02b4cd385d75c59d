// Paged decode attention on CPU: query rows that each see the keys up to their own position (a decode, or one
// token of a short query), keys and values read in place from their cache blocks (layout [2, num_blocks,
// num_kv_heads, block_size, width]), never gathered.
//
// The cache holds float32 or bf16 rows (width = head_dim), or quantized ones (int8, fp8 e4m3 or e5m2:
// width = head_dim + 4, the values then the bytes of their float32 scale). A quantized row's scale is
// folded into its score (q . k_t * scale_t) and into its softmax weight (p_t * scale_t), so the inner
// loops multiply raw values converted to float, and nothing is dequantized into memory.
//
// Rows at consecutive positions over the same blocks (one request's K + 1 verify rows, or a short prompt's
// tokens) form a run. Work is split into (run, kv head, split of consecutive blocks) items so that one long
// request still keeps every thread busy; each item keeps, per query, a running max m, sum l and unnormalized
// output acc (the online softmax of FlashAttention), and a second pass merges the splits by log-sum-exp:
//   m = max_s m_s,  l = sum_s l_s exp(m_s - m),  out = sum_s acc_s exp(m_s - m) / l.
// An item handles the query heads that share its KV head (GQA/MQA) for every row of its run together, so each
// key and value block is read once per KV head and run. Threads come from ATen's pool (at::parallel_for), the
// same the model uses.
//
// Against the kernel before runs (each verify row attended as its own request; each score's 16 lanes summed in
// scalar order), runs made a verify step's attention faster, warm or flushed, and left one row a request about even
// (benchmarks/results/report-2026-12-03-avx2-epyc-verify-step.md).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "bf16_bits.h"
#include "tile_state.h"

namespace {

inline float to_float(float x) { return x; }
inline float to_float(uint16_t bf16_bits) { return jido_bf16::to_float(bf16_bits); }

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
inline void store(float x, uint16_t* dst) { *dst = jido_bf16::round_bits(x); }

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

// Vectors of kLanes floats, one AVX2 register. 16 lanes (AVX-512) alone measured no faster on an AMX Xeon (bf16
// cache): what bounded it were the widening of bf16 and the accumulators loaded and stored per value row. bf16
// caches on AVX-512
// take the split-order kernels below instead.
constexpr int kLanes = 8;
typedef float fvec __attribute__((vector_size(4 * kLanes)));
typedef uint32_t uvec __attribute__((vector_size(4 * kLanes)));
typedef int32_t ivec __attribute__((vector_size(4 * kLanes)));

// kLanes cache elements from p as floats (unaligned), converted in vector lanes.
inline fvec loadv(const float* p) {
  fvec v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}
inline fvec loadv(const uint16_t* p) {
  typedef uint16_t u16v __attribute__((vector_size(2 * kLanes)));
  u16v raw;
  std::memcpy(&raw, p, sizeof(raw));
  return reinterpret_cast<fvec>(__builtin_convertvector(raw, uvec) << 16);
}
inline fvec loadv(const int8_t* p) {
  typedef int8_t i8v __attribute__((vector_size(kLanes)));
  i8v raw;
  std::memcpy(&raw, p, sizeof(raw));
  return __builtin_convertvector(__builtin_convertvector(raw, ivec), fvec);
}
template <int kMant, int kBias>
inline fvec fp8_to_fvec(const uint8_t* p) {
  typedef uint8_t u8v __attribute__((vector_size(kLanes)));
  u8v raw;
  std::memcpy(&raw, p, sizeof(raw));
  const uvec b = __builtin_convertvector(raw, uvec);
  const uvec bits = ((b & 0x80) << 24) | ((b & 0x7f) << (23 - kMant));
  return reinterpret_cast<fvec>(bits) * exp2i(127 - kBias);
}
inline fvec loadv(const E4M3* p) { return fp8_to_fvec<3, 7>(reinterpret_cast<const uint8_t*>(p)); }
inline fvec loadv(const E5M2* p) { return fp8_to_fvec<2, 15>(reinterpret_cast<const uint8_t*>(p)); }

inline fvec splat(float x) { return fvec{} + x; }
inline ivec splat_i(int32_t x) { return ivec{} + x; }
inline void storev(fvec v, float* p) { std::memcpy(p, &v, sizeof(v)); }

// The lanes summed pairwise, halves first (a fixed order: a score does not depend on where its row sits).
inline float lane_sum(fvec v) {
  typedef float f32x4 __attribute__((vector_size(16)));
  const f32x4 a = __builtin_shufflevector(v, v, 0, 1, 2, 3) + __builtin_shufflevector(v, v, 4, 5, 6, 7);
  return (a[0] + a[2]) + (a[1] + a[3]);
}

// exp(x) in kLanes lanes for x <= 0, as Cephes' expf: x = n ln 2 + r, a degree-6 polynomial in r, times 2^n
// (within 2 ulp); 0 below -87.3, where expf underflows too.
inline fvec expv(fvec x) {
  const fvec lo = splat(-87.3f);
  const ivec under = x < lo;
  x = under ? lo : x;
  const fvec n = (x * 1.44269504088896341f + 12582912.f) - 12582912.f;  // 1.5 * 2^23 rounds to an integer
  const fvec r = x - n * 0.693359375f - n * -2.12194440e-4f;
  fvec p = splat(1.9875691500e-4f);
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * (r * r) + (r + 1.f);
  const fvec e = p * reinterpret_cast<fvec>((__builtin_convertvector(n, ivec) + 127) << 23);
  return under ? fvec{} : e;
}

// Softmax weights of one row's scores s[t_lo..t_hi): exp(s[t] - m) for the keys it sees, [lo, hi), 0 for the
// others; returns their sum. Every weight goes through expv, a block's last keys too (padded to a vector), so a
// key's weight is the same bits whichever run or split it falls in. std::exp per key, a scalar call that does not
// vectorize, ran the decode kernel markedly slower.
inline float softmax_weights(float* s, int64_t t_lo, int64_t t_hi, int64_t lo, int64_t hi, float m) {
  ivec index;
  for (int j = 0; j < kLanes; ++j) index[j] = j;
  fvec total = {};
  const ivec first = splat_i(static_cast<int32_t>(lo)), end = splat_i(static_cast<int32_t>(hi));
  int64_t t = t_lo;
  for (; t + kLanes <= t_hi; t += kLanes) {
    const ivec pos = index + static_cast<int32_t>(t);
    const fvec w = (pos >= first) & (pos < end) ? expv(loadv(s + t) - m) : fvec{};
    storev(w, s + t);
    total += w;
  }
  if (t < t_hi) {  // the last keys, through a padded vector
    const int64_t n = t_hi - t;
    float x[kLanes] = {};
    std::memcpy(x, s + t, n * sizeof(float));
    const ivec pos = index + static_cast<int32_t>(t);
    const fvec w = (pos >= first) & (pos < end) & (pos < static_cast<int32_t>(t_hi)) ? expv(loadv(x) - m) : fvec{};
    storev(w, x);
    std::memcpy(s + t, x, n * sizeof(float));
    total += w;
  }
  return lane_sum(total);
}

// The queries an item attends for, in passes of up to kPass: per pass and key, kPass dot products share each load
// of the key.
constexpr int kPass = 4;

// s[i * bs + t] = q_i . k_t (times the row's scale) for NQ queries (q_i at q + i * D) and keys t_lo..t_hi-1 of one
// block: 2 * kLanes columns of each key per step against every query, in 2 * NQ accumulators (enough independent
// FMA chains for their latency, few enough for AVX2's 16 registers).
template <int NQ, typename T>
inline void block_scores(const float* q, const T* k, int64_t t_lo, int64_t t_hi, int64_t D, int64_t W, int64_t bs,
                         float* s) {
  const int64_t vec_end = D / (2 * kLanes) * (2 * kLanes);
  for (int64_t t = t_lo; t < t_hi; ++t) {
    const T* kt = k + t * W;
    fvec a[NQ][2] = {};
    for (int64_t d = 0; d < vec_end; d += 2 * kLanes) {
      const fvec x0 = loadv(kt + d), x1 = loadv(kt + d + kLanes);
#pragma GCC unroll 4
      for (int i = 0; i < NQ; ++i) {
        a[i][0] += loadv(q + i * D + d) * x0;
        a[i][1] += loadv(q + i * D + d + kLanes) * x1;
      }
    }
    for (int i = 0; i < NQ; ++i) {
      float x = lane_sum(a[i][0] + a[i][1]);
      for (int64_t d = vec_end; d < D; ++d) x += q[i * D + d] * to_float(kt[d]);
      s[i * bs + t] = x * row_scale(kt, D);
    }
  }
}

// acc_i += sum_t p[i * bs + t] * v_t for NQ queries (each p already times its value row's scale), one value row
// after another, each loaded once for all NQ, acc in memory.
template <int NQ, typename T>
inline void block_values_by_row(const float* p, const T* v, int64_t t_lo, int64_t t_hi, int64_t D, int64_t W,
                                int64_t bs, float* acc) {
  for (int64_t t = t_lo; t < t_hi; ++t) {
    const T* vt = v + t * W;
    float pt[NQ];
    for (int i = 0; i < NQ; ++i) pt[i] = p[i * bs + t];
#pragma omp simd
    for (int64_t d = 0; d < D; ++d) {
      const float vd = to_float(vt[d]);
      for (int i = 0; i < NQ; ++i) acc[i * D + d] += pt[i] * vd;
    }
  }
}

// The same sums with 16 columns of every acc_i in registers while the block's value rows pass, so acc is loaded
// and stored once per block, not once per key: the faster of the two where the block is in cache, but the value
// rows are read column by column, which streamed worse from memory (see attend_split).
template <int NQ, typename T>
inline void block_values_by_column(const float* p, const T* v, int64_t t_lo, int64_t t_hi, int64_t D, int64_t W,
                                   int64_t bs, float* acc) {
  int64_t d = 0;
  for (; d + 2 * kLanes <= D; d += 2 * kLanes) {
    fvec a[NQ][2];
    for (int i = 0; i < NQ; ++i) a[i][0] = loadv(acc + i * D + d), a[i][1] = loadv(acc + i * D + d + kLanes);
    for (int64_t t = t_lo; t < t_hi; ++t) {
      const fvec v0 = loadv(v + t * W + d), v1 = loadv(v + t * W + d + kLanes);
#pragma GCC unroll 4
      for (int i = 0; i < NQ; ++i) {
        const fvec pi = splat(p[i * bs + t]);
        a[i][0] += pi * v0;
        a[i][1] += pi * v1;
      }
    }
    for (int i = 0; i < NQ; ++i) storev(a[i][0], acc + i * D + d), storev(a[i][1], acc + i * D + d + kLanes);
  }
  for (; d < D; ++d)
    for (int64_t t = t_lo; t < t_hi; ++t)
      for (int i = 0; i < NQ; ++i) acc[i * D + d] += p[i * bs + t] * to_float(v[t * W + d]);
}

#if defined(__AVX512F__)
// bf16 caches on AVX-512: each 64-byte load of 32 bf16 keys or values becomes two float vectors with one
// instruction each, its even elements (x << 16) and its odd ones (x & 0xffff0000), where widening 16 at a time
// took a load and a convert per 16. The queries and the accumulated outputs are kept in the same order (per 32
// columns: the 16 even ones, then the 16 odd ones; `split_order`), so each dot product and sum has the same terms, and
// the output is put back in column order when it is stored. On an AMX Xeon it beat the 8-lane kernels at every
// batch and context (benchmarks/results/report-2026-12-05-amx-xeon-decode-kernels.md). The values go by column
// here whatever the rows (64 columns of each accumulator in registers; by row, each FMA loaded and stored its
// accumulator).
constexpr bool kSplitBf16 = true;
constexpr int64_t kSplitCols = 32;

inline void split_bf16(const uint16_t* p, __m512* even, __m512* odd) {
  const __m512i raw = _mm512_loadu_si512(p);
  *even = _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16));
  *odd = _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int32_t>(0xffff0000u))));
}

// Key row t of a block of bf16 rows (at k; D values, W apart) and its value row (`plane` further) asked into L2.
inline void prefetch_rows(const uint16_t* k, int64_t plane, int64_t t, int64_t D, int64_t W) {
  const char* kt = reinterpret_cast<const char*>(k + t * W);
  const char* vt = reinterpret_cast<const char*>(k + plane + t * W);
  for (int64_t b = 0; b < D * 2; b += 64) __builtin_prefetch(kt + b, 0, 2), __builtin_prefetch(vt + b, 0, 2);
}

// s[i * bs + t] = q_i . k_t for NQ queries in split order (q_i at q + i * D) and keys t_lo..t_hi-1 of one block.
// With next_k, key row t of the next block (at next_k) and its value row (`plane` further) are asked into L2 with
// key t: spread over the block, where asking for the whole next block at once (prefetch_block) stalled on the
// misses it had in flight. With caches from memory, this kept decode from waiting on them
// (benchmarks/results/report-2026-12-05-amx-xeon-decode-kernels.md).
template <int NQ>
inline void block_scores_split(const float* q, const uint16_t* k, int64_t t_lo, int64_t t_hi, int64_t D, int64_t W,
                               int64_t bs, float* s, const uint16_t* next_k, int64_t plane) {
  for (int64_t t = t_lo; t < t_hi; ++t) {
    const uint16_t* kt = k + t * W;
    if (next_k) prefetch_rows(next_k, plane, t, D, W);
    __m512 a[NQ][2];
    for (int i = 0; i < NQ; ++i) a[i][0] = a[i][1] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += kSplitCols) {
      __m512 even, odd;
      split_bf16(kt + d, &even, &odd);
#pragma GCC unroll 4
      for (int i = 0; i < NQ; ++i) {
        a[i][0] = _mm512_fmadd_ps(_mm512_loadu_ps(q + i * D + d), even, a[i][0]);
        a[i][1] = _mm512_fmadd_ps(_mm512_loadu_ps(q + i * D + d + 16), odd, a[i][1]);
      }
    }
    for (int i = 0; i < NQ; ++i) s[i * bs + t] = _mm512_reduce_add_ps(_mm512_add_ps(a[i][0], a[i][1]));
  }
}

// acc_i[d, d + 32 * Chunks) += sum_t p[i * bs + t] * v_t[same columns] for NQ queries, acc in split order, with
// those columns of every acc_i in registers while the block's value rows pass.
template <int NQ, int Chunks>
inline void values_split_columns(const float* p, const uint16_t* v, int64_t t_lo, int64_t t_hi, int64_t D, int64_t W,
                                 int64_t bs, int64_t d, float* acc) {
  constexpr int kVecs = 2 * Chunks;
  __m512 a[NQ][kVecs];
  for (int i = 0; i < NQ; ++i)
    for (int j = 0; j < kVecs; ++j) a[i][j] = _mm512_loadu_ps(acc + i * D + d + 16 * j);
  for (int64_t t = t_lo; t < t_hi; ++t) {
    __m512 x[kVecs];
    for (int c = 0; c < Chunks; ++c) split_bf16(v + t * W + d + c * kSplitCols, &x[2 * c], &x[2 * c + 1]);
#pragma GCC unroll 4
    for (int i = 0; i < NQ; ++i) {
      const __m512 pi = _mm512_set1_ps(p[i * bs + t]);
      for (int j = 0; j < kVecs; ++j) a[i][j] = _mm512_fmadd_ps(pi, x[j], a[i][j]);
    }
  }
  for (int i = 0; i < NQ; ++i)
    for (int j = 0; j < kVecs; ++j) _mm512_storeu_ps(acc + i * D + d + 16 * j, a[i][j]);
}

// acc_i += sum_t p[i * bs + t] * v_t for NQ queries, acc in split order: 64 columns at a time (a last 32 alone), the
// rows in L1 (attend_split asks for them while it scores the block).
template <int NQ>
inline void block_values_split(const float* p, const uint16_t* v, int64_t t_lo, int64_t t_hi, int64_t D, int64_t W,
                               int64_t bs, float* acc) {
  int64_t d = 0;
  for (; d + 2 * kSplitCols <= D; d += 2 * kSplitCols) values_split_columns<NQ, 2>(p, v, t_lo, t_hi, D, W, bs, d, acc);
  if (d < D) values_split_columns<NQ, 1>(p, v, t_lo, t_hi, D, W, bs, d, acc);
}

// Scores on CPUs with AVX-512 BF16 (Zen 4, Sapphire Rapids), for bf16 queries: s[i * bs + t] = (q_i . k_t) * scale
// with q_i the query as the model gave it (bf16, natural order, not yet scaled), each vdpbf16ps 32 products of a key
// row against a query, exact, added in float32 (pairs in a fixed order, so a key's score is the same bits in any run
// or split). Against block_scores_split (the bf16 widened by shifts, two float32 FMAs per 32 columns and query): half
// the instructions a key, and no q in float. The values keep the split-order kernel (their weights are float32).
// On a Zen 4 that made short contexts faster and left long ones, bound by the memory, even.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")
template <int NQ>
void block_scores_dot(const uint16_t* q, const uint16_t* k, int64_t t_lo, int64_t t_hi, int64_t D, int64_t W,
                      int64_t bs, float scale, float* s, const uint16_t* next_k, int64_t plane) {
  for (int64_t t = t_lo; t < t_hi; ++t) {
    const uint16_t* kt = k + t * W;
    if (next_k) prefetch_rows(next_k, plane, t, D, W);
    __m512 a[NQ][2];
    for (int i = 0; i < NQ; ++i) a[i][0] = a[i][1] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 2 * kSplitCols) {  // two chains a query: each vdpbf16ps waits on its sum
      const __m512bh k0 = (__m512bh)_mm512_loadu_si512(kt + d);
      const __m512bh k1 = (__m512bh)_mm512_loadu_si512(kt + d + kSplitCols);
#pragma GCC unroll 4
      for (int i = 0; i < NQ; ++i) {
        a[i][0] = _mm512_dpbf16_ps(a[i][0], (__m512bh)_mm512_loadu_si512(q + i * D + d), k0);
        a[i][1] = _mm512_dpbf16_ps(a[i][1], (__m512bh)_mm512_loadu_si512(q + i * D + d + kSplitCols), k1);
      }
    }
    for (int i = 0; i < NQ; ++i) s[i * bs + t] = _mm512_reduce_add_ps(_mm512_add_ps(a[i][0], a[i][1])) * scale;
  }
}
#pragma GCC pop_options

// Whether block_scores_dot runs here: AVX-512 BF16, asked of the CPU once.
inline bool dot_scores_run() {
  static const bool runs = __builtin_cpu_supports("avx512bf16");
  return runs;
}
#else
inline bool dot_scores_run() { return false; }
constexpr bool kSplitBf16 = false;
constexpr int64_t kSplitCols = 32;
#endif

// Whether a cache of element type T with rows of D values takes the split-order kernels above.
template <typename T>
inline bool takes_split(int64_t D) {
  return kSplitBf16 && std::is_same_v<T, uint16_t> && D % kSplitCols == 0;
}

// Column d of a row in split order: where it sits (see split_bf16).
inline int64_t split_index(int64_t d) {
  const int64_t c = d % kSplitCols;
  return d - c + (c % 2) * (kSplitCols / 2) + c / 2;
}

// Queries [i0, i0 + n) of an item, n <= kPass, through f<NQ> with NQ = n as a constant.
template <class F>
inline void pass(int64_t n, F f) {
  switch (n) {
    case 4: return f(std::integral_constant<int, 4>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 2: return f(std::integral_constant<int, 2>{});
    default: return f(std::integral_constant<int, 1>{});
  }
}

// One run of query rows: rows of one request at consecutive positions (a decode is a run of one; a speculative
// step's K + 1 tokens, or a short prompt's, one of several), which read the same blocks; each row still sees only
// the keys up to its own position. Its items are item0 .. item0 + num_splits * kv heads - 1.
struct Run {
  int64_t row0, rows;  // its rows of q and out
  int64_t first_blk, num_splits, split_blocks, item0;
  bool tiles;  // on AMX tiles (amx_runs::attend)
};

// The keys of cache block `block` for kv head h ([block_size, width]; its values lie `plane` elements further).
template <typename T>
inline const T* block_keys(const Shape& s, const T* cache, int64_t block, int64_t h) {
  return cache + (block * s.num_kv_heads + h) * s.block_size * s.width;
}

// Asks for a block's keys and values into L2: blocks lie anywhere in the cache, where the hardware prefetcher
// does not follow a request's table.
template <typename T>
inline void prefetch_block(const Shape& s, const T* cache, int64_t block, int64_t h, int64_t plane) {
  const char* k = reinterpret_cast<const char*>(block_keys(s, cache, block, h));
  const int64_t bytes = s.block_size * s.width * static_cast<int64_t>(sizeof(T)), v = plane * sizeof(T);
  for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(k + b, 0, 2), __builtin_prefetch(k + v + b, 0, 2);
}

// One item: the G query heads sharing kv head h for every row of one run (query i = row i / G, head i % G), over
// blocks [blk_lo, blk_hi) of its table. Each key and value block is read once for all of them; a row's keys
// outside its own range get no weight. Writes the running max m, sum l [Q] and unnormalized output acc [Q, D]. The
// queries come scaled, as float32 (q), or with q_bf16 (not nullptr) as the model gave them, for block_scores_dot.
// `aligned` (fixed splits): each block's keys are scored from its first slot and the values summed by column whatever
// the rows, so a key's softmax lane (which partial sum its weight joins) is its slot in the block, not its place after
// the run's first visible key: a row's sums then do not depend on the run it is in.
template <typename T>
void attend_split(const Shape& s, const T* cache, const int32_t* table, const int64_t* first, const int64_t* end,
                  int64_t rows, const float* q, const uint16_t* q_bf16, int64_t h, int64_t blk_lo, int64_t blk_hi,
                  bool prefetch_next, bool aligned, float* m, float* l, float* acc) {
  const int64_t D = s.head_dim, W = s.width, bs = s.block_size, G = s.group, Q = rows * G;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores(Q * bs);
  std::fill(m, m + Q, neg_inf);
  std::fill(l, l + Q, 0.f);
  std::fill(acc, acc + Q * D, 0.f);
  const int64_t plane = s.num_blocks * s.num_kv_heads * bs * W;  // keys, then values
  // On the AVX2 EPYC one row a request ran faster by row (by column it fell short of the memory's bandwidth),
  // and a run of several rows faster by column, which reads each value row once for all of them
  // (benchmarks/results/report-2026-12-03-avx2-epyc-verify-step.md).
  const bool split_order = takes_split<T>(D);
  const bool by_column = rows > 1 || split_order || aligned;
  for (int64_t blk = blk_lo; blk < blk_hi; ++blk) {
    const int64_t base = blk * bs;
    const int64_t first_key = std::max(first[0], base) - base, t_hi = std::min(end[rows - 1], base + bs) - base;
    if (first_key >= t_hi) continue;  // no row of the run sees this block
    // NOTE: slots before first_key hold keys earlier rows wrote (the cache starts as zeros): finite, and weighted 0.
    const int64_t t_lo = aligned ? 0 : first_key;
    const T* k = block_keys(s, cache, table[blk], h);
    const T* v = k + plane;
    if (by_column) {  // this block's values into L1 while its scores are computed
      const char* vb = reinterpret_cast<const char*>(v);
      for (int64_t b = 0; b < bs * W * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(vb + b);
    }
    // the next block into L2: the split-order kernels ask for it row by row while they score this one
    const bool has_next = blk + 1 < blk_hi;
    const T* next_k = split_order && has_next ? block_keys(s, cache, table[blk + 1], h) : nullptr;
    if (!split_order && (rows > 1 || prefetch_next) && has_next) prefetch_block(s, cache, table[blk + 1], h, plane);
    for (int64_t i0 = 0; i0 < Q; i0 += kPass)
      pass(std::min<int64_t>(kPass, Q - i0), [&](auto n) {
        constexpr int NQ = decltype(n)::value;
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<T, uint16_t>) {
          if (q_bf16 != nullptr)
            return block_scores_dot<NQ>(q_bf16 + i0 * D, k, t_lo, t_hi, D, W, bs, s.scale, scores.data() + i0 * bs,
                                        i0 == 0 ? next_k : nullptr, plane);
          if (split_order)
            return block_scores_split<NQ>(q + i0 * D, k, t_lo, t_hi, D, W, bs, scores.data() + i0 * bs,
                                          i0 == 0 ? next_k : nullptr, plane);
        }
#endif
        block_scores<NQ>(q + i0 * D, k, t_lo, t_hi, D, W, bs, scores.data() + i0 * bs);
      });
    for (int64_t i = 0; i < Q; ++i) {
      const int64_t r = i / G;
      const int64_t lo = std::max(first[r] - base, t_lo), hi = std::min(end[r] - base, t_hi);
      float* si = scores.data() + i * bs;
      float block_max = neg_inf;
      for (int64_t t = lo; t < hi; ++t) {
        if (s.softcap > 0.f) si[t] = s.softcap * std::tanh(si[t] / s.softcap);
        block_max = std::max(block_max, si[t]);
      }
      const float m_new = std::max(m[i], block_max);
      if (m_new > m[i]) {  // rescale what was summed under the old max
        const float alpha = std::exp(m[i] - m_new);
        l[i] *= alpha;
        float* acc_i = acc + i * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) acc_i[d] *= alpha;
        m[i] = m_new;
      }
      l[i] += softmax_weights(si, t_lo, t_hi, lo, hi, m_new);
      if constexpr (kQuantized<T>)
        for (int64_t t = t_lo; t < t_hi; ++t) si[t] *= row_scale(v + t * W, D);  // the value row's scale, into its weight
    }
    for (int64_t i0 = 0; i0 < Q; i0 += kPass)
      pass(std::min<int64_t>(kPass, Q - i0), [&](auto n) {
        constexpr int NQ = decltype(n)::value;
        float* out = acc + i0 * D;
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<T, uint16_t>)
          if (split_order) return block_values_split<NQ>(scores.data() + i0 * bs, v, t_lo, t_hi, D, W, bs, out);
#endif
        if (by_column) block_values_by_column<NQ>(scores.data() + i0 * bs, v, t_lo, t_hi, D, W, bs, out);
        else block_values_by_row<NQ>(scores.data() + i0 * bs, v, t_lo, t_hi, D, W, bs, out);
      });
  }
}

#if defined(__AVX512F__)
// Runs of bf16 queries on a bf16 cache, on AMX tiles (where tiles_ready()). Per item, with S^T = K Q^T so that the
// keys are the left operand, read as they lie in the cache (16 keys of one block, 32 columns a tile row):
//   S^T [16 keys, 16 queries] += K[16 keys, 32 dims] x Q^T (the queries' 32 dims in pairs: a B tile),
//   softmax down S^T's columns in 16-lane vectors (lane = query; each row of S^T is one key for every query),
//   the weights as bf16 pairs hi + lo scattered, two keys a time, into P's A tiles [16 queries, 32 keys],
//   acc [16 queries, 16 dims] += P_hi x V + P_lo x V (V's rows in pairs, packed once per item: a B tile per 32 keys
//   and 16 dims).
// Keys an item's queries cannot see (before the first row's first key, past the last row's last, other lanes' ranges)
// get weight 0; packed value rows past what any query sees are zeros, so stale slots (NaN bits even) add nothing.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16")
#include "bf16_tiles.h"
namespace amx_runs {

using bf16_tiles::exp_ps;

constexpr int64_t kTile = 16;   // tile rows: keys of S^T, queries of P and acc
constexpr int64_t kGroup = 32;  // keys per P x V multiply (pairs of keys in a B tile's rows)
constexpr int64_t kTileElems = kTile * kGroup;  // bf16 elements of one A or B tile

// Tiles 0-3 sum (C), 4 and 6 hold left operands (A: keys, or P's hi and lo), 5 the right one (B).
inline void configure() { bf16_tiles::configure_full_tiles(7); }

inline void release() { _tile_release(); }

struct Scratch {
  std::vector<uint32_t> qt;   // the queries as B tiles: [head_dim / 2 pairs][16 queries]
  std::vector<float> st;      // S^T: [keys][16 queries]
  std::vector<uint16_t> p;    // P as A tiles: [groups][16 queries][32 keys]
  std::vector<uint16_t> vp;   // V as B tiles: [groups][head_dim / 16][16 key pairs][16 dims][2]
  std::vector<float> acc;     // P V: [16 queries][head_dim]
};

// The value rows of keys [k0, k0 + 32) (zeros outside [lo, hi)) as the B tiles of one group: per 16 dims, row i holds
// dims d..d+15 of keys 2i and 2i + 1, interleaved.
template <class RowOf>
void pack_values(RowOf value_row, int64_t k0, int64_t lo, int64_t hi, int64_t D, uint16_t* out) {
  static const __m512i interleave = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                                     23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  for (int64_t i = 0; i < kTile; ++i) {
    const int64_t a = k0 + 2 * i, b = a + 1;
    const uint16_t* va = a >= lo && a < hi ? value_row(a) : nullptr;
    const uint16_t* vb = b >= lo && b < hi ? value_row(b) : nullptr;
    for (int64_t d = 0; d < D; d += kTile) {
      const __m256i x = va ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(va + d)) : _mm256_setzero_si256();
      const __m256i y = vb ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(vb + d)) : _mm256_setzero_si256();
      const __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(x), y, 1);
      _mm512_storeu_si512(out + (d / kTile) * kTileElems + i * kGroup, _mm512_permutexvar_epi16(interleave, both));
    }
  }
}

// acc[:, d0 .. d0 + 16 * NC) = P V for the groups' tiles (NC of the four sum tiles), P = p's hi tiles + its lo ones.
template <int NC>
void values_pass(const uint16_t* p, const uint16_t* vp, int64_t groups, int64_t D, int64_t d0, float* acc) {
  _tile_zero(0);
  if constexpr (NC > 1) _tile_zero(1);
  if constexpr (NC > 2) _tile_zero(2);
  if constexpr (NC > 3) _tile_zero(3);
  const int64_t chunks = D / kTile;
  for (int64_t g = 0; g < groups; ++g) {
    _tile_loadd(4, p + g * kTileElems, 64);
    _tile_loadd(6, p + (groups + g) * kTileElems, 64);
    const uint16_t* v = vp + (g * chunks + d0 / kTile) * kTileElems;
    _tile_loadd(5, v, 64);
    _tile_dpbf16ps(0, 4, 5);
    _tile_dpbf16ps(0, 6, 5);
    if constexpr (NC > 1) { _tile_loadd(5, v + kTileElems, 64); _tile_dpbf16ps(1, 4, 5); _tile_dpbf16ps(1, 6, 5); }
    if constexpr (NC > 2) { _tile_loadd(5, v + 2 * kTileElems, 64); _tile_dpbf16ps(2, 4, 5); _tile_dpbf16ps(2, 6, 5); }
    if constexpr (NC > 3) { _tile_loadd(5, v + 3 * kTileElems, 64); _tile_dpbf16ps(3, 4, 5); _tile_dpbf16ps(3, 6, 5); }
  }
  _tile_stored(0, acc + d0, D * 4);
  if constexpr (NC > 1) _tile_stored(1, acc + d0 + kTile, D * 4);
  if constexpr (NC > 2) _tile_stored(2, acc + d0 + 2 * kTile, D * 4);
  if constexpr (NC > 3) _tile_stored(3, acc + d0 + 3 * kTile, D * 4);
}

// One item as attend_split makes it (running max m, sum l, unnormalized acc per query, acc in column order) for a
// run's rows * G bf16 queries (q: the run's first row [rows, kv heads, G, D]) in tiles of 16, keys of blocks
// [blk_lo, blk_hi) of its table.
void attend(const Shape& s, const uint16_t* cache, const int32_t* table, const int64_t* first, const int64_t* end,
            int64_t rows, const uint16_t* q, int64_t h, int64_t blk_lo, int64_t blk_hi, float* m, float* l,
            float* acc, Scratch& w) {
  const int64_t D = s.head_dim, W = s.width, bs = s.block_size, G = s.group, Q = rows * G;
  const int64_t plane = s.num_blocks * s.num_kv_heads * bs * W;  // keys, then values
  const float neg_inf = -std::numeric_limits<float>::infinity();
  // Keys any query here sees: [k_lo, k_hi). Rows sit at consecutive positions: first and end rise with the row.
  const int64_t k_lo = std::max(first[0], blk_lo * bs), k_hi = std::min(end[rows - 1], blk_hi * bs);
  if (k_lo >= k_hi) {
    std::fill(m, m + Q, neg_inf);
    std::fill(l, l + Q, 0.f);
    std::fill(acc, acc + Q * D, 0.f);
    return;
  }
  const int64_t key0 = k_lo / kTile * kTile;  // slices of 16 keys, never across a block (bs % 16 == 0)
  const int64_t slices = (k_hi - key0 + kTile - 1) / kTile, groups = (slices + 1) / 2;
  auto key_row = [&](int64_t pos) { return block_keys(s, cache, table[pos / bs], h) + (pos % bs) * W; };
  auto value_row = [&](int64_t pos) { return key_row(pos) + plane; };
  w.qt.resize(D / 2 * kTile);
  w.st.resize(slices * kTile * kTile);
  w.p.resize(2 * groups * kTileElems);
  w.vp.resize(groups * D / kTile * kTileElems);
  w.acc.resize(kTile * D);
  for (int64_t g = 0; g < groups; ++g) pack_values(value_row, key0 + g * kGroup, k_lo, k_hi, D, &w.vp[g * D / kTile * kTileElems]);
  const __m512i lane = _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0);
  const __m512i pair_lanes = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
                                              23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i row_bytes = _mm512_mullo_epi32(lane, _mm512_set1_epi32(kGroup * 2));  // P's rows, 64 bytes apart
  for (int64_t q0 = 0; q0 < Q; q0 += kTile) {
    const int64_t nq = std::min(kTile, Q - q0);
    // The queries' pairs of columns as B tiles; each lane's visible keys [lo, hi) (none past the last query).
    alignas(64) int32_t lo[kTile], hi[kTile];
    for (int64_t n = 0; n < kTile; ++n) {
      if (n >= nq) {
        lo[n] = hi[n] = 0;
        for (int64_t j = 0; j < D / 2; ++j) w.qt[j * kTile + n] = 0;
        continue;
      }
      const int64_t r = (q0 + n) / G, g = (q0 + n) % G;
      lo[n] = static_cast<int32_t>(first[r]);
      hi[n] = static_cast<int32_t>(end[r]);
      const uint32_t* src = reinterpret_cast<const uint32_t*>(q + ((r * s.num_kv_heads + h) * G + g) * D);
      for (int64_t j = 0; j < D / 2; ++j) w.qt[j * kTile + n] = src[j];
    }
    // S^T, one slice of 16 keys at a time.
    for (int64_t i = 0; i < slices; ++i) {
      const uint16_t* k = key_row(key0 + i * kTile);
      _tile_zero(0);
      for (int64_t c = 0; c < D; c += kGroup) {
        _tile_loadd(4, k + c, W * 2);
        _tile_loadd(5, &w.qt[c / 2 * kTile], 64);
        _tile_dpbf16ps(0, 4, 5);
      }
      _tile_stored(0, &w.st[i * kTile * kTile], 64);
    }
    const int64_t n_keys = slices * kTile;
    float scale = s.scale;
    if (s.softcap > 0.f) {
      for (int64_t x = 0; x < n_keys * kTile; ++x) w.st[x] = std::tanh(w.st[x] * s.scale / s.softcap) * s.softcap;
      scale = 1.f;
    }
    const __m512i vlo = _mm512_load_si512(lo), vhi = _mm512_load_si512(hi);
    auto visible = [&](int64_t t) {
      const __m512i pos = _mm512_set1_epi32(static_cast<int32_t>(key0 + t));
      return t < n_keys ? static_cast<__mmask16>(_mm512_cmpge_epi32_mask(pos, vlo) & _mm512_cmplt_epi32_mask(pos, vhi))
                        : __mmask16{0};
    };
    __m512 mx = _mm512_set1_ps(neg_inf);
    for (int64_t t = 0; t < n_keys; ++t) mx = _mm512_mask_max_ps(mx, visible(t), mx, _mm512_loadu_ps(&w.st[t * kTile]));
    // A lane that sees nothing keeps m = -inf and l = 0 (the merge skips it); its shift is 0, its weights masked.
    const __mmask16 seen = _mm512_cmp_ps_mask(mx, _mm512_set1_ps(neg_inf), _CMP_NEQ_OQ);
    const __m512 m_lane = _mm512_mask_mul_ps(mx, seen, mx, _mm512_set1_ps(scale));
    const __m512 shift = _mm512_maskz_sub_ps(seen, _mm512_setzero_ps(), m_lane), sc = _mm512_set1_ps(scale);
    __m512 sum = _mm512_setzero_ps();
    uint16_t* p_lo = w.p.data() + groups * kTileElems;
    for (int64_t t = 0; t < groups * kGroup; t += 2) {
      const __mmask16 v0 = visible(t), v1 = visible(t + 1);
      const __m512 e0 = v0 ? _mm512_maskz_mov_ps(v0, exp_ps(_mm512_fmadd_ps(_mm512_loadu_ps(&w.st[t * kTile]), sc, shift)))
                           : _mm512_setzero_ps();
      const __m512 e1 = v1 ? _mm512_maskz_mov_ps(v1, exp_ps(_mm512_fmadd_ps(_mm512_loadu_ps(&w.st[(t + 1) * kTile]), sc, shift)))
                           : _mm512_setzero_ps();
      sum = _mm512_add_ps(sum, _mm512_add_ps(e0, e1));
      // Each weight as a bf16 pair hi + lo (lo: what hi's rounding lost, ~2^-9 of it): P V in two products keeps the
      // weights to ~2^-17, where one bf16 P put 1e-3 of error on outputs of ~1.
      const __m512i hi = (__m512i)_mm512_cvtne2ps_pbh(e1, e0);
      const __m512 lo0 = _mm512_sub_ps(e0, _mm512_cvtpbh_ps((__m256bh)_mm512_castsi512_si256(hi)));
      const __m512 lo1 = _mm512_sub_ps(e1, _mm512_cvtpbh_ps((__m256bh)_mm512_extracti64x4_epi64(hi, 1)));
      const __m512i lo = (__m512i)_mm512_cvtne2ps_pbh(lo1, lo0);
      // (key t, key t + 1) per query, into row `query` of the group's A tiles, columns t % 32 and t % 32 + 1.
      const int64_t at = (t / kGroup) * kTileElems + t % kGroup;
      _mm512_i32scatter_epi32(&w.p[at], row_bytes, _mm512_permutexvar_epi16(pair_lanes, hi), 1);
      _mm512_i32scatter_epi32(p_lo + at, row_bytes, _mm512_permutexvar_epi16(pair_lanes, lo), 1);
    }
    alignas(64) float m_out[kTile], l_out[kTile];
    _mm512_store_ps(m_out, m_lane);
    _mm512_store_ps(l_out, sum);
    int64_t d0 = 0;
    for (; d0 + 4 * kTile <= D; d0 += 4 * kTile) values_pass<4>(w.p.data(), w.vp.data(), groups, D, d0, w.acc.data());
    if (D - d0 == 2 * kTile) values_pass<2>(w.p.data(), w.vp.data(), groups, D, d0, w.acc.data());
    for (int64_t n = 0; n < nq; ++n) {
      m[q0 + n] = m_out[n];
      l[q0 + n] = l_out[n];
      std::memcpy(acc + (q0 + n) * D, &w.acc[n * D], D * sizeof(float));
    }
  }
}

}  // namespace amx_runs
#pragma GCC pop_options

// Whether this process multiplies bf16 tiles: the CPU has AMX-BF16 and Linux lets this process use the tile state,
// asked once (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA, as oneDNN and the int8 kernels ask).
bool tiles_ready() {
  static const bool ready = [] {
    if (!__builtin_cpu_supports("amx-bf16") || !__builtin_cpu_supports("amx-tile") ||
        !__builtin_cpu_supports("avx512bf16") || !__builtin_cpu_supports("avx512bw"))
      return false;
    return jido_tiles::state_granted();
  }();
  return ready;
}
#else
bool tiles_ready() { return false; }
#endif  // __AVX512F__

// Rows of one request at consecutive positions whose blocks are the same (the rows build_plan makes of a short
// query) form one run, up to this many rows.
constexpr int64_t kMaxRunRows = 16;

// A step's keys and values per thread past which one-row runs prefetch their next block (see decode).
constexpr int64_t kPrefetchBytesPerThread = 1536 * 1024;

// Runs of at least this many rows go on AMX tiles, where the cache and queries are bf16 and the tiles run: from 2
// rows the tiles beat the vector kernels, more so the more rows
// (benchmarks/results/spec_decode-2026-12-05-amx-xeon.md).
// A run of one row lost on tiles: its 4 queries fill a quarter of the tile's rows.
constexpr int64_t kTileMinRows = 2;
constexpr int64_t amx_tile_keys = 16;  // keys per S^T tile: block sizes must be multiples of it
template <typename T, typename C>
constexpr bool kTileTypes = std::is_same_v<T, uint16_t> && std::is_same_v<C, uint16_t>;

// Whether row b continues the run that row b - 1 is in: the next position of the same blocks.
inline bool continues_run(const Shape& s, const int32_t* tables, const int32_t* seq_lens, int64_t b) {
  if (seq_lens[b] != seq_lens[b - 1] + 1) return false;
  const int64_t blocks = (seq_lens[b] - 1) / s.block_size + 1;
  return std::memcmp(tables + b * s.max_blocks, tables + (b - 1) * s.max_blocks, blocks * sizeof(int32_t)) == 0;
}

// `fixed_splits` (batch_invariant): splits are the blocks [j * blocks_per_split, (j + 1) * blocks_per_split) of the
// table, whatever the run and the batch, no run goes on AMX tiles, and every block is summed `aligned` (see
// attend_split). A row's output is then the same bits alone, in any batch, in a run of any length (a prompt's rows
// and a decode alike); splits with no key the row sees add nothing to its merge.
template <typename T, typename C>
void decode(const Shape& s, T* out, const T* q_in, const C* cache, const int32_t* tables, const int32_t* seq_lens,
            int64_t num_rows, int64_t blocks_per_split, bool fixed_splits) {
  const int64_t D = s.head_dim, G = s.group, H = s.num_kv_heads, bs = s.block_size;
  std::vector<int64_t> first(num_rows), end(num_rows);
  for (int64_t b = 0; b < num_rows; ++b) visible_range(s, seq_lens[b], &first[b], &end[b]);
  std::vector<Run> runs;
  for (int64_t b = 0; b < num_rows; ++b) {
    if (b > 0 && runs.back().rows < kMaxRunRows && continues_run(s, tables, seq_lens, b)) ++runs.back().rows;
    else runs.push_back(Run{b, 1, 0, 0, 0, 0, false});
  }
  // Items per run: its visible blocks (from its first row's first key to its last row's last) cut into splits of
  // equal size, at most blocks_per_split blocks each, and at least enough of them that a batch of fewer (run, kv
  // head) pairs than threads keeps every thread busy. Equal sizes matter: a 512-token window spans 33 blocks of
  // 16, which splits of 32 cut 32 + 1, leaving one thread all the work (visible in a whole batch-1 decode step).
  const int64_t pairs = std::max<int64_t>(1, static_cast<int64_t>(runs.size()) * H);  // NOTE: may be no rows
  const int64_t min_splits = (at::get_num_threads() + pairs - 1) / pairs;
  std::vector<int64_t> item_run, item_q;  // each item's run, and the offset of its first query's state
  int64_t num_q = 0;
  for (int64_t j = 0; j < static_cast<int64_t>(runs.size()); ++j) {
    Run& run = runs[j];
    const int64_t last = run.row0 + run.rows - 1;
    if (fixed_splits) {
      const int64_t first_split = first[run.row0] / bs / blocks_per_split;
      run.first_blk = first_split * blocks_per_split;
      run.split_blocks = blocks_per_split;
      run.num_splits = (end[last] - 1) / bs / blocks_per_split + 1 - first_split;
    } else {
      run.first_blk = first[run.row0] / bs;
      const int64_t nblk = (end[last] - 1) / bs + 1 - run.first_blk;
      const int64_t splits = std::min(nblk, std::max((nblk + blocks_per_split - 1) / blocks_per_split, min_splits));
      run.split_blocks = (nblk + splits - 1) / splits;
      run.num_splits = (nblk + run.split_blocks - 1) / run.split_blocks;  // none empty
    }
    run.item0 = static_cast<int64_t>(item_run.size());
    for (int64_t i = 0; i < run.num_splits * H; ++i) item_run.push_back(j), item_q.push_back(num_q), num_q += run.rows * G;
  }
  const int64_t num_items = static_cast<int64_t>(item_run.size());
  std::vector<float> ms(num_q), ls(num_q), accs(num_q * D);
  const bool split_order = takes_split<C>(D);  // queries and outputs in split order (see split_bf16)
  const bool tiles = !fixed_splits && kTileTypes<T, C> && D % 32 == 0 && bs % amx_tile_keys == 0 && tiles_ready();
  bool any_tiles = false;
  for (Run& run : runs) any_tiles |= run.tiles = tiles && run.rows >= kTileMinRows;
  // One-row runs of the 8-lane kernels ask for their next block too once the step's keys and values outgrow what the
  // threads' L2 caches hold (the split-order kernels always do, row by row): past that the prefetch hides memory
  // latency; below it, with the data in L2, it only adds instructions (no gain or a loss).
  int64_t step_bytes = 0;
  for (const Run& run : runs) step_bytes += run.num_splits * run.split_blocks * bs * s.width * 2 * H;
  step_bytes *= static_cast<int64_t>(sizeof(C));
  const bool prefetch_next = step_bytes > kPrefetchBytesPerThread * at::get_num_threads();

  // bf16 queries on a bf16 cache: scores by vdpbf16ps where the CPU has it (block_scores_dot)
  const bool dot_scores = kTileTypes<T, C> && split_order && D % (2 * kSplitCols) == 0 && dot_scores_run();
  at::parallel_for(0, num_items, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> q;
    std::vector<uint16_t> q_bf16;
#if defined(__AVX512F__)
    amx_runs::Scratch scratch;
    if (any_tiles) amx_runs::configure();
#endif
    for (int64_t i = lo; i < hi; ++i) {
      const Run& run = runs[item_run[i]];
      const int64_t local = i - run.item0, h = local / run.num_splits, split = local % run.num_splits;
      const int64_t qi = item_q[i];
      if (run.tiles) {
#if defined(__AVX512F__)
        if constexpr (kTileTypes<T, C>) {
          const int64_t last = run.row0 + run.rows - 1;
          const int64_t blk_lo = run.first_blk + split * run.split_blocks;
          const int64_t blk_hi = std::min(blk_lo + run.split_blocks, (end[last] - 1) / bs + 1);
          amx_runs::attend(s, cache, tables + run.row0 * s.max_blocks, &first[run.row0], &end[run.row0], run.rows,
                           q_in + run.row0 * H * G * D, h, blk_lo, blk_hi, &ms[qi], &ls[qi], &accs[qi * D], scratch);
        }
#endif
        continue;
      }
      q.resize(dot_scores ? 0 : run.rows * G * D);
      q_bf16.resize(dot_scores ? run.rows * G * D : 0);
      for (int64_t r = 0; r < run.rows; ++r) {
        const T* qh = q_in + ((run.row0 + r) * H + h) * G * D;  // query heads h*G .. h*G+G-1 of the row
        float* qr = q.data() + r * G * D;
        if (dot_scores)
          std::memcpy(q_bf16.data() + r * G * D, qh, G * D * sizeof(T));
        else if (split_order)
          for (int64_t g = 0; g < G; ++g)
            for (int64_t d = 0; d < D; ++d) qr[g * D + split_index(d)] = to_float(qh[g * D + d]) * s.scale;
        else
          for (int64_t x = 0; x < G * D; ++x) qr[x] = to_float(qh[x]) * s.scale;
      }
      const int64_t last = run.row0 + run.rows - 1;
      const int64_t blk_lo = run.first_blk + split * run.split_blocks;
      const int64_t blk_hi = std::min(blk_lo + run.split_blocks, (end[last] - 1) / bs + 1);
      attend_split(s, cache, tables + run.row0 * s.max_blocks, &first[run.row0], &end[run.row0], run.rows, q.data(),
                   dot_scores ? q_bf16.data() : nullptr, h, blk_lo, blk_hi, prefetch_next, fixed_splits, &ms[qi],
                   &ls[qi], &accs[qi * D]);
    }
#if defined(__AVX512F__)
    if (any_tiles) amx_runs::release();
#endif
  });

  // Merge each (row, kv head)'s splits by log-sum-exp and normalize once.
  at::parallel_for(0, num_rows * H, 1, [&](int64_t lo, int64_t hi) {
    std::vector<float> o(D);
    int64_t j = 0;
    for (int64_t bh = lo; bh < hi; ++bh) {
      const int64_t b = bh / H, h = bh % H;
      while (runs[j].row0 + runs[j].rows <= b) ++j;  // rows come in order: the run holding b
      const Run& run = runs[j];
      const int64_t n = run.num_splits, i0 = run.item0 + h * n;
      for (int64_t g = 0; g < G; ++g) {
        const int64_t query = (b - run.row0) * G + g;  // its index within each item
        float m = -std::numeric_limits<float>::infinity();
        for (int64_t x = 0; x < n; ++x) m = std::max(m, ms[item_q[i0 + x] + query]);
        float l = 0.f;
        std::fill(o.begin(), o.end(), 0.f);
        for (int64_t x = 0; x < n; ++x) {
          const int64_t qi = item_q[i0 + x] + query;
          if (ls[qi] == 0.f) continue;  // a split with no key this row sees
          const float w = std::exp(ms[qi] - m);
          l += ls[qi] * w;
          axpy(w, &accs[qi * D], o.data(), D);
        }
        T* dst = out + ((b * H + h) * G + g) * D;
        if (split_order && !run.tiles)
          for (int64_t d = 0; d < D; ++d) store(o[split_index(d)] / l, dst + d);
        else
          for (int64_t d = 0; d < D; ++d) store(o[d] / l, dst + d);
      }
    }
  });
}

// The cache's element type: the query's (float32, bf16), or a quantized one.
template <typename T>
void decode_cache(const Shape& s, T* out, const T* q, const at::Tensor& kv_cache, const int32_t* tables,
                  const int32_t* lens, int64_t num_reqs, int64_t blocks_per_split, bool fixed_splits) {
  const void* cache = kv_cache.data_ptr();
  switch (kv_cache.scalar_type()) {
    case at::ScalarType::Char:
      return decode(s, out, q, static_cast<const int8_t*>(cache), tables, lens, num_reqs, blocks_per_split,
                    fixed_splits);
    case at::ScalarType::Float8_e4m3fn:
      return decode(s, out, q, static_cast<const E4M3*>(cache), tables, lens, num_reqs, blocks_per_split,
                    fixed_splits);
    case at::ScalarType::Float8_e5m2:
      return decode(s, out, q, static_cast<const E5M2*>(cache), tables, lens, num_reqs, blocks_per_split,
                    fixed_splits);
    default:
      return decode(s, out, q, static_cast<const T*>(cache), tables, lens, num_reqs, blocks_per_split,
                    fixed_splits);
  }
}

void paged_decode(at::Tensor out, const at::Tensor& q, const at::Tensor& kv_cache, const at::Tensor& block_tables,
                  const at::Tensor& seq_lens, double scale, int64_t window, double softcap, int64_t blocks_per_split,
                  bool fixed_splits) {
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
    decode_cache(s, out.data_ptr<float>(), q.data_ptr<float>(), kv_cache, tables, lens, num_reqs, blocks_per_split,
                 fixed_splits);
  } else {
    TORCH_CHECK(q.scalar_type() == at::kBFloat16, "paged_decode: float32 or bfloat16");
    auto bits = [](const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); };
    decode_cache(s, bits(out), bits(q), kv_cache, tables, lens, num_reqs, blocks_per_split, fixed_splits);
  }
}

// This step's keys and values into their slots of a cache of their own dtype: k, v [tokens, kv_heads * head_dim]
// (rows may be strided, as splits of the fused QKV output are), token t to block slot[t] / block_size, offset
// slot[t] % block_size, each (token, kv head) row one copy. The PyTorch path (tiled_backend.write_kv) does this
// with ~8 ATen ops per layer, whose dispatch was a visible share of a batch-1 decode layer. Every slot is checked
// before any row is written, so a bad slot leaves the cache as it was; a prefill's rows are split over the threads.
template <typename I>
void copy_rows(char* cache, const char* k, const char* v, const I* slots, int64_t tokens, const at::Tensor& kv_cache,
               int64_t k_stride, int64_t v_stride, int64_t row_bytes) {
  const int64_t num_blocks = kv_cache.size(1), H = kv_cache.size(2), block_size = kv_cache.size(3);
  const int64_t half = num_blocks * H * block_size * row_bytes;  // bytes of the keys' half of the cache
  for (int64_t t = 0; t < tokens; ++t) {
    const int64_t slot = static_cast<int64_t>(slots[t]);
    TORCH_CHECK(slot >= 0 && slot < num_blocks * block_size, "write_kv: slot ", slot, " is outside the cache");
  }
  at::parallel_for(0, tokens, 128, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t slot = static_cast<int64_t>(slots[t]), block = slot / block_size, offset = slot % block_size;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t dst = ((block * H + h) * block_size + offset) * row_bytes;
        std::memcpy(cache + dst, k + t * k_stride + h * row_bytes, row_bytes);
        std::memcpy(cache + half + dst, v + t * v_stride + h * row_bytes, row_bytes);
      }
    }
  });
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
        "int window, float softcap, int blocks_per_split, bool fixed_splits=False) -> ()");
  m.def("write_kv(Tensor(a!) kv_cache, Tensor k, Tensor v, Tensor slot_mapping) -> ()");
}

TORCH_LIBRARY_IMPL(jido_cpu_attn, CPU, m) {
  m.impl("paged_decode", &paged_decode);
  m.impl("write_kv", &write_kv);
}
