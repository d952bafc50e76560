# Sourced by leftovers.sh and slurm-leftovers.sh (up.sh runs both): whether a test session is gone. A session is its pytest process, named by its
# pid and that process's start time (field 22 of /proc/PID/stat, clock ticks since boot; tests/testbed/bed.py
# session_id): the pid alone may be another process's by now (pids are reused), the pair never is.
# Its containers carry the owner label <bed owner>.<pid>.<start> (an older session's: <bed owner>.<pid>); its Slurm
# jobs' names and its drain reasons carry sess<pid>t<start> (tests/integration/test_slurm.py).

# session_start PID: the process's start time, or fails where there is no such process (a zombie: none)
session_start() {
  local stat fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  read -ra fields <<<"${stat##*) }"  # after the command's name, which may hold spaces and ')'
  [ "${fields[0]}" != Z ] || return 1
  printf '%s\n' "${fields[19]}"
}

# session_gone PID [START]: true where that session's process is no longer there: no process with that pid, or one
# that started at another time (the pid reused); without START (an older label), any process with the pid is taken
# for it. Not a pid: gone (no session labels so).
session_gone() {
  local now
  [[ "$1" =~ ^[0-9]+$ ]] || return 0
  now=$(session_start "$1") || return 0
  [ -z "${2:-}" ] || [ "$now" = "$2" ] || return 0
  return 1
}

# session_tag_in TEXT: "PID START" of the Slurm tag sess<pid>t<start> in TEXT (a job's name, a drain reason), or fails
session_tag_in() {
  [[ "$1" =~ sess([0-9]+)t([0-9]+) ]] || return 1
  printf '%s %s\n' "${BASH_REMATCH[1]}" "${BASH_REMATCH[2]}"
}
