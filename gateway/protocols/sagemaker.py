"""SageMaker's POST /invocations, as TGI and vLLM serve it: one route for whichever API the body
is for, told by the field that only that API's body has.

TGI (router/src/sagemaker.rs) reads the body as its compat generate request (`inputs`), else
as a chat request (`messages`), else as a completion request (`prompt`); vLLM (`invocations`
in entrypoints/openai/api_server.py) as a chat request, else as a completion request, and
answers 400 naming the requests it expected. Here a body with `inputs` is TGI's and served as
POST / is, else one with `messages` as /v1/chat/completions, else one with `prompt` as
/v1/completions: each is then checked, answered (streamed with `stream: true`) and refused as
on that route.
"""

from __future__ import annotations

from switchboard.gateway.errors import RequestError
from switchboard.gateway.protocols import openai, tgi
from switchboard.gateway.protocols.exchange import GenerationProtocol

# The protocol of each API's body, by the field telling it, in the order TGI tries them.
API_PROTOCOLS: dict[str, GenerationProtocol] = {
    "inputs": tgi.COMPAT, "messages": openai.CHAT, "prompt": openai.COMPLETIONS}
API_FIELDS = tuple(API_PROTOCOLS)


def api_field(document: object) -> str:
    """The first of API_FIELDS that `document` has."""
    if isinstance(document, dict):
        for field in API_FIELDS:
            if field in document:
                return field
    raise RequestError(400, "the body must be a JSON object with `inputs` (TGI's generate "
                       "request), `messages` (a chat completion request) or `prompt` (a "
                       "completion request)")


class Invocations(openai.OpenAIProtocol):
    """A body for none of the APIs gets OpenAI's 400, as vLLM answers it; so do the refusals
    that come before the body is read (413, and 503 while stopping)."""

    def speaking(self, document: object) -> GenerationProtocol:
        return API_PROTOCOLS[api_field(document)]


INVOCATIONS = Invocations()
