// Weight-quantized linear layers by integer dot products on CPU, as llama.cpp computes them:
//   y[m, n] = sum_b dx[m, b] * sum_{k in b} s[n, g(k)] * q[n, k] * xq[m, k]  +  sum_g mins[n, g] * xsum[m, g]
// The weight is a QuantizedWeight (quant_kernels.py: int8 codes, or int4 two to a byte, with float32 scales
// and optional mins per group of 16, of a multiple of 32, or of a whole row). x is quantized here, per row
// and block b of 32 columns: dx = max |x| / 127, xq = round(x / dx) in -127..127; xsum is the float sum of x
// over each weight group (the mins' term stays exact). Only the int8 / int4 bytes of w are read, and 32
// products take 3-5 instructions (bytes widened to floats took ~12), so batch-1 decode streams w at the
// memory's bandwidth.
//
// A 32-column block: int8 codes as |q| (unsigned) against xq with q's signs (_mm256_sign_epi8; |q| <= 128 and
// |xq| <= 127, so maddubs' pair sums of at most 32512 never saturate); int4 codes, 0..15, as they are, the low
// nibbles (even columns) in the low 16 bytes and the high nibbles (odd columns) in the high 16, against xq
// stored in that order. Then four products per int32 lane: maddubs + madd (AVX2) or one vpdpbusd
// (AVX-512 VNNI), converted to float and scaled by dx * s per lane.
//
// One source, two kernels: the part below `#else` is compiled twice (this file includes itself), once for
// AVX2 and once under `#pragma GCC target` for AVX-512 VNNI, each in its own namespace; every build of an
// x86 CPU holds both and `isa` picks one at run time (checked against the CPU here, chosen in int8_dot.py).
#ifndef JIDO_INT8_DOT_PASS
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#define JIDO_INLINE __attribute__((always_inline)) inline

namespace jido_int8_dot {

constexpr int64_t kBlock = 32;  // columns per block of x (one scale each)
constexpr int64_t kPrefetchRows = 4;  // how far ahead weight rows are prefetched

// x quantized: xq [M, nb * 32] (zero-padded past K; for int4 weights each block's even columns first),
// dx [M, nb] and, for weights with mins, xsum [M, num_groups].
struct QuantizedX {
  const int8_t* q;
  const float* d;
  const float* sums;
  int64_t M, nb, num_groups;
};

struct Weight {
  const uint8_t* data;
  const float* scales;
  const float* mins;  // nullptr: no mins
  int64_t N, K, group_size, bits, row_bytes, num_groups, nb;
  bool groups16;  // else each group holds whole blocks: group_size a multiple of 32, or one group per row
};

inline void prefetch_row(const Weight& w, int64_t n) {
  if (n >= w.N) return;
  const char* bytes = reinterpret_cast<const char*>(w.data + n * w.row_bytes);
  for (int64_t i = 0; i < w.row_bytes; i += 64) __builtin_prefetch(bytes + i);
  const char* scales = reinterpret_cast<const char*>(w.scales + n * w.num_groups);
  for (int64_t i = 0; i < w.num_groups * 4; i += 64) __builtin_prefetch(scales + i);
}

using RowsFn = void (*)(const Weight&, const QuantizedX&, int64_t, int64_t, float*);

#if defined(__AVX2__)
#define JIDO_INT8_DOT_PASS 1
namespace avx2 {
JIDO_INLINE __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
#include __FILE__
}  // namespace avx2

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")
namespace vnni {
JIDO_INLINE __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
#include __FILE__
}  // namespace vnni
#pragma GCC pop_options

// The ISAs `isa` names, in int8_dot.py's order.
enum Isa : int64_t { kAvx2 = 0, kAvx512Vnni = 1 };

bool isa_supported(int64_t isa) {
  if (isa == kAvx2) return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (isa == kAvx512Vnni) return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
  return false;
}

RowsFn pick_rows(const Weight& w, int64_t isa) {
  const bool vnni_isa = isa == kAvx512Vnni;
  if (w.bits == 8) {
    if (w.groups16) return vnni_isa ? &vnni::rows_dot<8, true> : &avx2::rows_dot<8, true>;
    return vnni_isa ? &vnni::rows_dot<8, false> : &avx2::rows_dot<8, false>;
  }
  if (w.groups16) return vnni_isa ? &vnni::rows_dot<4, true> : &avx2::rows_dot<4, true>;
  return vnni_isa ? &vnni::rows_dot<4, false> : &avx2::rows_dot<4, false>;
}

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// One row's block of 32 floats (zeros past `len`) -> its scale and 32 codes in column order.
inline float quantize_block(const float* src, int64_t len, int8_t* dst) {
  alignas(32) float v[kBlock] = {};
  std::memcpy(v, src, len * sizeof(float));
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 vals[4], amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) {
    vals[i] = _mm256_load_ps(v + 8 * i);
    amax = _mm256_max_ps(amax, _mm256_and_ps(vals[i], abs_mask));
  }
  const float d = hmax(amax) / 127.f;
  const __m256 id = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(vals[i], id));  // rounds to nearest even
  // packs interleave 128-bit lanes: the permute puts the 32 bytes back in column order
  const __m256i q16 = _mm256_packs_epi32(q[0], q[1]), q16b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, q16b),
                                                 _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), q8);
  return d;
}

// The even columns of a 32-byte block, then the odd ones: the order of an int4 block's low and high nibbles.
inline void split_even_odd(int8_t* block) {
  int8_t tmp[kBlock];
  for (int j = 0; j < 16; ++j) {
    tmp[j] = block[2 * j];
    tmp[16 + j] = block[2 * j + 1];
  }
  std::memcpy(block, tmp, sizeof(tmp));
}
#endif  // __AVX2__

void check_weight(const at::Tensor& data, const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                  int64_t group_size, int64_t bits, int64_t K) {
  TORCH_CHECK(bits == 8 || bits == 4, "bits must be 8 or 4, got ", bits);
  TORCH_CHECK(data.dim() == 2 && data.is_contiguous() && data.scalar_type() == (bits == 8 ? at::kChar : at::kByte),
              "data must be a contiguous 2-D ", bits == 8 ? "int8" : "uint8", " tensor");
  TORCH_CHECK(data.size(1) == (bits == 8 ? K : (K + 1) / 2), "data has ", data.size(1), " columns for K = ", K);
  TORCH_CHECK(group_size == 16 || group_size % kBlock == 0 || group_size >= K,
              "int8 dot products need groups of 16, of a multiple of 32 or of a whole row; got ", group_size);
  const int64_t num_groups = (K + group_size - 1) / group_size;
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kFloat && scales.dim() == 2 &&
                  scales.size(0) == data.size(0) && scales.size(1) == num_groups,
              "scales must be contiguous float32 [N, ceil(K / group_size)]");
  TORCH_CHECK(!mins.has_value() || (mins->is_contiguous() && mins->sizes() == scales.sizes() &&
                                    mins->scalar_type() == at::kFloat),
              "mins must be contiguous float32 shaped like scales");
}

// y = x w^T (+ bias) in x's dtype, x quantized to int8 per block of 32 (see the top of this file).
at::Tensor int8_dot_linear(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scales,
                           const c10::optional<at::Tensor>& mins, int64_t group_size, int64_t bits, int64_t K,
                           const c10::optional<at::Tensor>& bias, int64_t isa) {
#if defined(__AVX2__)
  check_weight(data, scales, mins, group_size, bits, K);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "]");
  TORCH_CHECK(isa_supported(isa), "this CPU does not run the int8 dot kernel for isa ", isa);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const int64_t M = xf.size(0), nb = (K + kBlock - 1) / kBlock, num_groups = scales.size(1);
  const bool with_mins = mins.has_value();
  std::vector<int8_t> xq(M * nb * kBlock);
  std::vector<float> dx(M * nb), xsum(with_mins ? M * num_groups : 0, 0.f);
  const float* xp = xf.data_ptr<float>();
  for (int64_t m = 0; m < M; ++m) {
    const float* row = xp + m * K;
    for (int64_t b = 0; b < nb; ++b) {
      int8_t* block = xq.data() + (m * nb + b) * kBlock;
      dx[m * nb + b] = quantize_block(row + b * kBlock, std::min(kBlock, K - b * kBlock), block);
      if (bits == 4) split_even_odd(block);
    }
    for (int64_t k = 0; with_mins && k < K; ++k) xsum[m * num_groups + k / group_size] += row[k];
  }
  const Weight w{static_cast<const uint8_t*>(data.data_ptr()), scales.data_ptr<float>(),
                 with_mins ? mins->data_ptr<float>() : nullptr, data.size(0), K, group_size, bits, data.size(1),
                 num_groups, nb, group_size == 16 && K > 16};
  const QuantizedX qx{xq.data(), dx.data(), with_mins ? xsum.data() : nullptr, M, nb, num_groups};
  at::Tensor out = at::empty({M, w.N}, xf.options());
  float* op = out.data_ptr<float>();
  const RowsFn rows = pick_rows(w, isa);
  at::parallel_for(0, w.N, 16, [&](int64_t n0, int64_t n1) { rows(w, qx, n0, n1, op); });
  if (bias.has_value()) out.add_(bias->to(at::kFloat));
  return out.to(x.scalar_type());
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

bool int8_dot_supported(int64_t isa) {
#if defined(__AVX2__)
  return isa_supported(isa);
#else
  return false;
#endif
}

}  // namespace jido_int8_dot

TORCH_LIBRARY(jido_int8_dot, m) {
  m.def("linear(Tensor x, Tensor data, Tensor scales, Tensor? mins, int group_size, int bits, int K, Tensor? bias, "
        "int isa) -> Tensor");
  m.def("supported(int isa) -> bool", &jido_int8_dot::int8_dot_supported);
}

TORCH_LIBRARY_IMPL(jido_int8_dot, CPU, m) { m.impl("linear", &jido_int8_dot::int8_dot_linear); }

#else  // JIDO_INT8_DOT_PASS: the kernels, compiled once per ISA inside its namespace (see the top of the file)

// The 32 codes of one block as bytes: int8 as stored; int4 as the low nibbles, then the high nibbles.
template <int Bits>
JIDO_INLINE __m256i load_codes(const uint8_t* p) {
  if (Bits == 8) return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m128i nibble = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), nibble), _mm_and_si128(b, nibble));
}

// Groups of 16: the two groups' scales in the order of the block's int32 lanes (each sums 4 columns). int8:
// lanes 0-3 are columns 0-15. int4: lanes 0-1 even columns 0-14, 2-3 even 16-30, 4-5 odd 1-15, 6-7 odd 17-31.
template <int Bits>
JIDO_INLINE __m256 pair_scales(const float* s) {
  const __m256 two = _mm256_castps128_ps256(_mm_castpd_ps(_mm_load_sd(reinterpret_cast<const double*>(s))));
  const __m256i order = Bits == 8 ? _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1) : _mm256_setr_epi32(0, 0, 1, 1, 0, 0, 1, 1);
  return _mm256_permutevar8x32_ps(two, order);
}

JIDO_INLINE float lane_sum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
}

// acc[r] += (block b of row `codes`) . (block b of x row m0 + r), scaled per lane by dx * ws.
template <int R, int Bits>
JIDO_INLINE void block_dot(const uint8_t* codes, int64_t b, __m256 ws, const QuantizedX& x, int64_t m0,
                           __m256* acc) {
  const __m256i q = load_codes<Bits>(codes);
  const __m256i mag = Bits == 8 ? _mm256_sign_epi8(q, q) : q;
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r) {
    const int64_t i = (m0 + r) * x.nb + b;
    __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + i * kBlock));
    if (Bits == 8) xv = _mm256_sign_epi8(xv, q);
    const __m256 p = _mm256_cvtepi32_ps(dot_u8s8(mag, xv));
    acc[r] = _mm256_fmadd_ps(p, _mm256_mul_ps(ws, _mm256_broadcast_ss(x.d + i)), acc[r]);
  }
}

// out[r] = row n of w . row m0 + r of x, for R rows of x.
template <int R, int Bits, bool Groups16>
JIDO_INLINE void row_dot(const Weight& w, int64_t n, const QuantizedX& x, int64_t m0, float* out) {
  constexpr int64_t kBlockBytes = Bits == 8 ? kBlock : kBlock / 2;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const uint8_t* row = w.data + n * w.row_bytes;
  const float* rs = w.scales + n * w.num_groups;
  const int64_t full = w.K / kBlock;  // blocks read in place; a partial last one goes through a padded copy
  if (Groups16) {
    for (int64_t b = 0; b < full; ++b) block_dot<R, Bits>(row + b * kBlockBytes, b, pair_scales<Bits>(rs + 2 * b), x, m0, acc);
  } else {
    const int64_t per_group = w.group_size >= w.K ? full : w.group_size / kBlock;
    for (int64_t b = 0, g = 0; b < full; ++g) {
      const __m256 ws = _mm256_broadcast_ss(rs + g);
      for (const int64_t end = std::min(full, b + per_group); b < end; ++b)
        block_dot<R, Bits>(row + b * kBlockBytes, b, ws, x, m0, acc);
    }
  }
  if (full < w.nb) {
    alignas(32) uint8_t tail[kBlock] = {};
    std::memcpy(tail, row + full * kBlockBytes, w.row_bytes - full * kBlockBytes);
    // a partial block lies in one group of any size but 16; with 16, in groups 2 * full and maybe 2 * full + 1
    __m256 ws;
    if (Groups16) {
      const float pair[2] = {rs[2 * full], 2 * full + 1 < w.num_groups ? rs[2 * full + 1] : 0.f};
      ws = pair_scales<Bits>(pair);
    } else {
      ws = _mm256_broadcast_ss(rs + w.num_groups - 1);
    }
    block_dot<R, Bits>(tail, full, ws, x, m0, acc);
  }
  for (int r = 0; r < R; ++r) {
    float sum = lane_sum(acc[r]);
    if (w.mins) {
      const float* rm = w.mins + n * w.num_groups;
      const float* xs = x.sums + (m0 + r) * x.num_groups;
      for (int64_t g = 0; g < w.num_groups; ++g) sum += rm[g] * xs[g];
    }
    out[r] = sum;
  }
}

// Output columns [n0, n1) of out [M, N], x's rows in blocks of 4, 2 and 1 for each weight row (read from L1
// again after the first block).
template <int Bits, bool Groups16>
void rows_dot(const Weight& w, const QuantizedX& x, int64_t n0, int64_t n1, float* out) {
  float part[4];
  for (int64_t n = n0; n < n1; ++n) {
    prefetch_row(w, n + kPrefetchRows);
    for (int64_t m = 0; m < x.M;) {
      const int64_t left = x.M - m;
      const int R = left >= 4 ? 4 : left >= 2 ? 2 : 1;
      if (R == 4) row_dot<4, Bits, Groups16>(w, n, x, m, part);
      else if (R == 2) row_dot<2, Bits, Groups16>(w, n, x, m, part);
      else row_dot<1, Bits, Groups16>(w, n, x, m, part);
      for (int r = 0; r < R; ++r) out[(m + r) * w.N + n] = part[r];
      m += R;
    }
  }
}

#endif  // JIDO_INT8_DOT_PASS
