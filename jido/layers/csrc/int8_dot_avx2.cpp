// The vector kernels (int8_dot_kernels.h) for AVX2: products by maddubs + madd. Compiled with the build's own flags,
// as before the units were split (on an AVX-512 build the compiler may use its registers here too).
#include "int8_dot_common.h"

#if defined(__AVX2__)
namespace jido_int8_dot {
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
#include "int8_dot_kernels.h"
}  // namespace avx2

void fill_avx2(Kernels* k) { avx2::fill_vector_kernels(k); }
}  // namespace jido_int8_dot
#endif  // __AVX2__
