from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import quote
from uuid import UUID

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId, ArtifactFilterKey
from prefect.runtime import flow_run

from flagperf.config.diagnose import report_section
from flagperf.paths import RESULTS_ROOT_ENV, RESULTS_URL_ENV
from flagperf.results.diagnosis import Diagnosis
from flagperf.results.diagnosis import render_markdown as render_diagnosis
from flagperf.results.report import build_report
from flagperf.results.summary import HEADLINE_HEADER, RunSummary, headline_cells, headline_rows, render_markdown


def published_url(run_dir: Path) -> str | None:
    """The run folder's address on the server's results HTTP service, if it serves this folder."""
    base, root = os.environ.get(RESULTS_URL_ENV), os.environ.get(RESULTS_ROOT_ENV)
    if not base or not root:
        return None
    try:
        relative = run_dir.resolve().relative_to(Path(root).resolve())
    except ValueError:  # a results_dir outside the served folder: nobody else can open it
        return None
    return f"{base.rstrip('/')}/{quote(relative.as_posix())}/"


REPORT_ARTIFACTS = ("flagperf-summary", "flagperf-report", "flagperf-report-html")


def replace_earlier_artifacts(keys: Iterable[str], published: Iterable[UUID]) -> None:
    """A retried flow run (the same flow run, a new attempt) publishes its artifacts again under the same keys:
    those the earlier attempts left under these keys are deleted, so the run shows one set, the latest. Best
    effort: where the server refuses, the stale ones stay listed beside the new ones."""
    run_id = flow_run.get_id()
    if not run_id:
        return
    logger = get_run_logger()
    keep = set(published)
    try:
        with get_client(sync_client=True) as client:
            stale = [a for a in client.read_artifacts(artifact_filter=ArtifactFilter(
                flow_run_id=ArtifactFilterFlowRunId(any_=[UUID(run_id)]), key=ArtifactFilterKey(any_=list(keys))))
                if a.id not in keep]
            for artifact in stale:
                client.delete_artifact(artifact.id)
    except Exception as exc:  # the run's outcome does not depend on it
        logger.warning("could not remove the earlier attempt's artifacts: %s", exc)
        return
    if stale:
        logger.info("replaced %d artifact(s) of an earlier attempt of this flow run", len(stale))


@task(name="analyze", task_run_name="analyze[{run_dir.name}]", cache_policy=NONE)
def analyze(run_dir: Path) -> RunSummary | None:
    """Summarise the run from its result and monitor files, write the report, publish it as artifacts.
    None when the report cannot be written (a full disk): one line says so; `flagperf report` makes it later."""
    logger = get_run_logger()
    diagnosed: list[Diagnosis] = []
    try:
        summary, paths = build_report(run_dir, lambda folder, made: report_section(folder, made, diagnosed))
    except OSError as exc:
        logger.error("the report could not be written to %s: %s; once it can, run `flagperf report %s`",
                     run_dir, exc.strerror or exc, run_dir)
        return None
    for problem in summary.problems:
        logger.warning(problem)
    for note in summary.monitor_notes:
        logger.info("monitors: %s", note)
    # A serving sweep's figures without a peak are left out (a row per point is in the report artifact below)
    # md_text cells: the Prefect UI renders a table artifact's string cells as Markdown (prefect-ui-library's
    # ArtifactDataTable, p-markdown-renderer), so a case's text is escaped here as in report.md.
    table = [dict(zip(HEADLINE_HEADER, headline_cells(e), strict=True)) for e in headline_rows(summary.headline)]
    table += [{"case": e["case"], "metric": "-", "measured": e["status"], "unit": "", "p50": "", "spread (CV)": "",
               "peak": "", "measured/peak": e["message"][:200], "MFU": "", "rounds": f"round {e['round']}"}
              for e in summary.not_measured]
    published = [create_table_artifact(table=table, key="flagperf-summary",
                                       description=f"{summary.run_id}: measured vs peak per case and metric")]
    url = published_url(run_dir)
    markdown = render_markdown(summary, monitor_table=False)  # the UI's artifact page is narrow
    if url:  # plots only where a browser can fetch them: from the results service
        markdown += f"\n## Plots\n\nThe full report: [{url}report.html]({url}report.html)\n"
        for plot in sorted(paths["plots"].glob("*.png")):
            markdown += f"\n![{plot.stem.replace('_', ' ')}]({url}plots/{quote(plot.name)})\n"
    published.append(create_markdown_artifact(markdown=markdown, key="flagperf-report",
                                              description=f"{summary.run_id}: the run report ({paths['markdown']})"))
    if url:
        published.append(create_link_artifact(
            link=f"{url}report.html", link_text=f"{summary.run_id} report (HTML, plots)", key="flagperf-report-html",
            description=f"{summary.run_id}: the HTML report with plots, served by flagperf server from the results "
                        "folder"))
    replace_earlier_artifacts(REPORT_ARTIFACTS, published)
    if url:  # the address the team opens, not a path on the worker's disk
        logger.info("report on the results site: %sreport.html", url)
    else:
        logger.info("the HTML report is at %s on this machine (`flagperf server` serves the results folder "
                    "over HTTP and links it here)", paths["html"])
    logger.info("report written to %s", ", ".join(str(p) for p in paths.values()))
    for diagnosis in diagnosed:  # several hosts or devices: the fleet diagnosis beside the report
        publish_diagnosis(diagnosis)
    return summary


def publish_diagnosis(diagnosis: Diagnosis) -> None:
    """The fleet diagnosis as an artifact of the flow run, and one warning per failing host naming why."""
    logger = get_run_logger()
    create_markdown_artifact(markdown=render_diagnosis(diagnosis), key="flagperf-diagnosis",
                             description=f"{diagnosis.run_id}: every device and host against the fleet median "
                                         "(deployments/diagnosis/rules.yaml)")
    for host in diagnosis.failed_hosts:
        logger.warning("fleet diagnosis: host %s fails: %s", host.host, "; ".join(c.line() for c in host.failed))
    if not diagnosis.failed_hosts and diagnosis.unjudged_reason():
        logger.info("fleet diagnosis: no host could be judged (%d hosts, %d devices): %s", len(diagnosis.hosts),
                    len(diagnosis.devices), diagnosis.unjudged_reason())
    elif not diagnosis.failed_hosts:
        logger.info("fleet diagnosis: no host fails the rules (%d hosts, %d devices)", len(diagnosis.hosts),
                    len(diagnosis.devices))
