"""Request bodies with a Content-Encoding, decoded chunk by chunk (gateway/content_coding.py)."""

from __future__ import annotations

import gzip
import zlib

import pytest

from switchboard.gateway.content_coding import body_decoder
from switchboard.gateway.errors import RequestError

BODY = b'{"text_input": "The capital of France is", "parameters": {"max_new_tokens": 4}}'
ENCODERS = {"gzip": gzip.compress, "deflate": zlib.compress}


def decode_in_chunks(coding: str, data: bytes, limit: int = 1 << 20, size: int = 7) -> bytes:
    decoder = body_decoder(coding, limit)
    decoded = b"".join(decoder.decode(data[i:i + size]) for i in range(0, len(data), size))
    decoder.finish()
    return decoded


@pytest.mark.parametrize("coding", ["gzip", "deflate", "GZip", " deflate "])
def test_a_body_is_decoded_whatever_its_chunks(coding) -> None:
    data = ENCODERS[coding.strip().lower()](BODY)
    assert decode_in_chunks(coding, data) == decode_in_chunks(coding, data, size=len(data)) == BODY


@pytest.mark.parametrize("header", [None, "identity", "Identity"])
def test_an_identity_body_needs_no_decoder(header) -> None:
    assert body_decoder(header, 100) is None


def refusal(call) -> RequestError:
    with pytest.raises(RequestError) as caught:
        call()
    return caught.value


@pytest.mark.parametrize("header", ["br", "compress", "gzip, br", "zstd"])
def test_another_coding_is_refused_with_415_naming_the_header(header) -> None:
    error = refusal(lambda: body_decoder(header, 100))
    assert (error.status, error.field) == (415, "Content-Encoding")
    assert error.message == (f"Content-Encoding: {header!r} is not supported; use gzip, "
                             "deflate or identity")


def test_a_body_that_inflates_past_the_limit_is_413_before_it_is_all_decoded() -> None:
    bomb = gzip.compress(bytes(10 << 20))
    decoder = body_decoder("gzip", 1 << 16)
    error = refusal(lambda: decoder.decode(bomb))
    assert error.status == 413
    assert error.message == "the body, decoded from gzip, is over the limit of 65536 bytes"
    assert decode_in_chunks("gzip", gzip.compress(bytes(1 << 16)), limit=1 << 16) == \
        bytes(1 << 16)


@pytest.mark.parametrize("data, reason", [
    (BODY, "incorrect header check"),  # not gzip at all
    (gzip.compress(BODY)[:-9], "ends before its compressed data does"),
    (gzip.compress(BODY) + b"x", "data follows the end of the compressed body"),
])
def test_a_body_that_is_not_what_its_coding_says_is_400_naming_the_header(data, reason) -> None:
    error = refusal(lambda: decode_in_chunks("gzip", data))
    assert (error.status, error.field) == (400, "Content-Encoding")
    assert error.message.startswith("Content-Encoding: the body is not valid gzip data")
    assert reason in error.message
