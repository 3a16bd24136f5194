"""`switchboard.v1.Generation`: text generation with chat messages, n sequences and
log-probabilities, which KServe v2's tensors have no place for."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import AsyncIterator, Sequence

import grpc

from switchboard.engine.chat import ChatMessage, ChatPrompt, ToolCall
from switchboard.engine.chat_output import (ChatOutputParser, ChatOutputPlan, ToolChoice,
                                            plan_chat_output, tool_from_json)
from switchboard.engine.errors import EngineError, InvalidRequest
from switchboard.engine.params import GenerationRequest
from switchboard.engine.protocol import EngineClient
from switchboard.engine.request import RequestOutput, TokenLogprob
from switchboard.engine.validation import PATTERN_PARAMS, build_request, check_vocabulary
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc
from switchboard.proto.generation_fields import requested_values
from switchboard.server import codec
from switchboard.server.errors import refusal
from switchboard.server.json_text import decode_json
from switchboard.server.kv_transfer import KVHandoff
from switchboard.server.model_info import parameter_limits_pb
from switchboard.server.served_model import ServedModel
from switchboard.server.servicer import InferenceServicer, engine_errors

logger = logging.getLogger(__name__)

TOOL_CHOICE_MODES = {sb.TOOL_CHOICE_NONE: "none", sb.TOOL_CHOICE_AUTO: "auto",
                     sb.TOOL_CHOICE_REQUIRED: "required", sb.TOOL_CHOICE_NAMED: "named"}


class GenerationServicer(sb_grpc.GenerationServicer):
    def __init__(self, served: ServedModel, inference: InferenceServicer,
                 handoff: KVHandoff) -> None:
        self.served = served
        self.inference = inference
        self.handoff = handoff

    async def InferStream(self, request: pb.ModelInferRequest, context: grpc.aio.ServicerContext
                          ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        async with contextlib.aclosing(self.inference.stream(_one(request), context,
                                                             status_errors=True)) as responses:
            async for response in responses:
                yield response

    async def Generate(self, request: sb.GenerateRequest, context: grpc.aio.ServicerContext
                       ) -> AsyncIterator[sb.GenerateResponse]:
        try:
            engine = self.served.named_engine(request.model_name)
            codec.check_client_id(request.id)
            values = requested_values(request)
            prompt_token_ids, plan = await _prompt(engine, request, values)
            spec = build_request(uuid.uuid4().hex, prompt_token_ids, values, engine.limits)
            spec, prefilled = await self.handoff.prepared(
                spec, request.kv_transfer_params if request.HasField("kv_transfer_params")
                else None, engine)
            logger.info("request %s (client id %r): %d prompt tokens, generation%s",
                        spec.request_id, request.id, len(spec.prompt_token_ids),
                        "" if prefilled is None else
                        f", {len(prefilled.token_ids)} prefilled elsewhere")
            tokens = TokenDescriber(engine)
            outputs: dict[int, ChatOutputParser] = {}
            async with contextlib.aclosing(self.served.generate(spec, request.id,
                                                                prefilled)) as events:
                del prefilled  # the engine's cache holds it from now on
                async for event in events:
                    response = generate_response(event, spec, tokens)
                    if event.kv_transfer_id:
                        response.kv_transfer_params.CopyFrom(
                            self.handoff.prefilled_here(event.kv_transfer_id))
                    if plan.make_parser is not None:
                        parse_output(response, outputs.setdefault(event.index,
                                                                  plan.make_parser()))
                    yield response
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

    @engine_errors
    async def GetParameterLimits(self, request: sb.GetParameterLimitsRequest,
                                 context: grpc.aio.ServicerContext
                                 ) -> sb.GetParameterLimitsResponse:
        return parameter_limits_pb(self.served.named_engine(request.model_name))


def chat_prompt(messages: sb.ChatMessages) -> ChatPrompt:
    variables = {}
    if messages.template_variables_json:
        variables = decode_json("chat_template_kwargs", messages.template_variables_json)
        if not isinstance(variables, dict):
            raise InvalidRequest("chat_template_kwargs", "must be an object of template "
                                 f"variables; got {type(variables).__name__}")
    return ChatPrompt(
        messages=[ChatMessage(role=m.role, content=m.content, tool_call_id=m.tool_call_id,
                              tool_calls=tuple(ToolCall(call.id, call.name, call.arguments)
                                               for call in m.tool_calls))
                  for m in messages.messages],
        tools=tuple(tool_from_json(index, tool.name, tool.description, tool.parameters_json)
                    for index, tool in enumerate(messages.tools)),
        template_variables=variables,
        add_generation_prompt=(messages.add_generation_prompt
                               if messages.HasField("add_generation_prompt") else True),
        continue_final_message=messages.continue_final_message)


def tool_choice(messages: sb.ChatMessages) -> ToolChoice:
    return ToolChoice(mode=TOOL_CHOICE_MODES.get(messages.tool_choice, ""),
                      name=messages.tool_choice_name,
                      parallel=(messages.parallel_tool_calls
                                if messages.HasField("parallel_tool_calls") else True))


def constrain_to_tool_calls(values: dict[str, object], plan: ChatOutputPlan) -> None:
    """A required or named tool choice's schema as the request's output pattern."""
    if plan.schema is None:
        return
    given = [name for name in PATTERN_PARAMS if values.get(name) is not None]
    if given:
        raise InvalidRequest("tool_choice", f"cannot be combined with {given[0]}: a required "
                             "or named tool choice sets the output's format")
    values["guided_json"] = plan.schema


def parse_output(response: sb.GenerateResponse, parser: ChatOutputParser) -> None:
    """The response's text read as content, reasoning and tool calls."""
    was_reasoning = parser.is_reasoning
    parsed = parser.feed(response.text)
    if response.finish_reason:
        parsed += parser.finish()
    response.text = parsed.content
    response.reasoning_text = parsed.reasoning
    response.tool_calls.extend(sb.ToolCallDelta(index=call.index, id=call.id, name=call.name,
                                                arguments=call.arguments)
                               for call in parsed.tool_calls)
    if was_reasoning or parser.is_reasoning:
        response.reasoning_tokens = len(response.tokens)


async def _prompt(engine: EngineClient, request: sb.GenerateRequest,
                  values: dict[str, object]) -> tuple[list[int], ChatOutputPlan]:
    """The prompt's token ids, and how the answer is read: for chat messages as their tool
    choice and the server's parsers say (a required or named choice sets values' output
    pattern), else as content."""
    kind = request.WhichOneof("prompt")
    if kind == "messages":
        prompt = chat_prompt(request.messages)
        plan = plan_chat_output(prompt.tools, tool_choice(request.messages),
                                engine.info.output_parsers, piecewise=request.messages.stream)
        constrain_to_tool_calls(values, plan)
        return await engine.prompts.encode_chat(prompt), plan
    if kind == "text":
        return await engine.prompts.encode(request.text), ChatOutputPlan()
    if kind == "token_ids":
        return list(request.token_ids.ids), ChatOutputPlan()
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


async def _one(request: pb.ModelInferRequest) -> AsyncIterator[pb.ModelInferRequest]:
    yield request
