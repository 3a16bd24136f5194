"""switchboard.v1's typed generation parameters under MindIE's names: a GenerateRequest's
`sampling`, `output` and `scheduling` fields are named as MindIE's parameters, so their
descriptors are the one table the gateway's translators fill a request from (`fill`) and
the server reads it back by (`requested_values`). Types are checked here, where JSON values
become typed fields; ranges are the engine's to check."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

from google.protobuf.descriptor import FieldDescriptor

from switchboard.proto import switchboard_pb2 as sb

UINT32_MAX = 2**32 - 1
INT64_RANGE = range(-2**63, 2**63)
UINT64_RANGE = range(2**64)
PARTS = ("sampling", "output", "scheduling")
# Each parameter's field, by its MindIE name, and the part of the request that holds it.
FIELDS: dict[str, tuple[str, FieldDescriptor]] = {
    field.name: (part, field)
    for part in PARTS
    for field in sb.GenerateRequest.DESCRIPTOR.fields_by_name[part].message_type.fields}
NAMES = frozenset(FIELDS)
SCHEMA_FIELDS = frozenset({"guided_json"})
# What MindIE's interfaces (its native routes, its Triton ones) accept without effect on
# generation: `details` and `perf_stat` shape the reply, `watermark` is not applied by its
# post-processing (MindIE answers a request that asks for it), `batch_size` is the server's.
MINDIE_IGNORED_FLAGS = ("details", "perf_stat", "watermark")
MINDIE_IGNORED_COUNT = "batch_size"
# MindIE's interfaces document its seeds in [1, 2^64 - 1]; the engine takes 0 too (TGI's u64).
MINDIE_MIN_SEED = 1
# What answers of one sequence without log-probabilities (KServe v2's tensors, and MindIE's
# replies, which share its parameters) have no place for: log-probabilities always, and n and
# best_of but at 1.
UNCARRIED = frozenset({"logprobs", "top_logprobs", "prompt_logprobs"})
SINGLE_SEQUENCE = frozenset({"n", "best_of"})


class FieldError(ValueError):
    """A parameter whose value has no place in its typed field."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def fill(request: sb.GenerateRequest, values: Mapping[str, object]) -> None:
    """Set `values` (MindIE's names; None is absent) on the request's typed fields."""
    for name, value in values.items():
        if value is None:
            continue
        if name not in FIELDS:
            raise FieldError(name, "unknown parameter; supported parameters are "
                             + ", ".join(sorted(NAMES)))
        part, field = FIELDS[name]
        message = getattr(request, part)
        if field.containing_oneof is not None and (
                chosen := message.WhichOneof(field.containing_oneof.name)) is not None:
            raise FieldError(name, f"cannot be combined with {chosen}: a request follows one "
                             "pattern")
        _set(message, field, name, value)


def under_mindie_rules(values: Mapping[str, object]) -> dict[str, object]:
    """`values` as MindIE's interfaces take them: less what MindIE accepts without effect,
    which must still be well formed, and with a positive seed."""
    seed = values.get("seed")
    if seed == 0 and not isinstance(seed, bool):
        raise FieldError("seed", f"must be in [{MINDIE_MIN_SEED}, {UINT64_RANGE.stop - 1}]; "
                         "got 0 (MindIE's seeds are positive)")
    for name in MINDIE_IGNORED_FLAGS:
        if values.get(name) is not None and not isinstance(values[name], bool):
            raise FieldError(name, f"must be true or false; got {_json(values[name])}")
    count = values.get(MINDIE_IGNORED_COUNT)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 1):
        raise FieldError(MINDIE_IGNORED_COUNT, f"must be a positive integer; got {_json(count)}")
    ignored = {*MINDIE_IGNORED_FLAGS, MINDIE_IGNORED_COUNT}
    return {name: value for name, value in values.items() if name not in ignored}


def typed_values(values: Mapping[str, object]) -> dict[str, object]:
    """`values` as a typed request carries them (`fill`, then `requested_values`): types
    checked and values converted as for every other protocol."""
    request = sb.GenerateRequest()
    fill(request, values)
    return requested_values(request)


def requested_values(request: sb.GenerateRequest) -> dict[str, object]:
    """The request's parameters that are present, by MindIE's names, as Python values."""
    values: dict[str, object] = {}
    for part in PARTS:
        for field, value in getattr(request, part).ListFields():
            if field.message_type is sb.TokenIds.DESCRIPTOR:
                values[field.name] = list(value.ids)
            elif field.message_type is sb.Choices.DESCRIPTOR:
                values[field.name] = list(value.choices)
            elif field.message_type is not None:  # a map
                values[field.name] = dict(value)
            elif field.is_repeated:
                values[field.name] = list(value)
            else:
                values[field.name] = value
    return values


def _set(message: object, field: FieldDescriptor, name: str, value: object) -> None:
    if field.message_type is sb.TokenIds.DESCRIPTOR:
        getattr(message, name).ids.extend(_token_ids(name, value))
    elif field.message_type is sb.Choices.DESCRIPTOR:
        getattr(message, name).choices.extend(_strings(name, value, "a list of strings"))
    elif field.message_type is not None:
        getattr(message, name).update(_logit_bias(name, value))
    elif field.is_repeated:
        getattr(message, name).extend(
            _token_ids(name, value) if field.type == FieldDescriptor.TYPE_UINT32
            else _strings(name, [value] if isinstance(value, str) else value,
                          "a string or a list of strings"))
    else:
        setattr(message, name, _scalar(field, name, value))


def _scalar(field: FieldDescriptor, name: str, value: object) -> object:
    if field.type == FieldDescriptor.TYPE_BOOL:
        if not isinstance(value, bool):
            raise FieldError(name, f"must be true or false; got {_json(value)}")
        return value
    if field.type == FieldDescriptor.TYPE_STRING:
        if name in SCHEMA_FIELDS:
            # A JSON schema travels as its text.
            if isinstance(value, Mapping):
                return json.dumps(value)
            if not isinstance(value, str):
                raise FieldError(name, f"must be a JSON schema (an object, or its text); got "
                                 f"{_json(value)}")
        elif not isinstance(value, str):
            raise FieldError(name, f"must be a string; got {_json(value)}")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        kind = "a number" if field.type == FieldDescriptor.TYPE_DOUBLE else "an integer"
        raise FieldError(name, f"must be {kind}; got {_json(value)}")
    if field.type == FieldDescriptor.TYPE_DOUBLE:
        if isinstance(value, int):
            try:
                return float(value)
            except OverflowError:
                # Past a double's range, infinite: the engine's range check refuses it.
                return math.inf if value > 0 else -math.inf
        if math.isnan(value):
            raise FieldError(name, f"must be a number; got {_json(value)}")
        return value
    bounds = UINT64_RANGE if field.type == FieldDescriptor.TYPE_UINT64 else INT64_RANGE
    if not isinstance(value, int) or value not in bounds:
        raise FieldError(name, f"must be an integer in [{bounds.start}, {bounds.stop - 1}]; "
                         f"got {_json(value)}")
    return value


def _strings(name: str, value: object, kind: str) -> list[str]:
    if not isinstance(value, list | tuple) or not all(isinstance(each, str) for each in value):
        raise FieldError(name, f"must be {kind}; got {_json(value)}")
    return list(value)


def _token_ids(name: str, value: object) -> list[int]:
    if not isinstance(value, list | tuple) or not all(
            isinstance(each, int) and not isinstance(each, bool) and 0 <= each <= UINT32_MAX
            for each in value):
        raise FieldError(name, f"must be a list of token ids; got {_json(value)}")
    return list(value)


def _logit_bias(name: str, value: object) -> dict[int, float]:
    """OpenAI's logit_bias: an object from token ids (JSON keys are strings) to numbers."""
    if not isinstance(value, Mapping):
        raise FieldError(name, f"must be an object mapping token ids to biases; got "
                         f"{_json(value)}")
    biases: dict[int, float] = {}
    for key, bias in value.items():
        token_id = key if isinstance(key, int) and not isinstance(key, bool) else \
            int(key) if isinstance(key, str) and key.isascii() and key.isdecimal() else None
        if token_id is None or not 0 <= token_id <= UINT32_MAX:
            raise FieldError(name, f"keys must be token ids; got {_json(key)}")
        if isinstance(bias, bool) or not isinstance(bias, int | float) or math.isnan(bias):
            raise FieldError(name, f"the bias of token {token_id} must be a number; got "
                             f"{_json(bias)}")
        biases[token_id] = float(bias)
    return biases


def _json(value: object) -> str:
    """A value as the request's JSON writes it (true, "x"), in error messages."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
