// The vector kernels (rows, panels, five-bit rows), written once for the ISAs that run them: included by
// int8_dot_avx2.cpp and int8_dot_vnni.cpp inside their ISA's namespace, after that ISA's dot_u8s8, first_pairs,
// add_pairs and widen_pairs (and, for VNNI, under its `#pragma GCC target`), so each unit compiles them into its own
// namespace with its own instructions. See int8_dot.cpp's top for the kernels and int8_dot_common.h for the layouts.
#pragma once

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

// out[r] = row n of w (its scales rs and mins rm as float32: GroupRows) . row m0 + r of x, for R rows of x.
template <int R, int Bits, bool Groups16>
JIDO_INLINE void row_dot(const Weight& w, int64_t n, const float* rs, const float* rm, const QuantizedX& x,
                         int64_t m0, float* out) {
  constexpr int64_t kBlockBytes = Bits == 8 ? kBlock : kBlock / 2;
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  const uint8_t* row = w.data + n * w.row_bytes;
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
    if (rm) sum += mins_term(rm, x.sums + (m0 + r) * x.num_groups, w.num_groups);
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

// out[a], out[b]: the lane sums of rows a and b's accumulators, plus their mins' terms (mins ma, mb) on x's group sums.
JIDO_INLINE void store_two_rows(const float* ma, const float* mb, int64_t num_groups, int64_t a, int64_t b,
                                const QuantizedX& x, __m256 acc_a, __m256 acc_b, float* out) {
  float sum_a = lane_sum(acc_a), sum_b = lane_sum(acc_b);
  if (ma) {
    sum_a += mins_term(ma, x.sums, num_groups);
    sum_b += mins_term(mb, x.sums, num_groups);
  }
  out[a] = sum_a, out[b] = sum_b;
}

// Decode (one row of x, whole blocks): weight rows a and b against x in one pass over x's blocks, each output the
// same float operations in the same order as row_dot<1>'s. Faster than one row at a time: x's block and scale are
// loaded once for two rows, and the two FMA chains overlap. a and b must be far apart: with b = a + 1 the two rows'
// blocks alternate in memory and the stream from memory slowed, where two monotonic streams sped it up
// (benchmarks/results/report-2026-12-01-avx2-epyc-decode-kernel.md).
template <int Bits, bool Groups16>
JIDO_INLINE void two_rows_dot(const Weight& w, int64_t a, int64_t b, const RowGroups& ga, const RowGroups& gb,
                              const QuantizedX& x, float* out) {
  constexpr int64_t kBlockBytes = Bits == 8 ? kBlock : kBlock / 2;
  const uint8_t* qa = w.data + a * w.row_bytes;
  const uint8_t* qb = w.data + b * w.row_bytes;
  const float* sa = ga.scales;
  const float* sb = gb.scales;
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
  store_two_rows(ga.mins, gb.mins, w.num_groups, a, b, x, acc_a, acc_b, out);
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
JIDO_INLINE void five_bit_two_rows(const FiveBitWeight& w, int64_t a, int64_t b, const RowGroups& ga,
                                   const RowGroups& gb, const QuantizedX& x, const int32_t* lanes, float* out) {
  const int64_t row_bytes = w.nb * kFiveBitBlockBytes;
  const uint8_t* qa = w.data + a * row_bytes;
  const uint8_t* qb = w.data + b * row_bytes;
  const float* sa = ga.scales;
  const float* sb = gb.scales;
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
  store_two_rows(ga.mins, gb.mins, w.num_groups, a, b, x, acc_a, acc_b, out);
}

// Output columns [n0, n1) of one row of x on five-bit rows: rows n and n + half together (two monotonic streams,
// see two_rows_dot); an odd last row pairs with itself.
void five_bit_rows(const FiveBitWeight& w, const QuantizedX& x, const int32_t* lanes, int64_t n0, int64_t n1,
                   float* out) {
  const int64_t half = (n1 - n0) / 2, row_bytes = w.nb * kFiveBitBlockBytes;
  GroupRows groups(scales_of(w), mins_of(w));
  for (int64_t n = n0; n < n0 + half; ++n) {
    for (const int64_t r : {n + kPrefetchRows, n + half + kPrefetchRows}) {
      if (r >= w.N) continue;
      const char* bytes = reinterpret_cast<const char*>(w.data + r * row_bytes);
      for (int64_t i = 0; i < row_bytes; i += 64) __builtin_prefetch(bytes + i);
    }
    five_bit_two_rows(w, n, n + half, groups.row(n, 0), groups.row(n + half, 1), x, lanes, out);
  }
  if ((n1 - n0) % 2) {
    const RowGroups last = groups.row(n1 - 1, 0);
    five_bit_two_rows(w, n1 - 1, n1 - 1, last, last, x, lanes, out);
  }
}

// Output columns [n0, n1) of out [M, N], x's rows in blocks of 4, 2 and 1 for each weight row (read from L1
// again after the first block).
template <int Bits, bool Groups16>
void rows_dot(const Weight& w, const QuantizedX& x, int64_t n0, int64_t n1, float* out) {
  // Decode: rows n and n + half together, as two monotonic streams (see two_rows_dot).
  const int64_t half = x.M == 1 && w.K % kBlock == 0 ? (n1 - n0) / 2 : 0;
  GroupRows groups(scales_of(w), mins_of(w));
  for (int64_t n = n0; n < n0 + half; ++n) {
    prefetch_row(w, n + kPrefetchRows);
    prefetch_row(w, n + half + kPrefetchRows);
    two_rows_dot<Bits, Groups16>(w, n, n + half, groups.row(n, 0), groups.row(n + half, 1), x, out);
  }
  float part[4];
  for (int64_t n = n0 + 2 * half; n < n1; ++n) {
    prefetch_row(w, n + kPrefetchRows);
    const RowGroups g = groups.row(n, 0);
    for (int64_t m = 0; m < x.M;) {
      const int64_t left = x.M - m;
      const int R = left >= 4 ? 4 : left >= 2 ? 2 : 1;
      if (R == 4) row_dot<4, Bits, Groups16>(w, n, g.scales, g.mins, x, m, part);
      else if (R == 2) row_dot<2, Bits, Groups16>(w, n, g.scales, g.mins, x, m, part);
      else row_dot<1, Bits, Groups16>(w, n, g.scales, g.mins, x, m, part);
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

// This ISA's vector kernels into k (its unit's fill function adds what only it has).
inline void fill_vector_kernels(Kernels* k) {
  k->rows[0][0] = &rows_dot<8, false>;
  k->rows[0][1] = &rows_dot<8, true>;
  k->rows[1][0] = &rows_dot<4, false>;
  k->rows[1][1] = &rows_dot<4, true>;
  k->panel[0] = &panel_dot<true, 8>;
  k->panel[1] = &panel_dot<true, 4>;
  k->panel[2] = &panel_dot<true, 2>;
  k->panel[3] = &panel_dot<true, 1>;
  k->panel[kSignedSpan] = &panel_dot<false, 1>;
  k->five_bit_rows = &five_bit_rows;
}
