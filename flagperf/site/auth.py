"""The team server's one sign-in: Prefect's basic auth (a shared ``user:password``), used by the Prefect server
(PREFECT_SERVER_API_AUTH_STRING), its workers and clients (PREFECT_API_AUTH_STRING) and the results site.

Where the credentials come from, first found wins:
  1. the file given by --auth-file or FLAGPERF_AUTH_FILE,
  2. PREFECT_SERVER_API_AUTH_STRING (the server) or PREFECT_API_AUTH_STRING (the server and clients),
  3. the default file, ~/.config/flagperf/server-auth ($XDG_CONFIG_HOME respected), if it exists.
A file holds one line ``user:password`` (a UTF-8 byte order mark before it is taken off), of at most
MAX_AUTH_FILE_BYTES, is readable by its owner only (mode 600) and lies outside the project (a file there could be
committed). The value is never printed or logged: messages name the file, not its text.
"""

from __future__ import annotations

import base64
import binascii
import hmac
import ipaddress
import os
import secrets
import shlex
import socket
import stat
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from flagperf.errors import ConfigError, printable
from flagperf.paths import PROJECT_ROOT

AUTH_FILE_ENV = "FLAGPERF_AUTH_FILE"
SERVER_AUTH_ENV = "PREFECT_SERVER_API_AUTH_STRING"
CLIENT_AUTH_ENV = "PREFECT_API_AUTH_STRING"
MIN_PASSWORD = 12
# A file of one line user:password: far above any sign-in, far below a file read by mistake (a log, an image)
MAX_AUTH_FILE_BYTES = 4096
# The byte order mark an editor may put at a UTF-8 file's start, as printf's escapes: no part of the user name
BOM_OCTAL = r"'\357\273\277'"
TR_LINE_ENDS = r"'\r\n'"  # tr's escapes, for a printed command that stays one line
HOW_TO_SET = (f"put user:password in {{default}} (chmod 600), or export {SERVER_AUTH_ENV}=user:password "
              f"(see docs/team-server.md)")


def default_auth_file() -> Path:
    config = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return config / "flagperf" / "server-auth"


def how_to_set() -> str:
    return HOW_TO_SET.format(default=default_auth_file())


@dataclass(frozen=True)
class Credentials:
    """``user:password``, and where it came from (a file or an environment variable: never the value)."""

    auth_string: str
    source: str

    @property
    def user(self) -> str:
        return self.auth_string.split(":", 1)[0]

    def __repr__(self) -> str:  # a traceback or a debug print shows where, never what
        return f"Credentials(user={self.user!r}, source={self.source!r})"

    def matches(self, authorization: str | None) -> bool:
        """Whether an ``Authorization: Basic ...`` header carries these credentials (constant-time compare)."""
        if not authorization:
            return False
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            given = base64.b64decode(token.strip(), validate=True)
        except (binascii.Error, ValueError):
            return False
        return hmac.compare_digest(given, self.auth_string.encode("utf-8"))

    def exported_in_shell(self, name: str) -> str:
        """POSIX shell that sets and exports ``name`` to the credentials from where they came (the variable, the
        file), its line ends taken off as the server takes them off, and holds neither them nor anything of them:
        what a command printed for the admin to run (flows.server's deploy_command) signs in with. Unset, empty or
        unreadable there, the command stops at it with the shell's one line."""
        if self.source in (SERVER_AUTH_ENV, CLIENT_AUTH_ENV):
            # checked apart: in a pipeline the shell's error would end only its side, and the value be empty
            value = (f': "${{{self.source}:?set {self.source} to user:password as for the server}}" && '
                     f'{name}="$(printf %s "${self.source}" | tr -d {TR_LINE_ENDS})"')
        else:
            # a byte order mark at the start taken off as read_auth_file takes it off (printf's octal: POSIX)
            value = (f'{name}="$(tr -d {TR_LINE_ENDS} < {shlex.quote(os.path.abspath(self.source))})" && '
                     f'{name}="${{{name}#"$(printf {BOM_OCTAL})"}}"')
        return f"{value} && export {name}"


class SignInThrottle:
    """Wrong sign-ins per client (its address): the first ``free`` in a row cost nothing (a typo, a browser
    retrying an old password); each one after that locks the client out for a delay that doubles, from
    ``first_delay_s`` up to ``max_delay_s``, during which its attempts are not even checked. A right sign-in
    clears the count. ``clock`` is injectable so that tests need no sleeping. The table keeps at most
    ``max_clients`` (the least recently failed go first): an attacker with many addresses cannot fill memory. A
    client is an IPv4 address, or an IPv6 one's /64 (client_key). The same wrong sign-in as the client's last one
    is no new guess (a browser or the Prefect UI sending an old password with each request)."""

    def __init__(self, free: int = 5, first_delay_s: float = 1.0, max_delay_s: float = 900.0,
                 max_clients: int = 10_000, clock: Callable[[], float] = time.monotonic) -> None:
        self.free, self.first_delay_s, self.max_delay_s = free, first_delay_s, max_delay_s
        self.max_clients, self.clock = max_clients, clock
        # client: (wrong in a row, locked until, a keyed digest of its last wrong sign-in: never the text)
        self._failures: OrderedDict[str, tuple[int, float, bytes]] = OrderedDict()
        self._digest_key = secrets.token_bytes(16)

    def wait_s(self, client: str) -> float:
        """Seconds before ``client`` may try again; 0 when it may now."""
        failures = self._failures.get(client_key(client))
        return max(0.0, failures[1] - self.clock()) if failures else 0.0

    def failed(self, client: str, given: bytes | None = None) -> float:
        """Count a wrong sign-in of ``client`` (``given``: what it sent, where known); returns the seconds it is
        now locked out for (0: none yet). The same ``given`` as its last wrong one is not counted again."""
        key = client_key(client)
        count, until, last = self._failures.pop(key, (0, 0.0, b""))
        digest = hmac.digest(self._digest_key, given, "sha256") if given is not None else b""
        if digest and hmac.compare_digest(digest, last):
            self._failures[key] = (count, until, last)
            return max(0.0, until - self.clock())
        count += 1
        over = count - self.free
        delay = 0.0 if over <= 0 else min(self.max_delay_s, self.first_delay_s * 2.0 ** min(over - 1, 64))
        self._failures[key] = (count, self.clock() + delay, digest)
        while len(self._failures) > self.max_clients:
            self._failures.popitem(last=False)
        return delay

    def succeeded(self, client: str) -> None:
        self._failures.pop(client_key(client), None)


# An IPv6 host gets a /64 of its own (SLAAC, privacy addresses): any address of it is the same client.
IPV6_CLIENT_PREFIX = 64


def client_key(address: str) -> str:
    """The client an address counts as: an IPv4 address (mapped into IPv6 too) itself, an IPv6 one its /64, a name
    (no address: a test client, a Unix socket) itself."""
    try:
        parsed = ipaddress.ip_address(address.split("%")[0])
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address):
        if parsed.ipv4_mapped is not None:
            return str(parsed.ipv4_mapped)
        return str(ipaddress.IPv6Network((parsed, IPV6_CLIENT_PREFIX), strict=False))
    return str(parsed)


def check_auth_string(value: str, source: str) -> str:
    """A ``user:password`` value, checked: one line, a user name, a password long enough to resist guessing
    from the network."""
    value = value.strip("\r\n")
    user, colon, password = value.partition(":")
    if not colon or not user or any(c.isspace() for c in user):
        raise ConfigError(source, None, "must hold one line user:password (a user name without spaces, a colon, "
                                        "a password)")
    if "\n" in value or "\r" in value:
        raise ConfigError(source, None, "must hold one line user:password, and nothing else")
    # Prefect's server compares the sign-in as a str, which hmac refuses beyond ASCII: every API call would fail
    # with 500.
    if not value.isascii() or not value.isprintable():
        raise ConfigError(source, None, "must hold printable ASCII characters only (Prefect's server fails every "
                                        "call for another); make the password with python -c 'import secrets; "
                                        "print(secrets.token_urlsafe(24))'")
    if len(password) < MIN_PASSWORD:
        raise ConfigError(source, None, f"the password is shorter than {MIN_PASSWORD} characters; make a long one, "
                                        "e.g. python -c 'import secrets; print(secrets.token_urlsafe(24))'")
    return value


def read_auth_file(path: Path) -> Credentials:
    """The credentials in ``path``, after checking that only its owner can read it and that it is no file of this
    project. Checking reads it, never runs it. Its kind, mode, owner and size are checked again on the file opened:
    the one read is the one checked, though the name be replaced meanwhile."""
    where = str(path)
    try:
        info = path.stat()
    except FileNotFoundError:
        raise ConfigError(where, None, f"no such file; {how_to_set()}") from None
    except OSError as exc:
        raise ConfigError(where, None, f"cannot be read: {exc.strerror or exc}") from None
    _check_auth_file(info, path)
    resolved = path.resolve()
    if resolved.is_relative_to(PROJECT_ROOT):
        raise ConfigError(where, None, f"lies inside the project ({printable(str(PROJECT_ROOT))}), where it could be "
                                       f"committed or served; keep it elsewhere, e.g. "
                                       f"{printable(str(default_auth_file()))}")
    try:
        fd = os.open(resolved, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO put there meanwhile: no wait
    except OSError as exc:
        raise ConfigError(where, None, f"cannot be read: {exc.strerror or type(exc).__name__}") from None
    with os.fdopen(fd, "rb") as handle:
        _check_auth_file(os.fstat(fd), path)
        try:
            data = handle.read(MAX_AUTH_FILE_BYTES + 1)
        except OSError as exc:
            raise ConfigError(where, None, f"cannot be read: {exc.strerror or type(exc).__name__}") from None
    if len(data) > MAX_AUTH_FILE_BYTES:  # grown since it was checked
        raise ConfigError(where, None, f"is more than {MAX_AUTH_FILE_BYTES} bytes; a sign-in file holds one line "
                                       "user:password; not read")
    try:
        text = data.decode("utf-8-sig")  # a byte order mark before the user name taken off
    except UnicodeDecodeError:  # the codec's text would quote a byte of the secret and its place: never shown
        raise ConfigError(where, None, "is not UTF-8 text; it must hold one line user:password in UTF-8 (saved "
                                       "as UTF-8, not a legacy code page or UTF-16)") from None
    return Credentials(check_auth_string(text.rstrip("\r\n"), where), where)


def _check_auth_file(info: os.stat_result, path: Path) -> None:
    """A sign-in file's kind, mode, owner and size, as ``info`` (of its name, or of the file opened) gives them."""
    where = str(path)
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(where, None, "is not a regular file")
    if info.st_mode & 0o077:
        raise ConfigError(where, None, f"mode {stat.S_IMODE(info.st_mode):04o} lets others read it; chmod 600 "
                                       f"{printable(shlex.quote(str(path)))}")  # copyable, whatever the name holds
    if info.st_uid != os.geteuid():
        raise ConfigError(where, None, "belongs to another user; the server's own user must own it (chmod 600)")
    if info.st_size > MAX_AUTH_FILE_BYTES:
        raise ConfigError(where, None, f"is {info.st_size} bytes; a sign-in file holds one line user:password, at "
                                       f"most {MAX_AUTH_FILE_BYTES} bytes; not read")


def find_credentials(auth_file: Path | None = None, *, server: bool = True) -> Credentials | None:
    """The credentials from the first source that has them (see the module's text), or None when none does.
    A source that is there but wrong (a readable-by-all file, a short password) is an error, never skipped."""
    named = auth_file or (Path(os.environ[AUTH_FILE_ENV]).expanduser() if os.environ.get(AUTH_FILE_ENV) else None)
    if named is not None:
        return read_auth_file(named)
    for env in ((SERVER_AUTH_ENV, CLIENT_AUTH_ENV) if server else (CLIENT_AUTH_ENV,)):
        if os.environ.get(env):
            return Credentials(check_auth_string(os.environ[env], env), env)
    default = default_auth_file()
    if default.exists() or default.is_symlink():
        return read_auth_file(default)
    return None


def use_client_credentials() -> Credentials | None:
    """For a client of a team server (`flagperf run` with PREFECT_API_URL): PREFECT_API_AUTH_STRING from the
    credentials file when it is not set already. Call before prefect is imported (it reads settings once)."""
    if os.environ.get(CLIENT_AUTH_ENV):
        return None
    found = find_credentials(server=False)
    if found is not None:
        os.environ[CLIENT_AUTH_ENV] = found.auth_string
    return found


# Names of this machine only in a URL (RFC 6761 for localhost and *.localhost; the others are what distributions'
# /etc/hosts give loopback): a browser on this machine that reaches a proxy by one is on this machine. A trailing dot
# (the root) is the same name. Never trusted for an address one listens on: see binds_loopback.
LOOPBACK_NAMES = ("localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback")


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a URL's host) is reachable from this machine only: a loopback name, or a loopback address
    in any form a URL or the resolver takes (127.1, 0x7f.0.0.1, [::1], ::ffff:127.0.0.1)."""
    name = host.strip("[]").lower()
    bare = name[:-1] if name.endswith(".") else name
    if bare in LOOPBACK_NAMES or bare.endswith(".localhost"):
        return True
    literal = _literal_address(name)
    return literal is not None and _loopback_address(literal)


def binds_loopback(host: str) -> bool:
    """Whether listening on ``host`` (a --host) listens on this machine only: a loopback address in any form,
    'localhost', or a name every address of which, as this machine's resolver gives them (those the server binds),
    is loopback. A name the resolver does not map ('localhost.', 'localhost.localdomain' where /etc/hosts lacks it)
    goes to DNS, which could give a network address: not loopback, so the server asks for a sign-in."""
    name = host.strip("[]").lower()
    if name == "localhost":
        return True
    literal = _literal_address(name)
    if literal is not None or not name:
        return literal is not None and _loopback_address(literal)
    try:
        found = {str(info[4][0]) for info in socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)}
    except (OSError, UnicodeError):
        return False
    addresses = [_literal_address(a.split("%")[0]) for a in found]  # fe80::1%eth0: the zone is no part of it
    return bool(addresses) and all(a is not None and _loopback_address(a) for a in addresses)


def _literal_address(name: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``name`` as an address where it is one, in any form (the shorthand forms of IPv4 too: 127.1, octal, hex, as
    inet_aton, browsers and curl read them); None for a name."""
    try:
        return ipaddress.ip_address(name)
    except ValueError:
        pass
    if not name or not set(name) <= set("0123456789abcdefx."):
        return None
    try:
        return ipaddress.ip_address(socket.inet_aton(name))
    except (OSError, ValueError):
        return None  # a name: it may resolve to any interface


def _loopback_address(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    mapped = getattr(address, "ipv4_mapped", None)
    return bool(address.is_loopback or (mapped is not None and mapped.is_loopback))
