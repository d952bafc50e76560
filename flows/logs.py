"""The core's loggers (flagperf.*: hosts, SSH, Docker, config rules) under the task or flow run that logged, and
Prefect's run loggers kept to one line for a failure this project already said in its own words."""

from __future__ import annotations

import logging

from prefect.exceptions import FailedRun
from prefect.logging.handlers import APILogHandler

from flagperf.errors import FlagperfError

CORE_LOGGER = "flagperf"
RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
# The line a deployment's engine process adds, with a traceback, when the flow run it ran ended Failed.
ENGINE_EXIT_LINE = "Engine execution exited with unexpected exception"


class OneLineFailures(logging.Filter):
    """A failure this project describes (a FlagperfError, or a Failed state a flow returned with its message:
    Prefect raises that again as FailedRun when a worker's engine reads the run's result) is one line, never a
    traceback: the traceback is dropped, and the engine's closing line, which only repeats the run's final
    state, is dropped whole. Any other exception (a bug) keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, (FailedRun, FlagperfError)):
            return True
        if record.msg == ENGINE_EXIT_LINE:
            return False
        record.exc_info, record.exc_text = None, None
        return True


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
    for name in RUN_LOGGERS:
        run_logger = logging.getLogger(name)
        if not any(isinstance(f, OneLineFailures) for f in run_logger.filters):
            run_logger.addFilter(OneLineFailures())
