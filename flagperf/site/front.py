"""What stands in front of the team server's web apps (the Prefect server's and the results site): an answer only
for requests that name the server by one of its own names (a DNS rebinding page names the attacker's domain),
frame and sniffing protection on every answer, and a malformed Basic sign-in refused with 401 (Prefect's server
fails with a 500 and a traceback on one that decodes to non-ASCII text)."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any

from starlette.middleware.trustedhost import TrustedHostMiddleware

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Any]]
Send = Callable[[Any], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

# Never inside another site's frame (clickjacking: a page of another site overlaying the UI's buttons); never a
# type guessed from the content (an uploaded text served as HTML).
FRAME_HEADERS = [
    (b"x-frame-options", b"DENY"),
    (b"content-security-policy", b"frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
]
REBINDING = "DNS rebinding protection"


async def _passed(scope: Scope, receive: Receive, send: Send) -> None:
    scope["flagperf.host_ok"] = True


async def _discard(message: Any) -> None:
    return None


async def _nothing() -> Any:
    return {"type": "http.disconnect"}


class HostCheck:
    """Whether a request's Host header is one of ``names`` (host names or addresses, an IPv6 one in brackets, any
    port), decided by Starlette's TrustedHostMiddleware (its parsing of the header, its matching)."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = sorted({name.lower() for name in names if name})
        self._check = TrustedHostMiddleware(_passed, allowed_hosts=self.names, www_redirect=False)

    async def refused(self, scope: Scope) -> str | None:
        """None where the Host is one of the names, else the one line to answer (400)."""
        probe = {**scope, "type": "http"}  # a websocket's handshake is checked as a request
        await self._check(probe, _nothing, _discard)
        if probe.get("flagperf.host_ok"):
            return None
        given = dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")
        return (f"{REBINDING}: Host {given!r} is not one of this server's names; open it by the address its "
                "banner shows\n")


def malformed_basic(value: bytes | None) -> bool:
    """Whether an Authorization header is one no sign-in can match and Prefect's server does not refuse cleanly:
    bytes beyond ASCII, not `Basic <base64>`, or base64 of text beyond ASCII. No header is not malformed."""
    if value is None:
        return False
    if not value.isascii():
        return True
    parts = value.split()
    if len(parts) != 2 or parts[0] != b"Basic":
        return True
    try:
        return not base64.b64decode(parts[1], validate=True).decode("ascii").isprintable()
    except (binascii.Error, ValueError):
        return True


class Front:
    """The Prefect server's app behind the checks of this module. ``names``: the server's own (HostCheck);
    ``signed_in``: whether the server asks for a sign-in (only then is a malformed one refused: without one,
    Prefect ignores the header)."""

    def __init__(self, app: ASGIApp, names: Iterable[str], signed_in: bool) -> None:
        self.app, self.hosts, self.signed_in = app, HostCheck(names), signed_in

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan: Prefect's services start and stop with it
            await self.app(scope, receive, send)
            return
        refused = await self.hosts.refused(scope)
        if scope["type"] == "websocket":
            if refused is not None:
                await send({"type": "websocket.close", "code": 1008, "reason": REBINDING})
                return
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *FRAME_HEADERS]
            await send(message)

        if refused is not None:
            await answer(with_headers, 400, refused.encode(), b"text/plain; charset=utf-8")
            return
        if self.signed_in and malformed_basic(dict(scope.get("headers") or []).get(b"authorization")):
            await answer(with_headers, 401, json.dumps({"exception_message": "Unauthorized"}).encode(),
                         b"application/json")
            return
        await self.app(scope, receive, with_headers)


async def answer(send: Send, status: int, body: bytes, content_type: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", content_type), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
