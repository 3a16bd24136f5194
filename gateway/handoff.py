"""The gateway as the coordinator of one prefill/decode pair (`--prefill`): each generation
runs on the prefill server for its prompt, which keeps the KV cache, and then on the decode
server (the gateway's upstream), which reads that KV cache and generates; the exchange is
vLLM's kv_transfer_params, as its disaggregation proxy drives it."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable

import grpc

from switchboard.gateway.upstream import Upstream
from switchboard.proto import switchboard_pb2 as sb

logger = logging.getLogger(__name__)


class HandedOff:
    """One generation's responses, as a gRPC call's (iterated, cancelled), from the decode
    server after the prefill server's turn. A prefill server that cannot be reached leaves the
    decode server to compute the prompt itself (MindIE's is-recompute)."""

    def __init__(self, request: sb.GenerateRequest, deadline_s: float, prefill: Upstream,
                 decode: Upstream, track: Callable[[grpc.aio.Call], grpc.aio.Call]) -> None:
        self._request = request
        self._deadline_s = deadline_s
        self._prefill = prefill
        self._decode = decode
        self._track = track  # the handler's: a client that leaves cancels the calls
        self._call: grpc.aio.UnaryStreamCall | None = None

    @staticmethod
    def applies_to(request: sb.GenerateRequest) -> bool:
        """A request of one sequence whose client does not hand it off itself (several
        sequences share one prefill on a single server)."""
        output = request.output
        return (not request.HasField("kv_transfer_params") and output.n <= 1
                and output.best_of <= 1)

    def cancel(self) -> bool:
        return self._call is not None and self._call.cancel()

    async def __aiter__(self) -> AsyncIterator[sb.GenerateResponse]:
        decode = sb.GenerateRequest()
        decode.CopyFrom(self._request)
        params = await self._prefilled()
        if params is not None:
            decode.kv_transfer_params.CopyFrom(params)
        self._call = self._track(self._decode.generation.Generate(decode,
                                                                  timeout=self._deadline_s))
        async for response in self._call:
            yield response

    async def _prefilled(self) -> sb.KVTransferParams | None:
        prefill = sb.GenerateRequest()
        prefill.CopyFrom(self._request)
        prefill.sampling.max_new_tokens = 1
        # What only the decode server's tokens are subject to.
        prefill.sampling.ClearField("min_new_tokens")
        prefill.sampling.ClearField("pattern")
        prefill.ClearField("output")
        prefill.kv_transfer_params.do_remote_decode = True
        self._call = self._track(self._prefill.generation.Generate(prefill,
                                                                   timeout=self._deadline_s))
        params = None
        try:
            async for response in self._call:
                if response.HasField("kv_transfer_params"):
                    params = response.kv_transfer_params
        except grpc.aio.AioRpcError as error:
            if error.code() is not grpc.StatusCode.UNAVAILABLE:
                raise
            logger.warning("the prefill server %s is unavailable (%s); the decode server "
                           "computes the prompt", self._prefill.config.target, error.details())
        return params
