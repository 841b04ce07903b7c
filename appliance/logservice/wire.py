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
from appliance.protocol.log_service import BAD, decode_header, encode_header

log = logging.getLogger("appliance.logservice")


def error_frames(message: str, rid=None) -> list[bytes]:
    """The one-frame error reply (code ``bad``)."""
    return [encode_header({"op": "error", "code": BAD, "rid": rid, "message": message})]


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
        if not isinstance(exc, BKError):
            if counters is not None:
                counters["handler_failures"] = counters.get("handler_failures", 0) + 1
            log.error("log service: handler failed on %s", request.get("op"), exc_info=exc)
        return error_frames(str(exc), request.get("rid"))


HEADER_WIRE = HeaderWire()
