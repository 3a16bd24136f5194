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
answer, chunk by chunk, on its /dresult stream under the request's id.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import ssl
from collections.abc import Mapping

import grpc
from google.protobuf import json_format
from tornado.httpclient import AsyncHTTPClient, HTTPClientError, HTTPRequest

from switchboard.gateway.dresult import DResults, Record
from switchboard.gateway.errors import RequestError, client_message
from switchboard.gateway.protocols.exchange import Exchange
from switchboard.gateway.roles import Roles
from switchboard.gateway.upstream import Upstream
from switchboard.proto import switchboard_pb2 as sb

logger = logging.getLogger(__name__)

REQUEST_TYPE_HEADER = "req-type"
REQUEST_ID_HEADER = "req-id"
TARGET_HEADER = "d-target"
# Switchboard's: the prefill's kv_transfer_params, from a prefill instance's gateway.
DECODE_HEADER = "x-switchboard-kv-transfer"
MAX_REQUEST_ID = 1024
HANDOFF_TIMEOUT_S = 30.0


def is_prefill(headers: Mapping[str, str]) -> bool:
    return REQUEST_TYPE_HEADER in headers


def is_decode(headers: Mapping[str, str]) -> bool:
    return DECODE_HEADER in headers


def checked_prefill(headers: Mapping[str, str], roles: Roles, own_port: int
                    ) -> tuple[str, str]:
    """The request's id and its decode instance's address, refused as MindIE refuses them."""
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
    return request_id, f"{host}:{port or own_port}"


async def prefill_and_hand_over(exchange: Exchange, deadline_s: float, upstream: Upstream,
                                target: str,
                                request_id: str, path: str, body: bytes,
                                client_tls: ssl.SSLContext | None) -> dict[str, object]:
    """Prefill here, hand the request to the decode instance's gateway, and MindIE's answer
    to the coordinator."""
    if len(exchange.requests) != 1:
        raise RequestError(400, "a DMI request has one prompt")
    prefill = sb.GenerateRequest()
    prefill.CopyFrom(exchange.requests[0])
    prefill.sampling.max_new_tokens = 1
    prefill.sampling.ClearField("min_new_tokens")
    prefill.kv_transfer_params.do_remote_decode = True
    params = None
    async for response in upstream.generation.Generate(prefill, timeout=deadline_s):
        if response.HasField("kv_transfer_params"):
            params = response.kv_transfer_params
    if params is None:  # a refused or failed prefill ends with its error status instead
        raise RequestError(500, "[P Node] the prefill kept no KV cache to hand over")
    scheme = "http" if client_tls is None else "https"
    try:
        await AsyncHTTPClient().fetch(HTTPRequest(
            f"{scheme}://{target}{path}", method="POST", body=body,
            headers={"Content-Type": "application/json", REQUEST_ID_HEADER: request_id,
                     DECODE_HEADER: json_format.MessageToJson(params, indent=None)},
            ssl_options=client_tls, request_timeout=HANDOFF_TIMEOUT_S))
    except (HTTPClientError, OSError, ssl.SSLError) as error:
        raise RequestError(500, f"[P Node] Send D request failed: {error}") from None
    answer: dict[str, object] = {"reqId": request_id, "isStream": exchange.stream}
    if exchange.stream:
        answer.update(isLastResp=False, output="")
    return answer


def start_decode(exchange: Exchange, deadline_s: float, headers: Mapping[str, str],
                 upstream: Upstream, dresults: DResults) -> None:
    """Generate a handed-off request from its prefilled KV cache, publishing its answer on
    /dresult (in the background: the prefill instance's gateway waits for no more)."""
    request_id = headers.get(REQUEST_ID_HEADER, "")
    if len(exchange.requests) != 1 or not request_id:
        raise RequestError(400, "a handed-off request has one prompt and a req-id")
    request = exchange.requests[0]
    try:
        json_format.Parse(headers[DECODE_HEADER], request.kv_transfer_params)
    except json_format.ParseError as error:
        raise RequestError(400, f"{DECODE_HEADER}: {error}") from None
    dresults.run(_decode(exchange, deadline_s, request_id, upstream, dresults))


async def _decode(exchange: Exchange, deadline_s: float, request_id: str, upstream: Upstream,
                  dresults: DResults) -> None:
    answer = exchange.answer
    try:
        async for response in upstream.generation.Generate(exchange.requests[0],
                                                           timeout=deadline_s):
            if exchange.stream:
                for chunk in answer.events(0, response):
                    dresults.publish(request_id, Record.DATA, chunk)
            else:
                answer.collect(0, response)
    except grpc.aio.AioRpcError as error:
        dresults.publish(request_id, Record.ERROR,
                         client_message(error.code(), error.details()).encode())
        return
    last = answer.end() if exchange.stream else json.dumps(answer.reply(),
                                                           ensure_ascii=False).encode()
    dresults.publish(request_id, Record.LAST_DATA, last)
    logger.info("request %s decoded for its coordinator's /dresult", request_id)
