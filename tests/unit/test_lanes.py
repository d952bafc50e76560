"""The groups of the README's test command (tests/lanes.py): a self-contained integration file shares nothing
with the tests that may run beside it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.lanes import SELF_CONTAINED, SHARED_GROUP, TESTS, UNIT_GROUP, group_of

# A screen of each self-contained file's own text (not of the helper modules it imports) for what would share
# something with a test beside it: the test bed (its Docker engine, sshd hosts, Slurm cluster), a `flagperf
# server` on the test database's pools or their locks, a look at every process of the machine by name. A look at
# processes must keep to its own run's, as test_evaluate_flow's do (the other worker's are there too), and a file
# it writes must lie in its tmp_path or an ignored folder (git status is part of every round's provenance).
SHARED_THINGS = re.compile(r"testbed|server_ports|PoolLock|default_pool|FLAGPERF_TEST_POSTGRES_URL|docker|slurm|"
                           r"squeue|sbatch|SshHost|pgrep|pkill|killall|/proc/", re.IGNORECASE)


@pytest.mark.parametrize("name", sorted(SELF_CONTAINED))
def test_a_self_contained_integration_file_uses_nothing_shared(name: str) -> None:
    path = TESTS / "integration" / name
    assert path.is_file(), f"tests/lanes.py names {name}, which tests/integration does not have"
    found = sorted({match.group(0) for match in SHARED_THINGS.finditer(path.read_text(encoding="utf-8"))})
    assert found == [], f"{name} uses {found}: take it out of SELF_CONTAINED (tests/lanes.py)"
    assert group_of(path) == path.stem


def test_every_other_test_file_is_in_the_unit_or_the_shared_group() -> None:
    for path in (TESTS / "unit").glob("test_*.py"):
        assert group_of(path) == UNIT_GROUP, path
    for path in [*(TESTS / "integration").glob("test_*.py"), *(TESTS / "gpu").glob("test_*.py")]:
        if path.name not in SELF_CONTAINED:
            assert group_of(path) == SHARED_GROUP, path
    assert group_of(Path(__file__)) == UNIT_GROUP
