"""The OpenAPI document (gateway/openapi.py) against the route table and the server's ranges:
every route pattern and every method its handler implements is described, nothing else is;
the document is well-formed OpenAPI 3.0.3 (checked by hand: openapi-spec-validator is not a
dependency); the request parameters' ranges are the engine's. Fuzzing it against the real
gateway is tests/peers/test_openapi_contract.py."""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import tornado.web

from switchboard.engine import validation
from switchboard.gateway import openapi
from switchboard.gateway.app import ROUTES, make_app
from switchboard.gateway.config import Plane
from switchboard.gateway.protocols import openai, tgi
from switchboard.proto import generation_fields

ALL_ROUTES = [openapi.Route(plane.value, pattern, handler, name)
              for plane, rules in ROUTES.items() for pattern, handler, name in rules]
DOCUMENT = openapi.document(ALL_ROUTES)
HTTP_METHODS = ("get", "head", "post", "delete", "patch", "put", "options")
# The Schema Object's keywords in OpenAPI 3.0.3.
SCHEMA_KEYWORDS = {
    "title", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxProperties",
    "minProperties", "required", "enum", "type", "allOf", "oneOf", "anyOf", "not", "items",
    "properties", "additionalProperties", "description", "format", "default", "nullable",
    "discriminator", "readOnly", "writeOnly", "xml", "externalDocs", "example", "deprecated",
    "$ref"}
TYPES = {"object", "array", "string", "number", "integer", "boolean"}


def implemented_methods(handler: type[tornado.web.RequestHandler]) -> set[str]:
    return {method for method in HTTP_METHODS
            if getattr(handler, method) is not getattr(tornado.web.RequestHandler, method)}


@pytest.mark.parametrize("route", ALL_ROUTES, ids=lambda route: f"{route.plane}:{route.name}")
def test_every_route_is_described_with_the_methods_its_handler_implements(
        route: openapi.Route) -> None:
    templates = openapi.path_templates(route.pattern)
    assert templates
    for template, _ in templates:
        operations = DOCUMENT["paths"][template]
        assert set(operations) == implemented_methods(route.handler), template
        for operation in operations.values():
            assert route.plane in operation["tags"]


def test_the_document_has_no_path_without_a_route() -> None:
    paths = {template for route in ALL_ROUTES
             for template, _ in openapi.path_templates(route.pattern)}
    assert set(DOCUMENT["paths"]) == paths


def test_path_templates_expand_optional_groups() -> None:
    assert openapi.path_templates(r"/v2/models/(?P<model>[\w\-.]+)(?:/versions/(?P<version>"
                                  r"[\w\-.]+))?/ready") == [
        ("/v2/models/{model}/ready", {"model": r"[\w\-.]+"}),
        ("/v2/models/{model}/versions/{version}/ready",
         {"model": r"[\w\-.]+", "version": r"[\w\-.]+"})]
    assert openapi.path_templates(r"/openapi\.json") == [("/openapi.json", {})]
    with pytest.raises(ValueError):
        openapi.path_templates(r"/items/\d+")


@pytest.mark.parametrize("plane, served, elsewhere", [
    (Plane.MANAGEMENT, "/v1/status", "/v1/chat/completions"),
    (Plane.METRICS, "/metrics", "/v1/status"),
])
def test_a_plane_on_its_own_port_serves_its_own_document(plane, served, elsewhere) -> None:
    services = SimpleNamespace(metrics=SimpleNamespace(record=lambda handler: None))
    application = make_app([plane], services)
    document = openapi.document(openapi.served_routes(application))
    assert {served, "/openapi.json"} <= set(document["paths"])
    assert elsewhere not in document["paths"]
    assert document["paths"]["/openapi.json"]["get"]["tags"][0] == plane.value


def test_a_shared_port_serves_one_document_of_both_planes() -> None:
    services = SimpleNamespace(metrics=SimpleNamespace(record=lambda handler: None))
    application = make_app([Plane.BUSINESS, Plane.MANAGEMENT], services)
    document = openapi.document(openapi.served_routes(application))
    assert {"/v1/chat/completions", "/v1/status", "/openapi.json"} <= set(document["paths"])
    assert "/metrics" not in document["paths"]
    assert document["paths"]["/health"]["get"]["tags"] == ["business", "management", "tgi"]
    assert [tag["name"] for tag in document["tags"]][:2] == ["business", "management"]


def test_errors_have_their_protocols_shape() -> None:
    responses = DOCUMENT["components"]["responses"]
    assert DOCUMENT["paths"]["/v1/chat/completions"]["post"]["responses"]["400"] == {
        "$ref": "#/components/responses/OpenAIError400"}
    assert responses["TgiError422"]["content"]["application/json"]["schema"]["allOf"][1] == {
        "type": "object", "properties": {"error_type": {"type": "string",
                                                        "enum": ["validation"]}}}
    assert DOCUMENT["paths"]["/v1/role/{role}"]["post"]["responses"]["501"] == {
        "$ref": "#/components/responses/MindIEError501"}
    assert DOCUMENT["paths"]["/v2/health/ready"]["get"]["responses"]["503"] == {
        "$ref": "#/components/responses/KServeError503"}


def test_invocations_errors_are_tgis_or_openais_as_each_answers_the_status() -> None:
    def shapes_at(status: int) -> list[str]:
        assert DOCUMENT["paths"]["/invocations"]["post"]["responses"][str(status)] == {
            "$ref": f"#/components/responses/SageMakerError{status}"}
        response = DOCUMENT["components"]["responses"][f"SageMakerError{status}"]
        narrowed = response["content"]["application/json"]["schema"]["allOf"][1]
        return [shape["allOf"][0]["$ref"].rpartition("/")[2] for shape in narrowed["oneOf"]]

    assert shapes_at(422) == shapes_at(429) == ["TgiError"]
    assert shapes_at(400) == ["OpenAIError"]
    assert shapes_at(404) == shapes_at(503) == ["TgiError", "OpenAIError"]


@pytest.mark.parametrize("name", sorted(openapi.PARAMETERS))
def test_request_parameters_have_the_engines_ranges(name: str) -> None:
    schema = openapi.PARAMETERS[name]
    if name in generation_fields.MINDIE_IGNORED_FLAGS:
        assert schema["type"] == "boolean"
        return
    if name == generation_fields.MINDIE_IGNORED_COUNT:
        assert (schema["type"], schema["minimum"]) == ("integer", 1)
        return
    assert name in validation.SUPPORTED_PARAMS
    if name in validation.INT_RANGES:
        # These are MindIE's routes' and Triton's: MindIE's seeds.
        interval = validation.INT_RANGES[name]
        if name == "seed":
            interval = dataclasses.replace(interval, low=generation_fields.MINDIE_MIN_SEED)
        assert (schema["type"], schema["minimum"], schema["maximum"]) == (
            "integer", interval.low, interval.high)
    elif name in validation.FLOAT_RANGES:
        interval = validation.FLOAT_RANGES[name]
        assert schema["type"] == "number"
        assert (schema["minimum"], schema.get("exclusiveMinimum", False)) == (
            interval.low, interval.low_open)
        assert schema.get("maximum", math.inf) == interval.high
    elif name in validation.BOOL_PARAMS:
        assert schema["type"] == "boolean"


@pytest.mark.parametrize(("schema", "fields"), [
    ("ChatCompletionRequest", openai.CHAT_FIELDS),
    ("CompletionRequest", openai.COMPLETION_FIELDS),
    ("TgiParameters", tgi.PARAMETERS),
])
def test_request_fields_are_those_the_translator_reads(schema: str, fields: frozenset[str]) -> None:
    """A field the translator reads but the document lacks would be refused by a client that
    validates against it; one the document lists but the translator refuses would be a lie."""
    assert set(openapi.REQUESTS[schema]["properties"]) == fields


def test_shared_ranges_are_the_engines() -> None:
    for schema, name in [(openapi.SEQUENCES, "n"), (openapi.SEQUENCES, "best_of"),
                         (openapi.TOP_LOGPROBS, "top_logprobs"),
                         (openapi.TRUNCATE, "truncate"), (openapi.TGI_SEED, "seed")]:
        interval = validation.INT_RANGES[name]
        assert (schema["minimum"], schema["maximum"]) == (interval.low, interval.high), name
    assert openapi.STOP["oneOf"][1]["maxItems"] == validation.MAX_STOP_SEQUENCES
    bias = validation.LOGIT_BIAS_RANGE
    assert (openapi.LOGIT_BIAS["minimum"], openapi.LOGIT_BIAS["maximum"]) == (bias.low, bias.high)


# --- OpenAPI 3.0.3 structure ------------------------------------------------------------------

def schemas_in(document: dict) -> Iterator[tuple[str, dict]]:
    """Every Schema Object of the document, with where it is."""
    def walk(schema: dict, where: str) -> Iterator[tuple[str, dict]]:
        yield where, schema
        for name, child in schema.get("properties", {}).items():
            yield from walk(child, f"{where}.{name}")
        for keyword in ("items", "not", "additionalProperties"):
            if isinstance(schema.get(keyword), dict):
                yield from walk(schema[keyword], f"{where}/{keyword}")
        for keyword in ("allOf", "oneOf", "anyOf"):
            for index, child in enumerate(schema.get(keyword, [])):
                yield from walk(child, f"{where}/{keyword}[{index}]")

    components = document["components"]
    for name, schema in components["schemas"].items():
        yield from walk(schema, name)
    media = [(f"responses.{name}", response) for name, response in components["responses"].items()]
    for path, item in document["paths"].items():
        for method, operation in item.items():
            where = f"{method} {path}"
            for parameter in operation.get("parameters", []):
                yield from walk(parameter["schema"], f"{where} {parameter['name']}")
            media += [(f"{where} {status}", response)
                      for status, response in operation["responses"].items()]
            if "requestBody" in operation:
                media.append((f"{where} body", operation["requestBody"]))
    for where, holder in media:
        for media_type, content in holder.get("content", {}).items():
            yield from walk(content["schema"], f"{where} {media_type}")


def test_the_document_is_openapi_3_0_3() -> None:
    assert DOCUMENT["openapi"] == "3.0.3"
    assert isinstance(DOCUMENT["info"]["title"], str)
    assert isinstance(DOCUMENT["info"]["version"], str)
    tags = {tag["name"] for tag in DOCUMENT["tags"]}
    operation_ids = []
    for path, item in DOCUMENT["paths"].items():
        assert path.startswith("/")
        in_path = set(re.findall(r"\{(\w+)\}", path))
        for method, operation in item.items():
            assert method in HTTP_METHODS
            operation_ids.append(operation["operationId"])
            assert set(operation["tags"]) <= tags
            assert operation["responses"]
            assert all(re.fullmatch(r"[1-5]\d\d", status) for status in operation["responses"])
            parameters = operation.get("parameters", [])
            assert {p["name"] for p in parameters} == in_path, path
            assert all(p["in"] == "path" and p["required"] is True for p in parameters)
    assert len(operation_ids) == len(set(operation_ids))


def test_every_reference_resolves() -> None:
    def references(node: object) -> Iterator[str]:
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for value in node.values():
                yield from references(value)
        elif isinstance(node, list):
            for value in node:
                yield from references(value)

    for reference in references(DOCUMENT):
        kind, _, name = reference.removeprefix("#/components/").partition("/")
        assert name in DOCUMENT["components"][kind], reference


def test_every_schema_uses_openapi_3_0_keywords_only() -> None:
    for where, schema in schemas_in(DOCUMENT):
        assert set(schema) <= SCHEMA_KEYWORDS, where
        assert schema.get("type", "object") in TYPES, where
        assert isinstance(schema.get("exclusiveMinimum", False), bool), where
        assert "$ref" not in schema or len(schema) == 1, where
        assert "nullable" not in schema or "type" in schema, where
        if "required" in schema:
            assert schema["required"], where
            assert set(schema["required"]) <= set(schema.get("properties", {})), where
        if "enum" in schema:
            assert schema["enum"], where
        for keyword in ("allOf", "oneOf", "anyOf"):
            assert schema.get(keyword, [None]), where
