"""MindIE's prefill/decode role assignment as the gateway keeps it: its controller's body
checked as MindIE checks it, the role status switching until a peer answers, and the peers'
links as `/v1/status` reports them. Peers are real HTTP servers on loopback."""

from __future__ import annotations

import asyncio
import socket

import pytest
import tornado.httpserver
import tornado.netutil
import tornado.web

from switchboard.gateway.errors import RequestError
from switchboard.gateway.roles import BUSY, Roles

DEVICE = {"device_ip": "29.0.0.1", "device_id": "0", "device_logical_id": "0"}
LOCAL = {"server_ip": "127.0.0.1", "id": 1, "host_ip": "127.0.0.1", "device": [DEVICE]}


def peer(identifier: int, port: int) -> dict[str, object]:
    return {"server_ip": "127.0.0.1", "id": identifier, "host_ip": "127.0.0.1",
            "device": [DEVICE], "port": port}


class StatusHandler(tornado.web.RequestHandler):
    def get(self) -> None:
        self.write({"service": {"roleStatus": "RoleReady"}})


def serving_status() -> tuple[tornado.httpserver.HTTPServer, int]:
    [sock] = tornado.netutil.bind_sockets(0, "127.0.0.1", family=socket.AF_INET)
    server = tornado.httpserver.HTTPServer(tornado.web.Application([("/v1/status",
                                                                      StatusHandler)]))
    server.add_sockets([sock])
    return server, sock.getsockname()[1]


def unused_port() -> int:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        return unused.getsockname()[1]


def test_a_role_is_switching_until_a_peer_answers_then_ready_with_its_links() -> None:
    async def main() -> None:
        server, port = serving_status()
        roles = Roles(lambda: 1026, lambda: None)
        assert roles.status_json()["service"] == {"roleStatus": "RoleReady",
                                                  "currentRole": "none"}
        gone = unused_port()
        assert roles.assign("decode", {"local": LOCAL,
                                       "peers": [peer(7, port), peer(8, gone)]}) == "ok"
        assert roles.status_json() == {
            "service": {"roleStatus": "RoleSwitching", "currentRole": "decode"},
            "linkStatus": {"peers": []}}  # still linking: left out, as MindIE's
        assert roles.assign("prefill", {"local": LOCAL, "peers": [peer(7, port)]}) == BUSY
        for _ in range(100):
            await asyncio.sleep(0.02)
            if roles.status_json()["service"]["roleStatus"] == "RoleReady":
                break
        status = roles.status_json()
        assert status["service"] == {"roleStatus": "RoleReady", "currentRole": "decode"}
        [ok, failed] = status["linkStatus"]["peers"]
        assert ok == {"target": 7, "link": "ok"}
        assert failed["target"] == 8 and failed["link"].startswith("failed : ")
        await roles.close()
        server.stop()

    asyncio.run(main())


@pytest.mark.parametrize(("body", "field"), [
    ([], "the body"),
    ({"peers": []}, "local"),
    ({"local": {**LOCAL, "server_ip": "localhost"}}, "local.server_ip"),
    ({"local": {**LOCAL, "id": -1}}, "local.id"),
    ({"local": {key: value for key, value in LOCAL.items() if key != "host_ip"}}, "local"),
    ({"local": {**LOCAL, "device": [{**DEVICE, "device_id": 0}]}},
     "local.device[0].device_id"),
    ({"local": LOCAL, "peers": [{**peer(2, 1027), "port": 70000}]}, "peers[0].port"),
])
def test_a_body_mindies_validation_refuses_is_422_naming_the_field(body, field) -> None:
    roles = Roles(lambda: 1026, lambda: None)
    with pytest.raises(RequestError) as refused:
        roles.assign("prefill", body)
    assert (refused.value.status, refused.value.field) == (422, field)
    assert roles.status_json()["service"]["currentRole"] == "none"


def test_a_first_assignment_without_peers_is_503_as_mindie_answers_it() -> None:
    with pytest.raises(RequestError) as refused:
        Roles(lambda: 1026, lambda: None).assign("decode", {"local": LOCAL, "peers": []})
    assert refused.value.status == 503
