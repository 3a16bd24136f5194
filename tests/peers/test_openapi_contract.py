"""The gateway's OpenAPI contract, fuzzed with schemathesis against the real gateway and server
(mutual TLS): for every operation of the document the business plane serves at /openapi.json,
generated requests, valid ones and invalid ones, never get a 5xx; every reply has a status the
document declares, its media type, and a body matching its schema (errors: the route's own
error shape). Afterwards the server still answers and generates.

The served document describes the API; the fuzz runs against a copy narrowed to this
deployment and to short generations (`narrowed`): the served model's name and versions, token
ids within any vocabulary, at most 8 new tokens and 2 sequences, timeouts no request here
reaches. Invalid cases may step outside those bounds where the server would accept them
anyway: `bound` brings such values back, so that no case runs long. Each operation gets
MAX_EXAMPLES cases, valid and invalid, as a pytest subtest. The tests at the end are
regressions of the bugs it found.

Imports none of our packages (see gateway_clients).
"""

from __future__ import annotations

import copy
import json

import pytest
import requests
import schemathesis
from gateway_clients import MODEL, REQUEST_TIMEOUT_S, request
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode, checks

MAX_EXAMPLES = 10
INT32_MAX = 2**31 - 1
UINT32_MAX = 2**32 - 1
# Token ids below this are in any vocabulary.
FEW_TOKEN_IDS = 1000
MAX_SEQUENCES = 128
# Fields that make a generation long, with the most the fuzz sends and the most the server
# accepts.
SMALL = {"max_new_tokens": (8, INT32_MAX), "max_tokens": (8, INT32_MAX),
         "max_completion_tokens": (8, INT32_MAX), "max_output_tokens": (8, INT32_MAX),
         "min_new_tokens": (8, INT32_MAX),
         "min_tokens": (8, INT32_MAX), "n": (2, MAX_SEQUENCES), "best_of": (2, MAX_SEQUENCES)}
# Request timeouts (seconds) at least this long: a shorter one is a 504 by design.
MIN_TIMEOUT_S = 60.0
CONTRACT_CHECKS = [checks.not_a_server_error, checks.status_code_conformance,
                   checks.content_type_conformance, checks.response_schema_conformance]


def narrowed(document: dict, versions: list[str]) -> dict:
    """A copy of `document` whose requests name the served model and its `versions`, and
    generate briefly."""
    document = copy.deepcopy(document)
    schemas = document["components"]["schemas"]
    seen: set[int] = set()

    def narrow(node: object) -> None:
        if id(node) in seen:
            return
        seen.add(id(node))
        if isinstance(node, list):
            for item in node:
                narrow(item)
        if not isinstance(node, dict):
            return
        if "$ref" in node:
            narrow(schemas[node["$ref"].rpartition("/")[2]])
            return
        if node.get("type") == "integer" and node.get("maximum") == UINT32_MAX:  # a token id
            node["maximum"] = FEW_TOKEN_IDS - 1
        properties = node.get("properties", {})
        for name, (most, _) in SMALL.items():
            if name in properties:
                properties[name] = {"type": "integer", "minimum": properties[name]["minimum"],
                                    "maximum": most}
        if "timeout" in properties:
            properties["timeout"] = {**properties["timeout"], "minimum": MIN_TIMEOUT_S,
                                     "exclusiveMinimum": False}
        if "model" in properties:
            properties["model"] = {"type": "string", "enum": [MODEL]}
        for value in node.values():
            narrow(value)

    for item in document["paths"].values():
        for operation in item.values():
            narrow(operation.get("requestBody"))
            for parameter in operation.get("parameters", []):
                values = {"model": [MODEL], "version": versions}.get(parameter["name"])
                if values:
                    parameter["schema"] = {"type": "string", "enum": values}
    # A chat completion without max_tokens runs to the end of the model's turn.
    schemas["ChatCompletionRequest"]["required"].append("max_tokens")
    return document


def bound(case: schemathesis.Case) -> None:
    """Bring back within `narrowed`'s bounds the values of an invalid case that the server
    would accept anyway (a length, a sequence count, a timeout), top-level or in
    `parameters`; values the server refuses stay refused."""
    body = case.body
    if not isinstance(body, dict):
        return
    for values in (body, body.get("parameters")):
        if not isinstance(values, dict):
            continue
        for name, (most, accepted) in SMALL.items():
            value = values.get(name)
            if isinstance(value, int) and not isinstance(value, bool) and most < value <= accepted:
                values[name] = most
        timeout = values.get("timeout")
        if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) \
                and 0 < timeout < MIN_TIMEOUT_S:
            values["timeout"] = MIN_TIMEOUT_S
    if "messages" in body and body.get("max_tokens") is None \
            and body.get("max_completion_tokens") is None:
        body["max_tokens"] = SMALL["max_tokens"][0]
    # The Responses API's body: without a most, it generates up to the server's limits.
    if "input" in body and body.get("max_output_tokens") is None:
        body["max_output_tokens"] = SMALL["max_output_tokens"][0]


def mutual_tls(client_files) -> dict[str, object]:
    """requests' arguments for the gateway's mutual TLS."""
    return {"verify": str(client_files.ca),
            "cert": (str(client_files.cert), str(client_files.key)), "timeout": REQUEST_TIMEOUT_S}


@pytest.fixture(scope="module")
def served_document(gateway, client_files) -> dict:
    response = requests.get(gateway.url("business") + "/openapi.json", **mutual_tls(client_files))
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/json"
    return response.json()


@pytest.fixture(scope="module")
def api(gateway, client_files, served_document: dict) -> schemathesis.BaseSchema:
    status, metadata = request(gateway.url("business"), client_files, f"/v2/models/{MODEL}")
    assert status == 200, metadata
    config = schemathesis.Config()
    config.projects.default.update(
        base_url=gateway.url("business"), tls_verify=str(client_files.ca),
        request_cert=str(client_files.cert), request_cert_key=str(client_files.key),
        request_timeout=REQUEST_TIMEOUT_S)
    return schemathesis.openapi.from_dict(narrowed(served_document, metadata["versions"]),
                                          config=config)


def test_the_document_lists_the_business_routes_only(served_document: dict) -> None:
    """The business plane has a server of its own here: no management or metrics route."""
    paths = served_document["paths"]
    assert {"/v2/models/{model}/generate", "/v1/chat/completions", "/infer",
            "/openapi.json"} <= set(paths)
    assert not {"/metrics", "/stopService", "/v1/status"} & set(paths)
    tags = {tag for item in paths.values() for operation in item.values()
            for tag in operation["tags"]}
    assert {"business", "kserve", "tgi", "openai", "mindie", "sagemaker"} == tags


@pytest.mark.parametrize(("plane", "served", "elsewhere"), [
    ("management", {"/stopService", "/v1/status", "/health"}, {"/metrics", "/infer"}),
    ("metrics", {"/metrics"}, {"/stopService", "/infer"}),
])
def test_a_plane_on_a_port_of_its_own_serves_its_own_document(gateway, client_files, plane: str,
                                                              served: set, elsewhere: set) -> None:
    response = requests.get(gateway.url(plane) + "/openapi.json", **mutual_tls(client_files))
    assert response.status_code == 200, response.text
    paths = set(response.json()["paths"])
    assert served | {"/openapi.json"} <= paths and not elsewhere & paths


def test_every_operation_keeps_its_contract(api: schemathesis.BaseSchema,
                                            subtests: pytest.Subtests) -> None:
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) == len(api)
    for operation in operations:
        with subtests.test(operation.label):
            fuzz(operation)


def fuzz(operation: schemathesis.APIOperation) -> None:
    """MAX_EXAMPLES cases, valid and invalid, each sent and its reply checked (not shrunk on
    failure: schemathesis reports a curl command that sends the failing case)."""
    cases = st.one_of(*(operation.as_strategy(mode) for mode in GenerationMode))

    @given(cases)
    @settings(max_examples=MAX_EXAMPLES, deadline=None, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    def send(case: schemathesis.Case) -> None:
        bound(case)
        case.call_and_validate(checks=CONTRACT_CHECKS)

    send()


def test_a_greedy_tgi_answer_with_details_keeps_its_contract(api: schemathesis.BaseSchema
                                                             ) -> None:
    """Its seed is null, as TGI's Option<u64> is where nothing was sampled: a case the fuzz
    meets only now and then."""
    case = api["/generate"]["POST"].Case(
        body={"inputs": "Hi", "parameters": {"details": True, "max_new_tokens": 2}},
        media_type="application/json")
    response = case.call_and_validate(checks=CONTRACT_CHECKS)
    assert response.json()["details"]["seed"] is None


def test_the_server_is_healthy_after_the_fuzz(gateway, client_files) -> None:
    business = gateway.url("business")
    assert request(business, client_files, "/v2/health/ready") == (200, None)
    status, reply = request(business, client_files, f"/v2/models/{MODEL}/generate",
                            {"text_input": "The capital of France is",
                             "parameters": {"max_new_tokens": 4, "do_sample": False}})
    assert status == 200, reply
    assert reply["text_output"]


# --- regressions: what the fuzz found --------------------------------------------------------

@pytest.mark.parametrize(("path", "body", "status"), [
    ("/infer", {"inputs": "Hi", "parameters": {"max_new_tokens": 2, "timeout": 1e10}}, 422),
    (f"/v2/models/{MODEL}/generate",
     {"text_input": "Hi", "parameters": {"max_new_tokens": 2, "timeout": 1e10}}, 400),
])
def test_a_huge_timeout_is_refused(gateway, client_files, path: str, body: dict,
                                   status: int) -> None:
    reply = request(gateway.url("business"), client_files, path, body)
    assert reply[0] == status, reply
    assert reply[1]["error"].startswith("timeout: must be in (0, 3600]")


def test_a_vllm_stream_is_not_labelled_json(gateway, client_files) -> None:
    """Newline-delimited JSON objects are not one JSON document."""
    response = requests.post(gateway.url("business") + "/generate",
                             json={"prompt": "Hi", "stream": True, "max_tokens": 2},
                             **mutual_tls(client_files))
    assert response.status_code == 200, response.text
    assert response.headers["Content-Type"] == "application/octet-stream"
    assert all("text" in json.loads(part) for part in response.content.split(b"\n") if part)


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/infer", "POST"), ("GET", "/v1/completions", "POST"),
    ("DELETE", f"/v2/models/{MODEL}/generate", "POST"), ("POST", "/v1/models", "GET")])
def test_a_method_a_route_does_not_take_gets_405_saying_which_it_does(
        gateway, client_files, method: str, path: str, allowed: str) -> None:
    """RFC 9110 §15.5.6: a 405 carries Allow (schemathesis flagged its absence)."""
    response = requests.request(method, gateway.url("business") + path,
                                **mutual_tls(client_files))
    assert response.status_code == 405, response.text
    assert response.headers["Allow"] == allowed


def test_mindie_infer_refuses_several_sequences(gateway, client_files) -> None:
    status, reply = request(gateway.url("business"), client_files, "/infer",
                            {"inputs": "Hi", "parameters": {"max_new_tokens": 2, "n": 2,
                                                            "do_sample": True}})
    assert (status, reply["error_type"]) == (422, "Input Validation Error"), reply
