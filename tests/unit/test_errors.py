"""One-line errors: how a line too long is shortened, and findings gathered each once."""

from __future__ import annotations

from flagperf.errors import MAX_LINE, ConfigError, gathered, one_line, printable


def test_the_lead_stays_whole_where_the_middle_of_the_message_can_go_instead() -> None:
    """A lead (the file an error is about) of less than half the line is never shortened while cutting the middle of
    the message is enough: its middle was cut, though the file's path is what the user needs whole."""
    lead = "/lab/" + "configs/" * 20 + "base/mycase/vendor/cpu.yaml: size:"
    said = one_line(" ".join(["h1,"] * 200) + " remove the duplicates", lead=lead)
    assert len(said) <= MAX_LINE and said.startswith(f"{lead} h1, h1,") and " ... " in said, said
    assert said.endswith(" remove the duplicates"), said
    # A lead longer than half the line loses its middle (its start and its file's name stay).
    lead = "/lab/" + "configs/" * 60 + "base/mycase/vendor/cpu.yaml: size:"
    said = one_line("overrides the default with the same value (8); remove the line", lead=lead)
    assert len(said) <= MAX_LINE and said.startswith("/lab/configs/") and "..." in said.split()[0], said
    assert said.endswith("/mycase/vendor/cpu.yaml: size: overrides the default with the same value (8); remove the "
                         "line"), said


def test_a_path_in_the_advice_stays_whole_while_the_rest_can_be_shortened() -> None:
    """The last clause (after the final ';' or ':') says what to do, often a command with a path: its words are
    shortened only where the rest of the line cannot give enough; the longest word anywhere went first."""
    advice = f"list /lab/{'vendors-' * 30}second before /lab/first on FLAGPERF_VENDOR_PATH, or rename this vendor"
    said = one_line(f"shadowed by /lab/{'vendors-' * 28}first/acme: nothing of this one is read; {advice}",
                    lead="/lab/second/acme/vendor.yaml:")
    assert len(said) <= MAX_LINE and said.endswith(f"; {advice}"), said
    assert said.startswith("/lab/second/acme/vendor.yaml: shadowed by /lab/vendors-") and "..." in said, said
    # Where nothing else is left to shorten, the advice's paths lose their middles: the line still fits.
    said = one_line(f"do this: run flagperf validate /lab/{'x' * 600}/case.yaml", lead="f.yaml:")
    assert len(said) <= MAX_LINE and said.startswith("f.yaml: do this: run flagperf validate /lab/xxx"), said
    assert said.endswith("xxx/case.yaml"), said


def test_control_characters_in_a_line_are_escaped() -> None:
    """A file name or value with an escape sequence, a NUL, a backspace or DEL prints as text, never raw (a name
    from a folder scan could rewrite the terminal's line)."""
    said = one_line("bad name \x1b[31mred\x00 \x08 \x7f", lead="f\x1b.yaml:")
    assert said == "f\\x1b.yaml: bad name \\x1b[31mred\\x00 \\x08 \\x7f", said
    assert str(ConfigError("a\x07.yaml", "k", "no\x1b")) == "a\\x07.yaml: k: no\\x1b"


def test_findings_whose_shortened_lines_read_alike_are_kept_apart() -> None:
    """Two findings of different files whose lines are shortened to the same text are two findings: gathered() kept
    the first only (it compared the shortened lines)."""
    first, second = (ConfigError(f"/lab/{'configs/' * 40}{name}/{'configs/' * 40}case.yaml", "size", "too big")
                     for name in ("one", "two"))
    assert str(first) == str(second)  # the same line once shortened
    assert [e.source for e in gathered([first, second]).more] == [second.source]
    again = ConfigError(first.source, "size", "too big")
    assert gathered([ConfigError(first.source, "size", "too big"), again]).more == []  # the same finding: once


def test_an_error_gathered_with_others_is_left_as_it_was() -> None:
    """gathered() set the first error's ``more`` to the others: an error held elsewhere too (the plan shares one
    case's engine options findings across cases) then carried one case's findings into the next gathering, so what
    a case's error listed depended on which case was gathered first. The errors given are left as they were."""
    shared = ConfigError("engine.yaml", "options", "unknown option")
    one, two = ConfigError("one.yaml", "x", "bad"), ConfigError("two.yaml", "y", "bad")
    first = gathered([shared, one])
    second = gathered([two, shared])
    assert shared.more == [] and shared.left_out == 0 and one.more == []
    assert [e.source for e in [first, *first.more]] == ["engine.yaml", "one.yaml"]
    assert [e.source for e in [second, *second.more]] == ["two.yaml", "engine.yaml"]
    assert str(first) == str(shared) and isinstance(first, ConfigError)


def test_a_names_whitespace_is_shown_as_it_is_never_as_one_plain_space() -> None:
    """Words are what ' ' parts: a tab or a newline in a file name is escaped where it is (\\t, \\n), a no-break
    space stays one, two spaces stay two; each was shown as one plain space, a different, valid-looking path."""
    said = one_line("missing: /d/a\tb /d/a\nb /d/a\u00a0b '/d/a  b'", lead="f.yaml:")
    assert said == "f.yaml: missing: /d/a\\tb /d/a\\nb /d/a\u00a0b '/d/a  b'", said
    assert one_line("  padded  ") == "padded"


def test_printable_escapes_what_breaks_or_reorders_a_line_and_a_backslash_and_keeps_what_a_name_may_hold() -> None:
    """Control characters, lone surrogates (a byte that is no UTF-8 as \\xNN), line and paragraph separators and
    bidi overrides and isolates are escaped, and a backslash is doubled, so that a name holding a backslash and an n
    is not read as one holding a newline; format characters valid in a name (a right-to-left mark, a zero-width
    joiner, a soft hyphen) are kept, as is a no-break space. One_line, which takes names printable already, does not
    double a backslash again."""
    kept = "r\u200fz\u200dj\u00adh\u00a0n\u00e9"
    assert printable(kept) == kept
    assert printable("a\\nb") == "a\\\\nb" and printable("a\nb") == "a\\nb"
    for char, shown in (("\u202e", "\\u202e"), ("\u2066", "\\u2066"), ("\u2069", "\\u2069"), ("\u2028", "\\u2028"),
                        ("\u2029", "\\u2029"), ("\x85", "\\x85"), ("\ud800", "\\ud800"), ("\udcff", "\\xff"),
                        ("\t", "\\t"), ("\x7f", "\\x7f")):
        assert printable(f"a{char}b") == f"a{shown}b", char
    assert one_line(f"{printable('a' + chr(92) + 'n')} gone") == "a\\\\n gone"
    assert str(ConfigError("x.yaml", None, f"{printable('/d/a' + chr(10) + 'b')} is missing")) == \
        "x.yaml: /d/a\\nb is missing"


SECRET_URL = "http://flagperf:s3cret-word@127.0.0.1:4200/api/flow_runs/x"


def test_a_urls_user_and_password_are_masked_and_nothing_else() -> None:
    """PREFECT_API_URL may hold a user and password, and clients' messages name the whole URL: masked wherever a
    message from elsewhere goes on into results and logs; a URL without them, and an @ after its host, left alone."""
    from flagperf.errors import redact_userinfo

    assert redact_userinfo(f"500 for url '{SECRET_URL}'; again https://u%40x:p@h/") == (
        "500 for url 'http://***@127.0.0.1:4200/api/flow_runs/x'; again https://***@h/")
    assert redact_userinfo("http://h:4200/api?by=me@lab mail me@lab") == "http://h:4200/api?by=me@lab mail me@lab"


def test_an_error_line_never_names_a_urls_password() -> None:
    """An HTTP error named in one line: an httpx one (and Prefect's ObjectNotFound, which wraps one and said "None")
    by its status and reason; any other (requests' HTTPError, whose message ends with the URL) with the URL's user
    and password masked."""
    import httpx
    import requests
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    from flagperf.errors import error_line

    request = httpx.Request("GET", SECRET_URL)
    errors = {status: httpx.HTTPStatusError("failed", request=request, response=httpx.Response(status, request=request))
              for status in (404, 409)}
    assert error_line(ObjectNotFound(http_exc=errors[404])) == "ObjectNotFound: 404 Not Found"
    assert error_line(ObjectAlreadyExists(http_exc=errors[409])) == "ObjectAlreadyExists: 409 Conflict"
    assert error_line(requests.HTTPError(f"500 Server Error: Internal Server Error for url: {SECRET_URL}")) == (
        "HTTPError: 500 Server Error: Internal Server Error for url: http://***@127.0.0.1:4200/api/flow_runs/x")
