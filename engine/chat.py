"""Chat prompts: messages checked, then rendered with the model's own chat template."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

from jinja2 import TemplateError

from switchboard.engine.errors import InvalidRequest

ROLES = ("system", "developer", "user", "assistant", "tool")
# Names `apply_chat_template` takes as its own arguments: as template variables they would
# change what it returns or replace the conversation, so none may come as one.
RESERVED_TEMPLATE_VARIABLES = frozenset({
    "conversation", "messages", "tools", "documents", "chat_template", "add_generation_prompt",
    "continue_final_message", "tokenize", "padding", "truncation", "max_length",
    "return_tensors", "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs"})


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str


@dataclass(frozen=True, slots=True)
class ChatPrompt:
    """A conversation and how the template renders it. template_variables: more variables
    for the template (vLLM's chat_template_kwargs, such as Qwen3's `enable_thinking`); the
    rendering ends with the opening of the assistant's turn (add_generation_prompt), or
    inside the last message, which the model then continues (continue_final_message), or
    after the last message's end."""

    messages: Sequence[ChatMessage]
    template_variables: Mapping[str, object] = field(
        default_factory=lambda: MappingProxyType({}))
    add_generation_prompt: bool = True
    continue_final_message: bool = False


def render_chat(tokenizer: object, prompt: ChatPrompt) -> str:
    """The conversation as the model's chat template writes it, special tokens included
    (tokenize it without adding any)."""
    if not prompt.messages:
        raise InvalidRequest("messages", "must contain at least one message")
    for index, message in enumerate(prompt.messages):
        if message.role not in ROLES:
            raise InvalidRequest(f"messages[{index}].role", f"must be one of {', '.join(ROLES)}; "
                                 f"got {message.role!r}")
    reserved = sorted(RESERVED_TEMPLATE_VARIABLES & set(prompt.template_variables))
    if reserved:
        raise InvalidRequest(f"chat_template_kwargs.{reserved[0]}", "is not a template "
                             "variable one may set: it is an argument of the rendering itself")
    if prompt.add_generation_prompt and prompt.continue_final_message:
        raise InvalidRequest("continue_final_message", "cannot be combined with "
                             "add_generation_prompt: set that to false")
    if prompt.continue_final_message and prompt.messages[-1].role != "assistant":
        raise InvalidRequest("continue_final_message", "needs the last message to be the "
                             f"assistant's; it is {prompt.messages[-1].role!r}")
    if not getattr(tokenizer, "chat_template", None):
        raise InvalidRequest("messages", "the model has no chat template; send a plain prompt")
    try:
        return tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.content} for m in prompt.messages],
            add_generation_prompt=prompt.add_generation_prompt,
            continue_final_message=prompt.continue_final_message, tokenize=False,
            **prompt.template_variables)
    except (TemplateError, ValueError) as error:
        # ValueError: transformers' own refusals, such as a final message the template does
        # not write whole, which continue_final_message cannot find.
        raise InvalidRequest("messages", f"the model's chat template refused them: {error}") from None
