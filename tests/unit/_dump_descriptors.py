"""Print the protobuf schema of the given generated modules as JSON.

Run as a script by test_proto_descriptors.py, once per side: tritonclient's modules and
ours register the same `inference.*` names in protobuf's default descriptor pool, so
they cannot be imported into one process.

Usage: python _dump_descriptors.py MODULE [MODULE ...]
Output: {"messages": {full name: {...}}, "enums": {full name: {...}}, "methods": {full name: {...}}}
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

from google.protobuf.descriptor_pb2 import (
    DescriptorProto,
    EnumDescriptorProto,
    FieldDescriptorProto,
    FileDescriptorProto,
)


def _type_name(name: str) -> str:
    """Referenced message/enum type as a full name without protoc's leading dot."""
    return name.removeprefix(".")


def _enum(enum: EnumDescriptorProto) -> dict[str, int]:
    return {value.name: value.number for value in enum.value}


def _field(field: FieldDescriptorProto, message: DescriptorProto) -> dict[str, Any]:
    in_oneof = field.HasField("oneof_index")
    return {
        "number": field.number,
        "type": FieldDescriptorProto.Type.Name(field.type),
        "label": FieldDescriptorProto.Label.Name(field.label),
        "type_name": _type_name(field.type_name),
        "oneof": message.oneof_decl[field.oneof_index].name if in_oneof else None,
        "proto3_optional": field.proto3_optional,
    }


def _collect(message: DescriptorProto, scope: str, schema: dict[str, dict[str, Any]]) -> None:
    """Add `message` and everything nested in it to `schema`, keyed by full name."""
    full_name = f"{scope}.{message.name}"
    schema["messages"][full_name] = {
        "map_entry": message.options.map_entry,
        "fields": {field.name: _field(field, message) for field in message.field},
    }
    for enum in message.enum_type:
        schema["enums"][f"{full_name}.{enum.name}"] = _enum(enum)
    for nested in message.nested_type:
        _collect(nested, full_name, schema)


def dump(module_names: list[str]) -> dict[str, dict[str, Any]]:
    """Schema of every message, enum and RPC defined in the files behind `module_names`."""
    schema: dict[str, dict[str, Any]] = {"messages": {}, "enums": {}, "methods": {}}
    for module_name in module_names:
        file_proto = FileDescriptorProto()
        importlib.import_module(module_name).DESCRIPTOR.CopyToProto(file_proto)
        package = file_proto.package
        for enum in file_proto.enum_type:
            schema["enums"][f"{package}.{enum.name}"] = _enum(enum)
        for message in file_proto.message_type:
            _collect(message, package, schema)
        for service in file_proto.service:
            for method in service.method:
                schema["methods"][f"{package}.{service.name}.{method.name}"] = {
                    "input_type": _type_name(method.input_type),
                    "output_type": _type_name(method.output_type),
                    "client_streaming": method.client_streaming,
                    "server_streaming": method.server_streaming,
                }
    return schema


if __name__ == "__main__":
    json.dump(dump(sys.argv[1:]), sys.stdout, indent=1, sort_keys=True)
