// A decoding step's layers in one call (engine/paged_runner.py, `DecodeStack`): every
// sequence one token, each projection by its packed weight-only kernel. Called from Python,
// each layer made some fifteen framework calls, each paying the interpreter and the GIL, which
// the serving loop's thread then waited for; here the GIL is released for the whole stack
// (docs/engine-measurements.md#fused-layer-operations).

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <cmath>
#include <vector>

namespace {

// How a projection's packed weight is multiplied, as `PackedKind` in engine/quantization.py
// names them: PyTorch's int4 kernel, the native one (int4_linear.cpp), PyTorch's int8 kernel.
enum class PackedKind : int64_t { kTorchInt4 = 0, kNativeInt4 = 1, kInt8 = 2 };
constexpr int64_t kProjections = 4;  // per layer: qkv, output, gate/up, down
constexpr int64_t kTensorsPerProjection = 4;  // three of the kernel's and a bias (empty: none)

template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

struct Ops {
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, double)> rms_norm =
      op<at::Tensor(const at::Tensor&, const at::Tensor&, double)>("switchboard::rms_norm");
  c10::TypedOperatorHandle<at::Tensor(at::Tensor&, const at::Tensor&, const at::Tensor&, double)>
      add_rms_norm = op<at::Tensor(at::Tensor&, const at::Tensor&, const at::Tensor&, double)>(
          "switchboard::add_rms_norm");
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      at::Tensor&, at::Tensor&, const at::Tensor&, int64_t,
                                      int64_t)>
      rotary_to_cache = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      at::Tensor&, at::Tensor&, const at::Tensor&, int64_t,
                                      int64_t)>("switchboard::rotary_to_cache");
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&)> silu_mul =
      op<at::Tensor(const at::Tensor&)>("switchboard::silu_mul");
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&, const at::Tensor&, int64_t, double)>
      decode_attention = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                       const at::Tensor&, const at::Tensor&, int64_t, double)>(
          "switchboard::decode_attention");
  c10::TypedOperatorHandle<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                      const at::Tensor&)>
      int4_linear = op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                  const at::Tensor&)>("switchboard::int4_linear");
};

const Ops& ops() {
  static const Ops handles;
  return handles;
}

at::Tensor project(PackedKind kind, const at::Tensor* weight, int64_t group_size,
                   const at::Tensor& x) {
  at::Tensor y;
  switch (kind) {
    case PackedKind::kTorchInt4:
      y = at::_weight_int4pack_mm_for_cpu(x.to(at::kBFloat16), weight[0], group_size, weight[1]);
      break;
    case PackedKind::kNativeInt4:
      y = ops().int4_linear.call(x.to(at::kFloat), weight[0], weight[1], weight[2]);
      break;
    case PackedKind::kInt8:
      y = at::_weight_int8pack_mm(x.to(at::kBFloat16), weight[0], weight[1]);
      break;
    default:
      TORCH_CHECK(false, "unknown packed kind ", static_cast<int64_t>(kind));
  }
  return weight[3].numel() ? y + weight[3] : y;
}

at::Tensor decode_layers(at::Tensor& hidden, const at::Tensor& cos, const at::Tensor& sin,
                         at::Tensor& k_cache, at::Tensor& v_cache, const at::Tensor& write_slots,
                         const at::Tensor& context_slots, const at::Tensor& context_lens,
                         at::TensorList norms, double eps, at::IntArrayRef kinds,
                         at::TensorList weights, int64_t group_size, int64_t heads,
                         int64_t kv_heads, at::IntArrayRef windows) {
  const int64_t layers = static_cast<int64_t>(windows.size());
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(0) == layers && v_cache.sizes() == k_cache.sizes(),
              "caches [layers, slots, kv heads, head size] for every layer expected");
  TORCH_CHECK(static_cast<int64_t>(norms.size()) == 2 * layers + 1,
              "an input and a post-attention norm per layer, and the final norm, expected");
  TORCH_CHECK(static_cast<int64_t>(kinds.size()) == kProjections * layers &&
                  static_cast<int64_t>(weights.size()) ==
                      kProjections * kTensorsPerProjection * layers,
              "four projections a layer, each a kind and four tensors, expected");
  const int64_t rows = hidden.size(0), head_dim = k_cache.size(3);
  const double scale = 1.0 / std::sqrt(static_cast<double>(head_dim));
  at::Tensor normed = ops().rms_norm.call(hidden, norms[0], eps);
  for (int64_t layer = 0; layer < layers; ++layer) {
    const auto projection = [&](int64_t index, const at::Tensor& x) {
      const int64_t which = layer * kProjections + index;
      return project(static_cast<PackedKind>(kinds[which]),
                     weights.data() + which * kTensorsPerProjection, group_size, x);
    };
    at::Tensor layer_k = k_cache.select(0, layer), layer_v = v_cache.select(0, layer);
    const at::Tensor qkv = projection(0, normed).view({rows, heads + 2 * kv_heads, head_dim});
    const at::Tensor queries = ops().rotary_to_cache.call(qkv, cos, sin, layer_k, layer_v,
                                                          write_slots, heads, kv_heads);
    const at::Tensor attended = ops().decode_attention.call(
        queries, layer_k, layer_v, context_slots, context_lens, windows[layer], scale);
    normed = ops().add_rms_norm.call(hidden, projection(1, attended), norms[2 * layer + 1], eps);
    const at::Tensor activated = ops().silu_mul.call(projection(2, normed));
    normed = ops().add_rms_norm.call(hidden, projection(3, activated), norms[2 * layer + 2], eps);
  }
  return normed;
}

}  // namespace

TORCH_LIBRARY_FRAGMENT(switchboard, m) {
  m.def("decode_layers(Tensor(a!) hidden, Tensor cos, Tensor sin, Tensor(b!) k_cache, "
        "Tensor(c!) v_cache, Tensor write_slots, Tensor context_slots, Tensor context_lens, "
        "Tensor[] norms, float eps, int[] kinds, Tensor[] weights, int group_size, int heads, "
        "int kv_heads, int[] windows) -> Tensor");
}

TORCH_LIBRARY_IMPL(switchboard, CPU, m) { m.impl("decode_layers", &decode_layers); }
