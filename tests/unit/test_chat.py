"""engine.chat.render_chat: a conversation as the model's chat template writes it, with vLLM's
options of the rendering (more template variables; ending at the opening of the assistant's
turn, after the last message, or inside it). A tokenizer of one token whose template marks
each message and the assistant's opening, and reads one variable of its own."""

from __future__ import annotations

import copy
import json

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from switchboard.engine.chat import ChatMessage, ChatPrompt, Tool, ToolCall, render_chat
from switchboard.engine.errors import InvalidRequest

TEMPLATE = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
            "{% if add_generation_prompt %}<assistant>"
            "{% if enable_thinking is defined and not enable_thinking %}<no-think>{% endif %}"
            "{% endif %}")
QUESTION = ChatMessage("user", "Capital of France?")
STARTED_ANSWER = ChatMessage("assistant", "The capital is")


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel({"[UNK]": 0}, unk_token="[UNK]")))
    tokenizer.chat_template = TEMPLATE
    return tokenizer


def test_a_conversation_ends_with_the_opening_of_the_assistants_turn(tokenizer) -> None:
    assert render_chat(tokenizer, ChatPrompt([QUESTION])) == \
        "<user>Capital of France?</user><assistant>"


def test_template_variables_reach_the_template(tokenizer) -> None:
    prompt = ChatPrompt([QUESTION], template_variables={"enable_thinking": False})
    assert render_chat(tokenizer, prompt).endswith("<assistant><no-think>")


def test_without_the_generation_prompt_it_ends_after_the_last_message(tokenizer) -> None:
    prompt = ChatPrompt([QUESTION], add_generation_prompt=False)
    assert render_chat(tokenizer, prompt) == "<user>Capital of France?</user>"


def test_a_final_assistant_message_to_continue_is_left_open(tokenizer) -> None:
    prompt = ChatPrompt([QUESTION, STARTED_ANSWER], add_generation_prompt=False,
                        continue_final_message=True)
    assert render_chat(tokenizer, prompt) == \
        "<user>Capital of France?</user><assistant>The capital is"


@pytest.mark.parametrize("prompt, field", [
    (ChatPrompt([QUESTION, STARTED_ANSWER], continue_final_message=True),
     "continue_final_message"),
    (ChatPrompt([QUESTION], add_generation_prompt=False, continue_final_message=True),
     "continue_final_message"),
    (ChatPrompt([QUESTION], template_variables={"messages": []}),
     "chat_template_kwargs.messages"),
    (ChatPrompt([QUESTION], template_variables={"tokenize": True}),
     "chat_template_kwargs.tokenize"),
    (ChatPrompt([ChatMessage("narrator", "Once")]), "messages[0].role"),
    (ChatPrompt([]), "messages"),
], ids=["with-generation-prompt", "last-is-users", "messages-variable", "tokenize-variable",
        "unknown-role", "no-messages"])
def test_refusals_name_the_field(tokenizer, prompt: ChatPrompt, field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        render_chat(tokenizer, prompt)
    assert refused.value.field == field


SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
    "Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + "
    "message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
WEATHER = Tool("get_weather", "The weather in a city.",
               {"type": "object", "properties": {"city": {"type": "string"}}})
CALL = ToolCall("call_1", "get_weather", '{"city": "Paris"}')
TOOL_LOOP = [QUESTION, ChatMessage("assistant", "", tool_calls=(CALL,)),
             ChatMessage("tool", "18 degrees", tool_call_id="call_1")]


@pytest.fixture
def chatml(tokenizer) -> PreTrainedTokenizerFast:
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = SMOLLM2_TEMPLATE
    return tokenizer


def test_a_chatml_template_that_ignores_tools_renders_them_with_chatmls_tools_template(
        chatml) -> None:
    rendered = render_chat(chatml, ChatPrompt(TOOL_LOOP, tools=(WEATHER,)))
    assert rendered.startswith("<|im_start|>system\n# Tools\n")
    assert json.dumps(WEATHER.as_template_tool()) in rendered
    assert ('<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": '
            '{"city": "Paris"}}\n</tool_call><|im_end|>\n') in rendered
    assert rendered.endswith("<|im_start|>user\n<tool_response>\n18 degrees\n</tool_response>"
                             "<|im_end|>\n<|im_start|>assistant\n")


def test_without_tools_the_models_own_template_renders(chatml) -> None:
    assert render_chat(chatml, ChatPrompt([QUESTION])) == chatml.apply_chat_template(
        [{"role": "user", "content": QUESTION.content}], add_generation_prompt=True,
        tokenize=False)


def test_a_template_that_reads_tools_gets_them_and_the_calls(tokenizer) -> None:
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.chat_template = ("{{ tools | map(attribute='function.name') | join(',') }}|"
                               "{% for m in messages %}{% for c in m.tool_calls or [] %}"
                               "{{ c.id }}:{{ c.function.arguments.city }}{% endfor %}"
                               "{{ m.tool_call_id or '' }};{% endfor %}")
    assert render_chat(tokenizer, ChatPrompt(TOOL_LOOP, tools=(WEATHER,))) == \
        "get_weather|;call_1:Paris;call_1;"


@pytest.mark.parametrize("messages, field", [
    ([QUESTION, ChatMessage("tool", "18", tool_call_id="call_9")], "messages[1].tool_call_id"),
    ([QUESTION, ChatMessage("assistant", "", tool_calls=(ToolCall("c", "f", "[1]"),))],
     "messages[1].tool_calls[0].function.arguments"),
    ([QUESTION, ChatMessage("assistant", "", tool_calls=(ToolCall("c", "f", "{x"),))],
     "messages[1].tool_calls[0].function.arguments"),
], ids=["unanswered-id", "arguments-not-an-object", "arguments-not-json"])
def test_tool_messages_refusals_name_the_field(chatml, messages, field: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        render_chat(chatml, ChatPrompt(messages))
    assert refused.value.field == field
