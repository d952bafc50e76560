from __future__ import annotations

from pathlib import Path

from prefect import get_run_logger, task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.cache_policies import NONE

from flagperf.results.report import build_report
from flagperf.results.summary import HEADLINE_HEADER, RunSummary, headline_cells, render_markdown


@task(name="analyze", task_run_name="analyze[{run_dir.name}]", cache_policy=NONE)
def analyze(run_dir: Path) -> RunSummary | None:
    """Summarise the run from its result and monitor files, write the report, publish it as artifacts.
    None when the report cannot be written (a full disk): one line says so; `flagperf report` makes it later."""
    logger = get_run_logger()
    try:
        summary, paths = build_report(run_dir)
    except OSError as exc:
        logger.error("the report could not be written to %s: %s; once it can, run `flagperf report %s`",
                     run_dir, exc.strerror or exc, run_dir)
        return None
    for problem in summary.problems:
        logger.warning(problem)
    for note in summary.monitor_notes:
        logger.info("monitors: %s", note)
    table = [dict(zip(HEADLINE_HEADER, headline_cells(e), strict=True)) for e in summary.headline]
    table += [{"case": e["case"], "metric": "-", "measured": e["status"], "unit": "", "p50": "", "spread (CV)": "",
               "peak": "", "measured/peak": e["message"][:200], "MFU": "", "rounds": f"round {e['round']}"}
              for e in summary.not_measured]
    create_table_artifact(table=table, key="flagperf-summary",
                          description=f"{summary.run_id}: measured vs peak per case and metric")
    create_markdown_artifact(markdown=render_markdown(summary), key="flagperf-report",
                             description=f"{summary.run_id}: the run report ({paths['markdown']})")
    create_link_artifact(link=paths["html"].resolve().as_uri(), link_text=f"{summary.run_id} report (HTML, plots)",
                         key="flagperf-report-html", description="the HTML report with plots, on the controller")
    logger.info("report written to %s", ", ".join(str(p) for p in paths.values()))
    return summary
