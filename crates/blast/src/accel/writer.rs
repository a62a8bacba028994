//! Writing a batch's part and telling the master, on the plug-in's writer threads;
//! with `JobSpec::ship`, shipping the part to the storage site first (ParaMEDIC's
//! overlap, see `crate::ship`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use gepsea_agent::api::Api;
use gepsea_agent::plugin::PluginError;
use gepsea_agent::wire::Dest;

use crate::plan::*;
use crate::report;

use super::plugin::merger_key;
use super::*;

/// A batch's part to write (see [`write_part`]).
pub(crate) struct WriteJob {
    pub(crate) spec: Arc<JobSpec>,
    pub(crate) job: PathBuf,
    pub(crate) batch: usize,
    pub(crate) hsps: Vec<String>,
    pub(crate) done: PartDone,
    pub(crate) services: Arc<dyn gepsea_agent::api::Services>,
    /// Where the statistics runs and the formatter work: in the plug-in's node-local
    /// scratch, since the job directory is shared storage, where their files would
    /// cross the network.
    pub(crate) scratch: PathBuf,
    /// Where this agent keeps the batch's piece (see `crate::parts::piece`) until the
    /// master says at which offset of the output to write it: node-local too.
    pub(crate) piece: PathBuf,
}

/// The nice value of the part writers and of the BLAST+ tools they start (children
/// inherit it). Formatting a part is work the agent takes off the application's hands,
/// and it is bulk: with a core of its own (the paper's spare core) the value changes
/// nothing; on cores shared with the workers it keeps the formatter from delaying
/// what the workers wait on — a task handed out, a fragment staged, a result taken —
/// while it still gets every cycle they leave.
pub const WRITER_NICE: i32 = 19;

/// Parts are written by as many threads as the node has cores (at most 4): one node's
/// merges never hold more, and a batch waits for a writer rather than for a job thread.
pub(crate) fn spawn_writers() -> crossbeam_channel::Sender<WriteJob> {
    let (tx, rx) = crossbeam_channel::unbounded::<WriteJob>();
    let n = std::thread::available_parallelism().map_or(1, |n| n.get()).min(4);
    for i in 0..n {
        let rx = rx.clone();
        let spawned = std::thread::Builder::new().name(format!("blast-writer-{i}")).spawn(move || {
            // On Linux the nice value is per thread: `None` is this writer thread alone.
            if let Err(e) = rustix::process::setpriority_process(None, WRITER_NICE) {
                tracing::debug!("blast plug-in: part writer keeps its priority: {e}");
            }
            for job in rx {
                if let Err(e) = write_part(job) {
                    tracing::warn!("blast plug-in: {e}");
                }
            }
        });
        if let Err(e) = spawned {
            tracing::warn!("blast plug-in: cannot start a part writer: {e}");
        }
    }
    tx
}

/// Writes a batch's part of the report, then tells the job's master (a failure too:
/// the master fails the run with it).
fn write_part(w: WriteJob) -> Result<(), PluginError> {
    let WriteJob { spec, job, batch, hsps, done, services, scratch, piece } = w;
    let write_clock = crate::tools::CpuClock::start();
    let mut part_bytes = 0;
    let mut piece_bytes = None;
    let mut stats_ahead = false;
    let result = (|| -> Result<(), String> {
        std::fs::create_dir_all(&scratch).map_err(|e| e.to_string())?;
        let queries = batch_file(&job, batch);
        let rs = spec.report_spec(&queries, &scratch);
        let part = spec.parts.get(batch).ok_or_else(|| format!("no batch {batch}"))?;
        // Formatted in scratch, then read twice there: into the piece this agent will
        // write at the piece's final offset, and stored once across, compressed, as the
        // part file (what a rerun resumes from, and the master's fallback).
        let local = scratch.join("report");
        // The statistics runs were usually done ahead by the master (`super::ahead`).
        match super::ahead::for_writer(&job, batch, &spec.outfmt, std::time::Duration::from_secs(30)) {
            Some(stats) => {
                stats_ahead = true;
                report::write_with(&rs, &stats, &hsps, &local)
            }
            None => report::write(&rs, &hsps, &local),
        }
        .map_err(|e| e.to_string())?;
        piece_bytes = make_piece(&spec, batch, &local, &piece);
        let tmp = part_tmp(part, "merged");
        part_bytes = std::fs::metadata(&local).map_err(|e| format!("{}: {e}", local.display()))?.len();
        crate::parts::store(&local, &tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, part).map_err(|e| e.to_string())
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&piece);
        piece_bytes = None;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    let done = PartDone {
        error: result.err(),
        write_seconds: write_clock.wall_seconds(),
        write_cpu_seconds: write_clock.seconds(),
        write_thread_cpu_seconds: write_clock.thread_seconds(),
        part_bytes,
        piece_bytes,
        written_unix: crate::trace::unix_now(),
        stats_ahead,
        ..done
    };
    if spec.assign == MergeAssign::Dynamic {
        // The batch no longer weighs on this agent (nothing to do if the scheduler that
        // placed it has changed since).
        let _ = services.release(&merger_key(&spec, batch));
    }
    publish_part(services, spec, job, done).map_err(failed)
}

/// Makes batch `batch`'s piece from its formatted report `local` into `piece`; its
/// length, or `None` (with a warning) if it cannot be made, and the master then writes
/// the batch's share of the output from the part file itself.
pub(crate) fn make_piece(spec: &JobSpec, batch: usize, local: &Path, piece: &Path) -> Option<u64> {
    let made = std::fs::File::create(piece)
        .map_err(|e| format!("{}: {e}", piece.display()))
        .and_then(|w| super::piece_from_part(spec, batch, local, std::io::BufWriter::with_capacity(1 << 20, w)));
    made.map_err(|e| {
        tracing::warn!("blast plug-in: batch {batch}'s piece: {e}; the master writes the batch's share itself");
        let _ = std::fs::remove_file(piece);
    })
    .ok()
}

/// Writes the piece `piece` at `offset` of the output `out` (which the master created),
/// then drops it; returns its length.
pub(crate) fn place_piece(piece: &Path, out: &Path, offset: u64) -> Result<u64, String> {
    use std::io::{Seek, SeekFrom};
    let mut src = std::fs::File::open(piece).map_err(|e| format!("the piece {}: {e}", piece.display()))?;
    // No create, no truncate: the master made the file, and other agents write theirs.
    let mut dst = std::fs::OpenOptions::new().write(true).open(out).map_err(|e| format!("{}: {e}", out.display()))?;
    dst.seek(SeekFrom::Start(offset)).map_err(|e| format!("{}: {e}", out.display()))?;
    // `io::copy` between files uses `copy_file_range` where the file systems allow it.
    let n = std::io::copy(&mut src, &mut dst).map_err(|e| format!("the piece {} into {}: {e}", piece.display(), out.display()))?;
    let _ = std::fs::remove_file(piece);
    Ok(n)
}

/// Tells the job's master that a part is in place. With `JobSpec::ship` (ParaMEDIC's
/// overlap) the part first goes to the storage site, on a thread of its own: the
/// transfer waits on the wide-area link and the storage site, and neither the job
/// thread nor the part writer should (the master ships parts an earlier run left, see
/// `master`). A failed shipment fails the run, as a failed write does.
pub(crate) fn publish_part(
    services: Arc<dyn gepsea_agent::api::Services>,
    spec: Arc<JobSpec>,
    job: PathBuf,
    done: PartDone,
) -> Result<(), String> {
    let topic = topic(&spec.id);
    let publish = move |services: &dyn gepsea_agent::api::Services, done: PartDone| -> Result<(), String> {
        let notice = postcard::to_stdvec(&Notice::Part(done)).map_err(|e| e.to_string())?;
        services.publish(&topic, &notice, Dest::All).map(|_| ()).map_err(|e| e.to_string())
    };
    let Some(ship) = spec.ship.clone().filter(|_| done.error.is_none()) else {
        return publish(&*services, done);
    };
    std::thread::Builder::new()
        .name(format!("blast-ship-{}", done.batch))
        .spawn(move || {
            let done = match ship_part(&*services, &spec, &job, done.batch, &ship) {
                Ok(sh) => PartDone { shipped: Some(Box::new(sh)), ..done },
                Err(e) => PartDone { error: Some(e), ..done },
            };
            if let Err(e) = publish(&*services, done) {
                tracing::warn!("blast plug-in: {e}");
            }
        })
        .map(|_| ())
        .map_err(|e| format!("starting a shipping thread: {e}"))
}

/// The request to ship batch `batch`'s finished part.
pub(crate) fn part_request(
    spec: &JobSpec,
    job: &Path,
    batch: usize,
    ship: &crate::ship::ShipParts,
) -> Result<crate::ship::ShipPart, String> {
    let abs = |p: &Path| std::fs::canonicalize(p).map_err(|e| format!("{}: {e}", p.display()));
    let part = spec.parts.get(batch).ok_or_else(|| format!("no batch {batch}"))?;
    Ok(crate::ship::ShipPart {
        ship: ship.clone(),
        part: abs(part)?,
        queries: abs(&batch_file(job, batch))?,
        of: crate::ship::PartOf {
            job: spec.id.clone(),
            index: batch as u32,
            total: spec.batches.len() as u32,
            outfmt: spec.outfmt.clone(),
        },
    })
}

/// Hands batch `batch`'s finished part to the node's `paramedic` plug-in and waits for
/// the storage site's acknowledgement.
pub(crate) fn ship_part(
    services: &dyn gepsea_agent::api::Services,
    spec: &JobSpec,
    job: &Path,
    batch: usize,
    ship: &crate::ship::ShipParts,
) -> Result<crate::ship::Shipped, String> {
    crate::ship::ship_part(services, part_request(spec, job, batch, ship)?)
        .map_err(|e| format!("shipping part {batch} to the storage site {}: {e}", ship.storage))
}
