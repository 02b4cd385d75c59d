// GGML K-quant blocks decoded into integer codes with a float32 scale (and offset) per group, as
// jido/models/gguf_blocks.py's numpy decoders do, bit for bit: the same f16 -> f32 conversions and one float32
// product per scale. A GGUF model's weights are decoded at every load (nothing derived is cached on disk), and in
// numpy the K-quants took most of that time: several passes over the codes per shift and mask, where these loops make
// one, block-parallel.
//
//   decode_q4_k(blocks uint8 [n, 144]) -> (q int8 [n * 256] in 0..15, scales float32 [n * 8], offsets float32 [n * 8])
//   decode_q6_k(blocks uint8 [n, 210]) -> (q int8 [n * 256] in -32..31, scales float32 [n * 16])
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <cstdint>
#include <cstring>
#include <tuple>

namespace {

constexpr int64_t kQK = 256;  // values in a K-quant super-block
constexpr int64_t kQ4KBytes = 144;
constexpr int64_t kQ6KBytes = 210;

float f16_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return static_cast<float>(c10::Half(bits, c10::Half::from_bits()));
}

void check_blocks(const at::Tensor& blocks, int64_t block_bytes, const char* name) {
  TORCH_CHECK(blocks.scalar_type() == at::kByte && blocks.dim() == 2 && blocks.size(1) == block_bytes &&
                  blocks.is_contiguous(),
              name, ": blocks must be contiguous uint8 [n, ", block_bytes, "]");
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> decode_q4_k(const at::Tensor& blocks) {
  check_blocks(blocks, kQ4KBytes, "decode_q4_k");
  const int64_t n = blocks.size(0);
  auto q = at::empty({n * kQK}, blocks.options().dtype(at::kChar));
  auto scales = at::empty({n * 8}, blocks.options().dtype(at::kFloat));
  auto offsets = at::empty({n * 8}, blocks.options().dtype(at::kFloat));
  const uint8_t* in = blocks.data_ptr<uint8_t>();
  int8_t* out_q = q.data_ptr<int8_t>();
  float* out_s = scales.data_ptr<float>();
  float* out_o = offsets.data_ptr<float>();
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const uint8_t* block = in + b * kQ4KBytes;
      const float d = f16_at(block), dmin = f16_at(block + 2);
      const uint8_t* s = block + 4;  // 12 bytes: six-bit scales and mins of the 8 sub-blocks
      for (int j = 0; j < 8; ++j) {
        const int sc = j < 4 ? (s[j] & 0x3F) : ((s[j + 4] & 0x0F) | ((s[j - 4] >> 2) & 0x30));
        const int m = j < 4 ? (s[j + 4] & 0x3F) : ((s[j + 4] >> 4) | ((s[j] >> 2) & 0x30));
        out_s[b * 8 + j] = d * static_cast<float>(sc);
        out_o[b * 8 + j] = -(dmin * static_cast<float>(m));
      }
      const uint8_t* qs = block + 16;  // 4 runs of 32 bytes: low nibbles values 0..31 of 64, high nibbles 32..63
      int8_t* dst = out_q + b * kQK;
      for (int g = 0; g < 4; ++g) {
        for (int i = 0; i < 32; ++i) {
          dst[64 * g + i] = static_cast<int8_t>(qs[32 * g + i] & 0x0F);
          dst[64 * g + 32 + i] = static_cast<int8_t>(qs[32 * g + i] >> 4);
        }
      }
    }
  });
  return {q, scales, offsets};
}

std::tuple<at::Tensor, at::Tensor> decode_q6_k(const at::Tensor& blocks) {
  check_blocks(blocks, kQ6KBytes, "decode_q6_k");
  const int64_t n = blocks.size(0);
  auto q = at::empty({n * kQK}, blocks.options().dtype(at::kChar));
  auto scales = at::empty({n * 16}, blocks.options().dtype(at::kFloat));
  const uint8_t* in = blocks.data_ptr<uint8_t>();
  int8_t* out_q = q.data_ptr<int8_t>();
  float* out_s = scales.data_ptr<float>();
  at::parallel_for(0, n, 256, [&](int64_t begin, int64_t end) {
    for (int64_t b = begin; b < end; ++b) {
      const uint8_t* block = in + b * kQ6KBytes;
      const uint8_t* ql = block;         // 128 bytes: low four bits
      const uint8_t* qh = block + 128;   // 64 bytes: high two bits
      const int8_t* sc = reinterpret_cast<const int8_t*>(block + 192);  // 16 signed scales
      const float d = f16_at(block + 208);
      for (int j = 0; j < 16; ++j) out_s[b * 16 + j] = d * static_cast<float>(sc[j]);
      int8_t* dst = out_q + b * kQK;
      // Two halves of 128 values, four runs of 32 each: run r takes ql's (r % 2)-th 32 bytes, nibble r / 2,
      // and bits 2r..2r+1 of qh.
      for (int h = 0; h < 2; ++h) {
        for (int r = 0; r < 4; ++r) {
          for (int i = 0; i < 32; ++i) {
            const int low = (ql[h * 64 + (r % 2) * 32 + i] >> (4 * (r / 2))) & 0x0F;
            const int high = (qh[h * 32 + i] >> (2 * r)) & 0x03;
            dst[h * 128 + r * 32 + i] = static_cast<int8_t>((low | (high << 4)) - 32);
          }
        }
      }
    }
  });
  return {q, scales};
}

}  // namespace

TORCH_LIBRARY(jido_gguf_decode, m) {
  m.def("decode_q4_k(Tensor blocks) -> (Tensor, Tensor, Tensor)");
  m.def("decode_q6_k(Tensor blocks) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(jido_gguf_decode, CPU, m) {
  m.impl("decode_q4_k", &decode_q4_k);
  m.impl("decode_q6_k", &decode_q6_k);
}
