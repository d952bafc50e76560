#!/usr/bin/env bash
# Takes the test bed of tests/testbed/up.sh down. Run as root:
#   bash tests/testbed/down.sh            # sshds, slurmd/slurmctld, namespaces, veths, bridge, testbed.json
#   bash tests/testbed/down.sh --all      # also the base image, the dockerd up.sh started, munged and the
#                                         # slurm.conf up.sh wrote, the
#                                         # package cache, the key and the user fpagent
#   bash tests/testbed/down.sh --beyond K # only hosts numbered above K (up.sh uses it to shrink a bed)
#   --dry-run first (down.sh --dry-run --all): print each change it would make ("would: ..."), make none, take no lock (the bed may be in
#   use: this is how its own test checks what it would take down)
set -euo pipefail

readonly STATE=/tmp/flagperf-testbed
readonly IMAGE=flagperf-testbed/base:bookworm-py311
readonly BRIDGE=fpbr0
readonly AGENT=fpagent
export DOCKER_HOST=unix:///var/run/docker.sock

die() { echo "down.sh: error: $*" >&2; exit 1; }
dry=
# first, so that an older down.sh, which knows no --dry-run, refuses it (usage) rather than take the bed down
if [ "${1:-}" = --dry-run ]; then dry=1; shift; fi
log() { echo "down.sh${dry:+ (dry run: nothing done)}: $*" >&2; }
# run COMMAND...: a change to the machine; with --dry-run only said. run_quiet: its output dropped.
run() { if [ -n "$dry" ]; then echo "would: $*"; else "$@"; fi; }
run_quiet() { if [ -n "$dry" ]; then echo "would: $*"; else "$@" >/dev/null; fi; }
remove_containers() {  # the ids on stdin
  if [ -n "$dry" ]; then sed 's/^/would: docker rm -f /'; else xargs -r timeout 300 docker rm -f >/dev/null; fi
}
all=; beyond=0
usage="usage: down.sh [--dry-run] [--all | --beyond K]"
case "${1:-}" in
  "") ;;
  --all) [ "$#" = 1 ] || die "$usage"; all=1 ;;  # nothing after it: '--all --dry-run' is no dry run, so refused
  --beyond) [[ "${2:-}" =~ ^[0-9]{1,3}$ ]] || die "--beyond needs a host number"; [ "$#" = 2 ] || die "$usage"
            beyond=$2 ;;
  *) die "$usage" ;;
esac
[ "$(id -u)" = 0 ] || [ -n "$dry" ] || die "run as root"

if [ "$beyond" = 0 ] && [ -z "$dry" ]; then  # up.sh calls --beyond while it holds the lock
  mkdir -p "$STATE"
  exec 9>"$STATE/.lock"
  flock -w 900 9 || die "another up.sh/down.sh holds $STATE/.lock for more than 900 s"
  rm -f "$STATE/testbed.json"
fi

# alive PID: running, not a zombie (this machine's init reaps orphans only after a second or two)
alive() { awk '$1 == "State:" {exit $2 == "Z"}' "/proc/$1/status" 2>/dev/null; }
# stop_pids PID...: TERM, up to 5 s, then KILL
stop_pids() {
  [ "$#" -gt 0 ] || return 0
  [ -z "$dry" ] || { echo "would: stop $*"; return 0; }
  kill "$@" 2>/dev/null || true
  for _ in $(seq 50); do
    local alive=0 pid
    for pid in "$@"; do alive "$pid" && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null || true
}

# Hosts: every namespace fp-hK and every host folder, numbered above $beyond
declare -A hosts=()
while read -r ns _; do
  [[ "$ns" =~ ^fp-h([0-9]+)$ ]] && hosts[${BASH_REMATCH[1]}]=1
done < <(ip netns list 2>/dev/null)
for hdir in "$STATE"/hosts/h*; do
  [[ "$hdir" =~ /h([0-9]+)$ ]] && hosts[${BASH_REMATCH[1]}]=1
done
removed=0
for i in "${!hosts[@]}"; do
  [ "$i" -gt "$beyond" ] || continue
  ns="fp-h$i"; hdir="$STATE/hosts/h$i"
  pids=()
  if [ -e "/run/netns/$ns" ]; then  # everything in the namespace is ours (the sshd and its sessions)
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null)
  fi
  stop_pids "${pids[@]}"
  # the veth first: deleting it is synchronous, while a deleted namespace frees its devices later
  if ip link show "fpv$i" >/dev/null 2>&1; then run ip link delete "fpv$i" 2>/dev/null || true; fi
  if [ -e "/run/netns/$ns" ]; then run ip netns delete "$ns" || die "cannot delete namespace $ns"; fi
  run rm -rf "$hdir" "$STATE/checks/h$i.ok" "$STATE/checks/h$i.err"
  removed=$((removed + 1))
done
[ "$removed" = 0 ] || log "removed $removed hosts"
[ "$beyond" = 0 ] || exit 0

# The Slurm controller (its slurmds lived in the namespaces, stopped with them above)
pid=$(cat "$STATE/slurm/slurmctld.pid" 2>/dev/null) || pid=
if [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q slurmctld; then
  stop_pids "$pid"
  log "stopped slurmctld ($pid)"
fi
if ip link show "$BRIDGE" >/dev/null 2>&1; then run ip link delete "$BRIDGE"; log "removed bridge $BRIDGE"; fi
run rm -f "$STATE/known_hosts"
[ -n "$all" ] || { log "kept dockerd and $IMAGE (down.sh --all removes them)"; exit 0; }

if timeout 20 docker info >/dev/null 2>&1; then
  # the owner value goes with $STATE: its containers (labelled <owner> or <owner>.<pid>) would be no one's after
  owner=$(cat "$STATE/owner" 2>/dev/null) || owner=
  if [[ "$owner" =~ ^flagperf-testbed-[0-9a-f]{16}$ ]]; then
    timeout 60 docker ps -a --filter label=org.flagperf.owner \
        --format '{{.ID}} {{.State}} {{.Label "org.flagperf.owner"}}' \
      | bash "$(dirname "${BASH_SOURCE[0]}")/leftovers.sh" "$owner" --all | remove_containers \
      && log "removed the containers of owner $owner" \
      || log "not all containers of owner $owner removed (docker ps -a --filter label=org.flagperf.owner lists them)"
  fi
  if timeout 30 docker image inspect "$IMAGE" >/dev/null 2>&1; then
    run_quiet timeout 300 docker rmi "$IMAGE" || die "cannot remove $IMAGE (a container still uses it?)"
    log "removed $IMAGE"
  fi
fi
pid=$(cat "$STATE/dockerd.pid" 2>/dev/null) || pid=
if [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q dockerd; then
  run kill "$pid"
  for _ in $(seq 300); do [ -z "$dry" ] && alive "$pid" || break; sleep 0.1; done
  [ -z "$dry" ] && alive "$pid" && die "dockerd ($pid) did not stop within 30 s"
  log "stopped dockerd ($pid)"
else
  log "no dockerd started by up.sh is running (left any other alone)"
fi
if grep -qF flagperf-testbed-slurm /etc/slurm/slurm.conf 2>/dev/null; then  # only the one up.sh wrote
  run rm -f /etc/slurm/slurm.conf
  log "removed /etc/slurm/slurm.conf"
fi
mapfile -t munged_pids < <(pgrep -x munged || true)
if [ "${#munged_pids[@]}" -gt 0 ]; then stop_pids "${munged_pids[@]}"; log "stopped munged"; fi
if id "$AGENT" >/dev/null 2>&1; then
  run userdel --remove "$AGENT" 2>/dev/null || run userdel "$AGENT"
  log "removed user $AGENT"
fi
# the build folder may hold proc/sys mounts of a killed debootstrap: never delete through a mount
while read -r mnt; do run umount -l "$mnt"; done < <(awk -v p="$STATE/" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r)
run rm -rf --one-file-system "$STATE"
log "removed $STATE"
