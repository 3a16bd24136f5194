"""Runs one engine step for the whole batch over the paged KV cache.

The Llama family (Llama, Mistral, Qwen2, Qwen3; SmolLM2 is Llama) is computed here from the
transformers model's own modules and weights, with the Q/K/V and gate/up projections fused
into one matmul each. All scheduled tokens of all requests travel as one flat sequence;
attention is one call per layer for the whole batch (see `attention.py`). On a CPU the native
kernels (engine/csrc/layer_ops.cpp) take a layer's small operations in four calls: each norm
with the residual sum before it, the rotation with the KV cache's writes, and SiLU with its
product; a quantized model's decoding steps of few rows run all their layers in one native
call (`DecodeStack`) (docs/engine-measurements.md#fused-layer-operations).

On a CPU, a float32 projection is computed as nn.Linear's x @ Wᵀ or as (W @ xᵀ)ᵀ, whichever
was faster for its number of rows when the model was loaded, or, where that was faster
overall, from a copy of the weight laid out once for MKL's or oneDNN's packed GEMM, which then
replaces it (see `measured_choice.py`). That goes for the LM head too, whose plain GEMM is
slow at some numbers of rows where a packed one is not
(docs/engine-measurements.md#packed-float32-weights); a tied model then looks tokens up in a
copy of its own, since a packed layout cannot be indexed.
Packed, the Q/K/V, output and down projections keep an unpacked copy as well, for steps of so
few rows that a whole step was faster with it (timed at the warm-up, see `_measure_few_rows`).

The residual stream is float32 for every model; a bf16 or fp16 model's norms hand its
projections their input in the model's dtype. With a quantization plan the projections, the
LM head and the embedding hold integer weights (see `quantization.py`) and return bf16 or
float32, as their kernels do, and Q/K/V are rotated and attended in the KV cache's dtype
(bf16 where the projections keep copies of their weights for many rows, else float32). Sums
with the float32 residual stream promote, so no conversion is spent on what the next op
would convert anyway.

On CUDA, decode steps replay CUDA graphs (see `decode_graphs.py`).
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PretrainedConfig, PreTrainedModel

from switchboard.engine import native
from switchboard.engine.attention import (AttentionBatch, DecodeAttention, attend_cached,
                                          paged_attention)
from switchboard.engine.decode_graphs import DecodeGraphs
from switchboard.engine.host_memory import release_free_heap
from switchboard.engine.kv_transfer import KVLayout
from switchboard.engine.measured_choice import (FP32_PACKINGS, PROBE_ROWS, MeasuredChoice,
                                                MklPacked, OneDnnPacked, Product,
                                                fastest_in_turns, fastest_overall,
                                                one_after_another, transposed_product)
from switchboard.engine.quantization import (INT4_GROUP_SIZE, DenseCopy, QuantizationPlan,
                                             QuantizedEmbedding, QuantizedProjection,
                                             QuantizedWeight, RefinedHead, Scratch)
from switchboard.engine.timing_store import Best, TimingStore

logger = logging.getLogger(__name__)

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                           "Qwen3ForCausalLM")
# Load-time measurements time products over this many bytes of weights (SmolLM2's 30 layers:
# 106 MB of float32 up projections; timed on one 3.5 MB weight hot in cache, a choice of
# form came out wrong).
MEASURED_BYTES = 128 * 2**20
# The projections also kept unpacked where the weights are packed, for steps of few rows (see
# `_measure_few_rows`), by their `_Layer` field; and the steps timed to choose, with so many
# rows, decoding at PROBE_CONTEXT tokens, each the best of PROBE_ROUNDS.
FEW_ROW_PLAIN_ROLES = ("qkv", "o_proj", "down")
FEW_ROW_PROBES = (1, 4, 8, 16)
# The numbers of decoding sequences whose attention `_measure_decode_attention` times.
GROUPING_PROBES = (1, 16, 64)
PROBE_CONTEXT = 128
PROBE_ROUNDS = 3
# The rows of the steps the native int4 kernel and PyTorch's are timed at: decoding steps', where
# the weights' bytes count most (more rows go to the dense copies where those win).
INT4_KERNEL_PROBES = (1, 4)
Layer = TypeVar("Layer")


class UnsupportedModel(ValueError):
    """The model's architecture has no paged implementation here."""


@dataclass(slots=True)
class SequenceChunk:
    """Tokens to compute for one sequence: their ids, first position, and block table.
    samples: the logits at its last token are wanted, and at each of the num_draft_tokens
    tokens before it (its last tokens are guesses to verify, see `speculation.py`);
    all_logits: those at each of its tokens (for prompt log-probabilities)."""

    request_id: str
    token_ids: Sequence[int]
    start: int
    block_ids: Sequence[int]
    samples: bool
    all_logits: bool = False
    num_draft_tokens: int = 0

    @property
    def num_logits(self) -> int:
        """Rows of logits the chunk gets back."""
        if self.all_logits:
            return len(self.token_ids)
        return 1 + self.num_draft_tokens if self.samples else 0


class Projection:
    """y = x @ weightᵀ (+ bias), weight in nn.Linear's [out, in] layout."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 transposed: MeasuredChoice | None = None) -> None:
        """transposed: whether (W @ xᵀ)ᵀ beat x @ Wᵀ on this CPU (None, as off the CPU:
        never used)."""
        self.weight = weight
        self.bias = bias
        self._transposed = transposed or MeasuredChoice.first_always()

    @classmethod
    def concat(cls, *linears: nn.Linear, transposed: MeasuredChoice | None = None,
               copy: bool = False) -> Projection:
        """Several projections of the same input as one matmul (outputs side by side).
        copy: a copy of one projection's weights too, not a view of them."""
        if len(linears) == 1:
            weight, bias = linears[0].weight.detach(), linears[0].bias
            bias = None if bias is None else bias.detach()
            if copy:
                weight, bias = weight.clone(), None if bias is None else bias.clone()
            return cls(weight, bias, transposed)
        weight = torch.cat([linear.weight.detach() for linear in linears])
        biases = [linear.bias for linear in linears]
        bias = torch.cat([b.detach() for b in biases]) if biases[0] is not None else None
        return cls(weight, bias, transposed)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if not self._transposed.second_is_faster(x.shape[0]):
            return F.linear(x, self.weight, self.bias)
        y = transposed_product(x, self.weight)
        return y if self.bias is None else y + self.bias


class PackedProjection:
    """A float32 Projection computed from its weight laid out for a packed GEMM, MKL's or
    oneDNN's (see `measured_choice.py`); the unpacked weight is not kept."""

    def __init__(self, projection: Projection, packing: type[MklPacked | OneDnnPacked]) -> None:
        self.bias = projection.bias
        self._product = packing(projection.weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._product(x, self.bias)


class RMSNorm:
    """The model's RMSNorm in one kernel where one exists (transformers' module runs about
    seven ops). A model in reduced precision normalises the float32 residual stream and scales
    after casting to its dtype, as transformers does from its reduced-precision stream.

    On a CPU a float32 norm of rows is the native kernel's (engine/csrc/layer_ops.cpp), which
    also adds a layer's output to the residual stream in the same call (`add`). Without it, and
    for a head's norm over [tokens, heads, head size]: F.rms_norm runs as about seven ops too,
    while F.layer_norm is one kernel, and x's root mean square is the standard deviation of
    (x, −x), whose mean is 0, so the norm is layer_norm over (x, −x) with the weight (w, 0),
    cut to x's half (docs/engine-measurements.md#rmsnorm-on-a-cpu)."""

    def __init__(self, module: nn.Module) -> None:
        # A copy: no view into the loaded checkpoint's mapped file may outlive the model.
        self.weight = module.weight.detach().clone()
        self.eps = module.variance_epsilon
        mirrors = self.weight.device.type == "cpu" and self.weight.dtype == torch.float32
        self._mirrored_weight = (torch.cat((self.weight, torch.zeros_like(self.weight)))
                                 if mirrors else None)
        self._ops = native.kernels() if mirrors else None

    @property
    def is_native(self) -> bool:
        return self._ops is not None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._ops is not None and x.dim() == 2:
            return self._ops.rms_norm(x, self.weight, self.eps)
        if self._mirrored_weight is not None:
            mirrored = F.layer_norm(torch.cat((x, -x), dim=-1), self._mirrored_weight.shape,
                                    self._mirrored_weight, None, self.eps)
            return mirrored[..., :self.weight.shape[0]]
        if self.weight.dtype == torch.float32:
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        normed = F.rms_norm(x.float(), self.weight.shape, None, self.eps)
        return self.weight * normed.to(self.weight.dtype)

    def add(self, residual: torch.Tensor, delta: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
        """The residual stream [tokens, hidden] (float32) plus a layer's output, and its norm;
        the native kernel adds in place, in the same call."""
        if self._ops is not None:
            return residual, self._ops.add_rms_norm(residual, delta, self.weight, self.eps)
        residual = residual + delta
        return residual, self(residual)


class GatedActivation:
    """act(gate) · up from the fused gate/up projection's output [tokens, 2 intermediate]:
    one native call for SiLU on a CPU, where PyTorch took three."""

    def __init__(self, act: nn.Module, hidden_act: str, device: torch.device) -> None:
        self._act = act
        self._ops = (native.kernels() if device.type == "cpu" and hidden_act in ("silu", "swish")
                     else None)

    @property
    def is_native(self) -> bool:
        return self._ops is not None

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        if self._ops is not None:
            return self._ops.silu_mul(gate_up)
        gate, up = gate_up.chunk(2, dim=-1)
        return self._act(gate) * up


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: RMSNorm
    qkv: Projection | PackedProjection | QuantizedProjection
    o_proj: Projection | PackedProjection | QuantizedProjection
    post_norm: RMSNorm
    gate_up: Projection | PackedProjection | QuantizedProjection
    down: Projection | PackedProjection | QuantizedProjection
    act: GatedActivation
    windowed: bool  # attends within the model's sliding window
    # Qwen3's RMSNorms of each query and key head before the rotation (None: the others').
    qk_norms: tuple[RMSNorm, RMSNorm] | None = None


@dataclass(frozen=True, slots=True)
class DecodeStack:
    """A decoding step's layers as one native call (engine/csrc/decode_layers.cpp), which
    releases the GIL for all of them: for steps whose sequences each decode one token, attend
    through the native kernel, and multiply by the projections' packed weight-only kernels (the
    few rows where those beat the dense copies). Built where every layer can go that way:
    quantized projections with their packed forms kept, SiLU, no norms of heads (Qwen3's),
    float32 norms of one eps (docs/engine-measurements.md#fused-layer-operations)."""

    ops: object
    norms: list[torch.Tensor]  # each layer's input and post-attention norms, then the final
    eps: float
    kinds: list[int]  # a PackedKind for each layer's qkv, output, gate/up and down projections
    weights: list[torch.Tensor]  # four for each of those (see `packed_form`)
    heads: int
    kv_heads: int
    windows: list[int]  # each layer's sliding window (0: none)

    @classmethod
    def build(cls, layers: Sequence[_Layer], final_norm: RMSNorm, heads: int, kv_heads: int,
              sliding_window: int | None) -> DecodeStack | None:
        """The stack of `layers`, or None where one of them cannot go natively."""
        ops = native.kernels()
        norms = [norm for layer in layers for norm in (layer.input_norm, layer.post_norm)]
        norms.append(final_norm)
        if (ops is None or any(layer.qk_norms is not None or not layer.act.is_native
                               for layer in layers)
                or any(not norm.is_native or norm.eps != final_norm.eps for norm in norms)):
            return None
        kinds: list[int] = []
        weights: list[torch.Tensor] = []
        for layer in layers:
            for projection in (layer.qkv, layer.o_proj, layer.gate_up, layer.down):
                form = (projection.packed_form() if isinstance(projection, QuantizedProjection)
                        else None)
                if form is None:
                    return None
                kinds.append(int(form[0]))
                weights.extend(form[1])
        return cls(ops, [norm.weight for norm in norms], final_norm.eps, kinds, weights, heads,
                   kv_heads, [(sliding_window or 0) if layer.windowed else 0 for layer in layers])

    @staticmethod
    def takes(batch: AttentionBatch, rows: int) -> bool:
        """Whether a step's batch is one group of decoding sequences, each of which samples."""
        return (len(batch.groups) == 1 and batch.groups[0].is_decode
                and len(batch.sample_index) == rows)

    def __call__(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                 k_cache: torch.Tensor, v_cache: torch.Tensor,
                 batch: AttentionBatch) -> torch.Tensor:
        """The final norm of the residual stream `hidden` (float32, updated in place) after
        the layers; cos and sin are the rotary module's [rows, head size]."""
        group = batch.groups[0]
        return self.ops.decode_layers(hidden, cos, sin, k_cache, v_cache, batch.write_slots,
                                      group.context_slots, group.context_lens, self.norms,
                                      self.eps, self.kinds, self.weights, INT4_GROUP_SIZE,
                                      self.heads, self.kv_heads, self.windows)


def kv_bytes_per_token(model: PreTrainedModel, dtype: torch.dtype) -> int:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.tensor([], dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element


class PagedRunner:
    def __init__(self, model: PreTrainedModel, device: torch.device, num_blocks: int,
                 block_size: int, quantization: QuantizationPlan = QuantizationPlan("none"),
                 *, static_decode_batch: int = 0, dense_copy: DenseCopy | None = None,
                 timings: TimingStore = TimingStore(None), batch_invariant: bool = False) -> None:
        """static_decode_batch: the most sequences a decode step is padded for to replay a
        CUDA graph (0: every step eager); on a CPU the padded steps run without a graph.
        timings: where the load-time measurements keep their best times across restarts.
        dense_copy (quantized; see `dense_copy_for`): the copies of their weights projections
        keep for many rows; with them the KV cache and attention are in bf16, which halves the
        bytes attention reads, and so shortens it (docs/engine-measurements.md#attention).
        batch_invariant: every product computed one way at any number of rows, one whose
        row's result does not depend on the other rows: the quantized kernels, or float32
        weights laid out for oneDNN."""
        architecture = (model.config.architectures or [type(model).__name__])[0]
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModel(f"{architecture} is not supported; supported architectures: "
                                   + ", ".join(SUPPORTED_ARCHITECTURES))
        config = model.config
        self._device = device
        self._hidden_act = config.hidden_act
        # The rotation and the KV cache's writes as one call a layer (see layer_ops.cpp).
        self._layer_ops = native.kernels() if device.type == "cpu" else None
        self._block_size = block_size
        self._num_heads = config.num_attention_heads
        self._num_kv_heads = config.num_key_value_heads
        self._head_dim = getattr(config, "head_dim", None) or config.hidden_size // self._num_heads
        dtype = model.lm_head.weight.dtype
        self._quantization = quantization
        self._scratch = Scratch()
        self._timings = timings
        # What the measured steps compute, for the names their times are kept under.
        self._model_shape = (f"{architecture}: {config.num_hidden_layers} layers, hidden "
                             f"{config.hidden_size}, intermediate {config.intermediate_size}, "
                             f"heads {self._num_heads}/{self._num_kv_heads}x{self._head_dim}, "
                             f"vocabulary {config.vocab_size}, {quantization.scheme}")
        measures = device.type == "cpu" and model.lm_head.weight.dtype == torch.float32
        measures_by_rows = measures and not batch_invariant
        self._transposed = self._measure_transposed(model) if measures_by_rows else None
        unquantized = measures and not quantization.is_quantized
        self._measures_packing = unquantized and not batch_invariant
        # Batch-invariant, oneDNN's packed product: it computes a row alike at any number of
        # rows, where MKL's GEMM does not at a few (docs/engine.md#deterministic-inference).
        self._packing = (self._measure_packing(model) if self._measures_packing
                         else OneDnnPacked if unquantized else None)
        # Whether steps of few rows are timed with FEW_ROW_PLAIN_ROLES unpacked (see
        # `_measure_few_rows`), which `_fuse` then keeps unpacked copies of.
        self._times_few_rows = self._packing is not None and measures_by_rows
        self._dense_copy = dense_copy
        self._dense = MeasuredChoice()
        self._measures_dense = measures_by_rows and quantization.is_quantized
        self._measures_int4_kernel = self._measures_dense and native.kernels() is not None
        self._native_int4 = False
        self._quantized: list[QuantizedProjection] = []
        # On a CPU the loader maps the checkpoint's file, and while any view of it lived the
        # whole mapping stayed resident, fused or packed weights besides
        # (docs/engine-measurements.md#host-memory): unquantized, the runner keeps copies
        # only, as quantized it does.
        self._keeps_copies = device.type == "cpu" and not quantization.is_quantized
        head = self._project(None, {"output": model.lm_head})
        self._embed = self._embedding(model, head)
        self._lm_head = RefinedHead(head) if isinstance(head, QuantizedProjection) else head
        self._rotary = model.model.rotary_emb
        self._final_norm = RMSNorm(model.model.norm)
        self._sliding_window, windowed = sliding_window_layers(config)
        fused = [self._fuse(index, layer, windowed[index])
                 for index, layer in enumerate(model.model.layers)]
        self._layers = [layer for layer, _ in fused]
        self._few_row_layers = ([few for _, few in fused]
                                if self._times_few_rows else None)
        self._few_rows = MeasuredChoice()
        capacity = num_blocks * block_size
        # One slot past the pool's: padding rows of a static decode batch write there.
        self._cache_shape = (len(self._layers), capacity + 1, self._num_kv_heads, self._head_dim)
        self._cache_dtype = torch.bfloat16 if dense_copy is not None else dtype
        # Measured at the warm-up on a CPU (see `_measure_decode_attention`); batch-invariant,
        # every token attends through the native kernel (see `AttentionBatch.build`).
        self._batch_invariant = batch_invariant
        self._decode_attention = (DecodeAttention.NATIVE if batch_invariant
                                  else DecodeAttention.SDPA)
        if batch_invariant and (device.type != "cpu" or native.kernels() is None
                                or self._cache_dtype not in native.DTYPES
                                or (unquantized and not OneDnnPacked.is_available())):
            raise ValueError(
                "deterministic inference needs a CPU, the native CPU kernels for a "
                f"{self._cache_dtype} KV cache (a C++ compiler builds them at install; the log "
                "says why they are missing), and oneDNN for unquantized float32 weights")
        self._k_cache: torch.Tensor | None = None
        self._v_cache: torch.Tensor | None = None
        self._decode_stack: DecodeStack | None = None  # made at the end of loading
        self._decode_graphs = DecodeGraphs(
            self._forward, device=device, block_size=block_size, scratch_slot=capacity,
            max_batch_size=static_decode_batch, max_context=capacity,
            capture=device.type == "cuda", sliding_window=self._sliding_window
        ) if static_decode_batch else None

    def prepare(self) -> None:
        """Allocate the KV pool and capture the common decode graphs now rather than at the
        first steps. Called at load where CUDA graphs are captured (no loader's host memory
        awaits release there), and by `warm_up` on the engine's thread."""
        if self._k_cache is None:
            self._finish_loading()
        if self._decode_graphs is not None:
            self._decode_graphs.capture_common()

    def warm_up(self) -> None:
        """`prepare`, then run one token through the model, so the first request does not
        wait for the pool's allocation and the first forward's setup
        (docs/engine-measurements.md#start-up-and-loading). The token's K/V go to the first
        slot of block 0, which holds nothing yet."""
        self.prepare()
        self.execute([SequenceChunk("warm-up", [0], 0, [0], samples=True)])

    def _finish_loading(self) -> None:
        """Time steps of few rows with some packed projections unpacked (see
        `_measure_few_rows`; their small KV cache is freed before the pool is allocated), pick
        the int4 kernel (see `_measure_int4_kernel`), make the quantized projections' dense
        copies (then time them, see `_measure_dense`, and drop the packed forms where the
        copies won at every number of rows), and the KV pool. The pool is zeroed, hence
        resident from the start, as the operator sized it: a pool whose pages became resident
        as blocks were first written would make memory creep up for minutes under load, which
        monitoring cannot tell from a leak.

        Done at the warm-up (or the first step) rather than at construction: by then the
        loader's model is gone, and on a CPU with it the mapped checkpoint (the runner keeps
        its own copies or quantized forms), so these take its place in memory instead of
        adding to it, and so does the heap memory the load freed (see `host_memory.py`): made
        at construction, the copies raised the load's peak
        (docs/engine-measurements.md#host-memory)."""
        gc.collect()
        if self._device.type == "cpu" and not self._batch_invariant:
            self._measure_decode_attention()
        if self._few_row_layers is not None:
            self._measure_few_rows()
        if self._measures_int4_kernel:
            self._measure_int4_kernel()
        if self._dense_copy is not None:
            for projection in self._quantized:
                projection.add_copy(self._dense_copy)
        # After the copies, which reuse the heap the load freed: each went through transient
        # ones, whose heap glibc would keep (docs/engine-measurements.md#host-memory).
        release_free_heap()
        if self._measures_dense:
            self._measure_dense()
            if self._dense_copy is not None and self._dense.second_always_faster:
                for projection in self._quantized:
                    projection.drop_packed()
                release_free_heap()
        self._k_cache = torch.zeros(self._cache_shape, dtype=self._cache_dtype, device=self._device)
        self._v_cache = torch.zeros(self._cache_shape, dtype=self._cache_dtype, device=self._device)
        # After the kernels' choices, which decide the projections' packed forms.
        if (self._layer_ops is not None and self._decode_attention is DecodeAttention.NATIVE
                and self._quantization.is_quantized):
            self._decode_stack = DecodeStack.build(self._layers, self._final_norm,
                                                   self._num_heads, self._num_kv_heads,
                                                   self._sliding_window)
        if self._device.type == "cpu":
            logger.info("load-time choices (timed, or as kept in %s): %s",
                        self._timings.file or "no cache folder", self.measured_choices())

    @property
    def kv_layout(self) -> KVLayout:
        return KVLayout(num_layers=self._cache_shape[0], num_kv_heads=self._num_kv_heads,
                        head_dim=self._head_dim,
                        dtype=str(self._cache_dtype).removeprefix("torch."),
                        model=self._model_shape)

    def read_kv(self, block_ids: Sequence[int], num_tokens: int
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the keys and values of a sequence's first num_tokens tokens, on the host."""
        slots = self._slots(block_ids, 0, num_tokens)
        return self._k_cache[:, slots].cpu(), self._v_cache[:, slots].cpu()

    def write_kv(self, block_ids: Sequence[int], start: int, keys: torch.Tensor,
                 values: torch.Tensor) -> None:
        """Store keys and values [layers, tokens, kv heads, head dim] as a sequence's tokens
        from `start` on, as computing them would have."""
        if self._k_cache is None or self._v_cache is None:
            self._finish_loading()
        slots = self._slots(block_ids, start, start + keys.shape[1])
        self._k_cache[:, slots] = keys.to(self._device, self._cache_dtype)
        self._v_cache[:, slots] = values.to(self._device, self._cache_dtype)

    def _slots(self, block_ids: Sequence[int], start: int, stop: int) -> torch.Tensor:
        positions = torch.arange(start, stop)
        blocks = torch.tensor(block_ids, dtype=torch.long)[positions // self._block_size]
        return (blocks * self._block_size + positions % self._block_size).to(self._device)

    def measured_choices(self) -> dict[str, str]:
        """What the load-time measurements chose on a CPU (where a choice was timed)."""
        choices = {"decoding attention": self._decode_attention.value}
        if self._transposed is not None:
            choices["(W @ xt)t at rows"] = self._transposed.describe()
        if self._measures_int4_kernel:
            choices["int4 kernel"] = "native" if self._native_int4 else "PyTorch's"
        if self._measures_dense:
            choices["quantized dense copies"] = getattr(self._dense_copy, "__name__", "none")
            choices["dense products at rows"] = self._dense.describe()
        elif self._measures_packing:
            choices["float32 layout"] = getattr(self._packing, "__name__", "unpacked")
        if self._times_few_rows:
            choices[f"{'/'.join(FEW_ROW_PLAIN_ROLES)} unpacked at rows"] = \
                self._few_rows.describe()
        return choices

    def _fuse(self, index: int, layer: nn.Module, windowed: bool) -> tuple[_Layer, _Layer]:
        """Fuse a layer's projections; the originals are dropped from the model (the runner
        owns it) so fused weights are not held twice. Also the layer as steps of few rows
        compute it where the weights are packed: its FEW_ROW_PLAIN_ROLES unpacked."""
        attention, mlp = layer.self_attn, layer.mlp
        roles = {"qkv": {"attn_q": attention.q_proj, "attn_k": attention.k_proj,
                         "attn_v": attention.v_proj},
                 "o_proj": {"attn_output": attention.o_proj},
                 "gate_up": {"ffn_gate": mlp.gate_proj, "ffn_up": mlp.up_proj},
                 "down": {"ffn_down": mlp.down_proj}}
        fused = _Layer(
            input_norm=RMSNorm(layer.input_layernorm),
            post_norm=RMSNorm(layer.post_attention_layernorm),
            act=GatedActivation(mlp.act_fn, self._hidden_act, self._device),
            windowed=windowed,
            qk_norms=((RMSNorm(attention.q_norm), RMSNorm(attention.k_norm))
                      if hasattr(attention, "q_norm") else None),
            **{role: self._project(index, linears) for role, linears in roles.items()},
        )
        few_rows = fused if not self._times_few_rows else replace(fused, **{
            role: Projection.concat(*roles[role].values(), transposed=self._transposed,
                                    copy=self._keeps_copies)
            for role in FEW_ROW_PLAIN_ROLES})
        for module, names in ((attention, ("q_proj", "k_proj", "v_proj", "o_proj")),
                              (mlp, ("gate_proj", "up_proj", "down_proj"))):
            for name in names:
                delattr(module, name)
        # The heap the layer's transient copies took goes back now, not after the last layer:
        # glibc kept it, which raised the load's peak (docs/engine-measurements.md#host-memory).
        release_free_heap()
        return fused, few_rows

    def _measure_transposed(self, model: PreTrainedModel) -> MeasuredChoice:
        """Whether (W @ xᵀ)ᵀ beats x @ Wᵀ on this CPU, by rows, timed over the layers' up
        projections (see `measured_layers`)."""
        weights = _timed_up_projections(model)
        return MeasuredChoice().measure(
            one_after_another([partial(F.linear, weight=weight) for weight in weights]),
            one_after_another([partial(transposed_product, weight=weight) for weight in weights]),
            weights[0].shape[1],
            self._best(f"x @ Wt or (W @ xt)t, {_describe_weights(weights)}, rows {PROBE_ROWS}"))

    def _best(self, name: str) -> Best:
        """The times a load-time choice named `name` is made from (see `timing_store.py`).
        A name says what is timed, not the earlier choices it was timed under: those settle
        first, and a name that changed with them would take longer to settle."""
        return partial(self._timings.best, name)

    def _measure_packing(self, model: PreTrainedModel
                         ) -> type[MklPacked | OneDnnPacked] | None:
        """The packed GEMM that beats the unpacked projection (in the form measured for each
        number of rows) and any other packing overall, timed over the layers' up projections;
        None where the unpacked one is fastest."""
        weights = _timed_up_projections(model)
        unpacked = [Projection(weight, transposed=self._transposed) for weight in weights]
        layouts = [None, *(packing for packing in FP32_PACKINGS if packing.is_available())]

        def product(packing: type[MklPacked | OneDnnPacked] | None) -> Product:
            # Packed copies are made one packing at a time, as they are timed (128 MiB each).
            return one_after_another([projection if packing is None
                                      else PackedProjection(projection, packing)
                                      for projection in unpacked])

        names = ", ".join("unpacked" if packing is None else packing.__name__
                          for packing in layouts)
        chosen = layouts[fastest_overall(
            [partial(product, packing) for packing in layouts], weights[0].shape[1],
            self._best(f"float32 layouts {names}, {_describe_weights(weights)}, "
                       f"rows {PROBE_ROWS}"))]
        return chosen

    @torch.inference_mode()
    def _measure_few_rows(self) -> None:
        """For which numbers of rows a step is faster with FEW_ROW_PLAIN_ROLES unpacked, timed
        as whole steps (see `_probe_batches`) before the pool is allocated; where at none, the
        unpacked copies are dropped.

        Timed alone, over many layers, each packed projection was the faster at most numbers
        of rows; yet on some processors whole steps of a few rows ran faster with these three
        unpacked (see `transposed_product`), while at more rows the packed ones won. Their
        copies raise the server's peak memory: the gate/up projections unpacked too would make
        a lone row faster still, but take it past 2 GiB; and these three unpacked without
        packed copies made steps of many rows slower
        (docs/engine-measurements.md#packed-float32-weights)."""
        probes = self._probe_batches(FEW_ROW_PROBES)
        self._few_rows = MeasuredChoice().measure_in_turns(
            partial(setattr, self, "_few_rows", MeasuredChoice.first_always()),
            partial(setattr, self, "_few_rows", MeasuredChoice.second_always()),
            self._forward, probes, PROBE_ROUNDS,
            self._best(f"steps with {'/'.join(FEW_ROW_PLAIN_ROLES)} unpacked or laid out for "
                       f"{self._packing.__name__}, {self._model_shape}, rows "
                       f"{FEW_ROW_PROBES} at {PROBE_CONTEXT} tokens"))
        self._k_cache = self._v_cache = None
        if self._few_rows.second_never_faster:
            self._few_row_layers = None

    @torch.inference_mode()
    def _measure_decode_attention(self) -> None:
        """How decoding sequences attend (see `attention.DecodeAttention`): whichever form was
        fastest over GROUPING_PROBES, timed as a step's layers attend, before the pool is
        allocated: which wins depends on the processor and the KV cache's dtype, by far on some
        and narrowly the other way on others (docs/engine-measurements.md#decoding-attention).
        The native kernel takes part where it was built, for the dtypes it has."""
        forms = [DecodeAttention.SDPA, DecodeAttention.GROUPED]
        if native.kernels() is not None and self._cache_dtype in native.DTYPES:
            forms.append(DecodeAttention.NATIVE)
        probes = self._probe_batches(GROUPING_PROBES)

        def attend(probe: tuple[AttentionBatch, torch.Tensor, torch.Tensor]) -> None:
            batch, queries, new_keys = probe
            for layer in range(len(self._layers)):
                paged_attention(queries, new_keys, new_keys, self._k_cache[layer],
                                self._v_cache[layer], batch, decode=self._decode_attention)

        inputs = [(batch,
                   torch.randn(rows, self._num_heads, self._head_dim, dtype=self._cache_dtype),
                   torch.randn(rows, self._num_kv_heads, self._head_dim, dtype=self._cache_dtype))
                  for rows, batch in probes.items()]
        self._decode_attention = forms[fastest_in_turns(
            [partial(setattr, self, "_decode_attention", form) for form in forms],
            attend, inputs, PROBE_ROUNDS,
            self._best(f"decoding attention: {', '.join(form.name for form in forms)}, "
                       f"{self._model_shape}, {self._cache_dtype} KV, sequences "
                       f"{GROUPING_PROBES} at {PROBE_CONTEXT} tokens"))]
        self._k_cache = self._v_cache = None

    def _probe_batches(self, probe_rows: Sequence[int]) -> dict[int, AttentionBatch]:
        """Steps of `probe_rows` rows for the load-time measurements, over a KV cache of their
        own: so many sequences decoding at PROBE_CONTEXT tokens, all reading the same blocks
        (their values do not matter)."""
        block_ids = list(range(PROBE_CONTEXT // self._block_size + 1))
        shape = (self._cache_shape[0], len(block_ids) * self._block_size,
                 *self._cache_shape[2:])
        self._k_cache = torch.zeros(shape, dtype=self._cache_dtype, device=self._device)
        self._v_cache = torch.zeros(shape, dtype=self._cache_dtype, device=self._device)
        return {rows: AttentionBatch.build(
                    [SequenceChunk(str(row), [0], PROBE_CONTEXT, block_ids, samples=True)
                     for row in range(rows)],
                    self._block_size, self._device, self._sliding_window)
                for rows in probe_rows}

    def _measure_int4_kernel(self) -> None:
        """Whether the native int4 kernel (`NativeInt4`) or PyTorch's multiplies a decoding
        step's rows faster, timed in turns over the layers' 4-bit gate/up projections (see
        `measured_layers`); every 4-bit projection then keeps the winner's form alone."""
        projections = [layer.gate_up for layer in measured_layers(
            self._layers, lambda layer: layer.gate_up.shape.numel() // 2)  # its int4 bytes
            if layer.gate_up.bits == 4]
        if not projections:
            return
        for projection in projections:
            projection.add_native()

        def use_native(chosen: bool) -> None:
            for projection in projections:
                projection.uses_native = chosen

        self._native_int4 = bool(fastest_in_turns(
            [partial(use_native, False), partial(use_native, True)],
            one_after_another([projection.packed_mm for projection in projections]),
            [torch.randn(rows, projections[0].shape[1]) for rows in INT4_KERNEL_PROBES],
            PROBE_ROUNDS,
            self._best(f"int4 kernel: PyTorch's or native, {len(projections)} x "
                       f"{tuple(projections[0].shape)}, rows {INT4_KERNEL_PROBES}")))
        for projection in self._quantized:
            if projection.bits == 4:
                projection.keep_one_kernel(self._native_int4)
        release_free_heap()

    def _measure_dense(self) -> None:
        """Whether the dense form beats the packed kernels (PyTorch's, or the native int4 one
        where `_measure_int4_kernel` chose it), by rows, timed over the layers' gate/up
        projections (see `measured_layers`)."""
        projections = [layer.gate_up for layer in measured_layers(
            self._layers, lambda layer: 2 * layer.gate_up.shape.numel())]  # its bf16 bytes
        copies = (f"{self._dense_copy.__name__} copies" if self._dense_copy is not None
                  else "fp32 dequantised at each product")
        self._dense.measure(one_after_another([p.packed_mm for p in projections]),
                            one_after_another([p.dense_mm for p in projections]),
                            projections[0].shape[1],
                            self._best(f"{self._quantization.scheme} kernels or {copies}, "
                                       f"{len(projections)} x {tuple(projections[0].shape)}, "
                                       f"rows {PROBE_ROWS}"))

    def _project(self, layer: int | None, linears: dict[str, nn.Linear]
                 ) -> Projection | PackedProjection | QuantizedProjection:
        """One projection for `linears` (GGUF role → module) side by side, quantized as the
        plan says for layer `layer` (None: the LM head), or packed for MKL where measured
        faster."""
        projection = Projection.concat(*linears.values(), transposed=self._transposed,
                                       copy=self._keeps_copies)
        if not self._quantization.is_quantized:
            return (projection if self._packing is None
                    else PackedProjection(projection, self._packing))
        bits = self._quantization.bits(layer, tuple(linears))
        quantized = QuantizedProjection(QuantizedWeight.quantize(projection.weight, bits),
                                        projection.bias, self._scratch, dense=self._dense,
                                        transposed=self._transposed, lookups=layer is None)
        self._quantized.append(quantized)
        return quantized

    def _embedding(self, model: PreTrainedModel,
                   head: Projection | PackedProjection | QuantizedProjection
                   ) -> Callable[[torch.Tensor], torch.Tensor]:
        """The token embedding. Quantized: a tied model looks tokens up in its quantized LM
        head, any other in an int8 copy. Copied (see `_keeps_copies`): a tied model in its
        unpacked LM head's copy, any other in a copy of its own. Either way the weights are
        dropped from the model."""
        embedding = model.model.embed_tokens
        if not isinstance(head, QuantizedProjection) and not self._keeps_copies:
            return embedding
        is_tied = embedding.weight is model.lm_head.weight
        model.model.embed_tokens = None
        model.lm_head = None
        if not isinstance(head, QuantizedProjection):
            shares = is_tied and isinstance(head, Projection)
            weight = head.weight if shares else embedding.weight.detach().clone()
            return nn.Embedding.from_pretrained(weight, padding_idx=embedding.padding_idx)
        source = head if is_tied else QuantizedWeight.quantize(embedding.weight, 8)
        return QuantizedEmbedding(source)

    @torch.inference_mode()
    def execute(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        """Compute the chunks' tokens, writing their K/V into the cache; return logits
        (float32, on the device) in chunk order: each chunk's last `num_logits` tokens."""
        if self._k_cache is None or self._v_cache is None:
            self._finish_loading()
        if self._decode_graphs is not None:
            logits = self._decode_graphs.run(chunks)
            if logits is not None:
                return logits
        return self._forward(AttentionBatch.build(
            chunks, self._block_size, self._device, self._sliding_window,
            token_by_token=self._batch_invariant)).float()

    def _forward(self, batch: AttentionBatch) -> torch.Tensor:
        """The logits at batch.sample_index, on the device, without host synchronisation."""
        # The residual stream is float32 whatever the weights: against a float32 model's
        # logits, a bfloat16 model's came much closer than with a bfloat16 stream, at no
        # measured cost (docs/engine-measurements.md#the-float32-residual-stream).
        hidden = self._embed(batch.token_ids).float()
        cos, sin = self._rotary(hidden, batch.positions.unsqueeze(0))
        cos, sin = cos[0], sin[0]
        if self._layer_ops is None:
            cos = cos.unsqueeze(1).to(self._cache_dtype)
            sin = _negate_first_half(sin.unsqueeze(1)).to(self._cache_dtype)
        rows = hidden.shape[0]
        if (self._decode_stack is not None and self._decode_stack.takes(batch, rows)
                and not self._dense.second_is_faster(rows)):
            return self._lm_head(self._decode_stack(hidden, cos, sin, self._k_cache,
                                                    self._v_cache, batch))
        num_qk_heads = self._num_heads + self._num_kv_heads
        layers = self._layers
        if self._few_row_layers is not None and self._few_rows.second_is_faster(rows):
            layers = self._few_row_layers
        last = len(layers) - 1
        normed = layers[0].input_norm(hidden)
        for index, layer in enumerate(layers):
            qkv = layer.qkv(normed).view(-1, num_qk_heads + self._num_kv_heads, self._head_dim)
            if layer.qk_norms is not None:
                q_norm, k_norm = layer.qk_norms
                qkv = torch.cat((q_norm(qkv[:, :self._num_heads]),
                                 k_norm(qkv[:, self._num_heads:num_qk_heads]),
                                 qkv[:, num_qk_heads:]), dim=1)
            attended = self._attend(index, layer.windowed, qkv, cos, sin, batch)
            if index == last and len(batch.sample_index) < len(hidden):
                # Past the last layer's K/V only the sampled tokens' states are wanted.
                hidden, attended = hidden[batch.sample_index], attended[batch.sample_index]
            hidden, normed = layer.post_norm.add(hidden, layer.o_proj(attended))
            next_norm = layers[index + 1].input_norm if index < last else self._final_norm
            hidden, normed = next_norm.add(hidden, layer.down(layer.act(layer.gate_up(normed))))
        return self._lm_head(normed)

    def _attend(self, index: int, windowed: bool, qkv: torch.Tensor, cos: torch.Tensor,
                sin: torch.Tensor, batch: AttentionBatch) -> torch.Tensor:
        """Layer `index`'s attention: qkv [tokens, heads + 2 K/V heads, head size] rotated,
        its K/V written to the cache, its queries attended. With the native kernels cos and
        sin are the rotary module's, else in the cache's dtype with sin's first half negated
        (see `_rotate`)."""
        k_cache, v_cache = self._k_cache[index], self._v_cache[index]
        if self._layer_ops is not None:
            q = self._layer_ops.rotary_to_cache(qkv, cos, sin, k_cache, v_cache,
                                                batch.write_slots, self._num_heads,
                                                self._num_kv_heads)
            return attend_cached(q, k_cache, v_cache, batch, windowed=windowed,
                                 decode=self._decode_attention)
        num_qk_heads = self._num_heads + self._num_kv_heads
        qkv = qkv.to(self._cache_dtype)
        q, k = _rotate(qkv[:, :num_qk_heads], cos, sin).split(
            (self._num_heads, self._num_kv_heads), dim=1)
        return paged_attention(q, k, qkv[:, num_qk_heads:], k_cache, v_cache, batch,
                               windowed=windowed, decode=self._decode_attention)


def sliding_window_layers(config: PretrainedConfig) -> tuple[int | None, list[bool]]:
    """The model's sliding window (None: none) and whether each layer attends within it: a
    config's `layer_types` say which do (Qwen2 from `max_window_layers` up), else all do
    (Mistral)."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if window is None:
        return None, [False] * config.num_hidden_layers
    if layer_types is None:
        return window, [True] * config.num_hidden_layers
    return window, [layer_type == "sliding_attention" for layer_type in layer_types]


def _timed_up_projections(model: PreTrainedModel) -> list[torch.Tensor]:
    """The float32 up-projection weights that load-time choices are timed over (see
    `measured_layers`)."""
    return [layer.mlp.up_proj.weight.detach()
            for layer in measured_layers(model.model.layers,
                                         lambda layer: layer.mlp.up_proj.weight.nbytes)]


def _describe_weights(weights: Sequence[torch.Tensor]) -> str:
    return f"{len(weights)} x {tuple(weights[0].shape)} {weights[0].dtype}"


def measured_layers(layers: Sequence[Layer], size: Callable[[Layer], int]) -> Sequence[Layer]:
    """The first layers whose timed weights add up to MEASURED_BYTES (at least one): as a step
    reads them, from memory rather than a cache, without minutes of timing a big model."""
    total = 0
    for count, layer in enumerate(layers, 1):
        total += size(layer)
        if total >= MEASURED_BYTES:
            return layers[:count]
    return layers


def _negate_first_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., :half], x[..., half:]), dim=-1)


def _rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding in transformers' rotate-half convention,
    x·cos + (−x₂, x₁)·sin, computed as x·cos + roll(x)·(−sin₁, sin₂): three ops per layer
    instead of seven, the sign folded into sin once per step."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)
