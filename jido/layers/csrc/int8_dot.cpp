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
//   all its rows. With AMX-INT8, prepacked
//   panels of 16 rows run on the tile units instead (see AMX panels below), with the same outputs.
//
// int8 codes as |q| (unsigned) against xq with q's signs (_mm256_sign_epi8; |q| <= 128 and |xq| <= 127, so
// maddubs' pair sums of at most 32512 never saturate); int4 codes (0..15) in the rows kernel as they are, the
// low nibbles (even columns) in the low 16 bytes and the high nibbles (odd columns) in the high 16, against
// xq stored in that order.
//
// One source, two ISAs: the part below `#else` is compiled twice (this file includes itself), once for AVX2
// and once under `#pragma GCC target` for AVX-512 VNNI, each in its own namespace; every build of an x86 CPU
// holds both and `isa` picks one at run time (checked against the CPU here, chosen in int8_dot.py).
#ifndef JIDO_INT8_DOT_PASS
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <mutex>

#include "bf16_bits.h"
#include <type_traits>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include "gated_activation.h"
#include "tile_state.h"

#define JIDO_INLINE __attribute__((always_inline)) inline

namespace jido_int8_dot {

constexpr int64_t kBlock = 32;  // columns of x per stored block (and per scale with x_block 32)
constexpr int64_t kPrefetchRows = 4;  // how far ahead the rows kernel prefetches weight rows
constexpr int64_t kPanel = 8;  // weight rows per panel: one int32 lane each
constexpr int64_t kPanelRows = 4;  // rows of x per step of the panel kernel

// Narrow AMX panels. A weight whose panels' codes all span at most 63 values (GGUF's Q4_K, Q5_0, Q6_K; stored
// shifted to 0..span) keeps them in 4, 5 or 6 bits rather than bytes: each unit of 128 code bytes (two 64-byte rows
// of a B tile) as 64 bytes of nibbles (byte i: code i in the low half, code 64 + i in the high) and, per bit past
// the fourth, 16 bytes of that bit (two 64-bit masks: codes 0..63, then 64..127). The tile kernel widens a multiply's
// units back into bytes in L1 just before it loads them. Decode steps of a few rows stream these weights from memory,
// so fewer bytes are less time: 4-6 bits a code read instead of 8.
constexpr int64_t kNarrowUnit = 128;
inline int64_t narrow_unit_bytes(int bits) { return bits >= 8 ? kNarrowUnit : 64 + 16 * (bits - 4); }
// Bits per code for a weight whose panels' widest span of codes is `span` (8: bytes, as packed).
inline int narrow_bits(int span) { return span <= 15 ? 4 : span <= 31 ? 5 : span <= 63 ? 6 : 8; }
// Bytes of codes in one panel of `rows` weight rows of kpad columns, `bits` a code.
inline int64_t panel_code_bytes(int64_t rows, int64_t kpad, int bits) {
  return rows * kpad / kNarrowUnit * narrow_unit_bytes(bits);
}

// Steps of up to this many rows (a speculative verify step's K + 1) run in one step: each pass over a panel
// then serves them all.
constexpr int64_t kPanelRowsOnce = 8;
// Panels packed together and swept by each step of 4 rows of x: those rows stay in L1 while 64 weight rows
// (40-128 KiB of codes for Gemma 3's shapes) stay in L2, so x is read from memory once per 64 outputs.
constexpr int64_t kPanelGroup = 8;

// x rounded: q [M, nb * 32] (zero past K; for the rows kernel on int4 weights each block's even columns
// first), d [M, nb] (every block of a row holds the row's scale when x is rounded per token), sums
// [M, num_groups] (the rounded x summed over each weight group).
struct QuantizedX {
  const int8_t* q;
  const float* d;
  const float* sums;
  int64_t M, nb, num_groups;
  const uint8_t* qu = nullptr;  // q + 128 (q ^ 0x80) for the VNNI panel kernel of signed codes; nullptr: not made
  // qu of each whole group of 8 rows, interleaved by column quad ([M / 8][nb * 8][8][4]): one pointer reaches all 8
  // rows' quads (pair_rows<8, true>); made with qu for steps of 8 rows or more (8 rows: one
  // interleaved block, faster than two blocks of 4 on the LM head and the layers' gate/up)
  const uint8_t* qu8 = nullptr;
  const int8_t* q8 = nullptr;  // q interleaved as qu8 is (pairs of unsigned codes, which take x as it is)
};

struct Weight {
  const uint8_t* data;
  const float* scales;
  const float* mins;  // nullptr: no mins
  int64_t N, K, group_size, bits, row_bytes, num_groups, nb;
  bool groups16;  // else each group holds whole blocks: group_size a multiple of 32, or one group per row
};

// A weight of codes in -16..15 (Q5_0's) stored in five bits (int8_dot.py, FiveBitRows), u = q + 16: per pair of
// blocks of 32 codes, 32 bytes of low nibbles (column j of the first block in byte j's low half, of the second in
// its high half), then each block's 4 bytes of fifth bits; a last block without a pair as 16 bytes of nibbles
// (column j in byte j's low half, j + 16 in its high half), then its fifth bits. The fifth bit of column
// 4 * i + b lies at bit 8 * b + i of its block's word, so lane i of the word shifted right by i holds them at
// the bottom of its bytes (fifth_bits). 20 bytes a block; scales and mins as Weight's; K a multiple of 32,
// groups of whole blocks.
constexpr int64_t kFiveBitBlockBytes = 20;
struct FiveBitWeight {
  const uint8_t* data;
  const float* scales;
  const float* mins;  // nullptr: no mins
  int64_t N, K, group_size, num_groups, nb;
};

// A panel of kPanel weight rows, repacked: codes [quads][kPanel][4] (column quad j of row n at
// codes[(j * kPanel + n) * 4]), the scales per chunk of columns [chunks][kPanel] (a chunk shares one scale of
// w and one of x) and the mins' term's factors per group [groups][kPanel].
struct Panel {
  const uint8_t* codes;
  const float* scales;
  const float* mins;  // nullptr: no mins' term (no mins and no shift)
  int64_t quads;  // column quads, nb * 8
  int64_t chunk_quads, num_chunks, num_groups;
  // Codes a pair of panels asks into cache while it runs, where they are packed already (prepacked panels): those of
  // the pair that runs after it (sweep_panels). nullptr: none.
  const uint8_t* ahead = nullptr;
};

inline void prefetch_row(const Weight& w, int64_t n) {
  if (n >= w.N) return;
  const char* bytes = reinterpret_cast<const char*>(w.data + n * w.row_bytes);
  for (int64_t i = 0; i < w.row_bytes; i += 64) __builtin_prefetch(bytes + i);
  const char* scales = reinterpret_cast<const char*>(w.scales + n * w.num_groups);
  for (int64_t i = 0; i < w.num_groups * 4; i += 64) __builtin_prefetch(scales + i);
}

using RowsFn = void (*)(const Weight&, const QuantizedX&, int64_t, int64_t, float*);
// (panel, x, first row of x, rows, out + first output column, N)
using PanelFn = void (*)(const Panel&, const QuantizedX&, int64_t, int64_t, float*, int64_t);

// The visits of a pair of panels (its blocks of rows) share the asking in of Panel::ahead's codes, a line of each
// panel every second quad (a quad of a panel is 32 bytes): an interleaved block of 8 rows asks at the quads j with
// (j & mask) == at; a block of fewer rows given a share asks every line (see pair_rows). AheadShare{}: none.
struct AheadShare {
  int64_t mask = 0, at = -1;

  // Visit `part` of `parts`: the largest power of two of visits that is at most `parts` asks one line in that many
  // each, the others none, so each line is asked once.
  static AheadShare of(int64_t part, int64_t parts) {
    int64_t shared = 1;
    while (2 * shared <= parts) shared *= 2;
    return part < shared ? AheadShare{2 * shared - 1, 2 * part} : AheadShare{};
  }
};

#if defined(__AVX2__)
#define JIDO_INT8_DOT_PASS 1
namespace avx2 {
JIDO_INLINE __m256i dot_u8s8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}
// Pair sums of u * s in int16 lanes (first_pairs), added to (add_pairs), widened to int32 (four products a
// lane) every few quads.
JIDO_INLINE __m256i first_pairs(__m256i u, __m256i s) { return _mm256_maddubs_epi16(u, s); }
// NOTE: in asm, the sum updated in place: from intrinsics GCC copied every accumulator once per quad (and,
// unrolled, summed the products as a tree and spilled it), a third of the panel kernel's instructions.
JIDO_INLINE __m256i add_pairs(__m256i acc, __m256i u, __m256i s) {
  __m256i t;
  asm("vpmaddubsw %2, %3, %1\n\tvpaddw %1, %0, %0" : "+x"(acc), "=&x"(t) : "x"(s), "x"(u));
  return acc;
}
JIDO_INLINE __m256i widen_pairs(__m256i acc) { return _mm256_madd_epi16(acc, _mm256_set1_epi16(1)); }
#include __FILE__
}  // namespace avx2

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512vnni")
namespace vnni {
JIDO_INLINE __m256i dot_u8s8(__m256i u, __m256i s) { return _mm256_dpbusd_epi32(_mm256_setzero_si256(), u, s); }
// vpdpbusd sums four products into int32 lanes without an int16 stage: nothing to widen.
JIDO_INLINE __m256i first_pairs(__m256i u, __m256i s) { return dot_u8s8(u, s); }
JIDO_INLINE __m256i add_pairs(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
// NOTE: in asm, the sum updated in place, as avx2's add_pairs: from the intrinsic GCC 12 copied each of the 8 sums of
// an interleaved block of rows (pair_rows) to another register and back once per quad, and spilled one. The blocks of
// 1-4 rows keep the intrinsic: in asm they ran slower (8 rows as 4 + 4 on the LM head).
JIDO_INLINE __m512i add_quads(__m512i acc, __m512i u, __m512i s) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
  return acc;
}
JIDO_INLINE __m256i widen_pairs(__m256i acc) { return acc; }
#define JIDO_INT8_DOT_VNNI 1
#include __FILE__
#undef JIDO_INT8_DOT_VNNI
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

// The panel kernel for codes of `span` values (max - min): stored unsigned up to 127, their int16 pair sums
// widened every 8, 4, 2 or 1 quads (2 * quads * span * 127 <= 32767); signed beyond.
PanelFn pick_panel(int span, int64_t isa, bool* unsigned_codes) {
  const bool v = isa == kAvx512Vnni;
  *unsigned_codes = span <= 127;
  if (span <= 15) return v ? &vnni::panel_dot<true, 8> : &avx2::panel_dot<true, 8>;
  if (span <= 31) return v ? &vnni::panel_dot<true, 4> : &avx2::panel_dot<true, 4>;
  if (span <= 63) return v ? &vnni::panel_dot<true, 2> : &avx2::panel_dot<true, 2>;
  if (span <= 127) return v ? &vnni::panel_dot<true, 1> : &avx2::panel_dot<true, 1>;
  return v ? &vnni::panel_dot<false, 1> : &avx2::panel_dot<false, 1>;
}

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

// Rows [n0, n0 + 8) of w (rows past N as zeros) as a panel (see Panel) in `codes`, `scales`, `mins`; returns
// the kernel for its span of codes. `rows` is scratch of 8 * kpad bytes.
PanelFn pack_panel(const Weight& w, int64_t n0, int64_t chunk, int64_t num_chunks, int64_t isa, uint8_t* rows,
                   uint8_t* codes, float* scales, float* mins, bool* with_mins, int* span) {
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
  bool unsigned_codes = false;
  *span = hi - lo;
  const PanelFn dot = pick_panel(hi - lo, isa, &unsigned_codes);
  const int shift = unsigned_codes ? lo : 0;
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
  for (int64_t i = 0; i < kPanel; ++i) {
    const bool real = n0 + i < w.N;
    const float* rs = w.scales + (n0 + i) * w.num_groups;
    for (int64_t c = 0; c < num_chunks; ++c) scales[c * kPanel + i] = real ? rs[c * chunk / w.group_size] : 0.f;
    for (int64_t g = 0; *with_mins && g < w.num_groups; ++g) {
      const float m = real && w.mins ? w.mins[(n0 + i) * w.num_groups + g] : 0.f;
      // w = s * q + m = s * (q - shift) + (m + s * shift)
      mins[g * kPanel + i] = real ? m + rs[g] * static_cast<float>(shift) : 0.f;
    }
  }
  return dot;
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

#if defined(__AVX2__)
Weight make_weight(const at::Tensor& data, const at::Tensor& scales, const c10::optional<at::Tensor>& mins,
                   int64_t group_size, int64_t bits, int64_t K) {
  const int64_t nb = (K + kBlock - 1) / kBlock, num_groups = scales.size(1);
  return Weight{static_cast<const uint8_t*>(data.data_ptr()), scales.data_ptr<float>(),
                mins.has_value() ? mins->data_ptr<float>() : nullptr, data.size(0), K,
                std::min(group_size, K), bits, data.size(1), num_groups, nb, group_size == 16 && K > 16};
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

// Under VNNI, the kind of pair a panel's kernel joins (vnni::pair_dot): signed codes, or unsigned codes of any
// span (vpdpbusd sums their products in int32, with no int16 step to widen); 0: none (not VNNI).
inline int pair_kind(PanelFn dot) {
  if (dot == &vnni::panel_dot<false, 1>) return 1;
  if (dot == &vnni::panel_dot<true, 8> || dot == &vnni::panel_dot<true, 4> || dot == &vnni::panel_dot<true, 2> ||
      dot == &vnni::panel_dot<true, 1>)
    return 2;
  return 0;
}

// Whether panels i and i + 1 of a set run as one pair (vnni::pair_dot): both signed codes or both unsigned under
// VNNI, both whole (`left` outputs from panel i's first on), both with a mins' term or neither. A panel left
// unpaired keeps its own kernel: the integer sums, and so the outputs, are the same.
inline bool pairs_with_next(const PanelFn* dot, const Panel* panel, int64_t i, int64_t count, int64_t left) {
  const int kind = pair_kind(dot[i]);
  return i + 1 < count && left >= 2 * kPanel && kind != 0 && pair_kind(dot[i + 1]) == kind &&
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
struct ArgmaxParts {
  const float* bias;
  std::mutex lock;
  std::vector<std::vector<RowMax>> parts;
};

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
void sweep_panels(int64_t N, const QuantizedX& x, float* out, int64_t scratch_bytes, GetPanel get,
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
          if (pairs_with_next(dot, panel, i, count, N - n0)) {
            // Where x's rows fit in half of L1 (kPairAllRowsBytes), a pair runs every block of rows of x when the
            // first block reaches it (the later blocks find it done): its codes come from memory once and stay in
            // L1.
            const int64_t m_end = all_rows ? (m == 0 ? x.M : m) : m + rows_here;
            for (int64_t mm = m; mm < m_end; mm += step)
              vnni::pair_dot(pair_kind(dot[i]) == 2, panel[i], panel[i + 1], x, mm, std::min(step, x.M - mm),
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
void panels(const Weight& w, const QuantizedX& x, int64_t x_block, int64_t isa, float* out) {
  const int64_t kpad = w.nb * kBlock, chunk = panel_chunk(w, x_block);
  const int64_t num_chunks = (w.K + chunk - 1) / chunk;
  // scratch: one panel's rows, then per panel of the set its codes, scales and mins
  const int64_t codes_bytes = kPanel * kpad, scales_bytes = num_chunks * kPanel * 4, mins_bytes = w.num_groups * kPanel * 4;
  const int64_t per_panel = codes_bytes + scales_bytes + mins_bytes;
  sweep_panels(w.N, x, out, codes_bytes + kPanelGroup * per_panel,
               [&](uint8_t* scratch, int64_t p, int64_t i, int64_t, Panel* panel) {
                 uint8_t* pc = scratch + codes_bytes + i * per_panel;
                 float* ps = reinterpret_cast<float*>(pc + codes_bytes);
                 float* pm = reinterpret_cast<float*>(pc + codes_bytes + scales_bytes);
                 bool with_mins = false;
                 int span = 0;
                 const PanelFn dot = pack_panel(w, p * kPanel, chunk, num_chunks, isa, scratch, pc, ps, pm, &with_mins,
                                                &span);
                 *panel = Panel{pc, ps, with_mins ? pm : nullptr, kpad / 4, chunk / 4, num_chunks, w.num_groups};
                 return dot;
               });
}

// Every panel of w packed once, as `panels` packs them per call: codes [panels, 8 * kpad], scales [panels,
// chunks * 8], mins [panels, groups * 8] (empty when no panel has a mins' term) and per panel its span of codes
// and whether it has a mins' term ([panels, 2]). Decode and verification steps of a few rows spent most of the
// LM head's time packing (the head is 168 M codes); packed once, the panel kernel serves them too.
std::vector<at::Tensor> pack_all_panels(const Weight& w, int64_t x_block, int64_t isa) {
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
      pack_panel(w, p * kPanel, chunk, num_chunks, isa, rows.data(), codes.data_ptr<uint8_t>() + p * kPanel * kpad,
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
                      const at::Tensor& meta, const QuantizedX& x, int64_t x_block, int64_t isa, float* out,
                      ArgmaxParts* argmax = nullptr) {
  check_panels(w, x_block, kPanel, codes, scales, mins, meta);
  const int64_t kpad = w.nb * kBlock, chunk = panel_chunk(w, x_block), num_chunks = (w.K + chunk - 1) / chunk;
  const int32_t* mp = meta.data_ptr<int32_t>();
  const uint8_t* cp = codes.data_ptr<uint8_t>();
  const float* sp = scales.data_ptr<float>();
  const float* mnp = mins.numel() > 0 ? mins.data_ptr<float>() : nullptr;
  const int64_t num_panels = codes.size(0);
  sweep_panels(w.N, x, out, 0, [&](uint8_t*, int64_t p, int64_t, int64_t ahead, Panel* panel) {
    bool unsigned_codes = false;
    const PanelFn dot = pick_panel(mp[2 * p], isa, &unsigned_codes);
    *panel = Panel{cp + p * kPanel * kpad, sp + p * num_chunks * kPanel,
                   mp[2 * p + 1] ? mnp + p * w.num_groups * kPanel : nullptr, kpad / 4, chunk / 4, num_chunks,
                   w.num_groups, p + ahead < num_panels ? cp + (p + ahead) * kPanel * kpad : nullptr};
    return dot;
  }, argmax);
}

// x [M, w.K] rounded for w's prepacked vector panels (panel_linear, panel_argmax), after checking what they share.
RoundedX round_for_panels(const at::Tensor& x, const Weight& w, int64_t isa, int64_t x_block) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.K, "x must be [M, ", w.K, "]");
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  TORCH_CHECK(isa_supported(isa), "this CPU does not run the int8 dot kernel for isa ", isa);
  return round_x(x.to(at::kFloat).contiguous(), w.group_size, x_block == 0, false, isa == kAvx512Vnni);
}

// AMX panels: steps of a few rows (decode batches, verify steps) on the tile units of CPUs with AMX-INT8. A panel
// holds 16 weight rows as an AMX B tile takes them: codes [quads][16][4] (the two 8-row panels of pack_panel side
// by side, so their codes, shifts and mins are the vector kernels'), scales [chunks][16], mins [groups][16]. Each
// chunk of columns is one tile multiply of up to 16 rows of x (A: [rows][chunk] int8) by the panel (B) into int32
// sums (C), stored and scaled in 16-lane vectors. Signed and shifted codes both fit int8 (shifted ones are 0..127),
// so every panel runs as int8 x int8 (tdpbssd). The integer sums are exact and each output's float operations are
// panel_rows' in the same order, so the outputs are the vector panel kernels' bits.
constexpr int64_t kAmxPanel = 16;  // weight rows per AMX panel: a B tile's 16 int32 columns
constexpr int64_t kAmxRows = 16;   // rows of x per A tile

namespace amx {
void narrow_codes(const uint8_t* codes, int64_t units, int bits, uint8_t* out);

struct Panels {
  const int8_t* codes;  // [panels][quads][16][4], or narrow (bits < 8): per panel kpad * 16 / 128 units
  const float* scales;  // [panels][chunks][16]
  const float* mins;    // [panels][groups][16]; nullptr: no panel has a mins' term
  const int32_t* meta;  // [panels][2]: the wider span of codes of its halves, whether it has a mins' term
  int64_t N, kpad, chunk, num_chunks, num_groups;
  int bits;  // per code: 8 (bytes), or 4-6 (narrow)
  int64_t panel_bytes() const { return panel_code_bytes(kAmxPanel, kpad, bits); }
};
}  // namespace amx

// Columns of x per tile multiply: a chunk of 16 or 32, or for longer chunks (x and w scaled per row, or groups of
// 64 and more per token) 64 where the chunks and the padded row divide by it, else 32.
inline int64_t amx_sub_k(int64_t chunk, int64_t kpad) {
  if (chunk <= 32) return chunk;
  return chunk % 64 == 0 && kpad % 64 == 0 ? 64 : 32;
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
        pack_panel(w, p * kAmxPanel + h * kPanel, chunk, num_chunks, kAvx512Vnni, rows.data(),
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
    at::Tensor narrow = at::empty({num_panels, panel_code_bytes(kAmxPanel, kpad, bits)}, codes.options());
    at::parallel_for(0, num_panels, 64, [&](int64_t p0, int64_t p1) {
      amx::narrow_codes(codes.data_ptr<uint8_t>() + p0 * kAmxPanel * kpad, (p1 - p0) * units, bits,
                        narrow.data_ptr<uint8_t>() + p0 * panel_code_bytes(kAmxPanel, kpad, bits));
    });
    codes = narrow;
  }
  return {codes, scales, any_mins ? mins : at::empty({0}, floats), meta};
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-int8")
namespace amx {
// Tile registers: a panel's chunks go round four banks of sums (C: tiles 0-3; x in A 4 / 5 and codes in B 6 / 7
// alternately), issued three chunks ahead of the one being scaled, so the tile units multiply while the vector
// units scale and the codes stream in. Four banks beat one and two, and beat making every chunk's sums of a panel
// first and scaling after, on the LM head at 2 and 16 rows (benchmarks/results/amx_panels-2026-12-04-amx-xeon.md).
// (GCC's tile intrinsics paste the tile argument into the instruction's text: each bank's registers are literals,
// picked by `if constexpr`.)
template <int Bank>
JIDO_INLINE void zero_sums() {
  if constexpr (Bank == 0) _tile_zero(0);
  else if constexpr (Bank == 1) _tile_zero(1);
  else if constexpr (Bank == 2) _tile_zero(2);
  else _tile_zero(3);
}
template <int Bank>
JIDO_INLINE void multiply(const int8_t* x, int64_t ldx, const int8_t* codes) {
  if constexpr (Bank % 2 == 0) {
    _tile_loadd(4, x, ldx);
    _tile_loadd(6, codes, 64);
  } else {
    _tile_loadd(5, x, ldx);
    _tile_loadd(7, codes, 64);
  }
  if constexpr (Bank == 0) _tile_dpbssd(0, 4, 6);
  else if constexpr (Bank == 1) _tile_dpbssd(1, 5, 7);
  else if constexpr (Bank == 2) _tile_dpbssd(2, 4, 6);
  else _tile_dpbssd(3, 5, 7);
}
template <int Bank>
JIDO_INLINE void store_sums(int32_t* sums) {
  if constexpr (Bank == 0) _tile_stored(0, sums, 64);
  else if constexpr (Bank == 1) _tile_stored(1, sums, 64);
  else if constexpr (Bank == 2) _tile_stored(2, sums, 64);
  else _tile_stored(3, sums, 64);
}

struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// This thread's tiles for `rows` rows of x and multiplies of `sub` columns.
inline void configure(int64_t rows, int64_t sub) {
  TileConfig cfg;
  for (int bank = 0; bank < 4; ++bank) cfg.rows[bank] = rows, cfg.colsb[bank] = 64;
  for (int i = 0; i < 2; ++i) {
    cfg.rows[4 + i] = rows, cfg.colsb[4 + i] = sub;
    cfg.rows[6 + i] = sub / 4, cfg.colsb[6 + i] = 64;
  }
  _tile_loadconfig(&cfg);
}

// `units` units of 128 code bytes (each code 0..2^bits - 1 where it counts: past K and N any bits do, x and the
// outputs are zero or unused there) in the narrow form described at narrow_unit_bytes.
void narrow_codes(const uint8_t* codes, int64_t units, int bits, uint8_t* out) {
  const __m512i keep = _mm512_set1_epi8(static_cast<char>((1 << bits) - 1)), low = _mm512_set1_epi8(0x0f);
  for (int64_t u = 0; u < units; ++u, codes += kNarrowUnit, out += narrow_unit_bytes(bits)) {
    const __m512i a = _mm512_and_si512(_mm512_loadu_si512(codes), keep);
    const __m512i b = _mm512_and_si512(_mm512_loadu_si512(codes + 64), keep);
    _mm512_storeu_si512(out, _mm512_or_si512(_mm512_and_si512(a, low),
                                             _mm512_slli_epi16(_mm512_and_si512(b, low), 4)));
    for (int j = 0; j < bits - 4; ++j) {
      const __m512i bit = _mm512_set1_epi8(static_cast<char>(1 << (4 + j)));
      const uint64_t masks[2] = {_cvtmask64_u64(_mm512_test_epi8_mask(a, bit)),
                                 _cvtmask64_u64(_mm512_test_epi8_mask(b, bit))};
      std::memcpy(out + 64 + 16 * j, masks, sizeof(masks));
    }
  }
}

// The inverse of narrow_codes: `units` units back into 128 code bytes each, at `out` (64-byte aligned).
template <int Bits>
JIDO_INLINE void widen_codes(const uint8_t* narrow, int64_t units, int8_t* out) {
  const __m512i low = _mm512_set1_epi8(0x0f);
  for (int64_t u = 0; u < units; ++u, narrow += 64 + 16 * (Bits - 4), out += kNarrowUnit) {
    const __m512i v = _mm512_loadu_si512(narrow);
    __m512i a = _mm512_and_si512(v, low), b = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
#pragma GCC unroll 2
    for (int j = 0; j < Bits - 4; ++j) {
      const __m512i bit = _mm512_set1_epi8(static_cast<char>(1 << (4 + j)));
      uint64_t masks[2];
      std::memcpy(masks, narrow + 64 + 16 * j, sizeof(masks));
      a = _mm512_or_si512(a, _mm512_maskz_mov_epi8(_cvtu64_mask64(masks[0]), bit));
      b = _mm512_or_si512(b, _mm512_maskz_mov_epi8(_cvtu64_mask64(masks[1]), bit));
    }
    _mm512_store_si512(out, a);
    _mm512_store_si512(out + 64, b);
  }
}

// One panel against one block of rows of x.
struct Block {
  const Panels& w;
  const QuantizedX& x;
  const int8_t* codes;  // the panel's (narrow or bytes: w.bits)
  const int8_t* xq;     // the block's first row
  int64_t m0, sub;
  int8_t* widened;      // narrow codes: per bank, one multiply's codes as bytes (sub * 16, 64-byte aligned)
};

// How far ahead of a chunk's codes the same bytes are asked into L2 (past a panel's end: the next panel's, which
// this thread reads next, or beyond its panels, where a prefetch does not fault). Tile loads alone left the stream
// from memory short of the hardware's; 4 KiB did best against none, 2, 6 and 8 KiB on the LM head and the layers
// (benchmarks/results/amx_panels-2026-12-04-amx-xeon.md).
constexpr int64_t kPrefetchAhead = 4096;

// The codes of columns [k, k + sub) of the panel, narrow, widened into `out`.
JIDO_INLINE void widen_multiply_codes(const Block& b, int64_t k, int8_t* out) {
  const uint8_t* narrow = reinterpret_cast<const uint8_t*>(b.codes) +
                          k * kAmxPanel / kNarrowUnit * narrow_unit_bytes(b.w.bits);
  const int64_t units = b.sub * kAmxPanel / kNarrowUnit;
  if (b.w.bits == 4) widen_codes<4>(narrow, units, out);
  else if (b.w.bits == 5) widen_codes<5>(narrow, units, out);
  else widen_codes<6>(narrow, units, out);
}

// Whether narrow codes are widened a round of banks ahead (see chunk_products): chunks of one multiply each.
inline bool widens_ahead(const Block& b) { return b.w.bits < 8 && b.w.chunk == b.sub; }

// Chunk c's tile multiplies into bank Bank's sums. Narrow codes go through the bank's buffer: the tile units load
// memory, not vector registers. Where a chunk is one multiply, its buffer was filled four chunks earlier, and is
// refilled here for chunk c + 4: a tile load right behind the stores that widened its codes waited for them to reach
// L1.
template <int Bank>
JIDO_INLINE void chunk_products(const Block& b, int64_t c) {
  const int64_t k0 = c * b.w.chunk, k1 = std::min(k0 + b.w.chunk, b.w.kpad), ldx = b.x.nb * kBlock;
  const int64_t unit = narrow_unit_bytes(b.w.bits);  // bytes per 128 codes: the stream is unit / 128 as long
  const char* ahead = reinterpret_cast<const char*>(b.codes) + k0 * kAmxPanel / kNarrowUnit * unit +
                      kPrefetchAhead * unit / kNarrowUnit;
  for (int64_t i = 0; i < (k1 - k0) * kAmxPanel / kNarrowUnit * unit; i += 64) _mm_prefetch(ahead + i, _MM_HINT_T1);
  if (b.w.bits == 8) {
    for (int64_t k = k0; k < k1; k += b.sub) multiply<Bank>(b.xq + k, ldx, b.codes + k * kAmxPanel);
    return;
  }
  int8_t* widened = b.widened + Bank * kAmxPanel * 64;
  if (widens_ahead(b)) {
    multiply<Bank>(b.xq + k0, ldx, widened);
    if (c + 4 < b.w.num_chunks) widen_multiply_codes(b, k0 + 4 * b.sub, widened);
    return;
  }
  for (int64_t k = k0; k < k1; k += b.sub) {
    widen_multiply_codes(b, k, widened);
    multiply<Bank>(b.xq + k, ldx, widened);
  }
}

// Chunk c's sums from bank Bank (which is zeroed again), scaled into acc: rows r < R.
template <int R, int Bank>
JIDO_INLINE void scale_chunk(const Block& b, const float* scales, int64_t c, int32_t* sums, __m512* acc) {
  store_sums<Bank>(sums);
  zero_sums<Bank>();
  const __m512 ws = _mm512_loadu_ps(scales + c * kAmxPanel);
  const float* dx = b.x.d + b.m0 * b.x.nb + c * b.w.chunk / kBlock;  // per token: every block holds the row's scale
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    const __m512 s = _mm512_cvtepi32_ps(_mm512_load_si512(sums + r * kAmxPanel));
    acc[r] = _mm512_fmadd_ps(s, _mm512_mul_ps(ws, _mm512_set1_ps(dx[r * b.x.nb])), acc[r]);
  }
}

// One row's largest output so far over the panels a thread ran (greedy tokens, see panel_argmax): per lane of the
// 16 a panel's outputs fill, the largest value and its column (the first of equals: columns come in order), and the
// first NaN's column (-1: none yet).
struct RowBest {
  float value[kAmxPanel];
  int32_t column[kAmxPanel];
  int64_t first_nan;
};

inline void reset(RowBest* best) {
  std::fill(best->value, best->value + kAmxPanel, -std::numeric_limits<float>::infinity());
  std::fill(best->column, best->column + kAmxPanel, -1);
  best->first_nan = -1;
}

// best's lanes take the outputs v of columns n0.. (the first `mask` lanes) that exceed them.
inline void update(RowBest* best, __m512 v, __mmask16 mask, int64_t n0) {
  const __m512 value = _mm512_loadu_ps(best->value);
  const __mmask16 larger = _mm512_mask_cmp_ps_mask(mask, v, value, _CMP_GT_OQ);
  if (larger) {
    const __m512i columns = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(n0)),
                                             _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    _mm512_storeu_ps(best->value, _mm512_mask_mov_ps(value, larger, v));
    _mm512_storeu_si512(best->column, _mm512_mask_mov_epi32(_mm512_loadu_si512(best->column), larger, columns));
  }
  const __mmask16 nan = _mm512_mask_cmp_ps_mask(mask, v, v, _CMP_UNORD_Q);
  if (nan && best->first_nan < 0) best->first_nan = n0 + __builtin_ctz(nan);
}

// Where the outputs go: float32, or bf16 (rounded to nearest even, as torch's .to(torch.bfloat16)), with the bias
// (float32 [N], or nullptr) added first, as the vector kernels' callers add it to their float32 outputs; or, with
// `best` (a RowBest per row of x), nowhere: each row's running maximum instead.
struct Out {
  void* data;
  bool bf16;
  const float* bias;
  int64_t ld;
  RowBest* best = nullptr;
};

// Rows [m0, m0 + R) of x against panel p: out rows m0.. at columns n0 = 16 p.. (the first `width`). The tiles may hold
// more rows (zeros past the step's last): only R are scaled.
template <int R>
void panel_block(const Panels& w, int64_t p, const QuantizedX& x, int64_t m0, int64_t sub, const Out& out,
                 int64_t width) {
  alignas(64) int8_t widened[4 * kAmxPanel * 64];
  const Block b{w, x, w.codes + p * w.panel_bytes(), x.q + m0 * x.nb * kBlock, m0, sub, widened};
  const float* scales = w.scales + p * w.num_chunks * kAmxPanel;
  alignas(64) int32_t sums[4][kAmxRows * kAmxPanel];
  // Every loop over acc is unrolled, so GCC keeps the R accumulators in registers: with one loop left rolled it kept
  // them on the stack, a load and a store per row and chunk, which slowed the LM head at few rows.
  __m512 acc[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  zero_sums<0>();
  zero_sums<1>();
  zero_sums<2>();
  zero_sums<3>();
  const int64_t n = w.num_chunks;
  for (int64_t c = 0; widens_ahead(b) && c < std::min<int64_t>(n, 4); ++c)  // each bank's first chunk
    widen_multiply_codes(b, c * sub, widened + c * kAmxPanel * 64);
  chunk_products<0>(b, 0);
  if (1 < n) chunk_products<1>(b, 1);
  if (2 < n) chunk_products<2>(b, 2);
  for (int64_t c = 0; c < n; c += 4) {  // the outputs add the chunks up in order
    if (c + 3 < n) chunk_products<3>(b, c + 3);
    scale_chunk<R, 0>(b, scales, c, sums[0], acc);
    if (c + 4 < n) chunk_products<0>(b, c + 4);
    if (c + 1 < n) scale_chunk<R, 1>(b, scales, c + 1, sums[1], acc);
    if (c + 5 < n) chunk_products<1>(b, c + 5);
    if (c + 2 < n) scale_chunk<R, 2>(b, scales, c + 2, sums[2], acc);
    if (c + 6 < n) chunk_products<2>(b, c + 6);
    if (c + 3 < n) scale_chunk<R, 3>(b, scales, c + 3, sums[3], acc);
  }
  if (w.mins != nullptr && w.meta[2 * p + 1]) {
    const float* mins = w.mins + p * w.num_groups * kAmxPanel;
    for (int64_t g = 0; g < w.num_groups; ++g) {
      const __m512 mv = _mm512_loadu_ps(mins + g * kAmxPanel);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_fmadd_ps(mv, _mm512_set1_ps(x.sums[(m0 + r) * x.num_groups + g]), acc[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << width) - 1);
  const int64_t n0 = p * kAmxPanel;
  if (out.bias != nullptr) {
    const __m512 bias = _mm512_maskz_loadu_ps(mask, out.bias + n0);
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) acc[r] = _mm512_add_ps(acc[r], bias);
  }
  if (out.best != nullptr) {
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) update(out.best + m0 + r, acc[r], mask, n0);
  } else if (out.bf16) {
    uint16_t* o = static_cast<uint16_t*>(out.data) + m0 * out.ld + n0;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r)
      _mm256_mask_storeu_epi16(o + r * out.ld, mask, reinterpret_cast<__m256i>(_mm512_cvtneps_pbh(acc[r])));
  } else {
    float* o = static_cast<float*>(out.data) + m0 * out.ld + n0;
#pragma GCC unroll 16
    for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(o + r * out.ld, mask, acc[r]);
  }
}

// Panels [p0, p1) against the first M rows of x, on this thread's tiles. x holds them in blocks of 16 rows, the
// last padded with zero rows, or in one block of fewer.
void run_panels(const Panels& w, const QuantizedX& x, int64_t M, int64_t p0, int64_t p1, const Out& out) {
  using BlockFn = void (*)(const Panels&, int64_t, const QuantizedX&, int64_t, int64_t, const Out&, int64_t);
  static constexpr BlockFn kBlocks[kAmxRows + 1] = {
      nullptr, &panel_block<1>, &panel_block<2>, &panel_block<3>, &panel_block<4>, &panel_block<5>,
      &panel_block<6>, &panel_block<7>, &panel_block<8>, &panel_block<9>, &panel_block<10>, &panel_block<11>,
      &panel_block<12>, &panel_block<13>, &panel_block<14>, &panel_block<15>, &panel_block<16>};
  const int64_t sub = amx_sub_k(w.chunk, w.kpad);
  configure(std::min(M, kAmxRows), sub);
  for (int64_t p = p0; p < p1; ++p) {
    const int64_t n0 = p * kAmxPanel, width = std::min(kAmxPanel, w.N - n0);
    for (int64_t m0 = 0; m0 < M; m0 += kAmxRows)
      kBlocks[std::min(kAmxRows, M - m0)](w, p, x, m0, sub, out, width);
  }
  _tile_release();
}

// ---- int8 GEMM for steps of many rows (w8a8) ----
// x's codes (rounded per token) times per-channel int8 weight codes, exact int32 sums, scaled as scale_sums scales
// torch._int_mm's: out = float(sum) * dx * dw (+ bias). W is packed once into blocks of 32 output columns, each
// [K / 64 steps][2 halves of 16 columns][16 quads of K][16 columns][4]: one tile multiply's B is 1 KiB in a row.
// Per block of 32 rows x 32 columns: four tiles of sums (2 x 2), two of x's codes (A), two of W's (B), so each tile
// loaded feeds two multiplies; a thread takes a range of rows and runs every column block over rows in groups of
// kGemmRowGroup, x loaded by the streaming tile load so that W's block (20 KiB at K 640) stays in L1 for the group.
// A block's sums are scaled and stored while the tiles multiply the next block's (two buffers).
constexpr int64_t kGemmCols = 32;
constexpr int64_t kGemmRowGroup = 256;

// The 32 x 32 sums of rows x[0..32) (row stride ldx) and one packed column block over `steps` steps of 64.
JIDO_INLINE void gemm_block(const int8_t* x, int64_t ldx, const int8_t* w, int64_t steps, int32_t* sums) {
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t s = 0; s < steps; ++s) {
    _tile_stream_loadd(4, x + s * 64, ldx);
    _tile_stream_loadd(5, x + 16 * ldx + s * 64, ldx);
    _tile_loadd(6, w + s * 2048, 64);
    _tile_loadd(7, w + s * 2048 + 1024, 64);
    _tile_dpbssd(0, 4, 6);
    _tile_dpbssd(1, 4, 7);
    _tile_dpbssd(2, 5, 6);
    _tile_dpbssd(3, 5, 7);
  }
  _tile_stored(0, sums, 128);
  _tile_stored(1, sums + 16, 128);
  _tile_stored(2, sums + 16 * 32, 128);
  _tile_stored(3, sums + 16 * 32 + 16, 128);
}

JIDO_INLINE void store16(float* dst, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(dst, m, v); }
JIDO_INLINE void store16(at::BFloat16* dst, __m512 v, __mmask16 m) {
  _mm256_mask_storeu_epi16(dst, m, (__m256i)_mm512_cvtneps_pbh(v));
}

// One block's sums scaled into out: rows [0, rows), columns [0, width) of the block.
struct GemmPending {
  const int32_t* sums = nullptr;
  int64_t rows = 0, width = 0;
  const float *dx = nullptr, *dw = nullptr, *bias = nullptr;
  void* out = nullptr;
};

// A gated block (16 gate columns beside their 16 up columns): rows' act(gate) * up into 16 bf16 outputs, gate and
// up rounded to bf16 first, as the unfused projection's bf16 output is, and then what act_and_mul computes.
JIDO_INLINE void gemm_store_gated(const GemmPending& b, int64_t ldo, jido_gated::Act act) {
  const __mmask16 mask = b.width == 16 ? 0xffff : static_cast<__mmask16>((1u << b.width) - 1);
  const __m512 dw_gate = _mm512_maskz_loadu_ps(mask, b.dw), dw_up = _mm512_maskz_loadu_ps(mask, b.dw + 16);
  const bool with_bias = b.bias != nullptr;
  const __m512 bias_gate = with_bias ? _mm512_maskz_loadu_ps(mask, b.bias) : _mm512_setzero_ps();
  const __m512 bias_up = with_bias ? _mm512_maskz_loadu_ps(mask, b.bias + 16) : _mm512_setzero_ps();
  at::BFloat16* out = static_cast<at::BFloat16*>(b.out);
  auto as_bf16_value = [](__m512 v) {  // v rounded to bf16, back in float32
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(v)), 16));
  };
  for (int64_t r = 0; r < b.rows; ++r) {
    const __m512 dx = _mm512_set1_ps(b.dx[r]);
    __m512 g = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(b.sums + r * 32)), dx), dw_gate);
    __m512 u = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(b.sums + r * 32 + 16)), dx), dw_up);
    if (with_bias) g = _mm512_add_ps(g, bias_gate), u = _mm512_add_ps(u, bias_up);
    _mm256_mask_storeu_epi16(out + r * ldo, mask, (__m256i)jido_gated::act_and_mul16_bf16(as_bf16_value(g),
                                                                                         as_bf16_value(u), act));
  }
}

template <typename Out>
JIDO_INLINE void gemm_store(const GemmPending& b, int64_t ldo) {
  for (int64_t h = 0; h < 2 && h * 16 < b.width; ++h) {
    const int64_t n = std::min<int64_t>(16, b.width - h * 16);
    const __mmask16 mask = n == 16 ? 0xffff : static_cast<__mmask16>((1u << n) - 1);
    const __m512 dw = _mm512_maskz_loadu_ps(mask, b.dw + h * 16);
    const __m512 bias = b.bias != nullptr ? _mm512_maskz_loadu_ps(mask, b.bias + h * 16) : _mm512_setzero_ps();
    Out* out = static_cast<Out*>(b.out) + h * 16;
    for (int64_t r = 0; r < b.rows; ++r) {
      const __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(b.sums + r * 32 + h * 16)),
                                                   _mm512_set1_ps(b.dx[r])), dw);
      store16(out + r * ldo, b.bias != nullptr ? _mm512_add_ps(v, bias) : v, mask);
    }
  }
}

// out = the scaled products (Out float or bf16, N columns), or with act >= 0 (bf16 only) act(gate) * up: W packed gated
// (pack_amx_gemm), N its gate + up columns and out N / 2 wide.
template <typename Out>
void gemm(const int8_t* x, int64_t M, int64_t K, const float* dx, const int8_t* w, const float* dw, const float* bias,
          int64_t N, Out* out, int64_t act) {
  const int64_t out_cols = act >= 0 ? N / 2 : N, per_block = act >= 0 ? 16 : kGemmCols;
  const int64_t steps = K / 64, blocks = (out_cols + per_block - 1) / per_block, groups = (M + 31) / 32;
  const int64_t threads = at::get_num_threads();
  // Rows split between the threads where there are enough; column blocks too where there are not.
  const int64_t row_parts = std::max<int64_t>(1, std::min(threads, groups / 2));
  const int64_t col_parts = std::max<int64_t>(1, threads / row_parts);
  at::parallel_for(0, row_parts * col_parts, 1, [&](int64_t begin, int64_t end) {
    configure(16, 64);
    alignas(64) int32_t sums[2][32 * 32];
    std::vector<int8_t> tail(32 * K);
    GemmPending pending;
    int flip = 0;
    auto store = [&](const GemmPending& b) {
      if constexpr (std::is_same_v<Out, at::BFloat16>) {
        if (act >= 0) return gemm_store_gated(b, out_cols, static_cast<jido_gated::Act>(act));
      }
      gemm_store<Out>(b, out_cols);
    };
    for (int64_t item = begin; item < end; ++item) {
      const int64_t rp = item / col_parts, cp = item % col_parts;
      const int64_t g0 = groups * rp / row_parts, g1 = groups * (rp + 1) / row_parts;
      const int64_t b0 = blocks * cp / col_parts, b1 = blocks * (cp + 1) / col_parts;
      for (int64_t gg = g0; gg < g1; gg += kGemmRowGroup / 32) {
        const int64_t gend = std::min(g1, gg + kGemmRowGroup / 32);
        for (int64_t b = b0; b < b1; ++b) {
          for (int64_t g = gg; g < gend; ++g) {
            const int64_t m0 = g * 32, rows = std::min<int64_t>(32, M - m0);
            const int8_t* xs = x + m0 * K;
            if (rows < 32) {  // the last rows, zero-padded so that the tile loads stay in memory we own
              std::memcpy(tail.data(), xs, rows * K);
              std::memset(tail.data() + rows * K, 0, (32 - rows) * K);
              xs = tail.data();
            }
            gemm_block(xs, K, w + b * steps * 2048, steps, sums[flip]);
            if (pending.sums != nullptr) store(pending);
            pending = GemmPending{sums[flip], rows, std::min(per_block, out_cols - b * per_block), dx + m0,
                                  dw + b * kGemmCols, bias != nullptr ? bias + b * kGemmCols : nullptr,
                                  out + m0 * out_cols + b * per_block};
            flip ^= 1;
          }
        }
      }
    }
    if (pending.sums != nullptr) store(pending);
    _tile_release();
  });
}
}  // namespace amx
#pragma GCC pop_options

// Whether this CPU multiplies int8 tiles (AMX-INT8) and Linux lets this process use their state: asked once, the
// first time (arch_prctl ARCH_REQ_XCOMP_PERM for XTILEDATA; oneDNN asks the same).
bool amx_ready() {
  static const bool ready = [] {
    if (!__builtin_cpu_supports("amx-int8") || !__builtin_cpu_supports("amx-tile") ||
        !__builtin_cpu_supports("avx512bw") || !__builtin_cpu_supports("avx512dq") ||
        !__builtin_cpu_supports("avx512vl") || !__builtin_cpu_supports("avx512bf16"))
      return false;
    return jido_tiles::state_granted();
  }();
  return ready;
}
#else
bool amx_ready() { return false; }
#endif  // __AVX2__

// y = x w^T (+ bias) in x's dtype, x rounded per block of 32 (x_block 32) or per row (x_block 0), by the rows
// kernel or (panels) the panel kernel; see the top of this file.
at::Tensor int8_dot_linear(const at::Tensor& x, const at::Tensor& data, const at::Tensor& scales,
                           const c10::optional<at::Tensor>& mins, int64_t group_size, int64_t bits, int64_t K,
                           const c10::optional<at::Tensor>& bias, int64_t isa, int64_t x_block, bool use_panels) {
#if defined(__AVX2__)
  check_weight(data, scales, mins, group_size, bits, K);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "]");
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  TORCH_CHECK(isa_supported(isa), "this CPU does not run the int8 dot kernel for isa ", isa);
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const Weight w = make_weight(data, scales, mins, group_size, bits, K);
  const RoundedX rx = round_x(xf, w.group_size, x_block == 0, bits == 4 && !use_panels,
                              use_panels && isa == kAvx512Vnni);
  at::Tensor out = at::empty({xf.size(0), w.N}, xf.options());
  float* op = out.data_ptr<float>();
  if (use_panels) {
    panels(w, rx.view, x_block, isa, op);
  } else {
    const RowsFn rows = pick_rows(w, isa);
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
                                             int64_t K, int64_t isa, int64_t x_block) {
#if defined(__AVX2__)
  check_weight(data, scales, mins, group_size, bits, K);
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  TORCH_CHECK(isa_supported(isa), "this CPU does not run the int8 dot kernel for isa ", isa);
  return pack_all_panels(make_weight(data, scales, mins, group_size, bits, K), x_block, isa);
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
  const RoundedX rx = round_for_panels(x, w, isa, x_block);
  at::Tensor out = at::empty({x.size(0), N}, x.options().dtype(at::kFloat));
  prepacked_panels(w, codes, scales, mins, meta, rx.view, x_block, isa, out.data_ptr<float>());
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
                                 int64_t x_block) {
#if defined(__AVX2__)
  const Weight w = packed_shape(N, K, group_size);
  const RoundedX rx = round_for_panels(x, w, isa, x_block);
  const at::Tensor b = bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
  TORCH_CHECK(!b.defined() || b.numel() == N, "bias must have N elements");
  ArgmaxParts argmax{b.defined() ? b.data_ptr<float>() : nullptr};
  prepacked_panels(w, codes, scales, mins, meta, rx.view, x_block, isa, nullptr, &argmax);
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
                                                 int64_t bits, int64_t K, int64_t x_block, bool narrow) {
#if defined(__AVX2__)
  check_weight(data, scales, mins, group_size, bits, K);
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  TORCH_CHECK(amx_ready(), "this CPU (or this process) cannot use AMX-INT8 tiles");
  return pack_all_amx_panels(make_weight(data, scales, mins, group_size, bits, K), x_block, narrow);
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
// amx_panel_argmax share.
template <class Run>
void over_amx_panels(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales, const at::Tensor& mins,
                     const at::Tensor& meta, int64_t N, int64_t K, int64_t group_size,
                     const c10::optional<at::Tensor>& bias, int64_t x_block, Run run) {
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "]");
  TORCH_CHECK(x_block == kBlock || x_block == 0, "x_block must be 32 or 0 (per token), got ", x_block);
  TORCH_CHECK(amx_ready(), "this CPU (or this process) cannot use AMX-INT8 tiles");
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
  // bf16 x gives bf16 outputs, written by the kernel
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  at::Tensor out = at::empty({x.size(0), N}, x.options().dtype(bf16 ? at::kBFloat16 : at::kFloat));
  over_amx_panels(x, codes, scales, mins, meta, N, K, group_size, bias, x_block,
                  [&](const amx::Panels& panels, const QuantizedX& rx, int64_t M, const float* b, int64_t p0,
                      int64_t p1) { amx::run_panels(panels, rx, M, p0, p1, amx::Out{out.data_ptr(), bf16, b, N}); });
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
  const int64_t M = x.size(0);
  std::mutex lock;
  std::vector<std::vector<amx::RowBest>> parts;  // one per range of panels run
  over_amx_panels(x, codes, scales, mins, meta, N, K, group_size, bias, x_block,
                  [&](const amx::Panels& panels, const QuantizedX& rx, int64_t rows, const float* b, int64_t p0,
                      int64_t p1) {
                    std::vector<amx::RowBest> best(rows);
                    for (amx::RowBest& row : best) amx::reset(&row);
                    amx::run_panels(panels, rx, rows, p0, p1, amx::Out{nullptr, false, b, N, best.data()});
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
  TORCH_CHECK(isa_supported(isa), "this CPU does not run the int8 dot kernel for isa ", isa);
  const int64_t nb = K / kBlock, gs = std::min(group_size, K), num_groups = (K + gs - 1) / gs;
  TORCH_CHECK(data.dim() == 2 && data.is_contiguous() && data.scalar_type() == at::kByte &&
                  data.size(1) == nb * kFiveBitBlockBytes, "data must be contiguous uint8 [N, K / 32 * 20]");
  const int64_t N = data.size(0);
  TORCH_CHECK(scales.is_contiguous() && scales.scalar_type() == at::kFloat && scales.numel() == N * num_groups,
              "scales must be contiguous float32 [N, groups]");
  TORCH_CHECK(!mins.has_value() || (mins->is_contiguous() && mins->scalar_type() == at::kFloat &&
                                    mins->numel() == N * num_groups), "mins must be shaped like scales");
  const FiveBitWeight w{data.data_ptr<uint8_t>(), scales.data_ptr<float>(),
                        mins.has_value() ? mins->data_ptr<float>() : nullptr, N, K, gs, num_groups, nb};
  const at::Tensor xf = x.to(at::kFloat).contiguous();
  const RoundedX rx = round_x(xf, gs, x_block == 0, false);
  // Each int32 lane's start: -16 times the sum of x's codes over the lane's four columns.
  std::vector<int32_t> lanes(nb * 8);
  for (int64_t i = 0; i < nb * 8; ++i)
    lanes[i] = -16 * (rx.view.q[4 * i] + rx.view.q[4 * i + 1] + rx.view.q[4 * i + 2] + rx.view.q[4 * i + 3]);
  at::Tensor out = at::empty({1, N}, xf.options());
  float* op = out.data_ptr<float>();
  const auto rows = isa == kAvx512Vnni ? &vnni::five_bit_rows : &avx2::five_bit_rows;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) { rows(w, rx.view, lanes.data(), n0, n1, op); });
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
  TORCH_CHECK(amx_ready(), "this CPU (or this process) cannot use AMX-INT8 tiles");
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
  if (bf16_out)
    amx::gemm(codes.data_ptr<int8_t>(), M, K, x_scales.data_ptr<float>(), packed.data_ptr<int8_t>(),
              dw.data_ptr<float>(), bp, N, out.data_ptr<at::BFloat16>(), act);
  else
    amx::gemm(codes.data_ptr<int8_t>(), M, K, x_scales.data_ptr<float>(), packed.data_ptr<int8_t>(),
              dw.data_ptr<float>(), bp, N, out.data_ptr<float>(), act);
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

bool scale_sums_to_bf16_runs() {
  static const bool runs = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                           __builtin_cpu_supports("avx512vl");
  return runs;
}
#else
bool scale_sums_to_bf16_runs() { return false; }
#endif

// torch._int_mm's sums acc [M, N] scaled back: out = float(acc) * x_scales[m] * w_scales[n] (+ bias), float32; with
// bf16_out (where scale_sums_to_bf16_runs) in bf16 straight away, and with act 0 / 1 (silu / gelu_tanh) the gated
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
  TORCH_CHECK(!bf16_out || scale_sums_to_bf16_runs(), "scale_sums: bf16_out needs AVX-512 BF16");
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
        "int isa, int x_block, bool panels) -> Tensor");
  m.def("pack_panels(Tensor data, Tensor scales, Tensor? mins, int group_size, int bits, int K, int isa, "
        "int x_block) -> Tensor[]");
  m.def("panel_linear(Tensor x, Tensor codes, Tensor scales, Tensor mins, Tensor meta, int N, int K, int group_size, "
        "Tensor? bias, int isa, int x_block) -> Tensor");
  m.def("panel_argmax(Tensor x, Tensor codes, Tensor scales, Tensor mins, Tensor meta, int N, int K, int group_size, "
        "Tensor? bias, int isa, int x_block) -> Tensor");
  m.def("five_bit_linear(Tensor x, Tensor data, Tensor scales, Tensor? mins, int group_size, int K, Tensor? bias, "
        "int isa, int x_block) -> Tensor");
  m.def("quantize_per_token(Tensor x, Tensor? channel_scale=None) -> Tensor[]");
  m.def("scale_sums(Tensor acc, Tensor x_scales, Tensor w_scales, Tensor? bias, bool bf16_out=False, int act=-1) "
        "-> Tensor");
  m.def("scale_sums_to_bf16_runs() -> bool", &jido_int8_dot::scale_sums_to_bf16_runs);
  m.def("pack_amx_panels(Tensor data, Tensor scales, Tensor? mins, int group_size, int bits, int K, int x_block, "
        "bool narrow) -> Tensor[]");
  m.def("amx_panel_linear(Tensor x, Tensor codes, Tensor scales, Tensor mins, Tensor meta, int N, int K, "
        "int group_size, Tensor? bias, int x_block) -> Tensor");
  m.def("amx_panel_argmax(Tensor x, Tensor codes, Tensor scales, Tensor mins, Tensor meta, int N, int K, "
        "int group_size, Tensor? bias, int x_block) -> Tensor");
  m.def("pack_amx_gemm(Tensor codes, bool gated) -> Tensor");
  m.def("amx_gemm(Tensor codes, Tensor x_scales, Tensor packed, Tensor w_scales, Tensor? bias, int N, bool bf16_out, "
        "int act) -> Tensor");
  m.def("supported(int isa) -> bool", &jido_int8_dot::int8_dot_supported);
  m.def("amx_supported() -> bool", &jido_int8_dot::amx_ready);
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

// The mins' term of one weight row, sum_g m[g] * xs[g], summed in 8 lanes: as one scalar chain (a dependent add per
// group) it took a third of a one-row matmul on Q4_K codes; 8 lanes break the chain
// (benchmarks/results/report-2026-12-05-amx-xeon-decode-kernels.md).
JIDO_INLINE float mins_term(const float* m, const float* xs, int64_t groups) {
  __m256 acc = _mm256_setzero_ps();
  int64_t g = 0;
  for (; g + 8 <= groups; g += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(m + g), _mm256_loadu_ps(xs + g), acc);
  float sum = lane_sum(acc);
  // One explicit rounding a group: GCC may contract `sum += m * x` into an FMA in one inlined caller and not in
  // another, and kernels that must agree bit for bit then part by an ulp.
  for (; g < groups; ++g) sum = std::fma(m[g], xs[g], sum);
  return sum;
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
    if (w.mins) sum += mins_term(w.mins + n * w.num_groups, x.sums + (m0 + r) * x.num_groups, w.num_groups);
    out[r] = sum;
  }
}

// acc += one block of codes (at q; as block_dot reads them) . the block of x (xv), scaled by `scale` (w's times x's).
template <int Bits>
JIDO_INLINE __m256 block_fma(const uint8_t* q, __m256i xv, __m256 scale, __m256 acc) {
  const __m256i qv = load_codes<Bits>(q);
  const __m256i p = Bits == 8 ? dot_u8s8(_mm256_sign_epi8(qv, qv), _mm256_sign_epi8(xv, qv)) : dot_u8s8(qv, xv);
  return _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), scale, acc);
}

// out[a], out[b]: the lane sums of rows a and b's accumulators, plus their mins' terms on x's group sums.
JIDO_INLINE void store_two_rows(const float* mins, int64_t num_groups, int64_t a, int64_t b, const QuantizedX& x,
                                __m256 acc_a, __m256 acc_b, float* out) {
  float sum_a = lane_sum(acc_a), sum_b = lane_sum(acc_b);
  if (mins) {
    sum_a += mins_term(mins + a * num_groups, x.sums, num_groups);
    sum_b += mins_term(mins + b * num_groups, x.sums, num_groups);
  }
  out[a] = sum_a, out[b] = sum_b;
}

// Decode (one row of x, whole blocks): weight rows a and b against x in one pass over x's blocks, each output the
// same float operations in the same order as row_dot<1>'s. Faster than one row at a time: x's block and scale are
// loaded once for two rows, and the two FMA chains overlap. a and b must be far apart: with b = a + 1 the two rows'
// blocks alternate in memory and the stream from memory slowed, where two monotonic streams sped it up
// (benchmarks/results/report-2026-12-01-avx2-epyc-decode-kernel.md).
template <int Bits, bool Groups16>
JIDO_INLINE void two_rows_dot(const Weight& w, int64_t a, int64_t b, const QuantizedX& x, float* out) {
  constexpr int64_t kBlockBytes = Bits == 8 ? kBlock : kBlock / 2;
  const uint8_t* qa = w.data + a * w.row_bytes;
  const uint8_t* qb = w.data + b * w.row_bytes;
  const float* sa = w.scales + a * w.num_groups;
  const float* sb = w.scales + b * w.num_groups;
  const int64_t full = w.K / kBlock;
  __m256 acc_a = _mm256_setzero_ps(), acc_b = _mm256_setzero_ps();
  if (Groups16) {
    for (int64_t k = 0; k < full; ++k) {
      const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + k * kBlock));
      const __m256 dx = _mm256_broadcast_ss(x.d + k);
      acc_a = block_fma<Bits>(qa + k * kBlockBytes, xv, _mm256_mul_ps(pair_scales<Bits>(sa + 2 * k), dx), acc_a);
      acc_b = block_fma<Bits>(qb + k * kBlockBytes, xv, _mm256_mul_ps(pair_scales<Bits>(sb + 2 * k), dx), acc_b);
    }
  } else {
    const int64_t per_group = w.group_size >= w.K ? full : w.group_size / kBlock;
    for (int64_t k = 0, g = 0; k < full; ++g) {
      const __m256 wa = _mm256_broadcast_ss(sa + g), wb = _mm256_broadcast_ss(sb + g);
      for (const int64_t end = std::min(full, k + per_group); k < end; ++k) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + k * kBlock));
        const __m256 dx = _mm256_broadcast_ss(x.d + k);
        acc_a = block_fma<Bits>(qa + k * kBlockBytes, xv, _mm256_mul_ps(wa, dx), acc_a);
        acc_b = block_fma<Bits>(qb + k * kBlockBytes, xv, _mm256_mul_ps(wb, dx), acc_b);
      }
    }
  }
  store_two_rows(w.mins, w.num_groups, a, b, x, acc_a, acc_b, out);
}

// 16 in byte 4 * i + b where the fifth bit of that column is set (bit 8 * b + i of `bits`, see FiveBitWeight):
// four instructions, where spreading bit j to byte j took six (a byte shuffle, two masks and a compare).
JIDO_INLINE __m256i fifth_bits(uint32_t bits) {
  const __m256i lanes =
      _mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(bits)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  return _mm256_and_si256(_mm256_slli_epi32(lanes, 4), _mm256_set1_epi8(16));
}

// The 32 codes u of a pair of five-bit blocks (at p, see FiveBitWeight) as bytes in column order: one 32-byte load
// holds both blocks' nibbles.
JIDO_INLINE void load_five_bit_pair(const uint8_t* p, __m256i* first, __m256i* second) {
  const __m256i nibbles = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i low = _mm256_set1_epi8(15);
  uint32_t bits[2];
  std::memcpy(bits, p + 32, sizeof(bits));
  *first = _mm256_or_si256(_mm256_and_si256(nibbles, low), fifth_bits(bits[0]));
  *second = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(nibbles, 4), low), fifth_bits(bits[1]));
}

// The 32 codes u of a last, unpaired five-bit block (at p) as bytes in column order.
JIDO_INLINE __m256i load_five_bit_block(const uint8_t* p) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  const __m256i nibbles = _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(15));
  uint32_t bits;
  std::memcpy(&bits, p + 16, sizeof(bits));
  return _mm256_or_si256(nibbles, fifth_bits(bits));
}

// Decode on five-bit rows a and b, in one pass over x's blocks as two_rows_dot. Each block's u . xq, started
// from -16 times the sums of xq over each int32 lane's four columns (`lanes`, [nb][8]), is q . xq in every lane
// exactly, so each output is the same float operations as two_rows_dot's on the same codes stored in bytes.
JIDO_INLINE void five_bit_two_rows(const FiveBitWeight& w, int64_t a, int64_t b, const QuantizedX& x,
                                   const int32_t* lanes, float* out) {
  const int64_t row_bytes = w.nb * kFiveBitBlockBytes;
  const uint8_t* qa = w.data + a * row_bytes;
  const uint8_t* qb = w.data + b * row_bytes;
  const float* sa = w.scales + a * w.num_groups;
  const float* sb = w.scales + b * w.num_groups;
  const int64_t per_group = w.group_size >= w.K ? w.nb : w.group_size / kBlock;
  __m256 acc_a = _mm256_setzero_ps(), acc_b = _mm256_setzero_ps();
  int64_t g = 0, left_in_group = per_group;
  // block k's codes ua (row a) and ub (row b) into the accumulators, as two_rows_dot's block_fma
  const auto block = [&](int64_t k, __m256i ua, __m256i ub) {
    const __m256 wa = _mm256_broadcast_ss(sa + g), wb = _mm256_broadcast_ss(sb + g);
    const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q + k * kBlock));
    const __m256i start = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(lanes + k * 8));
    const __m256 dx = _mm256_broadcast_ss(x.d + k);
    const __m256i pa = _mm256_add_epi32(start, dot_u8s8(ua, xv));
    const __m256i pb = _mm256_add_epi32(start, dot_u8s8(ub, xv));
    acc_a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pa), _mm256_mul_ps(wa, dx), acc_a);
    acc_b = _mm256_fmadd_ps(_mm256_cvtepi32_ps(pb), _mm256_mul_ps(wb, dx), acc_b);
    if (--left_in_group == 0) ++g, left_in_group = per_group;
  };
  int64_t k = 0;
  for (; k + 2 <= w.nb; k += 2) {
    __m256i ua0, ua1, ub0, ub1;
    load_five_bit_pair(qa + k * kFiveBitBlockBytes, &ua0, &ua1);
    load_five_bit_pair(qb + k * kFiveBitBlockBytes, &ub0, &ub1);
    block(k, ua0, ub0);
    block(k + 1, ua1, ub1);
  }
  if (k < w.nb)
    block(k, load_five_bit_block(qa + k * kFiveBitBlockBytes), load_five_bit_block(qb + k * kFiveBitBlockBytes));
  store_two_rows(w.mins, w.num_groups, a, b, x, acc_a, acc_b, out);
}

// Output columns [n0, n1) of one row of x on five-bit rows: rows n and n + half together (two monotonic streams,
// see two_rows_dot); an odd last row pairs with itself.
void five_bit_rows(const FiveBitWeight& w, const QuantizedX& x, const int32_t* lanes, int64_t n0, int64_t n1,
                   float* out) {
  const int64_t half = (n1 - n0) / 2, row_bytes = w.nb * kFiveBitBlockBytes;
  for (int64_t n = n0; n < n0 + half; ++n) {
    for (const int64_t r : {n + kPrefetchRows, n + half + kPrefetchRows}) {
      if (r >= w.N) continue;
      const char* bytes = reinterpret_cast<const char*>(w.data + r * row_bytes);
      for (int64_t i = 0; i < row_bytes; i += 64) __builtin_prefetch(bytes + i);
    }
    five_bit_two_rows(w, n, n + half, x, lanes, out);
  }
  if ((n1 - n0) % 2) five_bit_two_rows(w, n1 - 1, n1 - 1, x, lanes, out);
}

// Output columns [n0, n1) of out [M, N], x's rows in blocks of 4, 2 and 1 for each weight row (read from L1
// again after the first block).
template <int Bits, bool Groups16>
void rows_dot(const Weight& w, const QuantizedX& x, int64_t n0, int64_t n1, float* out) {
  // Decode: rows n and n + half together, as two monotonic streams (see two_rows_dot).
  const int64_t half = x.M == 1 && w.K % kBlock == 0 ? (n1 - n0) / 2 : 0;
  for (int64_t n = n0; n < n0 + half; ++n) {
    prefetch_row(w, n + kPrefetchRows);
    prefetch_row(w, n + half + kPrefetchRows);
    two_rows_dot<Bits, Groups16>(w, n, n + half, x, out);
  }
  float part[4];
  for (int64_t n = n0 + 2 * half; n < n1; ++n) {
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

// Column quad j of x row xr in every int32 lane, with the signs of the panel's codes q where they are signed (the
// codes then enter as |q|).
template <bool Unsigned>
JIDO_INLINE __m256i x_quad(const int8_t* xr, int64_t j, __m256i q) {
  int32_t quad;
  std::memcpy(&quad, xr + 4 * j, sizeof(quad));
  const __m256i xv = _mm256_set1_epi32(quad);
  return Unsigned ? xv : _mm256_sign_epi8(xv, q);
}

// pairs[r] (= with First, else +=) the products of column quad j of a panel's codes and of x rows xr[r].
template <int R, bool Unsigned, bool First>
JIDO_INLINE void quad_pairs(const uint8_t* codes, const int8_t* const* xr, int64_t j, __m256i* pairs) {
  const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + j * kPanel * 4));
  const __m256i mag = Unsigned ? q : _mm256_sign_epi8(q, q);
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r) {
    const __m256i xv = x_quad<Unsigned>(xr[r], j, q);
    pairs[r] = First ? first_pairs(mag, xv) : add_pairs(pairs[r], mag, xv);
  }
}

// R rows of x (from m0) against one panel: out[r * ldo + i] for the panel's 8 rows i. Each chunk of columns
// sums into int32 lanes (int16 pair sums widened every Widen quads), then is scaled by the chunk's weight
// scales times the row's x scale; the mins' term follows, over x's group sums.
template <int R, bool Unsigned, int Widen>
JIDO_INLINE void panel_rows(const Panel& p, const QuantizedX& x, int64_t m0, float* out, int64_t ldo) {
  // Past 4 rows AVX2's 16 registers no longer hold every row's output, pair sums and chunk sum: the outputs then
  // add up in `out` (the same float operations, so the same bits), and each row's pair sums are widened as soon
  // as they are made (blocks of more than 4 rows run only where pairs widen every quad: see panel_dot).
  constexpr bool kAccInOut = R > 4;
  __m256 acc[kAccInOut ? 1 : R];
  const int8_t* xr[R];
  for (int r = 0; r < R; ++r) {
    xr[r] = x.q + (m0 + r) * x.nb * kBlock;
    if (kAccInOut) _mm256_storeu_ps(out + r * ldo, _mm256_setzero_ps());
    else acc[r] = _mm256_setzero_ps();
  }
  const auto add_to = [&](int r, __m256 scale, __m256 term) {
    if (kAccInOut) _mm256_storeu_ps(out + r * ldo, _mm256_fmadd_ps(term, scale, _mm256_loadu_ps(out + r * ldo)));
    else acc[kAccInOut ? 0 : r] = _mm256_fmadd_ps(term, scale, acc[kAccInOut ? 0 : r]);
  };
  for (int64_t c = 0; c < p.num_chunks; ++c) {
    const int64_t j_end = std::min(p.quads, (c + 1) * p.chunk_quads);
    __m256i sum[R];
    for (int r = 0; r < R; ++r) sum[r] = _mm256_setzero_si256();
    for (int64_t j0 = c * p.chunk_quads; j0 < j_end; j0 += Widen) {
      if (kAccInOut && Widen == 1) {  // each row's pair sums widened as soon as they are made
        const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p.codes + j0 * kPanel * 4));
        const __m256i mag = Unsigned ? q : _mm256_sign_epi8(q, q);
#pragma GCC unroll 8
        for (int r = 0; r < R; ++r)
          sum[r] = _mm256_add_epi32(sum[r], widen_pairs(first_pairs(mag, x_quad<Unsigned>(xr[r], j0, q))));
      } else {
        __m256i pairs[R];
        quad_pairs<R, Unsigned, true>(p.codes, xr, j0, pairs);
#pragma GCC unroll 8
        for (int t = 1; t < Widen; ++t) quad_pairs<R, Unsigned, false>(p.codes, xr, j0 + t, pairs);
        for (int r = 0; r < R; ++r) sum[r] = _mm256_add_epi32(sum[r], widen_pairs(pairs[r]));
      }
    }
    const __m256 ws = _mm256_loadu_ps(p.scales + c * kPanel);
    const int64_t xb = (c * p.chunk_quads * 4) / kBlock;  // per token: every block holds the row's scale
    for (int r = 0; r < R; ++r)
      add_to(r, _mm256_mul_ps(ws, _mm256_broadcast_ss(x.d + (m0 + r) * x.nb + xb)), _mm256_cvtepi32_ps(sum[r]));
  }
  if (p.mins) {
    for (int64_t g = 0; g < p.num_groups; ++g) {
      const __m256 mins = _mm256_loadu_ps(p.mins + g * kPanel);
      for (int r = 0; r < R; ++r) add_to(r, _mm256_broadcast_ss(x.sums + (m0 + r) * x.num_groups + g), mins);
    }
  }
  if (!kAccInOut)
    for (int r = 0; r < R; ++r) _mm256_storeu_ps(out + r * ldo, acc[r]);
}

// rows of x from 0 in blocks of 4, 2 and 1 (with `wide`, 5 to 7 rows in one block): run(block, first row) with
// the block size as a constant. On the LM head's signed codes (AVX2 EPYC) 5 rows ran faster in one block than as
// 4 + 1, while 8 rows stay 4 + 4, which was no slower than one block of 8.
template <class Run>
JIDO_INLINE void row_blocks(int64_t rows, Run run, bool wide = false) {
  switch (wide ? rows : 0) {
    case 7: return run(std::integral_constant<int, 7>{}, 0);
    case 6: return run(std::integral_constant<int, 6>{}, 0);
    case 5: return run(std::integral_constant<int, 5>{}, 0);
    default: break;
  }
  for (int64_t r = 0; r < rows;) {
    const int64_t left = rows - r;
    if (left >= 4) run(std::integral_constant<int, 4>{}, r), r += 4;
    else if (left >= 2) run(std::integral_constant<int, 2>{}, r), r += 2;
    else run(std::integral_constant<int, 1>{}, r), r += 1;
  }
}

template <bool Unsigned, int Widen>
void panel_dot(const Panel& p, const QuantizedX& x, int64_t m0, int64_t rows, float* out, int64_t ldo) {
  // a chunk's quads are a whole number of widening steps: a chunk of 16 columns is 4 quads
  constexpr int kSmall = Widen < 4 ? Widen : 4;
  const bool small = p.chunk_quads < Widen;
  row_blocks(rows, [&](auto block, int64_t r) {
    constexpr int R = decltype(block)::value;
    float* o = out + r * ldo;
    small ? panel_rows<R, Unsigned, kSmall>(p, x, m0 + r, o, ldo) : panel_rows<R, Unsigned, Widen>(p, x, m0 + r, o, ldo);
  }, Widen == 1);
}

#ifdef JIDO_INT8_DOT_VNNI
// a's 8 floats, then b's (AVX-512F only: the DQ insert is not in the target).
JIDO_INLINE __m512 join_ps(__m256 a, __m256 b) {
  return _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castpd256_pd512(_mm256_castps_pd(a)), _mm256_castps_pd(b), 1));
}

// Two panels of signed codes (a span over 127, e.g. Q8_0: the LM head) side by side in 512-bit vectors, under VNNI.
// vpdpbusd multiplies unsigned bytes by signed ones, so x goes in offset by 128 (QuantizedX::qu, 1..255) against
// the codes as stored, and 128 times each chunk's code sums (one more vpdpbusd, of ones against the codes) comes
// off in int32: exactly the sums panel_rows<R, false, 1> gets from |q| against x with q's signs, without its two
// sign instructions per row and quad, and one broadcast of x serves 16 outputs (panel a's 8, then b's 8, written
// to out[0..16)). Each lane's float operations are panel_rows' in the same order, so the outputs are its bits.
// Interleaved (R 8, m0 a multiple of 8): x's quads from its interleaved copy (QuantizedX::qu8), all 8 rows' from
// one pointer, where 8 row pointers left too few registers for the loop (16 and 32 rows of the LM head ran slower
// in blocks of 8 than of 4 that way; from one pointer, faster on a Zen 4:
// benchmarks/results/report-2026-12-06-zen4-gguf-w8a8.md).
// Unsigned: two panels of unsigned codes (Q4_K, Q5_0 shifted, Q6_K: the layers' codes), which are vpdpbusd's
// unsigned operand as stored, against x as it is (QuantizedX::q, q8), with no offset to take off; their mins' term
// follows as panel_rows' does. Against panel_rows<R, true, Widen>: the same int32 sums (it widens int16 pair sums
// in time; vpdpbusd has none), the same float operations, so the same bits.
template <int R, bool Interleaved = false, bool Unsigned = false>
JIDO_INLINE void pair_rows(const Panel& a, const Panel& b, const QuantizedX& x, int64_t m0, float* out, int64_t ldo,
                           AheadShare share) {
  const uint8_t* ahead_a = share.at >= 0 && b.ahead != nullptr ? a.ahead : nullptr;
  const uint8_t* ahead_b = ahead_a != nullptr ? b.ahead : nullptr;
  static_assert(!Interleaved || R == 8, "the interleaved copy holds rows in groups of 8");
  __m512 acc[R];
  const uint8_t* xr[Interleaved ? 1 : R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const uint8_t* xq = Unsigned ? reinterpret_cast<const uint8_t*>(Interleaved ? x.q8 : x.q)
                               : Interleaved ? x.qu8 : x.qu;
  if constexpr (Interleaved) {
    xr[0] = xq + (m0 / 8) * x.nb * kBlock * 8;
  } else {
    for (int r = 0; r < R; ++r) xr[r] = xq + (m0 + r) * x.nb * kBlock;
  }
  const __m512i ones = _mm512_set1_epi8(1);
  for (int64_t c = 0; c < a.num_chunks; ++c) {
    const int64_t j_end = std::min(a.quads, (c + 1) * a.chunk_quads);
    __m512i sum[R], code_sum = _mm512_setzero_si512();
    for (int r = 0; r < R; ++r) sum[r] = _mm512_setzero_si512();
    for (int64_t j = c * a.chunk_quads; j < j_end; ++j) {
      const __m256i qa = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.codes + j * kPanel * 4));
      const __m256i qb = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.codes + j * kPanel * 4));
      const __m512i q = _mm512_inserti64x4(_mm512_castsi256_si512(qa), qb, 1);
      if constexpr (!Unsigned)
        code_sum = Interleaved ? add_quads(code_sum, ones, q) : _mm512_dpbusd_epi32(code_sum, ones, q);
      // Blocks of 1-7 rows ask every line (a share, AheadShare::of(0, 1), only when they are x's one block of rows) by
      // the cheapest test: the share's bookkeeping was a measurable cost on steps of 2-6 rows.
      if (ahead_a != nullptr && (Interleaved ? (j & share.mask) == share.at : j % 2 == 0)) {
        _mm_prefetch(reinterpret_cast<const char*>(ahead_a + j * kPanel * 4), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(ahead_b + j * kPanel * 4), _MM_HINT_T0);
      }
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        int32_t quad;
        if constexpr (Interleaved) std::memcpy(&quad, xr[0] + 32 * j + 4 * r, sizeof(quad));
        else std::memcpy(&quad, xr[r] + 4 * j, sizeof(quad));
        const __m512i xq = _mm512_set1_epi32(quad);
        if constexpr (Interleaved) sum[r] = Unsigned ? add_quads(sum[r], q, xq) : add_quads(sum[r], xq, q);
        else sum[r] = Unsigned ? _mm512_dpbusd_epi32(sum[r], q, xq) : _mm512_dpbusd_epi32(sum[r], xq, q);
      }
    }
    const __m512i offset = _mm512_slli_epi32(code_sum, 7);
    const __m512 ws = join_ps(_mm256_loadu_ps(a.scales + c * kPanel), _mm256_loadu_ps(b.scales + c * kPanel));
    const int64_t xb = (c * a.chunk_quads * 4) / kBlock;
    for (int r = 0; r < R; ++r) {
      const __m512 dx = _mm512_set1_ps(x.d[(m0 + r) * x.nb + xb]);
      const __m512i exact = Unsigned ? sum[r] : _mm512_sub_epi32(sum[r], offset);
      acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_mul_ps(ws, dx), acc[r]);
    }
  }
  if (a.mins) {  // pairs are made of panels that both have a mins' term or both have none
    for (int64_t g = 0; g < a.num_groups; ++g) {
      const __m512 mins = join_ps(_mm256_loadu_ps(a.mins + g * kPanel), _mm256_loadu_ps(b.mins + g * kPanel));
      for (int r = 0; r < R; ++r)
        acc[r] = _mm512_fmadd_ps(mins, _mm512_set1_ps(x.sums[(m0 + r) * x.num_groups + g]), acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) _mm512_storeu_ps(out + r * ldo, acc[r]);
}

template <bool Unsigned>
void pair_rows_dot(const Panel& a, const Panel& b, const QuantizedX& x, int64_t m0, int64_t rows, float* out,
                   int64_t ldo, AheadShare share) {
  if (rows == 8 && (Unsigned ? x.q8 != nullptr : x.qu8 != nullptr) && m0 % 8 == 0)
    return pair_rows<8, true, Unsigned>(a, b, x, m0, out, ldo, share);
  row_blocks(rows, [&](auto block, int64_t r) {
    constexpr int R = decltype(block)::value;
    pair_rows<R, false, Unsigned>(a, b, x, m0 + r, out + r * ldo, ldo, r == 0 ? share : AheadShare{});
  });
}

// A pair of panels (both signed codes, or with `unsigned_codes` both unsigned) against `rows` rows of x from m0.
inline void pair_dot(bool unsigned_codes, const Panel& a, const Panel& b, const QuantizedX& x, int64_t m0,
                     int64_t rows, float* out, int64_t ldo, AheadShare share) {
  unsigned_codes ? pair_rows_dot<true>(a, b, x, m0, rows, out, ldo, share)
                 : pair_rows_dot<false>(a, b, x, m0, rows, out, ldo, share);
}
#endif  // JIDO_INT8_DOT_VNNI

#endif  // JIDO_INT8_DOT_PASS
