"""The gateway's Prometheus metrics, served on the metrics plane."""

from __future__ import annotations

import prometheus_client
import tornado.web
from tornado.log import access_log

REQUESTS = prometheus_client.Counter(
    "switchboard_http_requests", "HTTP requests answered by the gateway, by route and status code",
    ("plane", "route", "method", "code"))


def record(handler: tornado.web.RequestHandler) -> None:
    """Tornado's `log_function`: count each finished request and write its access log line."""
    status = handler.get_status()
    request = handler.request
    REQUESTS.labels(handler.application.settings["plane"], getattr(handler, "route", "unrouted"),
                    request.method, str(status)).inc()
    log = access_log.info if status < 400 else access_log.warning if status < 500 else access_log.error
    log("%d %s %s (%s) %.1f ms", status, request.method, request.uri, request.remote_ip,
        1000 * request.request_time())


class MetricsHandler(tornado.web.RequestHandler):
    def get(self) -> None:
        self.set_header("Content-Type", prometheus_client.CONTENT_TYPE_LATEST)
        self.finish(prometheus_client.generate_latest())
