"""The team server's Prefect server, as `prefect server start` runs it in the foreground (Prefect's app with its UI
and services, on uvicorn, with the same settings: keep-alive, websocket pings, log level; graceful stop on
SIGTERM), but behind flagperf.site.front.Front: only requests naming the server by its own names, frame
protection, a page of another site kept from changing anything or opening a websocket, a malformed sign-in
refused with 401, wrong sign-ins throttled per client of the network. Started by flows.server.serve:

    python -m flows.team_app --host HOST --port PORT --fd FD --name NAME [--name NAME ...] --origin ORIGIN [...]

FD: the listening socket, bound by serve (a port another server holds fails there, naming --port, instead of
that server's /health being taken for this one's). ORIGIN: a page allowed to change things and open websockets
(serve's allowed_origins, which it also sets as Prefect's CORS origins); never "*".

The sign-in comes from Prefect's own setting (PREFECT_SERVER_API_AUTH_STRING), in the environment only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys

from flagperf.site import served
from flagperf.site.auth import SERVER_AUTH_ENV, Credentials
from flagperf.site.front import FRAME_HEADERS, ASGIApp, Front, interface_addresses


def create_app(names: list[str], origins: list[str], reread_names: bool = False) -> ASGIApp:
    """Prefect's app (create_app, final, with its services and UI, as `prefect server start` makes it) in Front.
    ``origins``: given by serve itself, not read back from Prefect's settings (whose alias an operator's
    environment could set to "*"). ``reread_names``: a Host that misses has the addresses of this machine's
    interfaces read again (a server on every interface: an address it got since it started is its own; no DNS)."""
    import prefect.settings
    from prefect.server.api.server import create_app as prefect_app

    auth_string = prefect.settings.PREFECT_SERVER_API_AUTH_STRING.value()
    # the front throttles wrong sign-ins, as the results site does: Prefect's server counts none
    credentials = Credentials(auth_string, SERVER_AUTH_ENV) if auth_string is not None else None
    return Front(prefect_app(final=True), names, auth_string is not None, origins,
                 interface_addresses if reread_names else None, credentials=credentials)


def temporary_app() -> ASGIApp:
    """`flagperf run`'s temporary server (flows.server.TemporaryServer, uvicorn's --factory): Prefect's API with no
    sign-in on loopback, behind Front: a page of another site whose DNS name was pointed at 127.0.0.1 (DNS
    rebinding) names that site in its Host and is refused, as on the team server; a page's change is refused. Its
    clients name the port it listens on (PREFECT_API_URL) and no proxy stands in front of it, so a Host naming
    another port is refused too."""
    from prefect.server.api.server import create_app as prefect_app

    from flows.server import server_names

    # the names a server bound to loopback answers to, as serve's (one list of them)
    return Front(prefect_app(), server_names("127.0.0.1", []), signed_in=False, own_port=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.team_app",
                                     description="the Prefect server of `flagperf server`, behind its front")
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--fd", type=int, default=None, help="the listening socket, bound already (HOST and PORT "
                                                             "are then only said)")
    parser.add_argument("--name", action="append", default=[], help="a name the server answers to (Host header)")
    parser.add_argument("--origin", action="append", default=[], help="a page's origin allowed to change things and "
                                                                      "open websockets (never '*')")
    parser.add_argument("--reread-names", action="store_true",
                        help="a Host that is none of the names has the addresses of this machine's interfaces "
                             "read again (at most every few seconds, no DNS) before it is refused: for a server on "
                             "every interface")
    args = parser.parse_args(argv)
    if "*" in (origin.strip() for origin in args.origin):
        parser.error("--origin '*' would let a page of any site use the API and its websockets")
    import uvicorn
    from prefect.settings import (
        PREFECT_SERVER_API_KEEPALIVE_TIMEOUT,
        PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL,
        PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT,
        PREFECT_SERVER_LOGGING_LEVEL,
    )

    print(f"flagperf team server: Prefect's server and UI on {args.host}:{args.port}, answering to "
          f"{', '.join(args.name)} (any other Host is refused: DNS rebinding protection)", flush=True)
    # What `prefect server start` passes uvicorn (prefect.cli._server_utils._run_in_foreground, one worker), and
    # the frame headers on uvicorn's own answers too (a malformed request's 400, a refused websocket handshake).
    where = {"fd": args.fd} if args.fd is not None else {"host": args.host, "port": args.port}
    config = served.config(create_app(args.name, args.origin, args.reread_names), FRAME_HEADERS, **where,
                            timeout_keep_alive=PREFECT_SERVER_API_KEEPALIVE_TIMEOUT.value(),
                            ws_ping_interval=PREFECT_SERVER_API_WEBSOCKET_PING_INTERVAL.value(),
                            ws_ping_timeout=PREFECT_SERVER_API_WEBSOCKET_PING_TIMEOUT.value(),
                            log_level=str(PREFECT_SERVER_LOGGING_LEVEL.value()).lower())

    class Server(uvicorn.Server):
        """uvicorn's server that, once it listens on its own copy of --fd (socket.fromfd), closes the inherited
        one: left open, a graceful stop would leave the port accepting connections nobody answers (they hang
        instead of being refused)."""

        async def startup(self, sockets: list[socket.socket] | None = None) -> None:
            await super().startup(sockets)
            if self.config.fd is not None:
                with contextlib.suppress(OSError):
                    os.close(self.config.fd)

    server = Server(config)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run
        server.run()
    # uvicorn ends a stop by a signal by raising that signal again, once shut down (as Prefect's)
    return 0 if server.started else STARTUP_FAILURE


STARTUP_FAILURE = 3  # uvicorn.run's exit code for a server that never started


if __name__ == "__main__":
    sys.exit(main())
