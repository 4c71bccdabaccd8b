#!/usr/bin/env bash
# Simulated hosts for multi-host tests: each host is a network namespace with its own
# address on a bridge that exists only inside namespaces made here, its own hostname
# (UTS namespace) and its own mount namespace, where DIR/disk is that host's private
# "local disk" (DIR/hostI underneath) and /etc/hosts names every simulated host.
# DIR/shared is the same directory on every host (a shared file system).
#
#   hosts.sh up N DIR     creates host0..host(N-1); writes DIR/hostfile, DIR/agent
#   hosts.sh down DIR     removes everything `up` made (safe to repeat)
#   hosts.sh run I DIR -- COMMAND...   runs COMMAND inside host I
#
# DIR/agent is Open MPI's rsh agent (--mca plm_rsh_agent): it enters the named host
# with nsenter instead of ssh. Nothing is routed outside the bridge: the namespaces
# have no default route and the bridge no uplink. Needs root (ip, unshare, nsenter).
#
# A namespace holder exits by itself once the process that ran `up` is gone, and
# `up` first removes namespaces whose creator is gone, so even a test killed with
# SIGKILL leaves nothing behind for long.
set -euo pipefail

PREFIX=ckptd-mh
SUBNET=10.213.77

sweep_stale() {
  local ns owner
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$PREFIX-" || true); do
    owner=${ns#"$PREFIX"-}
    owner=${owner%%-*}
    if ! kill -0 "$owner" 2>/dev/null; then ip netns delete "$ns" 2>/dev/null || true; fi
  done
}

up() {
  local n=$1 dir=$2 owner=${CKPTD_HOSTS_OWNER:-$PPID}
  local tag="$PREFIX-$owner-$$"
  [ "$n" -ge 1 ] && [ "$n" -le 32 ] || { echo "hosts.sh: 1 to 32 hosts" >&2; exit 2; }
  sweep_stale
  mkdir -p "$dir/disk" "$dir/shared"
  echo "$tag" > "$dir/tag"
  printf '127.0.0.1 localhost\n' > "$dir/etc-hosts"
  : > "$dir/hostfile"
  for i in $(seq 0 $((n - 1))); do
    printf '%s.%d host%d\n' "$SUBNET" $((i + 1)) "$i" >> "$dir/etc-hosts"
    printf 'host%d slots=64\n' "$i" >> "$dir/hostfile"
  done
  ip netns add "$tag-switch"
  ip -n "$tag-switch" link add bridge0 type bridge
  ip -n "$tag-switch" link set bridge0 up
  for i in $(seq 0 $((n - 1))); do
    ip netns add "$tag-host$i"
    ip link add "port$i" netns "$tag-switch" type veth peer name eth0 netns "$tag-host$i"
    ip -n "$tag-switch" link set "port$i" master bridge0 up
    ip -n "$tag-host$i" addr add "$SUBNET.$((i + 1))/24" dev eth0
    ip -n "$tag-host$i" link set eth0 up
    ip -n "$tag-host$i" link set lo up
    mkdir -p "$dir/host$i"
    rm -f "$dir/pid$i"
    # The holder keeps the host's UTS and mount namespaces alive for nsenter.
    ip netns exec "$tag-host$i" unshare --uts --mount --propagation private \
      sh -c "hostname host$i && mount --bind '$dir/host$i' '$dir/disk' && \
             mount --bind '$dir/etc-hosts' /etc/hosts && echo \$\$ > '$dir/pid$i.new' && \
             mv '$dir/pid$i.new' '$dir/pid$i' && exec 0<&- 1>/dev/null 2>&1 && \
             while kill -0 $owner 2>/dev/null && [ -e '$dir/tag' ]; do sleep 1; done" &
  done
  for i in $(seq 0 $((n - 1))); do
    # The holders announce themselves by writing their pid; give up after 10 s.
    for _ in $(seq 200); do [ -s "$dir/pid$i" ] && break; sleep 0.05; done
    [ -s "$dir/pid$i" ] || { echo "hosts.sh: host$i did not start" >&2; down "$dir"; exit 1; }
  done
  cat > "$dir/agent" <<AGENT
#!/bin/sh
# Open MPI's rsh agent for the simulated hosts: "agent [ssh options] HOST COMMAND...".
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
exec nsenter -t "\$(cat '$dir/pid'"\${host#host}")" -n -u -m -- /bin/sh -c "\$*"
AGENT
  chmod +x "$dir/agent"
}

down() {
  local dir=$1 tag pidfile
  [ -f "$dir/tag" ] || return 0
  tag=$(cat "$dir/tag")
  rm -f "$dir/tag"
  for pidfile in "$dir"/pid*; do
    [ -s "$pidfile" ] && kill "$(cat "$pidfile")" 2>/dev/null || true
    rm -f "$pidfile"
  done
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^$tag-" || true); do
    ip netns delete "$ns" 2>/dev/null || true
  done
}

run() {
  local i=$1 dir=$2
  shift 2
  [ "${1:-}" = "--" ] && shift
  exec nsenter -t "$(cat "$dir/pid$i")" -n -u -m -- "$@"
}

case "${1:-}" in
  up) up "$2" "$3" ;;
  down) down "$2" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,18p' "$0"; exit 2 ;;
esac
