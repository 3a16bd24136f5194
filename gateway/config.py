"""Gateway configuration: three planes (MindIE's business, management and metrics ports), each
with its own TLS settings, and the upstream gRPC server it transcodes to."""

from __future__ import annotations

import enum
import ssl
from dataclasses import dataclass

import grpc

from switchboard.gateway.roles import NO_ROLE, ROLES
from switchboard.proto.constants import MAX_BODY_BYTES
from switchboard.tls import TLSFiles, TLSMaterial
from switchboard.tls.plaintext import check_plaintext_host

DEFAULT_HTTP_HOST = "127.0.0.1"
DEFAULT_BUSINESS_PORT = 1025
DEFAULT_MANAGEMENT_PORT = 1026
DEFAULT_METRICS_PORT = 1027
DEFAULT_UPSTREAM = "127.0.0.1:8001"
# A body over the limit, declared up to this size, is read to its end and dropped before the
# 413: closing with a body unread resets the connection, and its client may lose the answer.
MAX_DRAINED_BODY_BYTES = 64 * 2**20
DEFAULT_MAX_CONNECTIONS = 1000  # MindIE's maxLinkNum default
# MindIE: maxLinkNum requests are served at once, 2 × maxLinkNum more wait their turn, and the
# one after is refused; here, connections beyond this many × max_connections, per plane.
CONNECTIONS_PER_LINK = 3
DEFAULT_CLIENT_TIMEOUT_S = 60.0
DEFAULT_MAX_HEADER_BYTES = 64 * 1024


class Plane(enum.Enum):
    BUSINESS = "business"
    MANAGEMENT = "management"
    METRICS = "metrics"


class TLSMode(enum.Enum):
    """`mutual` (MindIE's default) requires a client certificate signed by the CA; `server`
    encrypts without asking for one; `none` is plain HTTP, allowed on loopback only (a probe,
    a scraper or a mesh sidecar that terminates TLS itself)."""

    MUTUAL = "mutual"
    SERVER = "server"
    NONE = "none"


@dataclass(frozen=True, slots=True)
class PlaneConfig:
    plane: Plane
    host: str
    port: int
    tls_mode: TLSMode = TLSMode.MUTUAL
    tls: TLSFiles | None = None

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) \
                or not 0 <= self.port <= 65535:
            raise ValueError(f"{self.plane.value} port must be in [0, 65535]; got {self.port!r}")
        if self.tls_mode is not TLSMode.NONE and self.tls is None:
            raise ValueError(f"the {self.plane.value} plane needs TLS files for "
                             f"{self.tls_mode.value} TLS")
        if self.tls_mode is TLSMode.NONE:
            check_plaintext_host(self.host, f"plain HTTP on the {self.plane.value} plane")

    @property
    def scheme(self) -> str:
        return "http" if self.tls_mode is TLSMode.NONE else "https"

    def ssl_context(self) -> ssl.SSLContext | None:
        """TLS 1.2 at least; a client certificate required in mutual mode, refused when the
        CRLs list it or one of its issuers (each issuer of the chain needs its CRL). Reads the files each time (certificate rotation builds a new one)."""
        if self.tls_mode is TLSMode.NONE:
            return None
        assert self.tls is not None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(self.tls.ca_file))
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(str(self.tls.cert_file), str(self.tls.key_file),
                                password=self.tls.key_password)
        context.verify_mode = (ssl.CERT_REQUIRED if self.tls_mode is TLSMode.MUTUAL
                               else ssl.CERT_NONE)
        if self.tls.crl_file is not None:
            context.load_verify_locations(cafile=str(self.tls.crl_file))
            context.verify_flags |= ssl.VERIFY_CRL_CHECK_CHAIN
        return context


@dataclass(frozen=True, slots=True)
class UpstreamConfig:
    """The gRPC server, reached as a client with our own certificate (None: plaintext)."""

    target: str = DEFAULT_UPSTREAM
    tls: TLSFiles | None = None

    def __post_init__(self) -> None:
        host, _, port = self.target.rpartition(":")
        if not host or "/" in host or not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(f"upstream must be the gRPC server's HOST:PORT (no scheme, a port "
                             f"in [1, 65535]); got {self.target!r}")

    def credentials(self) -> grpc.ChannelCredentials | None:
        if self.tls is None:
            return None
        material: TLSMaterial = self.tls.load()
        return grpc.ssl_channel_credentials(root_certificates=material.ca_pem,
                                            private_key=material.key_pem,
                                            certificate_chain=material.cert_pem)


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    """Limits: `max_connections` (MindIE's maxLinkNum) inference requests forwarded at once,
    the others waiting their turn, and CONNECTIONS_PER_LINK × as many connections open per
    plane, of which `max_client_connections` from one client address (max_connections when
    None: a crowd from one address leaves two thirds of a plane to the others);
    `client_timeout_s` for a request's headers (and a TLS handshake) to arrive, for its body,
    and for an idle keep-alive connection; `max_header_bytes` for its headers. A request
    waits for its turn once its body has arrived: a slow body holds a connection, no turn."""

    planes: tuple[PlaneConfig, ...]
    upstream: UpstreamConfig
    max_body_bytes: int = MAX_BODY_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    client_timeout_s: float = DEFAULT_CLIENT_TIMEOUT_S
    max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    max_client_connections: int | None = None
    # Prefill/decode disaggregation coordinated here: the server that prefills, for
    # `upstream` to decode (None: upstream does both).
    prefill: UpstreamConfig | None = None
    # MindIE's prefill/decode role from the start, as if its controller had assigned it
    # without peers (see `roles.py`).
    role: str = NO_ROLE

    def __post_init__(self) -> None:
        if sorted(plane.plane.value for plane in self.planes) != sorted(p.value for p in Plane):
            raise ValueError("the gateway needs exactly one business, management and metrics plane")
        for plane in self.planes:
            for other in self.planes:
                if (plane.host, plane.port) == (other.host, other.port) and plane.port != 0 \
                        and (plane.tls_mode, plane.tls) != (other.tls_mode, other.tls):
                    raise ValueError(f"the {plane.plane.value} and {other.plane.value} planes share "
                                     f"{plane.host}:{plane.port} but not their TLS settings")
        for name in ("max_body_bytes", "max_connections", "client_timeout_s", "max_header_bytes",
                     "max_client_connections"):
            value = getattr(self, name)
            if name == "max_client_connections" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
                raise ValueError(f"{name} must be positive; got {value!r}")
        if self.role not in (NO_ROLE, *ROLES):
            raise ValueError(f"role must be one of {', '.join(ROLES)}; got {self.role!r}")
        if self.max_body_bytes > MAX_BODY_BYTES:
            raise ValueError(f"max_body_bytes must be at most {MAX_BODY_BYTES}: the server "
                             "takes no gRPC message a larger body could become; got "
                             f"{self.max_body_bytes}")

    @property
    def connections_per_client(self) -> int:
        return self.max_client_connections or self.max_connections

    def plane(self, plane: Plane) -> PlaneConfig:
        return next(config for config in self.planes if config.plane is plane)
