"""Triton's vLLM backend interface, over KServe v2 (vllm_backend's `model.py` and
`utils/request.py`), so that its clients work unchanged.

A request sends `text_input` with any of the backend's optional control tensors: `stream`
(BOOL: a response per step rather than one at the end), `exclude_input_in_output` (BOOL;
unstreamed, the prompt leads the output unless it is true; streamed, it must not be false),
`sampling_parameters` (a JSON object of vLLM's SamplingParams, numbers possibly as strings;
without it, the request's parameters are read by the same names; with it, they are ignored, as
the backend does, but for Triton's priority and timeout), and `return_finish_reason`,
`return_num_input_tokens`, `return_num_output_tokens` (BOOL), which add the outputs
`finish_reason` (vLLM's "length", "stop" or "abort"; "None" until the end), `num_input_tokens`
and `num_output_tokens` (of that response) beside `text_output`. vLLM's defaults hold:
16 new tokens, sampling at temperature 1 (temperature 0 is greedy, top_k -1 no cut), seeds
as vLLM's int64s; errors name vLLM's fields.

`text_input` alone stays MindIE's text interface (no prompt in the output, MindIE's parameter
names): the two cannot be told apart without a control tensor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from switchboard.engine.errors import InvalidRequest
from switchboard.engine.request import FinishReason
from switchboard.proto import vllm_sampling
from switchboard.proto.vllm_backend_tensors import CONTROL_INPUTS, EXTRA_OUTPUTS, SAMPLING_INPUT
from switchboard.server.json_text import decode_json

BOOL_INPUTS = tuple(name for name, datatype in CONTROL_INPUTS.items() if datatype == "BOOL")
NO_LOGPROBS = ("log-probabilities are not available over KServe v2 here "
               "(switchboard.v1.Generation has them)")
# The backend's inputs that are refused here, and why.
UNSUPPORTED_INPUTS = {
    "return_logprobs": NO_LOGPROBS,
    "return_cumulative_logprob": NO_LOGPROBS,
    "image": "the served model takes text only",
    "embedding_request": "the served model generates text; it makes no embeddings",
}
INPUTS = frozenset({*CONTROL_INPUTS, *UNSUPPORTED_INPUTS})
FINISH_REASONS = {FinishReason.LENGTH: "length", FinishReason.EOS: "stop",
                  FinishReason.STOP: "stop", FinishReason.STOPPED: "abort"}
# vLLM's SamplingParams fields by type, for values sent as strings (its samples send them so).
INT_FIELDS = frozenset({"max_tokens", "min_tokens", "top_k", "seed", "n", "best_of",
                        "truncate_prompt_tokens"})
FLOAT_FIELDS = frozenset({"temperature", "top_p", "min_p", "presence_penalty",
                          "frequency_penalty", "repetition_penalty"})
BOOL_FIELDS = frozenset({"ignore_eos", "skip_special_tokens", "include_stop_str_in_output",
                         "spaces_between_special_tokens"})
# vLLM's structured-output object (SamplingParams' guided_decoding, later structured_outputs):
# its keys that are the engine's pattern parameters, and those that choose how (ignored).
STRUCTURED_OUTPUT_FIELDS = ("guided_decoding", "structured_outputs")
STRUCTURED_OUTPUTS = {"json": "guided_json", "regex": "guided_regex", "choice": "guided_choice"}
IGNORED_STRUCTURED_OUTPUT_KEYS = frozenset({"backend", "disable_fallback"})
# The engine's names of vLLM's fields, back to vLLM's (for error messages).
FIELD_NAMES = {engine: vllm for vllm, engine in vllm_sampling.NAMES.items()}


@dataclass(frozen=True, slots=True)
class VllmOptions:
    """What a request's control tensors ask for."""

    stream: bool
    prepend_prompt: bool
    outputs: frozenset[str]  # the extra outputs, by name


def read_options(controls: Mapping[str, bool | str]) -> VllmOptions:
    """controls: the request's control tensors' values, by name (BOOL ones as bools)."""
    stream = bool(controls.get("stream", False))
    exclude = controls.get("exclude_input_in_output")
    if stream and exclude is False:
        raise InvalidRequest("exclude_input_in_output", "must not be false when streaming: "
                             "the prompt cannot lead a stream of new text")
    return VllmOptions(
        stream=stream, prepend_prompt=not stream and not exclude,
        outputs=frozenset(name for name, (asking, _) in EXTRA_OUTPUTS.items()
                          if controls.get(asking)))


def sampling_object(text: str) -> dict[str, object]:
    """The `sampling_parameters` tensor's JSON object."""
    values = decode_json(SAMPLING_INPUT, text)
    if not isinstance(values, dict):
        raise InvalidRequest(SAMPLING_INPUT, "must be a JSON object of sampling parameters")
    return values


def engine_parameters(values: Mapping[str, object]) -> dict[str, object]:
    """vLLM's sampling parameters under the engine's names, with vLLM's defaults and its
    readings (see vllm_sampling.apply_vllm_defaults); strings of numbers and booleans become
    them. Null values are left out, as the backend does."""
    result = {vllm_sampling.NAMES.get(name, name): _typed(name, value)
              for name, value in values.items() if value is not None}
    if refused := vllm_sampling.refusal(result):
        raise InvalidRequest(*refused)
    # Without effect here: special tokens never appear in text_output.
    if not isinstance(result.pop("spaces_between_special_tokens", True), bool):
        raise InvalidRequest("spaces_between_special_tokens", "must be true or false")
    for holder in STRUCTURED_OUTPUT_FIELDS:
        if holder in result:
            result.update(_structured_output(holder, result.pop(holder)))
    vllm_sampling.apply_vllm_defaults(result)
    return result


def _structured_output(holder: str, spec: object) -> dict[str, object]:
    """vLLM's structured-output object (`{"json": schema}`, `{"regex": …}`, `{"choice": […]}`
    or `{"json_object": true}`) as the engine's pattern parameter."""
    if not isinstance(spec, Mapping):
        raise InvalidRequest(holder, f"must be an object such as {{\"choice\": [...]}}; got "
                             f"{spec!r}")
    pattern: dict[str, object] = {}
    for key, value in spec.items():
        if value is None or value is False or key in IGNORED_STRUCTURED_OUTPUT_KEYS:
            continue
        if key == "json_object":
            pattern["guided_json"] = {"type": "object"}
        elif key in STRUCTURED_OUTPUTS:
            pattern[STRUCTURED_OUTPUTS[key]] = value
        else:
            raise InvalidRequest(f"{holder}.{key}", f"is not supported; "
                                 f"{', '.join([*STRUCTURED_OUTPUTS, 'json_object'])} are")
    return pattern


def finish_reason_text(reason: FinishReason | None) -> str:
    """As vLLM's backend writes it: str() of vLLM's reason, "None" before the end."""
    return "None" if reason is None else FINISH_REASONS[reason]


def _typed(name: str, value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        if name in INT_FIELDS:
            return int(value)
        if name in FLOAT_FIELDS:
            return float(value)
    except ValueError:
        raise InvalidRequest(name, f"must be a number; got {value!r}") from None
    if name in BOOL_FIELDS:
        if value.lower() not in ("true", "false"):
            raise InvalidRequest(name, f"must be true or false; got {value!r}")
        return value.lower() == "true"
    return value
