// Weight-quantized linear layers on CPU: y[m, n] = sum_k x[m, k] * w[n, k], with
//   w[n, k] = scales[n, k / group_size] * q[n, k] + mins[n, k / group_size]   (mins optional),
// q int8 [N, K] (bits 8) or two 4-bit values per byte [N, ceil(K / 2)], q[2j] in the low nibble (bits 4).
//
// linear: decode at batch 1 is memory-bound, so the weight bytes stream once: threads split the output
// rows, each row's 32-column chunks are dequantized to fp32 in registers and multiplied into up to kMaxRows
// rows of x at once (x converted to fp32 once, before the loop). The scale (and min) is folded into the
// dequantized weight, so the dot products accumulate in lane vectors over the whole row and are summed
// across lanes once per output. With bf16_dots (more rows of bf16 x, AVX512_BF16) the dequantized chunk is
// rounded to bf16 and multiplied by vdpbf16ps instead, twice the products per instruction.
// dequantize: w in fp32 or bf16 for some rows: the caller's tiled matmul and embedding lookups.
//
// The vectors are GCC's vector extensions, so one source compiles to AVX-512, to AVX2 (two registers per
// vector) or to scalar code, whatever the -m flags allow. Only the widening of bytes to floats uses
// intrinsics: GCC 12 turns __builtin_convertvector from 8-bit lanes into one scalar convert per lane.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "bf16_bits.h"

namespace {

typedef float f32x16 __attribute__((vector_size(64)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint8_t u8x16 __attribute__((vector_size(16)));

inline f32x16 load_f32(const float* p) {
  f32x16 v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

// NOTE: always_inline on the helpers of dequant_chunk: the bf16 kernel has another target attribute, and GCC
// does not otherwise inline them there (a call per chunk spills every accumulator).
#define JIDO_INLINE __attribute__((always_inline)) inline

JIDO_INLINE f32x16 broadcast(float s) { return f32x16{s, s, s, s, s, s, s, s, s, s, s, s, s, s, s, s}; }

// 16 bytes widened to 16 floats, read as signed (int8 weights) or unsigned (nibbles already masked).
template <bool Signed>
JIDO_INLINE f32x16 bytes_to_f32(u8x16 b) {
#if defined(__AVX512F__)
  const __m512i w = Signed ? _mm512_cvtepi8_epi32((__m128i)b) : _mm512_cvtepu8_epi32((__m128i)b);
  return (f32x16)_mm512_cvtepi32_ps(w);
#elif defined(__AVX2__)
  const __m128i high = _mm_srli_si128((__m128i)b, 8);
  const __m256i w0 = Signed ? _mm256_cvtepi8_epi32((__m128i)b) : _mm256_cvtepu8_epi32((__m128i)b);
  const __m256i w1 = Signed ? _mm256_cvtepi8_epi32(high) : _mm256_cvtepu8_epi32(high);
  const __m256 halves[2] = {_mm256_cvtepi32_ps(w0), _mm256_cvtepi32_ps(w1)};
  f32x16 v;
  std::memcpy(&v, halves, sizeof(v));
  return v;
#else
  f32x16 v;
  for (int j = 0; j < 16; ++j) v[j] = Signed ? static_cast<float>(static_cast<int8_t>(b[j])) : b[j];
  return v;
#endif
}

constexpr int64_t kChunk = 32;  // columns one step dequantizes: two 16-lane vectors
constexpr int64_t kPrefetchRows = 4;  // how far ahead rows are prefetched

// One quantized weight and how its rows are walked: columns [0, fast_len) by 32-column chunks, the rest
// (and every column, for group sizes chunks do not fit) one at a time by weight_at.
struct Layout {
  const uint8_t* data;
  const float* scales;
  const float* mins;  // nullptr: no mins
  int64_t N, K, group_size, bits, row_bytes, num_groups, fast_len;
  int group_shift;  // the group of column k is k >> group_shift when >= 0, else k / group_size
  bool groups16;    // groups of 16 columns, two to a chunk (see dequant_chunk)
};

Layout make_layout(const at::Tensor& data, const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                   int64_t group_size, int64_t bits, int64_t K) {
  const bool one_group = group_size >= K;
  // A chunk lies in one group, or (groups of 16) its halves do: then one scale vector serves a half-chunk.
  const bool fits = one_group || group_size % kChunk == 0 || group_size == 16;
  int shift = -1;
  if (one_group) shift = 62;  // every column is in group 0
  else if ((group_size & (group_size - 1)) == 0) shift = __builtin_ctzll(group_size);
  return Layout{static_cast<const uint8_t*>(data.data_ptr()), scales.data_ptr<float>(),
                mins.has_value() ? mins->data_ptr<float>() : nullptr, data.size(0), K, group_size, bits,
                data.size(1), scales.size(1), fits ? K / kChunk * kChunk : 0, shift, !one_group && group_size == 16};
}

// The 32 columns from k of one row as two vectors, scales and mins applied: int8 gives columns k..k+15
// and k+16..k+31; int4 (16 bytes) gives the even columns (low nibbles) and the odd ones (high nibbles).
struct Chunk {
  f32x16 lo, hi;
};

JIDO_INLINE f32x16 halves(float first, float second) {
  const i32x16 low_half = {1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0};
  return low_half ? broadcast(first) : broadcast(second);
}

// Groups16: groups of 16 columns, so the chunk spans groups g and g + 1 (both inside the row, as the
// chunk is). For int8 that is one group per vector; for int4 the low 8 lanes of each vector (columns
// k..k+15) are group g and the high 8 lanes group g + 1.
template <int Bits, bool Groups16>
JIDO_INLINE Chunk dequant_chunk(const Layout& l, const uint8_t* row, const float* rs, const float* rm, int64_t k) {
  const int64_t g = l.group_shift >= 0 ? k >> l.group_shift : k / l.group_size;
  f32x16 s0, s1, m0 = {}, m1 = {};
  if (Groups16 && Bits == 8) {
    s0 = broadcast(rs[g]), s1 = broadcast(rs[g + 1]);
    if (rm) m0 = broadcast(rm[g]), m1 = broadcast(rm[g + 1]);
  } else if (Groups16) {
    s0 = s1 = halves(rs[g], rs[g + 1]);
    if (rm) m0 = m1 = halves(rm[g], rm[g + 1]);
  } else {
    s0 = s1 = broadcast(rs[g]);
    if (rm) m0 = m1 = broadcast(rm[g]);
  }
  u8x16 b0, b1;
  if (Bits == 8) {
    std::memcpy(&b0, row + k, sizeof(b0));
    std::memcpy(&b1, row + k + 16, sizeof(b1));
    return Chunk{bytes_to_f32<true>(b0) * s0 + m0, bytes_to_f32<true>(b1) * s1 + m1};
  }
  std::memcpy(&b0, row + k / 2, sizeof(b0));
  return Chunk{bytes_to_f32<false>(b0 & 15) * s0 + m0, bytes_to_f32<false>(b0 >> 4) * s1 + m1};
}

// w[n, k] for one column, the scalar path for the tail of a row and for group sizes chunks do not fit.
inline float weight_at(const Layout& l, int64_t n, int64_t k) {
  const uint8_t* row = l.data + n * l.row_bytes;
  const float q = l.bits == 8 ? static_cast<float>(static_cast<int8_t>(row[k]))
                              : static_cast<float>((row[k / 2] >> (4 * (k & 1))) & 15);
  const int64_t g = n * l.num_groups + k / l.group_size;
  return l.scales[g] * q + (l.mins ? l.mins[g] : 0.f);
}

// The sum of the 16 lanes by halving (a tree: 4 dependent adds where a serial sum takes 15).
// Asks for the bytes, scales and mins of row n ahead of use: one core's hardware prefetcher alone keeps too
// few cache-line reads in flight to stream at the memory's bandwidth.
inline void prefetch_row(const Layout& l, int64_t n) {
  if (n >= l.N) return;
  const char* bytes = reinterpret_cast<const char*>(l.data + n * l.row_bytes);
  for (int64_t i = 0; i < l.row_bytes; i += 64) __builtin_prefetch(bytes + i);
  const int64_t group_bytes = l.num_groups * static_cast<int64_t>(sizeof(float));
  const char* scales = reinterpret_cast<const char*>(l.scales + n * l.num_groups);
  for (int64_t i = 0; i < group_bytes; i += 64) __builtin_prefetch(scales + i);
  if (!l.mins) return;
  const char* mins = reinterpret_cast<const char*>(l.mins + n * l.num_groups);
  for (int64_t i = 0; i < group_bytes; i += 64) __builtin_prefetch(mins + i);
}

inline float lane_sum(f32x16 v) {
  typedef float f32x8 __attribute__((vector_size(32)));
  typedef float f32x4 __attribute__((vector_size(16)));
  const f32x8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                  __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const f32x4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

// out[r] = sum_k x[r, k] w[n, k] for R rows of x (row stride ldx), with C independent accumulators per row
// so that few rows still keep several FMA chains in flight (an FMA's latency is 4 cycles). For int4,
// x's chunks are stored even columns first, then odd ones (see permute_for_int4), matching Chunk.
template <int R, int C, int Bits, bool Groups16>
void row_dot(const Layout& l, int64_t n, const float* x, int64_t ldx, float* out) {
  constexpr int U = C >= 2 ? C / 2 : 1;  // chunks per step
  f32x16 acc[R][C] = {};
  const uint8_t* row = l.data + n * l.row_bytes;
  const float* rs = l.scales + n * l.num_groups;
  const float* rm = l.mins ? l.mins + n * l.num_groups : nullptr;
  int64_t k = 0;
  for (; k + U * kChunk <= l.fast_len; k += U * kChunk) {
#pragma GCC unroll 4
    for (int u = 0; u < U; ++u) {
      const Chunk c = dequant_chunk<Bits, Groups16>(l, row, rs, rm, k + u * kChunk);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        const float* xr = x + r * ldx + k + u * kChunk;
        acc[r][(2 * u) % C] += c.lo * load_f32(xr);
        acc[r][(2 * u + 1) % C] += c.hi * load_f32(xr + 16);
      }
    }
  }
  for (; k < l.fast_len; k += kChunk) {
    const Chunk c = dequant_chunk<Bits, Groups16>(l, row, rs, rm, k);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      acc[r][0] += c.lo * load_f32(x + r * ldx + k);
      acc[r][1 % C] += c.hi * load_f32(x + r * ldx + k + 16);
    }
  }
  for (int r = 0; r < R; ++r) {
    f32x16 total = acc[r][0];
    for (int i = 1; i < C; ++i) total += acc[r][i];
    float sum = lane_sum(total);
    for (int64_t j = l.fast_len; j < l.K; ++j) sum += weight_at(l, n, j) * x[r * ldx + j];
    out[r] = sum;
  }
}

#if defined(__AVX512F__)
constexpr int kMaxRows = 8;  // 8 accumulators of 16 lanes: a quarter of AVX-512's 32 registers
#else
constexpr int kMaxRows = 4;  // AVX2 has 16 registers and a 16-lane vector takes two
#endif

// Output rows [n0, n1) for all M rows of x, in blocks of kMaxRows, 4, 2, 1 rows of x; each block reads
// the weight row again (from L1).
template <int Bits, bool Groups16>
void rows_dot(const Layout& l, int64_t n0, int64_t n1, const float* x, const uint16_t*, int64_t M, float* out) {
  float part[kMaxRows];
  for (int64_t n = n0; n < n1; ++n) {
    prefetch_row(l, n + kPrefetchRows);
    for (int64_t m = 0; m < M;) {
      const int64_t left = M - m;
      const int R = left >= kMaxRows ? kMaxRows : left >= 4 ? 4 : left >= 2 ? 2 : 1;
      const float* xm = x + m * l.K;
      if (R == kMaxRows) row_dot<kMaxRows, 1, Bits, Groups16>(l, n, xm, l.K, part);
      else if (R == 4) row_dot<4, 1, Bits, Groups16>(l, n, xm, l.K, part);
      else if (R == 2) row_dot<2, 2, Bits, Groups16>(l, n, xm, l.K, part);
      else row_dot<1, 4, Bits, Groups16>(l, n, xm, l.K, part);
      for (int r = 0; r < R; ++r) out[(m + r) * l.N + n] = part[r];
      m += R;
    }
  }
}

// Output rows [n0, n1) for M rows of x, given as float32 and (for the bf16 kernel) as bf16 bits.
using RowsFn = void (*)(const Layout&, int64_t, int64_t, const float*, const uint16_t*, int64_t, float*);

RowsFn pick_rows_dot(const Layout& l) {
  if (l.bits == 8) return l.groups16 ? &rows_dot<8, true> : &rows_dot<8, false>;
  return l.groups16 ? &rows_dot<4, true> : &rows_dot<4, false>;
}

#if defined(__AVX512F__)
// The bf16 kernel, for more rows of bf16 x, where the fp32 FMAs above are compute-bound: each chunk is
// dequantized once, rounded to bf16 (as a dense bf16 weight is) and multiplied into up to 16 rows of x
// by vdpbf16ps, 32 products per instruction (twice the FMA's 16). The lanes pair columns in Chunk's
// order, and x is stored in the same order, so sums over all lanes are the dot products. Compiled for
// AVX512_BF16 whatever the build flags; called only where the CPU has it (bf16_dots_supported).
#define JIDO_BF16_TARGET __attribute__((target("avx512bf16")))

// out[nb * R + r] = sum_k x[r, k] w[n + nb, k] for NB weight rows and R rows of x: each x load feeds NB
// dot products, so x (tens of KB at K = 2048) is read from L2 once per NB weight rows, not per row.
template <int NB, int R, int Bits, bool Groups16>
JIDO_BF16_TARGET void rows_block_bf16(const Layout& l, int64_t n, const float* xf, const uint16_t* xb, float* out) {
  __m512 acc[NB][R];
  for (int b = 0; b < NB; ++b)
    for (int r = 0; r < R; ++r) acc[b][r] = _mm512_setzero_ps();
  for (int64_t k = 0; k < l.fast_len; k += kChunk) {
    __m512bh w[NB];
#pragma GCC unroll 4
    for (int b = 0; b < NB; ++b) {
      const int64_t g = (n + b) * l.num_groups;
      const Chunk c = dequant_chunk<Bits, Groups16>(l, l.data + (n + b) * l.row_bytes, l.scales + g,
                                                    l.mins ? l.mins + g : nullptr, k);
      w[b] = _mm512_cvtne2ps_pbh((__m512)c.hi, (__m512)c.lo);
    }
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) {
      const __m512bh xr = (__m512bh)_mm512_loadu_si512(xb + r * l.K + k);
#pragma GCC unroll 4
      for (int b = 0; b < NB; ++b) acc[b][r] = _mm512_dpbf16_ps(acc[b][r], w[b], xr);
    }
  }
  for (int b = 0; b < NB; ++b) {
    for (int r = 0; r < R; ++r) {
      float sum = _mm512_reduce_add_ps(acc[b][r]);
      for (int64_t j = l.fast_len; j < l.K; ++j) sum += weight_at(l, n + b, j) * xf[r * l.K + j];
      out[b * R + r] = sum;
    }
  }
}

// Weight rows in blocks of 4 (the last few of a thread's range one by one), x rows in blocks of 4 or 1 for
// 4 weight rows (16 accumulators) and of 16, 8, 4 or 1 for one.
template <int NB, int Bits, bool Groups16>
JIDO_BF16_TARGET void rows_bf16(const Layout& l, int64_t n, const float* xf, const uint16_t* xb, int64_t M,
                                float* out) {
  float part[NB * 16];
  for (int64_t m = 0; m < M;) {
    const int64_t left = M - m;
    const int R = NB > 1 ? (left >= 4 ? 4 : 1) : (left >= 16 ? 16 : left >= 8 ? 8 : left >= 4 ? 4 : 1);
    const float* xfm = xf + m * l.K;
    const uint16_t* xbm = xb + m * l.K;
    if (R == 16) rows_block_bf16<1, 16, Bits, Groups16>(l, n, xfm, xbm, part);
    else if (R == 8) rows_block_bf16<1, 8, Bits, Groups16>(l, n, xfm, xbm, part);
    else if (R == 4) rows_block_bf16<NB, 4, Bits, Groups16>(l, n, xfm, xbm, part);
    else rows_block_bf16<NB, 1, Bits, Groups16>(l, n, xfm, xbm, part);
    for (int b = 0; b < NB; ++b)
      for (int r = 0; r < R; ++r) out[(m + r) * l.N + n + b] = part[b * R + r];
    m += R;
  }
}

template <int Bits, bool Groups16>
JIDO_BF16_TARGET void rows_dot_bf16(const Layout& l, int64_t n0, int64_t n1, const float* xf, const uint16_t* xb,
                                    int64_t M, float* out) {
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    for (int b = 0; b < 4; ++b) prefetch_row(l, n + kPrefetchRows + b);
    rows_bf16<4, Bits, Groups16>(l, n, xf, xb, M, out);
  }
  for (; n < n1; ++n) rows_bf16<1, Bits, Groups16>(l, n, xf, xb, M, out);
}

bool bf16_dots_supported() { return __builtin_cpu_supports("avx512bf16"); }

RowsFn pick_rows_dot_bf16(const Layout& l) {
  if (l.bits == 8) return l.groups16 ? &rows_dot_bf16<8, true> : &rows_dot_bf16<8, false>;
  return l.groups16 ? &rows_dot_bf16<4, true> : &rows_dot_bf16<4, false>;
}
#else
bool bf16_dots_supported() { return false; }

RowsFn pick_rows_dot_bf16(const Layout&) { return nullptr; }
#endif

// Reorders each full 32-column chunk of every row of x to its even columns, then its odd ones: the order
// in which an int4 chunk's low and high nibbles come out of dequant_i4.
void permute_for_int4(float* x, int64_t M, int64_t K, int64_t fast_len) {
  float tmp[32];
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < fast_len; k += 32) {
      float* c = x + m * K + k;
      for (int j = 0; j < 16; ++j) {
        tmp[j] = c[2 * j];
        tmp[16 + j] = c[2 * j + 1];
      }
      std::memcpy(c, tmp, sizeof(tmp));
    }
  }
}

void check_weight(const at::Tensor& data, const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                  int64_t group_size, int64_t bits, int64_t K) {
  TORCH_CHECK(bits == 8 || bits == 4, "bits must be 8 or 4, got ", bits);
  TORCH_CHECK(data.dim() == 2 && data.is_contiguous() && data.scalar_type() == (bits == 8 ? at::kChar : at::kByte),
              "data must be a contiguous 2-D ", bits == 8 ? "int8" : "uint8", " tensor");
  TORCH_CHECK(data.size(1) == (bits == 8 ? K : (K + 1) / 2), "data has ", data.size(1), " columns for K = ", K);
  const int64_t num_groups = (K + group_size - 1) / group_size;
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kFloat && scales.dim() == 2 &&
                  scales.size(0) == data.size(0) && scales.size(1) == num_groups,
              "scales must be contiguous float32 [N, ceil(K / group_size)]");
  TORCH_CHECK(!mins.has_value() || (mins->is_contiguous() && mins->sizes() == scales.sizes() &&
                                    mins->scalar_type() == at::kFloat),
              "mins must be contiguous float32 shaped like scales");
}

// y = x w^T (+ bias) in x's dtype, by the fp32 kernel, or with bf16_dots (bf16 x, a CPU with AVX512_BF16)
// by the bf16 one.
at::Tensor quant_linear(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scales,
                        const c10::optional<at::Tensor>& mins, int64_t group_size, int64_t bits, int64_t K,
                        const c10::optional<at::Tensor>& bias, bool bf16_dots) {
  check_weight(data, scales, mins, group_size, bits, K);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "]");
  TORCH_CHECK(!bf16_dots || (x.scalar_type() == at::kBFloat16 && bf16_dots_supported()),
              "bf16_dots needs bfloat16 x and a CPU with AVX512_BF16 (see bf16_dots_supported)");
  const Layout l = make_layout(data, scales, mins, group_size, bits, K);
  at::Tensor xf = x.to(at::kFloat).contiguous().clone();  // [M, K], a copy the int4 reorder may write
  const int64_t M = xf.size(0);
  if (bits == 4) permute_for_int4(xf.data_ptr<float>(), M, K, l.fast_len);
  // the same values as x (bf16 to float and back is exact), in the reordered columns
  const at::Tensor xb = bf16_dots ? xf.to(at::kBFloat16) : at::Tensor();
  const uint16_t* xbp = bf16_dots ? reinterpret_cast<const uint16_t*>(xb.data_ptr()) : nullptr;
  at::Tensor out = at::empty({M, l.N}, xf.options());
  const float* xp = xf.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const RowsFn rows = bf16_dots ? pick_rows_dot_bf16(l) : pick_rows_dot(l);
  at::parallel_for(0, l.N, 16, [&](int64_t n0, int64_t n1) { rows(l, n0, n1, xp, xbp, M, op); });
  if (bias.has_value()) out.add_(bias->to(at::kFloat));
  return out.to(x.scalar_type());
}

inline void store(f32x16 v, float* dst) { std::memcpy(dst, &v, sizeof(v)); }
// Rounded to the nearest bf16, ties to even (torch's .to(torch.bfloat16) for finite values).
inline void store(f32x16 v, at::BFloat16* dst) {
  const u16x16 b = jido_bf16::round_bits16(v);
  std::memcpy(dst, &b, sizeof(b));
}

template <int Bits, bool Groups16, typename T>
void dequantize_row(const Layout& l, int64_t n, T* out) {
  const uint8_t* row = l.data + n * l.row_bytes;
  const float* rs = l.scales + n * l.num_groups;
  const float* rm = l.mins ? l.mins + n * l.num_groups : nullptr;
  for (int64_t k = 0; k < l.fast_len; k += kChunk) {
    const Chunk c = dequant_chunk<Bits, Groups16>(l, row, rs, rm, k);
    if (Bits == 8) {
      store(c.lo, out + k);
      store(c.hi, out + k + 16);
    } else {  // interleave the even and odd columns back into column order
      store(__builtin_shufflevector(c.lo, c.hi, 0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23), out + k);
      store(__builtin_shufflevector(c.lo, c.hi, 8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31),
            out + k + 16);
    }
  }
  for (int64_t k = l.fast_len; k < l.K; ++k) out[k] = static_cast<T>(weight_at(l, n, k));
}

template <typename T>
void dequantize_rows(const Layout& l, T* out) {
  at::parallel_for(0, l.N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      T* dst = out + n * l.K;
      if (l.bits == 8) l.groups16 ? dequantize_row<8, true>(l, n, dst) : dequantize_row<8, false>(l, n, dst);
      else l.groups16 ? dequantize_row<4, true>(l, n, dst) : dequantize_row<4, false>(l, n, dst);
    }
  });
}

at::Tensor quant_dequantize(const at::Tensor& data, const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                            int64_t group_size, int64_t bits, int64_t K, at::ScalarType dtype) {
  check_weight(data, scales, mins, group_size, bits, K);
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "dequantize writes float32 or bfloat16");
  const Layout l = make_layout(data, scales, mins, group_size, bits, K);
  at::Tensor out = at::empty({l.N, K}, scales.options().dtype(dtype));
  if (dtype == at::kFloat) dequantize_rows(l, out.data_ptr<float>());
  else dequantize_rows(l, out.data_ptr<at::BFloat16>());
  return out;
}

}  // namespace

TORCH_LIBRARY(jido_quant, m) {
  m.def("linear(Tensor x, Tensor data, Tensor scales, Tensor? mins, int group_size, int bits, int K, Tensor? bias, "
        "bool bf16_dots=False) -> Tensor");
  m.def("bf16_dots_supported() -> bool", &bf16_dots_supported);
  m.def("dequantize(Tensor data, Tensor scales, Tensor? mins, int group_size, int bits, int K, ScalarType dtype) "
        "-> Tensor");
}

TORCH_LIBRARY_IMPL(jido_quant, CPU, m) {
  m.impl("linear", &quant_linear);
  m.impl("dequantize", &quant_dequantize);
}
