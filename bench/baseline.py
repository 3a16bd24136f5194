"""The baseline: plain transformers `generate` on the same converted model, device and dtype,
in this process (run while the server idles between its levels, so the two never compute at
once). `min_new_tokens` equal to `max_new_tokens` makes it generate exactly as many tokens as
the server does with ignore_eos."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, PreTrainedModel

from bench.metrics import Row, make_row


class Baseline:
    def __init__(self, folder: Path, eos_token_id: int, device: torch.device,
                 dtype: torch.dtype) -> None:
        self.model: PreTrainedModel = AutoModelForCausalLM.from_pretrained(
            folder, dtype=dtype).to(device).eval()
        self.eos = eos_token_id
        self.device = device

    def warm_up(self, prompt: tuple[int, ...], new_tokens: int) -> None:
        self._generate([prompt], new_tokens)

    def one_at_a_time(self, prompts: Sequence[tuple[int, ...]], max_new_tokens: int) -> Row:
        """Each prompt alone, one after another."""
        return self._batches("transformers, one at a time", [[prompt] for prompt in prompts],
                             max_new_tokens)

    def static_batches(self, batches: Sequence[Sequence[tuple[int, ...]]],
                       max_new_tokens: int) -> Row:
        """Each batch's prompts in one left-padded batch, the batches one after another (the
        same requests as the level of as many streams sends, `size` at a time)."""
        return self._batches(f"transformers, static batch of {len(batches[0])}", batches,
                             max_new_tokens)

    def _batches(self, name: str, batches: Sequence[Sequence[tuple[int, ...]]],
                 max_new_tokens: int) -> Row:
        """The batches one after another, their tokens/s the total over them. By batch, TTFT:
        a generate of one token; TPOT: the rest of a full generate's time, per remaining
        token."""
        ttfts: list[float] = []
        tpots: list[float] = []
        tokens = 0
        wall_s = cpu_s = 0.0
        for prompts in batches:
            ttft, _, _ = self._generate(prompts, 1)
            elapsed, cpu, generated = self._generate(prompts, max_new_tokens)
            ttfts.append(ttft)
            tpots.append((elapsed - ttft) / (max_new_tokens - 1))
            tokens += generated
            wall_s += elapsed
            cpu_s += cpu
        return make_row(name, len(batches[0]), sum(len(prompts) for prompts in batches), 0,
                        tokens, wall_s, cpu_s, ttfts, tpots)

    def _generate(self, prompts: Sequence[tuple[int, ...]],
                  new_tokens: int) -> tuple[float, float, int]:
        """Greedy generation of exactly `new_tokens` per prompt: (wall s, CPU s, tokens)."""
        width = max(len(prompt) for prompt in prompts)
        input_ids = torch.tensor([[self.eos] * (width - len(p)) + list(p) for p in prompts],
                                 device=self.device)
        attention_mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts],
                                      device=self.device)
        cpu_start, start = time.process_time(), time.perf_counter()
        with torch.inference_mode():
            output = self.model.generate(input_ids=input_ids, attention_mask=attention_mask,
                                         do_sample=False, max_new_tokens=new_tokens,
                                         min_new_tokens=new_tokens, pad_token_id=self.eos)
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        elapsed = time.perf_counter() - start
        return elapsed, time.process_time() - cpu_start, (output.shape[1] - width) * len(prompts)
