// Gated MLP activations, act(gate) * up with act SiLU or GELU's tanh form, in the float32 arithmetic every jido CPU
// kernel that applies them shares (csrc/activation.cpp's act_and_mul; int8_dot.cpp's AMX GEMM, which applies them as
// a fused gate/up projection's products are stored), so that a value is the same bits whichever kernel made it.
//
// Both are g times a logistic: silu(g) = g / (1 + e^-g), and since 1 + tanh(y) = 2 / (1 + e^-2y),
// gelu_tanh(g) = 0.5 g (1 + tanh(y)) = g / (1 + e^(-2y)), y = sqrt(2 / pi) (g + 0.044715 g^3). So each needs one
// exp, computed as Cephes' expf does (a degree-6 polynomial on x - n ln 2, n = round(x / ln 2), times 2^n; within
// 2 ulp). Arguments are clamped to [-87.3, 88.7]: past them the logistic is 0 or 1 to float32's precision
// (e^88.7 is 3.3e38, so g / (1 + e) is g * 3e-39 where the exact value underflows further).
#pragma once

#include <cstdint>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

namespace jido_gated {

constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;  // ln 2 in two parts (Cody-Waite)
constexpr float kExpMin = -87.3f, kExpMax = 88.7f;
constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                         4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
constexpr float kGeluA = -1.5957691216057308f;  // -2 sqrt(2 / pi)
constexpr float kGeluB = 0.044715f;

enum class Act : int64_t { kSilu = 0, kGeluTanh = 1 };

#if defined(__AVX2__) && defined(__GNUC__)
#define JIDO_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma")))

JIDO_AVX512_BF16 inline __m512 exp16(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(kExpMin)), _mm512_set1_ps(kExpMax));
  const __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(kLog2e), _mm512_set1_ps(0.5f)),
                                        _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Lo), _mm512_fmadd_ps(n, _mm512_set1_ps(-kLn2Hi), x));
  __m512 p = _mm512_set1_ps(kP[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kP[i]));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  const __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
  return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}

// The logistic's exponent: act(g) = g / (1 + e^exponent(g)).
JIDO_AVX512_BF16 inline __m512 exponent16(__m512 g, Act act) {
  if (act == Act::kSilu) return _mm512_sub_ps(_mm512_setzero_ps(), g);
  const __m512 inner = _mm512_fmadd_ps(_mm512_mul_ps(_mm512_set1_ps(kGeluB), g), g, _mm512_set1_ps(1.f));
  return _mm512_mul_ps(inner, _mm512_mul_ps(_mm512_set1_ps(kGeluA), g));
}

// 16 bf16 outputs of act(g) * u for g and u that are bf16 values: act(g) rounded to bf16, times u, rounded (as
// ATen's two bf16 ops round, each computing in float32), by the CPU's own conversion (to nearest even).
JIDO_AVX512_BF16 inline __m256bh act_and_mul16_bf16(__m512 g, __m512 u, Act act) {
  const __m256bh a16 = _mm512_cvtneps_pbh(_mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.f), exp16(exponent16(g, act)))));
  const __m512 a = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32((__m256i)a16), 16));
  return _mm512_cvtneps_pbh(_mm512_mul_ps(a, u));
}
#endif

}  // namespace jido_gated
