"""The route tables of the three planes and the servers that serve them.

Planes as in MindIE: business (inference and model routes of every protocol, plus Triton's
`/v2/health/*` so that tritonclient.http works against one URL), management (probes, slot
count, graceful stop, config, status, JSON metrics) and metrics (Prometheus' `/metrics`).
Planes configured on the same host and port are served by one server.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import signal
import ssl
from collections import defaultdict
from collections.abc import Callable, Mapping

import tornado.netutil
import tornado.web

from switchboard.gateway import generation_handlers as generation
from switchboard.gateway import management_handlers as management
from switchboard.gateway import openapi
from switchboard.gateway import triton_handlers as triton
from switchboard.gateway.config import (CONNECTIONS_PER_LINK, MAX_DRAINED_BODY_BYTES, GatewayConfig,
                                        Plane, PlaneConfig, TLSMode)
from switchboard.gateway.handler import Handler, NotFoundHandler, Services
from switchboard.gateway.http_server import BoundedHTTPServer
from switchboard.gateway.lifecycle import Lifecycle
from switchboard.gateway.metrics import GatewayMetrics
from switchboard.gateway.dresult import DResults
from switchboard.gateway.roles import Roles
from switchboard.gateway.upstream import Upstream

logger = logging.getLogger(__name__)

# Descriptors besides the planes' connections: listening sockets, the upstream channel, logs.
SPARE_FILE_DESCRIPTORS = 64
MODEL = r"/v2/models/(?P<model>[\w\-.]+)(?:/versions/(?P<version>[\w\-.]+))?"
# Probes and model information, served on the business and the management planes alike.
HEALTH_ROUTES: list[tuple[str, type[Handler], str]] = [
    (r"/v2/health/live", triton.ServerLiveHandler, "health_live"),
    (r"/v2/health/ready", triton.ServerReadyHandler, "health_ready"),
    (MODEL + r"/ready", triton.ModelReadyHandler, "model_ready"),
    (r"/health", generation.HealthHandler, "health"),
    (r"/info", generation.InfoHandler, "tgi_info"),
]
# Each plane describes what its server serves (every plane, where they share a port).
OPENAPI_ROUTE = (r"/openapi\.json", openapi.OpenAPIHandler, "openapi")
ROUTES: dict[Plane, list[tuple[str, type[tornado.web.RequestHandler], str]]] = {
    Plane.BUSINESS: [
        *HEALTH_ROUTES,
        (r"/v2", triton.ServerMetadataHandler, "server_metadata"),
        # The Open Inference Protocol's own spelling of the path.
        (r"/v2/", triton.ServerMetadataHandler, "server_metadata_slash"),
        (r"/v2/repository/index", triton.RepositoryIndexHandler, "repository_index"),
        # Before MODEL, which would take "stats" for a model's name.
        (r"/v2/models/stats", triton.ModelStatisticsHandler, "server_statistics"),
        (MODEL, triton.ModelMetadataHandler, "model_metadata"),
        (MODEL + r"/stats", triton.ModelStatisticsHandler, "model_statistics"),
        (MODEL + r"/config", triton.ModelConfigHandler, "model_config"),
        (MODEL + r"/infer", triton.InferHandler, "infer"),
        (MODEL + r"/generate", triton.GenerateHandler, "generate"),
        (MODEL + r"/generate_stream", triton.GenerateStreamHandler, "generate_stream"),
        (MODEL + r"/stopInfer", triton.StopInferHandler, "stop_infer"),
        (r"/", generation.TgiCompatHandler, "tgi_compat"),
        (r"/generate", generation.SharedGenerateHandler, "tgi_vllm_generate"),
        (r"/generate_stream", generation.TgiStreamHandler, "tgi_generate_stream"),
        (r"/v1/models", generation.ModelsHandler, "openai_models"),
        (r"/v1/models/(?P<model>[^/]+)", generation.ModelsHandler, "openai_model"),
        (r"/v1/chat/completions", generation.ChatCompletionsHandler, "openai_chat"),
        (r"/v1/completions", generation.CompletionsHandler, "openai_completions"),
        (r"/v1/responses", generation.ResponsesHandler, "openai_responses"),
        (r"/v1/responses/(?P<response_id>[^/]+)", generation.StoredResponseHandler,
         "openai_stored_response"),
        (r"/v1/responses/(?P<response_id>[^/]+)/cancel", generation.CancelResponseHandler,
         "openai_cancel_response"),
        (r"/infer", generation.MindIEHandler, "mindie_infer"),
        (r"/infer_token", generation.MindIETokenHandler, "mindie_infer_token"),
        (r"/v1/tokenizer", generation.TokenizerHandler, "mindie_tokenizer"),
        (r"/tokenize", generation.TokenizeHandler, "tgi_vllm_tokenize"),
        (r"/chat_tokenize", generation.ChatTokenizeHandler, "tgi_chat_tokenize"),
        (r"/detokenize", generation.DetokenizeHandler, "vllm_detokenize"),
        (r"/ping", generation.PingHandler, "sagemaker_ping"),
        (r"/invocations", generation.InvocationsHandler, "sagemaker_invocations"),
        (r"/version", generation.VersionHandler, "vllm_version"),
        (r"/dresult", management.DResultHandler, "mindie_dresult"),
        OPENAPI_ROUTE,
    ],
    Plane.MANAGEMENT: [
        *HEALTH_ROUTES,
        (r"/v2/models/(?P<model>[\w\-.]+)/getSlotCount", triton.SlotCountHandler, "slot_count"),
        (r"/health/timed(?:-(?P<seconds>[^/]*))?", management.HealthTimedHandler, "health_timed"),
        (r"/stopService", management.StopServiceHandler, "stop_service"),
        (r"/v1/config", management.ConfigHandler, "mindie_config"),
        (r"/v1/status", management.StatusHandler, "mindie_status"),
        (r"/v1/role/(?P<role>[^/]+)", management.RoleHandler, "mindie_role"),
        (r"/metrics-json", management.MetricsJsonHandler, "metrics_json"),
        OPENAPI_ROUTE,
    ],
    Plane.METRICS: [
        (r"/metrics", management.MetricsHandler, "metrics"),
        OPENAPI_ROUTE,
    ],
}


def make_app(planes: list[Plane], services: Services) -> tornado.web.Application:
    """One application serving the routes of `planes` (several when they share a port)."""
    rules = [tornado.web.url(pattern, handler, {"services": services, "route": route},
                             name=f"{plane.value}:{route}")
             for plane in planes for pattern, handler, route in ROUTES[plane]]
    return tornado.web.Application(
        rules, default_handler_class=NotFoundHandler,
        default_handler_args={"services": services, "route": "unknown"},
        log_function=services.metrics.record, plane="+".join(plane.value for plane in planes))


class ListenError(OSError):
    """A plane cannot listen where its configuration says."""


class Gateway:
    """The planes' HTTP(S) servers, the upstream channel, and the graceful stop."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.lifecycle = Lifecycle()
        self.services = Services(upstream=Upstream(config.upstream), lifecycle=self.lifecycle,
                                 prefill=None if config.prefill is None
                                 else Upstream(config.prefill),
                                 roles=Roles(self._management_port, self._peer_tls, config.role),
                                 dresults=DResults(), peer_tls=self._peer_tls,
                                 metrics=GatewayMetrics(lambda: self.lifecycle.in_flight),
                                 max_body_bytes=config.max_body_bytes,
                                 admission=asyncio.Semaphore(config.max_connections))
        self._servers: list[tuple[BoundedHTTPServer, PlaneConfig]] = []
        self.addresses: dict[Plane, str] = {}

    def start(self) -> None:
        groups = self._groups()
        _allow_open_files(len(groups) * CONNECTIONS_PER_LINK * self.config.max_connections
                          + SPARE_FILE_DESCRIPTORS)
        for planes in groups:
            plane_config = self.config.plane(planes[0])
            server = BoundedHTTPServer(
                make_app(planes, self.services), ssl_options=plane_config.ssl_context(),
                max_body_size=MAX_DRAINED_BODY_BYTES,
                max_header_size=self.config.max_header_bytes,
                idle_connection_timeout=self.config.client_timeout_s,
                body_timeout=self.config.client_timeout_s,
                max_connections=CONNECTIONS_PER_LINK * self.config.max_connections,
                max_client_connections=self.config.connections_per_client,
                refusal_timeout_s=self.config.client_timeout_s)
            try:
                sockets = tornado.netutil.bind_sockets(plane_config.port, plane_config.host)
            except OSError as error:
                names = " and ".join(plane.value for plane in planes)
                raise ListenError(f"the {names} plane cannot listen on {plane_config.host}:"
                                  f"{plane_config.port}: {error.strerror}") from None
            server.add_sockets(sockets)
            self._servers.append((server, plane_config))
            port = sockets[0].getsockname()[1]
            for plane in planes:
                host = f"[{plane_config.host}]" if ":" in plane_config.host else plane_config.host
                self.addresses[plane] = f"{plane_config.scheme}://{host}:{port}"

    def reload_tls(self) -> None:
        """SIGHUP: read the TLS files again (certificate rotation). New connections, and new
        upstream calls, use them; connections and streams in flight carry on."""
        try:
            # Checked first for messages that name the file at fault (ssl's say "PEM lib").
            for files in {plane.tls for _, plane in self._servers if plane.tls is not None}:
                files.load()
            contexts = [plane.ssl_context() for _, plane in self._servers]
            upstream_credentials = self.config.upstream.credentials()
        except (OSError, ValueError) as error:  # ssl.SSLError and TLSConfigError among them
            logger.error("TLS files not reloaded, the current ones stay in use: %s", error)
            return
        for (server, _), context in zip(self._servers, contexts):
            server.ssl_options = context
        if upstream_credentials is not None:
            self.services.upstream.reload(upstream_credentials)
            if self.services.prefill is not None:
                self.services.prefill.reload(upstream_credentials)
        logger.info("TLS files reloaded: new connections use them")

    def _management_port(self) -> int:
        return int(self.addresses[Plane.MANAGEMENT].rsplit(":", 1)[1])

    def _peer_tls(self) -> ssl.SSLContext | None:
        """How this gateway calls its peers' management planes: with its own certificate, as
        it calls its server."""
        files = self.config.upstream.tls
        if self.config.plane(Plane.MANAGEMENT).tls_mode is TLSMode.NONE or files is None:
            return None
        context = ssl.create_default_context(cafile=str(files.ca_file))
        context.load_cert_chain(str(files.cert_file), str(files.key_file),
                                password=files.key_password)
        return context

    async def stop(self) -> None:
        await self.services.roles.close()
        self.services.dresults.close()
        for server, _ in self._servers:
            server.stop()
        for server, _ in self._servers:
            await server.close_all_connections()
        await self.services.upstream.close()
        if self.services.prefill is not None:
            await self.services.prefill.close()

    def _groups(self) -> list[list[Plane]]:
        """Planes sharing a host and a fixed port are served together."""
        groups: defaultdict[tuple[str, int], list[Plane]] = defaultdict(list)
        for index, plane in enumerate(self.config.planes):
            key = (plane.host, plane.port) if plane.port else (plane.host, -1 - index)
            groups[key].append(plane.plane)
        return list(groups.values())


def _allow_open_files(needed: int) -> None:
    """Every connection is a file descriptor: raise the soft limit to `needed` where the hard
    limit allows (a common soft limit, 1024, is below one plane's 3 × maxLinkNum), else warn:
    past it, connections fail to be accepted instead of getting their 503."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < needed:
        allowed = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (allowed, hard))
        if allowed < needed:
            logger.warning("open files are limited to %d, fewer than the %d connections the "
                           "planes may hold: lower --max-connections or raise the limit",
                           allowed, needed)


async def serve(config: GatewayConfig, on_ready: Callable[[Mapping[str, str]], None]) -> None:
    """Run until SIGINT, SIGTERM or /stopService; a signal lets the inference requests in
    flight finish first, and a second signal stops at once. Once the planes listen,
    `on_ready` gets each plane's base URL by its name."""
    gateway = Gateway(config)
    lifecycle = gateway.lifecycle
    signalled = asyncio.Event()

    def on_signal() -> None:
        (lifecycle.stop_now if signalled.is_set() else signalled).set()
        lifecycle.begin_stop()
        lifecycle.exit_requested.set()

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal)
    loop.add_signal_handler(signal.SIGHUP, gateway.reload_tls)
    gateway.start()
    planes = ", ".join(f"{plane.value} on {address}" for plane, address in gateway.addresses.items())
    logger.info("gateway ready: %s; upstream %s%s", planes, config.upstream.target,
                "" if config.prefill is None else f", prefilled by {config.prefill.target}")
    on_ready({plane.value: address for plane, address in gateway.addresses.items()})
    await lifecycle.exit_requested.wait()
    logger.info("stopping: answering the requests in flight (signal again to stop at once)")
    drained = asyncio.create_task(lifecycle.drained())
    stop_now = asyncio.create_task(lifecycle.stop_now.wait())
    await asyncio.wait({drained, stop_now}, return_when=asyncio.FIRST_COMPLETED)
    for task in (drained, stop_now):
        task.cancel()
    await gateway.stop()
