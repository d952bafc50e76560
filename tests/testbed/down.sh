#!/usr/bin/env bash
# Takes the test bed of tests/testbed/up.sh down. Run as root:
#   bash tests/testbed/down.sh            # sshds, slurmd/slurmctld, namespaces, veths, bridge, testbed.json
#   bash tests/testbed/down.sh --all      # also the base image, the dockerd up.sh started, munged and the
#                                         # slurm.conf up.sh wrote, the
#                                         # package cache, the key and the user fpagent
#   bash tests/testbed/down.sh --beyond K # only hosts numbered above K (up.sh uses it to shrink a bed)
set -euo pipefail

readonly STATE=/tmp/flagperf-testbed
readonly IMAGE=flagperf-testbed/base:bookworm-py311
readonly BRIDGE=fpbr0
readonly AGENT=fpagent
export DOCKER_HOST=unix:///var/run/docker.sock

die() { echo "down.sh: error: $*" >&2; exit 1; }
log() { echo "down.sh: $*" >&2; }
all=; beyond=0
case "${1:-}" in
  "") ;;
  --all) all=1 ;;
  --beyond) [[ "${2:-}" =~ ^[0-9]{1,3}$ ]] || die "--beyond needs a host number"; beyond=$2 ;;
  *) die "usage: down.sh [--all | --beyond K]" ;;
esac
[ "$(id -u)" = 0 ] || die "run as root"

if [ "$beyond" = 0 ]; then  # up.sh calls --beyond while it holds the lock
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
  if ip link show "fpv$i" >/dev/null 2>&1; then ip link delete "fpv$i" 2>/dev/null || true; fi
  if [ -e "/run/netns/$ns" ]; then ip netns delete "$ns" || die "cannot delete namespace $ns"; fi
  rm -rf "$hdir" "$STATE/checks/h$i.ok" "$STATE/checks/h$i.err"
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
if ip link show "$BRIDGE" >/dev/null 2>&1; then ip link delete "$BRIDGE"; log "removed bridge $BRIDGE"; fi
rm -f "$STATE/known_hosts"
[ -n "$all" ] || { log "kept dockerd and $IMAGE (down.sh --all removes them)"; exit 0; }

if timeout 20 docker info >/dev/null 2>&1; then
  # the owner value goes with $STATE: its containers (labelled <owner> or <owner>.<pid>) would be no one's after
  owner=$(cat "$STATE/owner" 2>/dev/null) || owner=
  if [[ "$owner" =~ ^flagperf-testbed-[0-9a-f]{16}$ ]]; then
    timeout 60 docker ps -a --filter label=org.flagperf.owner \
        --format '{{.ID}} {{.State}} {{.Label "org.flagperf.owner"}}' \
      | bash "$(dirname "${BASH_SOURCE[0]}")/leftovers.sh" "$owner" --all | xargs -r timeout 300 docker rm -f >/dev/null \
      && log "removed the containers of owner $owner" \
      || log "not all containers of owner $owner removed (docker ps -a --filter label=org.flagperf.owner lists them)"
  fi
  if timeout 30 docker image inspect "$IMAGE" >/dev/null 2>&1; then
    timeout 300 docker rmi "$IMAGE" >/dev/null || die "cannot remove $IMAGE (a container still uses it?)"
    log "removed $IMAGE"
  fi
fi
pid=$(cat "$STATE/dockerd.pid" 2>/dev/null) || pid=
if [[ "$pid" =~ ^[0-9]+$ ]] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q dockerd; then
  kill "$pid"
  for _ in $(seq 300); do alive "$pid" || break; sleep 0.1; done
  alive "$pid" && die "dockerd ($pid) did not stop within 30 s"
  log "stopped dockerd ($pid)"
else
  log "no dockerd started by up.sh is running (left any other alone)"
fi
if grep -qF flagperf-testbed-slurm /etc/slurm/slurm.conf 2>/dev/null; then  # only the one up.sh wrote
  rm -f /etc/slurm/slurm.conf
  log "removed /etc/slurm/slurm.conf"
fi
mapfile -t munged_pids < <(pgrep -x munged || true)
if [ "${#munged_pids[@]}" -gt 0 ]; then stop_pids "${munged_pids[@]}"; log "stopped munged"; fi
if id "$AGENT" >/dev/null 2>&1; then
  userdel --remove "$AGENT" 2>/dev/null || userdel "$AGENT"
  log "removed user $AGENT"
fi
# the build folder may hold proc/sys mounts of a killed debootstrap: never delete through a mount
while read -r mnt; do umount -l "$mnt"; done < <(awk -v p="$STATE/" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r)
rm -rf --one-file-system "$STATE"
log "removed $STATE"
