"""Hosts: local and SSH hosts, the host agent, runtimes (process, Docker), inventories and FlagPerf's
host.yaml, healthcheck and probe, the fleet."""
