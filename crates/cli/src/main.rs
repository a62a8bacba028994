//! The `gepsea` command: every user-facing subcommand. Thin by design: each
//! subcommand parses its arguments and calls into a library crate or a driver module.

use anyhow::Result;
use clap::{Parser, Subcommand};

mod bench_net;

#[derive(Parser)]
#[command(name = "gepsea", version, about = "gepsea: a software accelerator for parallel scientific applications")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Benchmarks, each reporting ratios against a reference measured in the same run.
    Bench {
        #[command(subcommand)]
        what: Bench,
    },
}

#[derive(Subcommand)]
enum Bench {
    /// gepsea-net latency, bandwidth and overlap vs OpenMPI and raw TCP.
    Net(bench_net::NetArgs),
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Bench { what: Bench::Net(a) } => bench_net::run(&a),
    }
}
