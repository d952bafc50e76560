"""How the results site lists a run that a retry finished: started when the run started (its id's time, not the
retry's rewrite of plan.json), and its outcome saying that rounds ran again."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

from flagperf.config.plan import new_run_id
from flagperf.site.runs import list_runs

RETRY_TIME = datetime(2026, 3, 1, 2, 40, tzinfo=timezone.utc).timestamp()


def write_run(root: Path, run_id: str, summary: dict) -> None:
    folder = root / run_id
    folder.mkdir(parents=True)
    (folder / "plan.json").write_text(json.dumps({"run_id": run_id, "suite": "smoke"}), encoding="utf-8")
    (folder / "summary.json").write_text(json.dumps(summary), encoding="utf-8")
    for name in ("plan.json", "summary.json"):  # rewritten by the retry, 40 minutes after the run started
        os.utime(folder / name, (RETRY_TIME, RETRY_TIME))


def test_a_retried_run_is_listed_when_it_started_and_says_it_was_retried(tmp_path: Path) -> None:
    retried = {"counts": {"rounds": 4, "success": 4, "unsupported": 0, "failed": 0},
               "retried": [{"case": "c", "round": 1, "was": "failed", "now": "success"},
                           {"case": "c", "round": 2, "was": "failed", "now": "success"}]}
    write_run(tmp_path, "run20260301020000-dc14", retried)
    # A later run, not retried: listed first, as it started later.
    write_run(tmp_path, "run20260301021500-ab12", {"counts": {"rounds": 2, "success": 2, "unsupported": 0,
                                                             "failed": 0}})
    later, first = list_runs(tmp_path)
    assert first.run_id == "run20260301020000-dc14"
    assert first.started == datetime(2026, 3, 1, 2, 0, tzinfo=timezone.utc)
    assert first.outcome == "succeeded (4 rounds; 2 ran again in a retry)"
    assert later.started == datetime(2026, 3, 1, 2, 15, tzinfo=timezone.utc)
    assert later.outcome == "succeeded (2 rounds)"


def test_a_run_id_of_ones_own_is_listed_by_its_files_time(tmp_path: Path) -> None:
    write_run(tmp_path, "nightly-a", {"counts": {"rounds": 1, "success": 1, "unsupported": 0, "failed": 0}})
    write_run(tmp_path, "run99999999999999-x", {"counts": {"rounds": 1, "success": 1, "unsupported": 0, "failed": 0}})
    assert {r.started.timestamp() for r in list_runs(tmp_path)} == {RETRY_TIME}


def test_the_id_a_run_gets_carries_its_start_time(tmp_path: Path) -> None:
    """The site reads the time back from the id plan.py makes; a change of either's format fails here."""
    before = datetime.now(timezone.utc).replace(microsecond=0)
    write_run(tmp_path, new_run_id(), {"counts": {"rounds": 1, "success": 1, "unsupported": 0, "failed": 0}})
    (run,) = list_runs(tmp_path)
    assert before <= run.started <= datetime.now(timezone.utc)


def test_a_run_whose_controller_was_killed_is_listed_as_such_not_as_waiting_for_its_report(tmp_path: Path) -> None:
    """A run with no summary.json read 'no report yet' forever after its controller was killed (SIGKILL, a power
    cut). Where its controller.lock is held by nobody, it says so; held (the run goes on), as before. A summary.json
    that cannot be read is a run that ended: never 'killed'."""
    import signal

    from tests.unit.controllers import controller

    folder = tmp_path / "run20260301020000-dc14"
    folder.mkdir()
    (folder / "plan.json").write_text(json.dumps({"run_id": folder.name, "suite": "smoke"}), encoding="utf-8")
    assert list_runs(tmp_path)[0].outcome == "no report yet"  # no record: an older run, as before
    proc, _ = controller(folder)
    try:
        assert (list_runs(tmp_path)[0].outcome, list_runs(tmp_path)[0].tone) == ("no report yet", "none")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    (run,) = list_runs(tmp_path)  # nobody holds it: its controller is gone
    assert (run.outcome, run.tone) == ("controller killed, no report", "bad")
    (folder / "summary.json").write_text("{not json", encoding="utf-8")
    os.utime(folder / "summary.json", (RETRY_TIME, RETRY_TIME))  # older than the record: not one written since
    assert list_runs(tmp_path)[0].outcome == "no report yet"
