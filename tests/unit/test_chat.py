"""engine.chat.render_chat: a conversation as the model's chat template writes it, with vLLM's
options of the rendering (more template variables; ending at the opening of the assistant's
turn, after the last message, or inside it). A tokenizer of one token whose template marks
each message and the assistant's opening, and reads one variable of its own."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from switchboard.engine.chat import ChatMessage, ChatPrompt, render_chat
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
