"""What stands in front of the team server's web apps (the Prefect server's and the results site): an answer only
for requests that name the server by one of its own names (a DNS rebinding page names the attacker's domain),
frame and sniffing protection on every answer, a page of another site (its Origin header) kept from changing
anything or opening a websocket (browsers apply CORS to neither: a form's POST is sent, a websocket opened, whatever
the answer says), and a malformed Basic sign-in refused with 401 (Prefect's server fails with a 500 and a traceback
on one that decodes to non-ASCII text, or on a websocket's sign-in message that is not ASCII), and wrong sign-ins
throttled per client as the results site throttles them (Prefect's server counts none)."""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import json
import math
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from starlette.middleware.trustedhost import TrustedHostMiddleware

from flagperf.site.auth import Credentials, SignInThrottle

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
FOREIGN = "a page of another site (its Origin) may not change anything here nor open a websocket"
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")  # OPTIONS: a CORS preflight, which the CORS middleware answers
LOCKED_OUT = "too many wrong sign-ins from this address; try again later"
# How often, at most, a Host that is not one of the names has the names read again (reread): a request naming
# another site must not make the server list its interfaces at the attacker's pace.
REREAD_EVERY_S = 10.0


def missing(have: Any, headers: Iterable[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The ``headers`` whose name is not among ``have``'s (pairs of names and values, bytes or text)."""
    named = {(name.encode("latin-1") if isinstance(name, str) else bytes(name)).lower() for name, _ in have}
    return [(name, value) for name, value in headers if name.lower() not in named]


async def _passed(scope: Scope, receive: Receive, send: Send) -> None:
    scope["flagperf.host_ok"] = True


async def _discard(message: Any) -> None:
    return None


async def _nothing() -> Any:
    return {"type": "http.disconnect"}


def bracketed(name: str) -> str:
    """``name`` as a Host header has it: an IPv6 address in brackets."""
    name = name.strip("[]")
    return f"[{name}]" if ":" in name else name


def interface_addresses() -> list[str]:
    """The addresses of this machine's interfaces as they are now (an address DHCP changed, an interface added since
    the server started), as Host headers name them: what a Host that misses has read again (HostCheck's reread).
    No DNS: a lookup on a slow resolver would stall the server's event loop, at any stranger's request."""
    import psutil

    return sorted({bracketed(str(a.address).split("%")[0]).lower()
                   for addresses in psutil.net_if_addrs().values()
                   for a in addresses if a.family in (socket.AF_INET, socket.AF_INET6)})


def machine_names() -> list[str]:
    """This machine's names (its host name and the one DNS gives for it) and the addresses of its interfaces, as
    Host headers name them: read once, at start (a DNS lookup may take seconds)."""
    names = {socket.getfqdn(), socket.gethostname()} - {""}
    return sorted({*(bracketed(name).lower() for name in names), *interface_addresses()})


DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def host_port(scope: Scope) -> int | None:
    """The port a request's one Host header names (the scheme's default where it names none); None where it has
    not exactly one Host, or names a port that does not parse."""
    hosts = [value for name, value in scope.get("headers") or [] if name.lower() == b"host"]
    if len(hosts) != 1:
        return None
    try:
        port = urlsplit(f"//{hosts[0].decode('latin-1').strip()}").port
    except ValueError:
        return None
    return port if port is not None else DEFAULT_PORTS.get(str(scope.get("scheme") or "http"))


class HostCheck:
    """Whether a request's Host header is one of ``names`` (host names or addresses, an IPv6 one in brackets, any
    port unless ``own_port``: then only the port the request came in on), decided by Starlette's
    TrustedHostMiddleware (its parsing of the header, its matching). ``reread``
    (interface_addresses, for a server on every interface): where a Host is not one of them, the names it gives are
    added (read again at most every ``every_s`` seconds of ``clock``) before the Host is refused: an address the
    machine got since the server started is its own. Each read replaces the one before: an address it no longer
    lists (DHCP gave it to another machine) is dropped; ``names``, those given at start, are always kept."""

    def __init__(self, names: Iterable[str], reread: Callable[[], Iterable[str]] | None = None,
                 clock: Callable[[], float] = time.monotonic, every_s: float = REREAD_EVERY_S,
                 own_port: bool = False) -> None:
        self.reread, self.clock, self.every_s, self.own_port = reread, clock, every_s, own_port
        self.read_at: float | None = None
        self._use(names)
        self.given = set(self.names)

    @property
    def added(self) -> set[str]:
        """The names ``reread`` added: addresses this machine got since the server started."""
        return set(self.names) - self.given

    def _use(self, names: Iterable[str]) -> None:
        self.names = sorted({name.lower() for name in names if name})
        self._check = TrustedHostMiddleware(_passed, allowed_hosts=self.names, www_redirect=False)

    async def _matches(self, scope: Scope) -> bool:
        probe = {**scope, "type": "http"}  # a websocket's handshake is checked as a request
        await self._check(probe, _nothing, _discard)
        return bool(probe.get("flagperf.host_ok"))

    async def refused(self, scope: Scope) -> str | None:
        """None where the Host is one of the names (on the port the server listens on, with ``own_port``), else the
        one line to answer (400)."""
        if await self._matches(scope):
            return self._other_port(scope)
        now = self.clock()
        if self.reread is not None and (self.read_at is None or now - self.read_at >= self.every_s):
            self.read_at = now
            self._use([*self.given, *self.reread()])  # the last read's addresses only: a gone one is dropped
            if await self._matches(scope):
                return self._other_port(scope)
        return (f"{REBINDING}: Host {_given_host(scope)!r} is not one of this server's names; open it by the address "
                "its banner shows\n")

    def _other_port(self, scope: Scope) -> str | None:
        """With ``own_port``, the line refusing a Host (one of the names) that names a port other than the one the
        request came in on: every client of such a server names its port, so such a request came by something
        else (a forwarder from another port that keeps the Host), never one of them."""
        listening = (scope.get("server") or (None, None))[1]
        if not self.own_port or (listening is not None and host_port(scope) == listening):
            return None
        given = _given_host(scope)
        if ":" in given.rsplit("]", 1)[-1]:  # after an IPv6 address's bracket: its own colons are no port
            said = "names another port than this server's" + (f" ({listening})" if listening is not None else "")
        else:
            said = "names no port" + (f" (this server listens on {listening})" if listening is not None else "")
        return f"{REBINDING}: Host {given!r} {said}; open it by the address its banner shows\n"


def _given_host(scope: Scope) -> str:
    return dict(scope.get("headers") or []).get(b"host", b"").decode("latin-1")


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


def origin_of(url: str) -> str:
    """An origin as a browser's Origin header says it: scheme and host in lower case, no default port, no
    userinfo or path ("http://Lab:80/x" is "http://lab"); "" (which matches no origin) where the port does not
    parse."""
    parts = urlsplit(url.strip())
    scheme, host = parts.scheme.lower(), (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:  # no origin a browser sends: matched by none (Front.foreign)
        return ""
    host = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}.get(scheme)
    return f"{scheme}://{host}" + (f":{port}" if port is not None and port != default else "")


def own_origin(scope: Scope, addresses: Iterable[str]) -> str:
    """The origin of a page the server served under one of ``addresses`` (those HostCheck's reread added, in no
    list made at start) on the port it listens on: the request's scheme and Host; "" (matching none) for any other
    Host, or without exactly one. Not for the configured names: behind a TLS proxy uvicorn sees http, and a page
    at http://alias would pass for the https://alias the operator named."""
    hosts = [value for name, value in scope.get("headers") or [] if name.lower() == b"host"]
    server = scope.get("server") or (None, None)
    if len(hosts) != 1 or server[1] is None:
        return ""
    scheme = str(scope.get("scheme") or "http")
    scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)  # a websocket's handshake: its page's scheme
    origin = origin_of(f"{scheme}://{hosts[0].decode('latin-1')}")
    if not origin or host_port(scope) != server[1] or bracketed(urlsplit(origin).hostname or "") not in set(addresses):
        return ""
    return origin


def authorizations(scope: Scope) -> list[bytes]:
    """Every Authorization header of a request (Starlette reads the first, a check that read the last one would
    let a malformed first one through)."""
    return [value for name, value in scope.get("headers") or [] if name.lower() == b"authorization"]


def first_message_ok(message: Any) -> bool:
    """Whether a websocket's first message is one Prefect's check reads without a traceback: a text frame holding
    a JSON object whose token is missing, null or ASCII text (its hmac.compare_digest raises on any other, its
    json.loads on a binary frame or non-JSON text, its .get on a list or string)."""
    text = message.get("text")
    if not isinstance(text, str):
        return False
    try:
        parsed = json.loads(text)
    except ValueError:
        return False
    if not isinstance(parsed, dict):
        return False
    token = parsed.get("token")
    return token is None or (isinstance(token, str) and token.isascii())


class Front:
    """The Prefect server's app behind the checks of this module. ``names``: the server's own (HostCheck);
    ``signed_in``: whether the server asks for a sign-in (only then is a malformed one refused: without one,
    Prefect ignores the header); ``origins``: the pages allowed to change things and open websockets (the CORS
    origins; "*", any site's page, is refused: a ValueError), besides that of a page the server served under an
    address it got since it started (HostCheck's ``reread``) on the port it listens on (own_origin). A request
    without an Origin (Prefect's clients, its workers, curl) is not a page's. ``own_port``: the Host must name the
    port the server listens on too (a server no proxy stands in front of: flows.team_app.temporary_app).
    ``credentials``: the server's sign-in, where it has one: a client of the network whose wrong sign-ins
    (an Authorization header, a websocket's sign-in message) ``throttle`` locks out gets 429 (its websocket closed
    at the handshake) until the lockout ends, its sign-in unchecked; a client on this machine (loopback, once
    uvicorn took a local proxy's X-Forwarded-For) is never locked out: the server's worker and flow runs speak
    from there, and a guesser of the network could otherwise stop them."""

    def __init__(self, app: ASGIApp, names: Iterable[str], signed_in: bool, origins: Iterable[str] = (),
                 reread: Callable[[], Iterable[str]] | None = None, own_port: bool = False,
                 credentials: Credentials | None = None, throttle: SignInThrottle | None = None) -> None:
        self.app, self.hosts, self.signed_in = app, HostCheck(names, reread, own_port=own_port), signed_in
        self.credentials, self.throttle = credentials, throttle or SignInThrottle()
        origins = [origin.strip() for origin in origins if origin.strip()]
        if "*" in origins:
            raise ValueError("the origin '*' would let a page of any site change things and open websockets")
        self.origins = {origin_of(origin) for origin in origins} - {""}

    def foreign(self, scope: Scope) -> bool:
        """Whether the request comes from a page whose origin is not allowed (no Origin: not a page's)."""
        given = [value for name, value in scope.get("headers") or [] if name.lower() == b"origin"]
        if not given:
            return False
        origin = origin_of(given[0].decode("latin-1"))
        return len(given) > 1 or not origin or origin not in (self.origins | {own_origin(scope, self.hosts.added)})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan: Prefect's services start and stop with it
            await self.app(scope, receive, send)
            return
        refused = await self.hosts.refused(scope)
        if scope["type"] == "websocket":
            if refused is not None or self.foreign(scope) or self._locked_out(scope) > 0:
                reason = REBINDING if refused is not None else FOREIGN if self.foreign(scope) else LOCKED_OUT
                await send({"type": "websocket.close", "code": 1008, "reason": reason})
                return
            await self.app(scope, self._checked_first(receive, scope), send)
            return

        async def with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":  # only those the answer lacks: none named twice
                have = list(message.get("headers", []))
                message["headers"] = [*have, *missing(have, FRAME_HEADERS)]
            await send(message)

        if refused is not None:
            await answer(with_headers, 400, refused.encode(), b"text/plain; charset=utf-8")
            return
        if scope.get("method", "GET") not in SAFE_METHODS and self.foreign(scope):
            await answer(with_headers, 403, f"{FOREIGN}\n".encode(), b"text/plain; charset=utf-8")
            return
        given = authorizations(scope)
        if self.signed_in and (len(given) > 1 or any(malformed_basic(value) for value in given)):
            await answer(with_headers, 401, json.dumps({"exception_message": "Unauthorized"}).encode(),
                         b"application/json")
            return
        if self.signed_in and given:  # one, well-formed (above); a request without a sign-in is no guess
            if (wait := self._locked_out(scope)) > 0:
                await answer(with_headers, 429, json.dumps({"exception_message": LOCKED_OUT}).encode(),
                             b"application/json", [(b"retry-after", str(math.ceil(wait)).encode())])
                return
            self._counted(scope, base64.b64decode(given[0].split()[1]))
        await self.app(scope, receive, with_headers)

    def _throttled_client(self, scope: Scope) -> str | None:
        """The client whose sign-ins are counted: None without credentials, or for one on this machine."""
        if self.credentials is None:
            return None
        client = str((scope.get("client") or ("unknown", 0))[0])
        try:
            address = ipaddress.ip_address(client.split("%")[0])
        except ValueError:
            return client
        mapped = getattr(address, "ipv4_mapped", None)
        return None if address.is_loopback or (mapped is not None and mapped.is_loopback) else client

    def _locked_out(self, scope: Scope) -> float:
        client = self._throttled_client(scope)
        return self.throttle.wait_s(client) if client is not None else 0.0

    def _counted(self, scope: Scope, given: bytes) -> None:
        """A sign-in ``given`` (user:password) of the request's client, counted right or wrong."""
        client = self._throttled_client(scope)
        if client is None or self.credentials is None:
            return
        if hmac.compare_digest(given, self.credentials.auth_string.encode("utf-8")):
            self.throttle.succeeded(client)
        else:
            self.throttle.failed(client, given)

    def _checked_first(self, receive: Receive, scope: Scope) -> Receive:
        """``receive`` with a first message Prefect cannot read without a traceback (first_message_ok) made an
        invalid one, which Prefect refuses (1008) as any wrong one; with or without a sign-in. A sign-in message's
        token is counted, right or wrong (a websocket is a way to guess the password too)."""
        first = [True]

        async def checked() -> Any:
            message = await receive()
            if first[0] and message.get("type") == "websocket.receive":
                first[0] = False
                if not first_message_ok(message):
                    message = {"type": "websocket.receive", "text": json.dumps({"type": "invalid"}), "bytes": None}
                else:
                    token = json.loads(message["text"]).get("token")
                    if isinstance(token, str) and token:
                        self._counted(scope, token.encode("ascii"))
            return message

        return checked


async def answer(send: Send, status: int, body: bytes, content_type: bytes,
                 extra: list[tuple[bytes, bytes]] | None = None) -> None:
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", content_type), (b"content-length", str(len(body)).encode()), *(extra or [])]})
    await send({"type": "http.response.body", "body": body})
