"""tests/unit/childio.py: a child's output that cannot be decoded fails the test that reads it, not taken as its end."""

from __future__ import annotations

import os

import pytest

from tests.unit.childio import Lines


def test_output_that_cannot_be_decoded_is_raised_not_taken_as_the_end() -> None:
    read_end, write_end = os.pipe()
    os.write(write_end, b"said \xff\xfe\n")
    os.close(write_end)
    with open(read_end, encoding="utf-8") as stream:
        lines = Lines(stream)
        with pytest.raises(UnicodeDecodeError):
            lines.rest()
        with pytest.raises(UnicodeDecodeError):  # and again: it is no end
            lines.next()
