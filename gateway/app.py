"""The route tables of the three planes and the servers that serve them.

Planes as in MindIE: business (inference and model routes of every protocol, plus Triton's
`/v2/health/*` so that tritonclient.http works against one URL), management (health, slot count) and metrics
(`/metrics`). Planes configured on the same host and port are served by one server.
"""

from __future__ import annotations

import asyncio
import logging
import signal
from collections import defaultdict

import tornado.httpserver
import tornado.netutil
import tornado.web

from gateway import generation_handlers as generation
from gateway import triton_handlers as triton
from gateway.config import GatewayConfig, Plane
from gateway.handler import Handler, NotFoundHandler
from gateway.metrics import MetricsHandler, record
from gateway.upstream import Upstream

logger = logging.getLogger(__name__)

MODEL = r"/v2/models/(?P<model>[\w\-.]+)(?:/versions/(?P<version>[\w\-.]+))?"
HEALTH_ROUTES: list[tuple[str, type[Handler], str]] = [
    (r"/v2/health/live", triton.ServerLiveHandler, "health_live"),
    (r"/v2/health/ready", triton.ServerReadyHandler, "health_ready"),
    (MODEL + r"/ready", triton.ModelReadyHandler, "model_ready"),
]
ROUTES: dict[Plane, list[tuple[str, type[tornado.web.RequestHandler], str]]] = {
    Plane.BUSINESS: [
        *HEALTH_ROUTES,
        (r"/v2", triton.ServerMetadataHandler, "server_metadata"),
        (MODEL, triton.ModelMetadataHandler, "model_metadata"),
        (MODEL + r"/config", triton.ModelConfigHandler, "model_config"),
        (MODEL + r"/infer", triton.InferHandler, "infer"),
        (MODEL + r"/generate", triton.GenerateHandler, "generate"),
        (MODEL + r"/generate_stream", triton.GenerateStreamHandler, "generate_stream"),
        (MODEL + r"/stopInfer", triton.StopInferHandler, "stop_infer"),
        (r"/", generation.TgiCompatHandler, "tgi_compat"),
        (r"/generate", generation.SharedGenerateHandler, "tgi_vllm_generate"),
        (r"/generate_stream", generation.TgiStreamHandler, "tgi_generate_stream"),
        (r"/info", generation.InfoHandler, "tgi_info"),
        (r"/health", generation.HealthHandler, "health"),
        (r"/v1/models", generation.ModelsHandler, "openai_models"),
        (r"/v1/models/(?P<model>[^/]+)", generation.ModelsHandler, "openai_model"),
        (r"/v1/chat/completions", generation.ChatCompletionsHandler, "openai_chat"),
        (r"/v1/completions", generation.CompletionsHandler, "openai_completions"),
        (r"/infer", generation.MindIEHandler, "mindie_infer"),
        (r"/infer_token", generation.MindIETokenHandler, "mindie_infer_token"),
        (r"/v1/tokenizer", generation.TokenizerHandler, "mindie_tokenizer"),
    ],
    Plane.MANAGEMENT: [
        *HEALTH_ROUTES,
        (r"/v2/models/(?P<model>[\w\-.]+)/getSlotCount", triton.SlotCountHandler, "slot_count"),
    ],
    Plane.METRICS: [
        (r"/metrics", MetricsHandler, "metrics"),
    ],
}


def make_app(planes: list[Plane], upstream: Upstream, config: GatewayConfig
             ) -> tornado.web.Application:
    """One application serving the routes of `planes` (several when they share a port)."""
    collaborators = {"upstream": upstream, "max_body_bytes": config.max_body_bytes}
    rules = []
    for plane in planes:
        for pattern, handler, route in ROUTES[plane]:
            arguments = {**collaborators, "route": route} if issubclass(handler, Handler) else {}
            rules.append(tornado.web.url(pattern, handler, arguments, name=f"{plane.value}:{route}"))
    return tornado.web.Application(
        rules, default_handler_class=NotFoundHandler,
        default_handler_args={**collaborators, "route": "unknown"},
        log_function=record, plane="+".join(plane.value for plane in planes))


class Gateway:
    """The planes' HTTP(S) servers and the upstream channel."""

    def __init__(self, config: GatewayConfig) -> None:
        self.config = config
        self.upstream = Upstream(config.upstream)
        self._servers: list[tornado.httpserver.HTTPServer] = []
        self.addresses: dict[Plane, str] = {}

    def start(self) -> None:
        for planes in self._groups():
            plane_config = self.config.plane(planes[0])
            server = tornado.httpserver.HTTPServer(
                make_app(planes, self.upstream, self.config),
                ssl_options=plane_config.ssl_context(),
                max_body_size=self.config.max_body_bytes, idle_connection_timeout=300)
            sockets = tornado.netutil.bind_sockets(plane_config.port, plane_config.host)
            server.add_sockets(sockets)
            self._servers.append(server)
            port = sockets[0].getsockname()[1]
            for plane in planes:
                host = f"[{plane_config.host}]" if ":" in plane_config.host else plane_config.host
                self.addresses[plane] = f"{plane_config.scheme}://{host}:{port}"

    async def stop(self) -> None:
        for server in self._servers:
            server.stop()
        for server in self._servers:
            await server.close_all_connections()
        await self.upstream.close()

    def _groups(self) -> list[list[Plane]]:
        """Planes sharing a host and a fixed port are served together."""
        groups: defaultdict[tuple[str, int], list[Plane]] = defaultdict(list)
        for index, plane in enumerate(self.config.planes):
            key = (plane.host, plane.port) if plane.port else (plane.host, -1 - index)
            groups[key].append(plane.plane)
        return list(groups.values())


async def serve(config: GatewayConfig) -> None:
    """Run until SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    gateway = Gateway(config)
    gateway.start()
    planes = ", ".join(f"{plane.value} on {address}" for plane, address in gateway.addresses.items())
    logger.info("gateway ready: %s; upstream %s", planes, config.upstream.target)
    await stop.wait()
    logger.info("stopping")
    await gateway.stop()


