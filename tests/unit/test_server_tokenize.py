"""server.generation's Tokenize of chat messages, with a fake engine: the templated text is the
text the engine's chat template wrote, and the ids and spans are those of tokenizing it with
no special tokens added. The real tokenizer's answers are in
tests/integration/test_generation_service.py. And the chat prompt's options as the server
reads them."""

from __future__ import annotations

import asyncio

import pytest

from switchboard.engine.chat import ChatMessage, ChatPrompt
from switchboard.engine.config import EngineLimits
from switchboard.engine.errors import InvalidRequest
from switchboard.engine.tokenization import Tokenization
from switchboard.proto import switchboard_pb2 as sb
from switchboard.server.generation import GenerationServicer, chat_prompt
from switchboard.server.kv_transfer import KVHandoff
from switchboard.server.servicer import InferenceServicer
from switchboard.server.served_model import ServedModel

MODEL = "m"
LIMITS = EngineLimits(vocab_size=1000, max_seq_len=64, max_input_len=63, max_iter_times=64,
                      max_token_bytes=8)
TEMPLATED = "<s>Hi"


class CharacterPrompts:
    """One token per character, its code point, and a BOS token (1) when special tokens are
    added; the chat template writes TEMPLATED."""

    async def render_chat(self, prompt: ChatPrompt) -> str:
        return TEMPLATED

    async def tokenize(self, text: str, add_special_tokens: bool = True) -> Tokenization:
        bos = [(1, (0, 0))] if add_special_tokens else []
        tokens = bos + [(ord(character), (i, i + 1)) for i, character in enumerate(text)]
        ids = [token for token, _ in tokens]
        return Tokenization(ids=ids, spans=[span for _, span in tokens],
                            texts=[chr(token_id) for token_id in ids],
                            vocabulary_strings=[f"<{token_id}>" for token_id in ids])


class CharacterEngine:
    is_healthy = True
    limits = LIMITS
    prompts = CharacterPrompts()


def test_chat_tokens_are_those_of_the_templated_text_with_their_spans_in_it() -> None:
    served = ServedModel(MODEL)
    served.engine = CharacterEngine()
    request = sb.TokenizeRequest(messages=sb.ChatMessages(
        messages=[sb.ChatMessage(role="user", content="Hi")]))
    handoff = KVHandoff(None, "localhost")
    servicer = GenerationServicer(served, InferenceServicer(served, "test", handoff), handoff)
    response = asyncio.run(servicer.Tokenize(request, None))
    assert response.templated_text == TEMPLATED
    assert list(response.ids) == [ord(character) for character in TEMPLATED]
    assert [(span.start, span.stop) for span in response.spans] == \
        [(i, i + 1) for i in range(len(TEMPLATED))]


def test_the_chat_prompts_options_arrive_as_the_client_set_them() -> None:
    messages = [sb.ChatMessage(role="user", content="Hi")]
    assert chat_prompt(sb.ChatMessages(messages=messages)) == \
        ChatPrompt([ChatMessage("user", "Hi")])
    assert chat_prompt(sb.ChatMessages(
        messages=messages, template_variables_json='{"enable_thinking": false}',
        add_generation_prompt=False, continue_final_message=True)) == ChatPrompt(
            [ChatMessage("user", "Hi")], {"enable_thinking": False},
            add_generation_prompt=False, continue_final_message=True)


@pytest.mark.parametrize("variables", ["[1]", "{", '"x"'])
def test_template_variables_that_are_not_a_json_object_are_refused(variables: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        chat_prompt(sb.ChatMessages(messages=[sb.ChatMessage(role="user", content="Hi")],
                                    template_variables_json=variables))
    assert refused.value.field == "chat_template_kwargs"
