"""The results site's throttle of wrong sign-ins, on an injected clock (no sleeping, no timing): free tries, then
a lockout that doubles up to its cap, per client, cleared by a right sign-in, in a table of bounded size."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from flagperf.site.auth import SignInThrottle


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_wrong_sign_ins_lock_the_client_out_for_longer_and_longer() -> None:
    clock = Clock()
    throttle = SignInThrottle(free=3, first_delay_s=2.0, max_delay_s=16.0, clock=clock)
    assert [throttle.failed("10.0.0.9") for _ in range(3)] == [0.0, 0.0, 0.0]  # typos cost nothing
    assert throttle.wait_s("10.0.0.9") == 0.0
    assert throttle.failed("10.0.0.9") == 2.0
    assert throttle.wait_s("10.0.0.9") == 2.0 and throttle.wait_s("10.0.0.8") == 0.0  # that client alone
    clock.now += 1.5
    assert throttle.wait_s("10.0.0.9") == 0.5
    clock.now += 0.5
    assert throttle.wait_s("10.0.0.9") == 0.0
    assert [throttle.failed("10.0.0.9") for _ in range(4)] == [4.0, 8.0, 16.0, 16.0]  # doubling, capped
    throttle.succeeded("10.0.0.9")
    assert throttle.wait_s("10.0.0.9") == 0.0 and throttle.failed("10.0.0.9") == 0.0  # the count starts again


def test_the_table_of_clients_stays_bounded() -> None:
    throttle = SignInThrottle(free=0, first_delay_s=60.0, max_clients=3, clock=Clock())
    for n in range(10):
        throttle.failed(f"10.0.0.{n}")
    locked = [n for n in range(10) if throttle.wait_s(f"10.0.0.{n}") > 0]
    assert locked == [7, 8, 9]


def test_loopback_is_recognised_in_every_form_and_a_lookalike_is_not() -> None:
    """Whether a --host, or a --public-url's host, is this machine only (a server beyond it needs a sign-in): the
    names and address forms that mean loopback whatever they are spelt as (a server behind a proxy at
    http://localhost.:4200, or 127.1, was refused a start without a sign-in), and nothing that only looks like one
    (a name that resolves anywhere, another address, the wildcards)."""
    from urllib.parse import urlsplit

    from flagperf.site.auth import is_loopback

    for host in ("localhost", "LocalHost", "localhost.", "localhost.localdomain", "localhost.localdomain.",
                 "perf.localhost", "ip6-localhost", "127.0.0.1", "127.1", "127.0.1", "127.255.255.254", "0x7f.1",
                 "2130706433", "::1", "[::1]", "0:0:0:0:0:0:0:1", "::ffff:127.0.0.1", "[::ffff:127.0.0.9]"):
        assert is_loopback(host), host
    for host in ("perf-lab", "perf-lab.example.org", "localhost.example.org", "localhostx", "127.0.0.1.nip.io",
                 "10.1.2.3", "1", "0.0.0.0", "::", "", "fe80::1", "::ffff:10.1.2.3", "0x0a.1", "128.0.0.1"):
        assert not is_loopback(host), host
    for url in ("http://localhost.:4200", "http://127.1:4200", "http://[::ffff:127.0.0.1]:4200",
                "http://LOCALHOST.localdomain:4200/"):
        assert is_loopback(urlsplit(url).hostname or ""), url


def test_a_host_to_listen_on_is_loopback_only_where_this_machine_resolves_it_so(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """--host (what the server binds): a name this machine's resolver does not map goes to DNS, which may answer a
    network address; such a name (localhost., localhost.localdomain, foo.localhost where /etc/hosts lacks them) is
    not loopback, so the server needs a sign-in (it listened on the network with none)."""
    import socket

    from flagperf.site.auth import binds_loopback

    for host in ("localhost", "LOCALHOST", "127.0.0.1", "127.1", "0x7f.1", "::1", "[::1]", "::ffff:127.0.0.1"):
        assert binds_loopback(host), host
    for host in ("0.0.0.0", "::", "", "10.1.2.3", "fe80::1", "perf-lab.invalid", "localhost.invalid"):
        assert not binds_loopback(host), host
    real = socket.getaddrinfo
    answers = {"lab-dns.example": ["10.9.8.7"], "both.example": ["127.0.0.1", "10.9.8.7"],
               "here.example": ["127.0.1.1", "::1"]}

    def resolve(name: str, *args: object, **kwargs: object) -> list[tuple[object, ...]]:
        for alias in ("localhost.", "localhost.localdomain", "foo.localhost", "ip6-localhost"):
            answers.setdefault(alias, ["192.0.2.10"])  # what a DNS server may answer for a name /etc/hosts lacks
        if name not in answers:
            return real(name, *args, **kwargs)
        return [(socket.AF_INET6 if ":" in a else socket.AF_INET, socket.SOCK_STREAM, 6, "", (a, 0))
                for a in answers[name]]

    monkeypatch.setattr(socket, "getaddrinfo", resolve)
    for host in ("localhost.", "localhost.localdomain", "foo.localhost", "ip6-localhost", "lab-dns.example",
                 "both.example"):
        assert not binds_loopback(host), host
    assert binds_loopback("here.example") and binds_loopback("localhost")  # every address loopback
    from flows.server import beyond_loopback

    assert beyond_loopback("localhost.localdomain") == ("--host", "localhost.localdomain")
    assert beyond_loopback("127.1", {"--public-url": "http://localhost.localdomain:4200"}) is None  # a URL's host


def test_a_credentials_files_advice_names_it_copyably_whatever_its_name_holds(tmp_path: Path) -> None:
    """The chmod the error suggests is a command to copy: the file's path shell-quoted and escaped (a space or a
    newline in a folder's name was shown as a plain space, a command for another file)."""
    from flagperf.errors import ConfigError
    from flagperf.site.auth import read_auth_file

    folder = tmp_path / "my  conf\tdir\nx"
    folder.mkdir()
    path = folder / "server-auth"
    path.write_text("user:long-enough-password-1234\n")
    path.chmod(0o644)
    with pytest.raises(ConfigError) as info:
        read_auth_file(path)
    shown = f"{tmp_path}/my  conf\\tdir\\nx/server-auth"
    assert str(info.value) == f"{shown}: mode 0644 lets others read it; chmod 600 '{shown}'", str(info.value)


@pytest.mark.parametrize("body", ["user:pässwörd-long-enough\n".encode("latin-1"),
                                  "user:long-enough-password\n".encode("utf-16")])
def test_a_credentials_file_that_is_not_utf8_is_one_line_that_shows_none_of_it(tmp_path: Path, body: bytes) -> None:
    """A file saved in a legacy code page or as UTF-16 was 'cannot be read: 'utf-8' codec can't decode byte 0xe4
    in position 6...': a byte of the password and where it lies. Now one line naming the file and what it must be."""
    from flagperf.errors import ConfigError
    from flagperf.site.auth import find_credentials

    path = tmp_path / "server-auth"
    path.write_bytes(body)
    path.chmod(0o600)
    with pytest.raises(ConfigError) as info:
        find_credentials(path)
    assert str(info.value) == (f"{path}: is not UTF-8 text; it must hold one line user:password in UTF-8 (saved as "
                               "UTF-8, not a legacy code page or UTF-16)")


def test_a_credentials_file_with_a_byte_order_mark_signs_in_as_its_user(tmp_path: Path) -> None:
    """An editor that saves UTF-8 with a byte order mark put it before the user name: the file was refused as not
    printable ASCII, and the command printed for a worker would have signed in with it. Both take it off."""
    import subprocess

    from flagperf.site.auth import CLIENT_AUTH_ENV, read_auth_file

    secret = "lab:long-enough-password-1234"
    path = tmp_path / "server-auth"
    path.write_bytes(b"\xef\xbb\xbf" + secret.encode() + b"\r\n")
    path.chmod(0o600)
    found = read_auth_file(path)
    assert (found.auth_string, found.user) == (secret, "lab")
    shell = f'{found.exported_in_shell(CLIENT_AUTH_ENV)} && printf %s "${CLIENT_AUTH_ENV}"'
    assert "long-enough" not in shell
    for sh in ("sh", "bash"):
        ran = subprocess.run([sh, "-c", shell], capture_output=True, timeout=60, env={"PATH": os.environ["PATH"]})
        assert (ran.returncode, ran.stdout) == (0, secret.encode()), (sh, ran.stderr)


def test_a_credentials_file_too_large_is_one_line_that_shows_none_of_it(tmp_path: Path) -> None:
    """A file named by mistake (a log, a key) was read whole, however large; now one line naming the file and its
    size, never read, so nothing of it can reach the message."""
    from flagperf.errors import ConfigError
    from flagperf.site.auth import MAX_AUTH_FILE_BYTES, find_credentials

    path = tmp_path / "server-auth"
    body = b"lab:" + b"secretpw" * (MAX_AUTH_FILE_BYTES // 8)
    path.write_bytes(body)
    path.chmod(0o600)
    with pytest.raises(ConfigError) as info:
        find_credentials(path)
    assert str(info.value) == (f"{path}: is {len(body)} bytes; a sign-in file holds one line user:password, at most "
                               f"{MAX_AUTH_FILE_BYTES} bytes; not read")
    path.write_bytes(body[:MAX_AUTH_FILE_BYTES])  # at the limit: read, and judged as any other
    assert find_credentials(path).auth_string == body[:MAX_AUTH_FILE_BYTES].decode()


def test_the_addresses_of_one_ipv6_network_are_one_client() -> None:
    """An attacker given an IPv6 /64 (every host of a LAN segment is) has 2**64 addresses: counted per address,
    each got its free tries, and enough of them pushed the locked ones out of the table. A /64 is one client; an
    IPv4 address, and an IPv4 one mapped into IPv6, stays its own."""
    throttle = SignInThrottle(free=2, first_delay_s=60.0, clock=Clock())
    for n in range(3):
        throttle.failed(f"2001:db8:1:2::{n + 1:x}")
    assert throttle.wait_s("2001:db8:1:2:ffff::9") == 60.0
    assert throttle.wait_s("2001:db8:1:3::1") == 0.0  # another network
    for n in range(3):
        throttle.failed(f"10.0.0.{n}")
    assert throttle.wait_s("10.0.0.9") == 0.0 and throttle.wait_s("::ffff:10.0.0.9") == 0.0
    throttle.failed("::ffff:10.0.0.7")
    throttle.failed("10.0.0.7")
    assert throttle.wait_s("10.0.0.7") == 0.0 and throttle.failed("::ffff:10.0.0.7") == 60.0


def test_the_same_wrong_sign_in_again_is_no_new_guess() -> None:
    """A browser or the Prefect UI that keeps sending an old password (after the password was changed) is one
    wrong guess, not one per request: it was locked out for up to 15 minutes, the right password with it. A
    different wrong one is a guess again."""
    throttle = SignInThrottle(free=1, first_delay_s=10.0, clock=Clock())
    assert [throttle.failed("10.0.0.9", b"lab:old-password") for _ in range(5)] == [0.0] * 5
    assert throttle.wait_s("10.0.0.9") == 0.0
    assert throttle.failed("10.0.0.9", b"lab:guess-1") == 10.0
    assert throttle.failed("10.0.0.9", b"lab:old-password") == 20.0


def test_a_credentials_file_replaced_after_its_checks_is_checked_again_as_opened(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its mode and owner were checked on the name, then a separate open read whatever lay there by then: a file
    readable by all put there between the two was read as the secret. The file opened is checked itself. (The
    replacement is made just before the open, through the module's os.open: the race, made certain.)"""
    from flagperf.errors import ConfigError
    from flagperf.site import auth

    path = tmp_path / "server-auth"
    path.write_text("lab:long-enough-password-1234\n")
    path.chmod(0o600)
    opened = os.open

    def replaced_first(name: str, flags: int, *args: int) -> int:
        swap = tmp_path / "swap"
        swap.write_text("lab:another-password-of-a-file-others-read\n")
        swap.chmod(0o644)
        swap.replace(path)
        return opened(name, flags, *args)

    monkeypatch.setattr(auth.os, "open", replaced_first)
    with pytest.raises(ConfigError) as info:
        auth.read_auth_file(path)
    assert str(info.value) == f"{path}: mode 0644 lets others read it; chmod 600 {path}", str(info.value)
