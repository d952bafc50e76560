#!/usr/bin/env bash
# A PostgreSQL database for the tests of `flagperf server` (Debian/Ubuntu, run as root). Prints the
# two lines to export; the password is random per call and never written to a file of the project.
#   eval "$(bash deployments/postgres/test-database.sh)"
set -euo pipefail
if ! command -v pg_ctlcluster >/dev/null 2>&1; then
  apt-get update -qq >&2 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >&2
fi
version=$(ls /usr/lib/postgresql | sort -n | tail -n 1)
pg_lsclusters --no-header | awk '{print $1, $2}' | grep -qx "$version main" || pg_createcluster "$version" main >&2
pg_ctlcluster "$version" main start >&2 2>/dev/null || true
for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 && break; sleep 1; done
password=$(python3 -c 'import secrets; print(secrets.token_hex(16))')
su postgres -c "psql -q -v ON_ERROR_STOP=1" >&2 <<SQL
DO \$\$ BEGIN
  IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'flagperf') THEN CREATE ROLE flagperf LOGIN; END IF;
END \$\$;
ALTER ROLE flagperf PASSWORD '${password}';
DROP DATABASE IF EXISTS flagperf_test;
CREATE DATABASE flagperf_test OWNER flagperf;
SQL
echo "export PGPASSWORD=${password}"
echo "export FLAGPERF_TEST_POSTGRES_URL=postgresql+asyncpg://flagperf@127.0.0.1:5432/flagperf_test"
