"""Routes of the management and metrics planes that MindIE adds to the Triton family: the deep
health probe, the graceful stop, /v1/config, /v1/status, /v1/role, /metrics-json, and
Prometheus' /metrics. Errors are in MindIE's envelope."""

from __future__ import annotations

import logging

import grpc
import prometheus_client

from switchboard.gateway.errors import RequestError, client_message
from switchboard.gateway.handler import METADATA_TIMEOUT_S, Handler
from switchboard.gateway.protocols import mindie, mindie_management
from switchboard.gateway.protocols.kserve import parse_json
from switchboard.gateway.roles import ROLES
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto.constants import FORCED_STOP_S

logger = logging.getLogger(__name__)


class ManagementHandler(Handler):
    status_table = mindie.HTTP_STATUS

    def error_body(self, status: int, message: str) -> object:
        return mindie.error_body(status, message)

    async def status(self) -> sb.GetStatusResponse:
        return await self.track(self.upstream.management.GetStatus(
            sb.GetStatusRequest(), timeout=METADATA_TIMEOUT_S))


class HealthTimedHandler(ManagementHandler):
    """/health/timed[-N]: one real token generated through the gateway, the gRPC server and the
    engine within N seconds (10 by default): 200 `{"status": "healthy"}`, else 500."""

    async def get(self, seconds: str | None = None) -> None:
        limit_s = mindie_management.health_timeout(seconds)
        try:
            await self.track(self.upstream.management.ProbeGeneration(
                sb.ProbeGenerationRequest(), timeout=limit_s))
        except grpc.aio.AioRpcError as error:
            if error.code() is grpc.StatusCode.DEADLINE_EXCEEDED:
                raise RequestError(500, f"the probe generation did not finish within {limit_s} s")
            raise RequestError(500, "the probe generation failed: "
                               + client_message(error.code(), error.details()))
        self.write_json({"status": "healthy"})


class StopServiceHandler(ManagementHandler):
    """/stopService: new inference requests get 503 from now on; the answer (200, no body) comes
    once every request in flight has been answered, then the gateway and the server exit. A
    second call during the stop gets 500, as MindIE's. `?mode=Force` answers at once, and both
    exit within FORCED_STOP_S, cutting off what is still in flight."""

    exit_when_answered = False

    async def get(self) -> None:
        mode = self.get_query_argument("mode", "")
        if mode.lower() not in ("", "force"):
            raise RequestError(400, f"mode must be Force, or absent; got {mode!r}")
        force = bool(mode)
        lifecycle = self.services.lifecycle
        if not lifecycle.begin_stop():
            raise RequestError(500, "a graceful stop is already under way")
        logger.info("%s stop requested: %s", *(
            ("forced", f"cutting off the requests in flight after {FORCED_STOP_S:g} s") if force
            else ("graceful", "finishing the requests in flight")))
        self.exit_when_answered = True
        try:  # not tracked: the stop goes on if the caller leaves
            await self.upstream.management.StopService(sb.StopServiceRequest(force=force))
        finally:
            if force:
                lifecycle.stop_now_after(FORCED_STOP_S)
            else:
                await lifecycle.drained()

    def on_finish(self) -> None:
        super().on_finish()
        if self.exit_when_answered:
            self.services.lifecycle.exit_requested.set()


class ConfigHandler(ManagementHandler):
    async def get(self) -> None:
        self.write_json(mindie_management.config_json(*await self.served_model_parameters()))


class StatusHandler(ManagementHandler):
    async def get(self) -> None:
        self.write_json(mindie_management.status_json(await self.status(),
                                                      self.services.roles.status_json()))


class MetricsJsonHandler(ManagementHandler):
    async def get(self) -> None:
        host, port = self.request.connection.stream.socket.getsockname()[:2]
        instance = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        self.write_json(mindie_management.metrics_json(await self.status(), instance))


class RoleHandler(ManagementHandler):
    """MindIE's role assignment (see `roles.py`): 200 `{"result": "ok"}`, or its busy answer
    while a switch is under way, which its controller retries."""

    async def post(self, role: str) -> None:
        if role not in ROLES:  # MindIE has no route for it: 404, in its envelope here
            raise RequestError(404, f"no route for /v1/role/{role}: the roles are "
                               f"{', '.join(ROLES)}")
        self.write_json({"result": self.services.roles.assign(role, parse_json(self.body))})


class DResultHandler(ManagementHandler):
    """MindIE's GET /dresult on the business plane (see `dresult.py`): a decode instance's
    results for its coordinator, as long as the connection lasts."""

    async def get(self) -> None:
        role = self.services.roles.role
        if role not in ("decode", "flex"):
            raise RequestError(400, "Non DMI does not support dresult request" if role == "none"
                               else f"Only the Decode node supports dresult but you send to "
                                    f"{role}")
        self.set_header("Content-Type", "text/event-stream")
        dresults = self.services.dresults
        stream = dresults.connect()
        try:
            async for chunk in stream.chunks():
                if not await self.write_chunk(chunk):
                    return
            self.finish()
        finally:
            dresults.disconnect(stream)


class MetricsHandler(Handler):
    """Prometheus' /metrics: the gateway's metrics, then the gRPC server's (while it answers)."""

    async def get(self) -> None:
        metrics = self.services.metrics
        try:
            server = await self.track(self.upstream.management.GetMetrics(
                sb.GetMetricsRequest(), timeout=METADATA_TIMEOUT_S))
        except grpc.aio.AioRpcError as error:
            logger.warning("/metrics: the server's metrics are missing: %s %s",
                           error.code().name, error.details())
            metrics.upstream_up.set(0)
            server_text = ""
        else:
            metrics.upstream_up.set(1)
            server_text = server.text
        self.set_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
        self.finish(metrics.exposition() + server_text)
