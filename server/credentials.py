"""The gRPC server's mutual TLS: certificate, key, CA and CRL re-read on `reload` (SIGHUP)
and used from the next handshake on, without a restart or a dropped stream; and an
interceptor that refuses client certificates the CRLs revoke, or issued by a CA they revoke
(grpcio has no CRL option)."""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable

import grpc

from switchboard.tls import TLSConfigError, TLSFiles, TLSMaterial
from switchboard.tls.revocation import Revocations

logger = logging.getLogger(__name__)


class ReloadableCredentials:
    def __init__(self, files: TLSFiles) -> None:
        self._files = files
        self._material = files.load()
        self._pending: grpc.ServerCertificateConfiguration | None = None

    def server_credentials(self) -> grpc.ServerCredentials:
        return grpc.dynamic_ssl_server_credentials(
            _configuration(self._material), self._next_configuration,
            require_client_authentication=True)

    @property
    def revocations(self) -> Revocations | None:
        return self._material.revocations

    def reload(self) -> None:
        """Read the files again; a file that does not load leaves the current material in use."""
        try:
            material = self._files.load()
        except TLSConfigError as error:
            logger.error("TLS files not reloaded, the current ones stay in use: %s", error)
            return
        self._material = material
        self._pending = _configuration(material)
        logger.info("TLS files reloaded: new connections use them (%d revoked certificates)",
                    len(material.revocations or ()))

    def _next_configuration(self) -> grpc.ServerCertificateConfiguration | None:
        """gRPC calls this before each handshake (from its own thread): None keeps the current."""
        configuration, self._pending = self._pending, None
        return configuration


def _configuration(material: TLSMaterial) -> grpc.ServerCertificateConfiguration:
    return grpc.ssl_server_certificate_configuration(
        [(material.key_pem, material.cert_pem)], root_certificates=material.ca_pem)


class RevocationInterceptor(grpc.aio.ServerInterceptor):
    """Every RPC from a client whose chain the CRLs refuse (its certificate or one of its
    issuers revoked, or an issuer without a CRL) ends with UNAUTHENTICATED before its handler
    runs."""

    def __init__(self, revocations: Callable[[], Revocations | None]) -> None:
        self._revocations = revocations

    async def intercept_service(
            self, continuation: Callable[[grpc.HandlerCallDetails],
                                         Awaitable[grpc.RpcMethodHandler]],
            handler_call_details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
        handler = await continuation(handler_call_details)
        if handler is None:
            return None
        if handler.response_streaming:
            kind = "stream_stream" if handler.request_streaming else "unary_stream"
            return handler._replace(**{kind: self._checked_stream(getattr(handler, kind))})
        kind = "stream_unary" if handler.request_streaming else "unary_unary"
        return handler._replace(**{kind: self._checked_unary(getattr(handler, kind))})

    def _checked_unary(self, behavior: Callable[..., Awaitable[object]]
                       ) -> Callable[..., Awaitable[object]]:
        async def checked(request: object, context: grpc.aio.ServicerContext) -> object:
            await self._check(context)
            return await behavior(request, context)

        return checked

    def _checked_stream(self, behavior: Callable[..., object]) -> Callable[..., Awaitable[None]]:
        """Streaming handlers yield their responses or write them (grpc_health's Watch); the
        checked one writes them either way."""
        async def checked(request: object, context: grpc.aio.ServicerContext) -> None:
            await self._check(context)
            result = behavior(request, context)
            if not inspect.isasyncgen(result):
                await result
                return
            async with contextlib.aclosing(result) as responses:
                async for response in responses:
                    await context.write(response)

        return checked

    async def _check(self, context: grpc.aio.ServicerContext) -> None:
        revocations = self._revocations()
        if revocations is None:
            return
        properties = context.auth_context()
        # The client's certificate, then those it sent with it (the leaf again on some sides).
        presented = b"".join((*properties.get("x509_pem_cert", ()),
                              *properties.get("x509_pem_cert_chain", ())))
        if presented and (refusal := revocations.refusal(presented)) is not None:
            await context.abort(grpc.StatusCode.UNAUTHENTICATED,
                                f"the client certificate is refused: {refusal}")
