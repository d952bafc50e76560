#!/usr/bin/env bash
# The containers of this bed's owner to remove, one id a line, from lines "ID STATE OWNER-LABEL" on stdin (docker ps
# -a --format '{{.ID}} {{.State}} {{.Label "org.flagperf.owner"}}'). A test session labels its containers
# OWNER.<its pytest pid>.<that process's start time> (tests/integration/conftest.py; an older session OWNER.<pid>):
# one of them is a leftover where that process is gone, or the pid is another process's now (started at another
# time: sessions.sh); one of a live session (another on the same bed) is left alone in any state. One labelled OWNER
# alone is a leftover (the sessions always add their pid). ``--all`` (down.sh: the owner value goes with the bed):
# every one of this owner's. Other owners' containers are never listed.
# Usage: leftovers.sh OWNER [--all]
set -euo pipefail
# shellcheck source=sessions.sh
. "$(dirname "${BASH_SOURCE[0]}")/sessions.sh"
owner=$1
all=${2:-}
while read -r id state label; do
  case "$label" in
    "$owner") session= ;;
    "$owner".*) session=${label#"$owner".} ;;
    *) continue ;;
  esac
  # the engine removes it already (a `docker rm -f` of it answers 409, failing the whole removal)
  [ "$state" = removing ] && continue
  if [ "$all" != --all ] && [ -n "$session" ]; then
    # its session runs: kept whatever its state (one created and not yet started, or exited and not yet read, is
    # that session's round in progress)
    pid=${session%%.*}; start=
    [ "$pid" = "$session" ] || start=${session#*.}
    if [[ "$start" =~ ^[0-9]*$ ]] && ! session_gone "$pid" "$start"; then continue; fi
  fi
  # one with no pid (the bare owner): no session of this bed labels so (conftest adds its pid), so a leftover
  printf '%s\n' "$id"
done
