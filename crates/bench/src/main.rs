//! `gepsea-bench`: the benchmarks behind `make bench`, each printing ratios against a
//! reference measured in the same run, and the tools the wide-area testbed runs inside
//! its namespaces. A binary of its own so the user's `gepsea` links neither the
//! plotting stack (and its font libraries) nor NFQUEUE; it drives the `gepsea` binary
//! next to it, as a user would.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod agent;
mod cluster;
mod cluster_model;
mod db;
mod model;
mod net;
mod net_report;
mod out;
mod paramedic;
mod paramedic_figures;
mod plots;
mod procstat;
mod regime;
mod search;
mod soak;
mod spare_core;
mod testbed;
mod workload;

#[derive(Parser)]
#[command(name = "gepsea-bench", version, about = "gepsea's benchmarks (make bench) and testbed tools")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// gepsea-net latency, bandwidth and overlap vs OpenMPI and raw TCP.
    Net(net::NetArgs),
    /// gepsea search against serial blastp -num_threads 2, alternated.
    Search(search::SearchBenchArgs),
    /// gepsea db format against one makeblastdb over a synthesised FASTA (time, peak
    /// memory), and a large search's peak memory against its report size.
    Db(db::DbBenchArgs),
    /// Offloaded request latency vs a gepsea-net ping-pong; agent throughput and CPU with 4 nodes.
    Agent(agent::AgentBenchArgs),
    /// The paper's mpiBLAST experiments: 1, 2, 4 emulated nodes under mpirun, with and
    /// without agents (needs root).
    Cluster(cluster::ClusterBenchArgs),
    /// The paper's spare-core experiments on real cores: an agent pinned to a core of
    /// its own beside 1 worker, against 2 workers without an agent.
    SpareCore(spare_core::SpareCoreArgs),
    /// The ParaMEDIC experiments: two sites joined by an emulated wide-area link, the
    /// output written directly vs shipped as metadata (needs root).
    Paramedic(paramedic::ParamedicBenchArgs),
    /// The ParaMEDIC paper's figures (time breakdown, sweeps, break-even) from the JSON
    /// files of `paramedic` runs, as PNGs with their tables.
    ParamedicFigures(paramedic_figures::FiguresArgs),
    /// Chaos soak: repeated searches on 3 namespace nodes under mpirun while faults are
    /// injected at random moments (needs root; `make soak`).
    Soak(soak::SoakArgs),
    /// Tools the wide-area benchmark runs inside its namespaces (link delay, RTT probe).
    #[command(subcommand)]
    Testbed(testbed::TestbedCmd),
}

fn main() -> std::process::ExitCode {
    let result: Result<()> = match Cli::parse().cmd {
        Cmd::Net(a) => net::run(&a),
        Cmd::Search(a) => search::run(&a),
        Cmd::Db(a) => db::run(&a),
        Cmd::Agent(a) => agent::run(&a),
        Cmd::Cluster(a) => cluster::run(&a),
        Cmd::SpareCore(a) => spare_core::run(&a),
        Cmd::Paramedic(a) => paramedic::run(&a),
        Cmd::ParamedicFigures(a) => paramedic_figures::run(&a),
        Cmd::Soak(a) => soak::run(&a),
        Cmd::Testbed(t) => testbed::run(&t),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gepsea-bench: error: {}", gepsea_net::error::one_line(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}
