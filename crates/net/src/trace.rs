//! An event trace of a port's traffic: one line per message the application sent or
//! received, `<time ns>\t<kind>\t<peer>\t<bytes>`, where the time is nanoseconds since
//! the Unix epoch (taken once when the port opens, then advanced by the monotonic
//! clock, so a trace never goes backwards), the kind is `send`, `recv`, `sys-send` or
//! `sys-recv` (system channel), and the peer is `node.port`.
//!
//! Enabled per port with [`crate::port::PortConfig::trace`], or for every port of a
//! process by `GEPSEA_NET_TRACE=<dir>` (one file per port,
//! `<namespace>-<node>-<port>.trace`). This is the input of ParaMEDIC's trace
//! plug-in: the trace of an iterative program repeats with its iterations.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use parking_lot::Mutex;

use crate::frame::Addr;

/// Writes a port's trace (buffered; flushed when dropped).
pub struct Tracer {
    out: Mutex<std::io::BufWriter<std::fs::File>>,
    origin: Instant,
    origin_ns: u64,
}

impl Tracer {
    pub fn create(path: &Path) -> std::io::Result<Tracer> {
        let origin_ns = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        Ok(Tracer { out: Mutex::new(std::io::BufWriter::new(std::fs::File::create(path)?)), origin: Instant::now(), origin_ns })
    }

    pub fn record(&self, kind: &str, peer: Addr, bytes: usize) {
        let mut out = self.out.lock();
        // Read the clock under the lock, so lines are in time order across threads.
        let t = self.origin_ns + self.origin.elapsed().as_nanos() as u64;
        let _ = writeln!(out, "{t}\t{kind}\t{}.{}\t{bytes}", peer.node, peer.port);
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        let _ = self.out.lock().flush();
    }
}
