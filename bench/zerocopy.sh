#!/bin/bash
# `make bench-zerocopy`: MSG_ZEROCOPY against plain send() for one TCP stream, on
# loopback and (as root) across a veth pair between two network namespaces; 3
# alternated rounds per size, medians, and the ratio zero-copy / plain.
set -euo pipefail
prog=${1:?usage: zerocopy.sh PATH/TO/tcp_zerocopy}
total=$((1 << 30))
tag=gzc$$
cleanup() {
    pkill -f "tcp_zerocopy server" 2>/dev/null || true
    ip netns del ${tag}a 2>/dev/null || true
    ip netns del ${tag}b 2>/dev/null || true
}
trap cleanup EXIT

median() { sort -g | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }

run() { # LABEL SERVER_WRAP CLIENT_WRAP IP PORT
    local label=$1 swrap=$2 cwrap=$3 ip=$4 port=$5
    $swrap "$prog" server "$ip" "$port" "$total" > /dev/null &
    sleep 0.3
    for size in 65536 262144 1048576; do
        for zc in 0 1; do : > "/tmp/$tag.$zc"; done
        for r in 1 2 3; do
            for zc in 0 1; do
                $cwrap "$prog" client "$ip" "$port" "$total" "$size" "$zc" | awk '{print $4}' >> "/tmp/$tag.$zc"
            done
        done
        plain=$(median < "/tmp/$tag.0")
        zero=$(median < "/tmp/$tag.1")
        printf "%-8s %8d B sends: plain %6.2f GB/s, MSG_ZEROCOPY %6.2f GB/s, ratio %.2f\n" \
            "$label" "$size" "$plain" "$zero" "$(awk -v z="$zero" -v p="$plain" 'BEGIN {print z / p}')"
    done
    rm -f /tmp/$tag.0 /tmp/$tag.1
    pkill -f "tcp_zerocopy server $ip" || true
    wait 2>/dev/null || true
}

run loopback "" "" 127.0.0.1 $((40000 + $$ % 20000))
if [ "$(id -u)" = 0 ]; then
    ip netns add ${tag}a
    ip netns add ${tag}b
    ip link add ${tag}x type veth peer name ${tag}y
    ip link set ${tag}x netns ${tag}a
    ip link set ${tag}y netns ${tag}b
    ip -n ${tag}a addr add 10.213.7.1/24 dev ${tag}x
    ip -n ${tag}b addr add 10.213.7.2/24 dev ${tag}y
    for n in a b; do ip -n ${tag}$n link set lo up; done
    ip -n ${tag}a link set ${tag}x up
    ip -n ${tag}b link set ${tag}y up
    run veth "ip netns exec ${tag}b" "ip netns exec ${tag}a" 10.213.7.2 45680
else
    echo "veth: skipped (needs root)"
fi
