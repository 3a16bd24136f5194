"""KServe v2 REST (Triton's HTTP protocol) ⇄ KServe v2 gRPC: metadata, config and /infer with
the binary tensor data extension.

Binary extension (Triton `extension_binary_data.md`): the body is a JSON header of
`Inference-Header-Content-Length` bytes followed by raw tensor bytes; an input with
`parameters.binary_data_size` takes its data from there, in input order. Outputs are returned
as raw bytes when the request asks (`binary_data_output`, or an output's `binary_data`), which
tritonclient.http does by default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
from google.protobuf import json_format
from google.protobuf.descriptor import Descriptor, FieldDescriptor

from switchboard.gateway.errors import RequestError, bad_request
from switchboard.gateway.protocols.parameters import (INT64_MAX, json_type, parameter_value,
                                         set_parameters)
from switchboard.proto import grpc_service_pb2 as pb
from switchboard.proto import model_config_pb2 as mc
from switchboard.proto.tensor_bytes import deserialize_bytes, serialize_bytes

HEADER_LENGTH = "Inference-Header-Content-Length"
# Extensions of the REST front on top of what the server reports.
REST_EXTENSIONS = ("binary_tensor_data", "generate")
INT64_TYPES = (FieldDescriptor.CPPTYPE_INT64, FieldDescriptor.CPPTYPE_UINT64)
NUMPY_TYPES = {
    "BOOL": "?", "UINT8": "u1", "UINT16": "<u2", "UINT32": "<u4", "UINT64": "<u8",
    "INT8": "i1", "INT16": "<i2", "INT32": "<i4", "INT64": "<i8",
    "FP16": "<f2", "FP32": "<f4", "FP64": "<f8",
}


@dataclass(frozen=True, slots=True)
class OutputOptions:
    """Which outputs the client wants as raw bytes (by name; `default` for the others)."""

    default: bool
    by_name: Mapping[str, bool]

    def is_binary(self, name: str) -> bool:
        return self.by_name.get(name, self.default)


@dataclass(frozen=True, slots=True)
class HTTPReply:
    body: bytes
    header_length: int | None  # set when binary output follows the JSON header


def split_body(body: bytes, header_length: str | None) -> tuple[object, bytes]:
    """The JSON document and the binary data after it."""
    if header_length is None:
        json_part, binary = body, b""
    else:
        try:
            length = int(header_length)
        except ValueError:
            raise bad_request(HEADER_LENGTH, f"must be an integer; got {header_length!r}") from None
        if not 0 < length <= len(body):
            raise bad_request(HEADER_LENGTH, f"the JSON header's length must be in "
                              f"[1, {len(body)}] (the body's bytes); got {length}")
        json_part, binary = body[:length], body[length:]
    return parse_json(json_part), binary


_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def parse_json(body: bytes) -> object:
    """The body's JSON document. Refused (400): malformed JSON, nesting too deep for Python's
    parser, integers over Python's 4300 digits, and strings with an unpaired surrogate escape
    (`"\\ud800"`), which no UTF-8 text (nor protobuf string) can hold."""
    try:
        document = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise RequestError(400, f"the body is not valid JSON: {error}") from None
    except RecursionError:
        raise RequestError(400, "the body's JSON is nested too deeply") from None
    except ValueError as error:  # the integer digit limit
        raise RequestError(400, f"the body's JSON has a number out of range: {error}") from None
    if _SURROGATE_ESCAPE.search(body):
        try:
            json.dumps(document, ensure_ascii=False).encode()
        except UnicodeEncodeError:
            raise RequestError(400, "the body's JSON has a string with an unpaired surrogate "
                               "(\\ud800-\\udfff) escape") from None
    return document


def infer_request_to_pb(model: str, version: str, document: object, binary: bytes
                        ) -> tuple[pb.ModelInferRequest, OutputOptions]:
    """The gRPC request and its output options."""
    document = require_object(document, "the body")
    request = pb.ModelInferRequest(model_name=model, model_version=version)
    request.id = optional_string(document, "id")
    parameters = dict(require_object(document.get("parameters") or {}, "parameters"))
    binary_default = parameters.pop("binary_data_output", False)
    if not isinstance(binary_default, bool):
        raise bad_request("parameters.binary_data_output", "must be a boolean")
    set_parameters(request.parameters, parameters)
    inputs = document.get("inputs")
    if not isinstance(inputs, list) or not inputs:
        raise bad_request("inputs", "must be a non-empty array of tensors")
    offset = 0
    for position, tensor in enumerate(inputs):
        data, offset = _input_tensor(request, require_object(tensor, f"inputs[{position}]"),
                                     position, binary, offset)
        request.raw_input_contents.append(data)
    if offset != len(binary):
        raise bad_request("inputs", f"{len(binary) - offset} bytes of binary data are not claimed "
                          "by any input's binary_data_size")
    by_name: dict[str, bool] = {}
    outputs = document.get("outputs", [])
    if not isinstance(outputs, list):
        raise bad_request("outputs", "must be an array")
    for position, output in enumerate(outputs):
        output = require_object(output, f"outputs[{position}]")
        name = output.get("name")
        if not isinstance(name, str):
            raise bad_request(f"outputs[{position}].name", "must be a string")
        options = require_object(output.get("parameters", {}), f"outputs[{position}].parameters")
        wants_binary = options.get("binary_data", binary_default)
        if not isinstance(wants_binary, bool):
            raise bad_request(f"outputs[{position}].parameters.binary_data", "must be a boolean")
        by_name[name] = wants_binary
        request.outputs.add(name=name)
    return request, OutputOptions(default=binary_default, by_name=by_name)


def infer_response_to_http(response: pb.ModelInferResponse, options: OutputOptions) -> HTTPReply:
    document: dict[str, object] = {"model_name": response.model_name,
                                   "model_version": response.model_version}
    if response.id:
        document["id"] = response.id
    if response.parameters:
        document["parameters"] = parameters_to_json(response.parameters)
    outputs: list[dict[str, object]] = []
    binary: list[bytes] = []
    for tensor, raw in zip(response.outputs, response.raw_output_contents):
        output: dict[str, object] = {"name": tensor.name, "datatype": tensor.datatype,
                                     "shape": list(tensor.shape)}
        if options.is_binary(tensor.name):
            output["parameters"] = {"binary_data_size": len(raw)}
            binary.append(raw)
        else:
            output["data"] = tensor_json(tensor.datatype, raw)
        outputs.append(output)
    document["outputs"] = outputs
    header = json.dumps(document).encode()
    if not binary:
        return HTTPReply(header, None)
    return HTTPReply(header + b"".join(binary), len(header))


def parameters_to_json(parameters: Mapping[str, pb.InferParameter]) -> dict[str, object]:
    return {name: parameter_value(value) for name, value in parameters.items()}


def server_metadata_json(response: pb.ServerMetadataResponse) -> dict[str, object]:
    return {"name": response.name, "version": response.version,
            "extensions": [*response.extensions, *REST_EXTENSIONS]}


def model_metadata_json(response: pb.ModelMetadataResponse) -> dict[str, object]:
    def tensors(items: object) -> list[dict[str, object]]:
        return [{"name": t.name, "datatype": t.datatype, "shape": list(t.shape)} for t in items]

    return {"name": response.name, "versions": list(response.versions),
            "platform": response.platform, "inputs": tensors(response.inputs),
            "outputs": tensors(response.outputs)}


def repository_index_request(body: bytes) -> pb.RepositoryIndexRequest:
    """Triton's POST /v2/repository/index: an empty body, or `{"ready": true}` for the models
    ready to serve only."""
    if not body.strip():
        return pb.RepositoryIndexRequest()
    document = require_object(parse_json(body), "the body")
    refuse_unknown(document, {"ready"})
    ready = document.get("ready")
    if ready is not None and not isinstance(ready, bool):
        raise bad_request("ready", f"must be true or false; got {json_type(ready)}")
    return pb.RepositoryIndexRequest(ready=bool(ready))


def repository_index_json(response: pb.RepositoryIndexResponse) -> list[dict[str, str]]:
    return [{"name": model.name, "version": model.version, "state": model.state,
             "reason": model.reason} for model in response.models]


def model_statistics_json(response: pb.ModelStatisticsResponse) -> dict[str, object]:
    """Triton's REST statistics: the message as JSON, every field written, zeros and empty
    lists included, as Triton does; 64-bit counts as numbers."""
    document = json_format.MessageToDict(response, preserving_proto_field_name=True,
                                         always_print_fields_with_no_presence=True)
    return _int64_as_numbers(response.DESCRIPTOR, document)


def model_config_json(config: mc.ModelConfig) -> dict[str, object]:
    """Triton's REST model config: the ModelConfig message as JSON, proto field names, 64-bit
    integers as numbers (protobuf's JSON writes them as strings; Triton converts them back)."""
    document = json_format.MessageToDict(config, preserving_proto_field_name=True)
    return _int64_as_numbers(config.DESCRIPTOR, document)


def _int64_as_numbers(descriptor: Descriptor, document: dict[str, object]) -> dict[str, object]:
    for name, value in document.items():
        field = descriptor.fields_by_name.get(name)
        if field is None:
            continue
        if field.message_type is not None:
            if field.message_type.GetOptions().map_entry:
                value_field = field.message_type.fields_by_name["value"]
                if value_field.message_type is not None:
                    for item in value.values():
                        _int64_as_numbers(value_field.message_type, item)
            else:
                for item in value if isinstance(value, list) else [value]:
                    _int64_as_numbers(field.message_type, item)
        elif field.cpp_type in INT64_TYPES:
            document[name] = [int(v) for v in value] if isinstance(value, list) else int(value)
    return document


def require_object(value: object, what: str) -> dict[str, object]:
    if not isinstance(value, dict):
        raise bad_request(what, f"must be a JSON object; got {json_type(value)}")
    return value


def refuse_unknown(document: Mapping[str, object], known: Iterable[str],
                   kind: str = "field") -> None:
    """400 naming the first (in sorted order) of `document`'s keys not in `known`."""
    unknown = sorted(set(document) - set(known))
    if unknown:
        raise bad_request(unknown[0], f"unknown {kind}")


def required_string(document: Mapping[str, object], name: str) -> str:
    value = document.get(name)
    if not isinstance(value, str):
        raise bad_request(name, f"must be a string; got {json_type(value)}")
    return value


def optional_string(document: Mapping[str, object], name: str) -> str:
    value = document.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise bad_request(name, f"must be a string; got {json_type(value)}")
    return value


def _input_tensor(request: pb.ModelInferRequest, tensor: Mapping[str, object], position: int,
                  binary: bytes, offset: int) -> tuple[bytes, int]:
    """Add the tensor's description to `request`; return its raw bytes and the new offset."""
    where = f"inputs[{position}]"
    name, datatype, shape = tensor.get("name"), tensor.get("datatype"), tensor.get("shape")
    if not isinstance(name, str):
        raise bad_request(f"{where}.name", "must be a string")
    if not isinstance(datatype, str):
        raise bad_request(f"{name}.datatype", "must be a string")
    if not isinstance(shape, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and -INT64_MAX - 1 <= d <= INT64_MAX
            for d in shape):
        raise bad_request(f"{name}.shape", "must be an array of 64-bit integers")
    request.inputs.add(name=name, datatype=datatype, shape=shape)
    options = require_object(tensor.get("parameters", {}), f"{name}.parameters")
    size = options.get("binary_data_size")
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise bad_request(f"{name}.parameters.binary_data_size", "must be a non-negative integer")
        if offset + size > len(binary):
            raise bad_request(f"{name}.parameters.binary_data_size",
                              f"{size} bytes requested; {len(binary) - offset} remain in the body")
        return binary[offset:offset + size], offset + size
    if "data" not in tensor:
        raise bad_request(name, "needs `data`, or `parameters.binary_data_size` with binary data")
    return encode_tensor(name, datatype, tensor["data"]), offset


def encode_tensor(name: str, datatype: str, data: object) -> bytes:
    """JSON tensor data (flat or nested, row-major) → raw bytes of the datatype."""
    values = list(_flatten(data if isinstance(data, list) else [data]))
    if datatype == "BYTES":
        if not all(isinstance(value, str) for value in values):
            raise bad_request(name, "BYTES data must be strings")
        return serialize_bytes(value.encode() for value in values)
    numpy_type = NUMPY_TYPES.get(datatype)
    if numpy_type is None:
        raise bad_request(f"{name}.datatype", f"unknown datatype {datatype!r}")
    if not all(isinstance(value, (int, float)) and (datatype == "BOOL") == isinstance(value, bool)
               for value in values):
        raise bad_request(name, f"{datatype} data must be {'booleans' if datatype == 'BOOL' else 'numbers'}")
    target = np.dtype(numpy_type)
    if target.kind in "ui":
        info = np.iinfo(target)
        if not all(isinstance(value, int) and info.min <= value <= info.max for value in values):
            raise bad_request(name, f"{datatype} data must be integers in [{info.min}, {info.max}]")
    try:
        return np.asarray(values, dtype=target).tobytes()
    except OverflowError:
        raise bad_request(name, f"{datatype} data must be numbers within the datatype's "
                          "range") from None


def _flatten(data: list[object]) -> Iterator[object]:
    for item in data:
        if isinstance(item, list):
            yield from _flatten(item)
        else:
            yield item


def tensor_json(datatype: str, raw: bytes) -> list[object]:
    if datatype == "BYTES":
        return [element.decode("utf-8", errors="replace") for element in deserialize_bytes(raw)]
    return np.frombuffer(raw, dtype=np.dtype(NUMPY_TYPES[datatype])).tolist()
