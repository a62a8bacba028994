//! Shipping each batch's part of a report to a distant storage site as soon as the part
//! is final (ParaMEDIC's overlap of search, transfer and regeneration).
//!
//! With `gepsea search --storage-site` in agent mode, the agent that writes a batch's
//! part hands it at once to its own node's `paramedic` plug-in ([`PLUGIN`]), which
//! encodes it (the part itself, compressed, or as ParaMEDIC metadata of the batch's
//! queries), sends it and waits for the storage site's acknowledgement. The storage site
//! regenerates parts as they come and joins them into the report, in order, renaming it
//! into place when the last one is in. Every compute node ships its own batches, so the
//! transfer and the regeneration go on while the search does, instead of starting once
//! the whole output exists.
//!
//! This crate only defines the request and the answer: the plug-in lives in
//! `gepsea-paramedic`, which depends on this crate, and is reached by name through the
//! agent, so the two crates stay one-directional.

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The plug-in that ships (registered by every `gepsea agent`).
pub const PLUGIN: &str = "paramedic";

/// Where and how a search's parts go (in the job's spec, so every agent knows).
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct ShipParts {
    /// The storage site (`gepsea agent --storage-listen` or `gepsea paramedic serve`).
    pub storage: SocketAddr,
    /// Encrypt under the key in this file (absolute: agents read it).
    pub key_file: Option<PathBuf>,
    pub encoding: PartEncoding,
    /// The report's name at the storage site.
    pub name: String,
    /// The gepsea database directory (absolute), for metadata encoding.
    pub db: PathBuf,
    /// The BLAST+ options as the user gave them (they are in the metadata).
    pub blast_args: Vec<String>,
}

/// What crosses the link for a part.
#[derive(Clone, Copy, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub enum PartEncoding {
    /// The part itself.
    Output,
    /// The part compressed with zstd at this level.
    Zstd(i32),
    /// ParaMEDIC metadata: the batch's queries and the subjects they hit.
    Metadata,
    /// Per part, whichever of the three the measured link and costs say is fastest
    /// (`paramedic::choose`).
    Auto,
}

/// One part of a report, as the storage site places it.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct PartOf {
    /// The search (its job id): parts of different searches never mix.
    pub job: String,
    pub index: u32,
    pub total: u32,
    /// The report's `-outfmt` (how the parts are joined).
    pub outfmt: String,
}

/// A request to ship one part.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShipPart {
    pub ship: ShipParts,
    /// The finished part (absolute path).
    pub part: PathBuf,
    /// The batch's query file (absolute path), for metadata encoding.
    pub queries: PathBuf,
    pub of: PartOf,
}

/// A request to the `paramedic` plug-in: a whole output (`W`, the plug-in's own request
/// type) or one part. Generic so that this crate can send a part without knowing the
/// other request; postcard encodes `Part` the same whatever `W` is.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum ShipOp<W> {
    Whole(W),
    // Boxed: the enum stays small whatever `W` is (postcard encodes a box as its
    // contents).
    Part(Box<ShipPart>),
}

/// What shipping measured (one object; or, summed by the master, every part).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Shipped {
    /// `blast` (metadata), `zstd` (compressed output) or `raw` (the output itself).
    pub plugin: String,
    pub output_bytes: u64,
    /// Bytes sent (the container: metadata or output, plus its framing).
    pub bytes: u64,
    pub encrypted: bool,
    pub encode_seconds: f64,
    /// From opening the connection to the storage site's acknowledgement.
    pub transfer_seconds: f64,
    /// The storage site's share of that, once the object had arrived: decryption,
    /// checks, regeneration, writing.
    pub storage_seconds: f64,
    pub bytes_written_at_storage: u64,
    pub reconnects: u64,
    pub frames_resent: u64,
    /// Whether the compute site's agent shipped it (rather than the process itself).
    pub by_agent: bool,
    /// Objects shipped: 1 for a whole output, else the parts.
    #[serde(default)]
    pub objects: u64,
    /// When the last acknowledgement came (seconds since the Unix epoch).
    #[serde(default)]
    pub acked_unix: f64,
    /// `--ship auto`: objects shipped per encoding (`raw`, `zstd`, `blast`).
    #[serde(default)]
    pub chosen: std::collections::BTreeMap<String, u64>,
    /// `--ship auto`: why the last object went the way it did.
    #[serde(default)]
    pub reason: Option<String>,
}

impl Shipped {
    /// Adds another object's figures (times are summed: they are work, not wall time).
    pub fn add(&mut self, o: &Shipped) {
        if self.plugin.is_empty() {
            self.plugin = o.plugin.clone();
        } else if self.plugin != o.plugin {
            // `--ship auto` sent parts different ways (`chosen` says how many each).
            self.plugin = "mixed".into();
        }
        self.output_bytes += o.output_bytes;
        self.bytes += o.bytes;
        self.encrypted |= o.encrypted;
        self.encode_seconds += o.encode_seconds;
        self.transfer_seconds += o.transfer_seconds;
        self.storage_seconds += o.storage_seconds;
        self.bytes_written_at_storage += o.bytes_written_at_storage;
        self.reconnects += o.reconnects;
        self.frames_resent += o.frames_resent;
        self.by_agent |= o.by_agent;
        self.objects += o.objects;
        if o.acked_unix >= self.acked_unix {
            self.reason = o.reason.clone().or(self.reason.take());
        }
        self.acked_unix = self.acked_unix.max(o.acked_unix);
        for (k, n) in &o.chosen {
            *self.chosen.entry(k.clone()).or_default() += n;
        }
    }
}

/// Asks the `paramedic` plug-in of the agent behind `services` to ship a part; waits
/// for the storage site's acknowledgement.
pub fn ship_part(services: &dyn gepsea_agent::api::Services, req: ShipPart) -> Result<Shipped, String> {
    let reply = services.call(part_op(req)).map_err(|e| format!("the agent's {PLUGIN} plug-in: {e}"))?;
    answer(reply)
}

/// The agent operation that asks its `paramedic` plug-in to ship a part (started
/// asynchronously by the master, see [`answer`]).
pub(crate) fn part_op(req: ShipPart) -> gepsea_agent::wire::Op {
    let body = postcard::to_stdvec(&ShipOp::<()>::Part(Box::new(req))).expect("serialisable");
    gepsea_agent::wire::Op::Plugin { name: PLUGIN.into(), body }
}

/// What the plug-in answered to [`part_op`].
pub(crate) fn answer(reply: gepsea_agent::wire::Reply) -> Result<Shipped, String> {
    match reply {
        gepsea_agent::wire::Reply::Data(d) => {
            postcard::from_bytes::<Result<Shipped, String>>(&d).map_err(|e| format!("the {PLUGIN} plug-in's answer: {e}"))?
        }
        r => Err(format!("the {PLUGIN} plug-in answered {r:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_part_request_decodes_whatever_the_whole_request_type() {
        let req = ShipPart {
            ship: ShipParts {
                storage: "10.0.0.9:7500".parse().unwrap(),
                key_file: None,
                encoding: PartEncoding::Zstd(3),
                name: "hits.txt".into(),
                db: "/db".into(),
                blast_args: vec!["-evalue".into(), "1e-5".into()],
            },
            part: "/w/part-3".into(),
            queries: "/w/batch3.fasta".into(),
            of: PartOf { job: "j".into(), index: 3, total: 7, outfmt: "0".into() },
        };
        let bytes = postcard::to_stdvec(&ShipOp::<()>::Part(Box::new(req.clone()))).unwrap();
        match postcard::from_bytes::<ShipOp<(String, u64)>>(&bytes).unwrap() {
            ShipOp::Part(p) => {
                assert_eq!(p.of, req.of);
                assert_eq!(p.ship, req.ship);
                assert_eq!(p.part, req.part);
            }
            ShipOp::Whole(w) => panic!("decoded as a whole output {w:?}"),
        }
    }

    #[test]
    fn sums_add_work_and_keep_the_last_acknowledgement() {
        let one = Shipped {
            plugin: "blast".into(),
            output_bytes: 10,
            bytes: 2,
            objects: 1,
            acked_unix: 5.0,
            encode_seconds: 0.5,
            ..Default::default()
        };
        let two = Shipped {
            plugin: "blast".into(),
            output_bytes: 20,
            bytes: 3,
            objects: 1,
            acked_unix: 4.0,
            encode_seconds: 0.25,
            by_agent: true,
            ..Default::default()
        };
        let mut s = Shipped::default();
        s.add(&one);
        s.add(&two);
        assert_eq!((s.plugin.as_str(), s.output_bytes, s.bytes, s.objects, s.by_agent), ("blast", 30, 5, 2, true));
        assert_eq!((s.acked_unix, s.encode_seconds), (5.0, 0.75));
        s.add(&Shipped { plugin: "zstd".into(), objects: 1, ..Default::default() });
        assert_eq!((s.plugin.as_str(), s.objects), ("mixed", 3));
    }
}
