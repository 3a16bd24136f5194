// Elementwise math in loops the compiler vectorises, shared by the native kernels.

#pragma once

#include <cmath>
#include <cstdint>

// bfloat16 bits to float and back (round to nearest even, a NaN kept a NaN) in plain integer
// operations, which vectorise where c10::BFloat16's conversion per element does not.
inline float bf16_to_float(uint16_t bits) {
  return __builtin_bit_cast(float, static_cast<uint32_t>(bits) << 16);
}

inline uint16_t float_to_bf16(float value) {
  const auto bits = __builtin_bit_cast(uint32_t, value);
  const uint32_t rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16;
  return std::isnan(value) ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

// e^x for x <= 0 in a loop the compiler vectorises (std::exp is a call per element): 2^k e^r
// with |r| <= ln 2 / 2 (ln 2 split in two for exactness), e^r by its Taylor polynomial to r^6
// (relative error ~1e-7); below -87 it is the least normal float, not 0. k is rounded by
// adding and taking away 1.5 · 2^23, as std::floor would not vectorise.
inline float exp_nonpositive(float x) {
  constexpr float kRound = 12582912.f;
  x = x < -87.f ? -87.f : x;
  const float k = (x * 1.44269504f + kRound) - kRound;
  const float r = (x - k * 0.693359375f) + k * 2.12194440e-4f;
  const float p = 1.f + r * (1.f + r * (0.5f + r * (1.f / 6 + r * (1.f / 24 +
                   r * (1.f / 120 + r * (1.f / 720))))));
  return p * __builtin_bit_cast(float, (static_cast<int32_t>(k) + 127) << 23);
}

// x · sigmoid(x), from e^−|x| alone: 1 / (1 + e^−x) for x >= 0, e^x / (1 + e^x) below.
inline float silu(float x) {
  const float e = exp_nonpositive(-std::fabs(x));
  return x * (x >= 0.f ? 1.f : e) / (1.f + e);
}
