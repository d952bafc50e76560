"""The results site, a Starlette app: GET and HEAD only, HTML from jinja2 templates with autoescape, behind the
team server's basic auth when it has credentials (see flagperf/site/auth.py).

  /                              the runs, newest first: vendor, device, suite, outcome, headline figures
  /runs/RUN/                     one run: its figures, what was not measured, its plots, its files
  /runs/RUN/report.html|.md      the run's report files; summary.csv; /runs/RUN/plots/NAME.png its plots
  /compare?a=RUN&b=RUN           two runs side by side (flagperf compare), picked in the page
  /trends                        every figure of the history per vendor and device
  /trends/figure?case=..&metric=..&vendor=..&device=..   one figure over time (plot.png: its picture)
"""

from __future__ import annotations

import math
import re
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader
from markupsafe import Markup, escape
from sqlalchemy.exc import SQLAlchemyError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, PlainTextResponse, Response
from starlette.routing import Route

from flagperf.errors import FlagperfError
from flagperf.paths import HISTORY_FILE
from flagperf.results.compare import HEADER as COMPARE_HEADER
from flagperf.results.compare import OPERATION_NOTE, SPREAD_NOTE, compare_runs
from flagperf.results.history import figure_trend, list_series, unreadable
from flagperf.results.markup import plain
from flagperf.results.operators import OPERATOR_HEADER, operator_cells
from flagperf.results.serving import CONSOLE_HEADER, DIGEST_TITLE, console_rows, serving_points
from flagperf.results.summary import HEADLINE_HEADER, OPERATORS_INTRO, headline_cells, headline_rows
from flagperf.site import trends as drawing
from flagperf.site.auth import Credentials, SignInThrottle
from flagperf.site.front import HostCheck
from flagperf.site.runs import PLOT_TYPES, PLOTS, RUN_FILES, list_runs, plot_names, read_served, run_folder, run_info
from flagperf.site.trends import NO_MATPLOTLIB, open_history, trend_png

TEMPLATES = Path(__file__).resolve().parent / "templates"
REALM = 'Basic realm="flagperf", charset="UTF-8"'
# No script anywhere: a javascript: link in a report is inert; styles inline only, images from the site itself.
SECURITY_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; img-src 'self'; style-src 'unsafe-inline'; "
                                 b"form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),  # frame-ancestors' older spelling, for browsers that know only this one
    (b"referrer-policy", b"same-origin"),
    (b"cache-control", b"no-store"),
]
HSTS = (b"strict-transport-security", b"max-age=31536000")
# A run's own files (its report, its plots) are the run's content, not the site's: a report.html or an .svg a
# case wrote is shown sandboxed: no script, no forms, no pop-ups, whatever the file holds. (Its origin stays the
# site's so that the report's plots load with the sign-in; without scripts that gives the file no reach.)
RUN_FILE_CSP = {"Content-Security-Policy": "sandbox allow-same-origin"}
# A reader of the site cannot repair a run's files: it says why the run is not compared, not what to do to them.
SITE_ADVICE = "the run is not compared while a host's result cannot be read"

Scope = MutableMapping[str, Any]
ASGIApp = Callable[[Scope, Callable[[], Awaitable[Any]], Callable[[Any], Awaitable[None]]], Awaitable[None]]


class Guard:
    """Outermost layer: every answer gets the security headers; without the credentials, 401 and a Basic
    challenge (the browser asks for user and password, as the reverse proxy of a team would). Wrong sign-ins
    are throttled per client (``throttle``): a client locked out gets 429 and Retry-After, its attempts
    unchecked. The client is the connection's address, or, from a reverse proxy on this machine, the one it
    names in X-Forwarded-For (uvicorn trusts those headers from 127.0.0.1 only); behind a proxy that says the
    browser spoke TLS (X-Forwarded-Proto: https), answers also get Strict-Transport-Security."""

    def __init__(self, app: ASGIApp, credentials: Credentials | None, throttle: SignInThrottle | None = None,
                 names: list[str] | None = None, reread_names: Callable[[], Iterable[str]] | None = None) -> None:
        self.app, self.credentials = app, credentials
        self.throttle = throttle or SignInThrottle()
        self.hosts = HostCheck(names, reread_names) if names is not None else None

    async def __call__(self, scope: Scope, receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = [*SECURITY_HEADERS, *([HSTS] if scope.get("scheme") == "https" else [])]

        async def send_with_headers(message: Any) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *headers]
            await send(message)

        refused = await self.hosts.refused(scope) if self.hosts is not None else None
        if refused is not None:  # a page of another site that its DNS pointed here: before any sign-in is tried
            await PlainTextResponse(refused, status_code=400)(scope, receive, send_with_headers)
            return
        if self.credentials is not None:
            client = (scope.get("client") or ("unknown", 0))[0]
            wait = self.throttle.wait_s(client)
            if wait > 0:
                answer = PlainTextResponse("too many wrong sign-ins from this address; try again later\n",
                                           status_code=429, headers={"Retry-After": str(math.ceil(wait))})
                await answer(scope, receive, send_with_headers)
                return
            given = dict(scope.get("headers") or []).get(b"authorization")
            if not self.credentials.matches(given.decode("latin-1") if given else None):
                if given:  # a request without any (a browser's first) is no guess
                    self.throttle.failed(client, given)
                answer = PlainTextResponse("sign in to see the results\n", status_code=401,
                                           headers={"WWW-Authenticate": REALM})
                await answer(scope, receive, send_with_headers)
                return
            self.throttle.succeeded(client)
        await self.app(scope, receive, send_with_headers)


def preselected(choices: list[str], a: str | None, b: str | None) -> tuple[str | None, str | None]:
    """The runs the compare page's two lists show chosen: those asked for; a side not given gets the newest run
    that is not the other side's (neither given: B the newest, A the one before), never a run against itself."""
    if not b:
        b = next((c for c in choices if c != a), None)
    if not a:
        a = next((c for c in choices if c != b), None)
    return a, b


def create_app(root: Path, credentials: Credentials | None, history_url: str | None = None,
               ui_url: str | None = None, *, names: list[str] | None = None,
               reread_names: Callable[[], Iterable[str]] | None = None) -> ASGIApp:
    """The site for the results folder ``root``; ``credentials`` None only on a loopback address. ``ui_url``: the
    Prefect UI's address, where a run page links the flow run that made the run (its logs). ``names``: the only
    Host names it answers (DNS rebinding protection); None: any; ``reread_names``: where more are read where a
    Host misses (HostCheck)."""
    root = root.resolve()
    env = Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["cell"] = table_cell

    def page(template: str, status_code: int = 200, **values: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(template).render(root=root, **values), status_code=status_code)

    def not_found(what: str) -> HTMLResponse:
        return page("message.html", 404, title="Not found", message=what)

    def runs(request: Request) -> Response:
        return page("runs.html", title="Runs", runs=list_runs(root))

    def run(request: Request) -> Response:
        run_id = request.path_params["run_id"]
        folder = run_folder(root, run_id)
        if folder is None:
            return not_found(f"no run {run_id}")
        info = run_info(folder)
        # The same grouping as report.md: a row per figure, but a row per operator for operation cases and a row
        # per point for serving sweeps (their figures have no peak: tens of "unknown" rows otherwise).
        # Plain text: table_cell HTML-escapes it (md_text's backslashes would show, as in \\_softmax).
        headline = [headline_cells(e, plain) for e in headline_rows(info.summary.get("headline") or [])]
        serving = console_rows(serving_points(folder))
        operators = [(operator_cells(e, plain), bool(e.get("failed"))) for e in info.summary.get("operators") or []]
        files = [name for name in RUN_FILES if read_served(root, run_id, name) is not None]
        logs = f"{ui_url.rstrip('/')}/runs/flow-run/{info.flow_run_id}" if ui_url and info.flow_run_id else None
        return page("run.html", title=run_id, run=info, logs=logs, header=HEADLINE_HEADER, headline=headline,
                    operator_header=OPERATOR_HEADER, operators=operators, operators_intro=OPERATORS_INTRO,
                    serving_header=CONSOLE_HEADER, serving=serving, serving_intro=DIGEST_TITLE,
                    not_measured=info.summary.get("not_measured") or [], plots=plot_names(folder), files=files)

    def run_file(request: Request) -> Response:
        run_id, name = request.path_params["run_id"], request.path_params["name"]
        body = read_served(root, run_id, name)
        if body is None:
            return not_found(f"{run_id} has no {name} here")
        return Response(body, media_type=RUN_FILES[name], headers=RUN_FILE_CSP)

    def plot(request: Request) -> Response:
        run_id, name = request.path_params["run_id"], request.path_params["name"]
        body = read_served(root, run_id, PLOTS, name)
        if body is None:
            return not_found(f"{run_id} has no plot {name}")
        return Response(body, media_type=PLOT_TYPES[Path(name).suffix], headers=RUN_FILE_CSP)

    def compare(request: Request) -> Response:
        choices = [r.run_id for r in list_runs(root) if r.summary]
        a, b = request.query_params.get("a"), request.query_params.get("b")
        rows, error, per_operator, left_out = None, None, False, []
        if a and b:
            folder_a, folder_b = run_folder(root, a), run_folder(root, b)
            if folder_a is None or folder_b is None:
                error = f"no run {a if folder_a is None else b}"
            else:
                try:
                    # Named as the reader knows them (run ids, files under the run), with no advice to act on
                    compared, context = compare_runs(folder_a, folder_b, names=(f"run {a}", f"run {b}"),
                                                      shown=(None, None), advice=SITE_ADVICE)
                    rows = [(c.cells(), c.flagged) for c in compared]
                    per_operator = any(c.per_operator for c in compared)
                    left_out = context["left_out"]
                except (OSError, ValueError, FlagperfError) as exc:
                    error = f"cannot compare {a} and {b}: {exc}"
        a, b = preselected(choices, a, b)
        return page("compare.html", 404 if error and error.startswith("no run") else 200, title="Compare",
                    choices=choices, a=a, b=b, header=COMPARE_HEADER, rows=rows, error=error,
                    notes=[*left_out, SPREAD_NOTE, *([OPERATION_NOTE] if per_operator else [])])

    where = history_url or str(root / HISTORY_FILE)

    def trends(request: Request) -> Response:
        try:
            engine = open_history(root, history_url)
            series = list_series(engine) if engine is not None else []
        except SQLAlchemyError as exc:  # its server refuses or is not there, a file that is no database: say so
            return page("message.html", 503, title="Trends", message=str(unreadable(exc, where)))
        except FlagperfError as exc:  # an earlier version's history, which the site does not change
            return page("message.html", 503, title="Trends", message=str(exc))
        return page("trends.html", title="Trends", series=series, has_history=engine is not None)

    def _figure(request: Request) -> tuple[dict[str, str | None], list[Any]] | None:
        query = request.query_params
        key: dict[str, str | None] = {name: query.get(name) or None for name in ("case", "metric", "vendor", "device")}
        try:
            engine = open_history(root, history_url)
            if engine is None or not key["case"] or not key["metric"]:
                return None
            points = figure_trend(engine, key["case"], key["metric"], key["vendor"],  # type: ignore[arg-type]
                                  key["device"])
        except (FlagperfError, SQLAlchemyError):  # the trends page says why
            return None
        return (key, points) if points else None

    def figure(request: Request) -> Response:
        found = _figure(request)
        if found is None:
            return not_found("no such figure in the history")
        key, points = found
        return page("figure.html", title=f"{key['case']} {key['metric']}", key=key, points=points,
                    query=request.url.query, can_draw=NO_MATPLOTLIB if drawing.matplotlib_figure() is None else None)

    def figure_plot(request: Request) -> Response:
        found = _figure(request)
        if found is None:
            return PlainTextResponse("no such figure in the history\n", status_code=404)
        key, points = found
        title = f"{key['case']} {key['metric']} ({key['vendor'] or '?'}, {key['device'] or '?'})"
        png = trend_png(points, title)
        if png is None:
            return PlainTextResponse(NO_MATPLOTLIB + "\n", status_code=404)
        return Response(png, media_type="image/png")

    get = ["GET"]  # Starlette answers HEAD for GET routes, and 405 to every other method
    app = Starlette(routes=[
        Route("/", runs, methods=get),
        Route("/runs/{run_id}/", run, methods=get),
        Route("/runs/{run_id}/plots/{name}", plot, methods=get),
        Route("/runs/{run_id}/{name}", run_file, methods=get),
        Route("/compare", compare, methods=get),
        Route("/trends", trends, methods=get),
        Route("/trends/figure", figure, methods=get),
        Route("/trends/plot.png", figure_plot, methods=get),
    ])

    async def missing(request: Request, exc: Exception) -> Response:
        return not_found("nothing here")

    app.add_exception_handler(404, missing)
    return Guard(app, credentials, names=names, reread_names=reread_names)


BOLD = re.compile(r"\*\*(.+?)\*\*")


def table_cell(text: object) -> Markup:
    """A report table's cell: escaped, with the report's Markdown bold (an error, a FAILED count) shown bold."""
    return Markup(BOLD.sub(r"<strong>\1</strong>", str(escape(text))))
