"""Property-based tests of the gateway's REST → protobuf translators (gateway/protocols).

1. Totality: for any JSON-like document, each translator returns, or refuses with a
   RequestError whose status is 4xx, whose message is not empty and whose field, when set,
   is a non-empty string; never another exception (which the gateway renders as a 500).
2. A near-valid body (a valid one with one field set to an arbitrary value, or an unknown
   key added) is refused, if at all, naming that field under the protocol's own name.
3. Round trips: valid values come out in the protobuf request unchanged.

The inputs that once crashed a translator have regression tests at the end. Strings hold
no lone surrogates: parse_json refuses them before any translator runs (Hypothesis' text
has none either).
"""

from __future__ import annotations

import copy
import json
import math
import sys
from collections.abc import Callable, Collection, Mapping

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from switchboard.gateway.errors import RequestError
from switchboard.gateway.protocols import kserve, mindie, mindie_management, openai, tgi, triton, vllm
from switchboard.gateway.protocols.parameters import (INT64_MAX, MICROSECONDS, UINT32_MAX, UINT64_MAX,
                                          parameter_value)
from switchboard.proto import generation_fields, vllm_sampling
from switchboard.proto import switchboard_pb2 as sb
from switchboard.proto.tensor_bytes import deserialize_bytes
from switchboard.proto.vllm_backend_tensors import CONTROL_INPUTS

PROPERTY = settings(max_examples=100, deadline=None, database=None)
ROUND_TRIP = settings(max_examples=40, deadline=None, database=None)

# --- strategies -----------------------------------------------------------------------------

EDGE_INTS = st.sampled_from([-1, 0, 1, 2**31, UINT32_MAX + 1, INT64_MAX, INT64_MAX + 1,
                             -INT64_MAX - 2, UINT64_MAX, UINT64_MAX + 1, 10**400, -10**400])
INTS = st.integers() | EDGE_INTS
TEXT = st.text(max_size=12)
# Field names of every protocol, so that arbitrary objects reach the translators' branches.
KNOWN_KEYS = sorted(
    (tgi.PARAMETERS - tgi.FORMAT_PARAMETERS)
    | openai.CHAT_FIELDS | openai.COMPLETION_FIELDS | vllm.SAMPLING_FIELDS
    | {"inputs", "input_id", "prompt", "parameters", "stream", "id", "text_input", "timeout",
       "priority", "skip_special_tokens", "do_decode", "name", "datatype", "shape", "data",
       "outputs", "binary_data_output", "binary_data", "binary_data_size", "role", "content",
       "type", "text", "include_usage"})
KEYS = TEXT | st.sampled_from(KNOWN_KEYS)
EDGE_FLOATS = st.sampled_from([0.0, -0.0, 5e-324, 1e303, 1.7976931348623157e308, math.inf,
                               -math.inf, math.nan])
SCALARS = st.none() | st.booleans() | INTS | st.floats() | EDGE_FLOATS | TEXT
JSON = st.recursive(SCALARS, lambda children: st.lists(children, max_size=4)
                    | st.dictionaries(KEYS, children, max_size=4), max_leaves=12)
# A replaced field's value: any JSON, with edge numbers and flat lists of numbers (token ids,
# shapes) likelier.
VALUES = st.one_of(EDGE_INTS, EDGE_FLOATS, st.lists(INTS | EDGE_FLOATS, max_size=4), JSON)

# Valid bodies, and the fields each protocol knows (where they live in the body).
TGI_BODY = {"inputs": "Hello", "parameters": {"max_new_tokens": 8, "temperature": 0.7,
                                              "stop": ["\n"], "seed": 1, "details": True}}
TGI_PARAMETERS = (tgi.PARAMETERS - tgi.FORMAT_PARAMETERS)
CHAT_BODY = {"model": "m", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 8,
             "temperature": 0.5}
COMPLETION_BODY = {"model": "m", "prompt": "Once", "max_tokens": 8}
VLLM_BODY = {"prompt": "Hi", "max_tokens": 8, "temperature": 0.5}
MINDIE_PARAMETERS = {"max_new_tokens": 8, "temperature": 0.5, "priority": 1, "timeout": 10}
MINDIE_BODY = {"inputs": "Hi", "parameters": MINDIE_PARAMETERS}
MINDIE_TOKEN_BODY = {"input_id": [1, 2], "parameters": MINDIE_PARAMETERS}
MINDIE_KNOWN = {"max_new_tokens", "temperature", "top_k", "top_p", "typical_p", "seed", "stop",
                "do_sample", "repetition_penalty", "watermark", "details", "priority", "timeout",
                "skip_special_tokens"}
TRITON_BODY = {"id": "r1", "text_input": "Hi", "parameters": {"max_new_tokens": 8}}
KSERVE_BODY = {"id": "r1", "inputs": [{"name": "x", "datatype": "INT32", "shape": [2],
                                       "data": [1, 2]}],
               "outputs": [{"name": "y", "parameters": {"binary_data": True}}],
               "parameters": {"binary_data_output": False}}


@st.composite
def near_valid(draw: st.DrawFn, body: Mapping[str, object], fields: frozenset[str] | set[str],
               where: tuple[object, ...] = ()) -> tuple[dict[str, object], str]:
    """`body` with one key of the object at path `where` (one of `fields`, or any other) set
    to an arbitrary JSON value; returns the document and the key."""
    name = draw(st.sampled_from(sorted(fields)) | KEYS)
    document = copy.deepcopy(dict(body))
    target = document
    for step in where:
        target = target[step]
    target[name] = draw(VALUES)
    return document, name


def documents(body: Mapping[str, object], *places: tuple[set[str] | frozenset[str],
                                                         tuple[object, ...]]
              ) -> st.SearchStrategy[object]:
    """Arbitrary JSON, or `body` near-valid at one of `places` ((fields, where) pairs)."""
    return JSON | st.one_of(*(near_valid(body, fields, where).map(lambda pair: pair[0])
                              for fields, where in places))


# --- helpers --------------------------------------------------------------------------------

def outcome(translate: Callable[..., object], *args: object) -> RequestError | None:
    """Run `translate`; None when it returns, the error when it refuses well (a 4xx with a
    message, and a non-empty field if any). Any other exception propagates."""
    try:
        translate(*args)
    except RequestError as error:
        assert 400 <= error.status <= 499, error.status
        assert isinstance(error.message, str) and error.message
        assert error.field is None or (isinstance(error.field, str) and error.field)
        return error
    return None


def assert_names(error: RequestError | None, name: str) -> None:
    """The refusal, if any, is about `name` (or a part of it, `name[0]`, `name.x`)."""
    if error is None:
        return
    assert error.field == name or error.field.startswith((f"{name}[", f"{name}.")), \
        (error.field, name)
    assert error.message.startswith(f"{error.field}: "), error.message


def refusal_of_known_fields_only(translate: Callable[[object], object],
                                 case: tuple[dict[str, object], str],
                                 known: Collection[str]) -> RequestError | None:
    """Translate the case's document: a refusal names the changed field, and a field outside
    `known` is refused."""
    document, name = case
    assume(name)
    error = outcome(translate, document)
    assert_names(error, name)
    if name not in known:
        assert error is not None, "an unknown field is refused"
    return error


def decoded(request: object) -> dict[str, object]:
    """A request's parameters as plain values."""
    if isinstance(request, sb.GenerateRequest):
        return generation_fields.requested_values(request)
    values = {name: parameter_value(value) for name, value in request.parameters.items()}
    if "stop" in values:
        values["stop"] = json.loads(values["stop"])
    return values


# --- the valid bodies are valid -------------------------------------------------------------

@pytest.mark.parametrize(("translate", "args"), [
    (tgi.generate_request_to_pb, (TGI_BODY, False)),
    (openai.chat_request_to_pb, (CHAT_BODY,)),
    (openai.completion_request_to_pb, (COMPLETION_BODY,)),
    (vllm.generate_request_to_pb, (VLLM_BODY,)),
    (mindie.infer_request_to_pb, (MINDIE_BODY, False)),
    (mindie.infer_request_to_pb, (MINDIE_TOKEN_BODY, True)),
    (triton.generate_request_to_pb, ("m", "", TRITON_BODY, False)),
    (kserve.infer_request_to_pb, ("m", "", KSERVE_BODY, b"")),
], ids=["tgi", "chat", "completion", "vllm", "mindie", "mindie-tokens", "triton", "kserve"])
def test_the_near_valid_bodies_start_from_valid_ones(translate: Callable[..., object],
                                                     args: tuple[object, ...]) -> None:
    assert outcome(translate, *args) is None


# --- 1. totality ----------------------------------------------------------------------------

@PROPERTY
@given(document=documents(TGI_BODY, (TGI_PARAMETERS, ("parameters",)),
                          ({"inputs", "stream"}, ())),
       stream=st.sampled_from([None, False, True]))
def test_tgi_is_total(document: object, stream: bool | None) -> None:
    outcome(tgi.generate_request_to_pb, document, stream)


@PROPERTY
@given(document=documents(CHAT_BODY, (openai.CHAT_FIELDS, ()),
                          ({"role", "content"}, ("messages", 0))))
def test_openai_chat_is_total(document: object) -> None:
    outcome(openai.chat_request_to_pb, document)


@PROPERTY
@given(document=documents(COMPLETION_BODY, (openai.COMPLETION_FIELDS, ())))
def test_openai_completion_is_total(document: object) -> None:
    outcome(openai.completion_request_to_pb, document)


@PROPERTY
@given(document=documents(VLLM_BODY, (vllm.SAMPLING_FIELDS | {"prompt", "stream"}, ())))
def test_vllm_is_total(document: object) -> None:
    outcome(vllm.generate_request_to_pb, document)


@PROPERTY
@given(data=st.data(), tokens=st.booleans())
def test_mindie_infer_is_total(data: st.DataObject, tokens: bool) -> None:
    body = MINDIE_TOKEN_BODY if tokens else MINDIE_BODY
    document = data.draw(documents(body, (MINDIE_KNOWN, ("parameters",)),
                                   ({"inputs", "input_id", "stream", "id", "parameters"}, ())))
    outcome(mindie.infer_request_to_pb, document, tokens)


@PROPERTY
@given(document=documents({"inputs": "Hi", "do_decode": True}, ({"inputs", "do_decode"}, ())))
def test_mindie_tokenize_is_total(document: object) -> None:
    outcome(mindie.tokenize_request_to_pb, document)


@PROPERTY
@given(document=documents(TRITON_BODY,
                          (MINDIE_KNOWN | {"perf_stat", *CONTROL_INPUTS}, ("parameters",)),
                          (MINDIE_KNOWN | {"id", "text_input", "parameters", "perf_stat",
                                           *CONTROL_INPUTS}, ())),
       route_streams=st.booleans())
def test_triton_generate_is_total(document: object, route_streams: bool) -> None:
    """With the vLLM backend interface's inputs, whose fields become tensors, too."""
    outcome(triton.generate_request_to_pb, "m", "", document, route_streams)


@pytest.mark.filterwarnings("ignore:overflow encountered in cast:RuntimeWarning")
@PROPERTY
@given(document=documents(KSERVE_BODY, ({"id", "parameters", "inputs", "outputs"}, ()),
                          ({"name", "datatype", "shape", "data", "parameters"}, ("inputs", 0)),
                          ({"binary_data_output", "timeout", "priority"}, ("parameters",)),
                          ({"name", "parameters"}, ("outputs", 0)))
       | st.builds(lambda datatype, data: {"inputs": [{"name": "x", "datatype": datatype,
                                                       "shape": [1], "data": data}]},
                   st.sampled_from([*kserve.NUMPY_TYPES, "BYTES"]), JSON),
       binary=st.binary(max_size=8))
def test_kserve_infer_is_total(document: object, binary: bytes) -> None:
    """Numeric data beyond a datatype's range (1e300 as FP16) becomes inf, as numpy casts."""
    outcome(kserve.infer_request_to_pb, "m", "", document, binary)


@PROPERTY
@given(body=st.binary(max_size=64) | JSON.map(lambda value: json.dumps(value).encode()))
def test_parse_json_is_total(body: bytes) -> None:
    error = outcome(kserve.parse_json, body)
    assert error is None or error.status == 400


@PROPERTY
@given(value=JSON, ensure_ascii=st.booleans())
def test_parse_json_reads_back_what_json_dumps_writes(value: object, ensure_ascii: bool) -> None:
    """Compared as JSON text: NaN is not equal to itself."""
    body = json.dumps(value, ensure_ascii=ensure_ascii).encode()
    assert json.dumps(kserve.parse_json(body)) == json.dumps(value)


@PROPERTY
@given(body=st.binary(max_size=32),
       header_length=st.none() | TEXT | INTS.map(str) | st.integers(-2, 40).map(str))
def test_split_body_is_total(body: bytes, header_length: str | None) -> None:
    outcome(kserve.split_body, body, header_length)


@PROPERTY
@given(seconds=st.none() | st.text(max_size=8) | st.integers(-5, 700).map(str)
       | st.text("0123456789", min_size=1, max_size=30))
def test_health_timeout_is_an_integer_in_range_or_a_404(seconds: str | None) -> None:
    try:
        value = mindie_management.health_timeout(seconds)
    except RequestError as error:
        assert error.status == 404 and error.message
        assert not (seconds.isascii() and seconds.isdigit() and 1 <= int(seconds) <= 600)
    else:
        assert value == (10 if seconds is None else int(seconds))
        assert 1 <= value <= 600


# --- 2. errors name the protocol's field ----------------------------------------------------

@PROPERTY
@given(case=near_valid(TGI_BODY, TGI_PARAMETERS, ("parameters",)), stream=st.booleans())
def test_tgi_refusals_name_the_parameter(case: tuple[dict[str, object], str],
                                         stream: bool) -> None:
    refusal_of_known_fields_only(lambda document: tgi.generate_request_to_pb(document, stream),
                                 case, TGI_PARAMETERS)


@PROPERTY
@given(case=near_valid(CHAT_BODY, openai.CHAT_FIELDS))
def test_openai_chat_refusals_name_the_field(case: tuple[dict[str, object], str]) -> None:
    error = refusal_of_known_fields_only(openai.chat_request_to_pb, case, openai.CHAT_FIELDS)
    if case[1] in openai.IGNORED_FIELDS:
        assert error is None


@PROPERTY
@given(case=near_valid(COMPLETION_BODY, openai.COMPLETION_FIELDS - {"prompt"}))
def test_openai_completion_refusals_name_the_field(case: tuple[dict[str, object], str]) -> None:
    refusal_of_known_fields_only(openai.completion_request_to_pb, case, openai.COMPLETION_FIELDS)


@PROPERTY
@given(case=near_valid(VLLM_BODY, vllm.SAMPLING_FIELDS | {"prompt", "stream"}))
def test_vllm_refusals_name_the_field(case: tuple[dict[str, object], str]) -> None:
    refusal_of_known_fields_only(vllm.generate_request_to_pb, case,
                                 vllm.SAMPLING_FIELDS | {"prompt", "stream"})


@PROPERTY
@given(case=near_valid(MINDIE_BODY, MINDIE_KNOWN, ("parameters",))
       | near_valid(MINDIE_BODY, {"inputs", "stream", "id"}))
def test_mindie_refusals_name_the_field(case: tuple[dict[str, object], str]) -> None:
    """Parameters travel under their own names: unknown ones are the server's to refuse."""
    document, name = case
    assume(name and name != "parameters")
    assert_names(outcome(mindie.infer_request_to_pb, document, False), name)


# --- 3. round trips -------------------------------------------------------------------------

SEEDS = st.integers(0, UINT64_MAX)  # TGI's u64
MINDIE_SEEDS = st.integers(1, UINT64_MAX)
# vLLM's and OpenAI's int64 but -1 (random), sent as its two's complement.
INT64_SEEDS = st.integers(-INT64_MAX - 1, INT64_MAX).filter(lambda seed: seed != -1)
STOPS = st.lists(TEXT, max_size=4) | TEXT
FINITE = st.floats(allow_nan=False, allow_infinity=False)
NON_NEGATIVE = st.floats(min_value=0, allow_infinity=False)


def _as_list(stop: list[str] | str) -> list[str]:
    return [stop] if isinstance(stop, str) else stop


def _stops(stop: list[str] | str) -> dict[str, list[str]]:
    """`stop` as a typed request carries it: a list, absent when empty."""
    return {"stop": _as_list(stop)} if _as_list(stop) else {}


@ROUND_TRIP
@given(inputs=TEXT, temperature=FINITE, max_new_tokens=st.integers(1, 2**31 - 1), seed=SEEDS,
       stop=STOPS, best_of=st.integers(1, 4), top_n_tokens=st.integers(0, 5),
       details=st.booleans(), return_full_text=st.booleans())
def test_tgi_parameters_round_trip(inputs: str, temperature: float, max_new_tokens: int,
                                   seed: int, stop: list[str] | str, best_of: int,
                                   top_n_tokens: int, details: bool,
                                   return_full_text: bool) -> None:
    seeded = {"seed": seed} if best_of == 1 else {}  # TGI: no seed with best_of > 1
    parameters = {"temperature": temperature, "max_new_tokens": max_new_tokens, **seeded,
                  "stop": stop, "best_of": best_of, "top_n_tokens": top_n_tokens,
                  "details": details, "return_full_text": return_full_text}
    request, options = tgi.generate_request_to_pb({"inputs": inputs, "parameters": parameters},
                                                  False)
    assert request.text == inputs
    assert decoded(request) == {"temperature": temperature, "max_new_tokens": max_new_tokens,
                                **seeded, **_stops(stop), "n": best_of,
                                "top_logprobs": top_n_tokens, "logprobs": True}
    assert (options.best_of, options.top_n_tokens, options.details,
            options.return_full_text, options.inputs) == (best_of, top_n_tokens, details,
                                                          return_full_text, inputs)


@ROUND_TRIP
@given(inputs=TEXT, request_id=TEXT, temperature=FINITE, max_new_tokens=st.integers(1, 2**31 - 1),
       seed=MINDIE_SEEDS, stop=STOPS, priority=st.integers(1, 5),
       timeout=st.floats(0, 3600, exclude_min=True) | st.integers(1, 3600),
       stream=st.booleans(), details=st.booleans())
def test_mindie_parameters_round_trip(inputs: str, request_id: str, temperature: float,
                                      max_new_tokens: int, seed: int, stop: list[str] | str,
                                      priority: int, timeout: float, stream: bool,
                                      details: bool) -> None:
    parameters = {"temperature": temperature, "max_new_tokens": max_new_tokens, "seed": seed,
                  "stop": stop, "priority": priority, "timeout": timeout, "details": details}
    request, streamed, detailed = mindie.infer_request_to_pb(
        {"id": request_id, "inputs": inputs, "stream": stream, "parameters": parameters}, False)
    assert (request.text, request.id, streamed, detailed) == (inputs, request_id, stream, details)
    # details shapes MindIE's reply; an empty stop list is no stop list.
    carried = {name: value for name, value in parameters.items() if name not in ("details", "stop")}
    assert decoded(request) == {**carried, **_stops(stop)}


@ROUND_TRIP
@given(ids=st.lists(st.integers(0, UINT32_MAX), max_size=8))
def test_mindie_token_ids_round_trip(ids: list[int]) -> None:
    request, *_ = mindie.infer_request_to_pb({"input_id": ids}, True)
    assert list(request.token_ids.ids) == ids and not decoded(request)


@ROUND_TRIP
@given(model=TEXT, messages=st.lists(st.fixed_dictionaries({"role": TEXT, "content": TEXT}),
                                     max_size=3),
       temperature=st.none() | st.just(0) | NON_NEGATIVE,
       max_tokens=st.none() | st.integers(1, 2**31), seed=INT64_SEEDS, stop=STOPS,
       logprobs=st.booleans(), n=st.integers(1, 4))
def test_openai_chat_round_trip(model: str, messages: list[dict[str, str]],
                                temperature: float | None, max_tokens: int | None, seed: int,
                                stop: list[str] | str, logprobs: bool, n: int) -> None:
    calls, options = openai.chat_request_to_pb(
        {"model": model, "messages": messages, "temperature": temperature,
         "max_tokens": max_tokens, "seed": seed, "stop": stop, "logprobs": logprobs, "n": n})
    [call] = calls
    assert call.request.model_name == model == options.model
    assert [{"role": m.role, "content": m.content} for m in call.request.messages.messages] \
        == messages
    expected = {"max_new_tokens": openai.UNLIMITED if max_tokens is None else max_tokens,
                "seed": seed % 2**64, **_stops(stop), "logprobs": logprobs, "n": n}
    expected["do_sample"] = temperature != 0
    if temperature:
        expected["temperature"] = temperature
    assert decoded(call.request) == expected
    assert (options.n, options.logprobs) == (n, logprobs)


@ROUND_TRIP
@given(prompts=st.lists(TEXT | st.lists(st.integers(0, UINT32_MAX), min_size=1, max_size=4),
                        min_size=1, max_size=3),
       max_tokens=st.none() | st.integers(1, 2**31))
def test_openai_completion_prompts_round_trip(prompts: list[str | list[int]],
                                              max_tokens: int | None) -> None:
    calls, _ = openai.completion_request_to_pb({"prompt": prompts, "max_tokens": max_tokens})
    assert [call.request.text if isinstance(prompt, str) else list(call.request.token_ids.ids)
            for call, prompt in zip(calls, prompts, strict=True)] == prompts
    assert [call.prompt_text for call in calls] == \
        [prompt if isinstance(prompt, str) else None for prompt in prompts]
    for call in calls:
        assert decoded(call.request)["max_new_tokens"] == \
            (openai.COMPLETION_DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens)


@ROUND_TRIP
@given(prompt=TEXT, temperature=st.just(0) | NON_NEGATIVE, top_k=st.integers(-1, 100),
       max_tokens=st.none() | st.integers(1, 2**31), seed=INT64_SEEDS, stop=STOPS,
       stream=st.booleans())
def test_vllm_round_trip(prompt: str, temperature: float, top_k: int, max_tokens: int | None,
                         seed: int, stop: list[str] | str, stream: bool) -> None:
    request, echoed, streamed = vllm.generate_request_to_pb(
        {"prompt": prompt, "temperature": temperature, "top_k": top_k, "max_tokens": max_tokens,
         "seed": seed, "stop": stop, "stream": stream})
    assert (request.text, echoed, streamed) == (prompt, prompt, stream)
    expected = {"top_k": 0 if top_k == -1 else top_k, "seed": seed % 2**64,
                **_stops(stop),
                "max_new_tokens": vllm_sampling.DEFAULT_MAX_TOKENS if max_tokens is None else max_tokens,
                "do_sample": temperature != 0}
    if temperature != 0:
        expected["temperature"] = temperature
    assert decoded(request) == expected


@ROUND_TRIP
@given(text=TEXT, request_id=TEXT, parameters=st.dictionaries(
    st.sampled_from(["max_new_tokens", "top_k", "seed", "temperature", "top_p", "do_sample"]),
    st.booleans() | st.integers(-INT64_MAX - 1, UINT64_MAX) | FINITE | TEXT),
       details=st.booleans())
def test_triton_generate_round_trip(text: str, request_id: str, parameters: dict[str, object],
                                    details: bool) -> None:
    """MindIE's parameters go through as they are (KServe's greedy 0s are read on the way:
    test_gateway_protocols has them)."""
    assume(not any(parameters.get(name) == 0 and not isinstance(parameters[name], bool)
                   for name in triton.GREEDY_AT_ZERO))
    request, options = triton.generate_request_to_pb(
        "m", "1", {"id": request_id, "text_input": text, "details": details,
                   "parameters": parameters}, False)
    assert (request.model_name, request.model_version, request.id) == ("m", "1", request_id)
    assert deserialize_bytes(request.raw_input_contents[0]) == [text.encode()]
    assert decoded(request) == {**parameters, "details": details}
    assert (options.details, options.perf_stat) == (details, False)


KSERVE_DATA = {
    "INT64": st.integers(-INT64_MAX - 1, INT64_MAX),
    "UINT8": st.integers(0, 255),
    "FP64": st.floats(allow_nan=False),
    "BOOL": st.booleans(),
}


@ROUND_TRIP
@given(data=st.data(), datatype=st.sampled_from(sorted(KSERVE_DATA)))
def test_kserve_tensor_data_round_trips(data: st.DataObject, datatype: str) -> None:
    values = data.draw(st.lists(KSERVE_DATA[datatype], max_size=6))
    request, _ = kserve.infer_request_to_pb("m", "", {"inputs": [
        {"name": "x", "datatype": datatype, "shape": [len(values)], "data": values}]}, b"")
    dtype = np.dtype(kserve.NUMPY_TYPES[datatype])
    assert np.frombuffer(request.raw_input_contents[0], dtype).tolist() == values


@ROUND_TRIP
@given(values=st.lists(TEXT, max_size=4))
def test_kserve_bytes_data_round_trips(values: list[str]) -> None:
    request, _ = kserve.infer_request_to_pb("m", "", {"inputs": [
        {"name": "x", "datatype": "BYTES", "shape": [len(values)], "data": values}]}, b"")
    assert deserialize_bytes(request.raw_input_contents[0]) == [v.encode() for v in values]


# --- regressions ------------------------------------------------------------------------------
# Inputs that once raised something other than RequestError (a 500 where a 4xx is due), or
# were refused under a field name the client never sent.

@pytest.mark.parametrize(("translate", "args", "field"), [
    (mindie.infer_request_to_pb, ({"input_id": [-1]}, True), "input_id"),
    (mindie.infer_request_to_pb, ({"input_id": [2**32]}, True), "input_id"),
    (openai.completion_request_to_pb, ({"prompt": [[1], [-1]]},), "prompt"),
    (kserve.infer_request_to_pb, ("m", "", {"inputs": [
        {"name": "x", "datatype": "INT32", "shape": [2**63], "data": [1]}]}, b""), "x.shape"),
    (kserve.infer_request_to_pb, ("m", "", {"inputs": [
        {"name": "x", "datatype": "FP32", "shape": [1], "data": [10**400]}]}, b""), "x"),
], ids=["mindie-input_id-negative", "mindie-input_id-2**32", "completion-prompt-ids",
        "kserve-shape-2**63", "kserve-fp32-10**400"])
def test_values_beyond_the_wire_types_are_a_400_naming_the_field(
        translate: Callable[..., object], args: tuple[object, ...], field: str) -> None:
    error = outcome(translate, *args)
    assert error is not None and (error.status, error.field) == (400, field)


@pytest.mark.parametrize(("translate", "args"), [
    (mindie.infer_request_to_pb, ({"inputs": "x", "parameters": {"timeout": 1e303}}, False)),
    (mindie.infer_request_to_pb, ({"inputs": "x", "parameters": {"timeout": 10**400}}, False)),
    (triton.generate_request_to_pb, ("m", "", {"text_input": "x", "timeout": 1e303}, False)),
    (kserve.infer_request_to_pb, ("m", "", {**KSERVE_BODY, "parameters": {"timeout": 1e303}},
                                  b"")),
], ids=["mindie-1e303", "mindie-10**400", "triton-1e303", "kserve-1e303"])
def test_a_huge_timeout_travels_capped_for_the_server_to_refuse(
        translate: Callable[..., object], args: tuple[object, ...]) -> None:
    """The server owns the range (0, 3600]; on the way the value must only fit: KServe's
    int64 microseconds, capped, or switchboard.v1's seconds, a double (inf past its range)."""
    assert outcome(translate, *args) is None
    request = translate(*args)[0]
    if isinstance(request, sb.GenerateRequest):
        timeout = args[0]["parameters"]["timeout"]
        assert request.scheduling.timeout == (timeout if timeout < sys.float_info.max else math.inf)
    else:
        assert request.parameters["timeout"].int64_param == \
            INT64_MAX // MICROSECONDS * MICROSECONDS


def test_parse_json_refuses_a_lone_surrogate() -> None:
    """Refused where every body enters: no translator sees such a string."""
    assert outcome(kserve.parse_json, b'{"inputs": "\\ud800"}').status == 400
    assert kserve.parse_json('{"inputs": "\\ud83d\\ude00"}'.encode()) == {"inputs": "\U0001f600"}


def test_parse_json_refuses_deep_nesting() -> None:
    assert outcome(kserve.parse_json, b"[" * 1000 + b"]" * 1000).status == 400


def test_parse_json_refuses_an_integer_over_4300_digits() -> None:
    assert outcome(kserve.parse_json, b"1" * 4301).status == 400


def test_health_timeout_of_4301_digits_is_a_404() -> None:
    assert outcome(mindie_management.health_timeout, "1" * 4301).status == 404


@pytest.mark.parametrize(("translate", "document", "field"), [
    (lambda d: tgi.generate_request_to_pb(d, False),
     {"inputs": "x", "parameters": {"best_of": 2**64}}, "best_of"),
    (lambda d: tgi.generate_request_to_pb(d, False),
     {"inputs": "x", "parameters": {"top_n_tokens": 2**64}}, "top_n_tokens"),
    (openai.chat_request_to_pb, {"messages": [], "max_tokens": 2**64}, "max_tokens"),
    (openai.chat_request_to_pb, {"messages": [], "min_tokens": {}}, "min_tokens"),
    (openai.completion_request_to_pb, {"prompt": "x", "logprobs": {}}, "logprobs"),
    (vllm.generate_request_to_pb, {"prompt": "x", "max_tokens": {}}, "max_tokens"),
], ids=["tgi-best_of", "tgi-top_n_tokens", "chat-max_tokens", "chat-min_tokens",
        "completion-logprobs", "vllm-max_tokens"])
def test_renamed_field_is_refused_under_the_protocols_name(
        translate: Callable[[object], object], document: dict[str, object], field: str) -> None:
    error = outcome(translate, document)
    assert error is not None and error.field == field
