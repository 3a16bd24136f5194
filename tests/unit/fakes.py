"""Fakes for driving EngineCore and AsyncEngine without a model (shared by their tests).

Token ids are letters: id 0 is 'a', id 25 is 'z'. The fake runner makes greedy decoding follow
a script chosen by the prompt; the fake tokenizer decodes ids to their letters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

import torch

from engine.core import EngineCore
from engine.params import GenerationRequest, SamplingParams

VOCAB_SIZE = 26
EOS_ID = 25  # 'z'


def ids(text: str) -> tuple[int, ...]:
    return tuple(ord(char) - ord("a") for char in text)


class FakeTokenizer:
    def __init__(self, special_ids: Collection[int] = (EOS_ID,)) -> None:
        self.special_ids = frozenset(special_ids)

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return "".join(chr(ord("a") + token_id) for token_id in token_ids
                       if not (skip_special_tokens and token_id in self.special_ids))


@dataclass
class SequenceState:
    script: str
    position: int = 0


@dataclass
class FakeRunner:
    """Scripted ModelRunner: a sequence whose prompt is `ids(p)` generates `scripts[p]`,
    cycled; other prompts generate DEFAULT_SCRIPT.

    `calls` records ("prefill", prompt) and ("decode", token id). A prompt in `fail_prefill`
    raises in prefill. While `gate` is set to an unset Event, prefill waits for it (5 s at
    most); `step_delay_s` slows every call down.
    """

    DEFAULT_SCRIPT = "abcdefghijklmnopqrstuvwxy"

    scripts: dict[str, str] = field(default_factory=dict)
    fail_prefill: Collection[str] = ()
    gate: threading.Event | None = None
    step_delay_s: float = 0.0
    calls: list[tuple[str, object]] = field(default_factory=list)

    def prefill(self, token_ids: Sequence[int]) -> tuple[torch.Tensor, SequenceState]:
        prompt = "".join(chr(ord("a") + token_id) for token_id in token_ids)
        self.calls.append(("prefill", prompt))
        if self.gate is not None:
            self.gate.wait(timeout=5)
        if prompt in self.fail_prefill:
            raise RuntimeError(f"scripted failure for prompt {prompt!r}")
        state = SequenceState(self.scripts.get(prompt, self.DEFAULT_SCRIPT))
        return self._next_logits(state), state

    def decode(self, token_id: int, state: object) -> torch.Tensor:
        self.calls.append(("decode", token_id))
        assert isinstance(state, SequenceState)
        return self._next_logits(state)

    def prefilled_prompts(self) -> list[str]:
        return [prompt for kind, prompt in self.calls if kind == "prefill"]

    def _next_logits(self, state: SequenceState) -> torch.Tensor:
        if self.step_delay_s:
            time.sleep(self.step_delay_s)
        token_id = ids(state.script[state.position % len(state.script)])[0]
        state.position += 1
        logits = torch.full((VOCAB_SIZE,), -10.0)
        logits[token_id] = 10.0
        return logits


def make_request(request_id: str, prompt: str = "p", *, max_new_tokens: int = 20,
                 stop: tuple[str, ...] = (), priority: int = 5,
                 timeout_s: float = 600.0) -> GenerationRequest:
    sampling = SamplingParams(do_sample=False, seed=7, max_new_tokens=max_new_tokens, stop=stop)
    return GenerationRequest(request_id=request_id, prompt_token_ids=ids(prompt), sampling=sampling,
                             priority=priority, timeout_s=timeout_s)


def make_core(runner: FakeRunner | None = None, *, max_running: int = 8) -> EngineCore:
    return EngineCore(runner or FakeRunner(), FakeTokenizer(), {EOS_ID}, max_running=max_running)
