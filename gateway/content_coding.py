"""Request bodies sent with a Content-Encoding: gzip and deflate are decoded as they arrive,
as Triton's HTTP server does for `tritonclient.http`'s `request_compression_algorithm`; any
other coding is refused with 415 and the codings accepted (RFC 9110 §15.5.16)."""

from __future__ import annotations

import zlib

from switchboard.gateway.errors import RequestError

# zlib's window bits for each coding: gzip's wrapper, and HTTP's deflate, which is zlib's.
WINDOW_BITS = {"gzip": 16 + zlib.MAX_WBITS, "x-gzip": 16 + zlib.MAX_WBITS,
               "deflate": zlib.MAX_WBITS}
ACCEPTED = "gzip, deflate"
UNSUPPORTED_STATUS = 415


class BodyDecoder:
    """Decodes one body, chunk by chunk, never holding more than `limit` decoded bytes: a
    small body that inflates past the limit is refused as soon as it does (413)."""

    def __init__(self, coding: str, limit: int) -> None:
        self.coding = coding
        self._limit = limit
        self._size = 0
        self._inflater = zlib.decompressobj(WINDOW_BITS[coding])

    def decode(self, chunk: bytes) -> bytes:
        if self._inflater.eof:
            if chunk:
                raise self._invalid("data follows the end of the compressed body")
            return b""
        try:
            data = self._inflater.decompress(chunk, self._limit - self._size + 1)
        except zlib.error as error:
            raise self._invalid(str(error)) from None
        self._size += len(data)
        if self._size > self._limit or self._inflater.unconsumed_tail:
            raise RequestError(413, f"the body, decoded from {self.coding}, is over the limit "
                                    f"of {self._limit} bytes")
        if self._inflater.unused_data:
            raise self._invalid("data follows the end of the compressed body")
        return data

    def finish(self) -> None:
        """The body has ended: its compressed data must have too."""
        if not self._inflater.eof:
            raise self._invalid("the body ends before its compressed data does")

    def _invalid(self, reason: str) -> RequestError:
        return RequestError(400, f"Content-Encoding: the body is not valid {self.coding} data "
                                 f"({reason})", "Content-Encoding")


def body_decoder(content_encoding: str | None, limit: int) -> BodyDecoder | None:
    """The decoder of a body sent with this Content-Encoding header; None for none needed."""
    coding = (content_encoding or "identity").strip().lower()
    if coding == "identity":
        return None
    if coding not in WINDOW_BITS:
        raise RequestError(UNSUPPORTED_STATUS, f"Content-Encoding: {content_encoding!r} is not "
                                               f"supported; use {ACCEPTED} or identity",
                           "Content-Encoding")
    return BodyDecoder(coding, limit)
