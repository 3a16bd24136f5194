"""Malformed input on every POST route of the gateway's planes (their /openapi.json), against
the real gateway and server over mutual TLS: JSON nested past Python's parser (as the body, in
a field, or inside a string parameter that the server decodes as JSON), an invalid or cut-short
gzip body, and a bounded hypothesis fuzz mixing them. Each gets a 4xx in the route's error
shape that names what is wrong; never a 5xx, an empty reply, or a Python exception's class name.
The gateway serves on afterwards.

Imports none of our packages (see gateway_clients)."""

from __future__ import annotations

import gzip
import json
import re

import pytest
from gateway_clients import MODEL, connect, request
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

DEEP = 3000  # past Python's recursion limit (1,000)
PLANES = ("business", "management")
# A Python exception's class name, which no client should ever read; MindIE's and vLLM's
# contracts name their own 404 type "NotFoundError", which is not one.
EXCEPTION_NAME = re.compile(r"\b(?!NotFoundError\b)[A-Z]\w*(Error|Exception)\b")
GENERATE = f"/v2/models/{MODEL}/generate"
FUZZ_EXAMPLES = 40
# Fields that protocols read (a string parameter, a prompt, a list, an object); a malformed
# value goes into one of them.
FIELDS = ("stop", "parameters", "messages", "prompt", "inputs", "text_input", "input",
          "logit_bias", "response_format", "tools", "sampling_parameters")


def deep_array(depth: int) -> str:
    return "[" * depth + "]" * depth


def deep_object(depth: int) -> str:
    return '{"a":' * depth + "1" + "}" * depth


@pytest.fixture(scope="module")
def post_routes(gateway, client_files) -> list[tuple[str, str]]:
    """(plane, path) of every POST route the planes' documents list with a request body, path
    parameters filled."""
    routes = []
    for plane in PLANES:
        status, document = request(gateway.url(plane), client_files, "/openapi.json")
        if status != 200:
            continue
        for path, operations in document["paths"].items():
            if "requestBody" in operations.get("post", {}):
                filled = re.sub(r"\{model(_name)?\}", MODEL, path)
                routes.append((plane, re.sub(r"\{[^}]+\}", "1", filled)))
    assert ("business", GENERATE) in routes, routes
    return routes


def post(gateway, client_files, plane: str, path: str, body: bytes,
         headers: dict[str, str] | None = None) -> tuple[int, bytes]:
    connection = connect(gateway.url(plane), client_files)
    try:
        connection.request("POST", path, body,
                           {"Content-Type": "application/json", **(headers or {})})
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def assert_not_a_server_error(status: int, reply: bytes) -> None:
    """Under 500; a refusal as `assert_refused` says (a route that reads no body may answer
    200)."""
    if status >= 400:
        assert_refused(status, reply)


def assert_refused(status: int, reply: bytes, *, naming: str | None = None) -> None:
    """A 4xx with a JSON error body, naming `naming` where given, with no exception name."""
    assert 400 <= status < 500, (status, reply[:300])
    text = reply.decode()
    assert json.loads(text), "an empty error body"
    assert not EXCEPTION_NAME.search(text), text[:300]
    assert "internal error" not in text
    if naming is not None:
        assert naming in text, text[:300]


def assert_still_serves(gateway, client_files) -> None:
    status, reply = request(gateway.url("business"), client_files, GENERATE,
                            {"text_input": "Hi", "parameters": {"max_new_tokens": 1}})
    assert status == 200, reply


@pytest.mark.parametrize("value", [deep_array(DEEP), "[" * DEEP, deep_object(DEEP)])
def test_deep_json_inside_a_string_parameter_is_400_naming_it(gateway, client_files,
                                                              value) -> None:
    """Through the gateway to the server's KServe codec, which reads `stop` as JSON when it
    starts with '[': 500 "internal error" (the server's RecursionError) before."""
    body = json.dumps({"text_input": "Hi", "parameters": {"max_new_tokens": 1, "stop": value}})
    status, reply = post(gateway, client_files, "business", GENERATE, body.encode())
    if value.startswith("{"):  # not read as JSON: a stop string like any other
        assert status == 200, reply[:300]
        return
    assert_refused(status, reply, naming="stop")
    assert_still_serves(gateway, client_files)


def test_deep_json_bodies_and_fields_are_4xx_on_every_route(gateway, client_files,
                                                            post_routes) -> None:
    for plane, path in post_routes:
        for body in (deep_array(DEEP), deep_object(DEEP),
                     *(f'{{"{field}": {deep_array(DEEP)}}}' for field in ("messages", "parameters"))):
            assert_not_a_server_error(*post(gateway, client_files, plane, path, body.encode()))
    assert_still_serves(gateway, client_files)


@pytest.mark.parametrize("body", [b"this is not gzip", gzip.compress(b'{"text_input": "Hi"}')[:-6]],
                         ids=["not gzip", "cut short"])
def test_a_body_that_is_not_its_content_encoding_is_400_on_every_route(
        gateway, client_files, post_routes, body) -> None:
    """An empty reply before (the decoder's error ended the connection)."""
    for plane, path in post_routes:
        status, reply = post(gateway, client_files, plane, path, body,
                             {"Content-Encoding": "gzip"})
        assert_refused(status, reply, naming="gzip")
    assert_still_serves(gateway, client_files)


def malformed_value(depth: int, kind: str) -> object:
    """A JSON text for a field: deep JSON as a value, or inside a string."""
    return {"array": deep_array(depth), "object": deep_object(depth),
            "string": json.dumps("[" * depth), "huge int": "9" * 5000,
            "surrogate": '"\\ud800"'}[kind]


@st.composite
def malformed_requests(draw, routes: list[tuple[str, str]]) -> tuple[str, str, bytes, dict]:
    plane, path = draw(st.sampled_from(routes))
    fields = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3, unique=True))
    depth = draw(st.integers(min_value=990, max_value=5000))
    kinds = ["array", "object", "string", "huge int", "surrogate"]
    members = [f'"{field}": {malformed_value(depth, draw(st.sampled_from(kinds)))}'
               for field in fields]
    body = ("{" + ", ".join([*members, '"max_tokens": 1', '"max_new_tokens": 1']) + "}").encode()
    headers = {}
    coding = draw(st.sampled_from(["identity", "gzip", "not gzip"]))
    if coding == "gzip":
        body, headers = gzip.compress(body), {"Content-Encoding": "gzip"}
    elif coding == "not gzip":
        body, headers = draw(st.binary(min_size=1, max_size=64)), {"Content-Encoding": "gzip"}
    return plane, path, body, headers


def test_a_fuzz_of_malformed_bodies_over_every_route_never_gets_a_server_error(
        gateway, client_files, post_routes) -> None:
    @settings(max_examples=FUZZ_EXAMPLES, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(malformed_requests(post_routes))
    def fuzz(case: tuple[str, str, bytes, dict]) -> None:
        plane, path, body, headers = case
        assert_not_a_server_error(*post(gateway, client_files, plane, path, body, headers))

    fuzz()
    assert_still_serves(gateway, client_files)
