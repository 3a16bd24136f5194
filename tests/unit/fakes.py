"""Fakes for driving EngineCore and AsyncEngine without a model (shared by their tests).

Token ids are letters: id 0 is 'a', id 25 is 'z'. The fake runner makes greedy decoding follow
a script chosen by the prompt; the fake tokenizer decodes ids to their letters.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from switchboard.engine.block_manager import BlockManager
from switchboard.engine.core import EngineCore
from switchboard.engine.request import RequestOutput
from switchboard.engine.paged_runner import SequenceChunk
from switchboard.engine.scheduler import Scheduler
from switchboard.engine.params import GenerationRequest, SamplingParams

VOCAB_SIZE = 26
EOS_ID = 25  # 'z'


def ids(text: str) -> tuple[int, ...]:
    return tuple(ord(char) - ord("a") for char in text)


class FakeTokenizer:
    def __init__(self, special_ids: Collection[int] = (EOS_ID,)) -> None:
        self.special_ids = frozenset(special_ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return letters([token_id for token_id in token_ids
                        if not (skip_special_tokens and token_id in self.special_ids)])


@dataclass
class SequenceState:
    script: str
    num_prompt_tokens: int


@dataclass
class FakeRunner:
    """Scripted ModelRunner over a virtual paged KV cache.

    Every computed token is stored at its cache slot (from the chunk's block table), and each
    sampling chunk reads its whole context back through the block table, so broken paging
    shows up as wrong output. A sequence whose prompt reads back as `ids(p)` generates
    `scripts[p]`, cycled; other prompts generate DEFAULT_SCRIPT. A chunk with all_logits gets
    a row at each of its tokens, read back the same way: `context_logits` of its context
    except at a sampling chunk's last token, which gets the scripted row.

    `calls` records ("prefill", prompt chunk) for chunks starting at position 0, ("decode",
    token id) for one-token chunks and ("speculate", newest token and guesses) for chunks with
    guesses to verify (a sampling row at each, as at the last token). A prompt in `fail_prefill` raises when its first chunk
    runs. While `gate` is an unset Event, steps with a prefill wait for it (5 s at most);
    `step_delay_s` slows every step down.
    """

    DEFAULT_SCRIPT = "abcdefghijklmnopqrstuvwxy"

    scripts: dict[str, str] = field(default_factory=dict)
    fail_prefill: Collection[str] = ()
    gate: threading.Event | None = None
    step_delay_s: float = 0.0
    block_size: int = 4
    calls: list[tuple[str, object]] = field(default_factory=list)
    cache: dict[int, int] = field(default_factory=dict)
    sequences: dict[str, SequenceState] = field(default_factory=dict)

    @torch.inference_mode()  # as PagedRunner: its logits are inference tensors
    def execute(self, chunks: Sequence[SequenceChunk]) -> torch.Tensor:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        rows = []
        for chunk in chunks:
            self._record(chunk)
            for offset, token_id in enumerate(chunk.token_ids):
                self.cache[self._slot(chunk, chunk.start + offset)] = token_id
            end = chunk.start + len(chunk.token_ids)
            if chunk.all_logits:
                for position in range(chunk.start, end - 1 if chunk.samples else end):
                    rows.append(self.context_logits(self._context(chunk, position + 1)))
            if chunk.samples:
                rows += self._sampling_rows(chunk, end)
        return torch.stack(rows) if rows else torch.empty(0, VOCAB_SIZE)

    def _sampling_rows(self, chunk: SequenceChunk, end: int) -> list[torch.Tensor]:
        """The scripted row at the chunk's last token, and at each guess before it; but, as a
        model's would, the rows after a guess the script disagrees with are nonsense (the
        context's `context_logits`)."""
        rows: list[torch.Tensor] = []
        agreed = True
        for length in range(end - chunk.num_draft_tokens, end + 1):
            context = self._context(chunk, length)
            rows.append(self._next_logits(chunk.request_id, context) if agreed
                        else self.context_logits(context))
            if length < end:
                agreed = agreed and self._agrees(rows[-1], context, chunk.token_ids[
                    length - chunk.start])
        return rows

    @staticmethod
    def _agrees(row: torch.Tensor, context: Sequence[int], guess: int) -> bool:
        """Whether the scripted model would follow `context` with `guess`."""
        return int(row.argmax()) == guess

    @staticmethod
    def context_logits(context: Sequence[int]) -> torch.Tensor:
        """Logits after `context` at a row that does not sample: fixed by the context, and
        different for each position and token."""
        vocab = torch.arange(VOCAB_SIZE, dtype=torch.float32)
        return torch.sin(vocab * len(context) + context[-1])

    def prefilled_prompts(self) -> list[str]:
        return [prompt for kind, prompt in self.calls if kind == "prefill"]

    def _record(self, chunk: SequenceChunk) -> None:
        text = letters(chunk.token_ids)
        if chunk.start == 0:
            self.calls.append(("prefill", text))
            if self.gate is not None:
                self.gate.wait(timeout=5)
            if text in self.fail_prefill:
                raise RuntimeError(f"scripted failure for prompt {text!r}")
        elif len(chunk.token_ids) == 1:
            self.calls.append(("decode", chunk.token_ids[0]))
        elif chunk.num_draft_tokens:
            self.calls.append(("speculate", text))

    def _context(self, chunk: SequenceChunk, length: int) -> list[int]:
        return [self.cache[self._slot(chunk, i)] for i in range(length)]

    def _slot(self, chunk: SequenceChunk, position: int) -> int:
        return chunk.block_ids[position // self.block_size] * self.block_size \
            + position % self.block_size

    def _next_logits(self, request_id: str, context: list[int]) -> torch.Tensor:
        state = self.sequences.setdefault(request_id, SequenceState(
            self.scripts.get(letters(context), self.DEFAULT_SCRIPT), len(context)))
        position = len(context) - state.num_prompt_tokens
        token_id = ids(state.script[position % len(state.script)])[0]
        logits = torch.full((VOCAB_SIZE,), -10.0)
        logits[token_id] = 10.0
        return logits


def letters(token_ids: Sequence[int]) -> str:
    return "".join(chr(ord("a") + token_id) for token_id in token_ids)


def make_request(request_id: str, prompt: str = "p", *, max_new_tokens: int = 20,
                 stop: tuple[str, ...] = (), include_stop_str_in_output: bool = False,
                 priority: int = 5, timeout_s: float = 600.0) -> GenerationRequest:
    sampling = SamplingParams(do_sample=False, seed=7, max_new_tokens=max_new_tokens, stop=stop,
                              include_stop_str_in_output=include_stop_str_in_output)
    return GenerationRequest(request_id=request_id, prompt_token_ids=ids(prompt), sampling=sampling,
                             priority=priority, timeout_s=timeout_s)


def make_core(runner: FakeRunner | None = None, *, max_running: int = 8, num_blocks: int = 256,
              max_batched_tokens: int = 64, max_prefill_tokens: int = 64,
              enable_prefix_caching: bool = True, num_speculative_tokens: int = 0,
              speculative_max_batch: int = 4) -> EngineCore:
    runner = runner or FakeRunner()
    block_manager = BlockManager(num_blocks, runner.block_size,
                                 enable_prefix_caching=enable_prefix_caching)
    scheduler = Scheduler(block_manager, max_running=max_running,
                          max_batched_tokens=max_batched_tokens,
                          max_prefill_tokens=max_prefill_tokens,
                          num_speculative_tokens=num_speculative_tokens,
                          speculative_max_batch=speculative_max_batch)
    return EngineCore(runner, FakeTokenizer(), {EOS_ID}, scheduler)


def run(core: EngineCore, max_steps: int = 100) -> dict[str, list[RequestOutput]]:
    """Step until the core is idle; the outputs of each request, in order."""
    outputs: dict[str, list[RequestOutput]] = defaultdict(list)
    for _ in range(max_steps):
        if not core.has_work():
            return outputs
        for output in core.step():
            outputs[output.request_id].append(output)
    raise AssertionError(f"the core still had work after {max_steps} steps")
