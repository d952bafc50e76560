"""The result schema's file formats: case.log's lines as the controller relays them."""

from __future__ import annotations

import logging

import pytest

from flagperf.results import schema


@pytest.mark.parametrize("level", [logging.DEBUG, logging.INFO, logging.WARNING, logging.ERROR, logging.CRITICAL])
def test_a_case_log_line_is_relayed_at_the_level_the_case_logged_it(level: int) -> None:
    """What the case process writes in CASE_LOG_FORMAT reads back as its level and message (the relay shows the
    time and level itself); a line printed by a library stays as printed, at INFO."""
    record = logging.LogRecord("flagperf.case", level, __file__, 1, "gemm: %s TFLOPS", (1.5,), None)
    line = logging.Formatter(schema.CASE_LOG_FORMAT).format(record)
    assert schema.case_log_line(line) == (level, "gemm: 1.5 TFLOPS")
    printed = "2026-11-25 16:15:23 WARNING not the logging format (no milliseconds)"
    assert schema.case_log_line(printed) == (logging.INFO, printed)
    assert schema.case_log_line("sleeping") == (logging.INFO, "sleeping")
