"""The groups the README's test command runs the tests in (tests/conftest.py gives each test its group).

A group's tests run one after another in one worker, in their usual order; the two workers take groups as they
free up (the largest first). The groups:
- `unit`: every unit test, as `pytest tests/unit` runs them.
- `shared`: the integration tests that share something of this machine with other integration tests: the test
  bed (one Docker engine, three sshd hosts, one Slurm cluster), `flagperf server`s on the test database's work
  pools, the default pool's lock; several check that nothing of theirs is left on a shared engine or host.
- one group per SELF_CONTAINED integration file: it needs only its worker's own Prefect server and processes of
  its own (tests/unit/test_lanes.py screens its text for that), so it may run beside any other test.
One after the other the tests no longer fit CI's 90 minutes on two cores; like this the unit tests and the shared
integration tests run side by side from the start, and the self-contained files fill in behind whichever ends
first."""

from __future__ import annotations

from pathlib import Path

TESTS = Path(__file__).resolve().parent
UNIT_GROUP = "unit"
SHARED_GROUP = "shared"
SELF_CONTAINED = frozenset({
    "test_disk_full.py", "test_evaluate_flow.py", "test_generate_flow.py", "test_inference_flow.py",
    "test_interrupt_retry.py", "test_nightly.py", "test_operation_flow.py", "test_results_site.py",
    "test_run_interrupt.py", "test_site_security.py", "test_vendor_adaptation.py",
})


def group_of(path: Path) -> str:
    """The group of a test file; an integration file not named in SELF_CONTAINED (or anything else) is shared."""
    path = path.resolve()
    if path.is_relative_to(TESTS / "unit"):
        return UNIT_GROUP
    if path.parent == TESTS / "integration" and path.name in SELF_CONTAINED:
        return path.stem
    return SHARED_GROUP
