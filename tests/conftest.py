"""The README's test command (`python -m pytest -n 2 --dist loadgroup`) runs the tests in two workers of
pytest-xdist, each test in its group (tests/lanes.py says which and why). Without `--dist loadgroup` (plain
`pytest`, one process) the groups mean nothing."""

from __future__ import annotations

import pytest

from tests.lanes import group_of


def pytest_configure(config: pytest.Config) -> None:
    """Workers without --dist loadgroup would spread the shared integration tests over both (xdist's default is
    load): they would run at once on the one test bed."""
    if hasattr(config, "workerinput") or not config.pluginmanager.hasplugin("xdist"):
        return
    if config.getoption("numprocesses", None) and config.getoption("dist", "no") != "loadgroup":
        raise pytest.UsageError("-n needs --dist loadgroup here: the integration tests that share the test bed run "
                                "one after another in one group (tests/lanes.py)")


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into each test's id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):  # its mark is known only where xdist is installed
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item.path)))
