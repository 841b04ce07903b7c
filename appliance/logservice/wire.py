"""The log service's wire as a ``FrameServer`` codec (``ipc.server.WireCodec``).

``HeaderWire`` (the read service, ``appliance.logs.tail``): a request is a
JSON header frame (``appliance.protocol.log_service.decode_header``), a
reply a list of frames the handler made.  A malformed message, and a
request whose handling raised, are answered with one error header (code
``bad``, the request's ``rid`` when it had one), so a reader gets an
answer instead of waiting out its timeout.  Stateless: any thread.
"""

from __future__ import annotations

import logging

from appliance.errors import BadRequestError, BKError
from appliance.protocol.log_service import (
    BAD,
    MUX_KIND,
    decode_header,
    decode_request,
    encode_header,
)

log = logging.getLogger("appliance.logservice")


def error_frames(message: str, rid=None) -> list[bytes]:
    """The one-frame error reply (code ``bad``)."""
    return [encode_header({"op": "error", "code": BAD, "rid": rid, "message": message})]


def _note_failure(doc: dict, exc: Exception, counters: dict | None) -> None:
    """A handler that raised something else than a ``BKError`` (a bug or an
    I/O failure): counted in ``handler_failures`` and logged with its traceback."""
    if not isinstance(exc, BKError):
        if counters is not None:
            counters["handler_failures"] = counters.get("handler_failures", 0) + 1
        log.error("log service: handler failed on %s", doc.get("op"), exc_info=exc)


class HeaderWire:
    """One JSON header per request; replies are the handler's frames."""

    @staticmethod
    def decode(frames: list, limits) -> dict:
        if not frames:
            raise BadRequestError("log service: an empty message")
        return decode_header(frames[0].bytes)

    @staticmethod
    def encode(reply: list, limits) -> list:
        return reply

    @staticmethod
    def rejection(frames: list, exc: BKError) -> list[bytes]:
        return error_frames(str(exc))

    @staticmethod
    def failure(request: dict, exc: Exception, counters: dict | None) -> list[bytes]:
        _note_failure(request, exc, counters)
        return error_frames(str(exc), request.get("rid"))


HEADER_WIRE = HeaderWire()


class MuxRequest(bytes):
    """A multi-log request's one frame (split by the server: ``decode_mux``)."""
    __slots__ = ()


class WriteWire(HeaderWire):
    """The write socket's wire (``appliance.protocol.log_service``): a
    message is one frame, a multi-log request (``MuxRequest``) or one
    request (binary WRITE, or a JSON ``hello``/``ping`` header) decoded to
    (header, records); replies are the frames the server made.  Errors as
    ``HeaderWire``'s, echoing what routes a reply to its producer."""

    @staticmethod
    def decode(frames: list, limits):
        if len(frames) != 1:
            raise BadRequestError(f"log service: a request is one frame, not {len(frames)}")
        frame = frames[0].bytes
        if frame[:1] == _MUX_BYTE:
            return MuxRequest(frame)
        return decode_request([frame])

    @staticmethod
    def failure(request, exc: Exception, counters: dict | None) -> list[bytes]:
        doc = request[0] if isinstance(request, tuple) else {}
        _note_failure(doc, exc, counters)
        echo = {k: doc[k] for k in ("log", "pid", "seq", "gen") if k in doc}
        return [encode_header({**echo, "op": "error", "code": BAD, "message": str(exc)})]


WRITE_WIRE = WriteWire()
_MUX_BYTE = bytes([MUX_KIND])
