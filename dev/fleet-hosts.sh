#!/usr/bin/env bash
# Hosts on one machine, for the fleet tests (tests/it/fleet.rs) and by hand: each host a
# Linux network namespace with one interface on a bridge, an address in 10.77.<net>.0/24
# that exists only on that bridge, and nothing else reachable. Needs root, `ip` and `nft`
# (dev/tools.sh nft ping).
#
#   dev/fleet-hosts.sh up <net> <host>...       makes hosts sk<net>-<host> (net: 1–250); prints
#                                               "<host> <address>" per host
#   dev/fleet-hosts.sh cut <net> <host> <other> drops everything between two hosts (nft, in
#                                               <host>'s namespace)
#   dev/fleet-hosts.sh heal <net> <host> <other> lets it through again
#   dev/fleet-hosts.sh down <net>               kills every process in the hosts, removes them
#   ip netns exec sk<net>-<host> <command>      runs a command on a host (which knows the
#                                               other hosts by name)
#
# The machine itself is the checker's host: 10.77.<net>.1 on the bridge. It may open
# connections to the hosts (the test's load and its checks); the hosts may only answer it,
# so the machine's own Redis, MariaDB and RabbitMQ stay out of reach.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

command=${1:?usage: dev/fleet-hosts.sh up|cut|heal|down <net> …}
net=${2:?which net (1–250)?}
[[ $net =~ ^[0-9]+$ ]] && ((net >= 1 && net <= 250)) || die "net must be 1–250, not $net"
shift 2
bridge=skbr$net

ns() { echo "sk$net-$1"; }

address_of() {
  ip -n "$(ns "$1")" -4 -o addr show dev eth0 | awk '{ split($4, a, "/"); print a[1] }'
}

case $command in
up)
  ((${#@})) || die "name at least one host"
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
    ip addr add "10.77.$net.1/24" dev "$bridge"
    ip link set "$bridge" up
  fi
  index=$(ip netns list | grep -c "^sk$net-" || true)
  for host in "$@"; do
    name=$(ns "$host")
    index=$((index + 1))
    address=10.77.$net.$((index + 9))
    ip netns add "$name"
    ip link add "sk$net-$index" type veth peer name eth0 netns "$name"
    ip link set "sk$net-$index" master "$bridge" up
    ip -n "$name" addr add "$address/24" dev eth0
    ip -n "$name" link set eth0 up
    ip -n "$name" link set lo up
    # The checker's host answers, never calls: a host cannot reach the machine's services.
    ip netns exec "$name" nft -f - <<EOF
table inet fleet {
  chain out {
    type filter hook output priority 0; policy accept;
    ip daddr 10.77.$net.1 ct state established,related accept
    ip daddr 10.77.$net.1 drop
  }
}
EOF
    echo "$host $address"
  done
  # Every host knows the others by name (`ip netns exec` puts /etc/netns/NS/hosts over
  # /etc/hosts): what RabbitMQ's node names need.
  # The machine's own table first (its host name too, which RabbitMQ resolves).
  table=$(mktemp)
  cp /etc/hosts "$table"
  for name in $(ip netns list | awk '{ print $1 }' | grep "^sk$net-"); do
    ip -n "$name" -4 -o addr show dev eth0 |
      awk -v host="${name#sk$net-}" '{ split($4, a, "/"); print a[1], host }' >>"$table"
  done
  for name in $(ip netns list | awk '{ print $1 }' | grep "^sk$net-"); do
    mkdir -p "/etc/netns/$name"
    install -m 644 "$table" "/etc/netns/$name/hosts"
  done
  rm -f "$table"
  ;;
cut | heal)
  host=${1:?which host?}
  other=${2:?cut off from which host?}
  name=$(ns "$host")
  peer=$(address_of "$other")
  table=cut_$(echo "$other" | tr -c 'a-zA-Z0-9\n' _)
  if [ "$command" = cut ]; then
    ip netns exec "$name" nft -f - <<EOF
table inet $table {
  chain in { type filter hook input priority -10; policy accept; ip saddr $peer drop; }
  chain out { type filter hook output priority -10; policy accept; ip daddr $peer drop; }
}
EOF
  else
    ip netns exec "$name" nft delete table inet "$table" 2>/dev/null || true
  fi
  ;;
down)
  for name in $(ip netns list | awk '{ print $1 }' | grep "^sk$net-" || true); do
    pids=$(ip netns pids "$name" || true)
    [ -z "$pids" ] || kill -9 $pids 2>/dev/null || true
    ip netns del "$name"
    rm -rf "/etc/netns/$name"
  done
  # A namespace goes once its last process has; its link may outlive the name a while.
  for link in $(ip -br link | awk '{ print $1 }' | sed 's/@.*//' | grep "^sk$net-" || true); do
    ip link del "$link" 2>/dev/null || true
  done
  ip link del "$bridge" 2>/dev/null || true
  ;;
*)
  die "unknown command $command (up, cut, heal, down)"
  ;;
esac
