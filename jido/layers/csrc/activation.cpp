// Gated MLP activations in one pass: out[t, j] = act(x[t, j]) * x[t, I + j] for x [tokens, 2 * I] float32 or
// bfloat16, act SiLU or GELU's tanh form (their arithmetic: gated_activation.h). ATen runs them as two ops over a
// strided half of x, and its GELU evaluates tanh by Sleef, slow enough to show in a prefill's time.
// The AVX-512 loop, the AVX2 loop and the scalar tail run the same
// operations, so a value does not depend on its column.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "bf16_bits.h"
#include "gated_activation.h"

namespace {

using namespace jido_gated;

// The logistic's exponent: act(g) = g / (1 + e^exponent(g)).
inline float exponent(float g, Act act) {
  return act == Act::kSilu ? -g : std::fma(kGeluB * g, g, 1.f) * (kGeluA * g);
}

inline float exp_approx(float x) {
  x = std::min(std::max(x, kExpMin), kExpMax);
  const float n = std::floor(std::fma(x, kLog2e, 0.5f));
  const float r = std::fma(n, -kLn2Lo, std::fma(n, -kLn2Hi, x));
  float p = kP[0];
  for (int i = 1; i < 6; ++i) p = std::fma(p, r, kP[i]);
  p = std::fma(p, r * r, r + 1.f);
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

#ifdef __AVX2__
inline __m256 exponent8(__m256 g, Act act) {
  if (act == Act::kSilu) return _mm256_sub_ps(_mm256_setzero_ps(), g);
  const __m256 inner = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_set1_ps(kGeluB), g), g, _mm256_set1_ps(1.f));
  return _mm256_mul_ps(inner, _mm256_mul_ps(_mm256_set1_ps(kGeluA), g));
}

inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(kExpMin)), _mm256_set1_ps(kExpMax));
  const __m256 n = _mm256_floor_ps(_mm256_fmadd_ps(x, _mm256_set1_ps(kLog2e), _mm256_set1_ps(0.5f)));
  const __m256 r = _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Lo), _mm256_fmadd_ps(n, _mm256_set1_ps(-kLn2Hi), x));
  __m256 p = _mm256_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kP[i]));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.f)));
  const __m256i bits = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(bits));
}
#endif

using jido_bf16::round_bits;
using jido_bf16::to_float;

#ifdef __AVX2__
inline __m256 load_bf16(const uint16_t* p) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
}
// 8 floats rounded to bf16, as their bits in the low halves of int32 lanes.
inline __m256i bf16_bits(__m256 x) {
  const __m256i u = _mm256_castps_si256(x);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(odd, _mm256_set1_epi32(0x7fff))), 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7fc0), nan);
}
inline __m256 round_bf16(__m256 x) { return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits(x), 16)); }
inline void store_bf16(uint16_t* p, __m256 x) {
  const __m256i r = bf16_bits(x);
  const __m128i packed = _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), packed);
}
#endif

// One bf16 row: act(gate) rounded to bf16, times up, rounded (as ATen's two bf16 ops round, each computing in
// float32), in one pass where ATen's GELU alone was a visible part of a bf16 prefill layer.
#if defined(__AVX2__) && defined(__GNUC__)

// The AVX2 loop's operations, 16 lanes at a time; bf16 rounding by the CPU's own conversion (to nearest even, as
// bf16_bits does for every number). Where the CPU has AVX-512 BF16, twice the lanes and a native conversion
// make this loop much faster than the AVX2 one on a prefill's rows.
JIDO_AVX512_BF16 inline __m512 load_bf16x16(const uint16_t* p) {
  const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
}

// Columns [0, width / 16 * 16) of one bf16 row; returns where it stopped.
JIDO_AVX512_BF16 int64_t act_and_mul_row_bf16_avx512(const uint16_t* gate, const uint16_t* up, uint16_t* out,
                                                      int64_t width, Act act) {
  int64_t j = 0;
  for (; j + 16 <= width; j += 16) {
    const __m256bh y = act_and_mul16_bf16(load_bf16x16(gate + j), load_bf16x16(up + j), act);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + j), (__m256i)y);
  }
  return j;
}

bool has_avx512_bf16() {
  static const bool has = __builtin_cpu_supports("avx512bf16");
  return has;
}
#endif

void act_and_mul_row_bf16(const uint16_t* gate, const uint16_t* up, uint16_t* out, int64_t width, Act act) {
  int64_t j = 0;
#if defined(__AVX2__) && defined(__GNUC__)
  if (has_avx512_bf16()) j = act_and_mul_row_bf16_avx512(gate, up, out, width, act);
#endif
#ifdef __AVX2__
  const __m256 one = _mm256_set1_ps(1.f);
  for (; j + 8 <= width; j += 8) {
    const __m256 g = load_bf16(gate + j);
    const __m256 a = round_bf16(_mm256_div_ps(g, _mm256_add_ps(one, exp8(exponent8(g, act)))));
    store_bf16(out + j, _mm256_mul_ps(a, load_bf16(up + j)));
  }
#endif
  for (; j < width; ++j) {
    const float g = to_float(gate[j]);
    out[j] = round_bits(to_float(round_bits(g / (1.f + exp_approx(exponent(g, act))))) * to_float(up[j]));
  }
}

// One row: out[j] = act(gate[j]) * up[j], rounded once each (as the two unfused float32 ops round).
void act_and_mul_row(const float* gate, const float* up, float* out, int64_t width, Act act) {
  int64_t j = 0;
#ifdef __AVX2__
  const __m256 one = _mm256_set1_ps(1.f);
  for (; j + 8 <= width; j += 8) {
    const __m256 g = _mm256_loadu_ps(gate + j);
    const __m256 a = _mm256_div_ps(g, _mm256_add_ps(one, exp8(exponent8(g, act))));
    _mm256_storeu_ps(out + j, _mm256_mul_ps(a, _mm256_loadu_ps(up + j)));
  }
#endif
  for (; j < width; ++j) out[j] = gate[j] / (1.f + exp_approx(exponent(gate[j], act))) * up[j];
}

at::Tensor act_and_mul(const at::Tensor& x, int64_t act) {
  TORCH_CHECK(act == static_cast<int64_t>(Act::kSilu) || act == static_cast<int64_t>(Act::kGeluTanh),
              "act_and_mul: act must be 0 (silu) or 1 (gelu_tanh), got ", act);
  const bool bf16 = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && (bf16 || x.scalar_type() == at::kFloat) && x.size(1) % 2 == 0,
              "act_and_mul: x must be contiguous float32 or bfloat16 [tokens, 2 * width]");
  const int64_t rows = x.size(0), width = x.size(1) / 2;
  at::Tensor out = at::empty({rows, width}, x.options());
  // rows of at least ~32k values a task: one decode row stays on the calling thread
  const int64_t grain = std::max<int64_t>(1, (1 << 15) / std::max<int64_t>(width, 1));
  const Act a = static_cast<Act>(act);
  if (bf16) {
    const uint16_t* src = reinterpret_cast<const uint16_t*>(x.data_ptr<at::BFloat16>());
    uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
    at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t)
        act_and_mul_row_bf16(src + t * 2 * width, src + t * 2 * width + width, dst + t * width, width, a);
    });
    return out;
  }
  const float* src = x.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t)
      act_and_mul_row(src + t * 2 * width, src + t * 2 * width + width, dst + t * width, width, a);
  });
  return out;
}

}  // namespace

TORCH_LIBRARY(jido_act, m) { m.def("act_and_mul(Tensor x, int act) -> Tensor"); }

TORCH_LIBRARY_IMPL(jido_act, CPU, m) { m.impl("act_and_mul", &act_and_mul); }
