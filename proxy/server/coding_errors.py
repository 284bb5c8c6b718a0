"""Why a request body's content coding cannot be undone; each knows the answer the client gets, if it gets one."""

from __future__ import annotations

from aiohttp import web

from proxy.formats.chat_completions.errors import error_body as openai_error_body
from proxy.server.errors import ErrorShape, error_response


class ContentCodingError(Exception):
    """The body's content coding cannot be undone; `response()` is the answer for the client."""

    status = 400
    code = "invalid_content_encoding"

    def response(self, shape: ErrorShape = openai_error_body) -> web.Response:
        """The error answer, in `shape` (OpenAI's by default)."""
        return error_response(self.status, str(self), type_="invalid_request_error", code=self.code, shape=shape)


class UnsupportedCoding(ContentCodingError):
    """A content coding the proxy cannot undo (unknown, or its library not installed): the body goes as it came.

    Never answered to a client request (`proxy.server.compacted_route` forwards the body untouched and says so); the
    response is what a caller that must refuse would answer.
    """

    status = 415
    code = "unsupported_content_encoding"


class CorruptCoding(ContentCodingError):
    """The body is not valid data of its declared coding."""


class TooManyMembers(ContentCodingError):
    """A gzip body of more members than allowed."""

    code = "too_many_gzip_members"


class InflatesTooFar(ContentCodingError):
    """The body decompresses to more than the limit."""

    status = 413
    code = "request_too_large"
