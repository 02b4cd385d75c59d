// bf16 <-> float32 as c10 converts, for every one of jido's extension libraries (each build hashes this folder with
// its own, see jido/utils/cpp_build.py): a bf16 is the top 16 bits of a float32; rounding to it goes to nearest,
// ties to even, and a NaN becomes 0x7fc0. Plain integer arithmetic, so GCC vectorizes the loops that call these and
// CPUs without AVX-512 BF16 give the same bits.
#pragma once

#include <cstdint>
#include <cstring>

namespace jido_bf16 {

// The float a bf16 holds.
inline float to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float out;
  std::memcpy(&out, &u, sizeof(out));
  return out;
}

// x rounded to the nearest bf16 (ties to even; NaN to 0x7fc0), as its bits.
inline uint16_t round_bits(float x) {
  uint32_t u;
  std::memcpy(&u, &x, sizeof(u));
  return x != x ? 0x7fc0 : static_cast<uint16_t>((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

typedef float f32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));

// 16 finite floats rounded as round_bits rounds them (no NaN check: callers hold finite values), in GCC's generic
// vectors, which compile to whatever the build's ISA offers.
inline u16x16 round_bits16(f32x16 x) {
  typedef uint32_t u32x16 __attribute__((vector_size(64)));
  u32x16 u;
  std::memcpy(&u, &x, sizeof(u));
  return __builtin_convertvector((u + 0x7fff + ((u >> 16) & 1)) >> 16, u16x16);
}

}  // namespace jido_bf16
