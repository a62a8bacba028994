//! The profiler-trace plug-in: a timestamped communication trace, shipped as its first
//! period plus how each later period differs from the one before.
//!
//! Parallel programs repeat: an iterative solver exchanges the same messages with the
//! same peers every step, only the timing jitters. The plug-in finds the period (in
//! events) from the autocorrelation of the event sequence, computed with an FFT
//! (`rustfft`), keeps the first period verbatim and, for every later event, the change
//! of its inter-arrival time against the event one period earlier and its kind, peer
//! and size only where they differ. Small numbers, mostly zeros: they compress far
//! better than the trace.
//!
//! The trace format is one event per line, `<time ns>\t<kind>\t<peer>\t<bytes>`, with
//! canonical integers. Encoding checks that decoding gives back exactly the input and
//! refuses a trace it could not reproduce (use the zstd plug-in for those).

use std::collections::HashMap;

use rustfft::{num_complex::Complex, FftPlanner};
use serde::{Deserialize, Serialize};

use crate::plugin::{MetadataPlugin, PluginError};

#[derive(Clone, Debug, PartialEq, Eq)]
struct Event {
    t: u64,
    kind: u32,
    peer: u32,
    bytes: u64,
}

/// An event's (kind, peer, bytes).
type Identity = (u32, u32, u64);

#[derive(Debug, Serialize, Deserialize)]
struct TraceMeta {
    period: u32,
    kinds: Vec<String>,
    /// Peers as written (e.g. `3` or gepsea-net's `node.port`), indexed by events.
    peers: Vec<String>,
    first_time: u64,
    /// The first period: (inter-arrival ns, kind, peer, bytes); the first event's
    /// inter-arrival is 0.
    first: Vec<(u64, u32, u32, u64)>,
    /// Every later event: change of inter-arrival time against the event one period
    /// earlier, and (kind, peer, bytes) where they differ from that event.
    later: Vec<(i64, Option<Identity>)>,
}

/// The trace plug-in (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct TracePlugin;

/// Index of `name` in `table`, added if new.
fn intern(table: &mut Vec<String>, index: &mut HashMap<String, u32>, name: &str) -> u32 {
    if let Some(&i) = index.get(name) {
        return i;
    }
    table.push(name.to_string());
    index.insert(name.to_string(), table.len() as u32 - 1);
    table.len() as u32 - 1
}

/// Events, and the kinds and peers they index.
type Parsed = (Vec<Event>, Vec<String>, Vec<String>);

fn parse(text: &str) -> Result<Parsed, PluginError> {
    let (mut kinds, mut peers) = (Vec::new(), Vec::new());
    let (mut kind_index, mut peer_index) = (HashMap::new(), HashMap::new());
    let mut events = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let f: Vec<&str> = line.split('\t').collect();
        let bad = |what: &str| PluginError::BadInput(format!("trace line {}: {what} (want <time ns>\\t<kind>\\t<peer>\\t<bytes>)", i + 1));
        if f.len() != 4 {
            return Err(bad(&format!("{} fields", f.len())));
        }
        let t: u64 = f[0].parse().map_err(|_| bad("bad time"))?;
        if events.last().is_some_and(|e: &Event| e.t > t) {
            return Err(bad("time goes backwards"));
        }
        if f[2].is_empty() {
            return Err(bad("empty peer"));
        }
        let kind = intern(&mut kinds, &mut kind_index, f[1]);
        let peer = intern(&mut peers, &mut peer_index, f[2]);
        events.push(Event { t, kind, peer, bytes: f[3].parse().map_err(|_| bad("bad size"))? });
    }
    Ok((events, kinds, peers))
}

fn format(events: &[Event], kinds: &[String], peers: &[String]) -> String {
    let mut s = String::with_capacity(events.len() * 32);
    for e in events {
        s.push_str(&format!("{}\t{}\t{}\t{}\n", e.t, kinds[e.kind as usize], peers[e.peer as usize], e.bytes));
    }
    s
}

/// The period, in events, the plug-in finds in a trace (0 or 1: none).
pub fn period_of(trace: &[u8]) -> Result<usize, PluginError> {
    let text = std::str::from_utf8(trace).map_err(|_| PluginError::BadInput("the trace is not text".into()))?;
    let (events, _, _) = parse(text)?;
    Ok(period(&events.iter().map(signature).collect::<Vec<_>>()))
}

/// The period (in events) of `signal`: the smallest lag whose autocorrelation, per
/// overlapping pair, comes within 1 % of the best lag's; 0 if there is none.
pub fn period(signal: &[f64]) -> usize {
    let n = signal.len();
    if n < 4 {
        return 0;
    }
    let mean = signal.iter().sum::<f64>() / n as f64;
    let size = (2 * n).next_power_of_two();
    let mut buf: Vec<Complex<f64>> = (0..size).map(|i| Complex::new(if i < n { signal[i] - mean } else { 0.0 }, 0.0)).collect();
    let mut planner = FftPlanner::new();
    planner.plan_fft_forward(size).process(&mut buf);
    for c in buf.iter_mut() {
        *c = Complex::new(c.norm_sqr(), 0.0);
    }
    planner.plan_fft_inverse(size).process(&mut buf);
    let r0 = buf[0].re / n as f64;
    if r0 <= 0.0 {
        return 1; // constant signal: every event is like the one before
    }
    let score = |lag: usize| buf[lag].re / (n - lag) as f64 / r0;
    let lags = 1..=n / 2;
    let best = lags.clone().map(score).fold(f64::MIN, f64::max);
    lags.into_iter().find(|&l| score(l) >= best - 0.01).unwrap_or(0)
}

fn signature(e: &Event) -> f64 {
    // Any injective-enough mix of the event's identity: periods repeat it exactly.
    let h = (e.kind as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (e.peer as u64).wrapping_mul(0xc2b2_ae3d_27d4_eb4f)
        ^ e.bytes.wrapping_mul(0x1656_67b1_9e37_79f9);
    (h >> 11) as f64 / (1u64 << 53) as f64
}

impl MetadataPlugin for TracePlugin {
    fn name(&self) -> &'static str {
        "trace"
    }

    fn encode(&self, output: &[u8]) -> Result<Vec<u8>, PluginError> {
        let text = std::str::from_utf8(output).map_err(|_| PluginError::BadInput("the trace is not text".into()))?;
        let (events, kinds, peers) = parse(text)?;
        if format(&events, &kinds, &peers) != text {
            return Err(PluginError::BadInput("the trace is not in canonical form (integers without leading zeros, one event per line, final newline); use the zstd plug-in".into()));
        }
        let sig: Vec<f64> = events.iter().map(signature).collect();
        let p = period(&sig).max(1).min(events.len().max(1));
        let dt = |i: usize| if i == 0 { 0 } else { events[i].t - events[i - 1].t };
        let first = (0..p.min(events.len())).map(|i| (dt(i), events[i].kind, events[i].peer, events[i].bytes)).collect();
        let later = (p..events.len())
            .map(|i| {
                let (e, o) = (&events[i], &events[i - p]);
                let same = e.kind == o.kind && e.peer == o.peer && e.bytes == o.bytes;
                (dt(i) as i64 - dt(i - p) as i64, (!same).then_some((e.kind, e.peer, e.bytes)))
            })
            .collect();
        let meta = TraceMeta { period: p as u32, kinds, peers, first_time: events.first().map_or(0, |e| e.t), first, later };
        let raw = postcard::to_stdvec(&meta).map_err(|e| PluginError::Failed(e.to_string()))?;
        let packed = zstd::bulk::compress(&raw, 19).map_err(|e| PluginError::Failed(e.to_string()))?;
        // The contract: decoding gives back exactly this trace.
        if self.decode(&packed)? != output {
            return Err(PluginError::Mismatch("the trace does not decode to itself".into()));
        }
        Ok(packed)
    }

    fn decode(&self, metadata: &[u8]) -> Result<Vec<u8>, PluginError> {
        let raw = crate::plugin::zstd_decode_bounded(metadata, crate::plugin::MAX_DECODED_METADATA, "trace metadata")?;
        let m: TraceMeta = postcard::from_bytes(&raw).map_err(|e| PluginError::BadInput(format!("trace metadata does not decode: {e}")))?;
        let p = m.period as usize;
        if p == 0 && !m.later.is_empty() || m.first.len() > p.max(m.first.len().min(p)) {
            return Err(PluginError::BadInput("trace metadata: inconsistent period".into()));
        }
        let bad_kind = |k: u32, p: u32| (k as usize) >= m.kinds.len() || (p as usize) >= m.peers.len();
        let mut dts: Vec<u64> = Vec::with_capacity(m.first.len() + m.later.len());
        let mut events: Vec<Event> = Vec::with_capacity(dts.capacity());
        let mut t = m.first_time;
        for (i, &(dt, kind, peer, bytes)) in m.first.iter().enumerate() {
            if bad_kind(kind, peer) {
                return Err(PluginError::BadInput(format!("trace metadata: unknown event kind {kind} or peer {peer}")));
            }
            t = if i == 0 { t } else { t.checked_add(dt).ok_or_else(|| PluginError::BadInput("trace metadata: time overflows".into()))? };
            dts.push(dt);
            events.push(Event { t, kind, peer, bytes });
        }
        for (j, &(ddt, lit)) in m.later.iter().enumerate() {
            let i = p + j;
            let o = events.get(i - p).cloned().ok_or_else(|| PluginError::BadInput("trace metadata: inconsistent period".into()))?;
            let dt =
                u64::try_from(dts[i - p] as i64 + ddt).map_err(|_| PluginError::BadInput("trace metadata: negative interval".into()))?;
            let (kind, peer, bytes) = lit.unwrap_or((o.kind, o.peer, o.bytes));
            if bad_kind(kind, peer) {
                return Err(PluginError::BadInput(format!("trace metadata: unknown event kind {kind} or peer {peer}")));
            }
            t = t.checked_add(dt).ok_or_else(|| PluginError::BadInput("trace metadata: time overflows".into()))?;
            dts.push(dt);
            events.push(Event { t, kind, peer, bytes });
        }
        Ok(format(&events, &m.kinds, &m.peers).into_bytes())
    }
}

/// A synthetic trace of an iterative program: every step sends to and receives from
/// `peers` neighbours with fixed sizes, with timing jitter from `seed` (for tests and
/// the benchmark).
pub fn synthetic(steps: usize, peers: u32, seed: u64) -> String {
    let mut x = seed | 1;
    let mut jitter = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % 2_000
    };
    let mut t = 1_000_000_000u64;
    let mut s = String::new();
    for _ in 0..steps {
        t += 5_000_000 + jitter(); // compute phase
        for p in 1..=peers {
            t += 1_500 + jitter();
            s.push_str(&format!("{t}\tsend\t{p}\t{}\n", 65_536 * p as u64));
        }
        for p in 1..=peers {
            t += 20_000 + jitter();
            s.push_str(&format!("{t}\trecv\t{p}\t{}\n", 65_536 * p as u64));
        }
        t += 3_000 + jitter();
        s.push_str(&format!("{t}\tallreduce\t0\t8\n"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ZstdPlugin;

    #[test]
    fn fft_finds_the_period_of_a_repeating_sequence() {
        let sig: Vec<f64> = (0..900).map(|i| [0.1, 0.7, 0.3, 0.9, 0.5, 0.2, 0.8, 0.4, 0.6][i % 9]).collect();
        assert_eq!(period(&sig), 9);
        let t = synthetic(50, 4, 7);
        let (events, _, _) = parse(&t).unwrap();
        assert_eq!(period(&events.iter().map(signature).collect::<Vec<_>>()), 9);
    }

    #[test]
    fn traces_round_trip_exactly_and_beat_plain_compression() {
        let t = synthetic(2_000, 4, 42);
        let meta = TracePlugin.encode(t.as_bytes()).unwrap();
        assert_eq!(TracePlugin.decode(&meta).unwrap(), t.as_bytes());
        let z = ZstdPlugin::default().encode(t.as_bytes()).unwrap();
        // Timing jitter is incompressible; the rest is the period. Measured: 448,115 B of
        // trace, 65,789 B with zstd -19, 35,148 B as periods.
        assert!(meta.len() * 3 < z.len() * 2, "trace {} bytes vs zstd {} bytes of {}", meta.len(), z.len(), t.len());
        // An irregular event in the middle is kept as it is.
        let mut lines: Vec<String> = t.lines().map(str::to_string).collect();
        let f: Vec<String> = lines[5_000].split('\t').map(str::to_string).collect();
        lines[5_000] = format!("{}\tprobe\t99\t1", f[0]);
        let odd = lines.join("\n") + "\n";
        assert_eq!(TracePlugin.decode(&TracePlugin.encode(odd.as_bytes()).unwrap()).unwrap(), odd.as_bytes());
        // Empty and one-line traces.
        for s in ["", "5\tsend\t1\t10\n"] {
            assert_eq!(TracePlugin.decode(&TracePlugin.encode(s.as_bytes()).unwrap()).unwrap(), s.as_bytes());
        }
    }

    #[test]
    fn malformed_traces_are_refused_with_the_line() {
        let e = TracePlugin.encode(b"5\tsend\t1\t10\n4\tsend\t1\t10\n").unwrap_err().to_string();
        assert!(e.contains("line 2") && e.contains("backwards"), "{e}");
        let e = TracePlugin.encode(b"5\tsend\t1\n").unwrap_err().to_string();
        assert!(e.contains("line 1") && e.contains("3 fields"), "{e}");
        let e = TracePlugin.encode(b"05\tsend\t1\t10\n").unwrap_err().to_string();
        assert!(e.contains("canonical"), "{e}");
    }
}

/// The trace of a real run: gepsea-net's own event trace of a ring exchange.
#[cfg(test)]
mod real_trace {
    use super::*;
    use gepsea_net::{Addr, Port, PortConfig};
    use std::time::Duration;

    #[test]
    fn a_gepsea_net_trace_of_a_ring_exchange_has_the_exchange_as_period_and_round_trips() {
        let ns = format!("pmtrace{}", std::process::id());
        let dir = std::env::temp_dir().join(format!("gepsea-pmtrace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (ranks, steps) = (3u32, 300u64);
        let ports: Vec<Port> = (0..ranks)
            .map(|r| {
                let mut pc = PortConfig::new(&ns, Addr::new(1, r));
                pc.trace = Some(dir.join(format!("{r}.trace")));
                Port::open(pc).unwrap()
            })
            .collect();
        std::thread::scope(|s| {
            for (r, port) in ports.iter().enumerate() {
                s.spawn(move || {
                    let r = r as u32;
                    let (left, right) = (Addr::new(1, (r + ranks - 1) % ranks), Addr::new(1, (r + 1) % ranks));
                    for step in 0..steps {
                        std::thread::sleep(Duration::from_micros(300)); // the compute phase
                        let from_left = port.irecv(Some(left), Some(step), 4096);
                        let from_right = port.irecv(Some(right), Some(step), 4096);
                        let to_left = port.isend(left, step, vec![1u8; 1024]);
                        let to_right = port.isend(right, step, vec![2u8; 2048]);
                        for req in [from_left, from_right, to_left, to_right] {
                            port.wait(req).unwrap();
                        }
                    }
                });
            }
        });
        drop(ports);
        let trace = std::fs::read(dir.join("0.trace")).unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&ns));
        let text = String::from_utf8(trace.clone()).unwrap();
        // Per step: send left, send right (as posted), receive left, receive right (as
        // waited for): exactly four events, the period the FFT must find.
        assert_eq!(text.lines().count() as u64, steps * 4);
        assert_eq!(
            text.lines().take(4).map(|l| l.split('\t').skip(1).collect::<Vec<_>>().join(" ")).collect::<Vec<_>>(),
            ["send 1.2 1024", "send 1.1 2048", "recv 1.2 2048", "recv 1.1 1024"]
        );
        assert_eq!(period_of(&trace).unwrap(), 4);
        let meta = TracePlugin.encode(&trace).unwrap();
        assert_eq!(TracePlugin.decode(&meta).unwrap(), trace);
        eprintln!(
            "real trace: {} bytes, zstd -19 {} bytes, trace plug-in {} bytes",
            trace.len(),
            crate::ZstdPlugin::default().encode(&trace).unwrap().len(),
            meta.len()
        );
    }
}
