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


@pytest.mark.parametrize("at", ["mkdir", "close"])
def test_an_interrupt_as_an_atomic_write_begins_leaves_nothing_of_it(tmp_path, monkeypatch, at: str) -> None:
    """Ctrl-C just after the write's folder is made, or its temporary file: neither is left behind."""
    import os
    import signal
    import threading
    from pathlib import Path

    real = {"mkdir": Path.mkdir, "close": os.close}[at]
    sent: list[int] = []

    def then_ctrl_c(*args, **kwargs):
        result = real(*args, **kwargs)
        if not sent:
            sent.append(signal.SIGINT)
            signal.pthread_kill(threading.get_ident(), signal.SIGINT)  # the handler runs before this returns
        return result

    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    monkeypatch.setattr(*((Path, "mkdir") if at == "mkdir" else (os, "close")), then_ctrl_c)
    try:
        with pytest.raises(KeyboardInterrupt), schema.atomic_path(tmp_path / "made" / "deeper" / "x.json") as tmp:
            tmp.write_text("never")
    finally:
        monkeypatch.undo()
        signal.signal(signal.SIGINT, before)
    assert sent and list(tmp_path.iterdir()) == []
