#!/usr/bin/env bash
# The containers of this bed's owner to remove, one id a line, from lines "ID STATE OWNER-LABEL" on stdin (docker ps
# -a --format '{{.ID}} {{.State}} {{.Label "org.flagperf.owner"}}'). A test session labels its containers
# OWNER.<its pytest pid> (tests/integration/conftest.py): one of them is a leftover where it is not running or that
# process is gone; a running one of a live session (another on the same bed) is left alone. ``--all`` (down.sh:
# the owner value goes with the bed): every one of this owner's. Other owners' containers are never listed.
# Usage: leftovers.sh OWNER [--all]
set -euo pipefail
owner=$1
all=${2:-}
while read -r id state label; do
  case "$label" in
    "$owner") pid= ;;
    "$owner".*) pid=${label#"$owner".} ;;
    *) continue ;;
  esac
  if [ "$all" != --all ] && [ "$state" = running ]; then
    [ -z "$pid" ] && continue  # no session's pid to look at: not known to be a leftover
    [[ "$pid" =~ ^[0-9]+$ ]] && [ -d "/proc/$pid" ] && continue  # its session runs
  fi
  printf '%s\n' "$id"
done
