"""SageMaker's POST /invocations (gateway/protocols/sagemaker.py): which API a body is for, and
the protocol serving it, that of the route for that API. No network; the routes end to end are
in tests/peers/test_gateway_sagemaker.py."""

from __future__ import annotations

import pytest

from switchboard.gateway.app import ROUTES
from switchboard.gateway.config import Plane
from switchboard.gateway.errors import RequestError
from switchboard.gateway.protocols import sagemaker

USER = {"role": "user", "content": "Hi"}


@pytest.mark.parametrize("body, field", [
    ({"inputs": "Hi", "parameters": {"max_new_tokens": 2}, "stream": True}, "inputs"),
    ({"messages": [USER], "max_tokens": 2}, "messages"),
    ({"prompt": "Hi", "max_tokens": 2}, "prompt"),
    # In the order TGI tries them; vLLM tries chat before completions too.
    ({"inputs": "Hi", "messages": [USER], "prompt": "Hi"}, "inputs"),
    ({"messages": [USER], "prompt": "Hi"}, "messages"),
    # The field's presence decides; its route then checks its value.
    ({"inputs": None}, "inputs"),
])
def test_the_field_only_one_apis_body_has_tells_the_api(body: dict, field: str) -> None:
    assert sagemaker.api_field(body) == field


@pytest.mark.parametrize("body", [{}, {"text_input": "Hi"}, ["inputs"], "inputs", None])
def test_a_body_for_no_api_is_refused_naming_the_fields_expected(body: object) -> None:
    with pytest.raises(RequestError) as refused:
        sagemaker.api_field(body)
    assert refused.value.status == 400
    assert all(f"`{field}`" in refused.value.message for field in sagemaker.API_FIELDS)


def test_each_body_is_served_by_its_routes_protocol() -> None:
    handlers = {pattern: handler for pattern, handler, _ in ROUTES[Plane.BUSINESS]}
    bodies = {"inputs": {"inputs": "Hi"}, "messages": {"messages": [USER]},
              "prompt": {"prompt": "Hi"}}
    speaking = {field: sagemaker.INVOCATIONS.speaking(body) for field, body in bodies.items()}
    assert speaking == {"inputs": handlers[r"/"].protocol,
                        "messages": handlers[r"/v1/chat/completions"].protocol,
                        "prompt": handlers[r"/v1/completions"].protocol}
    assert set(speaking) == set(sagemaker.API_FIELDS)
    assert handlers[r"/invocations"].protocol is sagemaker.INVOCATIONS
    assert handlers[r"/invocations"].runs_inference
