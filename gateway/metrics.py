"""The gateway's Prometheus metrics, and the server's appended to them on the metrics plane."""

from __future__ import annotations

from collections.abc import Callable

import prometheus_client
import tornado.web
from tornado.log import access_log

DURATION_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                    120.0, 300.0, 600.0)


class GatewayMetrics:
    """`in_flight` reads how many inference requests the gateway is serving."""

    def __init__(self, in_flight: Callable[[], int]) -> None:
        self.registry = prometheus_client.CollectorRegistry()
        self._requests = prometheus_client.Counter(
            "switchboard_http_requests", "HTTP requests answered by the gateway, by route and "
            "status code", ("plane", "route", "method", "code"), registry=self.registry)
        self._durations = prometheus_client.Histogram(
            "switchboard_http_request_duration_seconds", "From a request's arrival at the gateway "
            "to the end of its answer (a whole stream for streamed answers)", ("plane", "route"),
            buckets=DURATION_BUCKETS, registry=self.registry)
        prometheus_client.Gauge(
            "switchboard_http_inference_requests_in_flight",
            "Inference requests the gateway is answering", registry=self.registry
        ).set_function(in_flight)
        self.upstream_up = prometheus_client.Gauge(
            "switchboard_upstream_up", "1 if the gRPC server answered the last scrape, else 0",
            registry=self.registry)
        prometheus_client.ProcessCollector(namespace="switchboard_gateway", registry=self.registry)

    def exposition(self) -> str:
        return prometheus_client.generate_latest(self.registry).decode()

    def record(self, handler: tornado.web.RequestHandler) -> None:
        """Tornado's `log_function`: count each finished request and write its access log line."""
        status = handler.get_status()
        request = handler.request
        plane = handler.application.settings["plane"]
        route = getattr(handler, "route", "unrouted")
        self._requests.labels(plane, route, request.method, str(status)).inc()
        self._durations.labels(plane, route).observe(request.request_time())
        log = (access_log.info if status < 400 else access_log.warning if status < 500
               else access_log.error)
        log("%d %s %s (%s) %.1f ms", status, request.method, request.uri, request.remote_ip,
            1000 * request.request_time())
