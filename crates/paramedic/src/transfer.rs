//! Shipping metadata from the compute site to the storage site over gepsea-net TCP.
//!
//! One object = a header message (name, length, SHA-256 of the container, and where
//! to send the acknowledgement) and the container itself on the normal channel, whose
//! rendezvous lands it in a buffer of exactly its size. gepsea-net makes the link
//! survive a cut connection: it reconnects and resends only the frames the storage site
//! had not acknowledged, so a transfer resumes where it broke instead of starting over.
//! The storage site checks the SHA-256 end to end, then the container's own checks,
//! regenerates, writes the output to a temporary file renamed into place, and answers
//! with an [`Ack`] that says what was written or why nothing was.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use gepsea_net::{Addr, NetError, Port};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::container::{self, ContainerError};
use crate::plugin::MetadataPlugin;

const TAG_HEADER: u64 = 0x504d_0001;
const TAG_BODY: u64 = 0x504d_0002;
const TAG_ACK: u64 = 0x504d_0003;

/// The storage site's port (node id chosen far from compute nodes' ids).
pub const STORAGE: Addr = Addr::new(0x7fff_0000, 0);

#[derive(Debug, Serialize, Deserialize)]
struct Header {
    name: String,
    len: u64,
    sha256: [u8; 32],
    /// Where the sender listens, for the acknowledgement.
    reply_to: Option<SocketAddr>,
}

/// The storage site's answer for one object.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ack {
    pub name: String,
    /// Bytes of output written, or why nothing was.
    pub result: Result<u64, String>,
}

/// A transfer failed.
#[derive(Debug, thiserror::Error)]
pub enum TransferError {
    #[error("network: {0}")]
    Net(#[from] NetError),
    #[error("object name {0:?} is not a plain file name")]
    BadName(String),
    #[error("malformed message from {from:?}: {reason}")]
    Malformed { from: Addr, reason: String },
    #[error("the storage site refused {name}: {reason}")]
    Refused { name: String, reason: String },
}

fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

/// Sends one container to the storage site and waits for its acknowledgement.
pub fn send(port: &Port, to: Addr, name: &str, container: &[u8], reply_to: Option<SocketAddr>) -> Result<Ack, TransferError> {
    if !plain_name(name) {
        return Err(TransferError::BadName(name.into()));
    }
    let header = Header { name: name.into(), len: container.len() as u64, sha256: Sha256::digest(container).into(), reply_to };
    let ack = port.irecv(Some(to), Some(TAG_ACK), 1 << 16);
    port.send(to, TAG_HEADER, postcard::to_stdvec(&header).expect("serialisable"))?;
    port.send(to, TAG_BODY, container.to_vec())?;
    let m = port.wait(ack)?;
    let ack: Ack = match m {
        gepsea_net::Completion::Received(msg) => postcard::from_bytes(&msg.data).map_err(|e| TransferError::Malformed { from: to, reason: e.to_string() })?,
        other => return Err(TransferError::Malformed { from: to, reason: format!("unexpected completion {other:?}") }),
    };
    match &ack.result {
        Ok(_) => Ok(ack),
        Err(reason) => Err(TransferError::Refused { name: ack.name.clone(), reason: reason.clone() }),
    }
}

/// What the storage site does with a received object.
pub trait Sink {
    /// Regenerates and writes the object; the `Ok` value is the bytes written.
    fn store(&mut self, name: &str, container: &[u8]) -> Result<u64, String>;
}

/// Regenerates each object with the plug-in named in its container and writes the
/// output as `dir/<name>`.
pub struct RegenerateInto<F: Fn(&str) -> Option<Box<dyn MetadataPlugin>>> {
    pub dir: PathBuf,
    pub plugins: F,
}

impl<F: Fn(&str) -> Option<Box<dyn MetadataPlugin>>> Sink for RegenerateInto<F> {
    fn store(&mut self, name: &str, data: &[u8]) -> Result<u64, String> {
        let (plugin_name, _) = container::unwrap(data).map_err(|e| e.to_string())?;
        let plugin = (self.plugins)(&plugin_name).ok_or_else(|| format!("no plug-in {plugin_name:?} at the storage site"))?;
        let output = container::open(plugin.as_ref(), data).map_err(|e: ContainerError| e.to_string())?;
        write_atomically(&self.dir.join(name), &output).map_err(|e| e.to_string())?;
        Ok(output.len() as u64)
    }
}

/// Writes through a temporary file renamed into place.
pub fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let tmp = dir.join(format!(".{}.gepsea-tmp{}", path.file_name().unwrap_or_default().to_string_lossy(), std::process::id()));
    std::fs::write(&tmp, data)?;
    std::fs::rename(&tmp, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// Serves objects until `count` have been handled (`None`: forever); calls `done` with
/// every acknowledgement sent.
pub fn serve(port: &Port, sink: &mut dyn Sink, count: Option<usize>, mut done: impl FnMut(&Ack)) -> Result<(), TransferError> {
    let mut handled = 0;
    while count.is_none_or(|c| handled < c) {
        let h = port.recv(None, Some(TAG_HEADER), 1 << 16)?;
        let from = h.src;
        let header: Header = postcard::from_bytes(&h.data).map_err(|e| TransferError::Malformed { from, reason: e.to_string() })?;
        if let Some(a) = header.reply_to {
            port.add_route(from, a);
        }
        let body = port.recv(Some(from), Some(TAG_BODY), header.len as usize)?;
        let result = if !plain_name(&header.name) {
            Err(format!("object name {:?} is not a plain file name", header.name))
        } else if body.data.len() as u64 != header.len {
            Err(format!("{} bytes arrived, {} announced", body.data.len(), header.len))
        } else if Sha256::digest(&body.data).as_slice() != header.sha256 {
            Err("SHA-256 of the received object differs from the sender's: damaged in transit".to_string())
        } else {
            sink.store(&header.name, &body.data)
        };
        let ack = Ack { name: header.name, result };
        port.send(from, TAG_ACK, postcard::to_stdvec(&ack).expect("serialisable"))?;
        done(&ack);
        handled += 1;
    }
    Ok(())
}

/// A compute-site port for talking to the storage site at `storage` (TCP), listening
/// on `listen` for the acknowledgements.
pub fn compute_port(namespace: &str, node: u32, listen: SocketAddr, storage: SocketAddr) -> Result<Port, NetError> {
    let mut pc = gepsea_net::PortConfig::new(namespace, Addr::new(node, 1));
    pc.listen = Some(listen);
    pc.routes.insert(STORAGE, storage);
    pc.reconnect_timeout = Duration::from_secs(60);
    Port::open(pc)
}

/// The storage site's port, listening on `listen`.
pub fn storage_port(namespace: &str, listen: SocketAddr) -> Result<Port, NetError> {
    let mut pc = gepsea_net::PortConfig::new(namespace, STORAGE);
    pc.listen = Some(listen);
    pc.reconnect_timeout = Duration::from_secs(60);
    Port::open(pc)
}
