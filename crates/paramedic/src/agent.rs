//! Shipping from the compute site's agent: the `paramedic` agent plug-in.
//!
//! An application hands its finished output to its node's agent with a
//! [`ShipRequest`]; the agent encodes it (BLAST metadata, the output compressed, or the
//! output as it is),
//! sends it to the storage site over gepsea-net TCP, encrypted when a key file is given,
//! waits for the storage site's acknowledgement and answers with what it measured
//! ([`Shipped`]). The application process does none of the encoding, networking or
//! waiting on the wide-area link itself; without an agent, [`ship`] does the same work
//! in the calling process.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use gepsea_agent::plugin::{Context, Plugin, PluginError as AgentPluginError, Uses};
use serde::{Deserialize, Serialize};

use std::collections::HashMap;
use std::sync::Arc;

use gepsea_blast::ship::{PartEncoding, ShipOp, ShipPart};
use parking_lot::Mutex;

use crate::choose::{Choice, Kind, Sample, Shared};

use crate::blast::{BlastJob, BlastPlugin};
use crate::plugin::{RawPlugin, ZstdPlugin};
use crate::transfer::{self, Key};

/// The plug-in's name, as applications address it.
pub const PLUGIN: &str = "paramedic";

/// Ship one output file to the storage site.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShipRequest {
    /// The complete output (an absolute path: the agent is another process).
    pub output: PathBuf,
    /// Its name at the storage site.
    pub name: String,
    /// The storage site (`gepsea paramedic serve --listen`).
    pub storage: SocketAddr,
    /// Encrypt under the key in this file (the storage site holds the same key).
    pub key_file: Option<PathBuf>,
    /// What crosses the link.
    pub encoding: Encoding,
}

/// What is shipped for an output: the ends of the trade-off between bytes on the link
/// and work at the two sites (`docs/paramedic.md` says where each wins).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Encoding {
    /// The output itself: most bytes, no work.
    Output,
    /// The output compressed (zstd at this level): fewer bytes, a little work, no
    /// application knowledge.
    Zstd(i32),
    /// ParaMEDIC's BLAST metadata of this search: fewest bytes; the storage site
    /// searches again over the hit subjects.
    Blast(BlastJob),
}

pub use gepsea_blast::ship::Shipped;

/// Shipping failed.
#[derive(Debug, thiserror::Error)]
pub enum ShipError {
    #[error("{0}: {1}")]
    Read(PathBuf, std::io::Error),
    #[error(transparent)]
    Key(#[from] transfer::KeyError),
    #[error("encoding {0}: {1}")]
    Encode(PathBuf, crate::container::ContainerError),
    #[error("sending {name} to {to}: {source}")]
    Transfer { name: String, to: SocketAddr, source: transfer::TransferError },
    #[error("the agent: {0}")]
    Agent(String),
}

/// Encodes and ships in this process.
pub fn ship(req: &ShipRequest) -> Result<Shipped, ShipError> {
    let key = req.key_file.as_deref().map(Key::read).transpose()?;
    let output = std::fs::read(&req.output).map_err(|e| ShipError::Read(req.output.clone(), e))?;
    let started = Instant::now();
    let (plugin, sealed) = seal(&req.encoding, &output);
    let sealed = sealed.map_err(|e| ShipError::Encode(req.output.clone(), e))?;
    let encode_seconds = started.elapsed().as_secs_f64();
    let sent = transfer::send_to(req.storage, None, &req.name, None, &sealed, key.as_ref()).map_err(|source| ShipError::Transfer {
        name: req.name.clone(),
        to: req.storage,
        source,
    })?;
    Ok(measured(plugin, output.len(), sealed.len(), key.is_some(), encode_seconds, &sent))
}

/// Encodes `output` as `encoding` says into a checked container; with the plug-in's
/// name.
fn seal(encoding: &Encoding, output: &[u8]) -> (&'static str, Result<Vec<u8>, crate::container::ContainerError>) {
    match encoding {
        Encoding::Blast(job) => ("blast", crate::container::seal(&BlastPlugin::compute_site(job.clone()), output)),
        Encoding::Zstd(level) => ("zstd", crate::container::seal(&ZstdPlugin { level: *level }, output)),
        Encoding::Output => ("raw", crate::container::seal(&RawPlugin, output)),
    }
}

/// What one object's shipping measured.
fn measured(plugin: &str, output: usize, sealed: usize, encrypted: bool, encode_seconds: f64, sent: &transfer::Sent) -> Shipped {
    Shipped {
        plugin: plugin.into(),
        output_bytes: output as u64,
        bytes: sealed as u64,
        encrypted,
        encode_seconds,
        transfer_seconds: sent.seconds,
        storage_seconds: sent.ack.seconds,
        bytes_written_at_storage: sent.ack.result.as_ref().copied().unwrap_or(0),
        reconnects: sent.reconnects,
        frames_resent: sent.frames_resent,
        by_agent: false,
        objects: 1,
        acked_unix: unix_now(),
        chosen: Default::default(),
        reason: None,
    }
}

fn unix_now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// Encodes and ships one part of a report in this process (see [`gepsea_blast::ship`]):
/// the storage site joins the parts of `req.of.job` into the report `req.ship.name`.
/// With [`PartEncoding::Auto`], `chooser` (the model of this storage site's link)
/// picks the encoding and learns from the transfer.
pub fn ship_part(req: &ShipPart, chooser: Option<&dyn LinkModel>) -> Result<Shipped, ShipError> {
    let ship = &req.ship;
    let key = ship.key_file.as_deref().map(Key::read).transpose()?;
    // A merged batch's part is stored compressed (`gepsea_blast::parts::store`).
    let output = gepsea_blast::parts::read(&req.part).map_err(|e| ShipError::Read(req.part.clone(), e))?;
    let started = Instant::now();
    let (encoding, choice) = match (ship.encoding, chooser) {
        (PartEncoding::Auto, Some(c)) => {
            let (choice, probe) = c.choose(output.len() as u64);
            let encoding = match choice.kind {
                Kind::Output => PartEncoding::Output,
                Kind::Zstd => PartEncoding::Zstd(crate::plugin::ZSTD_LEVEL),
                Kind::Metadata => PartEncoding::Metadata,
            };
            (encoding, Some((choice, probe)))
        }
        (PartEncoding::Auto, None) => (PartEncoding::Zstd(crate::plugin::ZSTD_LEVEL), None),
        (e, _) => (e, None),
    };
    let encoding = match encoding {
        PartEncoding::Auto => unreachable!("chosen above"),
        PartEncoding::Metadata => Encoding::Blast(BlastJob {
            db_dir: ship.db.clone(),
            query: req.queries.clone(),
            outfmt: req.of.outfmt.clone(),
            blast_args: ship.blast_args.clone(),
        }),
        PartEncoding::Zstd(level) => Encoding::Zstd(level),
        PartEncoding::Output => Encoding::Output,
    };
    let (plugin, sealed) = seal(&encoding, &output);
    let sealed = sealed.map_err(|e| {
        // A probe that never left still releases its claim.
        if let (Some(c), Some((_, probe))) = (chooser, &choice) {
            c.finished(*probe, None);
        }
        ShipError::Encode(req.part.clone(), e)
    })?;
    let encode_seconds = started.elapsed().as_secs_f64();
    let sent = transfer::send_to(ship.storage, None, &ship.name, Some(&req.of), &sealed, key.as_ref())
        .map_err(|source| ShipError::Transfer { name: format!("{} part {}", ship.name, req.of.index), to: ship.storage, source });
    let choice = choice.map(|(choice, probe)| {
        if let Some(c) = chooser {
            c.finished(
                probe,
                sent.as_ref().ok().map(|sent| Sample {
                    kind: choice.kind,
                    output_bytes: output.len() as u64,
                    bytes: sealed.len() as u64,
                    encode_seconds,
                    transfer_seconds: sent.seconds,
                    storage_seconds: sent.ack.seconds,
                }),
            );
        }
        choice
    });
    let sent = sent?;
    Ok(Shipped {
        chosen: choice.as_ref().map(|c| [(c.kind.name().to_string(), 1)].into()).unwrap_or_default(),
        reason: choice.map(|c| c.why),
        ..measured(plugin, output.len(), sealed.len(), key.is_some(), encode_seconds, &sent)
    })
}

/// Asks the node's agent (through `client`) to ship.
pub fn ship_via(client: &gepsea_client::Client, req: &ShipRequest) -> Result<Shipped, ShipError> {
    let body = postcard::to_stdvec(&ShipOp::Whole(req)).expect("serialisable");
    // The wide-area link may be slow and regeneration long: wait as long as it takes.
    let reply = client
        .call_timeout(gepsea_agent::wire::Op::Plugin { name: PLUGIN.into(), body }, Duration::from_secs(24 * 3600))
        .map_err(|e| ShipError::Agent(e.to_string()))?;
    let gepsea_agent::wire::Reply::Data(bytes) = reply else {
        return Err(ShipError::Agent(format!("unexpected reply {reply:?}")));
    };
    let r: Result<Shipped, String> = postcard::from_bytes(&bytes).map_err(|e| ShipError::Agent(e.to_string()))?;
    r.map_err(ShipError::Agent)
}

/// `--ship auto`'s model of one storage site's link, as [`ship_part`] consults it.
pub trait LinkModel {
    /// The encoding for a part of `output_bytes` bytes, and whether this choice claimed
    /// the metadata probe (handed back to [`LinkModel::finished`]).
    fn choose(&self, output_bytes: u64) -> (Choice, bool);
    /// The transfer is over: `sample` is what it measured (`None`: it failed).
    fn finished(&self, probe: bool, sample: Option<Sample>);
}

/// One process's own model (a test's, or an agent's should its board fail).
#[derive(Default)]
pub struct LocalLink(Mutex<Shared>);

impl LinkModel for LocalLink {
    fn choose(&self, output_bytes: u64) -> (Choice, bool) {
        self.0.lock().choose(output_bytes, unix_now())
    }
    fn finished(&self, probe: bool, sample: Option<Sample>) {
        self.0.lock().finished(sample, probe);
    }
}

/// The model every agent of the job shares for a storage site: a [`Shared`] on the
/// agents' bulletin board under `paramedic/link/<address>`, read and updated with
/// compare-and-swap (a part takes seconds; two board operations are noise beside it).
/// If the board fails, the agent's own model stands in, with a warning.
pub struct BoardLink<'a> {
    services: &'a dyn gepsea_agent::api::Services,
    key: String,
    local: &'a LocalLink,
}

impl<'a> BoardLink<'a> {
    pub fn new(services: &'a dyn gepsea_agent::api::Services, storage: SocketAddr, local: &'a LocalLink) -> Self {
        BoardLink { services, key: format!("paramedic/link/{storage}"), local }
    }

    /// Applies `change` (its result, and whether it changed the model) to the shared
    /// model until the write lands; returns the result, or the board's error.
    fn update<T>(&self, mut change: impl FnMut(&mut Shared) -> (T, bool)) -> Result<T, gepsea_agent::api::ApiError> {
        use gepsea_agent::api::{Api, Cas};
        loop {
            let (version, mut shared) = match self.services.board_get(&self.key)? {
                Some(v) => (v.version, postcard::from_bytes(&v.value).unwrap_or_default()),
                None => (0, Shared::default()),
            };
            let (out, changed) = change(&mut shared);
            if !changed {
                return Ok(out);
            }
            let bytes = postcard::to_stdvec(&shared).expect("the model serialises");
            if let Cas::Written(_) = self.services.board_cas(&self.key, version, &bytes)? {
                return Ok(out);
            }
        }
    }
}

impl LinkModel for BoardLink<'_> {
    fn choose(&self, output_bytes: u64) -> (Choice, bool) {
        let now = unix_now();
        self.update(|shared| {
            let (choice, probe) = shared.choose(output_bytes, now);
            ((choice, probe), probe)
        })
        .unwrap_or_else(|e| {
            tracing::warn!("--ship auto: the bulletin board failed ({e}); this agent chooses from its own measurements");
            self.local.choose(output_bytes)
        })
    }
    fn finished(&self, probe: bool, sample: Option<Sample>) {
        if let Err(e) = self.update(|shared| {
            shared.finished(sample, probe);
            ((), true)
        }) {
            tracing::warn!("--ship auto: the bulletin board failed ({e}); the measurement stays with this agent");
        }
        // The agent's own model learns too, should the board fail later. (A probe this
        // agent claimed locally while the board failed releases the board's claim if
        // the board is back: at worst one more probe.)
        self.local.finished(probe, sample);
    }
}

/// The agent plug-in (see the module docs). For `--ship auto` the agents of a job share
/// a model of the link to each storage site on their bulletin board ([`BoardLink`]),
/// which every part any of them ships refines; each agent also keeps its own.
#[derive(Default)]
pub struct ShipPlugin {
    links: Mutex<HashMap<SocketAddr, Arc<LocalLink>>>,
}

impl Plugin for ShipPlugin {
    fn name(&self) -> &str {
        PLUGIN
    }
    fn uses(&self) -> &[Uses] {
        &[Uses::Compression, Uses::DataStreaming, Uses::BulletinBoard]
    }
    fn handle(&self, ctx: &Context<'_>, request: &[u8]) -> Result<Vec<u8>, AgentPluginError> {
        let req: ShipOp<ShipRequest> = postcard::from_bytes(request).map_err(|e| AgentPluginError::BadRequest(e.to_string()))?;
        let r = match &req {
            ShipOp::Whole(req) => ship(req),
            ShipOp::Part(req) => {
                let local = self.links.lock().entry(req.ship.storage).or_default().clone();
                ship_part(req, Some(&BoardLink::new(ctx.services, req.ship.storage, &local)))
            }
        };
        let r = r.map(|s| Shipped { by_agent: true, ..s }).map_err(|e| e.to_string());
        Ok(postcard::to_stdvec(&r).expect("serialisable"))
    }
}
