// What the int8 dot-product kernels' units share (int8_dot.cpp's ops and glue, and one unit per ISA:
// int8_dot_avx2.cpp, int8_dot_vnni.cpp, int8_dot_amx.cpp): the layouts of x, weights and panels, the constants
// that size them, and the table of kernels each ISA's unit fills. Plain C++ and immintrin, no ATen: the per-ISA
// units compile fast. Include it before any `#pragma GCC target`, so its inline functions (and the standard
// library's) are compiled for the build's own ISA in every unit.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>
#if defined(__AVX2__)
#include <immintrin.h>
#endif

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

// A weight's scales and mins are float32; float16 (`half`: quant_kernels.py, compact_scales); or int8 integers times
// a float32 factor per super-block of a row (`scale_supers`, `min_supers`: a K-quant's d and -dmin, quant_kernels.pack).
// Each is widened to the same float32 values as it is read, so the kernels run the same float operations either way.
struct Weight {
  const uint8_t* data;
  const void* scales;  // float32, float16 (half) or int8 (scale_supers) [N, num_groups]
  const void* mins;  // as scales; nullptr: no mins
  int64_t N, K, group_size, bits, row_bytes, num_groups, nb;
  bool groups16;  // else each group holds whole blocks: group_size a multiple of 32, or one group per row
  bool half = false;
  const float* scale_supers = nullptr;  // [N, num_groups / groups_per_super]; nullptr: scales are floats
  const float* min_supers = nullptr;  // as scale_supers, for the mins
  int64_t groups_per_super = 0;
};

#if defined(__AVX2__)
// How one weight's scales or mins are stored (see Weight).
struct GroupValues {
  const void* values;  // nullptr: none
  bool half;
  const float* supers;  // non-null: values are int8 integers times these
  int64_t num_groups, groups_per_super;

  // Stored as float32: a row is read in place.
  bool in_place() const { return !half && !supers; }

  // Row n's groups as float32: in place where stored so, else widened into `slot` (num_groups floats).
  const float* row(int64_t n, float* slot) const {
    if (in_place()) return static_cast<const float*>(values) + n * num_groups;
    widen(n, slot);
    return slot;
  }

 private:
  // Row n's groups as float32 into dst: float16 widens exactly (F16C, which every CPU with AVX2 that jido builds for
  // has); an integer times its factor is one float32 product, the one the GGUF decoder made.
  void widen(int64_t n, float* dst) const {
    if (supers) {
      const int8_t* codes = static_cast<const int8_t*>(values) + n * num_groups;
      const float* factor = supers + n * (num_groups / groups_per_super);
      for (int64_t s = 0, g = 0; g < num_groups; ++s) {  // a loop per super-block: no division per group
        const float f = factor[s];
        const int64_t end = g + groups_per_super;
        for (const __m256 fv = _mm256_set1_ps(f); g + 8 <= end; g += 8) {  // K-quants: 8 or 16 groups a super-block
          const __m256i c = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + g)));
          _mm256_storeu_ps(dst + g, _mm256_mul_ps(fv, _mm256_cvtepi32_ps(c)));
        }
        for (; g < end; ++g) dst[g] = f * static_cast<float>(codes[g]);
      }
      return;
    }
    const uint16_t* src = static_cast<const uint16_t*>(values) + n * num_groups;
    int64_t g = 0;
    for (; g + 8 <= num_groups; g += 8)
      _mm256_storeu_ps(dst + g, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + g))));
    for (; g < num_groups; ++g) dst[g] = _cvtsh_ss(src[g]);
  }
};

inline GroupValues scales_of(const Weight& w) {
  return {w.scales, w.half, w.scale_supers, w.num_groups, w.groups_per_super};
}
inline GroupValues mins_of(const Weight& w) { return {w.mins, w.half, w.min_supers, w.num_groups, w.groups_per_super}; }

// One weight row's scales and mins (nullptr: none) as float32, for the dot loops.
struct RowGroups {
  const float* scales;
  const float* mins;
};

// The rows of a weight's scales and mins as float32 (GroupValues::row), widened rows into one of two slots (the two
// rows decode runs together), so the dot loops are the same whatever the storage. Widening per group inside those
// loops instead (a conversion and broadcast a group) slowed a one-row step on cached weights by a tenth; per row it is
// a pass over num_groups values, the loops then read float32 from L1.
class GroupRows {
 public:
  GroupRows(const GroupValues& scales, const GroupValues& mins) : scales_(scales), mins_(mins) {
    if (!scales.in_place()) widened_.resize(4 * scales.num_groups);
  }

  RowGroups row(int64_t n, int slot) {
    const int64_t groups = scales_.num_groups;
    float* s = widened_.empty() ? nullptr : widened_.data() + 2 * slot * groups;  // (unused in place)
    return {scales_.row(n, s), mins_.values ? mins_.row(n, s ? s + groups : nullptr) : nullptr};
  }

 private:
  GroupValues scales_, mins_;
  std::vector<float> widened_;
};
#endif

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
  const void* scales;  // as Weight's
  const void* mins;  // nullptr: no mins
  int64_t N, K, group_size, num_groups, nb;
  bool half = false;
};

#if defined(__AVX2__)
inline GroupValues scales_of(const FiveBitWeight& w) { return {w.scales, w.half, nullptr, w.num_groups, 0}; }
inline GroupValues mins_of(const FiveBitWeight& w) { return {w.mins, w.half, nullptr, w.num_groups, 0}; }
#endif

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
  const int64_t scale_bytes = w.scale_supers ? 1 : w.half ? 2 : 4;
  const char* scales = static_cast<const char*>(w.scales) + n * w.num_groups * scale_bytes;
  for (int64_t i = 0; i < w.num_groups * scale_bytes; i += 64) __builtin_prefetch(scales + i);
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
// Output columns per block of a weight packed for the int8 GEMM (pack_amx_gemm, gemm).
constexpr int64_t kGemmCols = 32;

struct Panels {
  const int8_t* codes;  // [panels][quads][16][4], or narrow (bits < 8): per panel kpad * 16 / 128 units
  const float* scales;  // [panels][chunks][16]
  const float* mins;    // [panels][groups][16]; nullptr: no panel has a mins' term
  const int32_t* meta;  // [panels][2]: the wider span of codes of its halves, whether it has a mins' term
  int64_t N, kpad, chunk, num_chunks, num_groups;
  int bits;  // per code: 8 (bytes), or 4-6 (narrow)
  int64_t panel_bytes() const { return panel_code_bytes(kAmxPanel, kpad, bits); }
};

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
}  // namespace amx

// The ISAs the kernels run on, as cpu_runs (int8_dot.cpp) names them and `isa` arguments index them: the vector
// kernels' first, in int8_dot.py's ISAS order; then AMX-INT8 tiles, and AVX-512 BF16 (scale_sums' bf16 epilogue).
enum Isa : int64_t { kAvx2 = 0, kAvx512Vnni = 1, kAmx = 2, kAvx512Bf16 = 3, kNumIsas = 4 };

// Codes of a panel that span at most this many values (max - min) are stored unsigned, less their lowest.
constexpr int kMaxUnsignedSpan = 127;
// The panel kernels by the span of their codes (Kernels::panel): unsigned up to 15, 31, 63 and 127 values, their
// int16 pair sums widened every 8, 4, 2 or 1 quads (2 * quads * span * 127 <= 32767); signed beyond.
constexpr int kSignedSpan = 4;
inline int span_class(int span) {
  return span <= 15 ? 0 : span <= 31 ? 1 : span <= 63 ? 2 : span <= kMaxUnsignedSpan ? 3 : kSignedSpan;
}

// (five-bit weight, x, each int32 lane's start, first output column, end column, out)
using FiveBitRowsFn = void (*)(const FiveBitWeight&, const QuantizedX&, const int32_t*, int64_t, int64_t, float*);
// (unsigned codes, panel a, panel b, x, first row of x, rows, out, ldo, share of the asking ahead)
using PairDotFn = void (*)(bool, const Panel&, const Panel&, const QuantizedX&, int64_t, int64_t, float*, int64_t,
                           AheadShare);
// (codes, units, bits, out)
using NarrowCodesFn = void (*)(const uint8_t*, int64_t, int, uint8_t*);
// (panels, x, rows of x, first panel, end panel, out)
using AmxPanelsFn = void (*)(const amx::Panels&, const QuantizedX&, int64_t, int64_t, int64_t, const amx::Out&);
// (x codes, M, K, x scales, W packed, W scales, bias, N, out, act, row parts, column parts, first item, end item)
template <typename Out>
using GemmFn = void (*)(const int8_t*, int64_t, int64_t, const float*, const int8_t*, const float*, const float*,
                        int64_t, Out*, int64_t, int64_t, int64_t, int64_t, int64_t);

// One ISA's kernels, as its unit's fill function sets them; nullptr where the ISA has none. int8_dot.cpp fills one
// table per ISA this CPU runs, once, and every op takes its kernels from the table its `isa` indexes.
struct Kernels {
  RowsFn rows[2][2] = {};  // [int4 codes][groups of 16]
  PanelFn panel[kSignedSpan + 1] = {};  // by span_class
  FiveBitRowsFn five_bit_rows = nullptr;
  // Two panels at once in 512-bit vectors (VNNI): x then needs its offset copies (QuantizedX::qu, qu8).
  PairDotFn pair_dot = nullptr;
  NarrowCodesFn narrow_codes = nullptr;  // AMX: panels' codes into 4-6 bits
  AmxPanelsFn amx_panels = nullptr;  // AMX: panels on the tiles
  GemmFn<float> gemm = nullptr;  // AMX: the int8 GEMM into float32
  GemmFn<uint16_t> gemm_bf16 = nullptr;  // ... into bf16 (or act(gate) * up)
};

// Each ISA's unit: its kernels into `k` (call only where cpu_runs says the CPU runs the ISA).
void fill_avx2(Kernels* k);
void fill_vnni(Kernels* k);
void fill_amx(Kernels* k);

}  // namespace jido_int8_dot
