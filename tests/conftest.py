"""The lanes of the README's test command (`python -m pytest -n 2 --dist loadgroup`: pytest-xdist, two workers).

The integration tests run one after another in one lane, in their usual order: they share the test bed (one
Docker engine, three sshd hosts, one Slurm cluster), each lane's Prefect server and the test database's work
pools, and several check that nothing of theirs is left on a shared engine or host. The unit tests run one after
another in the other lane, as `pytest tests/unit` runs them. Side by side the two lanes hold the suite within
CI's 90 minutes on two cores, where one after the other they no longer do; neither lane's tests ever run beside
another test of the same lane. Without `--dist loadgroup` (plain `pytest`, one process) the lanes mean nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
UNIT_LANE = "unit"
INTEGRATION_LANE = "integration"


def lane(path: Path) -> str:
    """The lane of a test file: tests/unit's is the unit lane, every other (integration, gpu) the integration one."""
    return UNIT_LANE if path.resolve().is_relative_to(TESTS / "unit") else INTEGRATION_LANE


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into each test's id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):  # its mark is known only where xdist is installed
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(lane(item.path)))
