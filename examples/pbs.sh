#!/bin/bash
# gepsea search as a PBS Pro / Torque job under OpenMPI's mpirun: 4 nodes x 16 cores,
# one BLAST+ worker per core plus the master. Edit the #PBS lines and the paths, then
# `qsub pbs.sh`.
#
# Resume: if the walltime (or qdel, or a node failure) stops the job, submit it again
# unchanged: the finished batches wait in the work directory and only the rest is
# searched; the output is identical to an uninterrupted run.
#
#PBS -N gepsea-blast
#PBS -l select=4:ncpus=16:mpiprocs=16
# Torque: #PBS -l nodes=4:ppn=16
#PBS -l walltime=48:00:00
#PBS -j oe
set -euo pipefail
cd "${PBS_O_WORKDIR:-.}"

# Everything below is on storage every node sees. Override any of these with
# qsub -v DB=...,OUT=...
DB=${DB:-/shared/blastdb/swissprot}            # NCBI preformatted or `gepsea db format`
QUERY=${QUERY:-/shared/queries/q.fasta}
OUT=${OUT:-/shared/results/hits.tsv}
OUTFMT=${OUTFMT:-6}
BLAST_OPTIONS=${BLAST_OPTIONS--evalue 1e-5}    # passed to BLAST+ after -- (may be empty)
AGENT_NET=${AGENT_NET:-}                       # e.g. 10.1.0.0/16: the network agents use
GEPSEA=${GEPSEA:-gepsea}

# $PBS_NODEFILE lists each node once per core: one process per line. Any --map-by
# works; the processes find their nodes through a directory next to $OUT, and each
# node's agent takes a free port, so other jobs may share the nodes.
NP=$(wc -l < "$PBS_NODEFILE")
# shellcheck disable=SC2086 # BLAST_OPTIONS is a list of options
mpirun -np "$NP" --hostfile "$PBS_NODEFILE" "$GEPSEA" search \
    --db "$DB" --query "$QUERY" --out "$OUT" --outfmt "$OUTFMT" \
    ${AGENT_NET:+--agent-net "$AGENT_NET"} \
    -- $BLAST_OPTIONS
