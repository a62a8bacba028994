//! Shared-memory connections between two ports on one node.
//!
//! The side that sends first (the *initiator*) creates a memfd holding a [`ConnHeader`]
//! and two rings (initiator → acceptor, acceptor → initiator), plus one eventfd
//! "doorbell" per side, and hands all three descriptors to the acceptor over the
//! acceptor's Unix socket (`SCM_RIGHTS`). The Unix socket then stays open only as a
//! liveness signal: when a process dies, the kernel closes it and the peer sees EOF.
//!
//! Wake-ups cost ≈5.5 µs here against ≈0.1 µs for a spin (see `docs/architecture.md`),
//! so a producer rings the peer's doorbell only when the peer has said it is asleep:
//! `awake[side]` is 1 while some thread of that side is progressing (its event thread is
//! running or its application spins in `wait`). The sleeper clears the word, fences,
//! and re-checks its rings before sleeping; the producer publishes, fences, and reads
//! the word (Dekker's pattern, both fences `SeqCst`), so a wake-up is never lost.
//! `want_space[side]` likewise asks the consumer to ring when it frees ring space.

use std::fs::File;
use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::sync::atomic::{fence, AtomicU32, AtomicU64, Ordering};

use memmap2::{MmapMut, MmapOptions};
use nix::sys::socket::{recvmsg, sendmsg, ControlMessage, ControlMessageOwned, MsgFlags};

use crate::error::NetError;
use crate::frame::Addr;
use crate::ring::{self, Consumer, ControlRef, Padded, Producer, RingControl, Storage};

/// Version 2: records are published by their stamps (`ring`), whose salts the segment
/// carries; a version-1 peer is refused at the handshake instead of misreading rings.
const SHM_MAGIC: u64 = u64::from_le_bytes(*b"GPSASHM2");
const DATA_ALIGN: usize = 4096;

/// Start of the shared segment.
#[repr(C)]
pub struct ConnHeader {
    magic: Padded<AtomicU64>,
    ring_bytes: Padded<AtomicU64>,
    awake: [Padded<AtomicU32>; 2],
    want_space: [Padded<AtomicU32>; 2],
    rings: [RingControl; 2],
}

fn header_size() -> usize {
    std::mem::size_of::<ConnHeader>().div_ceil(DATA_ALIGN) * DATA_ALIGN
}

fn segment_size(ring_bytes: usize) -> usize {
    header_size() + 2 * ring_bytes
}

/// An eventfd used as a doorbell.
pub struct Bell(OwnedFd);

impl Bell {
    /// A fresh, non-blocking doorbell.
    pub fn new() -> Result<Self, NetError> {
        // SAFETY: plain syscall; the result is checked before it is wrapped.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(NetError::io("eventfd", std::io::Error::last_os_error()));
        }
        // SAFETY: fd is a new descriptor we own.
        Ok(Bell(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Wakes whoever polls this doorbell.
    pub fn ring(&self) {
        let _ = nix::unistd::write(self.0.as_fd(), &1u64.to_ne_bytes());
    }

    /// Clears pending rings (after a wake-up).
    pub fn clear(&self) {
        let mut b = [0u8; 8];
        let _ = nix::unistd::read(self.0.as_raw_fd(), &mut b);
    }

    /// The descriptor, for registration with a poller.
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// One end of a shared-memory connection.
pub struct ShmConn {
    pub peer: Addr,
    side: usize,
    _map: MmapMut,
    hdr: *const ConnHeader,
    pub tx: Producer,
    pub rx: Consumer,
    /// Our doorbell: the peer rings it; our poller watches it.
    pub my_bell: Bell,
    peer_bell: Bell,
    /// Liveness: EOF here means the peer process is gone.
    pub sock: mio::net::UnixStream,
    /// The peer's process id as the kernel reports it for the socket (in our pid
    /// namespace; `None` if it is not visible there). Single copies are only made from
    /// this process, whatever pid a request to send names.
    pub peer_pid: Option<u32>,
    /// Records were consumed since the peer's `want_space` was last looked at behind a
    /// fence ([`ShmConn::owe_space`]).
    space_owed: bool,
}

// SAFETY: `hdr` points into `_map`, which the connection owns and which stays mapped
// for its whole life; the header holds only atomics.
unsafe impl Send for ShmConn {}

impl ShmConn {
    fn hdr(&self) -> &ConnHeader {
        // SAFETY: see the `Send` impl: the mapping outlives `self`.
        unsafe { &*self.hdr }
    }

    fn build(peer: Addr, side: usize, map: MmapMut, my_bell: Bell, peer_bell: Bell, sock: UnixStream) -> Result<Self, NetError> {
        let base = map.as_ptr() as *mut u8;
        let hdr = base as *const ConnHeader;
        // SAFETY: the mapping is at least `segment_size` bytes (checked by callers),
        // page-aligned, and initialised (zeroed by the kernel, then by `create`).
        let h = unsafe { &*hdr };
        if h.magic.0.load(Ordering::Acquire) != SHM_MAGIC {
            return Err(NetError::Protocol { peer, reason: "shared segment has a bad magic".into() });
        }
        let rb = h.ring_bytes.0.load(Ordering::Acquire) as usize;
        if !rb.is_multiple_of(2 * ring::RECORD_ALIGN) || rb == 0 {
            return Err(NetError::Protocol { peer, reason: format!("shared rings of {rb} bytes are not whole records") });
        }
        if map.len() < segment_size(rb) {
            return Err(NetError::Protocol { peer, reason: "shared segment smaller than its rings".into() });
        }
        let data = |i: usize| {
            // SAFETY: ring i's data lies inside the mapping (size checked above).
            unsafe { Storage::new(base.add(header_size() + i * rb), rb) }
        };
        // Ring 0 carries initiator → acceptor.
        let (out_ring, in_ring) = if side == 0 { (0, 1) } else { (1, 0) };
        // SAFETY: the controls live in the header inside the mapping.
        let tx = ring::producer(unsafe { ControlRef::new(&h.rings[out_ring]) }, data(out_ring), rb);
        let rx = ring::consumer(unsafe { ControlRef::new(&h.rings[in_ring]) }, data(in_ring), rb);
        sock.set_nonblocking(true).map_err(|e| NetError::io("unix socket", e))?;
        let peer_pid = nix::sys::socket::getsockopt(&sock, nix::sys::socket::sockopt::PeerCredentials)
            .ok()
            .map(|c| c.pid())
            .filter(|&p| p > 0)
            .map(|p| p as u32);
        Ok(ShmConn {
            peer,
            side,
            _map: map,
            hdr,
            tx,
            rx,
            my_bell,
            peer_bell,
            sock: mio::net::UnixStream::from_std(sock),
            peer_pid,
            space_owed: false,
        })
    }

    /// Initiator: creates the segment and hands it to the peer over `sock`.
    pub fn create(me: Addr, peer: Addr, mut sock: UnixStream, ring_bytes: usize) -> Result<Self, NetError> {
        let name = c"gepsea-ring";
        let fd = nix::sys::memfd::memfd_create(name, nix::sys::memfd::MemFdCreateFlag::MFD_CLOEXEC)
            .map_err(|e| NetError::io("memfd_create", e.into()))?;
        let file = File::from(fd);
        let size = segment_size(ring_bytes);
        file.set_len(size as u64).map_err(|e| NetError::io("sizing shared segment", e))?;
        // SAFETY: the memfd is ours, sized above, and only mapped by us and the peer.
        let map = unsafe { MmapOptions::new().len(size).map_mut(&file) }.map_err(|e| NetError::io("mmap", e))?;
        {
            // SAFETY: fresh zeroed mapping large enough for the header.
            let h = unsafe { &*(map.as_ptr() as *const ConnHeader) };
            h.ring_bytes.0.store(ring_bytes as u64, Ordering::Relaxed);
            for r in &h.rings {
                r.init_salt();
            }
            h.magic.0.store(SHM_MAGIC, Ordering::Release);
        }
        let mine = Bell::new()?;
        let theirs = Bell::new()?;
        let mut hello = [0u8; 16];
        hello[0..4].copy_from_slice(&me.node.to_le_bytes());
        hello[4..8].copy_from_slice(&me.port.to_le_bytes());
        hello[8..16].copy_from_slice(&(size as u64).to_le_bytes());
        let fds = [file.as_raw_fd(), theirs.raw(), mine.raw()];
        sendmsg::<()>(sock.as_raw_fd(), &[IoSlice::new(&hello)], &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)
            .map_err(|e| NetError::io(format!("handing shared segment to {peer}"), e.into()))?;
        use std::io::Write;
        sock.flush().ok();
        Self::build(peer, 0, map, mine, theirs, sock)
    }

    /// Acceptor: receives the segment from a freshly accepted socket. Blocks briefly
    /// for the handshake message (the initiator sends it right after connecting).
    pub fn accept(sock: UnixStream) -> Result<Self, NetError> {
        sock.set_read_timeout(Some(std::time::Duration::from_secs(5))).ok();
        let mut hello = [0u8; 16];
        let mut cmsg = nix::cmsg_space!([RawFd; 3]);
        let (n, fds) = {
            let mut iov = [IoSliceMut::new(&mut hello)];
            let msg = recvmsg::<()>(sock.as_raw_fd(), &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)
                .map_err(|e| NetError::io("receiving shared segment", e.into()))?;
            let mut fds = Vec::new();
            for c in msg.cmsgs().map_err(|e| NetError::io("control message", e.into()))? {
                if let ControlMessageOwned::ScmRights(v) = c {
                    fds.extend(v);
                }
            }
            (msg.bytes, fds)
        };
        // SAFETY: descriptors received through SCM_RIGHTS are new and ours.
        let mut owned: Vec<OwnedFd> = fds.into_iter().map(|f| unsafe { OwnedFd::from_raw_fd(f) }).collect();
        let unknown = Addr::new(u32::MAX, u32::MAX);
        if n != 16 || owned.len() != 3 {
            return Err(NetError::Protocol {
                peer: unknown,
                reason: format!("bad shared-memory handshake ({n} bytes, {} descriptors)", owned.len()),
            });
        }
        let peer = Addr::new(u32::from_le_bytes(hello[0..4].try_into().unwrap()), u32::from_le_bytes(hello[4..8].try_into().unwrap()));
        let size = u64::from_le_bytes(hello[8..16].try_into().unwrap()) as usize;
        let peer_bell = Bell(owned.pop().unwrap());
        let my_bell = Bell(owned.pop().unwrap());
        let file = File::from(owned.pop().unwrap());
        let actual = file.metadata().map_err(|e| NetError::io("shared segment", e))?.len() as usize;
        if actual != size || size < header_size() {
            return Err(NetError::Protocol { peer, reason: format!("shared segment is {actual} bytes, handshake said {size}") });
        }
        // SAFETY: the memfd was sized by the initiator; we map exactly its size.
        let map = unsafe { MmapOptions::new().len(size).map_mut(&file) }.map_err(|e| NetError::io("mmap", e))?;
        sock.set_read_timeout(None).ok();
        Self::build(peer, 1, map, my_bell, peer_bell, sock)
    }

    /// Declares whether our side has a thread that will notice new data by itself.
    pub fn set_awake(&self, awake: bool) {
        self.hdr().awake[self.side].0.store(awake as u32, Ordering::SeqCst);
    }

    /// After publishing into `tx`: ring the peer if it sleeps. Returns whether it rang.
    /// Also settles space owed ([`ShmConn::owe_space`]): a sleeping peer is rung anyway,
    /// and an awake one finds freed space by itself (its spin retries its blocked
    /// output, and going to sleep it looks, behind its fence, at what we freed before
    /// ours).
    pub fn notify_data(&mut self) -> bool {
        fence(Ordering::SeqCst);
        self.space_owed = false;
        if self.hdr().awake[1 - self.side].0.load(Ordering::SeqCst) == 0 {
            self.peer_bell.ring();
            return true;
        }
        false
    }

    /// After consuming from `rx`: the peer may be waiting for the space, and must be
    /// rung if it sleeps. Looking costs a fence (the freed `tail` must be visible before
    /// the peer's `want_space` is read), and a fence here stood between a message's
    /// arrival and the receiver's answer (≈20 cycles, and the store buffer drained).
    /// So the look is owed, and settled off that path: by the next publish into `tx`
    /// ([`ShmConn::notify_data`]), the next library call, or going to sleep
    /// ([`ShmConn::settle_space`]). A peer asleep on a full ring waits at most until
    /// then: the application's next call, or the event thread's look when the
    /// application's lease ends.
    pub fn owe_space(&mut self) {
        self.space_owed = true;
    }

    /// Settles space owed ([`ShmConn::owe_space`]): rings the peer if it waits for space
    /// and sleeps. `fenced`: the caller has just made a `SeqCst` fence after the space
    /// was freed (going to sleep does).
    pub fn settle_space(&mut self, fenced: bool) {
        if !std::mem::take(&mut self.space_owed) {
            return;
        }
        if !fenced {
            fence(Ordering::SeqCst);
        }
        let h = self.hdr();
        if h.want_space[1 - self.side].0.load(Ordering::SeqCst) != 0 && h.awake[1 - self.side].0.load(Ordering::SeqCst) == 0 {
            self.peer_bell.ring();
        }
    }

    /// Records that we have output blocked on a full ring (or no longer do).
    /// Whether this side asked to be told when the peer frees ring space.
    pub fn wants_space(&self) -> bool {
        self.hdr().want_space[self.side].0.load(Ordering::Relaxed) != 0
    }

    /// Work the peer published without ringing because this side said it was awake:
    /// records to read, or (when this side waits for room) space it freed. Called
    /// after clearing the awake flag and a `SeqCst` fence, before going to sleep.
    pub fn has_unannounced_work(&mut self) -> bool {
        self.rx.has_data() || (self.wants_space() && self.tx.space_released())
    }

    pub fn set_want_space(&self, want: bool) {
        self.hdr().want_space[self.side].0.store(want as u32, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(ring_bytes: usize) -> (ShmConn, ShmConn) {
        let (a, b) = UnixStream::pair().unwrap();
        let left = ShmConn::create(Addr::new(0, 1), Addr::new(0, 2), a, ring_bytes).unwrap();
        let right = ShmConn::accept(b).unwrap();
        (left, right)
    }

    #[test]
    fn space_freed_while_awake_is_seen_before_sleeping() {
        let (mut tx, mut rx) = pair(4096);
        let rec = vec![7u8; 1000];
        let mut pushed = 0;
        while tx.tx.try_push(&[&rec]) {
            pushed += 1;
        }
        assert!(pushed >= 2, "a 4 KiB ring takes several 1000-byte records");
        // The sender waits for room while awake: the receiver frees space and does not
        // ring (the sender said it was awake).
        tx.set_awake(true);
        tx.set_want_space(true);
        assert!(!tx.has_unannounced_work(), "nothing freed yet");
        assert_eq!(rx.rx.pop_with(|r| r.len()), Some(1000));
        rx.owe_space();
        rx.settle_space(false);
        assert_eq!(
            nix::unistd::read(tx.my_bell.raw(), &mut [0u8; 8]).map_err(|e| e as i32),
            Err(nix::errno::Errno::EAGAIN as i32),
            "no doorbell towards an awake side"
        );
        // Going to sleep, the sender must notice the freed space itself.
        tx.set_awake(false);
        fence(Ordering::SeqCst);
        assert!(tx.has_unannounced_work(), "freed space was missed: the sender would sleep on a ring with room");
        assert!(tx.tx.try_push(&[&rec]), "and the record now fits");
        assert!(!tx.has_unannounced_work(), "reported once");
    }

    /// Whether `c`'s doorbell was rung (and clears it).
    fn rung(c: &ShmConn) -> bool {
        nix::unistd::read(c.my_bell.raw(), &mut [0u8; 8]).is_ok()
    }

    #[test]
    fn space_owed_to_a_sleeping_sender_is_paid_by_a_settle_or_the_next_publish() {
        let (mut tx, mut rx) = pair(4096);
        let rec = vec![7u8; 1000];
        while tx.tx.try_push(&[&rec]) {}
        // The sender sleeps, waiting for room.
        tx.set_want_space(true);
        assert_eq!(rx.rx.pop_with(|r| r.len()), Some(1000));
        rx.owe_space();
        assert!(!rung(&tx), "owing rings nobody: the receive's path has no fence");
        rx.settle_space(false);
        assert!(rung(&tx), "settling rings the sleeping sender");
        rx.settle_space(false);
        assert!(!rung(&tx), "once");
        // Owed again, then paid by a publish of the receiver's own (it rings the sleeper).
        assert_eq!(rx.rx.pop_with(|r| r.len()), Some(1000));
        rx.owe_space();
        assert!(rx.tx.try_push(&[b"answer"]));
        assert!(rx.notify_data());
        assert!(rung(&tx));
        rx.settle_space(false);
        assert!(!rung(&tx), "the publish settled it");
        // Owed to an awake sender: no doorbell, it finds the space itself.
        tx.set_awake(true);
        assert_eq!(rx.rx.pop_with(|r| r.len()), Some(1000));
        rx.owe_space();
        rx.settle_space(false);
        assert!(!rung(&tx));
        assert!(tx.tx.space_released());
    }

    #[test]
    fn the_peer_process_is_identified_by_the_kernel() {
        let (a, b) = pair(4096);
        assert_eq!((a.peer_pid, b.peer_pid), (Some(std::process::id()), Some(std::process::id())));
    }

    #[test]
    fn data_published_while_awake_is_seen_before_sleeping() {
        let (mut tx, mut rx) = pair(4096);
        rx.set_awake(true);
        assert!(tx.tx.try_push(&[b"hello"]));
        assert!(!tx.notify_data(), "no doorbell towards an awake side");
        rx.set_awake(false);
        fence(Ordering::SeqCst);
        assert!(rx.has_unannounced_work());
        assert!(!tx.has_unannounced_work(), "the sender has nothing to read and asked for no space");
    }
}
