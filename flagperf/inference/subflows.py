"""The seven steps as Prefect subflows, nested under the controller's flow run, when that is possible.

The controller's run_case task puts a JSON form of its Prefect context in the job (``portable_context``);
the case process hydrates it and runs one flow for the case with one subflow per step, so each step shows in
the UI, with its own logs, under the evaluation that started it. Without Prefect, without a context, or
without a reachable API, the same step functions run as plain calls and the result says why.

Prefect is imported only inside these functions: the core does not need it to run a case.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

from flagperf.inference.config import STEP_TITLES
from flagperf.inference.pipeline import InferenceRun, StepRunner, finish_round, run_steps

log = logging.getLogger("flagperf.case.inference")


def portable_context() -> dict[str, Any]:
    """The current Prefect context as JSON-safe data for job.json (called in the run_case task).

    Prefect's serialize_context carries live objects (the parent Flow and Task); the case process gets
    stand-ins for those. The task run context is left out: a subflow nests through the flow run context.
    Secrets are left out, not masked: a case never gets the sign-in (a file on the host), and a masked one
    ("**********") would be sent as if it were one; without it, a signed-in API refuses the case
    (_api_unreachable), whose steps then run as plain functions. Left out with them, as they hold secrets in
    plain text: the active profile's settings (`prefect config set PREFECT_API_AUTH_STRING=...` puts the sign-in
    there; its name and source stay), the client's custom headers (a proxy's sign-in), and the flow run's result
    store (its storage block's configuration: the steps persist no results).
    """
    from prefect.context import FlowRunContext, SettingsContext, serialize_context
    from pydantic_core import to_jsonable_python

    context = serialize_context()
    settings = SettingsContext.get()
    context["settings_context"] = _portable_settings(settings.serialize(include_secrets=False)) if settings else {}
    context.pop("task_run_context", None)
    engine = FlowRunContext.get()  # serialize_context's includes secrets: made again without them
    flow_run = engine.serialize(include_secrets=False) if engine is not None else {}
    if flow_run:
        flow_run["result_store"] = {}
        flow_run["flow_name"] = getattr(flow_run.pop("flow", None), "name", None)
    context["flow_run_context"] = flow_run
    return to_jsonable_python(context, fallback=str)


def _portable_settings(serialized: dict[str, Any]) -> dict[str, Any]:
    """A serialized SettingsContext without what holds secrets (see portable_context)."""
    serialized = _without_secrets(serialized)
    profile = serialized.get("profile")
    if isinstance(profile, dict):
        serialized["profile"] = {**profile, "settings": {}}
    client = (serialized.get("settings") or {}).get("client")
    if isinstance(client, dict):
        client.pop("custom_headers", None)
    return serialized


def _without_secrets(value: Any) -> Any:
    """``value`` (serialized settings) without the secrets in it (masked SecretStr values, at any depth)."""
    from pydantic import SecretBytes, SecretStr

    if isinstance(value, dict):
        return {key: _without_secrets(item) for key, item in value.items()
                if not isinstance(item, (SecretStr, SecretBytes))}
    return value


def _prefect_unusable(context: dict[str, Any] | None) -> str | None:
    """Why the steps cannot run as subflows here, or None when they can."""
    if not context or not context.get("flow_run_context"):
        return "the job carries no Prefect context"
    try:
        import prefect  # noqa: F401
    except ImportError as exc:
        return f"prefect is not importable ({exc})"
    return None


@contextmanager
def _hydrated(context: dict[str, Any]) -> Iterator[None]:
    from prefect import flow
    from prefect.context import hydrated_context

    context = {**context, "flow_run_context": dict(context["flow_run_context"])}
    name = context["flow_run_context"].pop("flow_name", None) or "evaluate"

    @flow(name=name)
    def parent() -> None:  # a stand-in for the controller's flow object; it is never called
        return None

    context["flow_run_context"]["flow"] = parent
    with hydrated_context(context):
        yield


def _api_unreachable() -> str | None:
    from prefect.client.orchestration import get_client
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    try:
        with get_client(sync_client=True) as client:
            problem = client.api_healthcheck()
            if problem is None:  # /health needs no sign-in; this does, as every call of the steps' flows
                client.api_version()
    except Exception as exc:  # a missing URL, a refused connection: reported, never fatal
        status = getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return (f"the Prefect API at {url} refused the sign-in ({status}); a case process is never given it")
        problem = exc
    if problem is None:
        return None
    return f"the Prefect API at {url} is unreachable ({type(problem).__name__}: {problem})"


def _bridge_logs() -> Callable[[], None]:
    """Send flagperf's own loggers to the step's flow run, unless Prefect already ships them.

    Whether it does is read from the loggers themselves (an APILogHandler on "flagperf", which Prefect adds
    for PREFECT_LOGGING_EXTRA_LOGGERS at start-up), not from the settings: the settings restored from the
    controller's context may name extra loggers that this process never set up.
    """
    from prefect.logging import get_run_logger
    from prefect.logging.handlers import APILogHandler

    logger = logging.getLogger("flagperf")
    if any(isinstance(h, APILogHandler) for h in logger.handlers):
        return lambda: None
    run_logger = get_run_logger()

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            run_logger.log(record.levelno, record.getMessage())

    handler = Forward()
    logger.addHandler(handler)
    return lambda: logger.removeHandler(handler)


def _prefect_step_runner() -> StepRunner:
    from prefect import flow

    def runner(name: str, fn: Callable[[InferenceRun], None], run: InferenceRun) -> None:
        # The state travels by closure: flow parameters would be serialised, and it holds a model.
        @flow(name=f"inference-{name.replace('_', '-')}", flow_run_name=f"{run.case_name}: {STEP_TITLES[name]}",
              validate_parameters=False, persist_result=False)
        def step() -> None:
            undo = _bridge_logs()
            try:
                fn(run)
            finally:
                undo()

        step()

    return runner


def run_inference_steps(run: InferenceRun, prefect_context: dict[str, Any] | None) -> None:
    """Run the steps as subflows of one case flow when Prefect can be used, else as plain functions; the
    round's artifacts are cleaned afterwards, whatever happened (finish_round)."""
    try:
        _run_inference_steps(run, prefect_context)
    finally:
        finish_round(run)


def _run_inference_steps(run: InferenceRun, prefect_context: dict[str, Any] | None) -> None:
    why = _prefect_unusable(prefect_context)
    if why is None:
        assert prefect_context is not None
        with ExitStack() as stack:
            try:
                stack.enter_context(_hydrated(prefect_context))
                why = _api_unreachable()
            except Exception as exc:  # a context this Prefect cannot read: run the steps without it
                why = f"the Prefect context could not be restored ({type(exc).__name__}: {exc})"
            if why is None:
                from prefect import flow

                run.runner = "prefect subflows"

                @flow(name="inference-case", flow_run_name=f"inference[{run.case_name}]",
                      validate_parameters=False, persist_result=False)
                def case_flow() -> None:
                    run_steps(run, _prefect_step_runner())

                case_flow()
                return
    run.runner = f"plain functions ({why})"
    log.info("steps run as plain functions: %s", why)
    run_steps(run)
