//! `gepsea-bench testbed`: small tools the wide-area benchmark runs inside its namespaces.
//!
//! - `delay`: one-way delay without `netem` (this kernel has none). Packets the router
//!   hands to an NFQUEUE are held for the delay and then accepted, in arrival order
//!   (every packet waits the same time, so order is kept and the queue is a FIFO).
//!   Only metadata is copied to user space. The `nfq` crate exposes no descriptor to
//!   poll, so the loop reads without blocking and sleeps until the next packet is due
//!   (at most 200 µs while packets are held, 1 ms when idle): the delay is exact to
//!   ≈0.1 ms, which `rtt` measures.
//! - `rtt`: the round-trip time as the median TCP connect time (one SYN / SYN-ACK
//!   exchange) to a listener started with `--listen`.

use std::collections::VecDeque;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};

#[derive(clap::Subcommand)]
pub enum TestbedCmd {
    /// Hold every packet of an NFQUEUE for a fixed time, then accept it (run in the
    /// router's namespace; stop with a signal).
    Delay {
        #[arg(long, default_value_t = 0)]
        queue: u16,
        /// One-way delay in milliseconds.
        #[arg(long)]
        delay_ms: f64,
    },
    /// Measure the round-trip time to `--to`, or accept `--count` connections on
    /// `--listen`.
    Rtt {
        #[arg(long, conflicts_with = "listen")]
        to: Option<SocketAddr>,
        #[arg(long)]
        listen: Option<SocketAddr>,
        #[arg(long, default_value_t = 7)]
        count: usize,
    },
}

pub fn run(cmd: &TestbedCmd) -> Result<()> {
    match cmd {
        TestbedCmd::Delay { queue, delay_ms } => delay(*queue, Duration::from_secs_f64(delay_ms / 1e3)),
        TestbedCmd::Rtt { to: Some(to), count, .. } => {
            let mut t: Vec<f64> = (0..*count)
                .map(|_| {
                    let s = Instant::now();
                    TcpStream::connect_timeout(to, Duration::from_secs(10)).with_context(|| format!("connecting to {to}"))?;
                    Ok(s.elapsed().as_secs_f64() * 1e3)
                })
                .collect::<Result<_>>()?;
            t.sort_by(f64::total_cmp);
            println!("{:.3}", t[t.len() / 2]);
            Ok(())
        }
        TestbedCmd::Rtt { listen: Some(at), count, .. } => {
            let l = TcpListener::bind(at).with_context(|| format!("listening on {at}"))?;
            for _ in 0..*count {
                drop(l.accept()?);
            }
            Ok(())
        }
        TestbedCmd::Rtt { .. } => anyhow::bail!("give --to ADDR (measure) or --listen ADDR (answer)"),
    }
}

fn delay(queue: u16, delay: Duration) -> Result<()> {
    let mut q = nfq::Queue::open().context("opening a netfilter queue socket (needs root, in the router's namespace)")?;
    q.bind(queue).with_context(|| format!("binding NFQUEUE {queue}"))?;
    q.set_copy_range(queue, 0)?;
    // Everything in flight on the emulated link is held here: at 1 Gbit/s and 100 ms
    // that is ≈8,300 full-size packets.
    q.set_queue_max_len(queue, 262_144)?;
    q.set_nonblocking(true);
    let mut held: VecDeque<(Instant, nfq::Message)> = VecDeque::new();
    loop {
        let mut got = false;
        loop {
            match q.recv() {
                Ok(mut m) => {
                    m.set_verdict(nfq::Verdict::Accept);
                    held.push_back((Instant::now() + delay, m));
                    got = true;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                // The kernel's answer to a verdict on a packet it no longer holds: when a
                // device on the packet's path goes down (an emulated link cut), its queued
                // packets are flushed, as a real outage loses them. The link comes back; so
                // must the delay.
                Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                Err(e) => return Err(e).context("reading the netfilter queue"),
            }
        }
        let now = Instant::now();
        while held.front().is_some_and(|(due, _)| *due <= now) {
            let (_, m) = held.pop_front().expect("checked");
            q.verdict(m).context("accepting a held packet")?;
        }
        let nap = match held.front() {
            Some((due, _)) => due.saturating_duration_since(now).min(Duration::from_micros(200)),
            None if got => Duration::from_micros(200),
            None => Duration::from_millis(1),
        };
        std::thread::sleep(nap);
    }
}
