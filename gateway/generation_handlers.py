"""Routes of TGI, vLLM's demo server, OpenAI and MindIE's native API, over switchboard.v1
Generation (and KServe v2 for the model's name and limits)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import time
from collections.abc import AsyncIterator, Iterable
from typing import TypeVar

import grpc

from switchboard.gateway.errors import RequestError
from switchboard.gateway.handler import METADATA_TIMEOUT_S, Handler
from switchboard.gateway.protocols import (mindie, openai, openai_responses, openai_tools,
                                           sagemaker, tgi, vllm)
from switchboard.gateway.protocols.generation import Generation
from switchboard.gateway.protocols.kserve import parse_json
from switchboard.gateway.sse import DONE_EVENT, sse_event
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import switchboard_pb2 as sb

# The options of an OpenAI route (chat and completions', or the Responses API's).
OptionsT = TypeVar("OptionsT", openai.OpenAIOptions, openai_responses.ResponsesOptions)


class GenerationHandler(Handler):
    """Calls Generate; errors name fields in the protocol's terms (`names`: the protocol's
    names → MindIE's)."""

    def generate(self, request: sb.GenerateRequest, deadline_s: float
                 ) -> grpc.aio.UnaryStreamCall:
        return self.track(self.upstream.generation.Generate(request, timeout=deadline_s))

    async def server_version(self) -> str:
        """The version the model server reports (KServe's server metadata)."""
        metadata = await self.track(self.upstream.inference.ServerMetadata(
            pb.ServerMetadataRequest(), timeout=METADATA_TIMEOUT_S))
        return metadata.version

    async def tokenize(self, request: sb.TokenizeRequest) -> sb.TokenizeResponse:
        return await self.track(self.upstream.generation.Tokenize(
            request, timeout=METADATA_TIMEOUT_S))


def openai_error_document(handler: GenerationHandler, error: BaseException | None,
                          status: int) -> tuple[int, object]:
    """OpenAI's status and error body; a model the server does not serve is named as vLLM's
    `param` names it."""
    status, message, field = GenerationHandler.describe_error(handler, error, status)
    if isinstance(error, grpc.aio.AioRpcError) and error.code() is grpc.StatusCode.NOT_FOUND:
        field = "model"
    return status, openai.error_body(status, message, field)


class TgiHandler(GenerationHandler):
    """TGI's routes: errors `{"error", "error_type"}`, validation failures 422."""

    status_table = tgi.HTTP_STATUS
    names = tgi.NAMES
    stream: bool | None = False  # None: the body's `stream` decides (POST /)
    compat = False  # POST / answers a one-element array

    def describe_error(self, error: BaseException | None, status: int
                       ) -> tuple[int, str, str | None]:
        status, message, field = super().describe_error(error, status)
        return (422 if status == 400 else status), message, field

    def error_body(self, status: int, message: str) -> object:
        return tgi.error_body(status, message)

    async def health(self) -> None:
        """TGI's and vLLM's probe: 200 with an empty body when the model is ready, else 503."""
        if not await self.is_server_ready():
            raise RequestError(503, "unhealthy")
        self.finish_empty()

    async def generate_tgi(self, document: object) -> None:
        request, options = tgi.generate_request_to_pb(document, self.stream)
        self.names = options.names
        generation = Generation()
        call = self.generate(request, options.deadline_s)
        if options.stream:
            def render(response: sb.GenerateResponse) -> Iterable[bytes]:
                generation.add(response)
                return [sse_event(tgi.stream_event(response, generation, options))]

            await self.relay(call, render)
            return
        async for response in call:
            generation.add(response)
        reply = tgi.reply(generation, options)
        self.write_json([reply] if self.compat else reply)


class TgiGenerateHandler(TgiHandler):
    runs_inference = True

    async def post(self) -> None:
        await self.generate_tgi(parse_json(self.body))


class TgiStreamHandler(TgiGenerateHandler):
    stream = True


class TgiCompatHandler(TgiGenerateHandler):
    """POST /: TGI's compat route; GET /: its health probe."""

    stream = None
    compat = True

    async def get(self) -> None:
        await self.health()


class SharedGenerateHandler(TgiHandler):
    """POST /generate: TGI's (`inputs`) or vLLM's demo server's (`prompt`) by the body."""

    runs_inference = True

    async def post(self) -> None:
        document = parse_json(self.body)
        if tgi.is_tgi(document):
            await self.generate_tgi(document)
            return
        self.names = vllm.NAMES
        self.status_table = vllm.HTTP_STATUS
        request, prompt, stream, deadline_s = vllm.generate_request_to_pb(document)
        generation = Generation()
        call = self.generate(request, deadline_s)
        if stream:
            def render(response: sb.GenerateResponse) -> Iterable[bytes]:
                generation.add(response)
                return [vllm.stream_line(generation, prompt)]

            await self.relay(call, render, content_type=vllm.STREAM_CONTENT_TYPE,
                             error_event=vllm.stream_error)
            return
        async for response in call:
            generation.add(response)
        self.write_json(vllm.texts(generation, prompt))


class InfoHandler(TgiHandler):
    async def get(self) -> None:
        name, parameters = await self.served_model_parameters()
        self.write_json(tgi.info_json(name, parameters, await self.server_version()))


class TokenizeHandler(TgiHandler):
    """POST /tokenize: TGI's (`inputs`) or vLLM's (`prompt` or `messages`) by the body, and so
    are its errors: vLLM's are its OpenAI server's (400, `{"error": {"message", "type",
    "param", "code"}}`), as on its /detokenize."""

    runs_inference = True
    speaks_vllm = False

    async def post(self) -> None:
        document = parse_json(self.body)
        if tgi.is_tgi(document):
            request = tgi.tokenize_request_to_pb(document)
            self.write_json(tgi.tokenize_reply(await self.tokenize(request), request.text))
            return
        self.speaks_vllm = True
        self.status_table, self.names = openai.HTTP_STATUS, {}
        request, token_strs = vllm.tokenize_request_to_pb(document)
        self.write_json(vllm.tokenize_reply(await self.tokenize(request), token_strs))

    def error_document(self, error: BaseException | None, status: int) -> tuple[int, object]:
        if not self.speaks_vllm:
            return super().error_document(error, status)
        return openai_error_document(self, error, status)


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
    """OpenAI's routes: errors `{"error": {"message", "type", "param", "code"}}`."""

    status_table = openai.HTTP_STATUS

    def error_document(self, error: BaseException | None, status: int) -> tuple[int, object]:
        return openai_error_document(self, error, status)

    async def with_model_named(self, options: OptionsT) -> OptionsT:
        """`options` with the served model's name where the request named none."""
        if options.model:
            return options
        return dataclasses.replace(options, model=(await self.model_names() or [""])[0])


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


class CompletionsHandler(OpenAIHandler):
    """/v1/chat/completions and /v1/completions (`chat` chooses)."""

    runs_inference = True

    chat = False

    async def post(self) -> None:
        document = parse_json(self.body)
        calls, options = (openai.chat_request_to_pb(document) if self.chat
                          else openai.completion_request_to_pb(document))
        self.names = options.names
        options = await self.with_model_named(options)
        generations = [Generation() for _ in calls]
        streams = [self.generate(call.request, options.deadline_s) for call in calls]
        if not options.stream:
            async for call_index, response in _merged(streams):
                generations[call_index].add(response)
            self.write_json(openai.reply(calls, generations, options))
            return
        sent_chars: dict[int, int] = {}  # per choice: the length of its text streamed so far

        def render(item: tuple[int, sb.GenerateResponse]) -> Iterable[bytes]:
            call_index, response = item
            generations[call_index].add(response)
            index = openai.choice_index(options, call_index, response.index)
            usage = openai.usage(generations) if options.continuous_usage else None
            chunks = []
            text, tokens = ("", []) if options.echo_only else (response.text,
                                                                list(response.tokens))
            prefix, prompt = "", []
            if index not in sent_chars:
                sent_chars[index] = 0
                if options.echo:
                    prefix = openai.echo_text(calls[call_index], generations[call_index])
                    prompt = generations[call_index].prompt
                if self.chat:
                    role_usage = openai.usage(generations, pending=response.generated_tokens) \
                        if options.continuous_usage else None
                    chunks.append(sse_event(openai.chunk(options, index, role=True,
                                                         usage=role_usage)))
            # Where the chunk's first token's text starts in the choice's text.
            offset = sent_chars[index] + (0 if prompt else len(prefix))
            sent_chars[index] += len(prefix) + len(text)
            sequence = generations[call_index].sequences[response.index]
            chunks.append(sse_event(openai.chunk(
                options, index, delta_text=prefix + text, tokens=tokens, prompt=prompt,
                text_offset=offset, usage=usage,
                finish_reason="length" if options.echo_only and response.finish_reason
                else openai_tools.finish_reason(sequence, response.finish_reason),
                delta_fields=openai_tools.delta_fields(response))))
            return chunks

        def end() -> bytes:
            usage = sse_event(openai.usage_chunk(generations, options)) \
                if options.include_usage else b""
            return usage + DONE_EVENT

        await self.relay(_merged(streams), render, end=end,
                         error_event=lambda body: sse_event(body) + DONE_EVENT)


class ChatCompletionsHandler(CompletionsHandler):
    chat = True


class StoredResponseHandler(OpenAIHandler):
    """OpenAI's retrieve and delete of a stored response (and its cancel, below): none is
    stored here, so each is not found, as vLLM answers without its store."""

    async def _not_found(self, response_id: str) -> None:
        raise RequestError(404, f"Response with id {response_id!r} not found: responses are "
                           "not stored here", "response_id")

    get = delete = _not_found


class CancelResponseHandler(OpenAIHandler):
    post = StoredResponseHandler._not_found


class ResponsesHandler(OpenAIHandler):
    """OpenAI's /v1/responses."""

    runs_inference = True

    async def post(self) -> None:
        request, options = openai_responses.request_to_pb(parse_json(self.body))
        self.names = options.names
        options = await self.with_model_named(options)
        generation = Generation()
        call = self.generate(request, options.deadline_s)
        if not options.stream:
            async for response in call:
                generation.add(response)
            self.write_json(openai_responses.reply(options, generation))
            return
        events = openai_responses.ResponseEvents(options)

        def render(response: sb.GenerateResponse) -> Iterable[bytes]:
            generation.add(response)
            return events.add(response)

        await self.relay(call, render, end=lambda: events.finish(generation),
                         error_event=events.error)


# The handler of the route serving each API's body on /invocations (protocols/sagemaker.py).
INVOCATION_HANDLERS: dict[str, type[GenerationHandler]] = {
    "inputs": TgiCompatHandler, "messages": ChatCompletionsHandler, "prompt": CompletionsHandler}


class InvocationsHandler(OpenAIHandler):
    """SageMaker's POST /invocations: served by the handler of the route its body is for, with
    that route's reply and errors. A body for none gets OpenAI's 400, as vLLM answers it; so
    do the refusals that come before the body is read (413, and 503 while stopping)."""

    runs_inference = True

    async def post(self) -> None:
        # The request becomes one of that route's: handlers differ in their methods only (their
        # state is Handler's), and that route's, like this one, runs inference.
        self.__class__ = INVOCATION_HANDLERS[sagemaker.api_field(parse_json(self.body))]
        await self.post()


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


class MindIEHandler(GenerationHandler):
    """MindIE's native routes: errors `{"error", "error_type"}`; a field refused by the
    gateway or the server is 422 (Input Validation Error), malformed JSON 400."""

    runs_inference = True

    status_table = mindie.HTTP_STATUS
    tokens = False  # /infer_token: token ids in and out

    def describe_error(self, error: BaseException | None, status: int
                       ) -> tuple[int, str, str | None]:
        status, message, field = super().describe_error(error, status)
        return (422 if status == 400 and field else status), message, field

    def error_body(self, status: int, message: str) -> object:
        return mindie.error_body(status, message)

    async def post(self) -> None:
        self.names = mindie.TOKEN_NAMES if self.tokens else mindie.NAMES
        request, stream, details, deadline_s = mindie.infer_request_to_pb(
            parse_json(self.body), self.tokens)
        generation = Generation()
        call = self.generate(request, deadline_s)
        if stream:
            def render(response: sb.GenerateResponse) -> Iterable[bytes]:
                generation.add(response)
                return [sse_event(mindie.stream_event(response, generation, details,
                                                      self.tokens))]

            await self.relay(call, render)
            return
        async for response in call:
            generation.add(response)
        self.write_json(mindie.reply(generation, details, self.tokens))


class MindIETokenHandler(MindIEHandler):
    tokens = True


class TokenizerHandler(MindIEHandler):
    async def post(self) -> None:
        request, decode = mindie.tokenize_request_to_pb(parse_json(self.body))
        self.write_json(mindie.tokenize_reply(await self.tokenize(request), decode))
