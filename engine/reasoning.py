"""A reasoning model's thinking apart from its answer (vLLM's --reasoning-parser names): the
text between <think> and </think> is reasoning, the rest the answer, read from a stream of
text deltas as from a whole output.

`deepseek_r1`: the output is reasoning until </think> (DeepSeek-R1's template opens <think>
in the prompt, so the output may not); without a </think> it is all reasoning. `qwen3`: only
an output that opens with <think> reasons (with enable_thinking false, Qwen3's template
writes an empty think block into the prompt, and the output is all answer).
"""

from __future__ import annotations

from switchboard.engine.tool_parsers import ParsedText, StreamParser, held_prefix_length

THINK_START = "<think>"
THINK_END = "</think>"


class ReasoningParser(StreamParser):
    def __init__(self, *, reasons_without_start: bool) -> None:
        super().__init__()
        self._reasons_without_start = reasons_without_start
        self._state = "start"  # then "reasoning", then "answer"
        self._answer_started = True  # False from </think> to the answer's first text

    @property
    def is_reasoning(self) -> bool:
        """Whether the text fed so far ends inside the reasoning."""
        return self._state == "reasoning"

    def _scan(self, *, final: bool) -> ParsedText:
        parsed = ParsedText()
        if self._state == "start":
            stripped = self._buffer.lstrip()
            if stripped.startswith(THINK_START):
                self._state, self._buffer = "reasoning", stripped[len(THINK_START):]
            elif not final and THINK_START.startswith(stripped):
                return parsed  # the opening may be on its way
            else:
                self._state = "reasoning" if self._reasons_without_start else "answer"
        if self._state == "reasoning":
            end = self._buffer.find(THINK_END)
            if end < 0:
                keep = 0 if final else held_prefix_length(self._buffer, (THINK_END,))
                cut = len(self._buffer) - keep
                parsed, self._buffer = ParsedText(reasoning=self._buffer[:cut]), self._buffer[cut:]
                return parsed
            parsed = ParsedText(reasoning=self._buffer[:end])
            self._state, self._buffer = "answer", self._buffer[end + len(THINK_END):]
            self._answer_started = False
        if not self._answer_started:  # the answer's leading whitespace closes the thinking
            self._buffer = self._buffer.lstrip()
            self._answer_started = bool(self._buffer)
        parsed, self._buffer = parsed + ParsedText(self._buffer), ""
        return parsed


def deepseek_r1() -> ReasoningParser:
    return ReasoningParser(reasons_without_start=True)


def qwen3() -> ReasoningParser:
    return ReasoningParser(reasons_without_start=False)


REASONING_PARSERS = {"deepseek_r1": deepseek_r1, "qwen3": qwen3}
