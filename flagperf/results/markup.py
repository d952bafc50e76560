"""Text a case controls (a failure message, a warning, a metric's name) in the reports: shown as it is, never
as markup. ``md_text`` escapes it where it is put into Markdown (report.md, the Prefect markdown artifacts);
``plain`` is the same text for where no Markdown renders (the results site, which HTML-escapes, the CLI's
tables, a Prefect table artifact), and
``markdown_to_html`` renders Markdown with no raw HTML and links only to http(s) and relative paths, so that
a ``javascript:``, ``data:`` or ``vbscript:`` link, however spelt, is shown inert; ``spreadsheet_cell`` keeps a CSV
cell text where a spreadsheet would run it as a formula."""

from __future__ import annotations

import html
import re
import xml.etree.ElementTree as ET

import markdown
from markdown.extensions import Extension
from markdown.treeprocessors import Treeprocessor

# Markdown's punctuation that makes links and images ([ ]), code, emphasis, raw HTML or table cells. md_text's
# text never starts a line, so '#' and '>' make no heading or quote there; ( ) ! make nothing without [ ].
MARKDOWN_SPECIAL = re.compile(r"([\\`*\[\]|])")
# '_' makes emphasis at a word's edge (_x_, __init__), never between two letters or digits (metric names such as
# tokens_per_s, in Python-Markdown and CommonMark alike): escaped there only, so that those read as written.
EDGE_UNDERSCORE = re.compile(r"(?<![^\W_])_|_(?![^\W_])")
SAFE_SCHEMES = ("http", "https")
SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*):")
IGNORED_IN_URLS = re.compile(r"[\x00-\x20\x7f]")  # browsers drop these inside a URL ("java\tscript:")
# What makes a spreadsheet read a CSV cell as a formula (OWASP's CSV injection list): a failure message such as
# =HYPERLINK("http://…?"&A1) from a case's result.json would otherwise run where a lab opens summary.csv.
FORMULA_START = ("=", "+", "-", "@", "\t", "\r")


def spreadsheet_cell(value: object) -> object:
    """A text cell that starts like a formula, with a leading ' that spreadsheets read as "this is text" (and do
    not show); any other value (numbers included: a negative figure stays a number) unchanged."""
    return f"'{value}" if isinstance(value, str) and value.startswith(FORMULA_START) else value


def md_text(value: object) -> str:
    """``value`` as Markdown that shows exactly that text, on one line. '<' becomes an entity, which every
    Markdown renderer shows as '<' (a backslash before it is no escape in Python-Markdown)."""
    text = MARKDOWN_SPECIAL.sub(r"\\\1", " ".join(str(value).splitlines()))
    return EDGE_UNDERSCORE.sub(r"\\_", text).replace("<", "&lt;")


def plain(value: object) -> str:
    """``value`` on one line, as written: md_text's counterpart where no Markdown renders."""
    return " ".join(str(value).splitlines())


def number(value: float | None, digits: int = 4) -> str:
    """A figure to ``digits`` significant digits, written out (24540, never 2.454e+04) below 1e15; "-" where
    there is none. One rounding in every table."""
    if value is None or value != value:  # None or NaN
        return "-"
    text = f"{value:.{digits}g}"
    return f"{float(text):.0f}" if "e+" in text and abs(value) < 1e15 else text


SMALLEST_PERCENT = 0.01  # below it a share is "< 0.01%": a figure, not a 0.0% that reads as nothing measured


def percent(fraction: float | None, *, sign: str = "") -> str:
    """A fraction as a percentage, one convention in every report: one decimal from 1 % (12.3%), two
    significant digits below it (0.56%, 0.012%), "< 0.01%" below that, so that a small share never prints as
    0.0%; "-" where there is none. sign: a prefix such as "±", put inside the "<" ("< ±0.01%")."""
    if fraction is None or fraction != fraction:  # None or NaN
        return "-"
    value = 100 * fraction
    if value == 0:
        return f"{sign}0%"
    if abs(value) >= 1:
        return f"{sign}{value:.1f}%"
    if abs(value) >= SMALLEST_PERCENT:
        return f"{sign}{float(f'{value:.2g}')}%"
    return f"{'> -' if value < 0 else '< '}{sign}{SMALLEST_PERCENT}%"


def safe_url(url: str) -> bool:
    """An http(s) URL or a relative path; anything else (another scheme, entities hiding one, a
    protocol-relative //host) is not."""
    text = url
    for _ in range(3):  # &amp;#106; -> &#106; -> j
        text = html.unescape(text)
    text = IGNORED_IN_URLS.sub("", text).replace("\\", "/")
    scheme = SCHEME.match(text)
    if scheme:
        return scheme.group(1).lower() in SAFE_SCHEMES
    return not text.startswith("//")


class _InertLinks(Treeprocessor):
    """A link or image whose target is not a safe URL becomes its plain text."""

    def run(self, root: ET.Element) -> None:
        for element in root.iter():
            attribute = {"a": "href", "img": "src"}.get(element.tag)
            if attribute is None or safe_url(element.get(attribute, "")):
                continue
            text = element.get("alt", "") if element.tag == "img" else None
            element.attrib.clear()
            element.tag = "span"
            if text is not None:
                element.text = text


class _SafeMarkdown(Extension):
    def extendMarkdown(self, md: markdown.Markdown) -> None:
        md.preprocessors.deregister("html_block")  # raw HTML is text, escaped on output
        md.inlinePatterns.deregister("html")
        md.treeprocessors.register(_InertLinks(md), "inert_links", -10)  # last: after links are unescaped


def markdown_to_html(text: str) -> str:
    """Markdown (tables included) as an HTML fragment, safe for text a case controlled."""
    return markdown.markdown(text, extensions=["tables", _SafeMarkdown()])
