"""Weight-only quantized projections and embeddings for CPU decoding.

A weight is stored as integer codes with scales (and, for 4 bits, zero points) per group of
input columns: int4 in groups of 32 with a min/max (asymmetric) grid, int8 per output channel
with a symmetric one. Two ways to multiply, picked by the number of rows, whichever was
faster on this CPU when the model was loaded (see `measured_choice.py`):

- PyTorch's weight-only kernels, `_weight_int4pack_mm_for_cpu` / `_weight_int8pack_mm`, on
  bf16 activations: they read 4 or 8 bits per weight instead of 16 or 32, which wins where
  reading the weight dominates (few rows). For 4 bits the engine's own kernel
  (`NativeInt4`) takes their place where it was faster at a decoding step's rows;
- a dense matmul, which wins where arithmetic dominates and those kernels fall behind, from
  a copy of the dequantised weight kept beside the packed one (`dense_copy_for`): in bf16 for
  oneDNN on a CPU that multiplies bf16 faster than fp32 (AMX); elsewhere in fp16 for FBGEMM,
  whose GEMM widens it to fp32 as it multiplies, so it reads half the bytes of fp32 at fp32's
  arithmetic speed, which at many rows beat both dequantising at each product and float32
  laid out for oneDNN (docs/engine-measurements.md#quantization). Without FBGEMM the weight is
  dequantised to fp32 at each product, a slice of output channels at a time, into a small
  reusable buffer, which costs no memory.

Scales and zero points are kept in float32 as derived: the dense forms compute from them (a
copy rounds each weight once: to bf16's 8 significant bits, or fp16's 11), and only PyTorch's
kernels take them rounded to bf16. For a GGUF file's Q4_1 blocks that keeps the file's fp16
scales and offsets: rounded to bf16, they flipped a near tie the float32 model wins (see
docs/performance-defaults.md).

The `gguf` scheme keeps a GGUF file's own precision per tensor: its 4-bit blocks stay 4-bit in
groups of 32, which for Q4_1 re-derives the file's grid exactly (its quantizer maps each
block's min and max to the end codes, so min/max recovers the scale and offset; other 4-bit
types are re-quantized on that grid), and wider types become int8 per channel.
"""

from __future__ import annotations

import enum
import mmap
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType

import torch
import torch.nn.functional as F

from switchboard.engine import native
from switchboard.engine.config import QUANTIZATION_SCHEMES
from switchboard.engine.measured_choice import (MeasuredChoice, bf16_is_faster, bf16_product,
                                                prepack_bf16, transposed_product)
from switchboard.engine.timing_store import TimingStore

INT4_GROUP_SIZE = 32
# Output channels dequantised at a time: small enough for the buffer to stay in cache.
DEQUANTIZE_CHANNELS = 2048
# Rows multiplied by a bf16 copy are padded to a multiple of this: oneDNN keeps state for
# each number of rows it has seen, which grew the server with every new number
# (docs/engine-measurements.md#onednns-caches).
BF16_ROWS_MULTIPLE = 16
# Tokens per row whose logits a quantized LM head recomputes in float32 (see RefinedHead).
REFINED_CANDIDATES = 8
FOUR_BIT_GGUF_TYPES = frozenset({"Q4_0", "Q4_1", "Q4_K", "IQ4_NL", "IQ4_XS"})


class QuantizationError(ValueError):
    """The scheme cannot be applied to this model or device."""


@dataclass(frozen=True, slots=True)
class QuantizedWeight:
    """codes [out, in] int8; scales and zeros [out, in // group, 1] float32,
    zeros None for the symmetric int8 grid: weight = codes * scales + zeros, per group."""

    bits: int
    codes: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None

    @classmethod
    def quantize(cls, weight: torch.Tensor, bits: int) -> QuantizedWeight:
        weight = weight.detach().float()
        out_features, in_features = weight.shape
        if bits == 4:
            if in_features % INT4_GROUP_SIZE:
                raise QuantizationError(f"int4 needs input sizes that are multiples of "
                                        f"{INT4_GROUP_SIZE}; got {in_features}")
            groups = weight.view(out_features, -1, INT4_GROUP_SIZE)
            low, high = groups.amin(-1, keepdim=True), groups.amax(-1, keepdim=True)
            scales = (high - low) / 15
            scales = torch.where(scales > 0, scales, torch.ones_like(scales))
            # Codes are stored centred on zero ([-8, 7]): the int4 kernel subtracts 8 from its
            # unsigned nibbles and adds the zero point, so zeros are the offset of code 0.
            zeros = low + 8 * scales
            codes = torch.round((groups - zeros) / scales).clamp(-8, 7)
            return cls(4, codes.to(torch.int8).view(out_features, in_features), scales, zeros)
        if bits == 8:
            groups = weight.view(out_features, 1, in_features)
            scales = groups.abs().amax(-1, keepdim=True) / 127
            scales = torch.where(scales > 0, scales, torch.ones_like(scales))
            codes = torch.round(groups / scales).clamp(-127, 127).to(torch.int8)
            return cls(8, codes.view(out_features, in_features), scales, None)
        raise QuantizationError(f"weights can be quantized to 4 or 8 bits; got {bits}")

    @property
    def shape(self) -> torch.Size:
        return self.codes.shape

    def dequantize(self, rows: slice | torch.Tensor,
                   out: torch.Tensor | None = None) -> torch.Tensor:
        """The fp32 weight of output channels `rows` (a slice, or indices: an embedding
        lookup), written into `out` when given (any buffer with room)."""
        codes = self.codes[rows]
        num_rows, in_features = codes.shape
        num_groups = self.scales.shape[1]
        grouped_shape = (num_rows, num_groups, in_features // num_groups)
        if out is not None:
            out = out.view(-1)[:num_rows * in_features].view(grouped_shape)
        weight = torch.mul(codes.view(grouped_shape), self.scales[rows], out=out)
        if self.zeros is not None:
            weight.add_(self.zeros[rows])
        return weight.view(num_rows, in_features)


class Scratch:
    """One dequantisation buffer shared by every projection of a runner (one engine thread)."""

    def __init__(self) -> None:
        self.buffer = torch.empty(0)

    def at_least(self, num_elements: int) -> torch.Tensor:
        if self.buffer.numel() < num_elements:
            self.buffer = torch.empty(num_elements)
        return self.buffer


class Bf16Copy:
    """x @ weightᵀ in bf16 by oneDNN from a prepacked bf16 copy of the weight; returns bf16."""

    dtype = torch.bfloat16

    def __init__(self, weight: torch.Tensor) -> None:
        self._packed = prepack_bf16(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        padded = F.pad(x.to(torch.bfloat16), (0, 0, 0, -rows % BF16_ROWS_MULTIPLE))
        return bf16_product(padded, self._packed)[:rows]


class Fp16Copy:
    """x @ weightᵀ by FBGEMM's fp16 GEMM from a prepacked fp16 copy of the weight: float32
    activations and result, the weight widened to float32 as it is multiplied."""

    dtype = torch.float16

    def __init__(self, weight: torch.Tensor) -> None:
        self._packed = torch.ops.quantized.linear_prepack_fp16(weight, None)

    @staticmethod
    def is_available() -> bool:
        return "fbgemm" in torch.backends.quantized.supported_engines

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic_fp16(x.float(), self._packed)


DenseCopy = type[Bf16Copy] | type[Fp16Copy]


def dense_copy_for(sample_weight: torch.Tensor,
                   store: TimingStore = TimingStore(None)) -> DenseCopy | None:
    """The copy that quantized projections multiply many rows by on this CPU (None: dequantise
    at each product), as `sample_weight` [out, in] (float32) tells."""
    if bf16_is_faster(sample_weight, store):
        return Bf16Copy
    return Fp16Copy if Fp16Copy.is_available() else None


class NativeInt4:
    """x @ weightᵀ for a 4-bit weight by the engine's native kernel (engine/csrc/int4_linear.cpp):
    float32 activations quantized to int16 per group, float32 results. Faster than PyTorch's
    int4 kernel on some processors and slower on others
    (docs/engine-measurements.md#quantization)."""

    def __init__(self, weight: QuantizedWeight) -> None:
        self._ops = native.kernels()
        self._codes, self._scales, self._offsets = self._ops.int4_pack(
            weight.codes, weight.scales, weight.zeros)

    @property
    def tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        return self._codes, self._scales, self._offsets

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._ops.int4_linear(x.float(), *self.tensors)


class PackedKind(enum.IntEnum):
    """How `QuantizedProjection.packed_mm` multiplies, by number, as the native decode stack
    (engine/csrc/decode_layers.cpp) names the kernels."""

    TORCH_INT4 = 0
    NATIVE_INT4 = 1
    INT8 = 2


class QuantizedProjection:
    """y = x @ weightᵀ (+ bias) with a QuantizedWeight, for float32 or bf16 x. y is bf16 from
    PyTorch's kernels and bf16 copies, float32 from the native kernel, fp16 copies and fp32
    dequantisation: the caller converts only where it needs to."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None, scratch: Scratch, *,
                 dense: MeasuredChoice | None = None, transposed: MeasuredChoice | None = None,
                 lookups: bool = False) -> None:
        """dense: whether `dense_mm` beat `packed_mm` on this CPU, by rows (None: never);
        transposed: whether fp32 dequantised weights multiply faster as (W @ xᵀ)ᵀ than as
        x @ Wᵀ (None: never); lookups: `rows` will be asked for (a tied embedding)."""
        self.bias = bias
        self._scratch = scratch
        self._dense = dense or MeasuredChoice.first_always()
        self._transposed = transposed or MeasuredChoice.first_always()
        self._copy: Bf16Copy | Fp16Copy | None = None
        self._lookups = lookups
        self.shape = weight.shape
        self._bits = weight.bits
        self._quantized: QuantizedWeight | None = weight
        self._native: NativeInt4 | None = None
        self.uses_native = False
        if weight.bits == 4:
            unsigned = (weight.codes.to(torch.int32) + 8)
            self._packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned, 1)
            self._scales_and_zeros = torch.cat((weight.scales, weight.zeros), dim=-1) \
                .transpose(0, 1).contiguous().to(torch.bfloat16)
        else:
            self._channel_scales = weight.scales.view(-1).to(torch.bfloat16)

    @property
    def bits(self) -> int:
        return self._bits

    def add_native(self) -> None:
        """Keep the weight for the native int4 kernel too, which `packed_mm` then uses while
        `uses_native` is set."""
        self._native = NativeInt4(self._quantized)

    def keep_one_kernel(self, use_native: bool) -> None:
        """Multiply by the native int4 kernel (made here if need be) or PyTorch's from now on,
        and drop the other's form."""
        if use_native:
            if self._native is None:
                self.add_native()
            del self._packed, self._scales_and_zeros
        else:
            self._native = None
        self.uses_native = use_native

    def add_copy(self, kind: DenseCopy) -> None:
        """Keep a copy of the weight of `kind` for `dense_mm` (without one it dequantises to
        fp32 at each call)."""
        self._copy = kind(_dequantized_copy(self._quantized, kind.dtype))
        # The codes are kept where something reads them: the int8 kernel, fp32 dequantisation,
        # a tied embedding. A 4-bit weight with a copy needs only its packed form and it.
        if self._bits == 4 and not self._lookups:
            self._quantized = None

    def drop_packed(self) -> None:
        """Drop what only `packed_mm` reads, once the copy has been measured faster at every
        number of rows, to free its memory (docs/engine-measurements.md#quantization). The
        codes stay where a lookup reads them."""
        if self._copy is None:
            raise ValueError("a projection without a copy needs its packed form")
        if self._bits == 4 and self.uses_native:
            self._native = None
        elif self._bits == 4:
            del self._packed, self._scales_and_zeros
        else:
            del self._channel_scales
            if not self._lookups:
                self._quantized = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        y = (self.dense_mm(x) if self._dense.second_is_faster(x.shape[0])
             else self.packed_mm(x))
        return y if self.bias is None else y + self.bias

    def packed_mm(self, x: torch.Tensor) -> torch.Tensor:
        if self.uses_native:
            return self._native(x)
        x = x.to(torch.bfloat16)
        if self._bits == 4:
            y = torch.ops.aten._weight_int4pack_mm_for_cpu(x, self._packed, INT4_GROUP_SIZE,
                                                           self._scales_and_zeros)
        else:
            y = torch.ops.aten._weight_int8pack_mm(x, self._quantized.codes, self._channel_scales)
        return y

    def packed_form(self) -> tuple[PackedKind, list[torch.Tensor]] | None:
        """What `packed_mm` multiplies by, for the native decode stack: its kind, and three of
        its kernel's tensors and the bias (empty tensors where they have none); None where
        the packed form was dropped."""
        empty = torch.empty(0)
        bias = [empty if self.bias is None else self.bias]
        if self.uses_native and self._native is not None:
            return PackedKind.NATIVE_INT4, [*self._native.tensors, *bias]
        if self._bits == 4 and hasattr(self, "_packed"):
            return PackedKind.TORCH_INT4, [self._packed, self._scales_and_zeros, empty, *bias]
        if self._bits == 8 and hasattr(self, "_channel_scales"):
            return PackedKind.INT8, [self._quantized.codes, self._channel_scales, empty, *bias]
        return None

    def dense_mm(self, x: torch.Tensor) -> torch.Tensor:
        if self._copy is not None:
            return self._copy(x)
        out_features, in_features = self.shape
        channels = min(out_features, DEQUANTIZE_CHANNELS)
        buffer = self._scratch.at_least(channels * in_features)
        x = x.float()
        y = x.new_empty(x.shape[0], out_features)
        for start in range(0, out_features, channels):
            rows = slice(start, min(start + channels, out_features))
            weight = self._quantized.dequantize(rows, buffer)
            y[:, rows] = (transposed_product(x, weight)
                          if self._transposed.second_is_faster(x.shape[0])
                          else F.linear(x, weight))
        return y

    def rows(self, token_ids: torch.Tensor) -> torch.Tensor:
        """The fp32 weight's rows `token_ids`: a tied model's embedding lookup."""
        return self._quantized.dequantize(token_ids)


def _dequantized_copy(weight: QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """The dequantised weight in `dtype`, built a slice at a time (no full fp32 copy at once)."""
    copy = torch.empty(weight.shape, dtype=dtype)
    for start in range(0, weight.shape[0], DEQUANTIZE_CHANNELS):
        rows = slice(start, start + DEQUANTIZE_CHANNELS)
        copy[rows] = weight.dequantize(rows)
    return copy


class RefinedHead:
    """A quantized LM head whose most likely tokens get float32 logits.

    PyTorch's weight-only kernels (and the bf16 copies) take bf16 activations and return
    bf16: a logit near 25 comes back as a multiple of 0.125, so rounding decides near ties.
    Each row's REFINED_CANDIDATES highest logits are recomputed from the float32 hidden state
    and the head's dequantised rows, so the argmax, and the tokens sampling mostly picks, are
    the quantized model's own (the bf16 logits near a row's top err by a few bf16 ulps). It
    costs a small part of a step, mostly the top-k selection
    (docs/engine-measurements.md#quantization)."""

    def __init__(self, head: QuantizedProjection) -> None:
        self._head = head

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._head(hidden).float()
        candidates = logits.topk(min(REFINED_CANDIDATES, logits.shape[-1]), dim=-1).indices
        rows = self._head.rows(candidates.view(-1)).view(*candidates.shape, hidden.shape[-1])
        # Not bmm, which for one row computes otherwise than for several (see
        # `EngineConfig.enable_deterministic_inference`).
        exact = torch.linalg.vecdot(rows, hidden.float().unsqueeze(-2))
        if self._head.bias is not None:
            exact += self._head.bias[candidates]
        return logits.scatter_(-1, candidates, exact)


class QuantizedEmbedding:
    """An embedding lookup from a QuantizedWeight, or from a tied model's quantized LM head."""

    def __init__(self, weight: QuantizedWeight | QuantizedProjection) -> None:
        self._rows = weight.rows if isinstance(weight, QuantizedProjection) else weight.dequantize

    def __call__(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._rows(token_ids)


@dataclass(frozen=True, slots=True)
class QuantizationPlan:
    """How many bits each weight matrix keeps under a scheme. Matrices are named by their
    GGUF roles (`attn_q`, `ffn_down`, …; `output` is the LM head) and layer index.

    int4 keeps the LM head (for a tied model, the embedding too) at int8, as 4-bit GGUF files
    keep theirs at 8 bits or more: at 4 bits the head alone costs much of the teacher-forced
    top-1 agreement with float32 (docs/engine-measurements.md#quantization,
    tests/integration/test_quantized_model.py).

    gguf_bits: for the gguf scheme, the bits of each of the file's matrices by GGUF tensor
    name (`blk.3.attn_q`, `output`, `token_embd`)."""

    scheme: str
    gguf_bits: Mapping[str, int] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if self.scheme not in QUANTIZATION_SCHEMES:
            raise QuantizationError(f"quantization must be one of "
                                    f"{', '.join(QUANTIZATION_SCHEMES)}; "
                                    f"got {self.scheme!r}")

    @classmethod
    def for_model(cls, scheme: str, source: Path, device: torch.device, dtype: torch.dtype,
                  *, dtype_asked: bool = False) -> QuantizationPlan:
        """dtype_asked: the operator chose the dtype (see `resolve_scheme`)."""
        scheme = resolve_scheme(scheme, source, device, dtype, dtype_asked=dtype_asked)
        if scheme == "none":
            return cls(scheme)
        if device.type != "cpu" or dtype != torch.float32:
            raise QuantizationError(f"--quantization {scheme} runs on CPU in float32 (its "
                                    f"kernels are PyTorch's CPU ones); got {device.type} and "
                                    f"{str(dtype).removeprefix('torch.')}")
        if scheme != "gguf":
            return cls(scheme)
        if source.suffix != ".gguf":
            raise QuantizationError(f"--quantization gguf keeps a GGUF file's own precision, "
                                    f"but {source} is not a .gguf file: use int8 or int4")
        return cls(scheme, MappingProxyType(gguf_bits(source)))

    @property
    def is_quantized(self) -> bool:
        return self.scheme != "none"

    def bits(self, layer: int | None, roles: Sequence[str]) -> int:
        """Bits for the matrices `roles` fused into one (the widest of their own); layer None
        for the LM head."""
        if self.scheme == "int8" or (self.scheme == "int4" and layer is None):
            return 8
        if self.scheme == "int4":
            return 4
        if layer is None:
            return self.gguf_bits.get("output", self.gguf_bits.get("token_embd", 8))
        return max(self.gguf_bits.get(f"blk.{layer}.{role}", 8) for role in roles)


def resolve_scheme(scheme: str, source: Path, device: torch.device, dtype: torch.dtype, *,
                   dtype_asked: bool) -> str:
    """The scheme `auto` stands for: gguf for a .gguf file on a CPU in float32 unless the
    operator asked for a dtype (its weights served in their own quantization, the fastest
    path there); none for anything else (a Hugging Face folder keeps its weights as they are,
    an accelerator its dtype). Other schemes are themselves."""
    if scheme != "auto":
        return scheme
    serves_gguf = (source.suffix == ".gguf" and device.type == "cpu"
                   and dtype == torch.float32 and not dtype_asked)
    return "gguf" if serves_gguf else "none"


def gguf_bits(gguf_file: Path) -> dict[str, int]:
    """Bits to keep for each of a GGUF file's matrices, by GGUF tensor name: 4 for 4-bit
    block types, 8 for anything wider."""
    return {name.removesuffix(".weight"): 4 if tensor_type in FOUR_BIT_GGUF_TYPES else 8
            for name, dims, tensor_type in gguf_tensor_infos(gguf_file) if dims == 2}


def gguf_tensor_infos(gguf_file: Path) -> list[tuple[str, int, str]]:
    """Each tensor's name, number of dimensions and GGML type, read from the file's header
    alone: gguf's GGUFReader builds an array for every metadata value first, a tokenizer's
    strings included, at every start (docs/engine-measurements.md#start-up-and-loading)."""
    import numpy
    from gguf import GGUF_MAGIC, GGMLQuantizationType, GGUFReader, GGUFValueType

    sizes = {value_type: numpy.dtype(scalar).itemsize
             for value_type, scalar in GGUFReader.gguf_scalar_to_np.items()}
    with open(gguf_file, "rb") as file, mmap.mmap(file.fileno(), 0,
                                                  access=mmap.ACCESS_READ) as data:
        magic, _version, tensors, values = struct.unpack_from("<IIQQ", data)
        if magic != GGUF_MAGIC:
            raise QuantizationError(f"{gguf_file} is not a GGUF file")
        offset = struct.calcsize("<IIQQ")

        def number(fmt: str) -> int:
            nonlocal offset
            (value,) = struct.unpack_from(fmt, data, offset)
            offset += struct.calcsize(fmt)
            return value

        def text() -> str:
            nonlocal offset
            length = number("<Q")
            offset += length
            return bytes(data[offset - length:offset]).decode()

        def skip(value_type: int, count: int = 1) -> None:
            nonlocal offset
            if value_type == GGUFValueType.STRING:
                for _ in range(count):
                    length = number("<Q")
                    offset += length
            elif value_type == GGUFValueType.ARRAY:
                for _ in range(count):
                    item_type, items = number("<I"), number("<Q")
                    skip(item_type, items)
            else:
                offset += sizes[value_type] * count

        for _ in range(values):
            text()
            skip(number("<I"))
        infos = []
        for _ in range(tensors):
            name, dims = text(), number("<I")
            offset += 8 * dims
            infos.append((name, dims, GGMLQuantizationType(number("<I")).name))
            offset += 8
        return infos
