#!/usr/bin/env bash
# The containers of this bed's owner to remove, one id a line, from lines "ID STATE OWNER-LABEL" on stdin (docker ps
# -a --format '{{.ID}} {{.State}} {{.Label "org.flagperf.owner"}}'). A test session labels its containers
# OWNER.<its pytest pid> (tests/integration/conftest.py): one of them is a leftover where that process is gone; one
# of a live session (another on the same bed) is left alone in any state. One labelled OWNER alone is a leftover (the
# sessions always add their pid). ``--all`` (down.sh: the owner value goes with the bed): every one of this owner's.
# Other owners' containers are never listed.
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
  # the engine removes it already (a `docker rm -f` of it answers 409, failing the whole removal)
  [ "$state" = removing ] && continue
  if [ "$all" != --all ]; then
    # its session runs: kept whatever its state (one created and not yet started, or exited and not yet read, is
    # that session's round in progress)
    [[ "$pid" =~ ^[0-9]+$ ]] && [ -d "/proc/$pid" ] && continue
  fi
  # one with no pid (the bare owner): no session of this bed labels so (conftest adds its pid), so a leftover
  printf '%s\n' "$id"
done
