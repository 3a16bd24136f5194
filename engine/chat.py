"""Chat prompts: messages checked, then rendered with the model's own chat template (or the
operator's, vLLM's --chat-template), tools and tool calls included as transformers'
`apply_chat_template` takes them."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.resources import files
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


# For a ChatML model (SmolLM2) whose own template ignores tools: tools in the system turn,
# calls written as Hermes' <tool_call> JSON, and tool results as <tool_response>.
CHATML_TOOLS_TEMPLATE = files(__package__).joinpath("templates", "chatml_tools.jinja")


@dataclass(frozen=True, slots=True)
class ToolCall:
    """An assistant's call of a tool; arguments: a JSON object, as text."""

    id: str
    name: str
    arguments: str


@dataclass(frozen=True, slots=True)
class ChatMessage:
    role: str
    content: str
    tool_calls: Sequence[ToolCall] = ()
    tool_call_id: str = ""  # a tool message's: the call it answers


@dataclass(frozen=True, slots=True)
class Tool:
    """A function the model may call; parameters: its arguments' JSON schema."""

    name: str
    description: str = ""
    parameters: Mapping[str, object] = field(default_factory=lambda: MappingProxyType({}))

    def as_template_tool(self) -> dict[str, object]:
        """As chat templates read it (OpenAI's shape)."""
        function: dict[str, object] = {"name": self.name, "parameters": dict(self.parameters)}
        if self.description:
            function["description"] = self.description
        return {"type": "function", "function": function}


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
    tools: Sequence[Tool] = ()  # the template's `tools`


def render_chat(tokenizer: object, prompt: ChatPrompt) -> str:
    """The conversation as the model's chat template writes it, special tokens included
    (tokenize it without adding any)."""
    if not prompt.messages:
        raise InvalidRequest("messages", "must contain at least one message")
    call_ids: set[str] = set()
    for index, message in enumerate(prompt.messages):
        if message.role not in ROLES:
            raise InvalidRequest(f"messages[{index}].role", f"must be one of {', '.join(ROLES)}; "
                                 f"got {message.role!r}")
        if message.tool_call_id and message.tool_call_id not in call_ids:
            raise InvalidRequest(f"messages[{index}].tool_call_id",
                                 f"{message.tool_call_id!r} matches no earlier tool call")
        call_ids.update(call.id for call in message.tool_calls)
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
    uses_tools = prompt.tools or any(message.tool_calls or message.role == "tool"
                                     for message in prompt.messages)
    template = tools_template(tokenizer.chat_template) if uses_tools else None
    try:
        return tokenizer.apply_chat_template(
            [template_message(index, message) for index, message in enumerate(prompt.messages)],
            tools=[tool.as_template_tool() for tool in prompt.tools] or None,
            add_generation_prompt=prompt.add_generation_prompt,
            continue_final_message=prompt.continue_final_message, tokenize=False,
            chat_template=template, **prompt.template_variables)
    except (TemplateError, ValueError) as error:
        # ValueError: transformers' own refusals, such as a final message the template does
        # not write whole, which continue_final_message cannot find.
        raise InvalidRequest("messages", f"the model's chat template refused them: {error}") from None


def template_message(index: int, message: ChatMessage) -> dict[str, object]:
    """A message as transformers' chat templates read it: an assistant's tool calls with
    their arguments as an object, a tool message with the id of the call it answers."""
    result: dict[str, object] = {"role": message.role, "content": message.content}
    if message.tool_calls:
        result["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.name,
                          "arguments": _arguments(f"messages[{index}].tool_calls[{number}]"
                                                  ".function.arguments", call.arguments)}}
            for number, call in enumerate(message.tool_calls)]
    if message.tool_call_id:
        result["tool_call_id"] = message.tool_call_id
    return result


def _arguments(where: str, text: str) -> dict[str, object]:
    try:
        arguments = json.loads(text or "{}")
    except json.JSONDecodeError as error:
        raise InvalidRequest(where, f"is not JSON: {error}") from None
    if not isinstance(arguments, dict):
        raise InvalidRequest(where, "must be a JSON object")
    return arguments


def tools_template(own: str | None) -> str | None:
    """The template for a conversation with tools or tool calls where the model's own (or the
    operator's, vLLM's --chat-template) ignores them: ChatML's with tools for a ChatML one, as
    SmolLM2's; None where the template reads tools itself (or is not ChatML)."""
    if own and "<|im_start|>" in own and "tools" not in own:
        return CHATML_TOOLS_TEMPLATE.read_text()
    return None
