// y = x @ Wᵀ for 4-bit weights in groups of 32 (engine/quantization.py), reading each group's
// packed codes once per block of rows. Each row of x is quantized per group to int16 (error
// ~1e-5 of the group's largest value, where bf16 activations, as PyTorch's int4 kernel takes
// them, err by ~4e-3), so that a group's 32 products sum exactly in int32 lanes; the group's
// scales and offset then apply in float32. A row is computed the same way whatever rows come
// with it, so a sequence's logits do not depend on its batch.
//
// `int4_pack` lays the codes out for this processor's instructions, and `int4_linear` reads
// only that layout: with AVX-512 VNNI two groups share a register, their codes ordered so that
// each int32 lane sums four products of one group (`vpdpbusd` on unsigned bytes × signed
// bytes, the int16 activations split into a signed high and an unsigned low byte); with AVX2 a
// group's codes widen to int16 for `vpmaddwd`; elsewhere plain loops.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#if defined(__AVX2__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <tuple>
#include <vector>

namespace {

constexpr int64_t kGroup = 32;
constexpr float kInt16Top = 32767.f;
// Rows multiplied by one unpacked block of codes at a time, and output channels whose blocks
// each row meets in turn: every (row, channel) keeps sums of its own, which keeps the
// multiply-add units busy where one chain of dependent additions would wait on each.
constexpr int64_t kRowBlock = 4;
constexpr int64_t kChannelBlock = 2;
// Output channels per task of the thread team.
constexpr int64_t kChannelGrain = 16;

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)

// Two groups a block: byte b of the unpacked block holds code `kPosition[b]` of group
// (b / 4) % 2, so int32 lane i sums products of group i % 2 alone. The packed block's byte i
// holds unpacked byte i in its low nibble and byte i + 32 in its high one.
constexpr int64_t kBlockGroups = 2;
constexpr int64_t kPackedBlock = 32;
constexpr int64_t kActivationBlock = 128;  // the block's 64 low bytes, then its 64 high bytes
inline int64_t group_of(int64_t byte) { return (byte / 4) % 2; }
inline int64_t position_of(int64_t byte) { return (byte / 8) * 4 + byte % 4; }

using Lanes = __m512;
using Unpacked = __m512i;

inline Unpacked unpack(const uint8_t* packed) {
  const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(packed));
  const __m256i mask = _mm256_set1_epi8(0x0F);
  const __m256i low = _mm256_and_si256(bytes, mask);
  const __m256i high = _mm256_and_si256(_mm256_srli_epi16(bytes, 4), mask);
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), high, 1);
}

// x's int16 codes as a signed high byte and an unsigned low one: code × x = 256 × code × high
// + code × low, each a `vpdpbusd` of an unsigned and a signed operand.
inline void lay_out(const int16_t* groups[kBlockGroups], uint8_t* block) {
  for (int64_t byte = 0; byte < 64; ++byte) {
    const int16_t value = groups[group_of(byte)][position_of(byte)];
    block[byte] = static_cast<uint8_t>(value & 0xFF);
    block[64 + byte] = static_cast<uint8_t>(static_cast<int8_t>(value >> 8));
  }
}

inline Lanes products(Unpacked codes, const uint8_t* x) {
  const __m512i low = _mm512_loadu_si512(x), high = _mm512_loadu_si512(x + 64);
  const __m512i high_sums = _mm512_dpbusd_epi32(_mm512_setzero_si512(), codes, high);
  return _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(_mm512_slli_epi32(high_sums, 8), low, codes));
}

// scales: the block's two groups' scales, which alternate over the lanes as the groups do.
inline Lanes scaled_add(Lanes sum, Lanes block_products, const float* scales) {
  double pair;
  std::memcpy(&pair, scales, sizeof(pair));
  return _mm512_fmadd_ps(block_products, _mm512_castpd_ps(_mm512_set1_pd(pair)), sum);
}

inline Lanes zero_lanes() { return _mm512_setzero_ps(); }
inline float sum_lanes(Lanes sum) { return _mm512_reduce_add_ps(sum); }

inline float dot(const float* a, const float* b, int64_t n) {
  __m512 sum = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 lanes = n - i >= 16 ? 0xFFFF : (1u << (n - i)) - 1;
    sum = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(lanes, a + i),
                          _mm512_maskz_loadu_ps(lanes, b + i), sum);
  }
  return _mm512_reduce_add_ps(sum);
}

#else

// One group a block: byte i holds code i in its low nibble and code i + 16 in its high one.
constexpr int64_t kBlockGroups = 1;
constexpr int64_t kPackedBlock = 16;
constexpr int64_t kActivationBlock = kGroup * sizeof(int16_t);
inline int64_t group_of(int64_t) { return 0; }
inline int64_t position_of(int64_t byte) { return byte; }

inline void lay_out(const int16_t* groups[kBlockGroups], uint8_t* block) {
  std::memcpy(block, groups[0], kActivationBlock);
}

#if defined(__AVX2__)

using Lanes = __m256;
struct Unpacked {
  __m256i low, high;  // codes 0..15 and 16..31 as int16
};

inline Unpacked unpack(const uint8_t* packed) {
  const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(packed));
  const __m128i mask = _mm_set1_epi8(0x0F);
  return {_mm256_cvtepu8_epi16(_mm_and_si128(bytes, mask)),
          _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask))};
}

inline Lanes products(const Unpacked& codes, const uint8_t* x) {
  const auto* lanes = reinterpret_cast<const __m256i*>(x);
  return _mm256_cvtepi32_ps(_mm256_add_epi32(
      _mm256_madd_epi16(codes.low, _mm256_loadu_si256(lanes)),
      _mm256_madd_epi16(codes.high, _mm256_loadu_si256(lanes + 1))));
}

inline Lanes scaled_add(Lanes sum, Lanes block_products, const float* scales) {
  return _mm256_fmadd_ps(block_products, _mm256_broadcast_ss(scales), sum);
}

inline Lanes zero_lanes() { return _mm256_setzero_ps(); }
inline float sum_lanes(Lanes sum) {
  const __m128 halves = _mm_add_ps(_mm256_castps256_ps128(sum), _mm256_extractf128_ps(sum, 1));
  const __m128 pairs = _mm_add_ps(halves, _mm_movehl_ps(halves, halves));
  return _mm_cvtss_f32(_mm_add_ss(pairs, _mm_movehdup_ps(pairs)));
}

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 sum = _mm256_setzero_ps();
  for (int64_t i = 0; i < n; i += 8) {
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n - i)),
                                             _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    sum = _mm256_fmadd_ps(_mm256_maskload_ps(a + i, lanes), _mm256_maskload_ps(b + i, lanes),
                          sum);
  }
  return sum_lanes(sum);
}

#else

using Lanes = float;
struct Unpacked {
  int16_t codes[kGroup];
};

inline Unpacked unpack(const uint8_t* packed) {
  Unpacked codes;
  for (int64_t i = 0; i < kPackedBlock; ++i) {
    codes.codes[i] = packed[i] & 0x0F;
    codes.codes[i + kPackedBlock] = packed[i] >> 4;
  }
  return codes;
}

inline Lanes products(const Unpacked& codes, const uint8_t* x) {
  int16_t values[kGroup];
  std::memcpy(values, x, sizeof(values));
  int32_t sum = 0;
  for (int64_t i = 0; i < kGroup; ++i) sum += codes.codes[i] * values[i];
  return static_cast<float>(sum);
}

inline Lanes scaled_add(Lanes sum, Lanes block_products, const float* scales) {
  return std::fma(block_products, *scales, sum);
}

inline Lanes zero_lanes() { return 0.f; }
inline float sum_lanes(Lanes sum) { return sum; }

inline float dot(const float* a, const float* b, int64_t n) {
  float sum = 0.f;
  for (int64_t i = 0; i < n; ++i) sum = std::fma(a[i], b[i], sum);
  return sum;
}

#endif
#endif

constexpr int64_t kUnpackedBlock = 2 * kPackedBlock;

inline int64_t blocks_of(int64_t groups) { return (groups + kBlockGroups - 1) / kBlockGroups; }

// x's rows quantized per group to int16 and laid out by block, with each group's scale and the
// sum of its values (which the weights' offsets multiply); groups past the last pad with 0.
struct Activations {
  int64_t blocks;
  std::vector<uint8_t> bytes;
  std::vector<float> scales, sums;

  Activations(const float* x, int64_t rows, int64_t groups)
      : blocks(blocks_of(groups)), bytes(rows * blocks * kActivationBlock),
        scales(rows * blocks * kBlockGroups), sums(rows * blocks * kBlockGroups) {
    std::vector<int16_t> codes(blocks * kBlockGroups * kGroup);
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(codes.begin(), codes.end(), 0);
      for (int64_t g = 0; g < groups; ++g) {
        const float* values = x + (r * groups + g) * kGroup;
        float top = 0.f, sum = 0.f;
        for (int64_t j = 0; j < kGroup; ++j) {
          top = std::max(top, std::fabs(values[j]));
          sum += values[j];
        }
        const float inverse = top > 0.f ? kInt16Top / top : 0.f;
        for (int64_t j = 0; j < kGroup; ++j)
          codes[g * kGroup + j] = static_cast<int16_t>(std::nearbyint(values[j] * inverse));
        scales[r * blocks * kBlockGroups + g] = top / kInt16Top;
        sums[r * blocks * kBlockGroups + g] = sum;
      }
      for (int64_t b = 0; b < blocks; ++b) {
        const int16_t* block_groups[kBlockGroups];
        for (int64_t i = 0; i < kBlockGroups; ++i)
          block_groups[i] = codes.data() + (b * kBlockGroups + i) * kGroup;
        lay_out(block_groups, bytes.data() + (r * blocks + b) * kActivationBlock);
      }
    }
  }
};

// y[r, o] for the rows [first, first + Rows) and the output channels [o, o + Channels).
// group_scales: room for Rows × Channels × the padded groups.
template <int64_t Rows, int64_t Channels>
inline void tile(const Activations& x, int64_t first, int64_t o, const uint8_t* codes,
                 const float* scales, const float* offsets, float* y, int64_t out_features,
                 float* group_scales) {
  const int64_t blocks = x.blocks, groups = blocks * kBlockGroups;
  // Each (row, channel, group)'s scale, computed in vectors ahead of the loop that reads them.
  for (int64_t r = 0; r < Rows; ++r)
    for (int64_t c = 0; c < Channels; ++c) {
      const float* x_scales = x.scales.data() + (first + r) * groups;
      const float* w_scales = scales + (o + c) * groups;
      float* target = group_scales + (r * Channels + c) * groups;
      for (int64_t g = 0; g < groups; ++g) target[g] = w_scales[g] * x_scales[g];
    }
  Lanes sums[Rows][Channels];
  for (int64_t r = 0; r < Rows; ++r)
    for (int64_t c = 0; c < Channels; ++c) sums[r][c] = zero_lanes();
  for (int64_t b = 0; b < blocks; ++b) {
    for (int64_t c = 0; c < Channels; ++c) {
      const Unpacked block = unpack(codes + ((o + c) * blocks + b) * kPackedBlock);
      for (int64_t r = 0; r < Rows; ++r) {
        const uint8_t* x_block = x.bytes.data() + ((first + r) * blocks + b) * kActivationBlock;
        sums[r][c] = scaled_add(sums[r][c], products(block, x_block),
                                group_scales + (r * Channels + c) * groups + b * kBlockGroups);
      }
    }
  }
  for (int64_t r = 0; r < Rows; ++r)
    for (int64_t c = 0; c < Channels; ++c)
      y[(first + r) * out_features + o + c] =
          sum_lanes(sums[r][c]) +
          dot(offsets + (o + c) * groups, x.sums.data() + (first + r) * groups, groups);
}

// The rows of x in blocks of kRowBlock, for the output channels [o, o + Channels).
template <int64_t Channels>
inline void channels(const Activations& x, int64_t rows, int64_t o, const uint8_t* codes,
                     const float* scales, const float* offsets, float* y, int64_t out_features,
                     float* group_scales) {
  int64_t r = 0;
  for (; r + kRowBlock <= rows; r += kRowBlock)
    tile<kRowBlock, Channels>(x, r, o, codes, scales, offsets, y, out_features, group_scales);
  for (; r < rows; ++r)
    tile<1, Channels>(x, r, o, codes, scales, offsets, y, out_features, group_scales);
}

// codes [out, in] int8 in [-8, 7], scales and zeros [out, in / 32]: w = code × scale + zero.
// Returns the codes laid out for `int4_linear`, with the scales and the offsets of code 0 as
// it reads them (zero - 8 × scale: it multiplies codes + 8), padded to whole blocks.
std::tuple<at::Tensor, at::Tensor, at::Tensor> int4_pack(const at::Tensor& codes,
                                                          const at::Tensor& scales,
                                                          const at::Tensor& zeros) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar,
              "codes [out, in] int8 expected");
  const int64_t out_features = codes.size(0), in_features = codes.size(1);
  TORCH_CHECK(in_features % kGroup == 0, "in must be a multiple of ", kGroup);
  const int64_t groups = in_features / kGroup, blocks = blocks_of(groups);
  TORCH_CHECK(scales.numel() == out_features * groups && zeros.numel() == scales.numel(),
              "scales and zeros [out, in / 32] expected");
  const at::Tensor code = codes.contiguous();
  const at::Tensor scale = scales.reshape({out_features, groups}).to(at::kFloat);
  const at::Tensor zero = zeros.reshape({out_features, groups}).to(at::kFloat);
  auto packed = at::zeros({out_features, blocks * kPackedBlock}, codes.options().dtype(at::kByte));
  auto padded_scales = at::zeros({out_features, blocks * kBlockGroups}, scale.options());
  auto offsets = at::zeros({out_features, blocks * kBlockGroups}, scale.options());
  padded_scales.narrow(1, 0, groups).copy_(scale);
  offsets.narrow(1, 0, groups).copy_(zero - 8 * scale);
  const int8_t* source = code.data_ptr<int8_t>();
  uint8_t* target = packed.data_ptr<uint8_t>();
  for (int64_t o = 0; o < out_features; ++o)
    for (int64_t b = 0; b < blocks; ++b) {
      uint8_t unpacked[kUnpackedBlock] = {};
      for (int64_t byte = 0; byte < kUnpackedBlock; ++byte) {
        const int64_t g = b * kBlockGroups + group_of(byte);
        if (g < groups)
          unpacked[byte] = static_cast<uint8_t>(
              source[o * in_features + g * kGroup + position_of(byte)] + 8);
      }
      uint8_t* block = target + (o * blocks + b) * kPackedBlock;
      for (int64_t i = 0; i < kPackedBlock; ++i)
        block[i] = static_cast<uint8_t>(unpacked[i] | (unpacked[i + kPackedBlock] << 4));
    }
  return {packed, padded_scales, offsets};
}

// x [rows, in] float32 times the weight `int4_pack` laid out: [rows, out] float32.
at::Tensor int4_linear(const at::Tensor& x, const at::Tensor& codes, const at::Tensor& scales,
                       const at::Tensor& offsets) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x [rows, in] float32 expected");
  const int64_t rows = x.size(0), in_features = x.size(1), out_features = codes.size(0);
  TORCH_CHECK(in_features % kGroup == 0, "in must be a multiple of ", kGroup);
  const int64_t groups = in_features / kGroup, blocks = blocks_of(groups);
  TORCH_CHECK(codes.scalar_type() == at::kByte && codes.is_contiguous() &&
                  codes.size(1) == blocks * kPackedBlock,
              "codes as int4_pack lays them out for x's columns expected");
  for (const at::Tensor* grid : {&scales, &offsets})
    TORCH_CHECK(grid->scalar_type() == at::kFloat && grid->is_contiguous() &&
                    grid->numel() == out_features * blocks * kBlockGroups,
                "scales and offsets as int4_pack returns them expected");
  const at::Tensor input = x.contiguous();
  const Activations activations(input.data_ptr<float>(), rows, groups);
  auto y = at::empty({rows, out_features}, x.options());
  const uint8_t* code = codes.data_ptr<uint8_t>();
  const float* scale = scales.data_ptr<float>();
  const float* offset = offsets.data_ptr<float>();
  float* target = y.data_ptr<float>();
  at::parallel_for(0, out_features, kChannelGrain, [&](int64_t begin, int64_t end) {
    std::vector<float> group_scales(kRowBlock * kChannelBlock * blocks * kBlockGroups);
    int64_t o = begin;
    for (; o + kChannelBlock <= end; o += kChannelBlock)
      channels<kChannelBlock>(activations, rows, o, code, scale, offset, target, out_features,
                              group_scales.data());
    for (; o < end; ++o)
      channels<1>(activations, rows, o, code, scale, offset, target, out_features,
                  group_scales.data());
  });
  return y;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(switchboard, m) {
  m.def("int4_pack(Tensor codes, Tensor scales, Tensor zeros) -> (Tensor, Tensor, Tensor)");
  m.def("int4_linear(Tensor x, Tensor codes, Tensor scales, Tensor offsets) -> Tensor");
}

TORCH_LIBRARY_IMPL(switchboard, CPU, m) {
  m.impl("int4_pack", &int4_pack);
  m.impl("int4_linear", &int4_linear);
}
