"""The core's loggers (flagperf.*: hosts, SSH, Docker, config rules) under the task or flow run that logged."""

from __future__ import annotations

import logging

from prefect.logging.handlers import APILogHandler

CORE_LOGGER = "flagperf"


class RunLogHandler(APILogHandler):
    """Prefect's API handler, silent outside a flow or task run (the core also logs from plain functions,
    e.g. while planning, where there is no run to attach the line to; the console still shows it)."""

    def emit(self, record: logging.LogRecord) -> None:
        from prefect.context import FlowRunContext, TaskRunContext

        if FlowRunContext.get() is None and TaskRunContext.get() is None:
            return
        super().emit(record)


def route_core_logs() -> None:
    """Attach Prefect's API handler to the core's logger, once. PREFECT_LOGGING_EXTRA_LOGGERS=flagperf does the
    same, but only when it is set before prefect is first imported: a flow started from Python, a notebook
    or a test process would otherwise lose every SSH, Docker and config line from the dashboard."""
    logger = logging.getLogger(CORE_LOGGER)
    logger.setLevel(logging.INFO)  # the core logs at INFO; Prefect attaches handlers but leaves the level
    logging.getLogger("paramiko").setLevel(logging.WARNING)
    # One INFO line per request to the Prefect API is transport chatter, not a run's log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    if not any(isinstance(handler, APILogHandler) for handler in logger.handlers):
        logger.addHandler(RunLogHandler())
