// The small operations of a decoder layer, each one call where PyTorch took several: at a
// decoding step's few rows a framework call costs more than its arithmetic, and a step of
// SmolLM2 made some thirty of them a layer (docs/engine-measurements.md#fused-layer-operations).
//
// - rms_norm: x · rsqrt(mean(x²) + eps) · weight over float32 rows (transformers' RMSNorm);
// - add_rms_norm: the residual stream += a layer's output, in place, then rms_norm of it;
// - rotary_to_cache: rotary position embedding of the queries and keys (rotate-half, as
//   transformers' Llama), the keys and values written to the KV cache at their slots, the
//   queries returned in the cache's dtype;
// - silu_mul: silu(gate) · up from the fused gate/up projection's output, silu rounded to the
//   input's dtype before the product, as PyTorch's two operations round: in bf16, rounding
//   once instead flipped SmolLM2's near tie on "What is the capital of France?" away from the
//   float32 model's answer.
// The others compute in float32 and round once to their output's dtype; a row is computed
// alike whatever rows come with it.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <cmath>
#include <cstdint>

#include "vector_math.h"

namespace {

// Rows per task of the thread team: a step of a few rows runs on the calling thread alone.
constexpr int64_t kRowGrain = 8;
// Partial sums of squares kept apart: one chain of dependent additions would not vectorise.
constexpr int64_t kPartials = 16;

inline float widen(float value) { return value; }
inline float widen(at::BFloat16 value) { return bf16_to_float(value.x); }

template <typename T>
inline T narrow(float value);
template <>
inline float narrow<float>(float value) { return value; }
template <>
inline at::BFloat16 narrow<at::BFloat16>(float value) {
  return at::BFloat16(float_to_bf16(value), at::BFloat16::from_bits());
}

void normalise_row(const float* x, const float* weight, float eps, int64_t n, float* out) {
  float partial[kPartials] = {};
  int64_t i = 0;
  for (; i + kPartials <= n; i += kPartials)
    for (int64_t lane = 0; lane < kPartials; ++lane) partial[lane] += x[i + lane] * x[i + lane];
  for (; i < n; ++i) partial[0] += x[i] * x[i];
  float sum = 0.f;
  for (float value : partial) sum += value;
  const float scale = 1.f / std::sqrt(sum / static_cast<float>(n) + eps);
  for (i = 0; i < n; ++i) out[i] = weight[i] * (x[i] * scale);
}

void check_rows(const at::Tensor& x, const at::Tensor& weight) {
  TORCH_CHECK(x.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat,
              "float32 rows and weight expected");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && weight.is_contiguous() &&
                  weight.numel() == x.size(1),
              "rows [N, hidden] with contiguous rows, and a weight [hidden], expected");
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  check_rows(x, weight);
  const int64_t rows = x.size(0), n = x.size(1), stride = x.stride(0);
  auto out = at::empty({rows, n}, x.options());
  const float* source = x.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* target = out.data_ptr<float>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row)
      normalise_row(source + row * stride, w, static_cast<float>(eps), n, target + row * n);
  });
  return out;
}

template <typename T>
void add_rows(float* residual, const T* delta, int64_t n) {
  for (int64_t i = 0; i < n; ++i) residual[i] += widen(delta[i]);
}

at::Tensor add_rms_norm(at::Tensor& residual, const at::Tensor& delta, const at::Tensor& weight,
                        double eps) {
  check_rows(residual, weight);
  TORCH_CHECK(residual.is_contiguous() && delta.sizes() == residual.sizes() &&
                  delta.stride(1) == 1,
              "a contiguous residual stream and an output of its shape with contiguous rows "
              "expected");
  TORCH_CHECK(delta.scalar_type() == at::kFloat || delta.scalar_type() == at::kBFloat16,
              "a float32 or bfloat16 output expected, got ", delta.scalar_type());
  const int64_t rows = residual.size(0), n = residual.size(1), delta_stride = delta.stride(0);
  auto out = at::empty({rows, n}, residual.options());
  float* stream = residual.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* target = out.data_ptr<float>();
  const bool is_float = delta.scalar_type() == at::kFloat;
  const void* added = delta.data_ptr();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      if (is_float)
        add_rows(stream + row * n, static_cast<const float*>(added) + row * delta_stride, n);
      else
        add_rows(stream + row * n, static_cast<const at::BFloat16*>(added) + row * delta_stride,
                 n);
      normalise_row(stream + row * n, w, static_cast<float>(eps), n, target + row * n);
    }
  });
  return out;
}

// One head's row rotated: out[i] = x[i]·cos[i] − x[i+half]·sin[i] in the first half,
// x[i]·cos[i] + x[i−half]·sin[i] in the second.
template <typename In, typename Out>
void rotate_head(const In* x, const float* cos, const float* sin, int64_t dim, Out* out) {
  const int64_t half = dim / 2;
  for (int64_t i = 0; i < half; ++i)
    out[i] = narrow<Out>(widen(x[i]) * cos[i] - widen(x[i + half]) * sin[i]);
  for (int64_t i = half; i < dim; ++i)
    out[i] = narrow<Out>(widen(x[i]) * cos[i] + widen(x[i - half]) * sin[i]);
}

template <typename In, typename Out>
void rotate_rows(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                 at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots,
                 int64_t heads, int64_t kv_heads, at::Tensor& queries) {
  const int64_t rows = qkv.size(0), dim = qkv.size(2), row_stride = qkv.stride(0);
  const In* source = qkv.data_ptr<In>();
  const float* cosines = cos.data_ptr<float>();
  const float* sines = sin.data_ptr<float>();
  const int64_t* slot = slots.data_ptr<int64_t>();
  Out* keys = k_cache.data_ptr<Out>();
  Out* values = v_cache.data_ptr<Out>();
  Out* q = queries.data_ptr<Out>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const In* x = source + row * row_stride;
      const float* c = cosines + row * dim;
      const float* s = sines + row * dim;
      Out* key_row = keys + slot[row] * kv_heads * dim;
      Out* value_row = values + slot[row] * kv_heads * dim;
      for (int64_t head = 0; head < heads; ++head)
        rotate_head(x + head * dim, c, s, dim, q + (row * heads + head) * dim);
      for (int64_t head = 0; head < kv_heads; ++head)
        rotate_head(x + (heads + head) * dim, c, s, dim, key_row + head * dim);
      const In* v = x + (heads + kv_heads) * dim;
      for (int64_t i = 0; i < kv_heads * dim; ++i) value_row[i] = narrow<Out>(widen(v[i]));
    }
  });
}

template <typename In>
void rotate_into(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                 at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots,
                 int64_t heads, int64_t kv_heads, at::Tensor& queries) {
  if (k_cache.scalar_type() == at::kFloat)
    rotate_rows<In, float>(qkv, cos, sin, k_cache, v_cache, slots, heads, kv_heads, queries);
  else
    rotate_rows<In, at::BFloat16>(qkv, cos, sin, k_cache, v_cache, slots, heads, kv_heads,
                                  queries);
}

bool is_supported(at::ScalarType dtype) {
  return dtype == at::kFloat || dtype == at::kBFloat16;
}

at::Tensor rotary_to_cache(const at::Tensor& qkv, const at::Tensor& cos, const at::Tensor& sin,
                           at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& slots,
                           int64_t heads, int64_t kv_heads) {
  TORCH_CHECK(qkv.dim() == 3 && qkv.stride(2) == 1 && qkv.stride(1) == qkv.size(2) &&
                  qkv.size(1) == heads + 2 * kv_heads && qkv.size(2) % 2 == 0,
              "qkv [N, heads + 2 kv heads, even head size] with contiguous rows expected");
  const int64_t rows = qkv.size(0), dim = qkv.size(2);
  TORCH_CHECK(cos.scalar_type() == at::kFloat && sin.scalar_type() == at::kFloat &&
                  cos.is_contiguous() && sin.is_contiguous() && cos.numel() == rows * dim &&
                  sin.numel() == rows * dim,
              "float32 cos and sin [N, head size] expected");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.dim() == 3 &&
                  k_cache.sizes() == v_cache.sizes() && k_cache.size(1) == kv_heads &&
                  k_cache.size(2) == dim && k_cache.scalar_type() == v_cache.scalar_type() &&
                  is_supported(k_cache.scalar_type()),
              "float32 or bfloat16 caches [slots, kv heads, head size] of one dtype expected");
  TORCH_CHECK(is_supported(qkv.scalar_type()), "float32 or bfloat16 qkv expected, got ",
              qkv.scalar_type());
  TORCH_CHECK(slots.scalar_type() == at::kLong && slots.is_contiguous() && slots.numel() == rows,
              "slots [N] int64 expected");
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t row = 0; row < rows; ++row)
    TORCH_CHECK(slot[row] >= 0 && slot[row] < k_cache.size(0), "a slot outside the caches");
  auto queries = at::empty({rows, heads, dim}, qkv.options().dtype(k_cache.scalar_type()));
  if (qkv.scalar_type() == at::kFloat)
    rotate_into<float>(qkv, cos, sin, k_cache, v_cache, slots, heads, kv_heads, queries);
  else
    rotate_into<at::BFloat16>(qkv, cos, sin, k_cache, v_cache, slots, heads, kv_heads, queries);
  return queries;
}

template <typename T>
void silu_mul_rows(const at::Tensor& gate_up, at::Tensor& out) {
  const int64_t rows = gate_up.size(0), n = out.size(1), stride = gate_up.stride(0);
  const T* source = gate_up.data_ptr<T>();
  T* target = out.data_ptr<T>();
  at::parallel_for(0, rows, kRowGrain, [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const T* gate = source + row * stride;
      const T* up = gate + n;
      for (int64_t i = 0; i < n; ++i) {
        target[row * n + i] = narrow<T>(widen(narrow<T>(silu(widen(gate[i])))) * widen(up[i]));
      }
    }
  });
}

at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.stride(1) == 1 && gate_up.size(1) % 2 == 0,
              "gate_up [N, 2 intermediate] with contiguous rows expected");
  TORCH_CHECK(is_supported(gate_up.scalar_type()), "float32 or bfloat16 expected, got ",
              gate_up.scalar_type());
  auto out = at::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  if (gate_up.scalar_type() == at::kFloat)
    silu_mul_rows<float>(gate_up, out);
  else
    silu_mul_rows<at::BFloat16>(gate_up, out);
  return out;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(switchboard, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor(a!) residual, Tensor delta, Tensor weight, float eps) -> Tensor");
  m.def("rotary_to_cache(Tensor qkv, Tensor cos, Tensor sin, Tensor(a!) k_cache, "
        "Tensor(b!) v_cache, Tensor slots, int heads, int kv_heads) -> Tensor");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(switchboard, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("add_rms_norm", &add_rms_norm);
  m.impl("rotary_to_cache", &rotary_to_cache);
  m.impl("silu_mul", &silu_mul);
}
