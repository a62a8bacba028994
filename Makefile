# gepsea: the README's commands. `make test` is what CI runs (.ci/run).
CARGO ?= cargo
SHELL := /bin/bash
OUT := bench/out
export CARGO_TERM_COLOR ?= never

.PHONY: all setup build lint test test-unit test-loom fuzz soak bench bench-net bench-zerocopy bench-search bench-db bench-agent bench-cluster bench-replay bench-spare-core bench-paramedic bench-paramedic-scale demo clean

all: build

setup:
	@bash scripts/setup.sh

build: setup
	$(CARGO) build --release --workspace

# Formatting (rustfmt.toml) and clippy, warnings as errors; CI runs it before the tests.
lint: setup
	$(CARGO) fmt --all --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	# Doc links that name nothing (or something private) mislead the reader.
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --workspace --no-deps --quiet

# Every test: unit, property, loom, multi-process and multi-namespace.
test: setup test-unit test-loom

# `cargo test` links libraries as rlibs only; the C example needs the client's cdylib.
# Built with the tests in one command: a `--lib` build alone resolves features without
# the dev-dependencies, and `cargo test` then built five workspace crates again.
test-unit:
	$(CARGO) build --profile test --workspace --lib --tests
	$(CARGO) test --workspace --no-fail-fast

# The shared-memory ring and the event thread's hand-over under the loom model
# checker (its own target dir: loom needs a different build of the whole crate).
test-loom:
	RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom $(CARGO) test -p gepsea-net --lib --release _loom

# Every fuzz target (fuzz/fuzz_targets) for FUZZ_SECONDS each, coverage-guided by
# libFuzzer on the stable toolchain; regressions (fuzz/regressions) replayed first.
FUZZ_SECONDS ?= 60
fuzz: setup
	bash scripts/fuzz.sh $(FUZZ_SECONDS)

# Chaos soak: SOAK_ROUNDS searches on 3 namespace nodes, each with one fault injected
# (master, walltime, worker, agent, link cut); outputs compared, leaks checked (root).
SOAK_ROUNDS ?= 50
soak: build | $(OUT)
	./target/release/gepsea-bench soak --rounds $(SOAK_ROUNDS) --json $(OUT)/soak.json

# The references' buffers must be in memory before their clocks start: a zeroed
# `malloc` that the compiler turned into `calloc` faults inside the measured streams
# (bench/mpi_pingpong.c). A reference that calls `calloc` is refused.
NO_CALLOC = if nm -D $@ | grep -qw calloc; then rm -f $@; echo "$@ calls calloc: its buffers would fault inside the measurement; fill them with a non-zero byte" >&2; exit 1; fi

$(OUT)/mpi_pingpong: bench/mpi_pingpong.c | $(OUT)
	mpicc -O2 -o $@ $<
	@$(NO_CALLOC)

$(OUT)/tcp_pingpong: bench/tcp_pingpong.c | $(OUT)
	cc -O2 -o $@ $<
	@$(NO_CALLOC)

$(OUT)/tcp_zerocopy: bench/tcp_zerocopy.c | $(OUT)
	cc -O2 -o $@ $<

$(OUT):
	mkdir -p $(OUT)

bench-net: build $(OUT)/mpi_pingpong $(OUT)/tcp_pingpong
	./target/release/gepsea-bench net --refs $(OUT) --json $(OUT)/net.json

# Whether MSG_ZEROCOPY would pay for gepsea-net's TCP path (issue 20): it does not on
# loopback or veth, where the kernel copies zero-copy pages on delivery.
bench-zerocopy: $(OUT)/tcp_zerocopy
	bash bench/zerocopy.sh $(OUT)/tcp_zerocopy

bench-search: build | $(OUT)
	./target/release/gepsea-bench search --json $(OUT)/search.json

# db format vs makeblastdb on 1 GB of synthesised FASTA; a large report's search memory.
bench-db: build | $(OUT)
	./target/release/gepsea-bench db --json $(OUT)/db.json

bench-agent: build | $(OUT)
	./target/release/gepsea-bench agent --json $(OUT)/agent.json

# The paper's mpiBLAST experiments: 1, 2, 4 namespace nodes under mpirun (root).
bench-cluster: build | $(OUT)
	./target/release/gepsea-bench cluster --json $(OUT)/cluster.json

# The accelerator at 1-36 nodes with the searches replayed (issue 18): a search with
# 227 MB of pairwise output recorded once for real (kept in $(OUT)/replay), then
# replayed on 1, 4, 8, 16 and 36 namespace nodes without and with agents; a
# discrete-event model calibrated on the 1-node runs is checked against the others
# and extrapolated to 128 and 1,000 nodes (root; the recording takes ~10 min once).
# (-comp_based_stats 0: see docs/blast.md, known limits, for why.)
REPLAY_ARGS ?= --queries 500 --queries-from-db 1100 --fragments 8 --batches 32 --storage-mbit 1000 \
	--blast-options "-comp_based_stats 0"

bench-replay: build | $(OUT)
	./target/release/gepsea-bench cluster --replay $(OUT)/replay $(REPLAY_ARGS) --json $(OUT)/cluster-replay.json

# The paper's spare-core experiments on real cores (1 worker + a pinned agent vs 2 workers).
bench-spare-core: build | $(OUT)
	./target/release/gepsea-bench spare-core --json $(OUT)/spare-core.json

# The ParaMEDIC experiments: two namespace sites behind an emulated wide-area link (root).
bench-paramedic: build | $(OUT)
	./target/release/gepsea-bench paramedic --json $(OUT)/paramedic.json

# ParaMEDIC on a 317.5 MB workload and the paper's sweeps (about 2 hours: records the
# searches once, then replays them on 16 namespace nodes; see the script's header).
bench-paramedic-scale: build | $(OUT)
	bash bench/paramedic-scale.sh

bench: bench-net bench-zerocopy bench-search bench-db bench-agent bench-cluster bench-replay bench-spare-core bench-paramedic

# Parallel BLAST on the example data: 4 fragments, 100 queries, 2 workers.
EXAMPLES := /usr/share/doc/mmseqs2/example-data
DEMO := demo-out
demo: build
	mkdir -p $(DEMO)
	zcat $(EXAMPLES)/QUERY.fasta.gz | awk '/^>/{n++} n<=100' > $(DEMO)/queries.fasta
	./target/release/gepsea db format --input $(EXAMPLES)/DB.fasta.gz --fragments 4 --out $(DEMO)/db --force
	./target/release/gepsea search --db $(DEMO)/db --query $(DEMO)/queries.fasta --out $(DEMO)/results.txt --workers 2 --outfmt 0

clean:
	$(CARGO) clean
	rm -rf $(OUT) $(DEMO)
