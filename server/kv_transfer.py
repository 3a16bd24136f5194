"""Prefill/decode disaggregation between servers: `switchboard.v1.KVTransfer` serves the KV
caches this server's prefills keep, and `KVHandoff` reads another server's for a request
decoded here, over mutual TLS with this server's peer identity.

A transfer id is the prefill's unguessable request id, known only to the client that sent the
prefill (and whoever it hands the request on to), so any client of this server's CA that
holds it may read that KV cache, as it could have sent the prompt itself.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import AsyncIterator, Iterator

import grpc
import torch

from switchboard.engine.errors import EngineError, InvalidRequest
from switchboard.engine.kv_transfer import KV_TRANSFER_FIELD, KVLayout, PrefilledKV
from switchboard.engine.params import GenerationRequest
from switchboard.engine.protocol import EngineClient
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc
from switchboard.proto.constants import GRPC_MESSAGE_OPTIONS
from switchboard.server.errors import refusal
from switchboard.server.served_model import ServedModel
from switchboard.tls import TLSConfigError, TLSFiles

logger = logging.getLogger(__name__)

# A chunk's data at most: well under gRPC's message limits whatever the model.
KV_CHUNK_BYTES = 2**20
# The dtypes a KV cache may be sent in (the engine's KV caches are in one of them).
KV_DTYPES = frozenset({"float32", "bfloat16", "float16"})
# A peer that cannot be reached, or no longer keeps the KV cache: the prompt is computed here.
RECOMPUTED_STATUSES = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.NOT_FOUND,
                                 grpc.StatusCode.DEADLINE_EXCEEDED})
READ_TIMEOUT_S = 30.0


class KVTransferServicer(sb_grpc.KVTransferServicer):
    def __init__(self, served: ServedModel) -> None:
        self.served = served

    async def ReadKV(self, request: sb.ReadKVRequest, context: grpc.aio.ServicerContext
                     ) -> AsyncIterator[sb.KVChunk]:
        try:
            kv = await self.served.ready_engine().read_kv(request.transfer_id)
        except EngineError as error:
            await context.abort(*refusal(error))
        for chunk in kv_chunks(kv):
            yield chunk

    async def ReleaseKV(self, request: sb.ReleaseKVRequest, context: grpc.aio.ServicerContext
                        ) -> sb.ReleaseKVResponse:
        try:
            self.served.ready_engine().release_kv(request.transfer_id)
        except EngineError as error:
            await context.abort(*refusal(error))
        return sb.ReleaseKVResponse()


def kv_chunks(kv: PrefilledKV) -> Iterator[sb.KVChunk]:
    layout = kv.layout
    yield sb.KVChunk(layout=sb.KVLayout(num_layers=layout.num_layers,
                                        num_kv_heads=layout.num_kv_heads,
                                        head_dim=layout.head_dim, dtype=layout.dtype,
                                        model=layout.model),
                     token_ids=kv.token_ids)
    token_bytes = layout.num_kv_heads * layout.head_dim * kv.keys.element_size()
    step = max(1, KV_CHUNK_BYTES // token_bytes)
    for layer in range(layout.num_layers):
        for values, tensor in ((False, kv.keys), (True, kv.values)):
            for start in range(0, len(kv.token_ids), step):
                data = tensor[layer, start:start + step].contiguous().view(torch.uint8)
                yield sb.KVChunk(layer=layer, values=values, start=start,
                                 data=data.numpy().tobytes())


async def received_kv(chunks: AsyncIterator[sb.KVChunk], local: KVLayout) -> PrefilledKV:
    """The KV cache the chunks carry, refused as soon as its layout differs from `local`, or
    when a chunk does not fit or some are missing."""
    header = await anext(chunks)
    sent = header.layout
    if sent.dtype not in KV_DTYPES:
        raise InvalidRequest(KV_TRANSFER_FIELD, f"the KV cache's dtype {sent.dtype!r} is none "
                             f"of {', '.join(sorted(KV_DTYPES))}")
    layout = KVLayout(num_layers=sent.num_layers, num_kv_heads=sent.num_kv_heads,
                      head_dim=sent.head_dim, dtype=sent.dtype, model=sent.model)
    layout.check_matches(local)
    shape = layout.tensor_shape(len(header.token_ids))
    keys = torch.empty(shape, dtype=layout.torch_dtype)
    values = torch.empty(shape, dtype=layout.torch_dtype)
    token_bytes = layout.num_kv_heads * layout.head_dim * keys.element_size()
    received = 0
    async for chunk in chunks:
        num_tokens, rest = divmod(len(chunk.data), token_bytes)
        if rest or chunk.layer >= layout.num_layers or chunk.start + num_tokens > shape[1]:
            raise InvalidRequest(KV_TRANSFER_FIELD, f"a chunk of the KV cache does not fit it "
                                 f"(layer {chunk.layer}, tokens from {chunk.start}, "
                                 f"{len(chunk.data)} bytes)")
        target = (values if chunk.values else keys)[chunk.layer,
                                                    chunk.start:chunk.start + num_tokens]
        target.view(torch.uint8).view(-1).copy_(torch.frombuffer(bytearray(chunk.data),
                                                                 dtype=torch.uint8))
        received += len(chunk.data)
    if received != 2 * keys.numel() * keys.element_size():
        raise InvalidRequest(KV_TRANSFER_FIELD, f"the KV cache came incomplete: {received} of "
                             f"{2 * keys.numel() * keys.element_size()} bytes")
    return PrefilledKV(layout, tuple(header.token_ids), keys, values)


class KVHandoff:
    """This server's side of prefill/decode handoffs: the kv_transfer_params a prefill done
    here answers with, and the KV caches of prefills done elsewhere, read for decoding here."""

    def __init__(self, peer_tls: TLSFiles | None, advertised_host: str) -> None:
        """peer_tls: this server's identity towards other servers, and the CA it trusts them
        by (None: plaintext, as the server itself is); advertised_host: where other servers
        reach this one, whose port `listening` tells."""
        self.engine_id = uuid.uuid4().hex
        self._host = advertised_host
        self._port = 0
        self._peer_tls = peer_tls
        self._channels: dict[str, grpc.aio.Channel] = {}

    def listening(self, port: int) -> None:
        self._port = port

    async def prepared(self, spec: GenerationRequest, transfer: sb.KVTransferParams | None,
                       engine: EngineClient) -> tuple[GenerationRequest, PrefilledKV | None]:
        """The request as its kv_transfer_params make it (a prefill kept for another server),
        and the KV cache it reads first (a prefill done elsewhere), if any."""
        if transfer is None:
            return spec, None
        spec = dataclasses.replace(spec, keep_kv=transfer.do_remote_decode)
        if not transfer.do_remote_prefill:
            return spec, None
        return spec, await self.read(transfer, engine.info.kv_layout)

    def prefilled_here(self, transfer_id: str) -> sb.KVTransferParams:
        return sb.KVTransferParams(do_remote_prefill=True, remote_engine_id=self.engine_id,
                                   remote_host=self._host, remote_port=self._port,
                                   remote_request_id=transfer_id)

    async def read(self, params: sb.KVTransferParams, local: KVLayout) -> PrefilledKV | None:
        """The KV cache the prefill named by params keeps, released there once read; None
        where the prefill instance cannot be reached or no longer keeps it, and the prompt is
        computed here instead (vLLM's recompute policy). A KV cache that does not match
        this one is refused."""
        if not params.remote_host or not params.remote_port or not params.remote_request_id:
            raise InvalidRequest(KV_TRANSFER_FIELD, "do_remote_prefill needs remote_host, "
                                 "remote_port and remote_request_id (a prefill's answer gives "
                                 "them)")
        target = f"{params.remote_host}:{params.remote_port}"
        stub = sb_grpc.KVTransferStub(self._channel(target))
        call = stub.ReadKV(sb.ReadKVRequest(transfer_id=params.remote_request_id),
                           timeout=READ_TIMEOUT_S)
        try:
            try:
                kv = await received_kv(aiter(call), local)
            finally:
                call.cancel()  # a refused transfer stops sending; a finished one is unaffected
            await stub.ReleaseKV(sb.ReleaseKVRequest(transfer_id=params.remote_request_id),
                                 timeout=READ_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            if error.code() not in RECOMPUTED_STATUSES:
                raise InvalidRequest(KV_TRANSFER_FIELD, f"the prefill instance at {target} "
                                     f"refused to hand its KV cache over: {error.code().name}: "
                                     f"{error.details()}") from None
            logger.warning("the KV cache of prefill %s at %s cannot be read (%s: %s); the "
                           "prompt is computed here", params.remote_request_id, target,
                           error.code().name, error.details())
            return None
        return kv

    def _channel(self, target: str) -> grpc.aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            if self._peer_tls is None:
                channel = grpc.aio.insecure_channel(target, options=GRPC_MESSAGE_OPTIONS)
            else:
                try:
                    material = self._peer_tls.load()
                except TLSConfigError as error:
                    raise InvalidRequest(KV_TRANSFER_FIELD, f"this server has no identity to "
                                         f"read KV caches with (--kv-transfer-cert, "
                                         f"--kv-transfer-key): {error}") from None
                credentials = grpc.ssl_channel_credentials(
                    root_certificates=material.ca_pem, private_key=material.key_pem,
                    certificate_chain=material.cert_pem)
                channel = grpc.aio.secure_channel(target, credentials,
                                                  options=GRPC_MESSAGE_OPTIONS)
            self._channels[target] = channel
        return channel

    async def close(self) -> None:
        for channel in self._channels.values():
            await channel.close()
        self._channels.clear()
