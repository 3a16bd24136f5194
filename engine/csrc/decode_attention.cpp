// Attention of decoding sequences (one query each) straight from the paged KV cache: each
// (sequence, K/V head) reads its context's K and V rows by their cache slots once, where
// gathering them into a padded copy first and attending that with SDPA read and wrote them
// twice and cost a few framework calls a layer (docs/engine-measurements.md#decoding-attention).

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include "vector_math.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <utility>
#include <vector>

namespace {

// W floats as one vector: the compiler maps it onto the processor's SIMD registers (AVX-512,
// AVX2, NEON...); W == 1 is the plain scalar loop, for head sizes no larger width divides.
template <int W>
struct Lanes {
  typedef float type __attribute__((vector_size(sizeof(float) * W)));
};
template <int W>
using Vec = typename Lanes<W>::type;

template <int W>
inline Vec<W> load(const float* source) {
  Vec<W> value;
  std::memcpy(&value, source, sizeof(value));
  return value;
}

template <int W, int First, std::size_t... Lane>
inline Vec<W / 2> half(Vec<W> value, std::index_sequence<Lane...>) {
  return __builtin_shufflevector(value, value, (First + Lane)...);
}

// Halves added pairwise within registers: a few shuffles where adding lane after lane took W
// dependent adds.
template <int W>
inline float sum_lanes(Vec<W> value) {
  if constexpr (W == 2) {
    return value[0] + value[1];
  } else {
    constexpr auto lanes = std::make_index_sequence<W / 2>{};
    return sum_lanes<W / 2>(half<W, 0>(value, lanes) + half<W, W / 2>(value, lanes));
  }
}

// Sums of products are kept in kChains registers in turn: one sum's chain of dependent FMAs
// would wait each FMA's latency out.
constexpr int kChains = 4;

template <int W>
inline float dot(const float* a, const float* b, int64_t n) {
  if constexpr (W == 1) {
    float sum = 0.f;
    for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
    return sum;
  } else {
    Vec<W> sums[kChains] = {};
    int64_t i = 0;
    for (; i + kChains * W <= n; i += kChains * W)
      for (int chain = 0; chain < kChains; ++chain)
        sums[chain] += load<W>(a + i + chain * W) * load<W>(b + i + chain * W);
    for (; i < n; i += W) sums[0] += load<W>(a + i) * load<W>(b + i);
    return sum_lanes<W>((sums[0] + sums[1]) + (sums[2] + sums[3]));
  }
}

// sum over rows i of weights[i] * rows[i][first : first + W]: a column block of a GEMV,
// whose running sum stays in a register.
template <int W>
inline Vec<W> weighted_sum(const float* rows, const float* weights, int64_t n, int64_t stride,
                           int64_t first) {
  Vec<W> sums[kChains] = {};
  int64_t i = 0;
  for (; i + kChains <= n; i += kChains)
    for (int chain = 0; chain < kChains; ++chain)
      sums[chain] += weights[i + chain] * load<W>(rows + (i + chain) * stride + first);
  for (; i < n; ++i) sums[0] += weights[i] * load<W>(rows + i * stride + first);
  return (sums[0] + sums[1]) + (sums[2] + sums[3]);
}

inline void to_float(const float* source, float* target, int64_t n) {
  std::memcpy(target, source, n * sizeof(float));
}

inline void to_float(const at::BFloat16* source, float* target, int64_t n) {
  for (int64_t i = 0; i < n; ++i) target[i] = bf16_to_float(source[i].x);
}

// Rows are fetched this many context positions ahead: slots scatter them over the cache,
// and the model's other weights have evicted them since the layer before.
constexpr int64_t kPrefetch = 8;

template <typename T>
inline void prefetch(const T* row, int64_t n) {
  const auto* bytes = reinterpret_cast<const char*>(row);
  for (int64_t offset = 0; offset < n * static_cast<int64_t>(sizeof(T)); offset += 64)
    __builtin_prefetch(bytes + offset);
}

template <typename T, int W>
void attend(const at::Tensor& queries, const at::Tensor& k_cache, const at::Tensor& v_cache,
            const at::Tensor& slots, const at::Tensor& lengths, int64_t window, double scale,
            at::Tensor& out) {
  const int64_t batch = queries.size(0), heads = queries.size(1), head_dim = queries.size(2);
  const int64_t kv_heads = k_cache.size(1), group = heads / kv_heads;
  const int64_t query_stride = queries.stride(0), slot_stride = slots.stride(0);
  const T* q = queries.data_ptr<T>();
  const T* k = k_cache.data_ptr<T>();
  const T* v = v_cache.data_ptr<T>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  const int64_t* length = lengths.data_ptr<int64_t>();
  T* o = out.data_ptr<T>();
  const float scale_f = static_cast<float>(scale);
  at::parallel_for(0, batch * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> query(group * head_dim), row(head_dim), scores, values, inverse(group);
    for (int64_t work = begin; work < end; ++work) {
      const int64_t b = work / kv_heads, kv_head = work % kv_heads;
      const int64_t stop = length[b], start = window > 0 ? std::max<int64_t>(0, stop - window) : 0;
      const int64_t n = stop - start;
      const int64_t* context = slot + b * slot_stride + start;
      const auto row_offset = [&](int64_t i) {
        return (context[i] * kv_heads + kv_head) * head_dim;
      };
      const auto k_row = [&](int64_t i) { return k + row_offset(i); };
      const auto v_row = [&](int64_t i) { return v + row_offset(i); };
      to_float(q + b * query_stride + kv_head * group * head_dim, query.data(), group * head_dim);
      for (float& value : query) value *= scale_f;
      scores.resize(group * n);
      for (int64_t i = 0; i < n; ++i) {
        if (i + kPrefetch < n) prefetch(k_row(i + kPrefetch), head_dim);
        to_float(k_row(i), row.data(), head_dim);
        for (int64_t g = 0; g < group; ++g)
          scores[g * n + i] = dot<W>(query.data() + g * head_dim, row.data(), head_dim);
      }
      for (int64_t g = 0; g < group; ++g) {
        float* s = scores.data() + g * n;
        const float top = n ? *std::max_element(s, s + n) : 0.f;
        for (int64_t i = 0; i < n; ++i) s[i] = exp_nonpositive(s[i] - top);
        const float total = std::accumulate(s, s + n, 0.f);
        inverse[g] = total > 0.f ? 1.f / total : 0.f;
      }
      values.resize(n * head_dim);
      for (int64_t i = 0; i < n; ++i) {
        if (i + kPrefetch < n) prefetch(v_row(i + kPrefetch), head_dim);
        to_float(v_row(i), values.data() + i * head_dim, head_dim);
      }
      T* target = o + (b * heads + kv_head * group) * head_dim;
      for (int64_t g = 0; g < group; ++g) {
        for (int64_t first = 0; first < head_dim; first += W) {
          const Vec<W> sum = weighted_sum<W>(values.data(), scores.data() + g * n, n, head_dim,
                                             first) * inverse[g];
          for (int64_t d = 0; d < W; ++d) target[g * head_dim + first + d] = static_cast<T>(sum[d]);
        }
      }
    }
  });
}

template <typename T>
void attend_in_lanes(const at::Tensor& queries, const at::Tensor& k_cache,
                     const at::Tensor& v_cache, const at::Tensor& slots,
                     const at::Tensor& lengths, int64_t window, double scale, at::Tensor& out) {
  const int64_t head_dim = queries.size(2);
  if (head_dim % 16 == 0) {
    attend<T, 16>(queries, k_cache, v_cache, slots, lengths, window, scale, out);
  } else if (head_dim % 8 == 0) {
    attend<T, 8>(queries, k_cache, v_cache, slots, lengths, window, scale, out);
  } else if (head_dim % 4 == 0) {
    attend<T, 4>(queries, k_cache, v_cache, slots, lengths, window, scale, out);
  } else {
    attend<T, 1>(queries, k_cache, v_cache, slots, lengths, window, scale, out);
  }
}

at::Tensor decode_attention(const at::Tensor& queries, const at::Tensor& k_cache,
                            const at::Tensor& v_cache, const at::Tensor& slots,
                            const at::Tensor& lengths, int64_t window, double scale) {
  TORCH_CHECK(queries.dim() == 3 && k_cache.dim() == 3 && v_cache.dim() == 3,
              "queries [B, H, D] and caches [slots, Hkv, D] expected");
  TORCH_CHECK(queries.stride(2) == 1 && queries.stride(1) == queries.size(2),
              "each query's heads must be contiguous");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "contiguous caches expected");
  TORCH_CHECK(k_cache.sizes() == v_cache.sizes() && k_cache.size(2) == queries.size(2),
              "caches of one shape, with the queries' head size, expected");
  TORCH_CHECK(queries.size(1) % k_cache.size(1) == 0, "query heads must group over K/V heads");
  TORCH_CHECK(queries.scalar_type() == k_cache.scalar_type() &&
                  k_cache.scalar_type() == v_cache.scalar_type(),
              "queries and caches of one dtype expected");
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.dim() == 2 && slots.stride(1) == 1 &&
                  slots.size(0) == queries.size(0),
              "slots [B, L] int64 expected");
  TORCH_CHECK(lengths.scalar_type() == at::kLong && lengths.is_contiguous() &&
                  lengths.numel() == queries.size(0),
              "lengths [B] int64 expected");
  const int64_t* length = lengths.data_ptr<int64_t>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t b = 0; b < lengths.numel(); ++b) {
    TORCH_CHECK(length[b] >= 0 && length[b] <= slots.size(1), "a length past its row of slots");
    for (int64_t i = 0; i < length[b]; ++i) {
      const int64_t read = slot[b * slots.stride(0) + i];
      TORCH_CHECK(read >= 0 && read < k_cache.size(0), "a slot outside the caches");
    }
  }
  auto out = at::empty({queries.size(0), queries.size(1) * queries.size(2)}, queries.options());
  if (queries.scalar_type() == at::kFloat) {
    attend_in_lanes<float>(queries, k_cache, v_cache, slots, lengths, window, scale, out);
  } else if (queries.scalar_type() == at::kBFloat16) {
    attend_in_lanes<at::BFloat16>(queries, k_cache, v_cache, slots, lengths, window, scale, out);
  } else {
    TORCH_CHECK(false, "float32 or bfloat16 expected, got ", queries.scalar_type());
  }
  return out;
}

}  // namespace

TORCH_LIBRARY(switchboard, m) {
  m.def("decode_attention(Tensor queries, Tensor k_cache, Tensor v_cache, Tensor slots, "
        "Tensor lengths, int window, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(switchboard, CPU, m) { m.impl("decode_attention", &decode_attention); }
