"""The real-parts test bed (sshd hosts in network namespaces, a local Docker engine and base image):
tests/testbed/up.sh builds it, ``load_testbed``/``make_testbed_fixture`` hand it to the tests."""

from .bed import (
    SlurmBed,
    Testbed,
    TestbedHost,
    deploy_project,
    in_ci,
    load_testbed,
    make_testbed_fixture,
    require_slurm,
    require_testbed,
)

__all__ = ["SlurmBed", "Testbed", "TestbedHost", "deploy_project", "in_ci", "load_testbed", "make_testbed_fixture",
           "require_slurm", "require_testbed"]
