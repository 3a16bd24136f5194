"""Chat prompts: messages checked, then rendered with the model's own chat template."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from jinja2 import TemplateError

from engine.errors import InvalidRequest

ROLES = ("system", "developer", "user", "assistant", "tool")


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


def render_chat(tokenizer: object, messages: Sequence[ChatMessage]) -> str:
    """The conversation as the model's chat template writes it, special tokens included,
    ending with the opening of the assistant's turn (tokenize it without adding any)."""
    if not messages:
        raise InvalidRequest("messages", "must contain at least one message")
    for index, message in enumerate(messages):
        if message.role not in ROLES:
            raise InvalidRequest(f"messages[{index}].role", f"must be one of {', '.join(ROLES)}; "
                                 f"got {message.role!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest("messages", "the model has no chat template; send a plain prompt")
    try:
        return tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in messages],
            add_generation_prompt=True, tokenize=False)
    except TemplateError as error:
        raise InvalidRequest("messages", f"the model's chat template refused them: {error}") from None
