// Weight-quantized linear layers by integer dot products on CPU, as llama.cpp computes them:
//   y[m, n] = sum_c dx[m, c] * s[n, c] * sum_{k in c} q[n, k] * xq[m, k]  +  sum_g mins[n, g] * xsum[m, g]
// The weight is a QuantizedWeight (quant_kernels.py: int8 codes, or int4 two to a byte, with float32 scales
// and optional mins per group of 16, of a multiple of 32, or of a whole row). x is rounded here, per row:
// in blocks of 32 columns (x_block 32: dx = max |x| / 127 over the block, llama.cpp's Q8_0 activations) or
// once per row (x_block 0: per token, vLLM's w8a8), xq = round(x / dx) in -127..127; xsum[m, g] is the sum
// of the ROUNDED x over weight group g (dx * sum xq), so the mins' term sees the same x as the codes do and
// every row is rounded alike whatever else is in the step (batched equals unbatched up to float sums).
//
// Two kernels share that rounding:
// - rows (decode, a few rows of x): the weight streams once in its own layout; 32 codes per vector against a
//   block of x, four products per int32 lane (maddubs + madd, or one VNNI vpdpbusd), scaled per block.
// - panels (prefill, many rows): 8 weight rows at a time are repacked into a scratch panel whose vectors
//   hold 4 columns of 8 rows, so one x broadcast meets 8 outputs and the panel, in L1, serves every row of x.
//   A panel whose codes span at most 127 values is stored unsigned (q - min; the min goes into the mins'
//   term), and maddubs' int16 pair sums then add up for several column quads before one madd widens them:
//   up to 8 quads for 4-bit codes. Wider codes multiply by sign: |q| against xq with q's signs; under VNNI instead
//   xq + 128 against the codes as stored, less 128 times their sums, two panels to a 512-bit vector, which drops
//   the sign instructions (benchmarks/results/kernel_threads-2026-12-02-amx-xeon.md); a panel left unpaired
//   keeps the sign path. A step of up to 8 rows (a speculative verify step's K + 1) meets each panel once with
//   all its rows. With AMX-INT8, prepacked panels of 16 rows run on the tile units instead (see AMX panels in
//   int8_dot_common.h), with the same outputs.
//
// int8 codes as |q| (unsigned) against xq with q's signs (_mm256_sign_epi8; |q| <= 128 and |xq| <= 127, so
// maddubs' pair sums of at most 32512 never saturate); int4 codes (0..15) in the rows kernel as they are, the
// low nibbles (even columns) in the low 16 bytes and the high nibbles (odd columns) in the high 16, against
// xq stored in that order.
//
// One body, two ISAs: the vector kernels (int8_dot_kernels.h) are compiled by one unit per ISA, each in its own
// namespace: int8_dot_avx2.cpp with the build's flags, int8_dot_vnni.cpp under `#pragma GCC target` for AVX-512
// VNNI; int8_dot_amx.cpp holds the AMX tile kernels. Each unit fills a table of its kernels (Kernels,
// int8_dot_common.h); this file fills the tables of the ISAs this CPU runs once (cpu_runs, the one place that asks
// the CPU), and each op takes its kernels from the table its `isa` names (int8_dot.py reads the same answer: isas).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <array>
#include <mutex>

#include "bf16_bits.h"
#include "gated_activation.h"
#include "int8_dot_common.h"
#include "tile_state.h"

namespace jido_int8_dot {

// Whether this CPU runs `isa` (an Isa): the one place that asks the CPU, once. AMX also needs Linux to let this
// process use the tile state, asked here too (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; oneDNN asks the same). A
// build without AVX2 runs none.
bool cpu_runs(int64_t isa) {
#if defined(__AVX2__)
  static const std::array<bool, kNumIsas> runs = [] {
    std::array<bool, kNumIsas> r{};
    r[kAvx2] = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
    r[kAvx512Vnni] = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vl");
    r[kAvx512Bf16] = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                     __builtin_cpu_supports("avx512vl");
    r[kAmx] = __builtin_cpu_supports("amx-int8") && __builtin_cpu_supports("amx-tile") &&
              __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
              __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512bf16") &&
              jido_tiles::state_granted();
    return r;
  }();
  return isa >= 0 && isa < kNumIsas && runs[isa];
#else
  return false;
#endif
}

// The names of the ISAs this CPU runs (int8_dot.py's ISAS names the first two, the vector kernels' `isa`).
std::vector<std::string> cpu_isas() {
  static constexpr const char* kNames[kNumIsas] = {"avx2", "avx512_vnni", "amx", "avx512_bf16"};
  std::vector<std::string> names;
  for (int64_t isa = 0; isa < kNumIsas; ++isa)
    if (cpu_runs(isa)) names.emplace_back(kNames[isa]);
  return names;
}

// Each ISA's kernels, filled once (at first use) for the ISAs cpu_runs says this CPU runs; the others stay empty.
const Kernels& kernels(int64_t isa) {
  static const std::array<Kernels, kNumIsas> table = [] {
    std::array<Kernels, kNumIsas> t{};
#if defined(__AVX2__)
    if (cpu_runs(kAvx2)) fill_avx2(&t[kAvx2]);
    if (cpu_runs(kAvx512Vnni)) fill_vnni(&t[kAvx512Vnni]);
    if (cpu_runs(kAmx)) fill_amx(&t[kAmx]);
#endif
    return t;
  }();
  return table[isa];
}

// The vector kernels of `isa` (an int8_dot.py ISAS index), which this CPU must run.
const Kernels& vector_kernels(int64_t isa) {
  TORCH_CHECK((isa == kAvx2 || isa == kAvx512Vnni) && cpu_runs(isa),
              "this CPU does not run the int8 dot kernel for isa ", isa);
  return kernels(isa);
}

// The AMX kernels, where this CPU (and process) runs them.
const Kernels& amx_kernels() {
  TORCH_CHECK(cpu_runs(kAmx), "this CPU (or this process) cannot use AMX-INT8 tiles");
  return kernels(kAmx);
}

#if defined(__AVX2__)
RowsFn pick_rows(const Kernels& k, const Weight& w) { return k.rows[w.bits == 4][w.groups16]; }

// The panel kernel for codes of `span` values (max - min; see span_class).
PanelFn pick_panel(const Kernels& k, int span) { return k.panel[span_class(span)]; }

inline float hmax(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
}

// max |x| over 32 floats.
inline float abs_max32(const float* v) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  __m256 amax = _mm256_setzero_ps();
  for (int i = 0; i < 4; ++i) amax = _mm256_max_ps(amax, _mm256_and_ps(_mm256_loadu_ps(v + 8 * i), abs_mask));
  return hmax(amax);
}

// max |x| over a row's block of 32 floats (zeros past `len`), copied into `v`.
inline float block_amax(const float* src, int64_t len, float* v) {
  std::memset(v, 0, kBlock * sizeof(float));
  std::memcpy(v, src, len * sizeof(float));
  return abs_max32(v);
}

// A row's block of 32 floats: in place when whole, else copied into `v` with zeros past `len`; and its max |x|.
inline const float* block_values(const float* src, int64_t len, float* v, float* amax) {
  if (len < kBlock) {
    *amax = block_amax(src, len, v);
    return v;
  }
  *amax = abs_max32(src);
  return src;
}

// The sums of a block's 32 codes over its first and its second 16 (exact: one maddubs of ones, one madd).
inline void half_sums(const int8_t* block, int32_t* first, int32_t* second) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block));
  const __m256i s = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(1), q), _mm256_set1_epi16(1));
  alignas(32) int32_t lanes[8];  // lanes 0-3: codes 0-15, lanes 4-7: codes 16-31
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  *first = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  *second = lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

// 32 floats -> 32 codes round(v / d) in column order (d = 0: all zero).
inline void round_block(const float* v, float d, int8_t* dst) {
  const __m256 id = _mm256_set1_ps(d != 0.f ? 1.f / d : 0.f);
  __m256i q[4];
  for (int i = 0; i < 4; ++i) q[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + 8 * i), id));  // to even
  // packs interleave 128-bit lanes: the permute puts the 32 bytes back in column order
  const __m256i q16 = _mm256_packs_epi32(q[0], q[1]), q16b = _mm256_packs_epi32(q[2], q[3]);
  const __m256i q8 = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(q16, q16b),
                                                 _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst), q8);
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

// x rounded (see the top of this file), with the storage the pointers of QuantizedX point into. The codes are a
// tensor for the 64-byte alignment of torch's allocator: the AMX tile loads read their rows (rows of 32 codes across
// two cache lines are measurably slower).
struct RoundedX {
  at::Tensor q;  // int8 [M * nb * 32]
  std::vector<float> d, sums;
  QuantizedX view;
  std::vector<uint8_t> qu, qu8;
  std::vector<int8_t> q8;
};

// x: contiguous float32, or bf16 (widened a row at a time here: the same floats, without a float copy of x).
RoundedX round_x(const at::Tensor& xf, int64_t group_size, bool per_token, bool even_odd, bool offset_copy = false) {
  const int64_t M = xf.size(0), K = xf.size(1), nb = (K + kBlock - 1) / kBlock;
  const int64_t num_groups = (K + group_size - 1) / group_size;
  RoundedX r{at::empty({M * nb * kBlock}, at::TensorOptions().dtype(at::kChar)), std::vector<float>(M * nb),
             std::vector<float>(M * num_groups, 0.f), {}, {}};
  int8_t* q = r.q.data_ptr<int8_t>();
  const bool bf16 = xf.scalar_type() == at::kBFloat16;
  const float* xp = bf16 ? nullptr : xf.data_ptr<float>();
  const uint16_t* xb = bf16 ? reinterpret_cast<const uint16_t*>(xf.data_ptr<at::BFloat16>()) : nullptr;
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    alignas(32) float v[kBlock];
    std::vector<float> widened(bf16 ? K : 0);
    for (int64_t m = m0; m < m1; ++m) {
      if (bf16)
        for (int64_t k = 0; k < K; ++k) {
          const uint32_t bits = static_cast<uint32_t>(xb[m * K + k]) << 16;
          std::memcpy(&widened[k], &bits, sizeof(bits));
        }
      const float* row = bf16 ? widened.data() : xp + m * K;
      float row_max = 0.f;
      for (int64_t b = 0; per_token && b < nb; ++b)
        row_max = std::max(row_max, block_amax(row + b * kBlock, std::min(kBlock, K - b * kBlock), v));
      float* sums = r.sums.data() + m * num_groups;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t len = std::min(kBlock, K - b * kBlock);
        float amax = 0.f;
        const float* values = block_values(row + b * kBlock, len, v, &amax);
        const float d = (per_token ? row_max : amax) / 127.f;
        int8_t* block = q + (m * nb + b) * kBlock;
        round_block(values, d, block);
        r.d[m * nb + b] = d;
        // a block lies in one group, or (groups of 16) in two; its codes past `len` are zero
        int32_t first = 0, second = 0;
        half_sums(block, &first, &second);
        if (group_size != 16 || K <= 16) {
          sums[b * kBlock / group_size] += d * static_cast<float>(first + second);
        } else {
          sums[2 * b] += d * static_cast<float>(first);
          if (len > 16) sums[2 * b + 1] += d * static_cast<float>(second);
        }
        if (even_odd) split_even_odd(block);
      }
    }
  });
  r.view = QuantizedX{q, r.d.data(), r.sums.data(), M, nb, num_groups};
  if (offset_copy) {
    r.qu.resize(M * nb * kBlock);
    for (size_t i = 0; i < r.qu.size(); ++i) r.qu[i] = static_cast<uint8_t>(q[i]) ^ 0x80;
    r.view.qu = r.qu.data();
    if (M >= 8) {
      const int64_t quads = nb * kBlock / 4, groups = M / 8;
      r.qu8.resize(groups * quads * 32);
      r.q8.resize(groups * quads * 32);
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t row = 0; row < 8; ++row)
          for (int64_t j = 0; j < quads; ++j) {
            const int64_t to = (g * quads + j) * 32 + row * 4, from = (g * 8 + row) * nb * kBlock + 4 * j;
            std::memcpy(&r.qu8[to], &r.qu[from], 4);
            std::memcpy(&r.q8[to], &q[from], 4);
          }
      r.view.qu8 = r.qu8.data();
      r.view.q8 = r.q8.data();
    }
  }
  return r;
}

// Row n of w as one byte per code, zero past K ([kpad]).
inline void row_codes(const Weight& w, int64_t n, uint8_t* dst) {
  const int64_t kpad = w.nb * kBlock;
  std::memset(dst + w.K, 0, kpad - w.K);
  const uint8_t* src = w.data + n * w.row_bytes;
  if (w.bits == 8) {
    std::memcpy(dst, src, w.K);
    return;
  }
  const __m128i nibble = _mm_set1_epi8(0x0F);
  int64_t i = 0;
  for (; 2 * i + 32 <= w.K; i += 16) {  // 16 bytes -> 32 codes, the low nibble of each byte first
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i lo = _mm_and_si128(b, nibble), hi = _mm_and_si128(_mm_srli_epi16(b, 4), nibble);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i), _mm_unpacklo_epi8(lo, hi));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + 2 * i + 16), _mm_unpackhi_epi8(lo, hi));
  }
  for (int64_t k = 2 * i; k < w.K; ++k) dst[k] = (src[k / 2] >> (4 * (k & 1))) & 15;
}

// The lowest and highest code of a row of K codes (int8 codes as signed bytes).
inline void code_range(const uint8_t* codes, int64_t K, bool is_signed, int* lo, int* hi) {
  __m256i vmin = _mm256_set1_epi8(127), vmax = _mm256_set1_epi8(-128);
  int64_t k = 0;
  for (; k + 32 <= K; k += 32) {  // int4 codes (0..15) compare the same as signed bytes
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + k));
    vmin = _mm256_min_epi8(vmin, v), vmax = _mm256_max_epi8(vmax, v);
  }
  alignas(32) int8_t mins[32], maxs[32];
  _mm256_store_si256(reinterpret_cast<__m256i*>(mins), vmin);
  _mm256_store_si256(reinterpret_cast<__m256i*>(maxs), vmax);
  for (int i = 0; i < 32; ++i) *lo = std::min<int>(*lo, mins[i]), *hi = std::max<int>(*hi, maxs[i]);
  for (; k < K; ++k) {
    const int c = is_signed ? static_cast<int8_t>(codes[k]) : codes[k];
    *lo = std::min(*lo, c), *hi = std::max(*hi, c);
  }
}

// 8 rows of 8 int32 (column quads) -> 8 vectors of one quad of each row: an 8x8 transpose.
inline void transpose_quads(const __m256i* r, uint8_t* dst) {
  __m256i t[8], u[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 0-3, then 4-7
    u[4 * h] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);
  }
  for (int j = 0; j < 4; ++j) {  // quads j and j + 4 of the 8 are the 128-bit halves
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * j), _mm256_permute2x128_si256(u[j], u[j + 4], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + 32 * (j + 4)), _mm256_permute2x128_si256(u[j], u[j + 4], 0x31));
  }
}

// Rows [n0, n0 + 8) of w (rows past N as zeros) as a panel (see Panel) in `codes`, `scales`, `mins`, and its span
// of codes (pick_panel's kernel runs it). `rows` is scratch of 8 * kpad bytes.
void pack_panel(const Weight& w, int64_t n0, int64_t chunk, int64_t num_chunks, uint8_t* rows, uint8_t* codes,
                float* scales, float* mins, bool* with_mins, int* span) {
  const int64_t kpad = w.nb * kBlock;
  int lo = 255, hi = -255;
  for (int64_t i = 0; i < kPanel; ++i) {
    uint8_t* row = rows + i * kpad;
    if (n0 + i < w.N) {
      row_codes(w, n0 + i, row);
      code_range(row, w.K, w.bits == 8, &lo, &hi);
    } else {
      std::memset(row, 0, kpad);
    }
  }
  *span = hi - lo;
  const int shift = *span <= kMaxUnsignedSpan ? lo : 0;
  if (shift != 0) {  // stored as q - shift (what lies past K does not matter: x is 0 there)
    const __m256i sv = _mm256_set1_epi8(static_cast<char>(shift));
    for (int64_t k = 0; k < kPanel * kpad; k += 32) {
      __m256i* v = reinterpret_cast<__m256i*>(rows + k);
      _mm256_storeu_si256(v, _mm256_sub_epi8(_mm256_loadu_si256(v), sv));
    }
  }
  for (int64_t k = 0; k < kpad; k += 32) {
    __m256i r[kPanel];
    for (int64_t i = 0; i < kPanel; ++i) r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(rows + i * kpad + k));
    transpose_quads(r, codes + k * kPanel);
  }
  *with_mins = w.mins != nullptr || shift != 0;
  thread_local std::vector<float> widened;  // a row's scales and mins where they are not float32 (GroupValues::row)
  widened.resize(2 * w.num_groups);
  for (int64_t i = 0; i < kPanel; ++i) {
    const bool real = n0 + i < w.N;
    const float* rs = real ? scales_of(w).row(n0 + i, widened.data()) : nullptr;
    const float* rm = real && w.mins ? mins_of(w).row(n0 + i, widened.data() + w.num_groups) : nullptr;
    for (int64_t c = 0; c < num_chunks; ++c) scales[c * kPanel + i] = real ? rs[c * chunk / w.group_size] : 0.f;
    for (int64_t g = 0; *with_mins && g < w.num_groups; ++g) {
      const float m = rm ? rm[g] : 0.f;
      // w = s * q + m = s * (q - shift) + (m + s * shift)
      mins[g * kPanel + i] = real ? m + rs[g] * static_cast<float>(shift) : 0.f;
    }
  }
}
#endif  // __AVX2__

// Scales [rows, num_groups] in float32 or float16, and mins (if any) in the same dtype and shape; or, with
// scale_supers (float32 [rows, num_groups / groups_per_super]), int8 scales and mins (with min_supers) times them.
void check_groups(const at::Tensor& scales, const c10::optional<at::Tensor>& mins, int64_t rows, int64_t num_groups,
                  const c10::optional<at::Tensor>& scale_supers = c10::nullopt,
                  const c10::optional<at::Tensor>& min_supers = c10::nullopt, int64_t groups_per_super = 0) {
  const bool factored = scale_supers.has_value();
  TORCH_CHECK(scales.is_contiguous() && scales.dim() == 2 && scales.size(0) == rows && scales.size(1) == num_groups &&
                  (factored ? scales.scalar_type() == at::kChar
                            : scales.scalar_type() == at::kFloat || scales.scalar_type() == at::kHalf),
              "scales must be contiguous float32 or float16 [N, ceil(K / group_size)], or int8 with scale_supers");
  TORCH_CHECK(!mins.has_value() || (mins->is_contiguous() && mins->sizes() == scales.sizes() &&
                                    mins->scalar_type() == scales.scalar_type()),
              "mins must be contiguous, shaped like scales and of their dtype");
  TORCH_CHECK(min_supers.has_value() == (factored && mins.has_value()), "min_supers go with int8 mins, and only then");
  if (!factored) return;
  TORCH_CHECK(groups_per_super > 0 && num_groups % groups_per_super == 0,
              "scale_supers need groups that tile super-blocks of 256 columns");
  for (const auto* supers : {&scale_supers, &min_supers}) {
    TORCH_CHECK(!supers->has_value() || ((*supers)->is_contiguous() && (*supers)->scalar_type() == at::kFloat &&
                                         (*supers)->dim() == 2 && (*supers)->size(0) == rows &&
                                         (*supers)->size(1) == num_groups / groups_per_super),
                "scale_supers and min_supers must be contiguous float32 [N, K / 256]");
  }
}

// Groups per K-quant super-block of 256 columns (quant_kernels.SUPER_BLOCK), 0 where groups do not tile them.
inline int64_t groups_per_super(int64_t group_size) {
  return group_size > 0 && group_size <= 256 && 256 % group_size == 0 ? 256 / group_size : 0;
}

void check_weight(const at::Tensor& data, const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                  int64_t group_size, int64_t bits, int64_t K,
                  const c10::optional<at::Tensor>& scale_supers = c10::nullopt,
                  const c10::optional<at::Tensor>& min_supers = c10::nullopt) {
  TORCH_CHECK(bits == 8 || bits == 4, "bits must be 8 or 4, got ", bits);
  TORCH_CHECK(data.dim() == 2 && data.is_contiguous() && data.scalar_type() == (bits == 8 ? at::kChar : at::kByte),
              "data must be a contiguous 2-D ", bits == 8 ? "int8" : "uint8", " tensor");
  TORCH_CHECK(data.size(1) == (bits == 8 ? K : (K + 1) / 2), "data has ", data.size(1), " columns for K = ", K);
  TORCH_CHECK(group_size == 16 || group_size % kBlock == 0 || group_size >= K,
              "int8 dot products need groups of 16, of a multiple of 32 or of a whole row; got ", group_size);
  const int64_t num_groups = (K + group_size - 1) / group_size;
  check_groups(scales, mins, data.size(0), num_groups, scale_supers, min_supers, groups_per_super(group_size));
}


#if defined(__AVX2__)
Weight make_weight(const at::Tensor& data, const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                   int64_t group_size, int64_t bits, int64_t K,
                   const c10::optional<at::Tensor>& scale_supers = c10::nullopt,
                   const c10::optional<at::Tensor>& min_supers = c10::nullopt) {
  const int64_t nb = (K + kBlock - 1) / kBlock, num_groups = scales.size(1);
  return Weight{static_cast<const uint8_t*>(data.data_ptr()), scales.data_ptr(),
                mins.has_value() ? mins->data_ptr() : nullptr, data.size(0), K,
                std::min(group_size, K), bits, data.size(1), num_groups, nb, group_size == 16 && K > 16,
                scales.scalar_type() == at::kHalf,
                scale_supers.has_value() ? scale_supers->data_ptr<float>() : nullptr,
                min_supers.has_value() ? min_supers->data_ptr<float>() : nullptr, groups_per_super(group_size)};
}

// The shape of a weight whose codes come as packed panels (no codes or scales of its own here).
Weight packed_shape(int64_t N, int64_t K, int64_t group_size) {
  const int64_t nb = (K + kBlock - 1) / kBlock, gs = std::min(group_size, K);
  return Weight{nullptr, nullptr, nullptr, N, K, gs, 8, 0, (K + gs - 1) / gs, nb, group_size == 16 && K > 16};
}

// The columns of x that share one scale of w and one of x (a chunk): an int32 sum, then one float multiply-add.
int64_t panel_chunk(const Weight& w, int64_t x_block) {
  const int64_t chunk = std::min(w.group_size, x_block == 0 ? w.K : x_block);
  return chunk >= w.K ? w.nb * kBlock : chunk;  // one chunk over the padded row: whole quads, a multiple of 8
}

// Under VNNI, the kind of pair a panel's kernel (one of k's) joins (Kernels::pair_dot): signed codes, or unsigned
// codes of any span (vpdpbusd sums their products in int32, with no int16 step to widen); 0: none (not VNNI).
inline int pair_kind(const Kernels& k, PanelFn dot) {
  if (k.pair_dot == nullptr) return 0;
  return dot == k.panel[kSignedSpan] ? 1 : 2;
}

// Whether panels i and i + 1 of a set run as one pair (Kernels::pair_dot): both signed codes or both unsigned under
// VNNI, both whole (`left` outputs from panel i's first on), both with a mins' term or neither. A panel left
// unpaired keeps its own kernel: the integer sums, and so the outputs, are the same.
inline bool pairs_with_next(const Kernels& k, const PanelFn* dot, const Panel* panel, int64_t i, int64_t count,
                            int64_t left) {
  const int kind = pair_kind(k, dot[i]);
  return i + 1 < count && left >= 2 * kPanel && kind != 0 && pair_kind(k, dot[i + 1]) == kind &&
         (panel[i].mins == nullptr) == (panel[i + 1].mins == nullptr);
}

// Bytes of x (a byte a column) up to which a pair of panels runs every row of x in one visit (sweep_panels).
constexpr int64_t kPairAllRowsBytes = 16 << 10;

// Each row's running argmax over the outputs a thread's sets of panels made (sweep_panels with an ArgmaxParts): per
// lane of 8, the largest value and its column (the first of equals: a thread's columns come in order), and the first
// NaN's column (-1: none yet); merged over lanes and threads by best_column.
struct RowMax {
  alignas(32) float value[kPanel];
  alignas(32) int32_t column[kPanel];
  int64_t first_nan;

  RowMax() : first_nan(-1) {
    std::fill(value, value + kPanel, -std::numeric_limits<float>::infinity());
    std::fill(column, column + kPanel, -1);
  }
};

// Row m's column of the largest output over every part's lanes: the first NaN's if any, else the first of the largest
// values (0 where every output is -inf), as torch.argmax picks it. `Best` holds value[], column[] and first_nan.
template <class Best>
int64_t best_column(const std::vector<std::vector<Best>>& parts, int64_t m) {
  int64_t nan = -1, column = -1;
  float value = -std::numeric_limits<float>::infinity();
  for (const std::vector<Best>& part : parts) {
    const Best& row = part[m];
    if (row.first_nan >= 0 && (nan < 0 || row.first_nan < nan)) nan = row.first_nan;
    for (size_t i = 0; i < std::size(row.column); ++i) {
      if (row.column[i] < 0) continue;
      if (row.value[i] > value || (row.value[i] == value && row.column[i] < column))
        value = row.value[i], column = row.column[i];
    }
  }
  return nan >= 0 ? nan : std::max<int64_t>(column, 0);
}

// The threads' RowMax rows of a sweep (one vector per range of sets), and the bias (float32 [N], or nullptr) each
// output gets before it is compared: the float32 logits panel_linear gives for float32 x, which compute_logits hands
// the sampler whatever the model's dtype (so no bf16 rounding here: it made ties of values the sampler tells apart).
// With `allowed` (int32 [M, words], or nullptr), each row's grammar mask: bit n % 32 of word n / 32 allows column n,
// and a banned column's output counts as -inf, as apply_token_bitmask makes it (columns past the mask are banned), so
// a constrained greedy step reads the head once instead of twice.
struct ArgmaxParts {
  const float* bias;
  const int32_t* allowed = nullptr;
  int64_t words = 0;
  std::mutex lock;
  std::vector<std::vector<RowMax>> parts;
};

// The lanes of the kPanel columns from `column` (a multiple of kPanel) that row_bits allows, as a blend mask.
inline __m256 allowed_lanes(const int32_t* row_bits, int64_t words, int64_t column) {
  const __m256i lane_bits = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const int64_t word = column >> 5;
  const uint32_t bits = word < words ? (static_cast<uint32_t>(row_bits[word]) >> (column & 31)) & 0xFF : 0;
  const __m256i set = _mm256_and_si256(_mm256_set1_epi32(static_cast<int32_t>(bits)), lane_bits);
  return _mm256_castsi256_ps(_mm256_cmpeq_epi32(set, lane_bits));
}

// Rows [0, M) of a set's outputs (tile, `width` columns a row, row stride ld; columns n0.. of the weight) into each
// row's RowMax.
inline void take_set(const float* tile, int64_t M, int64_t width, int64_t ld, int64_t n0, const ArgmaxParts& how,
                     RowMax* best) {
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int64_t m = 0; m < M; ++m) {
    RowMax& row = best[m];
    __m256 value = _mm256_load_ps(row.value);
    __m256i column = _mm256_load_si256(reinterpret_cast<const __m256i*>(row.column));
    for (int64_t c = 0; c < width; c += kPanel) {
      alignas(32) float part[kPanel];
      const float* src = tile + m * ld + c;
      if (c + kPanel > width) {  // the weight's last columns: the rest of the vector never wins
        std::fill(part, part + kPanel, -std::numeric_limits<float>::infinity());
        std::memcpy(part, src, (width - c) * sizeof(float));
        src = part;
      }
      __m256 v = _mm256_loadu_ps(src);
      if (how.bias != nullptr) {
        alignas(32) float b[kPanel] = {};
        std::memcpy(b, how.bias + n0 + c, std::min(kPanel, width - c) * sizeof(float));
        v = _mm256_add_ps(v, _mm256_load_ps(b));
      }
      if (how.allowed != nullptr)
        v = _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), v,
                             allowed_lanes(how.allowed + m * how.words, how.words, n0 + c));
      const __m256 larger = _mm256_cmp_ps(v, value, _CMP_GT_OQ);
      value = _mm256_blendv_ps(value, v, larger);
      const __m256i at = _mm256_add_epi32(lanes, _mm256_set1_epi32(static_cast<int32_t>(n0 + c)));
      column = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(column), _mm256_castsi256_ps(at), larger));
      const int nan = _mm256_movemask_ps(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
      if (nan && row.first_nan < 0) row.first_nan = n0 + c + __builtin_ctz(nan);
    }
    _mm256_store_ps(row.value, value);
    _mm256_store_si256(reinterpret_cast<__m256i*>(row.column), column);
  }
}

// Panels as `get(set scratch, panel index, index in the set, how many panels on its Panel::ahead lies, &panel)` gives
// them (packed there, or prepacked), swept in sets of kPanelGroup, each set against every row of x, the sets split
// over threads. The outputs go to out [M, N]; or, with `argmax`, each set's to a tile, whose rows go into the rows'
// running argmax once the set has met every row of x (a greedy step's logits are never written).
template <class GetPanel>
void sweep_panels(const Kernels& k, int64_t N, const QuantizedX& x, float* out, int64_t scratch_bytes, GetPanel get,
                  ArgmaxParts* argmax = nullptr) {
  const int64_t num_panels = (N + kPanel - 1) / kPanel;
  const int64_t num_sets = (num_panels + kPanelGroup - 1) / kPanelGroup;
  constexpr int64_t kSetColumns = kPanelGroup * kPanel;
  at::parallel_for(0, num_sets, 1, [&](int64_t s0, int64_t s1) {
    std::vector<uint8_t> scratch(scratch_bytes);
    Panel panel[kPanelGroup];
    PanelFn dot[kPanelGroup];
    alignas(32) float tile[kPanelRowsOnce * kPanel];
    std::vector<float> set_outputs(argmax != nullptr ? x.M * kSetColumns : 0);
    std::vector<RowMax> best(argmax != nullptr ? x.M : 0);
    const int64_t ld = argmax != nullptr ? kSetColumns : N;
    const int64_t step = x.M <= kPanelRowsOnce ? x.M : x.qu8 != nullptr ? 8 : kPanelRows;
    const bool all_rows = x.M * x.nb * kBlock <= kPairAllRowsBytes;
    const int64_t whole_blocks = step > 0 ? x.M / step : 0;  // blocks of `step` rows (the rest asks nothing ahead)
    // The codes a pair asks in (Panel::ahead): with every block of rows in one visit, the next pair's; else those of
    // the same pair of the next set, which this set's whole blocks of rows ask in a share each (pair_rows), so they
    // arrive while the whole set computes. Asked only by the first block, they had to come at 64 bytes every 9
    // vpdpbusd, faster than a core's share of a Zen 4's memory bandwidth
    // (benchmarks/results/report-2026-12-06-zen4-headroom.md).
    const int64_t ahead = all_rows ? 2 : kPanelGroup;
    for (int64_t set = s0; set < s1; ++set) {
      const int64_t p0 = set * kPanelGroup, count = std::min(kPanelGroup, num_panels - p0);
      // output (row m, column n0) of this set
      const auto out_at = [&](int64_t m, int64_t n0) {
        return argmax != nullptr ? set_outputs.data() + m * ld + (n0 - p0 * kPanel) : out + m * ld + n0;
      };
      for (int64_t i = 0; i < count; ++i) dot[i] = get(scratch.data(), p0 + i, i, ahead, &panel[i]);
      for (int64_t m = 0; m < x.M; m += step) {
        const int64_t rows_here = std::min(step, x.M - m);
        for (int64_t i = 0; i < count; ++i) {
          const int64_t n0 = (p0 + i) * kPanel, width = std::min(kPanel, N - n0);
          if (pairs_with_next(k, dot, panel, i, count, N - n0)) {
            // Where x's rows fit in half of L1 (kPairAllRowsBytes), a pair runs every block of rows of x when the
            // first block reaches it (the later blocks find it done): its codes come from memory once and stay in
            // L1.
            const int64_t m_end = all_rows ? (m == 0 ? x.M : m) : m + rows_here;
            for (int64_t mm = m; mm < m_end; mm += step)
              k.pair_dot(pair_kind(k, dot[i]) == 2, panel[i], panel[i + 1], x, mm, std::min(step, x.M - mm),
                         out_at(mm, n0), ld,
                         mm / step < whole_blocks ? AheadShare::of(mm / step, whole_blocks) : AheadShare{});
            ++i;
          } else if (width == kPanel) {
            dot[i](panel[i], x, m, rows_here, out_at(m, n0), ld);
          } else {  // the last panel of an N that is not a multiple of 8: through a tile
            dot[i](panel[i], x, m, rows_here, tile, kPanel);
            for (int64_t r = 0; r < rows_here; ++r)
              std::memcpy(out_at(m + r, n0), tile + r * kPanel, width * sizeof(float));
          }
        }
      }
      if (argmax != nullptr)
        take_set(set_outputs.data(), x.M, std::min(kSetColumns, N - p0 * kPanel), ld, p0 * kPanel, *argmax,
                 best.data());
    }
    if (argmax != nullptr) {
      const std::lock_guard<std::mutex> hold(argmax->lock);
      argmax->parts.push_back(std::move(best));
    }
  });
}

// The panel kernel with each set of panels packed into scratch as it is reached.
void panels(const Kernels& k, const Weight& w, const QuantizedX& x, int64_t x_block, float* out) {
  const int64_t kpad = w.nb * kBlock, chunk = panel_chunk(w, x_block);
  const int64_t num_chunks = (w.K + chunk - 1) / chunk;
  // scratch: one panel's rows, then per panel of the set its codes, scales and mins
  const int64_t codes_bytes = kPanel * kpad, scales_bytes = num_chunks * kPanel * 4, mins_bytes = w.num_groups * kPanel * 4;
  const int64_t per_panel = codes_bytes + scales_bytes + mins_bytes;
  sweep_panels(k, w.N, x, out, codes_bytes + kPanelGroup * per_panel,
               [&](uint8_t* scratch, int64_t p, int64_t i, int64_t, Panel* panel) {
                 uint8_t* pc = scratch + codes_bytes + i * per_panel;
                 float* ps = reinterpret_cast<float*>(pc + codes_bytes);
                 float* pm = reinterpret_cast<float*>(pc + codes_bytes + scales_bytes);
                 bool with_mins = false;
                 int span = 0;
                 pack_panel(w, p * kPanel, chunk, num_chunks, scratch, pc, ps, pm, &with_mins, &span);
                 *panel = Panel{pc, ps, with_mins ? pm : nullptr, kpad / 4, chunk / 4, num_chunks, w.num_groups};
                 return pick_panel(k, span);
               });
}

// Every panel of w packed once, as `panels` packs them per call: codes [panels, 8 * kpad], scales [panels,
// chunks * 8], mins [panels, groups * 8] (empty when no panel has a mins' term) and per panel its span of codes
// and whether it has a mins' term ([panels, 2]). Decode and verification steps of a few rows spent most of the
// LM head's time packing (the head is 168 M codes); packed once, the panel kernel serves them too.
std::vector<at::Tensor> pack_all_panels(const Weight& w, int64_t x_block) {
  const int64_t num_panels = (w.N + kPanel - 1) / kPanel, kpad = w.nb * kBlock, chunk = panel_chunk(w, x_block);
  const int64_t num_chunks = (w.K + chunk - 1) / chunk;
  const auto bytes = at::TensorOptions().dtype(at::kByte), floats = at::TensorOptions().dtype(at::kFloat);
  at::Tensor codes = at::empty({num_panels, kPanel * kpad}, bytes);
  at::Tensor scales = at::empty({num_panels, num_chunks * kPanel}, floats);
  at::Tensor mins = at::zeros({num_panels, w.num_groups * kPanel}, floats);
  at::Tensor meta = at::empty({num_panels, 2}, at::TensorOptions().dtype(at::kInt));
  int32_t* mp = meta.data_ptr<int32_t>();
  at::parallel_for(0, num_panels, 64, [&](int64_t p0, int64_t p1) {
    std::vector<uint8_t> rows(kPanel * kpad);
    for (int64_t p = p0; p < p1; ++p) {
      bool with_mins = false;
      int span = 0;
      pack_panel(w, p * kPanel, chunk, num_chunks, rows.data(), codes.data_ptr<uint8_t>() + p * kPanel * kpad,
                 scales.data_ptr<float>() + p * num_chunks * kPanel, mins.data_ptr<float>() + p * w.num_groups * kPanel,
                 &with_mins, &span);
      mp[2 * p] = span, mp[2 * p + 1] = with_mins;
    }
  });
  bool any_mins = false;
  for (int64_t p = 0; p < num_panels; ++p) any_mins = any_mins || mp[2 * p + 1];
  return {codes, scales, any_mins ? mins : at::empty({0}, floats), meta};
}

// The panel kernel over panels packed by pack_all_panels.
// Checks panels of `rows` weight rows (pack_all_panels: 8, pack_all_amx_panels: 16) packed for w and x_block:
// codes uint8 [panels, rows * padded K] (AMX panels: or narrow, `bits` < 8), scales float32 [panels, chunks * rows],
// mins float32 [panels, groups * rows] or empty, meta int32 [panels, 2] (each panel's span of codes, whether it has a
// mins' term).
void check_panels(const Weight& w, int64_t x_block, int64_t rows, const at::Tensor& codes, const at::Tensor& scales,
                  const at::Tensor& mins, const at::Tensor& meta, int bits = 8) {
  const int64_t kpad = w.nb * kBlock, chunk = panel_chunk(w, x_block), num_chunks = (w.K + chunk - 1) / chunk;
  const int64_t num_panels = (w.N + rows - 1) / rows, code_bytes = panel_code_bytes(rows, kpad, bits);
  TORCH_CHECK(codes.dim() == 2 && codes.size(0) == num_panels && codes.size(1) == code_bytes &&
                  codes.scalar_type() == at::kByte && codes.is_contiguous(),
              "panel codes must be contiguous uint8 [", num_panels, ", ", code_bytes, "]");
  TORCH_CHECK(scales.sizes() == at::IntArrayRef({num_panels, num_chunks * rows}) && scales.is_contiguous() &&
                  scales.scalar_type() == at::kFloat,
              "panel scales must be contiguous float32 [", num_panels, ", ", num_chunks * rows,
              "]: packed for another x_block?");
  TORCH_CHECK(meta.sizes() == at::IntArrayRef({num_panels, 2}) && meta.scalar_type() == at::kInt && meta.is_contiguous(),
              "panel meta must be contiguous int32 [", num_panels, ", 2]");
  const bool has_mins = mins.numel() > 0;
  TORCH_CHECK(!has_mins || (mins.sizes() == at::IntArrayRef({num_panels, w.num_groups * rows}) &&
                            mins.is_contiguous() && mins.scalar_type() == at::kFloat),
              "panel mins must be empty or contiguous float32 [", num_panels, ", ", w.num_groups * rows, "]");
  const int32_t* mp = meta.data_ptr<int32_t>();
  for (int64_t p = 0; !has_mins && p < num_panels; ++p)
    TORCH_CHECK(!mp[2 * p + 1], "panel ", p, " has a mins' term but no mins were given");
}

void prepacked_panels(const Weight& w, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                      const at::Tensor& meta, const QuantizedX& x, int64_t x_block, const Kernels& k, float* out,
                      ArgmaxParts* argmax = nullptr) {
  check_panels(w, x_block, kPanel, codes, scales, mins, meta);
  const int64_t kpad = w.nb * kBlock, chunk = panel_chunk(w, x_block), num_chunks = (w.K + chunk - 1) / chunk;
  const int32_t* mp = meta.data_ptr<int32_t>();
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* mnp = mins.numel() > 0 ? mins.data_ptr<float>() : nullptr;
  const int64_t num_panels = codes.size(0);
  sweep_panels(k, w.N, x, out, 0, [&](uint8_t*, int64_t p, int64_t, int64_t ahead, Panel* panel) {
    const PanelFn dot = pick_panel(k, mp[2 * p]);
    *panel = Panel{cp + p * kPanel * kpad, sp + p * num_chunks * kPanel,
                   mp[2 * p + 1] ? mnp + p * w.num_groups * kPanel : nullptr, kpad / 4, chunk / 4, num_chunks,
                   w.num_groups, p + ahead < num_panels ? cp + (p + ahead) * kPanel * kpad : nullptr};
    return dot;
  }, argmax);
}

// x [M, w.K] rounded for w's prepacked vector panels (panel_linear, panel_argmax) run by k, after checking what they
// share.
RoundedX round_for_panels(const at::Tensor& x, const Weight& w, const Kernels& k, int64_t x_block) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.K, "x must be [M, ", w.K, "]");
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  return round_x(x.to(at::kFloat).contiguous(), w.group_size, x_block == 0, false, k.pair_dot != nullptr);
}

// Every 16-row AMX panel of w: the two 8-row panels pack_panel makes, interleaved quad by quad; with `narrow`, their
// codes in fewer bits where they fit (see narrow_unit_bytes).
std::vector<at::Tensor> pack_all_amx_panels(const Weight& w, int64_t x_block, bool narrow) {
  const int64_t num_panels = (w.N + kAmxPanel - 1) / kAmxPanel, kpad = w.nb * kBlock, chunk = panel_chunk(w, x_block);
  const int64_t num_chunks = (w.K + chunk - 1) / chunk;
  const auto floats = at::TensorOptions().dtype(at::kFloat);
  at::Tensor codes = at::empty({num_panels, kAmxPanel * kpad}, at::TensorOptions().dtype(at::kByte));
  at::Tensor scales = at::empty({num_panels, num_chunks * kAmxPanel}, floats);
  at::Tensor mins = at::zeros({num_panels, w.num_groups * kAmxPanel}, floats);
  at::Tensor meta = at::empty({num_panels, 2}, at::TensorOptions().dtype(at::kInt));
  int32_t* mp = meta.data_ptr<int32_t>();
  at::parallel_for(0, num_panels, 32, [&](int64_t p0, int64_t p1) {
    std::vector<uint8_t> rows(kPanel * kpad), half_codes(2 * kPanel * kpad);
    std::vector<float> half_scales(2 * num_chunks * kPanel), half_mins(2 * w.num_groups * kPanel);
    for (int64_t p = p0; p < p1; ++p) {
      bool with_mins[2] = {false, false};
      int span[2] = {0, 0};
      for (int h = 0; h < 2; ++h)
        pack_panel(w, p * kAmxPanel + h * kPanel, chunk, num_chunks, rows.data(),
                   half_codes.data() + h * kPanel * kpad, half_scales.data() + h * num_chunks * kPanel,
                   half_mins.data() + h * w.num_groups * kPanel, &with_mins[h], &span[h]);
      uint8_t* dst = codes.data_ptr<uint8_t>() + p * kAmxPanel * kpad;
      for (int64_t j = 0; j < kpad / 4; ++j)
        for (int h = 0; h < 2; ++h)
          std::memcpy(dst + (j * kAmxPanel + h * kPanel) * 4, half_codes.data() + h * kPanel * kpad + j * kPanel * 4,
                      kPanel * 4);
      float* ps = scales.data_ptr<float>() + p * num_chunks * kAmxPanel;
      float* pm = mins.data_ptr<float>() + p * w.num_groups * kAmxPanel;
      for (int h = 0; h < 2; ++h) {
        for (int64_t c = 0; c < num_chunks; ++c)
          std::memcpy(ps + c * kAmxPanel + h * kPanel, half_scales.data() + (h * num_chunks + c) * kPanel, kPanel * 4);
        for (int64_t g = 0; with_mins[h] && g < w.num_groups; ++g)  // a half without a mins' term adds zeros
          std::memcpy(pm + g * kAmxPanel + h * kPanel, half_mins.data() + (h * w.num_groups + g) * kPanel, kPanel * 4);
      }
      mp[2 * p] = std::max(span[0], span[1]), mp[2 * p + 1] = with_mins[0] || with_mins[1];
    }
  });
  bool any_mins = false;
  int span = 0;
  for (int64_t p = 0; p < num_panels; ++p) any_mins = any_mins || mp[2 * p + 1], span = std::max(span, mp[2 * p]);
  const int bits = narrow ? narrow_bits(span) : 8;
  if (bits < 8) {
    const int64_t units = kpad * kAmxPanel / kNarrowUnit;
    const NarrowCodesFn narrow_codes = amx_kernels().narrow_codes;
    at::Tensor narrow = at::empty({num_panels, panel_code_bytes(kAmxPanel, kpad, bits)}, codes.options());
    at::parallel_for(0, num_panels, 64, [&](int64_t p0, int64_t p1) {
      narrow_codes(codes.data_ptr<uint8_t>() + p0 * kAmxPanel * kpad, (p1 - p0) * units, bits,
                   narrow.data_ptr<uint8_t>() + p0 * panel_code_bytes(kAmxPanel, kpad, bits));
    });
    codes = narrow;
  }
  return {codes, scales, any_mins ? mins : at::empty({0}, floats), meta};
}
#endif  // __AVX2__

// y = x w^T (+ bias) in x's dtype, x rounded per block of 32 (x_block 32) or per row (x_block 0), by the rows
// kernel or (panels) the panel kernel; see the top of this file.
at::Tensor int8_dot_linear(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scales,
                           const c10::optional<at::Tensor>& mins, int64_t group_size, int64_t bits, int64_t K,
                           const c10::optional<at::Tensor>& bias, int64_t isa, int64_t x_block, bool use_panels,
                           const c10::optional<at::Tensor>& scale_supers, const c10::optional<at::Tensor>& min_supers) {
#if defined(__AVX2__)
  check_weight(data, scales, mins, group_size, bits, K, scale_supers, min_supers);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "]");
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  const Kernels& k = vector_kernels(isa);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const Weight w = make_weight(data, scales, mins, group_size, bits, K, scale_supers, min_supers);
  const RoundedX rx = round_x(xf, w.group_size, x_block == 0, bits == 4 && !use_panels,
                              use_panels && k.pair_dot != nullptr);
  at::Tensor out = at::empty({xf.size(0), w.N}, xf.options());
  float* op = out.data_ptr<float>();
  if (use_panels) {
    panels(k, w, rx.view, x_block, op);
  } else {
    const RowsFn rows = pick_rows(k, w);
    at::parallel_for(0, w.N, 16, [&](int64_t n0, int64_t n1) { rows(w, rx.view, n0, n1, op); });
  }
  if (bias.has_value()) out.add_(bias->to(at::kFloat));
  return out.to(x.scalar_type());
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

// w's panels packed once (see pack_all_panels), for panel_linear with the same x_block and isa.
std::vector<at::Tensor> int8_dot_pack_panels(const at::Tensor& data, const at::Tensor& scales,
                                             const c10::optional<at::Tensor>& mins, int64_t group_size, int64_t bits,
                                             int64_t K, int64_t isa, int64_t x_block,
                                             const c10::optional<at::Tensor>& scale_supers,
                                             const c10::optional<at::Tensor>& min_supers) {
#if defined(__AVX2__)
  check_weight(data, scales, mins, group_size, bits, K, scale_supers, min_supers);
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  vector_kernels(isa);  // the panels are the same for every ISA; the check is the op's contract
  return pack_all_panels(make_weight(data, scales, mins, group_size, bits, K, scale_supers, min_supers), x_block);
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

// y = x w^T (+ bias) by the panel kernel over w's prepacked panels (int8_dot_pack_panels), x rounded as in
// int8_dot_linear: each output the same float operations as int8_dot_linear's panel kernel gives it.
at::Tensor int8_dot_panel_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                                 const at::Tensor& mins, const at::Tensor& meta, int64_t N, int64_t K,
                                 int64_t group_size, const c10::optional<at::Tensor>& bias, int64_t isa,
                                 int64_t x_block) {
#if defined(__AVX2__)
  const Weight w = packed_shape(N, K, group_size);
  const Kernels& k = vector_kernels(isa);
  const RoundedX rx = round_for_panels(x, w, k, x_block);
  at::Tensor out = at::empty({x.size(0), N}, x.options().dtype(at::kFloat));
  prepacked_panels(w, codes, scales, mins, meta, rx.view, x_block, k, out.data_ptr<float>());
  if (bias.has_value()) out.add_(bias->to(at::kFloat));
  return out.to(x.scalar_type());
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

// argmax over n of panel_linear(x.float(), ...)[m, n] per row of x ([M] int64): the first column of the largest value
// (the float32 output plus the bias), or of the first NaN, as torch.argmax takes it from those logits, whatever x's
// dtype (as amx_panel_argmax). They are never written: a greedy step would otherwise write and read back
// [M, vocab] floats just for its argmax.
at::Tensor int8_dot_panel_argmax(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                                 const at::Tensor& mins, const at::Tensor& meta, int64_t N, int64_t K,
                                 int64_t group_size, const c10::optional<at::Tensor>& bias, int64_t isa,
                                 int64_t x_block, const c10::optional<at::Tensor>& allowed) {
#if defined(__AVX2__)
  const Weight w = packed_shape(N, K, group_size);
  const Kernels& k = vector_kernels(isa);
  const RoundedX rx = round_for_panels(x, w, k, x_block);
  const at::Tensor b = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() == N, "bias must have N elements");
  ArgmaxParts argmax{b.defined() ? b.data_ptr<float>() : nullptr};
  if (allowed.has_value()) {
    TORCH_CHECK(allowed->scalar_type() == at::kInt && allowed->dim() == 2 && allowed->size(0) == x.size(0) &&
                    allowed->is_contiguous(),
                "allowed must be a contiguous int32 [M, words] bitmask, one row per row of x");
    argmax.allowed = allowed->data_ptr<int32_t>();
    argmax.words = allowed->size(1);
  }
  prepacked_panels(w, codes, scales, mins, meta, rx.view, x_block, k, nullptr, &argmax);
  at::Tensor tokens = at::empty({x.size(0)}, x.options().dtype(at::kLong));
  int64_t* t = tokens.data_ptr<int64_t>();
  for (int64_t m = 0; m < x.size(0); ++m) t[m] = best_column(argmax.parts, m);
  return tokens;
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

// w's 16-row AMX panels packed once (pack_all_amx_panels), for amx_panel_linear with the same x_block.
std::vector<at::Tensor> int8_dot_pack_amx_panels(const at::Tensor& data, const at::Tensor& scales,
                                                 const c10::optional<at::Tensor>& mins, int64_t group_size,
                                                 int64_t bits, int64_t K, int64_t x_block, bool narrow,
                                                 const c10::optional<at::Tensor>& scale_supers,
                                                 const c10::optional<at::Tensor>& min_supers) {
#if defined(__AVX2__)
  check_weight(data, scales, mins, group_size, bits, K, scale_supers, min_supers);
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  amx_kernels();  // where the tiles run
  return pack_all_amx_panels(make_weight(data, scales, mins, group_size, bits, K, scale_supers, min_supers), x_block,
                             narrow);
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

#if defined(__AVX2__)
// The bits per code of AMX panels packed for rows of kpad columns, by their codes' width (see narrow_unit_bytes).
int amx_code_bits(const at::Tensor& codes, int64_t kpad) {
  for (int bits : {8, 4, 5, 6})
    if (codes.dim() == 2 && codes.size(1) == panel_code_bytes(kAmxPanel, kpad, bits)) return bits;
  return 8;  // check_panels names the shape expected
}

// x rounded for w's AMX panels (int8_dot_pack_amx_panels) and the panels split over the threads, each range run as
// `run(panels, rounded x, M, bias, first panel, end panel)` (nothing for no rows): the part amx_panel_linear and
// amx_panel_argmax share (each takes the AMX kernels first, which checks that the tiles run).
template <class Run>
void over_amx_panels(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                     const at::Tensor& meta, int64_t N, int64_t K, int64_t group_size,
                     const c10::optional<at::Tensor>& bias, int64_t x_block, Run run) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "]");
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  const Weight w = packed_shape(N, K, group_size);
  const int bits = amx_code_bits(codes, w.nb * kBlock);
  check_panels(w, x_block, kAmxPanel, codes, scales, mins, meta, bits);
  const int64_t chunk = panel_chunk(w, x_block), num_chunks = (K + chunk - 1) / chunk;
  const amx::Panels panels{reinterpret_cast<const int8_t*>(codes.data_ptr<uint8_t>()), scales.data_ptr<float>(),
                           mins.numel() > 0 ? mins.data_ptr<float>() : nullptr, meta.data_ptr<int32_t>(), N,
                           w.nb * kBlock, chunk, num_chunks, w.num_groups, bits};
  const int64_t M = x.size(0), padded = M > kAmxRows ? (M + kAmxRows - 1) / kAmxRows * kAmxRows : M;
  // bf16 x rounded as it is: a float copy of x (with one of the outputs) was a visible share of a decode step
  at::Tensor xs = x.scalar_type() == at::kBFloat16 ? x.contiguous() : x.to(at::kFloat).contiguous();
  // past 16 rows, x in whole blocks of 16 (zero rows at the end): every block runs on one tile configuration
  if (padded != M) xs = at::constant_pad_nd(xs, {0, 0, 0, padded - M});
  const RoundedX rx = round_x(xs, w.group_size, x_block == 0, false);
  const at::Tensor b = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() == N, "bias must have N elements");
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  if (M > 0)
    at::parallel_for(0, (N + kAmxPanel - 1) / kAmxPanel, 16,
                     [&](int64_t p0, int64_t p1) { run(panels, rx.view, M, bp, p0, p1); });
}
#endif

// y = x w^T (+ bias) on w's AMX panels (int8_dot_pack_amx_panels), x rounded as in int8_dot_linear: the bits the
// vector panel kernel gives (see amx::Panels).
at::Tensor int8_dot_amx_panel_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                                     const at::Tensor& mins, const at::Tensor& meta, int64_t N, int64_t K,
                                     int64_t group_size, const c10::optional<at::Tensor>& bias, int64_t x_block) {
#if defined(__AVX2__)
  const Kernels& tiles = amx_kernels();
  // bf16 x gives bf16 outputs, written by the kernel
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  at::Tensor out = at::empty({x.size(0), N}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  over_amx_panels(x, codes, scales, mins, meta, N, K, group_size, bias, x_block,
                  [&](const amx::Panels& panels, const QuantizedX& rx, int64_t M, const float* b, int64_t p0,
                      int64_t p1) { tiles.amx_panels(panels, rx, M, p0, p1, amx::Out{out.data_ptr(), bf16, b, N}); });
  return bf16 ? out : out.to(x.scalar_type());
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

// argmax over n of (x w^T (+ bias))[m, n] per row of x ([M] int64), on w's AMX panels, as torch.argmax takes it from
// amx_panel_linear's float32 outputs: the first column of the largest value, or of the first NaN. The outputs are
// never written: over a large vocabulary, writing the logits and reading them back for the argmax was a visible
// share of a greedy decode step (benchmarks/results/report-2026-12-05-amx-xeon-decode-kernels.md).
at::Tensor int8_dot_amx_panel_argmax(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                                     const at::Tensor& mins, const at::Tensor& meta, int64_t N, int64_t K,
                                     int64_t group_size, const c10::optional<at::Tensor>& bias, int64_t x_block) {
#if defined(__AVX2__)
  const Kernels& tiles = amx_kernels();
  const int64_t M = x.size(0);
  std::mutex lock;
  std::vector<std::vector<amx::RowBest>> parts;  // one per range of panels run
  over_amx_panels(x, codes, scales, mins, meta, N, K, group_size, bias, x_block,
                  [&](const amx::Panels& panels, const QuantizedX& rx, int64_t rows, const float* b, int64_t p0,
                      int64_t p1) {
                    std::vector<amx::RowBest> best(rows);
                    for (amx::RowBest& row : best) amx::reset(&row);
                    tiles.amx_panels(panels, rx, rows, p0, p1, amx::Out{nullptr, false, b, N, best.data()});
                    const std::lock_guard<std::mutex> hold(lock);
                    parts.push_back(std::move(best));
                  });
  at::Tensor tokens = at::empty({M}, x.options().dtype(at::kLong));
  int64_t* t = tokens.data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m) t[m] = best_column(parts, m);
  return tokens;
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

// y = x w^T (+ bias) for one row of x on a weight stored in five bits (FiveBitWeight), x rounded as in
// int8_dot_linear: the same outputs, bit for bit, as int8_dot_linear's rows kernel on the codes in bytes.
at::Tensor int8_dot_five_bit_linear(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scales,
                                    const c10::optional<at::Tensor>& mins, int64_t group_size, int64_t K,
                                    const c10::optional<at::Tensor>& bias, int64_t isa, int64_t x_block) {
#if defined(__AVX2__)
  TORCH_CHECK(x.dim() == 2 && x.size(0) == 1 && x.size(1) == K, "x must be [1, ", K, "]");
  TORCH_CHECK(K % kBlock == 0 && (group_size % kBlock == 0 || group_size >= K),
              "five-bit rows need K a multiple of 32 and groups of whole blocks");
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  const Kernels& k = vector_kernels(isa);
  const int64_t nb = K / kBlock, gs = std::min(group_size, K), num_groups = (K + gs - 1) / gs;
  TORCH_CHECK(data.dim() == 2 && data.is_contiguous() && data.scalar_type() == at::kByte &&
                  data.size(1) == nb * kFiveBitBlockBytes, "data must be contiguous uint8 [N, K / 32 * 20]");
  const int64_t N = data.size(0);
  check_groups(scales, mins, N, num_groups);
  const bool half = scales.scalar_type() == at::kHalf;
  const FiveBitWeight w{data.data_ptr<uint8_t>(), scales.data_ptr(), mins.has_value() ? mins->data_ptr() : nullptr,
                        N, K, gs, num_groups, nb, half};
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const RoundedX rx = round_x(xf, gs, x_block == 0, false);
  // Each int32 lane's start: -16 times the sum of x's codes over the lane's four columns.
  std::vector<int32_t> lanes(nb * 8);
  for (int64_t i = 0; i < nb * 8; ++i)
    lanes[i] = -16 * (rx.view.q[4 * i] + rx.view.q[4 * i + 1] + rx.view.q[4 * i + 2] + rx.view.q[4 * i + 3]);
  at::Tensor out = at::empty({1, N}, xf.options());
  float* op = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { k.five_bit_rows(w, rx.view, lanes.data(), n0, n1, op); });
  if (bias.has_value()) out.add_(bias->to(at::kFloat));
  return out.to(x.scalar_type());
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

// x [M, K] rounded per token as round_x rounds it (dx = max |x| / 127 over the row, codes round(x / dx)): codes
// [M, K] int8 and scales [M], for an int8 GEMM (torch._int_mm) against per-channel int8 weights (w8a8 steps of
// many rows, int8_dot.py's int_mm_linear): one pass for the row maxima, one for the codes, rows over the threads.
#if defined(__AVX512BW__)
// quantize_per_token's rounding in 16-lane vectors, straight from x's dtype (float32 or bf16, whose widening is exact):
// the same max, the same product by 1 / d and the same round-to-even and saturation as round_block. The generic path
// copied x to float32 and went block by block, a large share of a prefill layer's time.
template <typename T>
inline __m512 load16_as_float(const T* p, __mmask16 m) {
  if constexpr (std::is_same_v<T, float>) {
    return _mm512_maskz_loadu_ps(m, p);
  } else {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p)), 16));
  }
}

// x[k .. k + 15], times channel_scale[k ..] where given, as x's dtype multiplies: float32, rounded back to bf16 for a
// bf16 x (torch's bf16 product), so the codes are those of (x * channel_scale) in x's dtype on every route.
template <typename T>
inline __m512 load16_scaled(const T* x, const float* channel_scale, int64_t k, __mmask16 mask) {
  __m512 v = load16_as_float(x + k, mask);
  if (channel_scale == nullptr) return v;
  v = _mm512_mul_ps(v, _mm512_maskz_loadu_ps(mask, channel_scale + k));
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    jido_bf16::f32x16 f;
    std::memcpy(&f, &v, sizeof(f));
    const jido_bf16::u16x16 bits = jido_bf16::round_bits16(f);
    __m256i b;
    std::memcpy(&b, &bits, sizeof(b));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
}

template <typename T>
void quantize_rows_avx512(const T* x, const float* channel_scale, int64_t M, int64_t K, int8_t* codes,
                          float* scales) {
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    // A scaled row's products are kept for the second pass (K floats, in L1) rather than computed and rounded twice.
    std::vector<float> scaled(channel_scale != nullptr ? K + 16 : 0);
    float* kept = scaled.data();
    for (int64_t m = m0; m < m1; ++m) {
      const T* row = x + m * K;
      __m512 amax = _mm512_setzero_ps();
      for (int64_t k = 0; k < K; k += 16) {
        const __mmask16 mask = K - k >= 16 ? 0xffff : static_cast<__mmask16>((1u << (K - k)) - 1);
        const __m512 v = load16_scaled(row, channel_scale, k, mask);
        if (kept != nullptr) _mm512_storeu_ps(kept + k, v);
        amax = _mm512_max_ps(amax, _mm512_abs_ps(v));
      }
      const float d = _mm512_reduce_max_ps(amax) / 127.f;
      scales[m] = d;
      const __m512 id = _mm512_set1_ps(d != 0.f ? 1.f / d : 0.f);
      for (int64_t k = 0; k < K; k += 16) {
        const __mmask16 mask = K - k >= 16 ? 0xffff : static_cast<__mmask16>((1u << (K - k)) - 1);
        const __m512 v = kept != nullptr ? _mm512_loadu_ps(kept + k) : load16_as_float(row + k, mask);
        const __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v, id));
        _mm_mask_storeu_epi8(codes + m * K + k, mask, _mm512_cvtsepi32_epi8(q));
      }
    }
  });
}
#endif

// channel_scale (float32 [K], optional): x * channel_scale is rounded instead of x (w8a8's smoothing divides x by s).
std::vector<at::Tensor> int8_dot_quantize_per_token(const at::Tensor& x, const std::optional<at::Tensor>& channel_scale) {
#if defined(__AVX2__)
  TORCH_CHECK(x.dim() == 2, "x must be [M, K]");
  const bool scaled = channel_scale.has_value() && channel_scale->defined();
  TORCH_CHECK(!scaled || (channel_scale->scalar_type() == at::kFloat && channel_scale->is_contiguous() &&
                          channel_scale->numel() == x.size(1)),
              "quantize_per_token: channel_scale must be contiguous float32 [K]");
  const float* cs = scaled ? channel_scale->data_ptr<float>() : nullptr;
#if defined(__AVX512BW__)
  if (x.is_contiguous() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16)) {
    const int64_t M = x.size(0), K = x.size(1);
    at::Tensor codes = at::empty({M, K}, x.options().dtype(at::kChar));
    at::Tensor scales = at::empty({M}, x.options().dtype(at::kFloat));
    if (x.scalar_type() == at::kFloat)
      quantize_rows_avx512(x.data_ptr<float>(), cs, M, K, codes.data_ptr<int8_t>(), scales.data_ptr<float>());
    else
      quantize_rows_avx512(x.data_ptr<at::BFloat16>(), cs, M, K, codes.data_ptr<int8_t>(), scales.data_ptr<float>());
    return {codes, scales};
  }
#endif
  // The product in x's dtype, as torch computes it, then widened.
  const at::Tensor xf = (scaled ? x * channel_scale->to(x.scalar_type()) : x).to(at::kFloat).contiguous();
  const int64_t M = xf.size(0), K = xf.size(1), nb = (K + kBlock - 1) / kBlock;
  at::Tensor codes = at::empty({M, K}, xf.options().dtype(at::kChar));
  at::Tensor scales = at::empty({M}, xf.options());
  const float* xp = xf.data_ptr<float>();
  int8_t* cp = codes.data_ptr<int8_t>();
  float* sp = scales.data_ptr<float>();
  at::parallel_for(0, M, 16, [&](int64_t m0, int64_t m1) {
    alignas(32) float v[kBlock];
    alignas(32) int8_t q[kBlock];
    for (int64_t m = m0; m < m1; ++m) {
      const float* row = xp + m * K;
      float row_max = 0.f;
      for (int64_t b = 0; b < nb; ++b)
        row_max = std::max(row_max, block_amax(row + b * kBlock, std::min(kBlock, K - b * kBlock), v));
      const float d = row_max / 127.f;
      sp[m] = d;
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t len = std::min(kBlock, K - b * kBlock);
        block_amax(row + b * kBlock, len, v);  // (the block copied into v, zero-padded)
        round_block(v, d, q);
        std::memcpy(cp + m * K + b * kBlock, q, len);
      }
    }
  });
  return {codes, scales};
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

// Per-channel int8 weight codes [N, K] (K a multiple of 64) packed for amx_gemm: blocks of 32 columns (zero past N);
// `gated`: the first N / 2 rows are a gate projection's and the rest its up projection's, and each block holds 16
// gate columns beside the 16 up columns that pair with them.
at::Tensor int8_dot_pack_amx_gemm(const at::Tensor& codes, bool gated) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar, "pack_amx_gemm: int8 codes [N, K]");
  const at::Tensor w = codes.contiguous();
  const int64_t N = w.size(0), K = w.size(1), half = N / 2;
  TORCH_CHECK(K % 64 == 0, "pack_amx_gemm: K must be a multiple of 64, got ", K);
  TORCH_CHECK(!gated || N % 2 == 0, "pack_amx_gemm: a gated weight has an even N, got ", N);
#if defined(__AVX2__)
  const int64_t steps = K / 64, blocks = gated ? (half + 15) / 16 : (N + amx::kGemmCols - 1) / amx::kGemmCols;
  at::Tensor packed = at::zeros({blocks, steps * 2048}, w.options());
  const uint32_t* src = reinterpret_cast<const uint32_t*>(w.data_ptr<int8_t>());
  uint32_t* dst = reinterpret_cast<uint32_t*>(packed.data_ptr<int8_t>());
  at::parallel_for(0, blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t j = 0; j < amx::kGemmCols; ++j) {
        // column j of the block: W's row n (gated: gate row 16b + j, or up row half + 16b + j - 16)
        const int64_t n = gated ? (j < 16 ? 16 * b + j : half + 16 * b + j - 16) : b * amx::kGemmCols + j;
        if (gated ? 16 * b + j % 16 >= half : n >= N) continue;
        // its quads of K into rows of the step's tile half j / 16
        const uint32_t* row = src + n * (K / 4);
        uint32_t* col = dst + b * steps * 512 + (j / 16) * 256 + j % 16;
        for (int64_t q = 0; q < K / 4; ++q) col[(q / 16) * 512 + (q % 16) * 16] = row[q];
      }
  });
  return packed;
#else
  TORCH_CHECK(false, "the int8 dot kernels need an AVX2 build");
#endif
}

// v [N] (a gated weight's per-column floats, gate then up) in its gated blocks' order: 16 gate values, 16 up ones.
at::Tensor gated_block_order(const at::Tensor& v) {
  const int64_t half = v.numel() / 2, blocks = (half + 15) / 16;
  at::Tensor out = at::zeros({blocks * 32}, v.options());
  const float* src = v.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  for (int64_t n = 0; n < half; ++n) dst[(n / 16) * 32 + n % 16] = src[n], dst[(n / 16) * 32 + 16 + n % 16] = src[half + n];
  return out;
}

// x's codes [M, K] (quantize_per_token) times the packed weight (N columns), scaled by x_scales [M] and w_scales
// [N] (+ bias [N]), as scale_sums scales torch._int_mm's sums; the result in bf16 or float32. With act 0 (silu) or 1
// (gelu_tanh), for a weight packed gated and bf16 out: act(gate) * up, [M, N / 2], as act_and_mul makes it of the
// bf16 products.
at::Tensor int8_dot_amx_gemm(const at::Tensor& codes, const at::Tensor& x_scales, const at::Tensor& packed,
                             const at::Tensor& w_scales, const c10::optional<at::Tensor>& bias, int64_t N,
                             bool bf16_out, int64_t act) {
  const Kernels& k = amx_kernels();
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.is_contiguous(),
              "amx_gemm: contiguous int8 codes [M, K]");
  TORCH_CHECK(act >= -1 && act <= 1 && (act < 0 || (bf16_out && N % 2 == 0)),
              "amx_gemm: act -1 (none), or 0 / 1 (silu / gelu_tanh) of a gated weight's halves into bf16");
  const bool gated = act >= 0;
  const int64_t M = codes.size(0), K = codes.size(1);
  TORCH_CHECK(K % 64 == 0 && packed.dim() == 2 && packed.size(1) == K / 64 * 2048 &&
                  packed.size(0) == (gated ? (N / 2 + 15) / 16 : (N + 31) / 32),
              "amx_gemm: the packed weight does not match K and N");
  TORCH_CHECK(x_scales.scalar_type() == at::kFloat && x_scales.is_contiguous() && x_scales.numel() == M,
              "amx_gemm: x_scales must be contiguous float32 [M]");
  TORCH_CHECK(w_scales.scalar_type() == at::kFloat && w_scales.is_contiguous() && w_scales.numel() == N,
              "amx_gemm: w_scales must be contiguous float32 [N]");
  at::Tensor b = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() == N, "amx_gemm: bias must have N elements");
  at::Tensor out = at::empty({M, gated ? N / 2 : N}, codes.options().dtype(bf16_out ? at::kBFloat16 : at::kFloat));
  if (M == 0) return out;
#if defined(__AVX2__)
  const at::Tensor dw = gated ? gated_block_order(w_scales) : w_scales;
  if (gated && b.defined()) b = gated_block_order(b);
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  const int64_t threads = at::get_num_threads(), groups = (M + 31) / 32;
  // Rows split between the threads where there are enough; column blocks too where there are not.
  const int64_t row_parts = std::max<int64_t>(1, std::min(threads, groups / 2));
  const int64_t col_parts = std::max<int64_t>(1, threads / row_parts);
  at::parallel_for(0, row_parts * col_parts, 1, [&](int64_t begin, int64_t end) {
    if (bf16_out)
      k.gemm_bf16(codes.data_ptr<int8_t>(), M, K, x_scales.data_ptr<float>(), packed.data_ptr<int8_t>(),
                  dw.data_ptr<float>(), bp, N, reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()), act,
                  row_parts, col_parts, begin, end);
    else
      k.gemm(codes.data_ptr<int8_t>(), M, K, x_scales.data_ptr<float>(), packed.data_ptr<int8_t>(),
             dw.data_ptr<float>(), bp, N, out.data_ptr<float>(), act, row_parts, col_parts, begin, end);
  });
#endif
  return out;
}

// out[m, n] = acc[m, n] * x_scales[m] * w_scales[n] (+ bias[n]) in float32, one pass: an int8 GEMM's int32 sums
// scaled back (the same two products per output as the panel kernel's per-token path, in another order). ATen's ops
// took three passes over the [M, N] sums, and a prefill's sums are far larger than the cache.
#if defined(__AVX2__) && defined(__GNUC__)
// One row of sums [N] scaled into bf16: out[n] = bf16(float(a[n]) * dx * ws[n] (+ b[n])), the float32 products then
// torch's rounding to nearest even; with act >= 0 (a gated weight, gate columns first) act(gate) * up of the two
// halves' bf16 values instead, [N / 2], as act_and_mul makes it. Columns past the last 16 are masked.
JIDO_AVX512_BF16 inline __m512 scaled16(const int32_t* a, __m512 dx, const float* ws, const float* b, __mmask16 m) {
  const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_maskz_loadu_epi32(m, a)), dx),
                                 _mm512_maskz_loadu_ps(m, ws));
  return b != nullptr ? _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, b)) : v;
}

JIDO_AVX512_BF16 inline __m512 rounded_bf16(__m512 v) {  // v rounded to bf16 and widened back
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
}

JIDO_AVX512_BF16 void scale_row_bf16(const int32_t* a, float dx, const float* ws, const float* b, int64_t N, int64_t act,
                                     at::BFloat16* out) {
  const __m512 vdx = _mm512_set1_ps(dx);
  const int64_t width = act >= 0 ? N / 2 : N;
  for (int64_t n = 0; n < width; n += 16) {
    const __mmask16 m = width - n >= 16 ? 0xffff : static_cast<__mmask16>((1u << (width - n)) - 1);
    const float* bn = b != nullptr ? b + n : nullptr;
    __m256i y;
    if (act >= 0) {
      const float* bu = b != nullptr ? b + width + n : nullptr;
      y = (__m256i)jido_gated::act_and_mul16_bf16(rounded_bf16(scaled16(a + n, vdx, ws + n, bn, m)),
                                                  rounded_bf16(scaled16(a + width + n, vdx, ws + width + n, bu, m)),
                                                  static_cast<jido_gated::Act>(act));
    } else {
      y = (__m256i)_mm512_cvtneps_pbh(scaled16(a + n, vdx, ws + n, bn, m));
    }
    _mm256_mask_storeu_epi16(out + n, m, y);
  }
}

#endif

// torch._int_mm's sums acc [M, N] scaled back: out = float(acc) * x_scales[m] * w_scales[n] (+ bias), float32; with
// bf16_out (where the CPU runs AVX-512 BF16) in bf16 straight away, and with act 0 / 1 (silu / gelu_tanh) the gated
// halves' act(gate) * up [M, N / 2]: what .to(bf16) and act_and_mul make of the float32 result, in one pass over
// the sums instead of three, each of which at prefill sizes streams the whole [M, N] from memory.
at::Tensor int8_dot_scale_sums(const at::Tensor& acc, const at::Tensor& x_scales, const at::Tensor& w_scales,
                               const c10::optional<at::Tensor>& bias, bool bf16_out, int64_t act) {
  TORCH_CHECK(acc.dim() == 2 && acc.scalar_type() == at::kInt && acc.is_contiguous(), "acc must be contiguous int32 [M, N]");
  const int64_t M = acc.size(0), N = acc.size(1);
  TORCH_CHECK(x_scales.scalar_type() == at::kFloat && x_scales.is_contiguous() && x_scales.numel() == M,
              "x_scales must be contiguous float32 [M]");
  TORCH_CHECK(w_scales.scalar_type() == at::kFloat && w_scales.is_contiguous() && w_scales.numel() == N,
              "w_scales must be contiguous float32 [N]");
  TORCH_CHECK(act >= -1 && act <= 1 && (act < 0 || (bf16_out && N % 2 == 0)),
              "scale_sums: act -1 (none), or 0 / 1 (silu / gelu_tanh) of a gated weight's halves into bf16");
  TORCH_CHECK(!bf16_out || cpu_runs(kAvx512Bf16), "scale_sums: bf16_out needs AVX-512 BF16");
  const at::Tensor b = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() == N, "bias must have N elements");
  at::Tensor out = at::empty({M, act >= 0 ? N / 2 : N}, acc.options().dtype(bf16_out ? at::kBFloat16 : at::kFloat));
  const int32_t* ap = acc.data_ptr<int32_t>();
  const float *xs = x_scales.data_ptr<float>(), *ws = w_scales.data_ptr<float>();
  const float* bp = b.defined() ? b.data_ptr<float>() : nullptr;
  if (bf16_out) {
#if defined(__AVX2__) && defined(__GNUC__)
    at::BFloat16* op = out.data_ptr<at::BFloat16>();
    const int64_t width = out.size(1);
    at::parallel_for(0, M, 8, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) scale_row_bf16(ap + m * N, xs[m], ws, bp, N, act, op + m * width);
    });
#endif
    return out;
  }
  float* op = out.data_ptr<float>();
  at::parallel_for(0, M, 8, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      const int32_t* a = ap + m * N;
      float* o = op + m * N;
      const float dx = xs[m];
      if (bp == nullptr) {
#pragma omp simd
        for (int64_t n = 0; n < N; ++n) o[n] = static_cast<float>(a[n]) * dx * ws[n];
      } else {
#pragma omp simd
        for (int64_t n = 0; n < N; ++n) o[n] = static_cast<float>(a[n]) * dx * ws[n] + bp[n];
      }
    }
  });
  return out;
}

bool int8_dot_supported(int64_t isa) { return cpu_runs(isa); }

}  // namespace jido_int8_dot

TORCH_LIBRARY(jido_int8_dot, m) {
  m.def("linear(Tensor x, Tensor data, Tensor scales, Tensor? mins, int group_size, int bits, int K, Tensor? bias, "
        "int isa, int x_block, bool panels, Tensor? scale_supers=None, Tensor? min_supers=None) -> Tensor");
  m.def("pack_panels(Tensor data, Tensor scales, Tensor? mins, int group_size, int bits, int K, int isa, "
        "int x_block, Tensor? scale_supers=None, Tensor? min_supers=None) -> Tensor[]");
  m.def("panel_linear(Tensor x, Tensor codes, Tensor scales, Tensor mins, Tensor meta, int N, int K, int group_size, "
        "Tensor? bias, int isa, int x_block) -> Tensor");
  m.def("panel_argmax(Tensor x, Tensor codes, Tensor scales, Tensor mins, Tensor meta, int N, int K, int group_size, "
        "Tensor? bias, int isa, int x_block, Tensor? allowed=None) -> Tensor");
  m.def("five_bit_linear(Tensor x, Tensor data, Tensor scales, Tensor? mins, int group_size, int K, Tensor? bias, "
        "int isa, int x_block) -> Tensor");
  m.def("quantize_per_token(Tensor x, Tensor? channel_scale=None) -> Tensor[]");
  m.def("scale_sums(Tensor acc, Tensor x_scales, Tensor w_scales, Tensor? bias, bool bf16_out=False, int act=-1) "
        "-> Tensor");
  m.def("pack_amx_panels(Tensor data, Tensor scales, Tensor? mins, int group_size, int bits, int K, int x_block, "
        "bool narrow, Tensor? scale_supers=None, Tensor? min_supers=None) -> Tensor[]");
  m.def("amx_panel_linear(Tensor x, Tensor codes, Tensor scales, Tensor mins, Tensor meta, int N, int K, "
        "int group_size, Tensor? bias, int x_block) -> Tensor");
  m.def("amx_panel_argmax(Tensor x, Tensor codes, Tensor scales, Tensor mins, Tensor meta, int N, int K, "
        "int group_size, Tensor? bias, int x_block) -> Tensor");
  m.def("pack_amx_gemm(Tensor codes, bool gated) -> Tensor");
  m.def("amx_gemm(Tensor codes, Tensor x_scales, Tensor packed, Tensor w_scales, Tensor? bias, int N, bool bf16_out, "
        "int act) -> Tensor");
  m.def("supported(int isa) -> bool", &jido_int8_dot::int8_dot_supported);
  m.def("isas() -> str[]", &jido_int8_dot::cpu_isas);
}

TORCH_LIBRARY_IMPL(jido_int8_dot, CPU, m) {
  m.impl("linear", &jido_int8_dot::int8_dot_linear);
  m.impl("pack_panels", &jido_int8_dot::int8_dot_pack_panels);
  m.impl("panel_linear", &jido_int8_dot::int8_dot_panel_linear);
  m.impl("panel_argmax", &jido_int8_dot::int8_dot_panel_argmax);
  m.impl("pack_amx_panels", &jido_int8_dot::int8_dot_pack_amx_panels);
  m.impl("amx_panel_linear", &jido_int8_dot::int8_dot_amx_panel_linear);
  m.impl("amx_panel_argmax", &jido_int8_dot::int8_dot_amx_panel_argmax);
  m.impl("five_bit_linear", &jido_int8_dot::int8_dot_five_bit_linear);
  m.impl("quantize_per_token", &jido_int8_dot::int8_dot_quantize_per_token);
  m.impl("scale_sums", &jido_int8_dot::int8_dot_scale_sums);
  m.impl("pack_amx_gemm", &jido_int8_dot::int8_dot_pack_amx_gemm);
  m.impl("amx_gemm", &jido_int8_dot::int8_dot_amx_gemm);
}
