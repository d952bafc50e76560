#!/usr/bin/env bash
# The integration test bed: a local Docker engine, a locally built base image (no registry) and
# N simulated hosts (network namespaces fp-h1..fp-hN on bridge fpbr0, each with its own sshd).
# Idempotent: a second run checks everything and changes nothing. Run as root:
#   bash tests/testbed/up.sh [N_HOSTS=3]
# Writes /tmp/flagperf-testbed/testbed.json only after every check passed (tests/testbed/bed.py reads it).
set -euo pipefail
umask 022

readonly STATE=/tmp/flagperf-testbed
readonly IMAGE=flagperf-testbed/base:bookworm-py311
readonly BRIDGE=fpbr0
readonly NET_PREFIX=10.231.0
readonly BRIDGE_ADDR="$NET_PREFIX.1"
readonly AGENT=fpagent
readonly KEY="$STATE/id_ed25519"
readonly KNOWN_HOSTS="$STATE/known_hosts"
readonly SITE="$STATE/site"            # the pinned packages, shared by the image and the hosts' python
readonly HOST_VENV="$STATE/python"     # the hosts' interpreter: a venv that sees $SITE
readonly HOST_PY="$HOST_VENV/bin/python3"
readonly DOCKER_SOCK=/var/run/docker.sock
readonly SLURM_CONF=/etc/slurm/slurm.conf   # Debian's default place: every Slurm tool finds it there
readonly SLURM_MARK=flagperf-testbed-slurm
readonly SLURM_STATE="$STATE/slurm"
readonly SLURM_SHARED="$STATE/slurm-shared"   # the cluster's shared folder (every node sees this filesystem)
readonly SLURM_PARTITION=fp
readonly SLURM_MAX_NODES="${FLAGPERF_TESTBED_SLURM_NODES:-3}"
readonly TORCH_WHEEL="${FLAGPERF_TESTBED_TORCH_WHEEL:-/opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl}"
readonly DEBIAN_MIRROR="${FLAGPERF_TESTBED_DEBIAN_MIRROR:-http://deb.debian.org/debian}"
readonly PY="${FLAGPERF_TESTBED_PYTHON:-python3}"  # the controller's python: its pip builds $SITE
export DOCKER_HOST="unix://$DOCKER_SOCK"

N="${1:-3}"
die() { echo "up.sh: error: $*" >&2; exit 1; }
log() { echo "up.sh: $*" >&2; }
[[ "$N" =~ ^[1-9][0-9]{0,2}$ && "$N" -le 200 ]] || die "N_HOSTS must be an integer from 1 to 200, got '$N'"
[[ "$SLURM_MAX_NODES" =~ ^[1-9][0-9]?$ ]] || die "FLAGPERF_TESTBED_SLURM_NODES must be an integer from 1 to 99, got '$SLURM_MAX_NODES'"
[ "$(id -u)" = 0 ] || die "run as root (it installs packages, starts dockerd and sshds, creates namespaces)"
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd -P)
REPO=$(cd "$HERE/../.." && pwd -P)

mkdir -p "$STATE" "$STATE/hosts"
chmod 0755 "$STATE" "$STATE/hosts"
exec 9>"$STATE/.lock"
flock -w 900 9 || die "another up.sh/down.sh holds $STATE/.lock for more than 900 s"
rm -f "$STATE/testbed.json"  # only a fully checked bed is advertised

T_START=$SECONDS
T_STEP=$SECONDS
step_done() { log "step '$1' done in $((SECONDS - T_STEP)) s"; T_STEP=$SECONDS; }

# 1. Packages ------------------------------------------------------------------------------------------
missing=()
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v dockerd >/dev/null || missing+=(docker.io)
command -v docker >/dev/null || missing+=(docker.io)
command -v debootstrap >/dev/null || missing+=(debootstrap)
command -v ip >/dev/null || missing+=(iproute2)
if [ ! -x /usr/local/bin/python3.11 ] && [ ! -x /usr/bin/python3.11 ]; then missing+=(python3); fi
if [ "${#missing[@]}" -gt 0 ]; then
  log "installing ${missing[*]}"
  timeout 300 apt-get update -qq || die "apt-get update failed or took over 300 s"
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "${missing[@]}" \
    >"$STATE/apt.log" 2>&1 || die "apt-get install ${missing[*]} failed or took over 900 s; see $STATE/apt.log"
fi
step_done packages

# 2. Docker engine -------------------------------------------------------------------------------------
getent group docker >/dev/null || groupadd --system docker
if ! timeout 20 docker info >/dev/null 2>&1; then
  log "starting dockerd (log: $STATE/dockerd.log)"
  # setsid -f: its own session, not a child of this script (outlives it; `wait` below ignores it)
  setsid -f dockerd --iptables=false --bridge=none --storage-driver=vfs --group docker \
    --pidfile "$STATE/dockerd.pid" >>"$STATE/dockerd.log" 2>&1 </dev/null 9>&-  # not holding our lock
  ready=
  for _ in $(seq 60); do
    if timeout 10 docker info >/dev/null 2>&1; then ready=1; break; fi
    sleep 1
  done
  [ -n "$ready" ] || { tail -n 20 "$STATE/dockerd.log" >&2; die "dockerd not ready after 60 s; see $STATE/dockerd.log"; }
fi
[ "$(stat -c %G "$DOCKER_SOCK")" = docker ] || die "$DOCKER_SOCK belongs to group $(stat -c %G "$DOCKER_SOCK"), not docker: fpagent cannot use it (restart dockerd with --group docker)"
# This bed's containers carry org.flagperf.owner=$OWNER.<pid> (each test session sets FLAGPERF_CONTAINER_OWNER
# from testbed.json's owner and its pid): the owner is made once, kept across runs, so a later up.sh knows the leftovers of an earlier one.
if [ ! -s "$STATE/owner" ]; then
  printf 'flagperf-testbed-%s\n' "$(od -An -N8 -tx1 /dev/urandom | tr -d ' \n')" >"$STATE/owner.tmp"
  mv "$STATE/owner.tmp" "$STATE/owner"
fi
OWNER=$(cat "$STATE/owner")
[[ "$OWNER" =~ ^flagperf-testbed-[0-9a-f]{16}$ ]] || die "$STATE/owner holds '$OWNER', not an owner up.sh made (remove it)"
# Rounds and probes a killed earlier test run left on this bed (the tests start from none of theirs). Only this
# bed's (the engine may be shared with other flagperf deployments, whose containers are none of ours), and of
# those only one whose session (the pid and start in its label, OWNER.<pid>.<start>; an older session's
# OWNER.<pid>) is gone: another session testing on this bed right now keeps its containers, started or not
# (leftovers.sh, sessions.sh).
docker ps -a --filter label=org.flagperf.owner --format '{{.ID}} {{.State}} {{.Label "org.flagperf.owner"}}' \
  | "$HERE/leftovers.sh" "$OWNER" | xargs -r docker rm -f >/dev/null \
  || log "not all leftover containers of $OWNER removed (docker ps -a --filter label=org.flagperf.owner lists them)"
step_done dockerd

# 3. The pinned packages: the engine's in-container code needs exactly the project's pins --------------
"$PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 11))' \
  || die "$PY is not Python 3.11 (set FLAGPERF_TESTBED_PYTHON to the controller's python 3.11)"
pins=$("$PY" - "$REPO/vendor_images/cpu/pytorch/requirements.txt" <<'EOF'
import re, sys
# The cpu image's own requirements: what the image would install, pinned. torch first (from the local wheel).
found = {}
for line in open(sys.argv[1]):
    line = line.split("#", 1)[0].strip()
    if not line or line.startswith("-"):
        continue
    m = re.fullmatch(r"([A-Za-z0-9_.-]+)==([A-Za-z0-9_.+-]+)", line)
    if not m:
        sys.exit(f"{sys.argv[1]}: {line!r} is not pinned as name==version")
    found[m.group(1)] = m.group(2)
if "torch" not in found:
    sys.exit(f"{sys.argv[1]} pins no torch")
print(",".join([f"torch=={found.pop('torch')}", *(f"{k}=={v}" for k, v in found.items())]))
EOF
) || die "cannot read the pins from $REPO/vendor_images/cpu/pytorch/requirements.txt"
[ -f "$TORCH_WHEEL" ] || die "no local torch wheel at $TORCH_WHEEL (set FLAGPERF_TESTBED_TORCH_WHEEL; torch is never pulled from an index here)"
torch_pin=${pins%%,*}; torch_pin=${torch_pin#torch==}
case "$(basename "$TORCH_WHEEL")" in
  "torch-$torch_pin-"*|"torch-$torch_pin+"*) ;;
  *) die "$TORCH_WHEEL is not torch $torch_pin (pyproject.toml's pin)" ;;
esac
stamp="$pins;$(basename "$TORCH_WHEEL")"
if [ "$(cat "$SITE/.pins" 2>/dev/null)" != "$stamp" ]; then
  log "installing $pins into $SITE"
  rm -rf "$SITE.tmp"
  IFS=, read -ra pin_list <<<"${pins#*,}"
  timeout 900 "$PY" -m pip install --quiet --no-input --disable-pip-version-check --no-cache-dir \
      --only-binary=:all: --target "$SITE.tmp" "$TORCH_WHEEL" "${pin_list[@]}" >"$STATE/pip.log" 2>&1 \
    || { tail -n 20 "$STATE/pip.log" >&2; die "pip install into $SITE failed or took over 900 s; see $STATE/pip.log"; }
  printf '%s\n' "$stamp" >"$SITE.tmp/.pins"
  rm -rf "$SITE" && mv "$SITE.tmp" "$SITE"
fi
# The hosts' python: Debian's (or /usr/local's) 3.11 in a venv that sees exactly $SITE. Not the
# controller's interpreter, which may live where fpagent cannot go (e.g. pyenv under /root).
if [ ! -x "$HOST_PY" ] || [ "$(cat "$HOST_VENV/.site" 2>/dev/null)" != "$SITE" ]; then
  base_py=
  for candidate in /usr/local/bin/python3.11 /usr/bin/python3.11; do
    if [ -x "$candidate" ] && runuser -u nobody -- "$candidate" -c '' 2>/dev/null; then base_py=$candidate; break; fi
  done
  [ -n "$base_py" ] || die "no python3.11 that every user can run (/usr/local/bin/python3.11, /usr/bin/python3.11)"
  rm -rf "$HOST_VENV"
  "$base_py" -m venv --without-pip "$HOST_VENV" || die "cannot make a venv with $base_py"
  site_packages=$("$HOST_PY" -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
  printf '%s\n' "$SITE" >"$site_packages/flagperf-testbed.pth"
  printf '%s\n' "$SITE" >"$HOST_VENV/.site"
fi
"$HOST_PY" - "$pins" <<'EOF' || die "$HOST_PY does not have the pinned packages (remove $SITE and rerun)"
import sys
from importlib.metadata import version
bad = [f"{p} (has {version(p.split('==')[0])})" for p in sys.argv[1].split(",")
       if version(p.split("==")[0]).split("+")[0] != p.split("==")[1]]
sys.exit(f"wrong versions: {bad}" if bad else 0)
EOF
step_done packages-pinned

# 4. Base image ----------------------------------------------------------------------------------------
image_pins=$(timeout 30 docker image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" 2>/dev/null \
  | sed -n 's/^FLAGPERF_TESTBED_PINS=//p') || image_pins=
if [ "$image_pins" != "$pins" ]; then
  build="$STATE/build"
  rootfs="$build/rootfs"
  # debootstrap mounts proc/sys inside the target; a killed run can leave them: never delete through a mount.
  unmount_under() {
    local mnt
    while read -r mnt; do umount -l "$mnt" || die "cannot unmount $mnt"; done \
      < <(awk -v p="$1/" 'index($2, p) == 1 {print $2}' /proc/mounts | sort -r)
  }
  unmount_under "$build"
  rm -rf --one-file-system "$build"
  mkdir -p "$build"
  log "debootstrap bookworm into $rootfs (log: $STATE/debootstrap.log)"
  timeout 1200 debootstrap --variant=minbase --include=python3,python3-pip bookworm "$rootfs" "$DEBIAN_MIRROR" \
      >"$STATE/debootstrap.log" 2>&1 \
    || { unmount_under "$build"; tail -n 20 "$STATE/debootstrap.log" >&2; die "debootstrap failed or took over 1200 s; see $STATE/debootstrap.log"; }
  unmount_under "$build"
  dist="$rootfs/usr/local/lib/python3.11/dist-packages"
  mkdir -p "$dist"
  (cd "$SITE" && tar --exclude=./bin --exclude=./.pins -cf - .) | tar -C "$dist" -xf -
  # Minimal: the vfs driver copies every layer whole.
  rm -rf "${rootfs:?}"/var/cache/apt/* "${rootfs:?}"/var/lib/apt/lists/* "${rootfs:?}"/var/log/* \
         "${rootfs:?}"/usr/share/doc/* "${rootfs:?}"/usr/share/man/* "${rootfs:?}"/usr/share/info/* \
         "${rootfs:?}"/usr/share/locale/* "${rootfs:?}"/tmp/* "${rootfs:?}"/dev/*
  old_id=$(timeout 30 docker image inspect --format '{{.Id}}' "$IMAGE" 2>/dev/null) || old_id=
  log "importing $IMAGE"
  tar --numeric-owner -C "$rootfs" -cf - . \
    | timeout 900 docker import \
        --change 'ENV PYTHONUNBUFFERED=1' \
        --change 'ENV LANG=C.UTF-8' \
        --change "ENV FLAGPERF_TESTBED_PINS=$pins" \
        --change 'CMD ["python3"]' \
        - "$IMAGE" >/dev/null \
    || die "docker import failed or took over 900 s"
  if [ -n "$old_id" ]; then timeout 120 docker rmi "$old_id" >/dev/null 2>&1 || true; fi
  rm -rf --one-file-system "$build"
fi
image_id=$(timeout 30 docker image inspect --format '{{.Id}}' "$IMAGE") || die "no image $IMAGE after building it"
if [ "$(cat "$STATE/image.verified" 2>/dev/null)" != "$image_id" ]; then  # a container costs ~10 s on vfs, minutes on a loaded machine
  out=$(timeout 600 docker run --rm --network none "$IMAGE" python3 -c '
import sys
from importlib.metadata import version
import numpy, torch, pydantic, yaml, psutil, orjson
bad = [p for p in sys.argv[1].split(",") if version(p.split("==")[0]).split("+")[0] != p.split("==")[1]]
sys.exit(f"not the pinned versions: {bad}" if bad else print(torch.__version__))' "$pins" 2>&1) \
    || die "the image does not run python with the pinned packages: $out"
  log "image $IMAGE: torch $out"
  printf '%s\n' "$image_id" >"$STATE/image.verified"
fi
step_done image

# 5. Network: bridge + one namespace per host ----------------------------------------------------------
bash "$HERE/down.sh" --beyond "$N"   # hosts left from an earlier, larger bed
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  other=$(ip -o -4 addr show | awk -v p="$NET_PREFIX." 'index($4, p) == 1 {print $2}' | head -n 1)
  [ -z "$other" ] || die "$NET_PREFIX.0/24 is already used by interface $other"
  ip link add "$BRIDGE" type bridge
fi
# Fixed MAC addresses: a host removed and made again (or a bridge whose ports change) keeps its MAC,
# so no ARP cache, here or in another namespace, goes stale (stale entries did: connections timed out).
ip link set "$BRIDGE" address 02:66:70:00:00:01
ip addr replace "$BRIDGE_ADDR/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
ip neigh flush dev "$BRIDGE"
for i in $(seq "$N"); do
  ns="fp-h$i"; veth="fpv$i"; addr="$NET_PREFIX.$((10 + i))"; mac=$(printf '%02x' "$i")
  [ -e "/run/netns/$ns" ] || ip netns add "$ns"
  ip link show "$veth" >/dev/null 2>&1 || ip link add "$veth" type veth peer name eth0 netns "$ns"
  ip link set "$veth" address "02:66:70:00:02:$mac"
  ip link set "$veth" master "$BRIDGE" up
  ip -n "$ns" link set lo up
  ip -n "$ns" link set eth0 address "02:66:70:00:01:$mac"
  ip -n "$ns" addr replace "$addr/24" dev eth0
  ip -n "$ns" link set eth0 up
  ip -n "$ns" route replace default via "$BRIDGE_ADDR"
  ip -n "$ns" neigh flush dev eth0
done
step_done network

# 6. The agent user, its key, one sshd per host ---------------------------------------------------------
if ! id "$AGENT" >/dev/null 2>&1; then
  useradd --create-home --shell /bin/bash --groups docker "$AGENT"
fi
id -nG "$AGENT" | tr ' ' '\n' | grep -qx docker || usermod -aG docker "$AGENT"
usermod -p '*' "$AGENT"  # no password; '*' rather than '!' so that sshd (UsePAM no) accepts the key
home=$(getent passwd "$AGENT" | cut -d: -f6)
if [ ! -f "$KEY" ] || [ ! -f "$KEY.pub" ]; then
  rm -f "$KEY" "$KEY.pub"
  ssh-keygen -q -t ed25519 -N '' -C flagperf-testbed -f "$KEY"
fi
chmod 0600 "$KEY"
install -d -m 0700 -o "$AGENT" -g "$AGENT" "$home/.ssh"
install -m 0600 -o "$AGENT" -g "$AGENT" "$KEY.pub" "$home/.ssh/authorized_keys"
# A host whose plain `python3` has the project's dependencies, as a prepared host has: FlagPerf's host.yaml
# names no interpreter, so `flagperf run --host-config` uses python3 from the login's PATH.
printf 'PATH=%s/bin:/usr/local/bin:/usr/bin:/bin\n' "$HOST_VENV" >"$home/.ssh/environment"
chown "$AGENT:$AGENT" "$home/.ssh/environment"
chmod 0600 "$home/.ssh/environment"
install -d -m 0755 /run/sshd

# The hosts do not read the checkout under test: the tests deploy a copy of it for them
# (tests/testbed/bed.py deploy_project), as a real host has its own deployment (FLAGPERF_PATH).

sshd_running() {  # $1 host dir, $2 namespace: the pid file names our sshd, in that namespace
  local pid
  pid=$(cat "$1/sshd.pid" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "-f $1/sshd_config" || return 1
  [ "$(ip netns identify "$pid" 2>/dev/null)" = "$2" ]
}
for i in $(seq "$N"); do
  ns="fp-h$i"; addr="$NET_PREFIX.$((10 + i))"; hdir="$STATE/hosts/h$i"
  install -d -m 0755 "$hdir"
  [ -f "$hdir/ssh_host_ed25519_key" ] || ssh-keygen -q -t ed25519 -N '' -C "h$i" -f "$hdir/ssh_host_ed25519_key"
  cat >"$hdir/sshd_config.new" <<EOF
# flagperf test bed host h$i (namespace $ns); written by tests/testbed/up.sh
ListenAddress $addr
Port 22
HostKey $hdir/ssh_host_ed25519_key
PidFile $hdir/sshd.pid
AllowUsers $AGENT
PermitRootLogin no
PubkeyAuthentication yes
AuthenticationMethods publickey
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
AuthorizedKeysFile .ssh/authorized_keys
PermitUserEnvironment PATH
StrictModes yes
X11Forwarding no
PrintMotd no
MaxStartups 64:30:256
MaxSessions 64
Subsystem sftp internal-sftp
EOF
  if ! cmp -s "$hdir/sshd_config.new" "$hdir/sshd_config" 2>/dev/null; then
    mv "$hdir/sshd_config.new" "$hdir/sshd_config"
    if sshd_running "$hdir" "$ns"; then kill "$(cat "$hdir/sshd.pid")"; sleep 0.2; fi
  else
    rm -f "$hdir/sshd_config.new"
  fi
  if ! sshd_running "$hdir" "$ns"; then
    rm -f "$hdir/sshd.pid"
    ip netns exec "$ns" /usr/sbin/sshd -t -f "$hdir/sshd_config" || die "sshd_config of h$i is invalid"
    ip netns exec "$ns" /usr/sbin/sshd -f "$hdir/sshd_config" -E "$hdir/sshd.log" 9>&- \
      || die "sshd of h$i did not start; see $hdir/sshd.log"
  fi
done
# known_hosts from the host keys themselves (no trust on first use)
for i in $(seq "$N"); do
  printf '%s %s\n' "$NET_PREFIX.$((10 + i))" "$(cut -d' ' -f1,2 "$STATE/hosts/h$i/ssh_host_ed25519_key.pub")"
done >"$KNOWN_HOSTS.tmp"
chmod 0644 "$KNOWN_HOSTS.tmp"
mv "$KNOWN_HOSTS.tmp" "$KNOWN_HOSTS"
step_done sshd

# 7. Check every host, as the tests will use it ---------------------------------------------------------
ssh_opts=(-F /dev/null -i "$KEY" -o IdentitiesOnly=yes -o BatchMode=yes -o ConnectTimeout=5
          -o UserKnownHostsFile="$KNOWN_HOSTS" -o GlobalKnownHostsFile=/dev/null -o StrictHostKeyChecking=yes
          -o LogLevel=ERROR)
remote_check="docker info >/dev/null && $(printf '%q' "$HOST_PY") -c 'import numpy, torch, pydantic, yaml, psutil, orjson' && echo ok"
# shellcheck disable=SC2016  # the probes' $1 is expanded by the inner bash
check_host() {  # $1 host index; prints why it failed
  local i=$1 addr="$NET_PREFIX.$(($1 + 10))" next_addr="$NET_PREFIX.$(($1 % N + 11))" out
  for _ in $(seq 20); do  # sshd is listening within a second or so of starting
    ip netns exec "fp-h$i" timeout 2 bash -c 'exec 3<>"/dev/tcp/$1/22"' _ "$addr" 2>/dev/null && break
    sleep 0.5
  done
  out=$(timeout 60 ssh "${ssh_opts[@]}" "$AGENT@$addr" true 2>&1) \
    || { echo "h$i ($addr): ssh $AGENT@$addr true failed: $out"; return 1; }
  out=$(timeout 120 ssh "${ssh_opts[@]}" "$AGENT@$addr" "$remote_check" 2>&1) \
    || { echo "h$i ($addr): as $AGENT there, 'docker info', '$HOST_PY -c import torch ...' failed: $out"; return 1; }
  ip netns exec "fp-h$i" timeout 5 bash -c 'exec 3<>"/dev/tcp/$1/22"' _ "$next_addr" 2>/dev/null \
    || { echo "h$i ($addr): cannot reach the next host's sshd at $next_addr:22"; return 1; }
}
rm -rf "$STATE/checks"; mkdir -p "$STATE/checks"
check_pids=()
for i in $(seq "$N"); do  # 8 at a time: each imports torch once
  if [ "${#check_pids[@]}" -ge 8 ]; then wait "${check_pids[0]}" || true; check_pids=("${check_pids[@]:1}"); fi
  ( if check_host "$i" >"$STATE/checks/h$i.err" 2>&1; then touch "$STATE/checks/h$i.ok"; fi ) &
  check_pids+=("$!")
done
for pid in "${check_pids[@]}"; do wait "$pid" || true; done  # each check bounds its own time
failed=0
for i in $(seq "$N"); do
  [ -f "$STATE/checks/h$i.ok" ] || { cat "$STATE/checks/h$i.err" >&2; failed=$((failed + 1)); }
done
[ "$failed" = 0 ] || die "$failed of $N hosts failed their check (sshd logs: $STATE/hosts/h*/sshd.log)"
step_done checks

# 8. Slurm: munged, slurmctld on the bridge address, one slurmd in each of the first hosts' namespaces ------
# Debian's Slurm 22.05 with no cgroups (proctrack/linuxproc, task/none), select/cons_tres, no accounting
# database. Every node shares this machine's filesystem, so any folder is the cluster's shared folder.
SLURM_NODES=$(( N < SLURM_MAX_NODES ? N : SLURM_MAX_NODES ))
slurm_missing=()
command -v slurmctld >/dev/null || slurm_missing+=(slurmctld)
command -v slurmd >/dev/null || slurm_missing+=(slurmd)
command -v sbatch >/dev/null || slurm_missing+=(slurm-client)
command -v munged >/dev/null || slurm_missing+=(munge)
if [ "${#slurm_missing[@]}" -gt 0 ]; then
  log "installing ${slurm_missing[*]}"
  timeout 300 apt-get update -qq || die "apt-get update failed or took over 300 s"
  DEBIAN_FRONTEND=noninteractive timeout 900 apt-get install -y -qq --no-install-recommends "${slurm_missing[@]}" \
    >"$STATE/apt-slurm.log" 2>&1 || die "apt-get install ${slurm_missing[*]} failed or took over 900 s; see $STATE/apt-slurm.log"
fi
[ "$(slurmctld -V | awk '{print $2}' | cut -d. -f1)" -ge 22 ] || die "Slurm $(slurmctld -V) is older than 22.05"
install -d -m 0755 "$SLURM_STATE" "$SLURM_STATE/ctld" "$SLURM_STATE/spool"
install -d -m 1777 "$SLURM_SHARED"   # like /tmp: every user makes their own folder in it
# munge: the key the package made (or a new one), munged as its own user
if [ ! -s /etc/munge/munge.key ]; then
  (umask 077; dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none)
  chown munge:munge /etc/munge/munge.key
fi
install -d -m 0755 -o munge -g munge /run/munge
install -d -m 0700 -o munge -g munge /var/log/munge /var/lib/munge
if ! timeout 10 bash -c 'munge -n | unmunge' >/dev/null 2>&1; then
  log "starting munged"
  runuser -u munge -- /usr/sbin/munged 9>&- || die "munged did not start; see /var/log/munge/munged.log"
  for _ in $(seq 50); do timeout 5 bash -c 'munge -n | unmunge' >/dev/null 2>&1 && break; sleep 0.1; done
  timeout 10 bash -c 'munge -n | unmunge' >/dev/null 2>&1 || die "munge does not answer after starting munged"
fi
{
  echo "# flagperf test bed: written by tests/testbed/up.sh ($SLURM_MARK)"
  echo "ClusterName=flagperf"
  echo "SlurmctldHost=$(hostname -s)($BRIDGE_ADDR)"
  echo "SlurmUser=root"
  echo "AuthType=auth/munge"
  echo "CredType=cred/munge"
  echo "ProctrackType=proctrack/linuxproc"
  echo "TaskPlugin=task/none"
  echo "SelectType=select/cons_tres"
  echo "SelectTypeParameters=CR_Core"
  echo "SchedulerType=sched/backfill"
  echo "SlurmdParameters=config_overrides"  # nodes as declared here, whatever this machine has
  echo "JobAcctGatherType=jobacct_gather/none"
  echo "AccountingStorageType=accounting_storage/none"
  echo "JobCompType=jobcomp/none"
  echo "MpiDefault=none"
  echo "ReturnToService=2"
  echo "KillWait=5"
  echo "MinJobAge=300"
  echo "InactiveLimit=0"
  echo "SlurmctldPort=6817"
  echo "SlurmdPort=6818"
  echo "StateSaveLocation=$SLURM_STATE/ctld"
  echo "SlurmdSpoolDir=$SLURM_STATE/spool/%n"
  echo "SlurmctldPidFile=$SLURM_STATE/slurmctld.pid"
  echo "SlurmdPidFile=$SLURM_STATE/slurmd-%n.pid"
  echo "SlurmctldLogFile=$SLURM_STATE/slurmctld.log"
  echo "SlurmdLogFile=$SLURM_STATE/slurmd-%n.log"
  for i in $(seq "$SLURM_NODES"); do
    echo "NodeName=h$i NodeAddr=$NET_PREFIX.$((10 + i)) CPUs=2 RealMemory=1024 State=UNKNOWN"
  done
  echo "PartitionName=$SLURM_PARTITION Nodes=$(seq -s, -f 'h%g' "$SLURM_NODES") Default=YES MaxTime=INFINITE State=UP"
} >"$SLURM_STATE/slurm.conf.new"
if [ -e "$SLURM_CONF" ] && ! grep -qF "$SLURM_MARK" "$SLURM_CONF"; then
  die "$SLURM_CONF exists and was not written by up.sh: this machine has a Slurm of its own (not touched)"
fi
slurm_running() {  # $1 pid file, $2 program, $3 namespace ("" for this machine's own)
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid" || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "$2" || return 1
  [ "$(ip netns identify "$pid" 2>/dev/null)" = "$3" ]
}
alive() { awk '$1 == "State:" {exit $2 == "Z"}' "/proc/$1/status" 2>/dev/null; }
stop_daemon() {  # $1 pid file: TERM, then KILL after 10 s
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 0
  [[ "$pid" =~ ^[0-9]+$ ]] || return 0
  kill "$pid" 2>/dev/null || return 0
  for _ in $(seq 100); do alive "$pid" || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
}
if ! cmp -s "$SLURM_STATE/slurm.conf.new" "$SLURM_CONF" 2>/dev/null; then
  log "writing $SLURM_CONF ($SLURM_NODES nodes); restarting the Slurm daemons"
  for pidfile in "$SLURM_STATE"/slurmd-*.pid "$SLURM_STATE/slurmctld.pid"; do stop_daemon "$pidfile"; done
  install -d -m 0755 "$(dirname "$SLURM_CONF")"
  mv "$SLURM_STATE/slurm.conf.new" "$SLURM_CONF"
  chmod 0644 "$SLURM_CONF"
else
  rm -f "$SLURM_STATE/slurm.conf.new"
fi
if ! slurm_running "$SLURM_STATE/slurmctld.pid" slurmctld ""; then
  log "starting slurmctld (log: $SLURM_STATE/slurmctld.log)"
  slurmctld 9>&- || die "slurmctld did not start; see $SLURM_STATE/slurmctld.log"
fi
for _ in $(seq 100); do timeout 5 scontrol ping 2>/dev/null | grep -q UP && break; sleep 0.2; done
timeout 5 scontrol ping 2>/dev/null | grep -q UP || die "slurmctld does not answer scontrol ping; see $SLURM_STATE/slurmctld.log"
for i in $(seq "$SLURM_NODES"); do
  install -d -m 0755 "$SLURM_STATE/spool/h$i"
  if ! slurm_running "$SLURM_STATE/slurmd-h$i.pid" slurmd "fp-h$i"; then
    nsenter --net="/run/netns/fp-h$i" slurmd -N "h$i" 9>&- || die "slurmd of h$i did not start; see $SLURM_STATE/slurmd-h$i.log"
  fi
done
# Jobs a killed test session left, nodes it left drained: only a gone session's (slurm-leftovers.sh). Another
# session testing on this bed right now keeps its jobs and the node it drained on purpose.
# Pending and running ones only: a completing job is already ending, and scancel of it fails (a false warning)
timeout 30 squeue -h -p "$SLURM_PARTITION" -t PD,R -o '%i %j' 2>/dev/null | "$HERE/slurm-leftovers.sh" jobs \
  | xargs -r timeout 30 scancel 2>/dev/null || log "not every Slurm job of a gone test session cancelled (squeue lists them)"
kept=" "  # nodes a live session drained: not waited for, not checked below
while read -r verdict node why; do
  if [ "$verdict" = resume ]; then
    timeout 10 scontrol update NodeName="$node" State=RESUME 2>/dev/null || true
  else
    kept+="$node "; log "Slurm node $node kept drained: $why"
  fi
done < <(timeout 10 sinfo -h -N -p "$SLURM_PARTITION" -o '%N|%T|%E' 2>/dev/null | sort -u | "$HERE/slurm-leftovers.sh" nodes)
# Every node settled: idle, or running (or planned for) a job that was left (a live session's), or kept drained
# above. A node whose jobs were cancelled is completing until it is idle.
settled=
read -ra kept_nodes <<<"$kept"
for _ in $(seq 150); do  # slurmd registers within seconds of starting
  states=$(timeout 10 sinfo -h -N -p "$SLURM_PARTITION" -o '%N %T' 2>/dev/null | sort -u) || states=
  idle_nodes=() unsettled=0
  while read -r verdict node _; do
    if [ "$verdict" = idle ]; then idle_nodes+=("$node")
    elif [ "$verdict" = wait ]; then unsettled=$((unsettled + 1)); fi
  done < <("$HERE/slurm-leftovers.sh" states "${kept_nodes[@]}" <<<"$states")
  if [ "$(grep -c . <<<"$states")" = "$SLURM_NODES" ] && [ "$unsettled" = 0 ]; then settled=1; break; fi
  sleep 0.2
done
[ -n "$settled" ] || die "Slurm nodes not idle after 30 s: $(tr '\n' ';' <<<"$states") (logs: $SLURM_STATE/slurmd-h*.log)"
# A step on every idle node (a node a live session uses is checked by its use)
if [ "${#idle_nodes[@]}" -gt 0 ]; then
  nodes=$(IFS=,; echo "${idle_nodes[*]}")
  out=$(timeout 120 srun -p "$SLURM_PARTITION" -N "${#idle_nodes[@]}" -w "$nodes" --ntasks-per-node=1 --chdir=/ -t 2 \
        bash -c 'echo "$SLURMD_NODENAME $SLURM_NODEID"' 2>&1) \
    || die "srun across the Slurm nodes $nodes failed: $out"
  [ "$(wc -l <<<"$out")" = "${#idle_nodes[@]}" ] || die "srun across the nodes $nodes answered: $out"
else
  log "every Slurm node is in use by a live test session: no step of ours checked them"
fi
step_done slurm

# 9. Advertise the bed ---------------------------------------------------------------------------------
"$PY" - "$STATE/testbed.json" "$N" "$NET_PREFIX" "$AGENT" "$KEY" "$KNOWN_HOSTS" "$IMAGE" "$DOCKER_HOST" \
    "$BRIDGE_ADDR" "$HOST_PY" "$SLURM_NODES" "$SLURM_PARTITION" "$SLURM_SHARED" "$SLURM_CONF" "$OWNER" <<'EOF'
import json, os, sys
(path, n, prefix, user, key, known_hosts, image, docker_host, bridge, python, slurm_nodes, partition, shared,
 slurm_conf, owner) = sys.argv[1:]
doc = {
    "hosts": [{"name": f"h{i}", "address": f"{prefix}.{10 + i}", "port": 22, "user": user, "key_file": key,
               "netns": f"fp-h{i}", "python": python} for i in range(1, int(n) + 1)],
    "known_hosts": known_hosts,
    "base_image": image,
    "docker_host": docker_host,
    "bridge_address": bridge,
    "container_owner": owner,
    "slurm": {"partition": partition, "shared_dir": shared, "conf": slurm_conf,
              "nodes": [{"name": f"h{i}", "address": f"{prefix}.{10 + i}"} for i in range(1, int(slurm_nodes) + 1)]},
}
tmp = path + ".tmp"
with open(tmp, "w", encoding="utf-8") as f:
    json.dump(doc, f, indent=2)
    f.write("\n")
os.chmod(tmp, 0o644)
os.replace(tmp, path)
EOF
log "test bed ready: $N hosts, $STATE/testbed.json (total $((SECONDS - T_START)) s)"
