#!/bin/bash
# ParaMEDIC at scale (issue #19; `make bench-paramedic-scale`, as root): records the
# searches once on a quiet machine, then runs every variant on a compute site of
# COMPUTE_NODES namespace nodes that replay those searches, and draws the paper's
# figures from the runs' JSON files.
#
# Measured: everything but the searches themselves (formatting, shipping, the link,
# receiving, regeneration, writing), and every output is checked byte for byte against
# the run's own reference search. Emulated: the compute site's search, which takes the
# recorded duration of each task (recorded with 2 workers on this machine's 2 cores) on
# each of COMPUTE_NODES workers, so a 16-node site searches about 8 times as fast as
# this machine can. The storage site regenerates for real on this machine's cores.
#
# Each stage writes OUT/<stage>.json and is skipped when that file exists, so an
# interrupted run continues where it stopped. Recordings stay in REC.
set -euo pipefail
OUT=${OUT:-bench/out/paramedic-scale}
REC=${REC:-bench/out/paramedic-recordings}
COMPUTE_NODES=${COMPUTE_NODES:-16}
ONLY=${ONLY:-}
B=./target/release/gepsea-bench
mkdir -p "$OUT" "$REC"

# stage NAME RECORDING [bench paramedic options...] [-- BLAST+ options]
stage() {
    local name=$1 rec=$2
    shift 2
    if [[ -n $ONLY && " $ONLY " != *" $name "* ]]; then return; fi
    if [[ -e $OUT/$name.json ]]; then
        echo "== $name: $OUT/$name.json exists, skipped"
        return
    fi
    echo "== $name ($(date +%T))"
    $B paramedic --batch-residues 25000 --replay "$REC/$rec" --json "$OUT/$name.json" "$@"
}

# record NAME [workload options] [-- BLAST+ options]: the search on 2 nodes, for real.
record() {
    local name=$1
    shift
    if [[ -n $ONLY && " $ONLY " != *" record-$name "* ]]; then return; fi
    if [[ -e $REC/$name/recording.json ]]; then return; fi
    echo "== recording $name ($(date +%T))"
    $B paramedic --reference-only --batch-residues 25000 --replay "$REC/$name" --json /dev/null "$@"
}

Q500=(--queries 500)
Q1000=(--queries 500 --queries-from-db 500)
Q2200=(--queries 500 --queries-from-db 1700)
Q3900=(--queries 500 --queries-from-db 3400)

record q500 "${Q500[@]}"
record q1000 "${Q1000[@]}"
record q2200 "${Q2200[@]}"
record q3900 "${Q3900[@]}"
for n in 50 250; do record m$n "${Q1000[@]}" -- -max_target_seqs $n; done

SITE=(--compute-nodes "$COMPUTE_NODES")
WAN=(--rates-mbit 100 --delays-ms 100)
SWEEP=(--variants direct-encrypted,remote-fs,zstd,paramedic-encrypted)
# The large workload (317.5 MB of pairwise output) at the acceptance links; `auto` last.
stage large-100mbit-100ms q3900 "${Q3900[@]}" "${SITE[@]}" "${WAN[@]}" --variants direct-encrypted,remote-fs,zstd,paramedic-encrypted
stage large-10mbit-100ms q3900 "${Q3900[@]}" "${SITE[@]}" --rates-mbit 10 --delays-ms 100 --variants direct-encrypted,zstd,paramedic-encrypted
# Query-set sweep (Fig. 9a; encrypted vs remote FS, Figs. 10-13).
stage queries-500 q500 "${Q500[@]}" "${SITE[@]}" "${WAN[@]}" "${SWEEP[@]}"
stage queries-1000 q1000 "${Q1000[@]}" "${SITE[@]}" "${WAN[@]}" "${SWEEP[@]}"
# (sshfs at 200 ms RTT carries ≈0.6 MB/s: remote FS only up to 1,000 queries and on the large run.)
stage queries-2200 q2200 "${Q2200[@]}" "${SITE[@]}" "${WAN[@]}" --variants direct-encrypted,zstd,paramedic-encrypted
# -max_target_seqs sweep on 1,000 queries (Fig. 9b; 500 is queries-1000).
for n in 50 250; do
    stage targets-$n m$n "${Q1000[@]}" "${SITE[@]}" "${WAN[@]}" "${SWEEP[@]}" -- -max_target_seqs $n
done
# The split of this machine's 2 cores between search and regeneration (Fig. 8): real
# searches (no replay) on 2 nodes, the storage site under different CPU shares.
for s in 128 2048; do
    if [[ -n $ONLY && " $ONLY " != *" shares-$s "* ]] || [[ -e $OUT/shares-$s.json ]]; then continue; fi
    echo "== shares-$s ($(date +%T))"
    $B paramedic "${Q500[@]}" --batch-residues 25000 "${WAN[@]}" --variants paramedic-encrypted \
        --storage-cpu-shares "$s" --json "$OUT/shares-$s.json"
done

# (ParaMEDIC is bound by its storage site, not the link: not run again at 1 Gbit/s.)
stage large-1000mbit-0ms q3900 "${Q3900[@]}" "${SITE[@]}" --rates-mbit 1000 --delays-ms 0 --variants direct,zstd,auto
stage large-auto-100mbit-100ms q3900 "${Q3900[@]}" "${SITE[@]}" "${WAN[@]}" --variants auto
# ParaMEDIC again, alone on the machine (its first run above shared the cores with a
# build: the storage site's cgroup weight is against the whole root group, nice or not).
stage large-rerun-100mbit-100ms q3900 "${Q3900[@]}" "${SITE[@]}" "${WAN[@]}" --variants paramedic-encrypted

# The figures need every stage: not drawn when ONLY picked some.
if [[ -n $ONLY ]]; then
    echo "== ONLY=$ONLY: figures not drawn (they need every stage)"
    exit 0
fi

IMG=${IMG:-$OUT}
large=$OUT/large-all.json
# The large runs, merged (a later run of the same variant and link replaces an earlier
# one); the 100 Mbit/s, 100 ms ones alone for the query-set sweep.
python3 - "$OUT" "$large" "$OUT/at100-large.json" <<'EOF'
import json, sys, glob, os
out, large, at100 = sys.argv[1:4]
merged, rows = None, {}
for p in sorted(glob.glob(os.path.join(out, "large-*mbit-*ms.json")), key=os.path.getmtime):
    j = json.load(open(p))
    merged = merged or j
    for r in j["runs"]:
        rows[(r["rate_mbit"], r["delay_ms"], r["variant"])] = r
if merged:
    merged["runs"] = list(rows.values())
    json.dump(merged, open(large, "w"), indent=1)
    merged["runs"] = [r for r in rows.values() if (r["rate_mbit"], r["delay_ms"]) == (100, 100.0)]
    json.dump(merged, open(at100, "w"), indent=1)
EOF
$B paramedic-figures --out "$IMG" --link 100,100 --breakdown "$large" \
    --queries-sweep "$OUT/queries-500.json,$OUT/queries-1000.json,$OUT/queries-2200.json,$OUT/at100-large.json" \
    --targets-sweep "$OUT/targets-50.json,$OUT/targets-250.json,$OUT/queries-1000.json" \
    --shares-sweep "$OUT/shares-128.json,$OUT/shares-2048.json"
