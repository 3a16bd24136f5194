"""Builds and runs the gRPC server: KServe v2 inference, Switchboard's Generation and Management
services, health, reflection, mutual TLS."""

from __future__ import annotations

import asyncio
import logging
import signal
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from importlib.metadata import PackageNotFoundError, version

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1.health import aio as health_aio
from grpc_reflection.v1alpha import reflection

from switchboard.engine.async_engine import AsyncEngine
from switchboard.engine.config import EngineConfig
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import grpc_service_pb2_grpc as pb_grpc
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto import switchboard_pb2_grpc as sb_grpc
from switchboard.proto.constants import FORCED_STOP_S, GRPC_MESSAGE_OPTIONS
from switchboard.server.config import ServerConfig
from switchboard.server.credentials import ReloadableCredentials, RevocationInterceptor
from switchboard.server.generation import GenerationServicer
from switchboard.server.kv_transfer import KVHandoff, KVTransferServicer
from switchboard.server.management import ManagementServicer
from switchboard.server.served_model import ServedModel
from switchboard.server.servicer import InferenceServicer

logger = logging.getLogger(__name__)

INFERENCE_SERVICE = pb.DESCRIPTOR.services_by_name["GRPCInferenceService"].full_name
MANAGEMENT_SERVICE = sb.DESCRIPTOR.services_by_name["Management"].full_name
GENERATION_SERVICE = sb.DESCRIPTOR.services_by_name["Generation"].full_name
KV_TRANSFER_SERVICE = sb.DESCRIPTOR.services_by_name["KVTransfer"].full_name
SERVICES = (INFERENCE_SERVICE, GENERATION_SERVICE, MANAGEMENT_SERVICE, KV_TRANSFER_SERVICE)
SHUTDOWN_GRACE_S = 5.0


def package_version() -> str:
    try:
        return version("switchboard")
    except PackageNotFoundError:
        return "0+unknown"


class ListenError(RuntimeError):
    """The gRPC server cannot listen where its configuration says."""


class Server:
    """The gRPC server and its engine. Starts listening before the model is loaded, so health
    checks answer NOT_SERVING (and ServerReady false) while it loads."""

    def __init__(self, engine_config: EngineConfig, config: ServerConfig) -> None:
        self._engine_config = engine_config
        self._config = config
        self._served = ServedModel(config.model_name)
        self._health = health_aio.HealthServicer()
        self._credentials = None if config.tls is None else ReloadableCredentials(config.tls)
        revocation = [] if config.tls is None or config.tls.crl_file is None else [
            RevocationInterceptor(lambda: self._credentials.revocations)]
        self._grpc = grpc.aio.server(interceptors=revocation, options=GRPC_MESSAGE_OPTIONS)
        self._engine: AsyncEngine | None = None
        self._handoff = KVHandoff(config.kv_transfer_tls, config.advertised_host)
        self.port: int | None = None
        # Set by SIGTERM / SIGINT or by a StopService call that has drained the server.
        self.exit_requested = asyncio.Event()
        # Set by a second signal, or FORCED_STOP_S after a forced StopService: stop without
        # waiting for the requests in flight.
        self.stop_now = asyncio.Event()

    async def start(self) -> None:
        inference = InferenceServicer(self._served, package_version(), self._handoff)
        pb_grpc.add_GRPCInferenceServiceServicer_to_server(inference, self._grpc)
        sb_grpc.add_GenerationServicer_to_server(
            GenerationServicer(self._served, inference, self._handoff), self._grpc)
        sb_grpc.add_KVTransferServicer_to_server(KVTransferServicer(self._served), self._grpc)
        sb_grpc.add_ManagementServicer_to_server(
            ManagementServicer(self._served, self.stop_service,
                               None if self._config.is_insecure
                               else frozenset(self._config.management_identities)),
            self._grpc)
        health_pb2_grpc.add_HealthServicer_to_server(self._health, self._grpc)
        reflection.enable_server_reflection(
            (*SERVICES, health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
             reflection.SERVICE_NAME), self._grpc)
        for service in ("", *SERVICES):
            await self._health.set(service, health_pb2.HealthCheckResponse.NOT_SERVING)
        address = f"{self._config.grpc_host}:{self._config.grpc_port}"
        try:
            if self._config.is_insecure:
                logger.warning("serving gRPC WITHOUT TLS on %s (--insecure): anyone who can "
                               "reach the port can use the model", address)
                self.port = self._grpc.add_insecure_port(address)
            else:
                self.port = self._grpc.add_secure_port(address,
                                                       self._credentials.server_credentials())
        except RuntimeError as error:  # grpc's "Failed to bind to address"
            raise ListenError(f"gRPC cannot listen on {address} (grpcIpAddress, grpcPort): "
                              f"{error}") from None
        self._handoff.listening(self.port)
        await self._grpc.start()
        logger.info("gRPC listening on %s:%d; loading the model", self._config.grpc_host, self.port)

    async def load(self) -> None:
        self._engine = await AsyncEngine.load(self._engine_config)
        self._engine.start(asyncio.get_running_loop())
        await self._engine.wait_ready()
        self._served.engine = self._engine
        for service in ("", *SERVICES):
            await self._health.set(service, health_pb2.HealthCheckResponse.SERVING)
        info = self._engine.info
        logger.info("model %s loaded from %s (%s, %s; max_seq_len %d)", self._config.model_name,
                    info.source, info.device, info.dtype, self._engine.limits.max_seq_len)

    def reload_tls(self) -> None:
        """SIGHUP: re-read the TLS files (certificate rotation); new connections use them."""
        if self._credentials is not None:
            self._credentials.reload()

    async def drain(self) -> None:
        """Graceful stop: refuse new requests (health NOT_SERVING), wait for those in flight."""
        await self._refuse_new_requests()
        await self._served.drained()

    async def stop_service(self, force: bool) -> None:
        """Drain, then ask `serve` to exit; forced, ask at once, and stop waiting for the
        requests in flight after FORCED_STOP_S."""
        if force:
            await self._refuse_new_requests()
            asyncio.get_running_loop().call_later(FORCED_STOP_S, self.stop_now.set)
        else:
            await self.drain()
        self.exit_requested.set()

    async def _refuse_new_requests(self) -> None:
        if self._served.begin_stop():
            await self._health.enter_graceful_shutdown()

    async def stop(self) -> None:
        await self._health.enter_graceful_shutdown()
        await self._grpc.stop(SHUTDOWN_GRACE_S)
        await self._handoff.close()
        if self._engine is not None:
            await self._engine.shutdown()

    def how_to_call(self) -> str:
        host = self._config.grpc_host
        target = f"[{host}]:{self.port}" if ":" in host else f"{host}:{self.port}"
        if self._config.is_insecure:
            return f"grpcurl -plaintext {target} list"
        tls = self._config.tls
        client_cert, client_key = tls.ca_file.parent / "client.pem", tls.ca_file.parent / "client.key.pem"
        if not client_cert.exists():
            client_cert, client_key = Path("<client.pem>"), Path("<client.key.pem>")
        return f"grpcurl -cacert {tls.ca_file} -cert {client_cert} -key {client_key} {target} list"


async def serve(engine_config: EngineConfig, config: ServerConfig,
                on_ready: Callable[[Mapping[str, str]], None]) -> None:
    """Run until SIGINT, SIGTERM or a StopService call; a signal drains the requests in flight
    first, and a second signal stops at once. Once the model serves, `on_ready` gets the
    model's name and the server's address."""
    server = Server(engine_config, config)
    signalled = asyncio.Event()

    def on_signal() -> None:
        (server.stop_now if signalled.is_set() else signalled).set()
        server.exit_requested.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    loop.add_signal_handler(signal.SIGHUP, server.reload_tls)
    try:
        await server.start()
        loading = asyncio.create_task(server.load())
        await _first_of(loading, server.exit_requested.wait())
        if loading.done():
            loading.result()
            logger.info("ready: serving model %r over gRPC on %s:%d%s. Try: %s",
                        config.model_name, config.grpc_host, server.port,
                        "" if config.is_insecure else " (mutual TLS)", server.how_to_call())
            on_ready({"model": config.model_name, "address": f"{config.grpc_host}:{server.port}"})
            await server.exit_requested.wait()
        loading.cancel()
        logger.info("stopping: finishing the requests in flight (signal again to stop at once)")
        await _first_of(server.drain(), server.stop_now.wait())
    finally:
        await server.stop()


async def _first_of(*awaitables: Awaitable[object]) -> None:
    """Wait for the first to finish; cancel the others (tasks passed in are left running)."""
    tasks = [asyncio.ensure_future(awaitable) for awaitable in awaitables]
    _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    for task in pending:
        if task not in awaitables:
            task.cancel()
