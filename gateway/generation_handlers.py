"""Routes of TGI, vLLM's demo server, OpenAI and MindIE's native API, over switchboard.v1
Generation (and KServe v2 for the model's name and limits)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

import grpc

from switchboard.gateway import dmi
from switchboard.gateway.errors import RequestError
from switchboard.gateway.handler import METADATA_TIMEOUT_S, Handler, Services
from switchboard.gateway.handoff import HandedOff
from switchboard.gateway.protocols import mindie, openai, openai_responses, sagemaker, tgi, vllm
from switchboard.gateway.protocols.exchange import (Exchange, GenerationProtocol, Protocol,
                                                   TokenizeProtocol)
from switchboard.gateway.protocols.kserve import parse_json
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import switchboard_pb2 as sb


class GenerationHandler(Handler):
    """Calls Generate; errors name fields in the protocol's terms (`names`: the protocol's
    names → MindIE's)."""

    def generate(self, request: sb.GenerateRequest, deadline_s: float
                 ) -> grpc.aio.UnaryStreamCall | HandedOff:
        prefill = self.services.prefill
        if prefill is not None and HandedOff.applies_to(request):
            return HandedOff(request, deadline_s, prefill, self.upstream, self.track)
        return self.track(self.upstream.generation.Generate(request, timeout=deadline_s))

    async def server_version(self) -> str:
        """The version the model server reports (KServe's server metadata)."""
        metadata = await self.track(self.upstream.inference.ServerMetadata(
            pb.ServerMetadataRequest(), timeout=METADATA_TIMEOUT_S))
        return metadata.version

    async def tokenize(self, request: sb.TokenizeRequest) -> sb.TokenizeResponse:
        return await self.track(self.upstream.generation.Tokenize(
            request, timeout=METADATA_TIMEOUT_S))

    async def served_model_name(self) -> str:
        return (await self.model_names() or [""])[0]

    async def health(self) -> None:
        """TGI's and vLLM's probe: 200 with an empty body when the model is ready, else 503."""
        if not await self.is_server_ready():
            raise RequestError(503, "unhealthy")
        self.finish_empty()


class ProtocolRoute(GenerationHandler):
    """A route of a protocol (`protocol`, or the one its body speaks: `speaker`), whose
    errors come in that protocol's shape."""

    runs_inference = True
    protocol: Protocol

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "protocol" in vars(cls):
            cls.status_table = cls.protocol.status_table

    def initialize(self, services: Services, route: str) -> None:
        super().initialize(services, route)
        self.speaker = self.protocol

    def error_document(self, error: BaseException | None, status: int) -> tuple[int, object]:
        status, message, field = self.describe_error(error, status)
        return self.speaker.error_document(status, message, field, error)


class GenerationRoute(ProtocolRoute):
    """Every generation route: its protocol translates the body into calls of Generate, whose
    responses its answer renders, whole or streamed."""

    protocol: GenerationProtocol

    def initialize(self, services: Services, route: str) -> None:
        super().initialize(services, route)
        self.exchange: Exchange | None = None

    def error_terms(self) -> tuple[Mapping[grpc.StatusCode, int], Mapping[str, str]]:
        return (self.speaker.status_table,
                {} if self.exchange is None else self.exchange.names)

    async def post(self) -> None:
        document = parse_json(self.body)
        self.speaker = self.protocol.speaking(document)
        target = dmi.prefill_target(self)
        self.exchange = exchange = await self.speaker.exchange(document, self.served_model_name)
        if dmi.is_leg(self.request.headers):
            await dmi.answer(self, dmi.generation_leg(
                exchange, await self.call_deadline_s(exchange.requests[0]), self.upstream), target)
            return
        answer = exchange.answer
        responses = _merged([self.generate(request, await self.call_deadline_s(request))
                             for request in exchange.requests])
        if not exchange.stream:
            async for call, response in responses:
                answer.collect(call, response)
            self.write_json(answer.reply())
            return
        await self.relay(responses, lambda item: answer.events(*item),
                         content_type=answer.content_type, end=answer.end,
                         error_event=answer.error_event)


class TgiHandler(GenerationHandler):
    """TGI's other routes: errors `{"error", "error_type"}`, validation failures 422."""

    status_table = tgi.HTTP_STATUS
    names = tgi.NAMES

    def error_document(self, error: BaseException | None, status: int) -> tuple[int, object]:
        return tgi.error_document(*self.describe_error(error, status)[:2])


class TgiGenerateHandler(GenerationRoute):
    protocol = tgi.GENERATE


class TgiStreamHandler(GenerationRoute):
    protocol = tgi.GENERATE_STREAM


class TgiCompatHandler(GenerationRoute):
    """POST /: TGI's compat route; GET /: its health probe."""

    protocol = tgi.COMPAT

    async def get(self) -> None:
        await self.health()


class SharedGenerateHandler(GenerationRoute):
    """POST /generate: TGI's (`inputs`) or vLLM's demo server's (`prompt`) by the body."""

    protocol = vllm.TGI_OR_VLLM_GENERATE


class InfoHandler(TgiHandler):
    async def get(self) -> None:
        name, parameters = await self.served_model_parameters()
        self.write_json(tgi.info_json(name, parameters, await self.server_version()))


class TokenizeHandler(ProtocolRoute):
    """POST /tokenize: TGI's (`inputs`) or vLLM's (`prompt` or `messages`) by the body, and so
    are its errors."""

    protocol = vllm.TGI_OR_VLLM_TOKENIZE
    speaker: TokenizeProtocol

    def error_terms(self) -> tuple[Mapping[grpc.StatusCode, int], Mapping[str, str]]:
        return self.speaker.status_table, self.speaker.names

    async def post(self) -> None:
        document = parse_json(self.body)
        self.speaker = self.protocol.speaking(document)
        self.write_json(await self.speaker.answer(document, self.tokenize))


class ChatTokenizeHandler(TgiHandler):
    """TGI's POST /chat_tokenize."""

    runs_inference = True

    async def post(self) -> None:
        response = await self.tokenize(tgi.chat_tokenize_request_to_pb(parse_json(self.body)))
        self.write_json(tgi.chat_tokenize_reply(response))


class HealthHandler(TgiHandler):
    async def get(self) -> None:
        await self.health()


class PingHandler(HealthHandler):
    """SageMaker's /ping, /health's answer: TGI serves GET, vLLM POST too."""

    post = HealthHandler.get


class OpenAIHandler(GenerationHandler):
    """OpenAI's other routes: errors `{"error": {"message", "type", "param", "code"}}`."""

    status_table = openai.HTTP_STATUS

    def error_document(self, error: BaseException | None, status: int) -> tuple[int, object]:
        return openai.error_document(*self.describe_error(error, status), error)


class ModelsHandler(OpenAIHandler):
    async def get(self, model: str | None = None) -> None:
        names = await self.model_names()
        created = int(time.time())
        if model is not None and model not in names:
            raise RequestError(404, f"the model {model!r} does not exist", "model")
        _, parameters = await self.served_model_parameters()
        max_model_len = int(parameters["max_seq_len"]) if "max_seq_len" in parameters else None
        if model is None:
            self.write_json(openai.models_json(names, created, max_model_len))
        else:
            self.write_json(openai.model_json(model, created, max_model_len))


class DetokenizeHandler(OpenAIHandler):
    """vLLM's POST /detokenize (its errors are its OpenAI server's)."""

    names = vllm.DETOKENIZE_NAMES

    async def post(self) -> None:
        response = await self.track(self.upstream.generation.Detokenize(
            vllm.detokenize_request_to_pb(parse_json(self.body)), timeout=METADATA_TIMEOUT_S))
        self.write_json({"prompt": response.text})


class VersionHandler(OpenAIHandler):
    """vLLM's GET /version."""

    async def get(self) -> None:
        self.write_json(vllm.version_json(await self.server_version()))


class CompletionsHandler(GenerationRoute):
    protocol = openai.COMPLETIONS


class ChatCompletionsHandler(GenerationRoute):
    protocol = openai.CHAT


class StoredResponseHandler(OpenAIHandler):
    """OpenAI's retrieve and delete of a stored response (and its cancel, below): none is
    stored here, so each is not found, as vLLM answers without its store."""

    async def _not_found(self, response_id: str) -> None:
        raise RequestError(404, f"Response with id {response_id!r} not found: responses are "
                           "not stored here", "response_id")

    get = delete = _not_found


class CancelResponseHandler(OpenAIHandler):
    post = StoredResponseHandler._not_found


class ResponsesHandler(GenerationRoute):
    protocol = openai_responses.RESPONSES


class InvocationsHandler(GenerationRoute):
    """SageMaker's POST /invocations: served as the route its body is for (sagemaker.py)."""

    protocol = sagemaker.INVOCATIONS


async def _merged(calls: list[grpc.aio.UnaryStreamCall]
                  ) -> AsyncIterator[tuple[int, sb.GenerateResponse]]:
    """The responses of several calls as they come, each with its call's index."""
    if len(calls) == 1:
        async for response in calls[0]:
            yield 0, response
        return
    inbox: asyncio.Queue[tuple[int, sb.GenerateResponse | BaseException | None]] = asyncio.Queue()

    async def pump(index: int, call: grpc.aio.UnaryStreamCall) -> None:
        try:
            async for response in call:
                inbox.put_nowait((index, response))
        except BaseException as error:
            inbox.put_nowait((index, error))
        else:
            inbox.put_nowait((index, None))

    tasks = [asyncio.create_task(pump(index, call)) for index, call in enumerate(calls)]
    try:
        remaining = len(calls)
        while remaining:
            index, item = await inbox.get()
            if isinstance(item, BaseException):
                raise item
            if item is None:
                remaining -= 1
            else:
                yield index, item
    finally:
        for task, call in zip(tasks, calls):
            task.cancel()
            call.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.gather(*tasks, return_exceptions=True)


class MindIEHandler(GenerationRoute):
    protocol = mindie.INFER


class MindIETokenHandler(GenerationRoute):
    protocol = mindie.INFER_TOKEN


class TokenizerHandler(GenerationHandler):
    """MindIE's /v1/tokenizer: its errors are MindIE's."""

    runs_inference = True
    status_table = mindie.HTTP_STATUS

    def error_document(self, error: BaseException | None, status: int) -> tuple[int, object]:
        return mindie.error_document(*self.describe_error(error, status))

    async def post(self) -> None:
        request, decode = mindie.tokenize_request_to_pb(parse_json(self.body))
        self.write_json(mindie.tokenize_reply(await self.tokenize(request), decode))
