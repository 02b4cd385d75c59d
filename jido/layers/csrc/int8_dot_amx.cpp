// The AMX-INT8 kernels: prepacked 16-row panels on the tiles (run_panels), the narrow codes they widen, and the int8
// GEMM of w8a8 steps of many rows (gemm). Compiled under `#pragma GCC target`, so every x86 build holds them;
// int8_dot.cpp fills their table only where the CPU has AMX-INT8 and Linux granted this process the tile state.
#include "int8_dot_common.h"

#if defined(__AVX2__)
// Before the pragma, as int8_dot.cpp includes it: its inline functions carry their own target.
#include "gated_activation.h"

namespace jido_int8_dot {
// Columns of x per tile multiply: a chunk of 16 or 32, or for longer chunks (x and w scaled per row, or groups of
// 64 and more per token) 64 where the chunks and the padded row divide by it, else 32.
inline int64_t amx_sub_k(int64_t chunk, int64_t kpad) {
  if (chunk <= 32) return chunk;
  return chunk % 64 == 0 && kpad % 64 == 0 ? 64 : 32;
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
JIDO_INLINE void store16(uint16_t* dst, __m512 v, __mmask16 m) {
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
  uint16_t* out = static_cast<uint16_t*>(b.out);
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
      __m512 v = _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(b.sums + r * 32 + h * 16)),
                                             _mm512_set1_ps(b.dx[r])), dw);
      // NOTE: the product rounded before the bias is added, never one FMA: in its own unit GCC split this loop by
      // the bias and fused them, which changed the outputs' bits.
      asm("" : "+v"(v));
      store16(out + r * ldo, b.bias != nullptr ? _mm512_add_ps(v, bias) : v, mask);
    }
  }
}

// out = the scaled products (Out float or bf16 bits, N columns), or with act >= 0 (bf16 only) act(gate) * up: W packed
// gated (pack_amx_gemm), N its gate + up columns and out N / 2 wide. Work items [begin, end) of row_parts x col_parts
// (the ranges of rows and of column blocks that int8_dot.cpp splits between the threads).
template <typename Out>
void gemm(const int8_t* x, int64_t M, int64_t K, const float* dx, const int8_t* w, const float* dw, const float* bias,
          int64_t N, Out* out, int64_t act, int64_t row_parts, int64_t col_parts, int64_t begin, int64_t end) {
  const int64_t out_cols = act >= 0 ? N / 2 : N, per_block = act >= 0 ? 16 : kGemmCols;
  const int64_t steps = K / 64, blocks = (out_cols + per_block - 1) / per_block, groups = (M + 31) / 32;
  configure(16, 64);
  alignas(64) int32_t sums[2][32 * 32];
  std::vector<int8_t> tail(32 * K);
  GemmPending pending;
  int flip = 0;
  auto store = [&](const GemmPending& b) {
    if constexpr (std::is_same_v<Out, uint16_t>) {
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
}
}  // namespace amx
#pragma GCC pop_options

// After pop_options: the table is written with the build's own instructions.
void fill_amx(Kernels* k) {
  k->narrow_codes = &amx::narrow_codes;
  k->amx_panels = &amx::run_panels;
  k->gemm = &amx::gemm<float>;
  k->gemm_bf16 = &amx::gemm<uint16_t>;
}
}  // namespace jido_int8_dot
#endif  // __AVX2__
