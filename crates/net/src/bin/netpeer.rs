//! gepsea-netpeer: a small program that opens one gepsea-net port and plays a role
//! against a peer. The integration tests and `gepsea-bench net` run it as the "other
//! process" (or the other node, inside a network namespace).
//!
//! It prints `READY` once its port is open, and `OK ...` when its role succeeded; any
//! failure is reported on stderr with a non-zero exit.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, ensure, Context, Result};
use clap::{Parser, Subcommand};
use gepsea_net::testkit::{fingerprint, first_mismatch, pattern};
use gepsea_net::{Addr, Completion, Event, Port, PortConfig, Progress};

#[derive(Parser)]
#[command(about = "Open one gepsea-net port and play a test or benchmark role against a peer")]
struct Cli {
    /// Namespace isolating this run's ports from others on the machine.
    #[arg(long, default_value = "netpeer")]
    ns: String,
    /// This port's node id.
    #[arg(long)]
    node: u32,
    /// This port's port id.
    #[arg(long)]
    port: u32,
    /// TCP address to listen on (for peers on other nodes), e.g. 10.0.0.1:0.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Shared directory where ports publish and look up TCP addresses.
    #[arg(long)]
    directory: Option<PathBuf>,
    /// Progress only inside library calls (no event thread).
    #[arg(long)]
    inline: bool,
    /// Send large messages through the shared-memory ring even on one node (no
    /// single copy).
    #[arg(long)]
    no_single_copy: bool,
    /// Authenticate TCP links with the secret in this file (owner-only).
    #[arg(long)]
    key_file: Option<PathBuf>,
    /// Also encrypt TCP links (needs --key-file).
    #[arg(long)]
    encrypt: bool,
    /// Run TCP links under this congestion control (default: $GEPSEA_TCP_CONGESTION,
    /// else the system's).
    #[arg(long, value_name = "NAME")]
    tcp_congestion: Option<String>,
    /// Kernel buffers of each TCP connection, each way, in bytes, or `auto` for the
    /// kernel's own sizing (default: the port's, 4 MiB).
    #[arg(long, value_name = "BYTES|auto")]
    tcp_buffer: Option<gepsea_net::tcp::BufferSetting>,
    /// What TCP links checksum: `full` (headers and payloads), or `headers` (data
    /// payloads trusted to TCP where the peer says the same). Default: the port's.
    #[arg(long, value_name = "full|headers")]
    tcp_checksums: Option<gepsea_net::tcp::TcpChecksums>,
    /// Fault injection: offer single copies as this process id.
    #[arg(long, hide = true)]
    claim_pid: Option<u32>,
    #[command(subcommand)]
    role: Role,
}

fn parse_addr(s: &str) -> Result<Addr, String> {
    let (n, p) = s.split_once(':').ok_or("expected NODE:PORT")?;
    Ok(Addr::new(n.parse().map_err(|_| "bad node")?, p.parse().map_err(|_| "bad port")?))
}

#[derive(Subcommand)]
enum Role {
    /// Send every size to the peer and receive every size from it, at once; verify.
    Exchange {
        #[arg(long, value_parser = parse_addr)]
        peer: Addr,
        /// Comma-separated message sizes in bytes.
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Use the system channel (sizes must not exceed the eager threshold).
        #[arg(long)]
        system: bool,
    },
    /// Send COUNT messages of varying size with tags 0..COUNT, pausing now and then so
    /// that the stream lasts a while; print SENT n every 500 messages.
    StreamSend {
        #[arg(long, value_parser = parse_addr)]
        peer: Addr,
        #[arg(long)]
        count: u64,
        #[arg(long, default_value_t = 200)]
        pause_every: u64,
    },
    /// Receive COUNT messages from the peer and check they arrive once each, in order.
    StreamRecv {
        #[arg(long, value_parser = parse_addr)]
        peer: Addr,
        #[arg(long)]
        count: u64,
    },
    /// Expose region 1 of LEN bytes, report RMA events when the peer says done (tag 99).
    RmaTarget {
        #[arg(long, value_parser = parse_addr)]
        peer: Addr,
        #[arg(long)]
        len: usize,
    },
    /// Put into and get from the peer's region 1 (served by `rma-target`), including
    /// accesses out of bounds that must fail; check the owner saw exactly the valid ones.
    RmaOrigin {
        #[arg(long, value_parser = parse_addr)]
        peer: Addr,
        #[arg(long)]
        len: usize,
    },
    /// Answer every message with the same bytes and tag, COUNT times (or until a
    /// message tagged 1 saying "stop").
    Echo {
        #[arg(long, value_parser = parse_addr)]
        peer: Addr,
        #[arg(long)]
        count: u64,
        #[arg(long, default_value_t = 64 << 20)]
        max: usize,
        /// Answer with as many bytes from a buffer of its own instead of the received
        /// ones, as latency benchmarks do (OSU's, and bench/mpi_pingpong.c): the reply
        /// is then not read from lines the other core has just written.
        #[arg(long)]
        own_buffer: bool,
    },
    /// Latency client: for each size, round trips against `echo`; prints
    /// `LAT <size> <one-way microseconds>` (median of 7 batches of half round trips).
    Pingpong {
        #[arg(long, value_parser = parse_addr)]
        peer: Addr,
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        /// Scales the number of round trips (1.0 = full run).
        #[arg(long, default_value_t = 1.0)]
        scale: f64,
    },
    /// Bandwidth source: for each size, once `sink` says it is ready (tag 8), stream
    /// BYTES with a window of 16 outstanding sends, wait for its acknowledgement;
    /// prints `BW <size> <GB/s>`.
    Stream(StreamArgs),
    /// Bandwidth sink: receives the streams of `stream` (same sizes and bytes) with 16
    /// receives posted ahead (then says ready, tag 8), acknowledging each size.
    Sink(StreamArgs),
    /// Unidirectional bandwidth source (seed 004's test): for each size, batches of 16
    /// sends, each batch started by the receiver's go (tag 1) and followed by a
    /// system-channel "sent" notice, which arrives after the batch's messages.
    UniSend(UniArgs),
    /// Unidirectional bandwidth receiver: for each size, receives the batches of
    /// `uni-send`, with every receive posted before its message is sent (expected) or
    /// only once the batch has arrived (`--unexpected`); prints `UNI <size> <GB/s>
    /// <CPU>`, CPU being this process's CPU time (every thread) over the wall time.
    UniRecv {
        #[command(flatten)]
        args: UniArgs,
        #[arg(long)]
        unexpected: bool,
    },
    /// Overlap benchmark sender: for each size, wait for the receiver's go (tag 1), then
    /// send SIZE bytes (tag 2); ROUNDS times.
    OverlapSend {
        #[arg(long, value_parser = parse_addr)]
        peer: Addr,
        #[arg(long, value_delimiter = ',')]
        sizes: Vec<usize>,
        #[arg(long)]
        rounds: u32,
    },
}

/// Both ends of the unidirectional bandwidth test take the same arguments.
#[derive(clap::Args)]
struct UniArgs {
    #[arg(long, value_parser = parse_addr)]
    peer: Addr,
    /// Comma-separated message sizes in bytes.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Bytes received per size (rounded to whole batches of 16, at least 8 batches).
    #[arg(long, default_value_t = 64 << 20)]
    bytes: usize,
}

/// A buffer of `len` bytes whose pages are all in memory. `vec![0u8; len]` is not: a
/// large zeroed allocation comes from `calloc`, whose fresh pages fault on first
/// write, so the transport's first copy into each would pay for it (16 MiB of faults
/// in each measured stream).
fn touched(len: usize) -> Vec<u8> {
    vec![0x5a; len]
}

/// Batches of the unidirectional test, for `size`-byte messages.
fn uni_batches(size: usize, bytes: usize) -> usize {
    (bytes / size / UNI_BATCH).max(8)
}

const UNI_BATCH: usize = 16;

/// CPU time of this process so far, every thread (`CLOCK_PROCESS_CPUTIME_ID`, which
/// counts the running threads' time up to now, not up to their last tick).
fn cpu_seconds() -> Result<f64> {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_PROCESS_CPUTIME_ID).context("reading the process CPU clock")?;
    Ok(t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
}

/// The two ends of a bandwidth measurement take the same arguments.
#[derive(clap::Args)]
struct StreamArgs {
    #[arg(long, value_parser = parse_addr)]
    peer: Addr,
    /// Comma-separated message sizes in bytes.
    #[arg(long, value_delimiter = ',')]
    sizes: Vec<usize>,
    /// Bytes streamed per size.
    #[arg(long, default_value_t = 256 << 20)]
    bytes: usize,
}

/// Size of message `i` of a stream: 1 B to 300 KiB, crossing the eager threshold and
/// the size from which pieces send their checksums after them (a 256 KiB piece and a
/// short one), so that connections cut mid-stream also cut pieces waiting for their sum.
pub fn stream_size(i: u64) -> usize {
    [1usize, 100, 4096, 16 * 1024, 20_000, 64 * 1024, 300 * 1024][(i % 7) as usize] + (i as usize % 5)
}

/// Errors as one line (`RUST_BACKTRACE` set or not): a test or benchmark that runs
/// this tool shows its stderr, and anyhow's report printed a backtrace there.
fn main() -> std::process::ExitCode {
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gepsea-netpeer: error: {}", gepsea_net::error::one_line(e.as_ref()));
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(cli: Cli) -> Result<()> {
    let mut cfg = PortConfig::new(&cli.ns, Addr::new(cli.node, cli.port));
    cfg.listen = cli.listen;
    cfg.directory = cli.directory.clone();
    cfg.reconnect_timeout = Duration::from_secs(30);
    if cli.inline {
        cfg.progress = Progress::Inline;
    }
    cfg.single_copy = !cli.no_single_copy;
    if let Some(k) = &cli.key_file {
        cfg.key = Some(gepsea_net::auth::Key::from_file(k).context("--key-file")?);
    }
    cfg.encrypt = cli.encrypt;
    if cli.tcp_congestion.is_some() {
        cfg.tcp_congestion = cli.tcp_congestion.clone();
    }
    if let Some(c) = cli.tcp_checksums {
        cfg.tcp_checksums = c;
    }
    if let Some(b) = cli.tcp_buffer {
        cfg.tcp_buffer = b.0;
    }
    let port = Port::open(cfg).context("opening port")?;
    if let Some(pid) = cli.claim_pid {
        port.claim_pid_for_single_copy(pid);
    }
    println!("READY");
    let me = port.addr();
    let seed = |from: Addr, tag: u64| ((from.node as u64) << 40) ^ ((from.port as u64) << 20) ^ tag;
    match cli.role {
        Role::Exchange { peer, sizes, system } => {
            let recvs: Vec<_> =
                if system { vec![] } else { sizes.iter().enumerate().map(|(i, &s)| port.irecv(Some(peer), Some(i as u64), s)).collect() };
            let sends: Vec<_> = sizes
                .iter()
                .enumerate()
                .map(|(i, &s)| {
                    let data = pattern(seed(me, i as u64), s);
                    if system {
                        port.send_system(peer, i as u64, data)
                    } else {
                        port.isend(peer, i as u64, data)
                    }
                })
                .collect();
            let mut bytes = 0;
            if system {
                let mut seen = vec![false; sizes.len()];
                for _ in 0..sizes.len() {
                    let m = port.recv_system(Duration::from_secs(60))?;
                    let i = m.tag as usize;
                    ensure!(m.src == peer && i < sizes.len() && !seen[i], "unexpected system message {} from {}", m.tag, m.src);
                    seen[i] = true;
                    ensure!(m.data.len() == sizes[i], "message {i}: {} bytes, expected {}", m.data.len(), sizes[i]);
                    if let Some(at) = first_mismatch(seed(peer, m.tag), &m.data) {
                        bail!("message {i} differs at byte {at}");
                    }
                    bytes += m.data.len();
                }
            }
            for (i, r) in recvs.into_iter().enumerate() {
                let Completion::Received(m) = port.wait(r)? else { bail!("not a receive") };
                ensure!(m.data.len() == sizes[i], "message {i}: {} bytes, expected {}", m.data.len(), sizes[i]);
                if let Some(at) = first_mismatch(seed(peer, i as u64), &m.data) {
                    bail!("message {i} ({} bytes) differs at byte {at}", sizes[i]);
                }
                bytes += m.data.len();
            }
            for s in sends {
                port.wait(s)?;
            }
            let st = port.proto_stats();
            let not_peer = port.stats().single_copies_not_from_peer;
            println!("COPIES {} single, {} refused ({not_peer} not from the peer)", st.single_copies, st.single_copy_fallbacks);
            println!("OK exchanged {} messages, {bytes} bytes verified", sizes.len());
        }
        Role::StreamSend { peer, count, pause_every } => {
            let mut reqs = Vec::new();
            for i in 0..count {
                reqs.push(port.isend(peer, i, pattern(seed(me, i), stream_size(i))));
                if (i + 1) % pause_every == 0 {
                    for r in reqs.drain(..) {
                        port.wait(r)?;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                if (i + 1) % 500 == 0 {
                    println!("SENT {}", i + 1);
                }
            }
            for r in reqs {
                port.wait(r)?;
            }
            // Wait for the receiver's confirmation so that our output is delivered.
            let m = port.recv(Some(peer), Some(u64::MAX), 64)?;
            let st = port.stats();
            println!(
                "OK sent {count}; receiver says {}; connections established {} lost {} replayed {}",
                String::from_utf8_lossy(&m.data),
                st.connections_established,
                st.connections_lost,
                st.frames_replayed
            );
        }
        Role::StreamRecv { peer, count } => {
            for i in 0..count {
                let m = port.recv(Some(peer), None, 1 << 20)?;
                ensure!(m.tag == i, "out of order: got message {} where {i} was due", m.tag);
                ensure!(m.data.len() == stream_size(i), "message {i}: wrong length {}", m.data.len());
                if let Some(at) = first_mismatch(seed(peer, i), &m.data) {
                    bail!("message {i} differs at byte {at}");
                }
            }
            // Nothing more may arrive: a duplicate would show up here.
            let extra = port.irecv(Some(peer), None, 1 << 20);
            match port.wait_timeout(extra, Duration::from_millis(500)) {
                Err(gepsea_net::NetError::Timeout(_)) => {
                    port.cancel(extra);
                }
                other => bail!("extra message after {count}: {other:?}"),
            }
            let st = port.stats();
            port.send(peer, u64::MAX, format!("{count} in order"))?;
            println!("OK received {count} in order; duplicates dropped {}", st.duplicates_dropped);
        }
        Role::RmaTarget { peer, len } => {
            port.enable_events();
            port.expose(1, len)?;
            port.send_system(peer, 0, &b"ready"[..]);
            port.recv(Some(peer), Some(99), 16)?;
            let (mut puts, mut gets) = (0u64, 0u64);
            while let Some(e) = port.next_event() {
                match e {
                    Event::RemotePut { from, .. } if from == peer => puts += 1,
                    Event::RemoteGet { from, .. } if from == peer => gets += 1,
                    _ => {}
                }
            }
            let checksum = port.with_region(1, |r| fingerprint(r))?;
            port.send(peer, 100, format!("{puts} {gets} {checksum}"))?;
            println!("OK puts {puts} gets {gets}");
        }
        Role::RmaOrigin { peer, len } => {
            let ready = port.recv_system(Duration::from_secs(60))?;
            ensure!(ready.src == peer && ready.data == b"ready", "expected ready from {peer}");
            let mut expect = pattern(1, len);
            port.wait(port.put(peer, 1, 0, expect.clone()))?;
            let small = pattern(2, 100);
            port.wait(port.put(peer, 1, 5, small.clone()))?;
            expect[5..105].copy_from_slice(&small);
            let Completion::Got(all) = port.wait(port.get(peer, 1, 0, len))? else { bail!("get returned no data") };
            ensure!(all.len() == len, "get returned {} bytes", all.len());
            if let Some(at) = all.iter().zip(&expect).position(|(a, b)| a != b) {
                bail!("region differs from what was put at byte {at}");
            }
            let Completion::Got(tail) = port.wait(port.get(peer, 1, len as u64 - 10, 10))? else { bail!("no data") };
            ensure!(tail == expect[len - 10..], "tail get differs");
            let oob_put = port.wait(port.put(peer, 1, len as u64 - 5, vec![0u8; 10]));
            ensure!(matches!(oob_put, Err(gepsea_net::NetError::RegionAccess { .. })), "out-of-bounds put: {oob_put:?}");
            let oob_get = port.wait(port.get(peer, 1, len as u64, 1));
            ensure!(matches!(oob_get, Err(gepsea_net::NetError::RegionAccess { .. })), "out-of-bounds get: {oob_get:?}");
            let missing = port.wait(port.get(peer, 2, 0, 1));
            ensure!(matches!(missing, Err(gepsea_net::NetError::RegionAccess { .. })), "get from missing region: {missing:?}");
            port.send(peer, 99, &b"done"[..])?;
            let report = port.recv(Some(peer), Some(100), 64)?;
            let want = format!("2 2 {}", fingerprint(&expect));
            ensure!(report.data == want.as_bytes(), "owner reports {:?}, expected {want:?}", String::from_utf8_lossy(&report.data));
            println!("OK rma {len} bytes; owner saw 2 puts, 2 gets, identical contents");
        }
        Role::Echo { peer, count, max, own_buffer } => {
            // One buffer, received into and sent back from (or one to send from).
            let mut buf = Vec::with_capacity(max);
            let own = bytes::Bytes::from(if own_buffer { vec![2u8; max] } else { Vec::new() });
            let mut n = 0;
            while n < count {
                let r = port.irecv_into(Some(peer), None, std::mem::take(&mut buf));
                let Completion::Received(m) = port.wait(r)? else { bail!("not a receive") };
                if m.tag == 1 && m.data == b"stop" {
                    break;
                }
                if own_buffer {
                    let len = m.data.len();
                    if len <= 16 * 1024 {
                        port.send_copy(peer, m.tag, &own[..len])?;
                    } else {
                        port.send(peer, m.tag, own.slice(..len))?;
                    }
                    buf = m.data;
                } else if m.data.len() <= 16 * 1024 {
                    // Small: copied straight into the ring, the buffer stays ours.
                    port.send_copy(peer, m.tag, &m.data)?;
                    buf = m.data;
                } else {
                    let out = bytes::Bytes::from(m.data);
                    port.send(peer, m.tag, out.clone())?;
                    // Take the buffer back once the transport has let go of it.
                    buf = match out.try_into_mut() {
                        Ok(b) => b.into(),
                        Err(_) => Vec::with_capacity(max),
                    };
                }
                n += 1;
            }
            println!("OK echoed {n}");
        }
        Role::Pingpong { peer, sizes, scale } => {
            for &s in &sizes {
                let iters = (((4 << 20) / (s + 1024)).clamp(50, 20_000) as f64 * scale).max(10.0) as usize;
                let data = bytes::Bytes::from(vec![1u8; s]);
                let mut batches = Vec::new();
                let mut buf = Vec::with_capacity(s);
                for b in 0..8 {
                    let t = std::time::Instant::now();
                    for _ in 0..iters {
                        // Send, then receive, as the reference (mpi_pingpong) does. From
                        // one buffer, as MPI_Send does: small messages are copied
                        // straight into the ring, large ones are offered for single copy.
                        if s <= 16 * 1024 {
                            port.send_copy(peer, 0, &data)?;
                        } else {
                            port.send(peer, 0, data.clone())?;
                        }
                        let r = port.irecv_into(Some(peer), Some(0), std::mem::take(&mut buf));
                        let Completion::Received(m) = port.wait(r)? else { bail!("not a receive") };
                        buf = m.data;
                    }
                    if b > 0 {
                        batches.push(t.elapsed().as_secs_f64() * 1e6 / iters as f64 / 2.0);
                    }
                }
                batches.sort_by(|a, b| a.partial_cmp(b).unwrap());
                println!("LAT {s} {:.3}", batches[batches.len() / 2]);
            }
            port.send(peer, 1, &b"stop"[..])?;
            eprintln!("doorbells rung: {}", port.stats().doorbells);
            println!("OK");
        }
        Role::Stream(StreamArgs { peer, sizes, bytes: total }) => {
            for &s in &sizes {
                let n = (total / s).max(16);
                let data = bytes::Bytes::from(vec![3u8; s]);
                // The clock starts once the sink has its buffers ready (MPI's
                // reference starts after a barrier).
                port.recv(Some(peer), Some(8), 16)?;
                let t = std::time::Instant::now();
                let mut window = std::collections::VecDeque::new();
                for _ in 0..n {
                    if window.len() == 16 {
                        port.wait(window.pop_front().unwrap())?;
                    }
                    window.push_back(port.isend(peer, 0, data.clone()));
                }
                for r in window {
                    port.wait(r)?;
                }
                port.recv(Some(peer), Some(9), 16)?;
                let secs = t.elapsed().as_secs_f64();
                println!("BW {s} {:.3}", (n * s) as f64 / secs / 1e9);
            }
            println!("OK");
        }
        Role::Sink(StreamArgs { peer, sizes, bytes: total }) => {
            for &s in &sizes {
                let n = (total / s).max(16);
                let mut window = std::collections::VecDeque::new();
                let mut posted = 0;
                while posted < n.min(16) {
                    // Touched before the clock starts, as the MPI reference's buffers
                    // are (a non-zero memset, which the compiler cannot turn into
                    // `calloc`): page faults are not the transport's cost
                    // (16 × 4 MiB of them took ≈40 ms, inside the measured stream,
                    // until the sender waited for this "ready").
                    let mut b = touched(s);
                    b.clear();
                    window.push_back(port.irecv_into(Some(peer), Some(0), b));
                    posted += 1;
                }
                port.send(peer, 8, &b"ready"[..])?;
                for _ in 0..n {
                    let Completion::Received(m) = port.wait(window.pop_front().unwrap())? else { bail!("not a receive") };
                    if posted < n {
                        window.push_back(port.irecv_into(Some(peer), Some(0), m.data));
                        posted += 1;
                    }
                }
                port.send(peer, 9, &b"ack"[..])?;
            }
            println!("OK");
        }
        Role::UniSend(UniArgs { peer, sizes, bytes }) => {
            for &s in &sizes {
                let data = bytes::Bytes::from(vec![5u8; s]);
                for _ in 0..uni_batches(s, bytes) {
                    port.recv(Some(peer), Some(1), 16)?;
                    let sends: Vec<_> = (0..UNI_BATCH).map(|_| port.isend(peer, 0, data.clone())).collect();
                    let notice = port.send_system(peer, 2, &b"sent"[..]);
                    for r in sends.into_iter().chain([notice]) {
                        port.wait(r)?;
                    }
                }
            }
            println!("OK");
        }
        Role::UniRecv { args: UniArgs { peer, sizes, bytes }, unexpected } => {
            for &s in &sizes {
                // Buffers touched before the clock starts (page faults are not the
                // transport's), reused batch after batch.
                let mut bufs: Vec<Vec<u8>> = (0..UNI_BATCH).map(|_| touched(s)).collect();
                let batches = uni_batches(s, bytes);
                let (t, cpu) = (std::time::Instant::now(), cpu_seconds()?);
                for _ in 0..batches {
                    let post = |bufs: &mut Vec<Vec<u8>>| -> Vec<_> {
                        bufs.drain(..)
                            .map(|mut b| {
                                b.clear();
                                port.irecv_into(Some(peer), Some(0), b)
                            })
                            .collect()
                    };
                    // Expected: posted before the go; unexpected: once the batch is in.
                    let early = (!unexpected).then(|| post(&mut bufs));
                    port.send(peer, 1, &b"go"[..])?;
                    port.recv_system(Duration::from_secs(30)).context("waiting for the batch's notice")?;
                    let reqs = early.unwrap_or_else(|| post(&mut bufs));
                    for r in reqs {
                        let Completion::Received(m) = port.wait(r)? else { bail!("not a receive") };
                        ensure!(m.data.len() == s, "received {} bytes, expected {s}", m.data.len());
                        bufs.push(m.data);
                    }
                }
                let (secs, cpu) = (t.elapsed().as_secs_f64(), cpu_seconds()? - cpu);
                println!("UNI {s} {:.3} {:.3}", (batches * UNI_BATCH * s) as f64 / secs / 1e9, cpu / secs);
            }
            println!("OK");
        }
        Role::OverlapSend { peer, sizes, rounds } => {
            for &s in &sizes {
                let data = bytes::Bytes::from(vec![7u8; s]);
                for _ in 0..rounds {
                    port.recv(Some(peer), Some(1), 16)?;
                    port.send(peer, 2, data.clone())?;
                }
            }
            println!("OK");
        }
    }
    Ok(())
}
