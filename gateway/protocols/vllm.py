"""vLLM's demo API server (`vllm.entrypoints.api_server`) ⇄ switchboard.v1 Generate.

POST /generate with `{"prompt", "stream", ...sampling parameters}` answers
`{"text": [prompt + completion, one per sequence]}`; streamed, the same object with the
texts so far, each followed by a NUL byte, as vLLM sends it.
"""

from __future__ import annotations

import json

import grpc

from gateway.errors import bad_request
from gateway.protocols.generation import Generation, generate_request, optional_bool, renamed
from gateway.protocols.kserve import require_object
from gateway.protocols.parameters import json_type
from gateway.protocols.tgi import HTTP_STATUS as TGI_HTTP_STATUS
from proto import switchboard_pb2 as sb

DEFAULT_MAX_TOKENS = 16  # vLLM's SamplingParams default
DELIMITER = b"\0"
# JSON objects each followed by a NUL byte is no JSON document: vLLM's demo server sends no
# content type for it; this says "bytes" rather than claiming JSON.
STREAM_CONTENT_TYPE = "application/octet-stream"
NAMES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
# TGI's statuses (the route is shared), but a full queue is 503: 429 is TGI's alone.
HTTP_STATUS = {**TGI_HTTP_STATUS, grpc.StatusCode.RESOURCE_EXHAUSTED: 503}
SAMPLING_FIELDS = frozenset({"n", "best_of", "presence_penalty", "frequency_penalty",
                             "repetition_penalty", "temperature", "top_p", "top_k", "seed", "stop",
                             "stop_token_ids", "ignore_eos", "max_tokens", "min_tokens"})


def generate_request_to_pb(document: object) -> tuple[sb.GenerateRequest, str, bool, float]:
    """The request, the prompt, whether to stream, and the call's deadline in seconds."""
    document = require_object(document, "the body")
    prompt = document.get("prompt")
    if not isinstance(prompt, str):
        raise bad_request("prompt", f"must be a string; got {json_type(prompt)}")
    unknown = sorted(set(document) - SAMPLING_FIELDS - {"prompt", "stream"})
    if unknown:
        raise bad_request(unknown[0], "unknown sampling parameter")
    values = renamed({name: document.get(name) for name in SAMPLING_FIELDS}, NAMES)
    values.setdefault("max_new_tokens", DEFAULT_MAX_TOKENS)
    # vLLM: temperature 0 is greedy, top_k -1 (or 0) no cut; sampling is the default.
    if values.get("temperature") == 0:
        del values["temperature"]
        values["do_sample"] = False
    else:
        values["do_sample"] = True
    if values.get("top_k") == -1:
        values["top_k"] = 0
    request, deadline_s = generate_request("", prompt, values, names=NAMES)
    return request, prompt, optional_bool(document, "stream"), deadline_s


def texts(generation: Generation, prompt: str) -> dict[str, object]:
    return {"text": [prompt + sequence.generated_text for sequence in generation.ordered()]}


def stream_line(generation: Generation, prompt: str) -> bytes:
    return json.dumps(texts(generation, prompt), ensure_ascii=False).encode() + DELIMITER


def stream_error(body: object) -> bytes:
    return json.dumps(body, ensure_ascii=False).encode() + DELIMITER
