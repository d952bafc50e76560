"""The README's test command (`python -m pytest -n 2 --dist loadgroup`) runs the tests in two workers of
pytest-xdist, each test in its group (tests/lanes.py says which and why). Without `--dist loadgroup` (plain
`pytest`, one process) the groups mean nothing."""

from __future__ import annotations

import pytest

from tests.lanes import group_of


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the group into each test's id
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.pluginmanager.hasplugin("xdist"):  # its mark is known only where xdist is installed
        return
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item.path)))
