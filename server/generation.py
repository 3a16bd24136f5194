"""`switchboard.v1.Generation`: text generation with chat messages, n sequences and
log-probabilities, which KServe v2's tensors have no place for."""

from __future__ import annotations

import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Sequence

import grpc

from switchboard.engine.chat import ChatMessage, ChatPrompt
from switchboard.engine.errors import EngineError, InvalidRequest
from switchboard.engine.params import GenerationRequest
from switchboard.engine.protocol import EngineClient
from switchboard.engine.request import RequestOutput, TokenLogprob
from switchboard.engine.validation import INT_RANGES, MINDIE_SEED_RANGE, build_request, check_vocabulary
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc
from switchboard.server import codec
from switchboard.server.errors import refusal
from switchboard.server.served_model import ServedModel
from switchboard.server.servicer import engine_errors

logger = logging.getLogger(__name__)


class GenerationServicer(sb_grpc.GenerationServicer):
    def __init__(self, served: ServedModel) -> None:
        self.served = served

    async def Generate(self, request: sb.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[sb.GenerateResponse]:
        try:
            engine = self.served.named_engine(request.model_name)
            codec.check_client_id(request.id)
            spec = build_request(uuid.uuid4().hex, await _prompt_token_ids(engine, request),
                                 codec.parameter_values(request.parameters), engine.limits,
                                 seed_range=MINDIE_SEED_RANGE if request.mindie_ranges
                                 else INT_RANGES["seed"])
            logger.info("request %s (client id %r): %d prompt tokens, generation", spec.request_id,
                        request.id, len(spec.prompt_token_ids))
            tokens = TokenDescriber(engine)
            async with contextlib.aclosing(self.served.generate(spec, request.id)) as events:
                async for event in events:
                    yield generate_response(event, spec, tokens)
        except EngineError as error:
            await context.abort(*refusal(error))

    @engine_errors
    async def Tokenize(self, request: sb.TokenizeRequest, context: grpc.aio.ServicerContext
                       ) -> sb.TokenizeResponse:
        engine = self.served.named_engine(request.model_name)
        response = sb.TokenizeResponse(max_sequence_length=engine.limits.max_seq_len)
        if request.WhichOneof("prompt") == "messages":
            response.templated_text = await engine.prompts.render_chat(
                chat_prompt(request.messages))
            tokens = await engine.prompts.tokenize(response.templated_text,
                                                   add_special_tokens=False)
        else:
            tokens = await engine.prompts.tokenize(
                request.text, request.add_special_tokens
                if request.HasField("add_special_tokens") else True)
        response.ids.extend(tokens.ids)
        response.spans.extend(sb.TextSpan(start=start, stop=stop) for start, stop in tokens.spans)
        response.texts.extend(tokens.texts)
        response.vocabulary_strings.extend(tokens.vocabulary_strings)
        return response

    @engine_errors
    async def Detokenize(self, request: sb.DetokenizeRequest, context: grpc.aio.ServicerContext
                         ) -> sb.DetokenizeResponse:
        engine = self.served.named_engine(request.model_name)
        check_vocabulary("token_ids", request.token_ids, engine.limits)
        return sb.DetokenizeResponse(text=engine.decode(request.token_ids,
                                                        skip_special_tokens=False))


def chat_prompt(messages: sb.ChatMessages) -> ChatPrompt:
    variables = {}
    if messages.template_variables_json:
        try:
            variables = json.loads(messages.template_variables_json)
        except json.JSONDecodeError as error:
            raise InvalidRequest("chat_template_kwargs", f"is not JSON: {error}") from None
        if not isinstance(variables, dict):
            raise InvalidRequest("chat_template_kwargs", "must be an object of template "
                                 f"variables; got {type(variables).__name__}")
    return ChatPrompt(
        messages=[ChatMessage(role=m.role, content=m.content) for m in messages.messages],
        template_variables=variables,
        add_generation_prompt=(messages.add_generation_prompt
                               if messages.HasField("add_generation_prompt") else True),
        continue_final_message=messages.continue_final_message)


async def _prompt_token_ids(engine: EngineClient, request: sb.GenerateRequest) -> list[int]:
    kind = request.WhichOneof("prompt")
    if kind == "text":
        return await engine.prompts.encode(request.text)
    if kind == "token_ids":
        return list(request.token_ids.ids)
    if kind == "messages":
        return await engine.prompts.encode_chat(chat_prompt(request.messages))
    raise InvalidRequest("prompt", "is missing: send text, token_ids or messages")


class TokenDescriber:
    """Token messages: each token's own text and whether it is special."""

    def __init__(self, engine: EngineClient) -> None:
        self._engine = engine
        self._special = engine.info.special_token_ids

    def tokens(self, token_ids: Sequence[int], logprobs: Sequence[TokenLogprob | None]
               ) -> list[sb.Token]:
        """Token messages for ids and their log-probabilities (None: not computed)."""
        alternatives = [() if logprob is None else logprob.top for logprob in logprobs]
        all_ids = [*token_ids, *(token_id for top in alternatives for token_id, _ in top)]
        texts = iter(self._engine.token_texts(all_ids))
        tokens = [self._token(token_id, next(texts), None if logprob is None else logprob.logprob)
                  for token_id, logprob in zip(token_ids, logprobs)]
        for token, top in zip(tokens, alternatives):
            token.top.extend(self._token(token_id, next(texts), logprob) for token_id, logprob in top)
        return tokens

    def _token(self, token_id: int, text: str, logprob: float | None) -> sb.Token:
        token = sb.Token(id=token_id, text=text, special=token_id in self._special)
        if logprob is not None:
            token.logprob = logprob
        return token


def generate_response(event: RequestOutput, spec: GenerationRequest,
                      tokens: TokenDescriber) -> sb.GenerateResponse:
    logprobs: Sequence[TokenLogprob | None] = event.logprobs or [None] * len(event.new_token_ids)
    response = sb.GenerateResponse(
        index=event.index,
        tokens=tokens.tokens(event.new_token_ids, logprobs),
        text=event.text,
        decoded_text=event.decoded_text,
        finish_reason=event.finish_reason.value if event.finish_reason else "",
        prompt_tokens=event.num_prompt_tokens,
        generated_tokens=event.num_generated_tokens,
        seed=event.seed,
        cached_tokens=event.num_cached_tokens,
        sampled=spec.sampling.do_sample,
    )
    if event.prompt_logprobs:
        response.prompt.extend(tokens.tokens(spec.prompt_token_ids, event.prompt_logprobs))
    if event.timings is not None:
        response.queue_wait_us = round(event.timings.queue_wait * codec.MICROSECONDS)
        response.first_token_us = round(event.timings.first_token * codec.MICROSECONDS)
        response.token_latency_us = round(event.timings.token_latency * codec.MICROSECONDS)
    return response
