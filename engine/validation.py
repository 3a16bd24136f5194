"""The one place where request parameters are checked. Every protocol goes through `build_request`.

Parameter names, ranges and defaults are MindIE's (its Triton text/token interface table);
callers translate their protocol's names and units to these before calling. One exception:
the engine takes any uint64 seed, 0 included (TGI's u64, which OpenAI's and vLLM's seeds are
translated onto); MindIE's interfaces, which document (0, 2^64 - 1], refuse 0 themselves.
"""

from __future__ import annotations

import json
import math
import secrets
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from switchboard.engine.config import MAX_SEQUENCES, EngineLimits
from switchboard.engine.errors import InvalidRequest, PromptTooLong
from switchboard.engine.guided import choice_pattern, json_schema_pattern
from switchboard.engine.params import (DEFAULT_PRIORITY, DEFAULT_TIMEOUT_S, GenerationRequest, OutputPattern,
                           SamplingParams)

INT32_MAX = 2**31 - 1
UINT64_MAX = 2**64 - 1
MAX_STOP_SEQUENCES = 16
DEFAULT_MAX_NEW_TOKENS = 20
MAX_TIMEOUT_S = 3600.0
MAX_TOP_LOGPROBS = 20


@dataclass(frozen=True, slots=True)
class Interval:
    """A numeric range with open or closed ends; str() renders it as in MindIE's docs."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False

    def __contains__(self, value: float) -> bool:
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        high = "inf" if math.isinf(self.high) else _format_number(self.high)
        return (f"{'(' if self.low_open else '['}{_format_number(self.low)}, "
                f"{high}{')' if self.high_open else ']'}")


def _format_number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


FLOAT_RANGES: dict[str, Interval] = {
    "temperature": Interval(0.0, math.inf, low_open=True, high_open=True),
    "top_p": Interval(0.0, 1.0, low_open=True),
    "typical_p": Interval(0.0, 1.0, low_open=True),
    "min_p": Interval(0.0, 1.0),
    "repetition_penalty": Interval(0.0, math.inf, low_open=True, high_open=True),
    "timeout": Interval(0.0, MAX_TIMEOUT_S, low_open=True),
    "presence_penalty": Interval(-2.0, 2.0),
    "frequency_penalty": Interval(-2.0, 2.0),
}
INT_RANGES: dict[str, Interval] = {
    "top_k": Interval(0, INT32_MAX),
    "max_new_tokens": Interval(1, INT32_MAX),
    "seed": Interval(0, UINT64_MAX),
    "priority": Interval(1, 5),
    "min_new_tokens": Interval(0, INT32_MAX),
    "top_logprobs": Interval(0, MAX_TOP_LOGPROBS),
    "n": Interval(1, MAX_SEQUENCES),  # and at most the configured maxBestOf (limits)
    "best_of": Interval(1, MAX_SEQUENCES),
    "truncate": Interval(1, INT32_MAX),
}
# OpenAI's range for a token's logit bias.
LOGIT_BIAS_RANGE = Interval(-100.0, 100.0)
BOOL_PARAMS = ("do_sample", "ignore_eos", "logprobs", "prompt_logprobs",
               "include_stop_str_in_output", "skip_special_tokens")
# Present with one of these, and without do_sample, the request samples (MindIE: do_sample
# "absent → decided by the other parameters").
SAMPLING_HINTS = ("temperature", "top_k", "top_p", "typical_p", "min_p")
# Structured output (vLLM's names): at most one per request.
PATTERN_PARAMS = ("guided_json", "guided_regex", "guided_choice")
SUPPORTED_PARAMS = frozenset(FLOAT_RANGES) | frozenset(INT_RANGES) | frozenset(BOOL_PARAMS) \
    | frozenset(PATTERN_PARAMS) \
    | {"stop", "stop_token_ids", "logit_bias", "allowed_token_ids"}


@dataclass(frozen=True, slots=True)
class ParameterLimits:
    """What `build_request` accepts of a parameter beyond its type: a number's interval (a
    map's values'), a list's fewest and most items, a string's (each string's of a list)
    fewest characters."""

    interval: Interval | None = None
    min_items: int = 0
    max_items: int | None = None
    min_length: int = 0


def parameter_limits(limits: EngineLimits) -> dict[str, ParameterLimits]:
    """The limits `build_request` checks each parameter against on an engine of `limits`,
    which the server publishes so that no client restates them."""
    table = {name: ParameterLimits(interval)
             for name, interval in {**FLOAT_RANGES, **INT_RANGES}.items()}
    for name in ("n", "best_of"):
        table[name] = ParameterLimits(Interval(INT_RANGES[name].low, limits.max_best_of))
    return {**table,
            "stop": ParameterLimits(max_items=MAX_STOP_SEQUENCES, min_length=1),
            "logit_bias": ParameterLimits(LOGIT_BIAS_RANGE),
            "allowed_token_ids": ParameterLimits(min_items=1),
            "guided_regex": ParameterLimits(min_length=1),
            "guided_choice": ParameterLimits(min_items=1, min_length=1)}


def build_request(request_id: str, prompt_token_ids: Sequence[int],
                  parameters: Mapping[str, object], limits: EngineLimits) -> GenerationRequest:
    """Validate a prompt and its parameters against the engine's limits.

    Raises InvalidRequest (or PromptTooLong) whose `field` names the offending parameter;
    a prompt problem names the field "prompt".
    """
    unknown = sorted(set(parameters) - SUPPORTED_PARAMS)
    if unknown:
        raise InvalidRequest(unknown[0], "unknown parameter; supported parameters are "
                             + ", ".join(sorted(SUPPORTED_PARAMS)))
    floats = {name: _float(parameters, name, interval) for name, interval in FLOAT_RANGES.items()}
    ints = {name: _int(parameters, name, interval) for name, interval in INT_RANGES.items()}
    if ints["truncate"]:
        # TGI's truncate: keep the prompt's last tokens.
        prompt_token_ids = prompt_token_ids[-ints["truncate"]:]
    prompt = _validate_prompt(prompt_token_ids, limits)
    bools = {name: _bool(parameters, name) for name in BOOL_PARAMS}
    if ints["top_logprobs"] and not bools["logprobs"]:
        raise InvalidRequest("top_logprobs", "needs logprobs set to true")
    for name in ("n", "best_of"):
        if (ints[name] or 0) > limits.max_best_of:
            raise InvalidRequest(name, f"must be at most {limits.max_best_of} on this server "
                                 f"(maxBestOf); got {ints[name]}")
    n = ints["n"] or 1
    best_of = ints["best_of"] or n
    if best_of < n:
        raise InvalidRequest("best_of", f"must be at least n ({n}); got {best_of}")
    do_sample = bools["do_sample"]
    if do_sample is None:
        do_sample = any(name in parameters for name in SAMPLING_HINTS)
    if best_of > n and not do_sample:
        raise InvalidRequest("best_of", "choosing the best of several sequences needs sampling "
                             "(do_sample)")
    if n > 1 and not do_sample:
        raise InvalidRequest("n", "several sequences need sampling (do_sample): greedy "
                             "decoding would repeat one")
    min_new_tokens = ints["min_new_tokens"] or 0
    # Without max_new_tokens, as many as min_new_tokens asks for where the default is fewer.
    requested = ints["max_new_tokens"] or max(DEFAULT_MAX_NEW_TOKENS, min_new_tokens)
    if min_new_tokens > requested:
        # As vLLM refuses min_tokens past max_tokens.
        raise InvalidRequest("min_new_tokens", f"must not exceed the most new tokens asked for "
                             f"({requested}); got {min_new_tokens}")
    max_new_tokens = min(requested, limits.max_iter_times, limits.max_seq_len - len(prompt))
    if min_new_tokens > max_new_tokens:
        raise InvalidRequest("min_new_tokens", f"must not exceed {max_new_tokens}, the most "
                             "new tokens this prompt can have (maxIterTimes, maxSeqLen less the "
                             f"prompt); got {min_new_tokens}")
    sampling = SamplingParams(
        do_sample=do_sample,
        # A drawn seed is in every protocol's range, so that any of them can send it back.
        seed=secrets.randbelow(UINT64_MAX) + 1 if ints["seed"] is None else ints["seed"],
        max_new_tokens=max_new_tokens,
        temperature=floats["temperature"] or 1.0,
        top_k=ints["top_k"] or 0,
        top_p=floats["top_p"] or 1.0,
        typical_p=floats["typical_p"] or 1.0,
        min_p=floats["min_p"] or 0.0,
        repetition_penalty=floats["repetition_penalty"] or 1.0,
        presence_penalty=floats["presence_penalty"] or 0.0,
        frequency_penalty=floats["frequency_penalty"] or 0.0,
        stop=_stop_sequences(parameters),
        include_stop_str_in_output=bool(bools["include_stop_str_in_output"]),
        stop_token_ids=_token_ids(parameters, "stop_token_ids", limits) or frozenset(),
        ignore_eos=bool(bools["ignore_eos"]),
        min_new_tokens=min_new_tokens,
        logprobs=(ints["top_logprobs"] or 0) if bools["logprobs"] else None,
        n=n,
        best_of=best_of,
        prompt_logprobs=bool(bools["prompt_logprobs"]),
        logit_bias=_logit_bias(parameters, limits),
        skip_special_tokens=bools["skip_special_tokens"] is not False,
        allowed_token_ids=_allowed_token_ids(parameters, limits),
        pattern=_output_pattern(parameters),
    )
    return GenerationRequest(
        request_id=request_id,
        prompt_token_ids=prompt,
        sampling=sampling,
        priority=ints["priority"] or DEFAULT_PRIORITY,
        timeout_s=floats["timeout"] or DEFAULT_TIMEOUT_S,
    )


def _token_ids(parameters: Mapping[str, object], name: str, limits: EngineLimits
               ) -> frozenset[int] | None:
    """A list of vocabulary ids (None when absent)."""
    value = parameters.get(name)
    if value is None:
        return None
    if not isinstance(value, list | tuple) or not all(
            isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise InvalidRequest(name, "must be a list of token ids")
    check_vocabulary(name, value, limits)
    return frozenset(value)


def _allowed_token_ids(parameters: Mapping[str, object], limits: EngineLimits
                       ) -> frozenset[int] | None:
    allowed = _token_ids(parameters, "allowed_token_ids", limits)
    if allowed is not None and not allowed:
        raise InvalidRequest("allowed_token_ids", "must not be empty: no token could be chosen")
    return allowed


def _output_pattern(parameters: Mapping[str, object]) -> OutputPattern | None:
    """The pattern of guided_json (a JSON schema, or its text), guided_regex or guided_choice
    (a list of strings); whether the vocabulary can follow it is checked when the engine
    compiles it."""
    given = [name for name in PATTERN_PARAMS if parameters.get(name) is not None]
    if not given:
        return None
    if len(given) > 1:
        raise InvalidRequest(given[1], f"cannot be combined with {given[0]}: a request follows "
                             "one pattern")
    name, value = given[0], parameters[given[0]]
    if name == "guided_json":
        if not isinstance(value, Mapping | str):
            raise InvalidRequest(name, f"must be a JSON schema; got {_json(value)}")
        return json_schema_pattern(name, value)
    if name == "guided_regex":
        if not isinstance(value, str) or not value:
            raise InvalidRequest(name, "must be a non-empty regular expression; got "
                                 f"{_json(value)}")
        return OutputPattern(name, value)
    if not isinstance(value, list | tuple) or not value or not all(
            isinstance(choice, str) and choice for choice in value):
        raise InvalidRequest(name, "must be a non-empty list of non-empty strings; got "
                             f"{_json(value)}")
    return choice_pattern(name, value)


def _logit_bias(parameters: Mapping[str, object], limits: EngineLimits
                ) -> tuple[tuple[int, float], ...]:
    """OpenAI's logit_bias: an object from token ids (JSON keys are strings) to biases."""
    value = parameters.get("logit_bias")
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise InvalidRequest("logit_bias", f"must be an object mapping token ids to biases in "
                             f"{LOGIT_BIAS_RANGE}; got {_json(value)}")
    biases: list[tuple[int, float]] = []
    for key, bias in value.items():
        token_id = _token_id_key(key)
        if isinstance(bias, bool) or not isinstance(bias, int | float) \
                or bias not in LOGIT_BIAS_RANGE:
            raise InvalidRequest("logit_bias", f"the bias of token {token_id} must be a number "
                                 f"in {LOGIT_BIAS_RANGE}; got {_json(bias)}")
        biases.append((token_id, float(bias)))
    check_vocabulary("logit_bias", [token_id for token_id, _ in biases], limits)
    return tuple(biases)


def _token_id_key(key: object) -> int:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.isascii() and key.isdecimal():
        return int(key)
    raise InvalidRequest("logit_bias", f"keys must be token ids; got {_json(key)}")


def _validate_prompt(token_ids: Sequence[int], limits: EngineLimits) -> tuple[int, ...]:
    if not token_ids:
        raise InvalidRequest("prompt", "must contain at least one token")
    if len(token_ids) > limits.max_input_len:
        raise PromptTooLong("prompt", f"has {len(token_ids)} tokens; at most "
                            f"{limits.max_input_len} are accepted (maxInputTokenLen, maxSeqLen)")
    check_vocabulary("prompt", token_ids, limits)
    return tuple(int(token_id) for token_id in token_ids)


def check_prompt_size(field: str, texts: Iterable[str], limits: EngineLimits) -> None:
    """PromptTooLong naming `field` when the texts of a prompt have, together, more UTF-8
    bytes than max_input_len tokens can hold: checked before tokenizing, whose time and memory
    grow with the text."""
    remaining = limits.max_prompt_bytes
    for text in texts:
        # A character has at least one byte: a text of more characters than remain is over
        # without encoding it.
        remaining -= len(text) if len(text) > remaining else len(text.encode())
        if remaining < 0:
            raise PromptTooLong(field, f"is over {limits.max_prompt_bytes} bytes, more than "
                                f"{limits.max_input_len} tokens (maxInputTokenLen, maxSeqLen) "
                                f"of this model's vocabulary can hold (at most "
                                f"{limits.max_token_bytes} bytes a token)")


def check_vocabulary(field: str, token_ids: Sequence[int], limits: EngineLimits) -> None:
    """InvalidRequest naming `field` for the first id outside the model's vocabulary."""
    for position, token_id in enumerate(token_ids):
        if not 0 <= token_id < limits.vocab_size:
            raise InvalidRequest(field, f"token id {token_id} at position {position} is outside "
                                 f"the vocabulary [0, {limits.vocab_size})")


def _float(parameters: Mapping[str, object], name: str, interval: Interval) -> float | None:
    value = parameters.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value):
        raise InvalidRequest(name, f"must be a number in {interval}; got {_json(value)}")
    if value not in interval:
        raise InvalidRequest(name, f"must be in {interval}; got {_json(value)}")
    return float(value)


def _int(parameters: Mapping[str, object], name: str, interval: Interval) -> int | None:
    value = parameters.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(name, f"must be an integer in {interval}; got {_json(value)}")
    if value not in interval:
        raise InvalidRequest(name, f"must be in {interval}; got {_json(value)}")
    return value


def _bool(parameters: Mapping[str, object], name: str) -> bool | None:
    value = parameters.get(name)
    if value is None or isinstance(value, bool):
        return value
    raise InvalidRequest(name, f"must be true or false; got {_json(value)}")


def _stop_sequences(parameters: Mapping[str, object]) -> tuple[str, ...]:
    value = parameters.get("stop")
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list | tuple) or not all(isinstance(s, str) and s for s in stops):
        raise InvalidRequest("stop", "must be a non-empty string or a list of non-empty strings")
    if len(stops) > MAX_STOP_SEQUENCES:
        raise InvalidRequest("stop", f"supports up to {MAX_STOP_SEQUENCES} stop sequences; "
                             f"got {len(stops)}")
    return tuple(stops)


def _json(value: object) -> str:
    """A value as the request's JSON writes it (true, "x"), in error messages."""
    try:
        return json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        return repr(value)
