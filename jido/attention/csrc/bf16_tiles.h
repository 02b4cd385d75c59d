// What the AMX-BF16 attention kernels share (flash_prefill.cpp's prefill tiles, paged_decode.cpp's runs): the tile
// configuration block and a 16-lane exp for softmax weights. Include it inside a region compiled for
// "avx512f,avx512bw,avx512vl,avx512dq,avx512bf16,amx-tile,amx-bf16" (#pragma GCC target).
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace bf16_tiles {

// LDTILECFG's 64-byte block: palette 1, then per tile its bytes per row and its rows.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0 .. count - 1 as 16 rows of 64 bytes (16 floats, or 32 bf16 in pairs).
inline void configure_full_tiles(int count) {
  TileConfig cfg;
  for (int t = 0; t < count; ++t) cfg.rows[t] = 16, cfg.colsb[t] = 64;
  // NOTE: GCC does not see LDTILECFG read the whole block: where this was not inlined into its caller, it kept the
  // palette byte and dropped the stores of rows and colsb, so the tiles stayed unconfigured and the first tile
  // instruction faulted (#UD). The empty asm makes the block's memory needed before the load.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}

// exp(x) in 16 lanes for x <= 0 (and -inf): x = n ln2 + r, |r| <= ln2 / 2, exp(r) by a degree-5 polynomial
// (relative error ~2e-6: the weights are rounded to bf16, 4e-3), 2^n applied by scalef (0 below the float range).
inline __m512 exp_ps(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-0.693359375f), x);
  r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f), r);
  __m512 y = _mm512_set1_ps(1.f / 120.f);
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f / 24.f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f / 6.f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(0.5f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f));
  y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(y, n);
}

}  // namespace bf16_tiles
