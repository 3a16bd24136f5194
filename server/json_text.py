"""JSON carried inside a request's strings (a KServe parameter such as `stop`, vLLM's
`sampling_parameters`, chat template variables), decoded with refusals that name the field:
malformed text, nesting deeper than Python's parser goes, and integers past its digit limit."""

from __future__ import annotations

import json

from switchboard.engine.errors import InvalidRequest


def decode_json(field: str, text: str, what: str = "JSON") -> object:
    try:
        return json.loads(text)
    except RecursionError:
        raise InvalidRequest(field, f"is {what} nested too deeply") from None
    except ValueError as error:  # JSONDecodeError, and the integer digit limit
        raise InvalidRequest(field, f"is not {what}: {error}") from None
