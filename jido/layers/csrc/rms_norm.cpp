// RMSNorm over the last dimension in one pass per row, optionally added to a residual:
//   out = x / sqrt(mean(x^2) + eps) * w            (residual absent)
//   out = residual + (x / sqrt(mean(x^2) + eps) * w)  rounded to x's dtype first, as the unfused ops round
// Sums and products in float32, one rounding to the dtype (as F.rms_norm and HF's norms do). On CPU,
// F.rms_norm runs as ~10 ATen ops, each with its dispatch cost; a decode step of Gemma 3 270M runs 109 norms
// on rows that are small, so the dispatch was a large share of the step
// (benchmarks/results/archive/report-2026-12-01-avx2-epyc-fast-avx2.md).
//
// qk_norm_rope_: the per-head q/k norms (where the model has them) and the rotary embedding that follows,
// in place on the fused QKV projection's output, in one call per layer instead of ~20 ATen ops (rotary.py).
// Every value is rounded to the dtype where the unfused ops round it (the normed head, each product, the
// difference), so the result is theirs bit for bit; hence no FMA contraction in the rotation (rotate_head).
//
// bf16 rows and heads of a multiple of 16 (32 for a rotated head) run in 16-lane AVX-512 vectors (bf16x16), with
// the scalar loops' roundings: that speeds up the q/k norm + RoPE of a prefill layer, while the plain norm gains
// nothing, bound as it is by memory, not by its arithmetic.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#include <immintrin.h>
#define JIDO_NORM_AVX512 1
#endif

#include "bf16_bits.h"

namespace {

// float <-> the dtype in plain arithmetic GCC vectorizes (c10's BFloat16 conversions kept the loops scalar, several
// times slower on a prefill's rows). bf16 rounds to nearest even, NaN to 0x7fc0: c10's rounding, bit for bit.
inline float to_f(float x) { return x; }
inline float to_f(c10::Half x) { return static_cast<float>(x); }
inline float to_f(c10::BFloat16 x) { return jido_bf16::to_float(x.x); }
template <typename T> inline T from_f(float x) { return static_cast<T>(x); }
template <> inline c10::BFloat16 from_f<c10::BFloat16>(float x) {
  return c10::BFloat16(jido_bf16::round_bits(x), c10::BFloat16::from_bits());
}

#ifdef JIDO_NORM_AVX512
// bf16 in 16-lane float32 vectors, rounded as from_f rounds (to nearest even, NaN to 0x7fc0) with AVX-512F/BW
// integer ops, so that the vector loops below give the scalar loops' bits (CPUs without AVX-512 BF16 run them too).
namespace bf16x16 {
inline __m512 load(const c10::BFloat16* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
// x rounded to bf16, kept in float32 lanes (the low 16 bits zero): to_f(from_f(x)) per lane.
inline __m512 round(__m512 x) {
  const __m512i u = _mm512_castps_si512(x);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_and_si512(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))),
                                     _mm512_set1_epi32(static_cast<int>(0xffff0000u)));
  return _mm512_castsi512_ps(_mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q),
                                                   _mm512_set1_epi32(0x7fc00000)));
}
// Lanes already rounded (round) stored as bf16.
inline void store(c10::BFloat16* p, __m512 rounded) {
  const __m512i high = _mm512_srli_epi32(_mm512_castps_si512(rounded), 16);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(high));
}
// sum of x[k]^2 in float32 over dim (a multiple of 16): one accumulator, then its 16 lanes' tree sum.
inline float sum_squares(const c10::BFloat16* x, int64_t dim) {
  __m512 acc = _mm512_setzero_ps();
  for (int64_t k = 0; k < dim; k += 16) {
    const __m512 v = load(x + k);
    acc = _mm512_fmadd_ps(v, v, acc);
  }
  return _mm512_reduce_add_ps(acc);
}
// The norm's factor 1 / sqrt(mean(x^2) + eps) of a row of dim (a multiple of 16) values, in every lane.
inline __m512 norm_scale(const c10::BFloat16* x, int64_t dim, float eps) {
  return _mm512_set1_ps(1.f / std::sqrt(sum_squares(x, dim) / static_cast<float>(dim) + eps));
}
// 16 normed values x * scale * w, rounded.
inline __m512 normed(__m512 x, __m512 scale, const c10::BFloat16* w) {
  return round(_mm512_mul_ps(_mm512_mul_ps(x, scale), load(w)));
}
}  // namespace bf16x16
#endif

// One row: o = x * (1 / sqrt(mean(x^2) + eps)) * w, rounded to T (plus the residual, rounded again, if given).
template <typename T>
inline void norm_row_scalar(const T* xr, const T* w, const T* res, T* o, int64_t dim, float eps) {
  float sum = 0.f;
#pragma omp simd reduction(+ : sum)
  for (int64_t k = 0; k < dim; ++k) sum += to_f(xr[k]) * to_f(xr[k]);
  const float scale = 1.f / std::sqrt(sum / static_cast<float>(dim) + eps);
  if (res == nullptr) {
#pragma omp simd
    for (int64_t k = 0; k < dim; ++k) o[k] = from_f<T>(to_f(xr[k]) * scale * to_f(w[k]));
  } else {
#pragma omp simd
    for (int64_t k = 0; k < dim; ++k) {
      const T normed = from_f<T>(to_f(xr[k]) * scale * to_f(w[k]));
      o[k] = from_f<T>(to_f(res[k]) + to_f(normed));
    }
  }
}

#ifdef JIDO_NORM_AVX512
// A bf16 row of a multiple of 16 in vectors: norm_row_scalar's operations, but for the order of the sum of squares.
inline void norm_row_bf16x16(const c10::BFloat16* xr, const c10::BFloat16* w, const c10::BFloat16* res,
                             c10::BFloat16* o, int64_t dim, float eps) {
  using namespace bf16x16;
  const __m512 scale = norm_scale(xr, dim, eps);
  for (int64_t k = 0; k < dim; k += 16) {
    __m512 v = normed(load(xr + k), scale, w + k);
    if (res != nullptr) v = round(_mm512_add_ps(load(res + k), v));
    store(o + k, v);
  }
}
#endif

template <typename T>
inline void norm_row(const T* xr, const T* w, const T* res, T* o, int64_t dim, float eps) {
#ifdef JIDO_NORM_AVX512
  if constexpr (std::is_same_v<T, c10::BFloat16>) {
    if (dim % 16 == 0) return norm_row_bf16x16(xr, w, res, o, dim, eps);
  }
#endif
  norm_row_scalar<T>(xr, w, res, o, dim, eps);
}

template <typename T>
void norm_rows(const T* x, const T* w, const T* residual, T* out, int64_t rows, int64_t dim, float eps) {
  at::parallel_for(0, rows, 64, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      norm_row<T>(x + r * dim, w, residual == nullptr ? nullptr : residual + r * dim, out + r * dim, dim, eps);
  });
}

// A head rotated in place (rotate-half layout), each step rounded to T as apply_rotary's ops round:
//   x1' = T(T(x1 * cos) - T(x2 * sin)),  x2' = T(T(x2 * cos) + T(x1 * sin))
// Compiled without FMA contraction (and never inlined into code compiled with it): in float32 a fused
// x1 * cos - x2 * sin would round once where the unfused ops round three times. The norms keep GCC's default,
// as rms_norm always had: their float32 bits are what the tests' fixtures were made with.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
template <typename T>
__attribute__((noinline)) void rotate_head(T* x, const T* cos, const T* sin, int64_t half) {
#pragma omp simd
  for (int64_t i = 0; i < half; ++i) {
    const float x1 = to_f(x[i]), x2 = to_f(x[i + half]);
    const float c = to_f(cos[i]), s = to_f(sin[i]);
    const float a = to_f(from_f<T>(x1 * c)), b = to_f(from_f<T>(x2 * s));
    const float d = to_f(from_f<T>(x2 * c)), e = to_f(from_f<T>(x1 * s));
    x[i] = from_f<T>(a - b);
    x[i + half] = from_f<T>(d + e);
  }
}
#pragma GCC pop_options

#ifdef JIDO_NORM_AVX512
// A bf16 head (half a multiple of 16) normed by w (where given) and rotated, in place and in vectors: norm_row's and
// rotate_head's roundings, without the normed copy. No FMA contraction can occur: every product is rounded (integer
// ops on its bits) before the sum it feeds.
inline void norm_rotate_head_bf16x16(c10::BFloat16* x, const c10::BFloat16* w, const c10::BFloat16* cos,
                                     const c10::BFloat16* sin, int64_t half, float eps) {
  using namespace bf16x16;
  const __m512 scale = w == nullptr ? _mm512_set1_ps(1.f) : norm_scale(x, 2 * half, eps);
  for (int64_t i = 0; i < half; i += 16) {
    __m512 x1 = load(x + i), x2 = load(x + i + half);
    if (w != nullptr) {
      x1 = normed(x1, scale, w + i);
      x2 = normed(x2, scale, w + i + half);
    }
    const __m512 c = load(cos + i), s = load(sin + i);
    const __m512 a = round(_mm512_mul_ps(x1, c)), b = round(_mm512_mul_ps(x2, s));
    const __m512 d = round(_mm512_mul_ps(x2, c)), e = round(_mm512_mul_ps(x1, s));
    store(x + i, round(_mm512_sub_ps(a, b)));
    store(x + i + half, round(_mm512_add_ps(d, e)));
  }
}
#endif

// Tokens' q heads (columns [0, q_size)) and k heads ([q_size, q_size + kv_size)) of qkv, each normed by its
// weight (when given) into scratch and rotated by the token's cos/sin row.
template <typename T>
void norm_rope_rows(T* qkv, int64_t row_stride, int64_t tokens, int64_t q_heads, int64_t k_heads, int64_t head_dim,
                    const T* cos, const T* sin, int64_t cs_stride, const T* q_w, const T* k_w, float eps) {
  const int64_t heads = q_heads + k_heads, half = head_dim / 2;
  at::parallel_for(0, tokens * heads, 16, [&](int64_t i0, int64_t i1) {
    std::vector<T> normed(head_dim);
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t t = i / heads, h = i % heads;
      T* x = qkv + t * row_stride + h * head_dim;  // k heads follow the q heads
      const T* w = h < q_heads ? q_w : k_w;
#ifdef JIDO_NORM_AVX512
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        if (half % 16 == 0) {
          norm_rotate_head_bf16x16(x, w, cos + t * cs_stride, sin + t * cs_stride, half, eps);
          continue;
        }
      }
#endif
      if (w != nullptr) {
        norm_row<T>(x, w, nullptr, normed.data(), head_dim, eps);
        std::copy(normed.begin(), normed.end(), x);
      }
      rotate_head<T>(x, cos + t * cs_stride, sin + t * cs_stride, half);
    }
  });
}

// x and residual are made contiguous here rather than by the caller: a Python call each saved, 4 a layer.
at::Tensor rms_norm(const at::Tensor& x_in, const at::Tensor& weight, double eps,
                    const c10::optional<at::Tensor>& residual_in) {
  TORCH_CHECK(x_in.dim() >= 1, "x must have a last dimension");
  const at::Tensor x = x_in.contiguous();
  const c10::optional<at::Tensor> residual =
      residual_in.has_value() ? c10::optional<at::Tensor>(residual_in->contiguous()) : c10::nullopt;
  const int64_t dim = x.size(-1);
  TORCH_CHECK(weight.dim() == 1 && weight.size(0) == dim && weight.scalar_type() == x.scalar_type() &&
                  weight.is_contiguous(), "weight must be a contiguous [", dim, "] tensor of x's dtype");
  TORCH_CHECK(!residual.has_value() || (residual->sizes() == x.sizes() && residual->scalar_type() == x.scalar_type()),
              "residual must be shaped and typed like x");
  at::Tensor out = at::empty_like(x);
  const int64_t rows = dim ? x.numel() / dim : 0;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "jido_rms_norm", [&] {
    norm_rows<scalar_t>(x.data_ptr<scalar_t>(), weight.data_ptr<scalar_t>(),
                        residual.has_value() ? residual->data_ptr<scalar_t>() : nullptr, out.data_ptr<scalar_t>(),
                        rows, dim, static_cast<float>(eps));
  });
  return out;
}

// cos and sin: [tokens, head_dim / 2], or RotaryEmbedding's [tokens, 1, head_dim / 2] (taking the middle dim off
// here saves two Python calls a layer).
void qk_norm_rope_(at::Tensor qkv, int64_t q_size, int64_t kv_size, int64_t head_dim, const at::Tensor& cos_in,
                   const at::Tensor& sin_in, const c10::optional<at::Tensor>& q_weight,
                   const c10::optional<at::Tensor>& k_weight, double eps) {
  const auto rows_of = [](const at::Tensor& t) { return t.dim() == 3 && t.size(1) == 1 ? t.select(1, 0) : t; };
  const at::Tensor cos = rows_of(cos_in), sin = rows_of(sin_in);
  TORCH_CHECK(qkv.dim() == 2 && qkv.stride(1) == 1, "qk_norm_rope_: qkv must be [tokens, width], rows contiguous");
  TORCH_CHECK(head_dim % 2 == 0 && q_size % head_dim == 0 && kv_size % head_dim == 0 &&
                  qkv.size(1) >= q_size + kv_size, "qk_norm_rope_: q_size, kv_size and head_dim do not fit qkv");
  const int64_t tokens = qkv.size(0), half = head_dim / 2;
  for (const at::Tensor* t : {&cos, &sin})
    TORCH_CHECK(t->dim() == 2 && t->size(0) == tokens && t->size(1) == half && t->stride(1) == 1 &&
                    t->stride(0) == cos.stride(0) && t->scalar_type() == qkv.scalar_type(),
                "qk_norm_rope_: cos and sin must be [tokens, (1,) head_dim / 2] of qkv's dtype with one row stride");
  TORCH_CHECK(q_weight.has_value() == k_weight.has_value(), "qk_norm_rope_: both norm weights or neither");
  for (const auto* w : {&q_weight, &k_weight})
    TORCH_CHECK(!w->has_value() || ((*w)->dim() == 1 && (*w)->size(0) == head_dim && (*w)->is_contiguous() &&
                                    (*w)->scalar_type() == qkv.scalar_type()),
                "qk_norm_rope_: norm weights must be contiguous [head_dim] of qkv's dtype");
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, qkv.scalar_type(), "jido_qk_norm_rope", [&] {
    auto ptr = [](const c10::optional<at::Tensor>& w) { return w.has_value() ? w->data_ptr<scalar_t>() : nullptr; };
    norm_rope_rows<scalar_t>(qkv.data_ptr<scalar_t>(), qkv.stride(0), tokens, q_size / head_dim, kv_size / head_dim,
                             head_dim, cos.data_ptr<scalar_t>(), sin.data_ptr<scalar_t>(), cos.stride(0),
                             ptr(q_weight), ptr(k_weight), static_cast<float>(eps));
  });
}

}  // namespace

TORCH_LIBRARY(jido_norm, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps, Tensor? residual) -> Tensor");
  m.def("qk_norm_rope_(Tensor(a!) qkv, int q_size, int kv_size, int head_dim, Tensor cos, Tensor sin, "
        "Tensor? q_weight, Tensor? k_weight, float eps) -> ()");
}

TORCH_LIBRARY_IMPL(jido_norm, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("qk_norm_rope_", &qk_norm_rope_);
}
