#!/usr/bin/env bash
# Idempotent install of every system package gepsea needs (build, tests, benchmarks).
# Works as root or through sudo. Prints what it installed; does nothing when all is present.
set -euo pipefail

PACKAGES=(
  build-essential pkg-config       # C example, cbindgen consumers, bench programs
  ncbi-blast+                      # BLAST+ (blastp, blastn, makeblastdb, blastdbcmd)
  mmseqs2-examples                 # real protein data: 500 UniProt queries, 20,000 proteins
  microbiomeutil-data              # real 16S rRNA sequences for blastn tests
  openmpi-bin libopenmpi-dev       # reference ping-pong benchmark, mpirun cluster mode
  iproute2 iptables ethtool        # network namespaces, veth, bridges, link emulation
  procps psmisc                    # pkill/fuser used by test cleanup
  zstd bzip2                       # compressed FASTA inputs in the db format tests
  libfontconfig1-dev fonts-dejavu-core  # benchmark plots (plotters draws text through fontconfig)
  openssh-server openssh-client sshfs   # bench cluster: output location on a storage node (sshfs)
)

if [ "$(id -u)" -eq 0 ]; then SUDO=(); else SUDO=(sudo); fi

# `make lint` needs rustfmt and clippy (rustup's default profile has them).
for tool in fmt clippy; do
  if ! cargo "$tool" --version >/dev/null 2>&1 && command -v rustup >/dev/null; then
    rustup component add "$([ "$tool" = fmt ] && echo rustfmt || echo clippy)"
  fi
done

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

echo "setup: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
"${SUDO[@]}" apt-get update -qq
"${SUDO[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "setup: installed ${missing[*]}"
