"""uvicorn with the security headers on the answers it makes itself, not only on the app's: a malformed request's
400 (h11 writes it without uvicorn's default headers), a websocket handshake it refuses (no Sec-WebSocket-Key:
400, an unknown version: 426), the 403 of a websocket the app closed before accepting it, its 500s and 503s.

uvicorn's own ``headers=`` (Config) is no answer: it is added to every answer of the app as well (the apps send
theirs already: each would come twice) and still misses h11's 400 and the websocket handshake's refusals. So the
protocols here add, to every response head the connection writes, each of ``headers`` the head does not name yet:
an answer of the app keeps its own, one of uvicorn's gets them all."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from flagperf.site.front import missing

Headers = Sequence[tuple[bytes, bytes]]


def protocols(headers: Headers) -> tuple[type[H11Protocol], type[WebSocketsSansIOProtocol]]:
    """uvicorn's HTTP (h11) and websocket (websockets, sans-I/O) protocols, each adding ``headers`` to the
    response heads that lack them. The same two `auto` picks where httptools is not installed; chosen whatever is
    installed, so that every answer is covered (httptools' would need its own)."""
    own = list(headers)

    class HTTP(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            send = self.conn.send  # every head passes here: the app's, the 500, the 503 and the 400 of a bad request

            def with_headers(event: Any) -> bytes | None:
                if isinstance(event, h11.Response) and (extra := missing(event.headers, own)):
                    event = h11.Response(status_code=event.status_code, headers=[*event.headers, *extra],
                                         reason=event.reason, http_version=event.http_version)
                return send(event)

            self.conn.send = with_headers  # type: ignore[method-assign]

    class WebSocket(WebSocketsSansIOProtocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            send_response = self.conn.send_response  # the handshake's answer: 101, or a refusal of either side

            def with_headers(response: Any) -> None:
                for name, value in missing(response.headers.raw_items(), own):
                    response.headers[name.decode("latin-1")] = value.decode("latin-1")
                send_response(response)

            self.conn.send_response = with_headers  # type: ignore[method-assign]

    return HTTP, WebSocket


def config(app: Any, headers: Headers, **options: Any) -> uvicorn.Config:
    """uvicorn's Config for ``app`` (``options`` as uvicorn.Config takes them) whose every answer carries
    ``headers`` (those it lacks)."""
    http, ws = protocols(headers)
    return uvicorn.Config(app, http=http, ws=ws, **options)
