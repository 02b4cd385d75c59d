// The vector kernels (int8_dot_kernels.h) for AVX-512 VNNI: products by vpdpbusd, and panels in pairs (pair_dot).
// Compiled under `#pragma GCC target`, so every x86 build holds them; int8_dot.cpp fills their table only where the
// CPU runs them.
#include "int8_dot_common.h"

#if defined(__AVX2__)
namespace jido_int8_dot {
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
#include "int8_dot_kernels.h"

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
}  // namespace vnni
#pragma GCC pop_options

// After pop_options: the table is written with the build's own instructions.
void fill_vnni(Kernels* k) {
  vnni::fill_vector_kernels(k);
  k->pair_dot = &vnni::pair_dot;
}
}  // namespace jido_int8_dot
#endif  // __AVX2__
