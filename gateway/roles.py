"""MindIE's prefill/decode roles (`POST /v1/role/{role}`, its "DMI" mode), kept by the
gateway: the role its controller assigned, the instance's peers (the instances of the other
role), the state of the links to them, and the role status `/v1/status` reports.

As MindIE's, an assignment is answered at once and the role status is RoleSwitching until the
links have been checked: RoleReady once one peer answers, re-checked every LINK_CHECK_S while
none does. A link here is the peer gateway's management plane answering `/v1/status` to this
gateway's own certificate (MindIE links devices; a Switchboard pair moves KV caches between
its servers, see docs/prefill-decode.md).
"""

from __future__ import annotations

import asyncio
import enum
import ipaddress
import json
import logging
import ssl
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from switchboard.gateway.errors import RequestError

logger = logging.getLogger(__name__)

ROLES = ("prefill", "decode", "flex")
NO_ROLE = "none"
LINK_CHECK_S = 10.0  # MindIE's query thread's period
LINK_TIMEOUT_S = 5.0
BUSY = "Can't assign DMI role because status is switching."
# MindIE's bodies for a refused assignment.
INVALID_BODY = "Req body converts to json fail. Reset to previous node status."
UPDATE_FAILED = "Update pd info failed. Reset to previous node status."


class RoleStatus(enum.Enum):
    READY = "RoleReady"
    SWITCHING = "RoleSwitching"
    UNKNOWN = "RoleUnknown"


@dataclass(frozen=True, slots=True)
class Peer:
    """An instance of the other role: MindIE's `id` and `server_ip`, and the port of its
    gateway's management plane (Switchboard's `port`, else this gateway's own: MindIE's
    inter-instance port is one setting for every instance)."""

    id: int
    host: str
    port: int

    def status_url(self, scheme: str) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{scheme}://{host}:{self.port}/v1/status"


class Roles:
    def __init__(self, own_port: Callable[[], int],
                 client_tls: Callable[[], ssl.SSLContext | None], role: str = NO_ROLE) -> None:
        """own_port: this gateway's management port (a peer's by default); client_tls: the
        context this gateway reaches its peers' management planes with (None: they speak
        plain HTTP, as this one does); role: the role from the start, without peers (a
        prefill instance needs none: each request names its decode instance)."""
        self.role = role
        self.status = RoleStatus.READY  # as MindIE reports an instance outside DMI mode
        self._own_port = own_port
        self._client_tls = client_tls
        self._peers: dict[int, Peer] = {}
        self._links: dict[int, str] = {}
        self._linking: asyncio.Task[None] | None = None

    def assign(self, role: str, body: object) -> str:
        """Take the role and its peers from MindIE's role body; the answer's `result`
        ("ok", or MindIE's busy answer while a switch is under way). RequestError 422 for a
        body MindIE's validation refuses, 503 for a first assignment without peers."""
        if self.status is RoleStatus.SWITCHING:
            return BUSY
        peers = self._peers_of(body)
        if self.role == NO_ROLE and not peers and role != "flex":
            raise RequestError(503, UPDATE_FAILED, "peers", "a first assignment needs peers")
        self.role, self._peers = role, {peer.id: peer for peer in peers}
        self._links = {}
        self.status = RoleStatus.SWITCHING
        if self._linking is not None:
            self._linking.cancel()
        self._linking = asyncio.ensure_future(self._link())
        logger.info("role %s assigned, peers %s", role,
                    ", ".join(f"{peer.id} ({peer.host}:{peer.port})" for peer in peers) or "none")
        return "ok"

    def status_json(self) -> dict[str, object]:
        """/v1/status's `service` and `linkStatus`; peers still being linked are left out."""
        return {"service": {"roleStatus": self.status.value, "currentRole": self.role},
                "linkStatus": {"peers": [{"target": peer, "link": link}
                                         for peer, link in sorted(self._links.items())]}}

    async def close(self) -> None:
        if self._linking is not None:
            self._linking.cancel()

    async def _link(self) -> None:
        while True:
            checks = await asyncio.gather(*(self._check(peer) for peer in self._peers.values()))
            self._links = dict(zip(self._peers, checks))
            if "ok" in checks or not self._peers:
                self.status = RoleStatus.READY
                return
            await asyncio.sleep(LINK_CHECK_S)

    async def _check(self, peer: Peer) -> str:
        context = self._client_tls()
        try:
            await AsyncHTTPClient().fetch(peer.status_url("http" if context is None else "https"),
                                          ssl_options=context, request_timeout=LINK_TIMEOUT_S)
        except HTTPClientError as error:
            return f"failed : {error.code}"
        except (OSError, ssl.SSLError) as error:
            return f"failed : {error}"
        return "ok"

    def _peers_of(self, body: object) -> list[Peer]:
        """MindIE's checks of its role body (`local` and each peer: `server_ip` an IPv4
        address, `id` an unsigned integer with `host_ip`, `device` an array); the peers."""
        if not isinstance(body, Mapping):
            raise _invalid("the body", "must be a JSON object")
        _checked_instance(body.get("local"), "local")
        peers = body.get("peers")
        if not isinstance(peers, list):
            return []
        return [self._peer(_checked_instance(peer, f"peers[{index}]"), f"peers[{index}]")
                for index, peer in enumerate(peers)]

    def _peer(self, instance: Mapping[str, object], where: str) -> Peer:
        if "id" not in instance:
            raise _invalid(f"{where}.id", "is required of a peer")
        port = instance.get("port", self._own_port())
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise _invalid(f"{where}.port",
                               f"must be a port number; got {json.dumps(port)}")
        return Peer(id=instance["id"], host=instance["server_ip"], port=port)


def _checked_instance(instance: object, where: str) -> Mapping[str, object]:
    if not isinstance(instance, Mapping):
        raise _invalid(where, "must be an object")
    _check_ipv4(instance.get("server_ip"), f"{where}.server_ip")
    if "host_ip" in instance:
        _check_ipv4(instance["host_ip"], f"{where}.host_ip")
    if ("id" in instance) != ("host_ip" in instance):
        raise _invalid(where, "gives id and host_ip together or neither")
    identifier = instance.get("id")
    if "id" in instance and (isinstance(identifier, bool) or not isinstance(identifier, int)
                             or identifier < 0):
        raise _invalid(f"{where}.id", "must be an unsigned integer")
    devices = instance.get("device")
    if not isinstance(devices, list):
        raise _invalid(f"{where}.device", "must be an array")
    for index, device in enumerate(devices):
        if not isinstance(device, Mapping):
            raise _invalid(f"{where}.device[{index}]",
                               "must be an object")
        _check_ipv4(device.get("device_ip"), f"{where}.device[{index}].device_ip")
        for name in ("device_id", "device_logical_id"):
            value = device.get(name)
            if not isinstance(value, str) or not value.isdigit():
                raise _invalid(f"{where}.device[{index}].{name}",
                                   "must be a string of digits")
    return instance


def _check_ipv4(value: object, where: str) -> None:
    try:
        ipaddress.IPv4Address(value if isinstance(value, str) else "")
    except ValueError:
        raise _invalid(where,
                           f"must be an IPv4 address; got {json.dumps(value)}") from None


def _invalid(where: str, reason: str) -> RequestError:
    """MindIE's 422, naming what its validation refused."""
    return RequestError(422, f"{where}: {reason}. {INVALID_BODY}", where, reason)
