"""MindIE's prefill/decode requests ("DMI"), between the gateways of a pair.

The coordinator sends an inference request to a prefill instance with the headers `req-type:
prefill`, `req-id` (hex) and `d-target: ip[;port]`. That instance's gateway translates the body
as usual, has its server prefill the prompt and keep the KV cache (vLLM's do_remote_decode),
and hands the request on to the decode instance's gateway at `d-target` (its business port;
this gateway's own when none is given): the same route and body, with the prefill's
kv_transfer_params in the DECODE_HEADER header. It answers the coordinator with MindIE's
`{"reqId", "isStream"}` (and, streamed, `"isLastResp": false, "output": ""`: the decode
instance sends every token, the first too). The decode instance's gateway, which takes the
hand-off from another gateway only, generates from that KV cache and publishes the protocol's
answer, chunk by chunk, on its /dresult stream under the request's id. With `is-recompute:
true` (MindIE's re-dispatch after a failure) nothing is prefilled here: the request is handed
over with no KV cache, and the decode instance computes the prompt itself.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass

import grpc
from google.protobuf import json_format
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from switchboard.gateway.dresult import DResults, Record
from switchboard.gateway.errors import RequestError, client_message
from switchboard.gateway.handler import Handler
from switchboard.gateway.protocols import kserve, triton
from switchboard.gateway.protocols.exchange import Exchange
from switchboard.gateway.protocols.openai import KV_TRANSFER_FIELD
from switchboard.gateway.roles import Roles
from switchboard.gateway.sse import sse_event
from switchboard.gateway.upstream import Upstream
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import switchboard_pb2 as sb
from switchboard.tls.pki import GATEWAY_IDENTITY

logger = logging.getLogger(__name__)

REQUEST_TYPE_HEADER = "req-type"
REQUEST_ID_HEADER = "req-id"
TARGET_HEADER = "d-target"
RECOMPUTE_HEADER = "is-recompute"
# Switchboard's: the prefill's kv_transfer_params, from a prefill instance's gateway.
DECODE_HEADER = "x-switchboard-kv-transfer"
MAX_REQUEST_ID = 1024
HANDOFF_TIMEOUT_S = 30.0
# kv_transfer_params that name no KV cache: the decode instance computes the prompt.
NO_KV_CACHE = "{}"


def is_prefill(headers: Mapping[str, str]) -> bool:
    return REQUEST_TYPE_HEADER in headers


def is_decode(headers: Mapping[str, str]) -> bool:
    return DECODE_HEADER in headers


@dataclass(frozen=True, slots=True)
class Prefill:
    """A prefill request's id, its decode instance's address, and whether that instance is to
    compute the prompt itself (MindIE's is-recompute: a re-dispatch after a failure)."""

    request_id: str
    target: str
    recompute: bool


def checked_prefill(headers: Mapping[str, str], roles: Roles, own_port: int) -> Prefill:
    """The request's PD headers, refused as MindIE refuses them."""
    if roles.role not in ("prefill", "flex"):
        raise RequestError(400, "DMI inference requests can be sent only to the prefill node "
                           f"(this one is {roles.role!r})")
    missing = [name for name in (REQUEST_TYPE_HEADER, REQUEST_ID_HEADER, TARGET_HEADER)
               if name not in headers]
    if missing:
        raise RequestError(400, "DMI request must have req-type, req-id, d-target headers; "
                           f"missing: {', '.join(missing)}")
    if headers[REQUEST_TYPE_HEADER] != "prefill":
        raise RequestError(400, f"Parameter req-type must be prefill but got "
                           f"{headers[REQUEST_TYPE_HEADER]}")
    request_id = headers[REQUEST_ID_HEADER]
    if len(request_id) > MAX_REQUEST_ID:
        raise RequestError(400, f"The length of req-id cannot exceed {MAX_REQUEST_ID}")
    if not request_id or any(c not in "0123456789abcdefABCDEF" for c in request_id):
        raise RequestError(400, "Invalid req-id, the character of req-id should be hex char "
                           f"[0-9, a-f, A-F], but got {request_id!r}")
    host, _, port = headers[TARGET_HEADER].partition(";")
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        raise RequestError(400, "Parameter d-target must be an IPv4 address") from None
    if port and not (port.isdigit() and 0 < int(port) < 65536):
        raise RequestError(400, f"Parameter d-target's port must be a port number; got {port!r}")
    recompute = headers.get(RECOMPUTE_HEADER, "false")
    if recompute not in ("true", "false"):
        raise RequestError(400, f"Parameter is-recompute must be true or false but got "
                           f"{recompute}")
    return Prefill(request_id, f"{host}:{port or own_port}", recompute == "true")


@dataclass(frozen=True, slots=True)
class Leg:
    """What a route gives a DMI request: whether its answer streams, how to prefill it here
    (returning the kv_transfer_params the prefill kept, as JSON), and how to decode it from
    such parameters: checked at once (RequestError), then the records of its answer, a
    streamed answer's events as data and its last as lastData, or the whole answer as
    lastData."""

    stream: bool
    prefill: Callable[[], Awaitable[str]]
    decode: Callable[[str], AsyncIterator[tuple[Record, bytes]]]


def prefill_target(handler: Handler) -> Prefill | None:
    """A prefill request's PD headers (None: not one), checked before the body is, as MindIE
    checks them."""
    if not is_prefill(handler.request.headers):
        return None
    return checked_prefill(handler.request.headers, handler.services.roles, handler.own_port())


def is_leg(headers: Mapping[str, str]) -> bool:
    return is_prefill(headers) or is_decode(headers)


async def answer(handler: Handler, leg: Leg, target: Prefill | None) -> None:
    """Answer a DMI leg (`is_leg`; `target`: its `prefill_target`)."""
    if target is not None:
        handler.write_json(await _hand_over(leg, target, handler, handler.services.peer_tls()))
        return
    headers = handler.request.headers
    if handler.client_identity() != GATEWAY_IDENTITY:
        raise RequestError(403, "only a prefill instance's gateway hands requests over")
    request_id = headers.get(REQUEST_ID_HEADER, "")
    if not request_id:
        raise RequestError(400, "a handed-off request has a req-id")
    records = leg.decode(headers[DECODE_HEADER])
    handler.services.dresults.run(_publish(request_id, records, handler.services.dresults))
    handler.write_json({"isValidDecodeParameters": True})


async def _hand_over(leg: Leg, target: Prefill, handler: Handler,
                     client_tls: ssl.SSLContext | None) -> dict[str, object]:
    """Prefill here (unless the decode instance is to recompute it: it then gets no KV
    cache), hand the request to the decode instance's gateway (the body as this gateway read
    it, decoded, and KServe's binary-body header where given), and MindIE's answer to the
    coordinator."""
    params = NO_KV_CACHE if target.recompute else await leg.prefill()
    scheme = "http" if client_tls is None else "https"
    headers = {"Content-Type": "application/json", REQUEST_ID_HEADER: target.request_id,
               DECODE_HEADER: params}
    if kserve.HEADER_LENGTH in handler.request.headers:
        headers[kserve.HEADER_LENGTH] = handler.request.headers[kserve.HEADER_LENGTH]
    try:
        await AsyncHTTPClient().fetch(HTTPRequest(
            f"{scheme}://{target.target}{handler.request.path}", method="POST", body=handler.body,
            headers=headers, ssl_options=client_tls, request_timeout=HANDOFF_TIMEOUT_S))
    except (HTTPClientError, OSError, ssl.SSLError) as error:
        raise RequestError(500, f"[P Node] Send D request failed: {error}") from None
    answer: dict[str, object] = {"reqId": target.request_id, "isStream": leg.stream}
    if leg.stream:
        answer.update(isLastResp=False, output="")
    return answer


async def _publish(request_id: str, records: AsyncIterator[tuple[Record, bytes]],
                   dresults: DResults) -> None:
    try:
        async for kind, record in records:
            dresults.publish(request_id, kind, record)
    except grpc.aio.AioRpcError as error:
        dresults.publish(request_id, Record.ERROR,
                         client_message(error.code(), error.details()).encode())
        return
    logger.info("request %s decoded for its coordinator's /dresult", request_id)


def generation_leg(exchange: Exchange, deadline_s: float, upstream: Upstream) -> Leg:
    """A switchboard.v1 Generate route's leg: the prefill keeps its KV cache as vLLM's
    do_remote_decode asks; the decode reads it through its kv_transfer_params."""
    if len(exchange.requests) != 1:
        raise RequestError(400, "a DMI request has one prompt")
    [request] = exchange.requests

    async def prefill() -> str:
        prefill = sb.GenerateRequest()
        prefill.CopyFrom(request)
        prefill.sampling.max_new_tokens = 1
        prefill.sampling.ClearField("min_new_tokens")
        prefill.kv_transfer_params.do_remote_decode = True
        params = ""
        async for response in upstream.generation.Generate(prefill, timeout=deadline_s):
            if response.HasField("kv_transfer_params"):
                params = json_format.MessageToJson(response.kv_transfer_params, indent=None)
        return _handed(params)

    async def records() -> AsyncIterator[tuple[Record, bytes]]:
        answer = exchange.answer
        async for response in upstream.generation.Generate(request, timeout=deadline_s):
            if exchange.stream:
                for chunk in answer.events(0, response):
                    yield Record.DATA, chunk
            else:
                answer.collect(0, response)
        yield Record.LAST_DATA, (answer.end() if exchange.stream else
                                 json.dumps(answer.reply(), ensure_ascii=False).encode())

    def decode(params: str) -> AsyncIterator[tuple[Record, bytes]]:
        try:
            json_format.Parse(params, request.kv_transfer_params)
        except json_format.ParseError as error:
            raise RequestError(400, f"{DECODE_HEADER}: {error}") from None
        return records()

    return Leg(exchange.stream, prefill, decode)


def triton_leg(request: pb.ModelInferRequest, options: triton.GenerateOptions, stream: bool,
               deadline_s: float, upstream: Upstream) -> Leg:
    """Triton's generate routes' leg (MindIE's parameters; not the vLLM backend's inputs,
    which would override the prefill's one token): the same exchange, in KServe's string
    parameter."""
    if options.vllm:
        raise RequestError(400, "a DMI request on Triton's routes takes MindIE's parameters, "
                           "not the vLLM backend interface's inputs")

    async def prefill() -> str:
        params = ""
        async for response in upstream.generation.InferStream(_kserve_prefill(request),
                                                               timeout=deadline_s):
            params = _kept(response.infer_response) or params
        return _handed(params)

    async def records() -> AsyncIterator[tuple[Record, bytes]]:
        replies = triton.reply_stream(options)
        async for response in upstream.generation.InferStream(request, timeout=deadline_s):
            event = replies.add(response.infer_response)
            if stream:
                yield (Record.LAST_DATA if "finish_reason" in response.infer_response.parameters
                       else Record.DATA), sse_event(event)
        if not stream:
            yield Record.LAST_DATA, json.dumps(replies.reply(), ensure_ascii=False).encode()

    return Leg(stream, prefill, _kserve_decode(request, records))


def kserve_leg(request: pb.ModelInferRequest, options: kserve.OutputOptions,
               deadline_s: float, upstream: Upstream) -> Leg:
    """KServe v2's /infer leg (MindIE's Triton token interface): its reply is whole, in JSON
    (binary outputs would break /dresult's NUL-terminated records)."""
    if options.default or any(options.by_name.values()):
        raise RequestError(400, "a DMI request's outputs come as JSON: binary_data must be "
                           "false")

    async def prefill() -> str:
        response = await upstream.inference.ModelInfer(_kserve_prefill(request),
                                                       timeout=deadline_s)
        return _handed(_kept(response))

    async def records() -> AsyncIterator[tuple[Record, bytes]]:
        response = await upstream.inference.ModelInfer(request, timeout=deadline_s)
        yield Record.LAST_DATA, kserve.infer_response_to_http(response, options).body

    return Leg(False, prefill, _kserve_decode(request, records))


def _kserve_prefill(request: pb.ModelInferRequest) -> pb.ModelInferRequest:
    """The request for one token, keeping its KV cache for another server (vLLM's
    do_remote_decode in KServe's string parameter)."""
    prefill = pb.ModelInferRequest()
    prefill.CopyFrom(request)
    prefill.parameters["max_new_tokens"].CopyFrom(pb.InferParameter(int64_param=1))
    prefill.parameters.pop("min_new_tokens", None)
    prefill.parameters[KV_TRANSFER_FIELD].string_param = json.dumps({"do_remote_decode": True})
    return prefill


def _kept(response: pb.ModelInferResponse) -> str:
    """The kv_transfer_params a prefill's response carries ("" if none)."""
    kept = response.parameters.get(KV_TRANSFER_FIELD)
    return "" if kept is None else kept.string_param


def _handed(params: str) -> str:
    """A prefill's kv_transfer_params, to hand over ("": it kept none, where a refused or
    failed prefill would have ended with its error status)."""
    if not params:
        raise RequestError(500, "[P Node] the prefill kept no KV cache to hand over")
    return params


def _kserve_decode(request: pb.ModelInferRequest,
                   records: Callable[[], AsyncIterator[tuple[Record, bytes]]]
                   ) -> Callable[[str], AsyncIterator[tuple[Record, bytes]]]:
    """A KServe request's decode: the prefill's kv_transfer_params go as its string
    parameter, which the server's codec checks as it checks a client's."""
    def decode(params: str) -> AsyncIterator[tuple[Record, bytes]]:
        request.parameters[KV_TRANSFER_FIELD].string_param = params
        return records()
    return decode
