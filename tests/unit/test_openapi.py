"""The OpenAPI document (gateway/openapi.py) against the route table and the server's ranges:
every route pattern and every method its handler implements is described, nothing else is;
the document is well-formed OpenAPI 3.0.3 (checked by hand: openapi-spec-validator is not a
dependency); the request parameters' ranges are those the server publishes from the engine's
validation, and follow them when they change; the request bodies' fields are the translators'.
Fuzzing it against the real gateway is tests/peers/test_openapi_contract.py."""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Iterator
from types import SimpleNamespace

import pytest
import tornado.web

from switchboard.engine import validation
from switchboard.engine.config import EngineLimits
from switchboard.gateway import openapi
from switchboard.gateway.app import ROUTES, make_app
from switchboard.gateway.config import Plane
from switchboard.gateway.handler import PublishedLimits
from switchboard.gateway.protocols import openai, tgi, vllm
from switchboard.proto import generation_fields
from switchboard.proto import switchboard_pb2 as sb
from switchboard.server.model_info import parameter_limits_pb

ALL_ROUTES = [openapi.Route(plane.value, pattern, handler, name)
              for plane, rules in ROUTES.items() for pattern, handler, name in rules]
# A server configured below the engine's most sequences (maxBestOf), as an operator may.
ENGINE_LIMITS = EngineLimits(vocab_size=100, max_seq_len=64, max_input_len=63,
                             max_iter_times=32, max_token_bytes=8, max_best_of=4)
ENGINE_TABLE = validation.parameter_limits(ENGINE_LIMITS)
# What the server publishes (GetParameterLimits) for that engine.
PUBLISHED = parameter_limits_pb(SimpleNamespace(limits=ENGINE_LIMITS)).parameters
DOCUMENT = openapi.document(ALL_ROUTES, PUBLISHED)
SCHEMAS = DOCUMENT["components"]["schemas"]
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
    document = openapi.document(openapi.served_routes(application), PUBLISHED)
    assert {served, "/openapi.json"} <= set(document["paths"])
    assert elsewhere not in document["paths"]
    assert document["paths"]["/openapi.json"]["get"]["tags"][0] == plane.value


def test_a_shared_port_serves_one_document_of_both_planes() -> None:
    services = SimpleNamespace(metrics=SimpleNamespace(record=lambda handler: None))
    application = make_app([Plane.BUSINESS, Plane.MANAGEMENT], services)
    document = openapi.document(openapi.served_routes(application), PUBLISHED)
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


def assert_within(schema: dict, limits: validation.ParameterLimits) -> None:
    """`schema` accepts what the engine's `limits` accept (a number's interval; a list's item
    counts; its strings' length), and nothing else of its type."""
    if limits.interval is not None:
        interval = limits.interval
        if schema["type"] == "integer":
            assert schema["minimum"] == interval.low
            assert schema["maximum"] == min(interval.high, generation_fields.UINT64_RANGE[-1])
        else:
            assert schema["type"] == "number"
            assert (schema["minimum"], schema.get("exclusiveMinimum", False)) == (
                interval.low, interval.low_open)
            assert schema.get("maximum", math.inf) == interval.high
            assert schema.get("exclusiveMaximum", False) == (
                interval.high_open and not math.isinf(interval.high))
    lists = [schema] if schema.get("type") == "array" else [
        alternative for alternative in schema.get("oneOf", []) if alternative["type"] == "array"]
    for listed in lists:
        assert listed.get("minItems", 0) == limits.min_items
        assert listed.get("maxItems") == limits.max_items
        assert listed["items"].get("minLength", 0) == limits.min_length


@pytest.mark.parametrize("name", sorted(openapi.mindie_parameters(PUBLISHED)))
def test_request_parameters_are_within_what_the_engine_accepts(name: str) -> None:
    schema = openapi.mindie_parameters(PUBLISHED)[name]
    if name in generation_fields.MINDIE_IGNORED_FLAGS:
        assert schema["type"] == "boolean"
        return
    if name == generation_fields.MINDIE_IGNORED_COUNT:
        assert (schema["type"], schema["minimum"]) == ("integer", 1)
        return
    assert name in validation.SUPPORTED_PARAMS
    assert name not in generation_fields.UNCARRIED | generation_fields.SINGLE_SEQUENCE
    if name == "seed":
        # MindIE's seeds are positive.
        assert (schema["minimum"], schema["maximum"]) == (
            generation_fields.MINDIE_MIN_SEED, validation.UINT64_MAX)
    elif name in ("logit_bias", "guided_json"):
        # KServe's parameters carry them as their JSON text.
        assert schema["type"] == "string"
    elif name in ENGINE_TABLE:
        assert_within(schema, ENGINE_TABLE[name])
    elif name in validation.BOOL_PARAMS:
        assert schema["type"] == "boolean"


@pytest.mark.parametrize(("schema", "fields"), [
    ("ChatCompletionRequest", openai.CHAT_FIELDS),
    ("CompletionRequest", openai.COMPLETION_FIELDS),
    ("TgiParameters", tgi.PARAMETERS),
    ("VllmRequest", vllm.SAMPLING_FIELDS | {"prompt", "stream"}),
])
def test_request_fields_are_those_the_translator_reads(schema: str, fields: frozenset[str]) -> None:
    """A field the translator reads but the document lacks would be refused by a client that
    validates against it; one the document lists but the translator refuses would be a lie."""
    assert set(SCHEMAS[schema]["properties"]) == fields


@pytest.mark.parametrize(("schema", "field", "parameter"), [
    ("TgiParameters", "best_of", "n"), ("TgiParameters", "top_n_tokens", "top_logprobs"),
    ("TgiParameters", "truncate", "truncate"), ("TgiParameters", "seed", "seed"),
    ("TgiParameters", "stop", "stop"), ("TgiParameters", "temperature", "temperature"),
    ("ChatCompletionRequest", "n", "n"), ("ChatCompletionRequest", "top_logprobs", "top_logprobs"),
    ("ChatCompletionRequest", "stop", "stop"), ("CompletionRequest", "best_of", "best_of"),
    ("CompletionRequest", "logprobs", "top_logprobs"),
    ("VllmRequest", "min_tokens", "min_new_tokens"),
    ("GenerateParameters", "max_tokens", "max_new_tokens"),
])
def test_other_protocols_fields_are_within_what_the_engine_accepts(
        schema: str, field: str, parameter: str) -> None:
    assert_within(SCHEMAS[schema]["properties"][field], ENGINE_TABLE[parameter])


def test_the_engines_table_is_the_servers_configuration() -> None:
    """n and best_of stop at this server's maxBestOf, below the engine's own most."""
    assert ENGINE_TABLE["n"].interval.high == ENGINE_TABLE["best_of"].interval.high == 4 \
        < validation.INT_RANGES["n"].high
    assert SCHEMAS["TgiParameters"]["properties"]["best_of"]["maximum"] == 4


def test_the_document_follows_what_the_server_publishes() -> None:
    """Nothing is restated: change a published limit and every protocol's field built on it
    changes with it (vLLM's temperature keeps its own low end, 0: greedy)."""
    changed = dict(PUBLISHED)
    changed["temperature"] = sb.ParameterLimits(minimum=0.5, maximum=7)
    changed["stop"] = sb.ParameterLimits(max_items=3)
    schemas = openapi.document(ALL_ROUTES, changed)["components"]["schemas"]
    temperatures = [schemas["Parameters"]["properties"]["temperature"],
                    schemas["TgiParameters"]["properties"]["temperature"],
                    schemas["ChatCompletionRequest"]["properties"]["temperature"]]
    assert [(t["minimum"], t["maximum"]) for t in temperatures] == [(0.5, 7), (0.5, 7), (0, 7)]
    stops = [schemas[name]["properties"]["stop"] for name in ("TgiParameters", "CompletionRequest")]
    assert all(alternative["maxItems"] == 3 for stop in stops for alternative in stop["oneOf"]
               if alternative.get("type") == "array")


def test_vllms_readings_are_its_own() -> None:
    """vLLM's temperature 0 (greedy), top_k -1 (no cut) and int64 seed (-1: random), which
    its translators read onto the engine's ranges (vllm_sampling)."""
    properties = SCHEMAS["VllmRequest"]["properties"]
    assert properties["temperature"]["minimum"] == 0
    assert "exclusiveMinimum" not in properties["temperature"]
    assert properties["top_k"]["minimum"] == -1
    assert (properties["seed"]["minimum"], properties["seed"]["maximum"]) == (
        -2**63, 2**63 - 1)


def test_the_gateway_asks_the_server_for_its_limits_once() -> None:
    asked = []

    async def ask() -> sb.GetParameterLimitsResponse:
        asked.append(True)
        return sb.GetParameterLimitsResponse(parameters=PUBLISHED)

    async def twice() -> tuple:
        limits = PublishedLimits()
        return await limits.get(ask), await limits.get(ask)

    first, second = asyncio.run(twice())
    assert first == second == dict(PUBLISHED)
    assert len(asked) == 1


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
