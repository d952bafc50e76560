#!/usr/bin/env bash
# What a killed test session left on the bed's Slurm cluster, and only that (up.sh acts on it):
#   slurm-leftovers.sh jobs    stdin "JOBID NAME" (squeue -h -o '%i %j'): prints the ids of jobs to cancel, those whose
#                              name carries the tag of a session that is gone (sess<pid>t<start>: sessions.sh)
#   slurm-leftovers.sh nodes   stdin "NODE|STATE|REASON" (sinfo -h -N -o '%N|%T|%E'): prints "resume NODE" for a node
#                              drained or down by a gone session or for a reason of Slurm's own (not responding, a
#                              kill that failed), "keep NODE WHY" for one a live session drained, or a test session of
#                              an older checkout (flagperf_test_drain_ with no tag: it may be live); nothing for others
#   slurm-leftovers.sh states [KEPT_NODE...]
#                              stdin "NODE STATE" (sinfo -h -N -o '%N %T'), once the leftovers are gone: prints "idle NODE"
#                              for a node up.sh's step checks, "busy NODE" for one in a live session's use (mixed,
#                              allocated, or planned: held for a pending job) or kept drained (KEPT_NODE), "wait NODE
#                              STATE" for any other (completing, not registered yet): the cluster is settled without one
# Another session testing on this bed right now keeps its jobs and the node it drained on purpose.
set -euo pipefail
# shellcheck source=sessions.sh
. "$(dirname "${BASH_SOURCE[0]}")/sessions.sh"
case "${1:-}" in
  jobs)
    while read -r job name; do
      tag=$(session_tag_in "$name") || continue  # no session's: left alone
      read -r pid start <<<"$tag"
      if session_gone "$pid" "$start"; then printf '%s\n' "$job"; fi
    done ;;
  nodes)
    while IFS='|' read -r node state reason; do
      [[ "$state" =~ drain|down|fail ]] || continue
      if tag=$(session_tag_in "$reason"); then
        read -r pid start <<<"$tag"
        if ! session_gone "$pid" "$start"; then printf 'keep %s %s\n' "$node" "$reason (a live test session's)"; continue; fi
      elif [[ "$reason" == *flagperf_test_drain_* ]]; then
        printf 'keep %s %s\n' "$node" "$reason (no session tag: resume it by hand once its test ended)"; continue
      fi
      printf 'resume %s\n' "$node"
    done ;;
  states)
    shift
    kept=" $* "
    while read -r node state; do
      [ -n "$node" ] || continue
      if [ "$state" = idle ]; then printf 'idle %s\n' "$node"
      elif [[ "$state" =~ ^(mixed|allocated|planned)$ || "$kept" == *" $node "* ]]; then printf 'busy %s\n' "$node"
      else printf 'wait %s %s\n' "$node" "$state"; fi
    done ;;
  *) echo "usage: slurm-leftovers.sh jobs|nodes|states [KEPT_NODE...]" >&2; exit 2 ;;
esac
