"""Runs one engine step for the whole batch over the paged KV cache.

The Llama family (Llama, Mistral, Qwen2; SmolLM2 is Llama) is computed here from the
transformers model's own modules and weights, with the Q/K/V and gate/up projections fused
into one matmul each. All scheduled tokens of all requests travel as one flat sequence;
attention is one call per layer for the whole batch (see `attention.py`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel

from engine.attention import AttentionBatch, paged_attention

SUPPORTED_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


class UnsupportedModel(ValueError):
    """The model's architecture has no paged implementation here."""


@dataclass(frozen=True, slots=True)
class SequenceChunk:
    """Tokens to compute for one sequence: their ids, first position, and block table."""

    request_id: str
    token_ids: Sequence[int]
    start: int
    block_ids: Sequence[int]
    samples: bool


@dataclass(frozen=True, slots=True)
class _Layer:
    input_norm: nn.Module
    qkv: nn.Linear
    o_proj: nn.Linear
    post_norm: nn.Module
    gate_up: nn.Linear
    down: nn.Linear
    act: nn.Module


def kv_bytes_per_token(model: PreTrainedModel, dtype: torch.dtype) -> int:
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.tensor([], dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * element


class PagedRunner:
    def __init__(self, model: PreTrainedModel, device: torch.device, num_blocks: int,
                 block_size: int) -> None:
        architecture = (model.config.architectures or [type(model).__name__])[0]
        if architecture not in SUPPORTED_ARCHITECTURES:
            raise UnsupportedModel(f"{architecture} is not supported; supported architectures: "
                                   + ", ".join(SUPPORTED_ARCHITECTURES))
        config = model.config
        self._device = device
        self._block_size = block_size
        self._num_heads = config.num_attention_heads
        self._num_kv_heads = config.num_key_value_heads
        self._head_dim = getattr(config, "head_dim", None) or config.hidden_size // self._num_heads
        self._embed = model.model.embed_tokens
        self._rotary = model.model.rotary_emb
        self._final_norm = model.model.norm
        self._lm_head = model.lm_head
        self._layers = [self._fuse(layer) for layer in model.model.layers]
        dtype = self._embed.weight.dtype
        shape = (len(self._layers), num_blocks * block_size, self._num_kv_heads, self._head_dim)
        # torch.empty: pages become resident only as blocks are first written.
        self._k_cache = torch.empty(shape, dtype=dtype, device=device)
        self._v_cache = torch.empty(shape, dtype=dtype, device=device)

    @staticmethod
    def _fuse(layer: nn.Module) -> _Layer:
        """Fuse a layer's projections; the originals are dropped from the model (the runner
        owns it) so their weights are not held twice."""
        attention, mlp = layer.self_attn, layer.mlp
        fused = _Layer(
            input_norm=layer.input_layernorm,
            qkv=_concat_linear(attention.q_proj, attention.k_proj, attention.v_proj),
            o_proj=attention.o_proj,
            post_norm=layer.post_attention_layernorm,
            gate_up=_concat_linear(mlp.gate_proj, mlp.up_proj),
            down=mlp.down_proj,
            act=mlp.act_fn,
        )
        for module, names in ((attention, ("q_proj", "k_proj", "v_proj")),
                              (mlp, ("gate_proj", "up_proj"))):
            for name in names:
                delattr(module, name)
        return fused

    @torch.inference_mode()
    def execute(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        """Compute the chunks' tokens, writing their K/V into the cache; return the logits
        (float32, on CPU) at the last token of every chunk that samples, in order."""
        batch = AttentionBatch.build(chunks, self._block_size, self._device)
        hidden = self._embed(batch.token_ids)
        cos, sin = self._rotary(hidden, batch.positions.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)
        q_size = self._num_heads * self._head_dim
        kv_size = self._num_kv_heads * self._head_dim
        for index, layer in enumerate(self._layers):
            qkv = layer.qkv(layer.input_norm(hidden))
            q, k, v = qkv.split((q_size, kv_size, kv_size), dim=-1)
            q = _rotate(q.view(-1, self._num_heads, self._head_dim), cos, sin)
            k = _rotate(k.view(-1, self._num_kv_heads, self._head_dim), cos, sin)
            v = v.view(-1, self._num_kv_heads, self._head_dim)
            attended = paged_attention(q, k, v, self._k_cache[index], self._v_cache[index], batch)
            hidden = hidden + layer.o_proj(attended)
            gate, up = layer.gate_up(layer.post_norm(hidden)).chunk(2, dim=-1)
            hidden = hidden + layer.down(layer.act(gate) * up)
        last = self._final_norm(hidden[batch.sample_index])
        return self._lm_head(last).float().cpu()


def _concat_linear(*linears: nn.Linear) -> nn.Linear:
    weight = torch.cat([linear.weight for linear in linears])
    has_bias = linears[0].bias is not None
    fused = nn.Linear(weight.shape[1], weight.shape[0], bias=has_bias, device=weight.device,
                      dtype=weight.dtype)
    with torch.no_grad():
        fused.weight.copy_(weight)
        if has_bias:
            fused.bias.copy_(torch.cat([linear.bias for linear in linears]))
    return fused


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding, in transformers' rotate-half convention."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin
