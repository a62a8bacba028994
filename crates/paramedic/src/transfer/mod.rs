//! Shipping metadata (or any object) from the compute site to the storage site over
//! gepsea-net TCP.
//!
//! One object = a header message (name, length, SHA-256 of the container, and where
//! to send the acknowledgement) and the container itself on the normal channel, whose
//! rendezvous lands it in a buffer of exactly its size. gepsea-net makes the link
//! survive a cut connection: it reconnects and resends only the frames the storage site
//! had not acknowledged, so a transfer resumes where it broke instead of starting over.
//! The storage site checks the SHA-256 end to end, then the container's own checks,
//! regenerates, writes the output to a temporary file renamed into place, and answers
//! with an [`Ack`] that says what was written or why nothing was.
//!
//! Optional encryption ([`Key`]): a Noise `NNpsk0` session per object (`snow`). The
//! header carries the first handshake message, whose payload (name, length, SHA-256) is
//! already encrypted under the pre-shared key; the storage site answers with the second
//! one, and the body and the acknowledgement travel as ChaCha20-Poly1305 messages of
//! at most 64 KiB. The cost is one round trip and ≈0.5 CPU-s per GB per side. The
//! encryption sits above gepsea-net's reliability, so a resumed connection continues
//! the same session: frames are resent as ciphertext, never re-encrypted. Without a
//! key, objects travel in clear; a site with a key refuses them (and the reverse).

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use gepsea_net::{Addr, NetError, Port};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use gepsea_blast::ship::PartOf;

mod noise;

#[cfg(test)]
use noise::NOISE_CHUNK;
use noise::{open_body, random_bytes, seal_body, sealed_len, NOISE_MAX, NOISE_TAG};
pub use noise::{Key, KeyError};

const TAG_HEADER: u64 = 0x504d_0001;
const TAG_BODY: u64 = 0x504d_0002;
const TAG_ACK: u64 = 0x504d_0003;
const TAG_HANDSHAKE: u64 = 0x504d_0004;

/// The storage site's port (node id chosen far from compute nodes' ids).
pub const STORAGE: Addr = Addr::new(0x7fff_0000, 0);

/// What is sent about an object before its bytes.
#[derive(Debug, Serialize, Deserialize)]
struct Object {
    name: String,
    /// A part of the report `name` (the storage site joins the parts), or the whole.
    part: Option<PartOf>,
    len: u64,
    sha256: [u8; 32],
}

/// The first message of a transfer.
#[derive(Debug, Serialize, Deserialize)]
struct Header {
    /// Where the sender listens, for the answers.
    reply_to: Option<SocketAddr>,
    /// Unencrypted transfer: the object in clear.
    object: Option<Object>,
    /// Encrypted transfer: the first handshake message, whose payload is the object,
    /// already encrypted under the pre-shared key.
    noise: Option<Vec<u8>>,
}

/// The storage site's answer for one object.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
pub struct Ack {
    pub name: String,
    /// Bytes of output written, or why nothing was.
    pub result: Result<u64, String>,
    /// Seconds the storage site spent, once the object had arrived, decrypting,
    /// checking, regenerating and writing it.
    pub seconds: f64,
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
    #[error("no route to the storage site {to}: {source}")]
    NoRoute { to: SocketAddr, source: std::io::Error },
    #[error("the storage site {to} could not be reached: {reason} (is `gepsea paramedic serve`, or an agent with --storage-listen, running there?)")]
    Unreachable { to: SocketAddr, reason: String },
    #[error("{0}")]
    Io(String),
}

fn plain_name(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains('/') && !name.contains('\0')
}

fn received(from: Addr, c: gepsea_net::Completion) -> Result<gepsea_net::Message, TransferError> {
    match c {
        gepsea_net::Completion::Received(msg) => Ok(msg),
        other => Err(TransferError::Malformed { from, reason: format!("unexpected completion {other:?}") }),
    }
}

fn parse_ack(from: Addr, bytes: &[u8]) -> Result<Ack, TransferError> {
    let ack: Ack = postcard::from_bytes(bytes).map_err(|e| TransferError::Malformed { from, reason: e.to_string() })?;
    match &ack.result {
        Ok(_) => Ok(ack),
        Err(reason) => Err(TransferError::Refused { name: ack.name.clone(), reason: reason.clone() }),
    }
}

/// Sends one container to the storage site and waits for its acknowledgement;
/// encrypted and authenticated when `key` is given (the storage site must hold the
/// same key).
pub fn send(
    port: &Port,
    to: Addr,
    name: &str,
    part: Option<&PartOf>,
    container: &[u8],
    reply_to: Option<SocketAddr>,
    key: Option<&Key>,
) -> Result<Ack, TransferError> {
    if !plain_name(name) {
        return Err(TransferError::BadName(name.into()));
    }
    let object = Object { name: name.into(), part: part.cloned(), len: container.len() as u64, sha256: Sha256::digest(container).into() };
    let malformed = |reason: String| TransferError::Malformed { from: to, reason };
    // Before a session exists the storage site can only answer with a refusal in
    // clear (or, encrypted, with its handshake message).
    let first_answer = port.irecv(Some(to), None, 1 << 16);
    let Some(key) = key else {
        port.send(to, TAG_HEADER, postcard::to_stdvec(&Header { reply_to, object: Some(object), noise: None }).expect("serialisable"))?;
        port.send(to, TAG_BODY, container.to_vec())?;
        let m = received(to, port.wait(first_answer)?)?;
        return parse_ack(to, &m.data);
    };
    let mut hs = key.handshake(true);
    let mut msg = vec![0u8; NOISE_MAX];
    let n = hs.write_message(&postcard::to_stdvec(&object).expect("serialisable"), &mut msg).map_err(|e| malformed(e.to_string()))?;
    msg.truncate(n);
    port.send(to, TAG_HEADER, postcard::to_stdvec(&Header { reply_to, object: None, noise: Some(msg) }).expect("serialisable"))?;
    let m = received(to, port.wait(first_answer)?)?;
    if m.tag == TAG_ACK {
        return parse_ack(to, &m.data);
    }
    if m.tag != TAG_HANDSHAKE {
        return Err(malformed(format!("expected the handshake, got tag {:#x}", m.tag)));
    }
    hs.read_message(&m.data, &mut [0u8; NOISE_MAX])
        .map_err(|e| malformed(format!("handshake: {e} (the storage site does not hold this key)")))?;
    let mut t = hs.into_transport_mode().map_err(|e| malformed(e.to_string()))?;
    let ack = port.irecv(Some(to), Some(TAG_ACK), 1 << 16);
    port.send(to, TAG_BODY, seal_body(&mut t, container))?;
    let m = received(to, port.wait(ack)?)?;
    let mut plain = vec![0u8; m.data.len()];
    let n = t.read_message(&m.data, &mut plain).map_err(|e| malformed(format!("acknowledgement does not decrypt: {e}")))?;
    parse_ack(to, &plain[..n])
}

/// What [`send_to`] measured.
#[derive(Debug)]
pub struct Sent {
    pub ack: Ack,
    /// From opening the port to the acknowledgement.
    pub seconds: f64,
    pub reconnects: u64,
    pub frames_resent: u64,
}

/// Sends one container to the storage site at `storage` from a port of its own,
/// listening on `from` (default: this host's address on the route there); the port and
/// its runtime directory are gone when this returns.
pub fn send_to(
    storage: SocketAddr,
    from: Option<std::net::IpAddr>,
    name: &str,
    part: Option<&PartOf>,
    container: &[u8],
    key: Option<&Key>,
) -> Result<Sent, TransferError> {
    static PORTS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let ip = match from {
        Some(ip) => ip,
        None => local_ip_towards(storage).map_err(|source| TransferError::NoRoute { to: storage, source })?,
    };
    if let Some(e) = refused(storage) {
        return Err(TransferError::Unreachable { to: storage, reason: format!("connect to {storage}: {e}") });
    }
    let pid = std::process::id();
    let ns = format!("paramedic-send{pid}-{}", PORTS.fetch_add(1, std::sync::atomic::Ordering::Relaxed));
    let started = std::time::Instant::now();
    let port = compute_port(&ns, sender_id(), SocketAddr::new(ip, 0), storage)?;
    let sent = send(&port, STORAGE, name, part, container, port.listen_addr(), key);
    let st = port.stats();
    drop(port);
    let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(&ns));
    let sent = sent.map_err(|e| site_named(e, storage));
    Ok(Sent {
        ack: sent?,
        seconds: started.elapsed().as_secs_f64(),
        reconnects: st.connections_established.saturating_sub(1),
        frames_resent: st.frames_replayed,
    })
}

/// How long connections refused outright are tried again before the storage site
/// counts as not running: a site starting up listens well within it.
const REFUSED_FOR: Duration = Duration::from_secs(5);

/// The refusal, if every connection to `storage` for [`REFUSED_FOR`] is refused:
/// nothing listens there (a wrong port, a site not started), and the transfer says so
/// now instead of after its port's 60 s reconnect timeout (a mistyped port used to
/// wait a minute). A connection that gets no answer at all (a host down, a firewall
/// dropping it) is left to that timeout: over a wide-area link it may only be slow.
/// The probe connects and closes; the storage site ignores such a connection.
fn refused(storage: SocketAddr) -> Option<std::io::Error> {
    let deadline = std::time::Instant::now() + REFUSED_FOR;
    loop {
        match std::net::TcpStream::connect_timeout(&storage, REFUSED_FOR) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                if std::time::Instant::now() >= deadline {
                    return Some(e);
                }
                std::thread::sleep(Duration::from_millis(200));
            }
            _ => return None,
        }
    }
}

/// A link failure names the storage site by its internal port address (`STORAGE`):
/// say which site it was, as the user gave it.
fn site_named(e: TransferError, storage: SocketAddr) -> TransferError {
    match e {
        TransferError::Net(NetError::PeerFailed { peer, reason }) if peer == STORAGE => {
            TransferError::Unreachable { to: storage, reason: reason.replace(&STORAGE.to_string(), &storage.to_string()) }
        }
        e => e,
    }
}

/// A node id for one sending port: random, so that senders on many hosts, and several
/// at once in one process (every agent thread shipping a part), never share one: the
/// storage site would take a second sender with the same id for the first one restarted.
fn sender_id() -> u32 {
    let b = random_bytes().unwrap_or_else(|_| std::process::id().to_le_bytes());
    // Below the storage site's id, never 0.
    (u32::from_le_bytes(b) % (STORAGE.node - 1)) + 1
}

/// What the storage site does with a received object ([`crate::storage::StorageSite`]).
/// Called from several threads at once (see [`serve`]).
pub trait Sink: Sync {
    /// Regenerates and writes the object (the whole of `name`, or one part of it); the
    /// `Ok` value is the bytes regenerated.
    fn store(&self, name: &str, part: Option<&PartOf>, container: &[u8]) -> Result<u64, String>;
}

/// Writes through a temporary file renamed into place; into standard output (`-`), a
/// device or a FIFO directly ([`gepsea_blast::output::Destination`]).
pub fn write_atomically(path: &Path, data: &[u8]) -> std::io::Result<()> {
    gepsea_blast::output::Destination::of(path).write(data)
}

/// Checks a received object and hands it to the sink.
fn store_checked(sink: &dyn Sink, object: &Object, body: &[u8]) -> Result<u64, String> {
    if !plain_name(&object.name) {
        Err(format!("object name {:?} is not a plain file name", object.name))
    } else if body.len() as u64 != object.len {
        Err(format!("{} bytes arrived, {} announced", body.len(), object.len))
    } else if Sha256::digest(body).as_slice() != object.sha256 {
        Err("SHA-256 of the received object differs from the sender's: damaged in transit".to_string())
    } else {
        sink.store(&object.name, object.part.as_ref(), body)
    }
}

/// Answers `to` with `ack` in clear: every answer of an unencrypted transfer, and the
/// refusals of an encrypted one made before its session exists.
fn plain_ack(port: &Port, to: Addr, ack: &Ack) -> Result<(), NetError> {
    port.send(to, TAG_ACK, postcard::to_stdvec(ack).expect("serialisable"))
}

/// Largest object a storage site takes by default (`paramedic serve --max-object`): an
/// object is received whole into memory before it is checked.
pub const DEFAULT_MAX_OBJECT: u64 = 4 << 30;

fn too_large(object: &Object, max_object: u64) -> String {
    format!("object of {} bytes exceeds this storage site's limit of {max_object} bytes (paramedic serve --max-object)", object.len)
}

/// Serves objects until `count` have been handled (`None`: forever); calls `done` with
/// every acknowledgement, before it is sent (from the storing threads too, so that
/// counters a sender may read once acknowledged include it). With a `key`, only encrypted transfers under that key
/// are accepted; without one, only unencrypted transfers. An object announced larger
/// than `max_object` bytes is refused before anything is allocated for it; a header
/// that does not decode is counted as refused (no answer: its sender is unknown) and
/// the site serves on.
///
/// Objects arrive concurrently: every announced body is received while others are
/// being announced, received or stored (each sender has a port of its own), so the
/// round trips of many senders on a long link overlap. Up to `at_once` bodies are
/// checked and stored (regenerated) at the same time, each on a thread of its own, in
/// the order their bodies complete: one at a time kept 1.37 of 2 cores busy on the
/// 317.5 MB workload, and regeneration was ParaMEDIC's whole end-to-end time. A sender
/// that fails mid-object has that object refused; the site serves on.
pub fn serve(
    port: &Port,
    sink: &dyn Sink,
    count: Option<usize>,
    key: Option<&Key>,
    max_object: u64,
    at_once: usize,
    done: impl Fn(&Ack) + Sync,
) -> Result<(), TransferError> {
    /// How often the loop, waiting for the network, looks for stored objects to
    /// acknowledge (`done`).
    const LOOK: Duration = Duration::from_millis(50);
    type Job = (Box<Incoming>, Result<gepsea_net::Completion, NetError>);
    /// A stored object's acknowledgement (already passed to `done`), or why its sender
    /// failed.
    type Stored = (Addr, Result<(), TransferError>);
    let done = &done;
    let (jobs, queued) = crossbeam_channel::unbounded::<Job>();
    let (stored_tx, stored) = crossbeam_channel::unbounded::<Stored>();
    std::thread::scope(|scope| {
        for i in 0..at_once.max(1) {
            let (queued, stored_tx) = (queued.clone(), stored_tx.clone());
            let worker = move || {
                for (b, completion) in queued {
                    let from = b.from;
                    let r = completion
                        .map_err(TransferError::from)
                        .and_then(|c| received(from, c))
                        .and_then(|m| finish(port, sink, b, m, done));
                    if stored_tx.send((from, r)).is_err() {
                        return;
                    }
                }
            };
            std::thread::Builder::new()
                .name(format!("paramedic-store-{i}"))
                .spawn_scoped(scope, worker)
                .map_err(|e| TransferError::Io(format!("starting a storing thread: {e}")))?;
        }
        drop(stored_tx);
        // Dropped on every way out of this closure: the workers then finish what they
        // hold and stop, and the scope waits for them.
        let jobs = jobs;
        let mut handled = 0;
        let mut storing = 0;
        let mut header = port.irecv(None, Some(TAG_HEADER), 1 << 16);
        let mut bodies: Vec<Box<Incoming>> = Vec::new();
        let acknowledge = |(from, r): Stored, handled: &mut usize| -> Result<(), TransferError> {
            if let Err(e) = r {
                done(&failed_mid_object(from, e)?);
            }
            *handled += 1;
            Ok(())
        };
        loop {
            while let Ok(s) = stored.try_recv() {
                storing -= 1;
                acknowledge(s, &mut handled)?;
            }
            // New objects are taken until `count` are handled or under way.
            let accepting = count.is_none_or(|c| handled + storing + bodies.len() < c);
            if !accepting && bodies.is_empty() {
                if storing == 0 {
                    break;
                }
                let s = stored.recv().expect("a storing thread holds the sender while it stores");
                storing -= 1;
                acknowledge(s, &mut handled)?;
                continue;
            }
            let reqs: Vec<gepsea_net::ReqId> = accepting.then_some(header).into_iter().chain(bodies.iter().map(|b| b.req)).collect();
            let Some((i, completion)) = port.wait_any_timeout(&reqs, LOOK) else { continue };
            if accepting && i == 0 {
                header = port.irecv(None, Some(TAG_HEADER), 1 << 16);
                let h = match completion {
                    Ok(gepsea_net::Completion::Received(h)) => h,
                    // A sender that went away between objects is no reason to stop serving.
                    Err(NetError::PeerFailed { peer, reason }) => {
                        tracing::debug!("storage site: sender {peer} went away: {reason}");
                        continue;
                    }
                    Err(e) => return Err(e.into()),
                    Ok(other) => {
                        return Err(TransferError::Malformed { from: STORAGE, reason: format!("unexpected completion {other:?}") })
                    }
                };
                match announce(port, h.src, &h.data, key, max_object) {
                    Ok(Announced::Body(b)) => bodies.push(b),
                    Ok(Announced::Answered(ack)) => {
                        done(&ack);
                        handled += 1;
                    }
                    Err(e) => acknowledge((h.src, Err(e)), &mut handled)?,
                }
            } else {
                let b = bodies.remove(i - usize::from(accepting));
                jobs.send((b, completion)).expect("the storing threads outlive the loop");
                storing += 1;
            }
        }
        port.cancel(header);
        Ok(())
    })
}

/// The refusal of an object whose sender failed or vanished mid-object (nothing was
/// written for it: its gepsea-net link could not be resumed); other errors stop the
/// site.
fn failed_mid_object(from: Addr, e: TransferError) -> Result<Ack, TransferError> {
    match e {
        TransferError::Net(e @ (NetError::PeerFailed { .. } | NetError::Unreachable { .. })) => {
            Ok(Ack { name: String::new(), result: Err(format!("the sender {from} failed mid-object: {e}")), seconds: 0.0 })
        }
        e => Err(e),
    }
}

/// A body being received.
struct Incoming {
    req: gepsea_net::ReqId,
    from: Addr,
    object: Object,
    /// The session of an encrypted transfer.
    session: Option<snow::TransportState>,
}

enum Announced {
    /// Its body is on its way (boxed: a Noise session is large).
    Body(Box<Incoming>),
    /// Refused (and answered) from its header alone.
    Answered(Ack),
}

/// Takes an object's header: refuses it at once, or answers an encrypted one's
/// handshake, and posts the receive of its body.
fn announce(port: &Port, from: Addr, header: &[u8], key: Option<&Key>, max_object: u64) -> Result<Announced, TransferError> {
    let refuse = |name: String, why: &str| Ack { name, result: Err(why.to_string()), seconds: 0.0 };
    let answer = |ack: Ack| -> Result<Announced, TransferError> {
        plain_ack(port, from, &ack)?;
        Ok(Announced::Answered(ack))
    };
    let header: Header = match postcard::from_bytes(header) {
        Ok(header) => header,
        // No answer: its sender is unknown.
        Err(e) => return Ok(Announced::Answered(refuse(String::new(), &format!("malformed header from {from}: {e}")))),
    };
    if let Some(a) = header.reply_to {
        port.add_route(from, a);
    }
    match (header.object, header.noise, key) {
        (Some(object), None, _) if object.len > max_object => {
            // Its body is taken into no buffer at all: the receive ends truncated,
            // which also releases the sender.
            let _ = port.recv(Some(from), Some(TAG_BODY), 0);
            answer(refuse(object.name.clone(), &too_large(&object, max_object)))
        }
        (Some(object), None, None) => {
            let req = port.irecv(Some(from), Some(TAG_BODY), object.len as usize);
            Ok(Announced::Body(Box::new(Incoming { req, from, object, session: None })))
        }
        (Some(object), None, Some(_)) => {
            // Its body is not wanted: taken into no buffer, which releases the sender.
            let _ = port.recv(Some(from), Some(TAG_BODY), 0);
            answer(refuse(object.name, "this storage site accepts only encrypted transfers: give the sender the site's key (--key)"))
        }
        (None, Some(_), None) => {
            answer(refuse(String::new(), "the sender encrypts, but this storage site has no key: start it with --key"))
        }
        (None, Some(first), Some(key)) => {
            let malformed = |e: snow::Error| TransferError::Malformed { from, reason: e.to_string() };
            let mut hs = key.handshake(false);
            let mut payload = vec![0u8; NOISE_MAX];
            let object = hs.read_message(&first, &mut payload).ok().and_then(|n| postcard::from_bytes::<Object>(&payload[..n]).ok());
            let Some(object) = object else {
                // Refused in clear: there are no session keys to answer with.
                return answer(refuse(String::new(), "handshake failed: the sender's key is not this storage site's key"));
            };
            if object.len > max_object {
                // Refused in clear before the handshake completes: the sender sends no body.
                return answer(Ack { result: Err(too_large(&object, max_object)), name: object.name, seconds: 0.0 });
            }
            let mut reply = vec![0u8; NOISE_MAX];
            let n = hs.write_message(&[], &mut reply).map_err(malformed)?;
            reply.truncate(n);
            let session = hs.into_transport_mode().map_err(malformed)?;
            let req = port.irecv(Some(from), Some(TAG_BODY), sealed_len(object.len) as usize);
            port.send(from, TAG_HANDSHAKE, reply)?;
            Ok(Announced::Body(Box::new(Incoming { req, from, object, session: Some(session) })))
        }
        _ => answer(refuse(String::new(), "malformed header: neither an object nor a handshake")),
    }
}

/// A body has arrived: decrypt, check, store, acknowledge (encrypted in an encrypted
/// session).
fn finish(port: &Port, sink: &dyn Sink, b: Box<Incoming>, body: gepsea_net::Message, done: &dyn Fn(&Ack)) -> Result<(), TransferError> {
    // From here: the storage site's time excludes the transfer.
    let started = std::time::Instant::now();
    let Incoming { from, object, session, .. } = *b;
    let Some(mut t) = session else {
        let result = store_checked(sink, &object, &body.data);
        let ack = Ack { name: object.name, result, seconds: started.elapsed().as_secs_f64() };
        done(&ack);
        unheard(from, plain_ack(port, from, &ack));
        return Ok(());
    };
    let result = match open_body(&mut t, &body.data) {
        Ok(plain) => store_checked(sink, &object, &plain),
        Err(e) => Err(format!("the body does not decrypt ({e}): damaged or forged in transit")),
    };
    let ack = Ack { name: object.name, result, seconds: started.elapsed().as_secs_f64() };
    done(&ack);
    let bytes = postcard::to_stdvec(&ack).expect("serialisable");
    let mut sealed = vec![0u8; bytes.len() + NOISE_TAG];
    let n = t.write_message(&bytes, &mut sealed).map_err(|e| TransferError::Malformed { from, reason: e.to_string() })?;
    sealed.truncate(n);
    unheard(from, port.send(from, TAG_ACK, sealed));
    Ok(())
}

/// An acknowledgement that could not be sent: the object was handled (and counted by
/// `done`) all the same; its sender, if it comes back, sends it again.
fn unheard(from: Addr, sent: Result<(), NetError>) {
    if let Err(e) = sent {
        tracing::warn!("storage site: the acknowledgement to {from} was not delivered: {e}");
    }
}

/// This host's address on the route to `to` (a connected UDP socket sends nothing).
pub fn local_ip_towards(to: SocketAddr) -> std::io::Result<std::net::IpAddr> {
    let s = std::net::UdpSocket::bind(("0.0.0.0", 0))?;
    s.connect(to)?;
    Ok(s.local_addr()?.ip())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unreachable_storage_site_is_named_as_the_user_gave_it() {
        let to: SocketAddr = "192.0.2.7:4040".parse().unwrap();
        let failed = NetError::PeerFailed { peer: STORAGE, reason: format!("connect to {STORAGE}: Connection refused (os error 111)") };
        let e = site_named(TransferError::Net(failed), to).to_string();
        assert_eq!(
            e,
            "the storage site 192.0.2.7:4040 could not be reached: connect to 192.0.2.7:4040: Connection refused (os error 111) \
             (is `gepsea paramedic serve`, or an agent with --storage-listen, running there?)"
        );
        // Another peer's failure, and other errors, are left as they are.
        let other = NetError::PeerFailed { peer: Addr::new(3, 1), reason: "gone".into() };
        assert!(matches!(site_named(TransferError::Net(other), to), TransferError::Net(_)));
        assert!(matches!(site_named(TransferError::BadName("a/b".into()), to), TransferError::BadName(_)));
    }

    #[test]
    fn a_storage_site_that_refuses_connections_fails_the_transfer_in_seconds() {
        // A port nothing listens on: bound, then closed.
        let to = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
        let started = std::time::Instant::now();
        let e = send_to(to, None, "x", None, b"data", None).unwrap_err();
        let took = started.elapsed();
        assert!(matches!(e, TransferError::Unreachable { to: t, .. } if t == to), "{e}");
        assert!(e.to_string().contains(&format!("connect to {to}: Connection refused")), "{e}");
        // Tried again for REFUSED_FOR, not for the port's 60 s reconnect timeout.
        assert!(took >= REFUSED_FOR && took < Duration::from_secs(30), "{took:?}");
    }

    use crate::container;
    use crate::plugin::RawPlugin;

    /// Stores into memory.
    #[derive(Default)]
    struct Collect(parking_lot::Mutex<Vec<(String, Vec<u8>)>>);
    impl Sink for Collect {
        fn store(&self, name: &str, _part: Option<&PartOf>, data: &[u8]) -> Result<u64, String> {
            let out = container::open(&RawPlugin, data).map_err(|e| e.to_string())?;
            self.0.lock().push((name.to_string(), out.clone()));
            Ok(out.len() as u64)
        }
    }

    /// Runs one transfer per `(sender key, object)` against a storage site holding
    /// `site_key`, over real TCP on the loopback; returns the sender's results and what
    /// the storage site stored.
    type Outcome = (Vec<Result<Ack, TransferError>>, Vec<(String, Vec<u8>)>);

    /// A storage site's port and a compute site's port aimed at it, over the loopback;
    /// their namespaces' runtime directories go when the guard does (declared first,
    /// it is dropped after the ports), also when the test fails.
    fn sites(tag: &str) -> (RemoveNamespaces, Port, Port) {
        let guard = RemoveNamespaces([format!("pmt-s-{tag}-{}", std::process::id()), format!("pmt-c-{tag}-{}", std::process::id())]);
        let storage = storage_port(&guard.0[0], "127.0.0.1:0".parse().unwrap()).unwrap();
        let compute = compute_port(&guard.0[1], 1, "127.0.0.1:0".parse().unwrap(), storage.listen_addr().unwrap()).unwrap();
        (guard, storage, compute)
    }

    struct RemoveNamespaces([String; 2]);

    impl Drop for RemoveNamespaces {
        fn drop(&mut self) {
            for ns in &self.0 {
                let _ = std::fs::remove_dir_all(gepsea_net::namespace_dir(ns));
            }
        }
    }

    fn transfers(tag: &str, site_key: Option<Key>, sends: Vec<(Option<Key>, Vec<u8>)>) -> Outcome {
        let (_guard, storage, port) = sites(tag);
        let n = sends.len();
        let server = std::thread::spawn(move || {
            let sink = Collect::default();
            serve(&storage, &sink, Some(n), site_key.as_ref(), DEFAULT_MAX_OBJECT, 2, |_| {}).unwrap();
            sink.0.into_inner()
        });
        let results = sends
            .iter()
            .enumerate()
            .map(|(i, (key, data))| {
                send(
                    &port,
                    STORAGE,
                    &format!("obj{i}"),
                    None,
                    &container::seal(&RawPlugin, data).unwrap(),
                    port.listen_addr(),
                    key.as_ref(),
                )
            })
            .collect();
        let stored = server.join().unwrap();
        (results, stored)
    }

    /// Objects over the site's limit, plain or encrypted, and a header that does not
    /// decode are refused; the site serves on and stores the next good object. The
    /// 1 TiB announcement would abort the process if the site allocated for it.
    #[test]
    fn oversized_objects_and_malformed_headers_are_refused_and_the_site_serves_on() {
        let key = Key::generate().unwrap();
        for site_key in [None, Some(key)] {
            let (_guard, storage, port) = sites(if site_key.is_some() { "lim-enc" } else { "lim" });
            let skey = site_key.clone();
            let server = std::thread::spawn(move || {
                let sink = Collect::default();
                let acks = parking_lot::Mutex::new(Vec::new());
                serve(&storage, &sink, Some(4), skey.as_ref(), 1000, 2, |a| acks.lock().push(a.clone())).unwrap();
                (sink.0.into_inner(), acks.into_inner())
            });
            let k = site_key.as_ref();
            let big = container::seal(&RawPlugin, &[7u8; 2000]).unwrap();
            let e = send(&port, STORAGE, "big", None, &big, port.listen_addr(), k).unwrap_err().to_string();
            assert!(e.contains("exceeds this storage site's limit of 1000 bytes"), "{e}");
            port.send(STORAGE, TAG_HEADER, vec![0xff, 0xff, 0xff]).unwrap();
            if k.is_none() {
                // A header announcing 1 TiB, with a small body behind it.
                let object = Object { name: "huge".into(), part: None, len: 1 << 40, sha256: [0; 32] };
                let header = Header { reply_to: port.listen_addr(), object: Some(object), noise: None };
                let ack = port.irecv(Some(STORAGE), Some(TAG_ACK), 1 << 16);
                port.send(STORAGE, TAG_HEADER, postcard::to_stdvec(&header).unwrap()).unwrap();
                let _ = port.send(STORAGE, TAG_BODY, vec![1; 100]);
                let m = received(STORAGE, port.wait(ack).unwrap()).unwrap();
                let e = parse_ack(STORAGE, &m.data).unwrap_err().to_string();
                assert!(e.contains("object of 1099511627776 bytes exceeds"), "{e}");
            } else {
                let e = send(&port, STORAGE, "big2", None, &big, port.listen_addr(), k).unwrap_err().to_string();
                assert!(e.contains("exceeds this storage site's limit"), "{e}");
            }
            let small = container::seal(&RawPlugin, b"fits").unwrap();
            assert_eq!(send(&port, STORAGE, "small", None, &small, port.listen_addr(), k).unwrap().result, Ok(4));
            let (stored, acks) = server.join().unwrap();
            assert_eq!(stored, vec![("small".to_string(), b"fits".to_vec())]);
            assert_eq!(acks.iter().filter(|a| a.result.is_err()).count(), 3);
            assert!(acks.iter().any(|a| a.result.as_ref().is_err_and(|e| e.starts_with("malformed header"))));
        }
    }

    #[test]
    fn encrypted_objects_arrive_exactly_including_chunk_boundaries() {
        let key = Key::generate().unwrap();
        // Sizes around the 65,519-byte plaintext chunk, and a multi-chunk object.
        let objects: Vec<Vec<u8>> = [0usize, 1, NOISE_CHUNK - 60, NOISE_CHUNK, 3 * NOISE_CHUNK + 7, 1 << 20]
            .iter()
            .map(|&n| (0..n).map(|i| (i * 7 + n) as u8).collect())
            .collect();
        let (results, stored) = transfers("enc", Some(key.clone()), objects.iter().map(|o| (Some(key.clone()), o.clone())).collect());
        for (i, r) in results.iter().enumerate() {
            assert_eq!(r.as_ref().unwrap().result, Ok(objects[i].len() as u64));
        }
        assert_eq!(stored, objects.iter().enumerate().map(|(i, o)| (format!("obj{i}"), o.clone())).collect::<Vec<_>>());
    }

    #[test]
    fn wrong_or_missing_keys_are_refused_and_nothing_is_stored() {
        let site = Key::generate().unwrap();
        let other = Key::generate().unwrap();
        let (results, stored) =
            transfers("keyed", Some(site.clone()), vec![(Some(other), b"a".to_vec()), (None, b"b".to_vec()), (Some(site), b"c".to_vec())]);
        let refused = |r: &Result<Ack, TransferError>| match r {
            Err(TransferError::Refused { reason, .. }) => reason.clone(),
            other => panic!("expected a refusal, got {other:?}"),
        };
        assert!(refused(&results[0]).contains("key is not this storage site's key"));
        assert!(refused(&results[1]).contains("accepts only encrypted transfers"));
        assert_eq!(stored, vec![("obj2".to_string(), b"c".to_vec())]);

        let (results, stored) = transfers("keyless", None, vec![(Some(Key::generate().unwrap()), b"a".to_vec()), (None, b"b".to_vec())]);
        assert!(refused(&results[0]).contains("has no key"));
        assert_eq!(stored, vec![("obj1".to_string(), b"b".to_vec())]);
    }

    #[test]
    fn a_flipped_ciphertext_byte_does_not_decrypt() {
        let key = Key::generate().unwrap();
        let (mut a, mut b) = (key.handshake(true), key.handshake(false));
        let mut m1 = [0u8; NOISE_MAX];
        let n = a.write_message(b"x", &mut m1).unwrap();
        b.read_message(&m1[..n], &mut [0u8; NOISE_MAX]).unwrap();
        let n = b.write_message(&[], &mut m1).unwrap();
        a.read_message(&m1[..n], &mut [0u8; NOISE_MAX]).unwrap();
        let (mut a, mut b) = (a.into_transport_mode().unwrap(), b.into_transport_mode().unwrap());
        let plain: Vec<u8> = (0..200_000u32).map(|i| i as u8).collect();
        let mut sealed = seal_body(&mut a, &plain);
        assert_eq!(sealed.len() as u64, sealed_len(plain.len() as u64));
        sealed[100_000] ^= 1;
        assert!(open_body(&mut b, &sealed).is_err());
    }

    #[test]
    fn key_files_round_trip_and_bad_ones_are_named() {
        let dir = std::env::temp_dir().join(format!("pmt-key-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let k = Key::generate().unwrap();
        k.write_new(&dir.join("k")).unwrap();
        assert_eq!(Key::read(&dir.join("k")).unwrap(), k);
        assert!(k.write_new(&dir.join("k")).is_err(), "an existing key file is never overwritten");
        std::fs::write(dir.join("bad"), "abc\n").unwrap();
        let e = Key::read(&dir.join("bad")).unwrap_err().to_string();
        assert!(e.contains("bad") && e.contains("64 hexadecimal digits"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
