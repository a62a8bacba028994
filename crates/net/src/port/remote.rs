//! Remote links: TCP connections to ports on other nodes (resolving, connecting,
//! the handshake with incarnations, reading frames, acknowledgements, link loss).

use super::*;
use crate::frame::{FrameError, FLAG_SUM_AFTER, FLAG_TRUST_TCP};
use crate::tcp::{Finished, Held, PendingSums, TcpChecksums};

/// The least payload still to come for a data frame to be read in place rather than
/// through the decoder (one more system call per frame).
const DIRECT_MIN: usize = 8 << 10;

/// Puts connection `id` in the TCP set (`tcp_set`; edge-triggered, both ways).
fn watch_tcp(registry: &mio::Registry, c: &mut TcpConn, id: usize) -> io::Result<()> {
    registry.register(&mut c.stream, tcp_token(id), Interest::READABLE | Interest::WRITABLE)
}

impl State {
    pub(super) fn resolve(&self, peer: Addr) -> Option<SocketAddr> {
        if let Some(a) = self.cfg.routes.get(&peer) {
            return Some(*a);
        }
        let d = self.cfg.directory.as_ref()?;
        std::fs::read_to_string(directory_entry(d, peer)).ok()?.trim().parse().ok()
    }

    pub(super) fn connect_tcp(&mut self, peer: Addr) {
        let Some(addr) = self.resolve(peer) else {
            // The peer may not have started yet: retry until the reconnect timeout.
            self.link_down(peer, "no route: not in the routes table nor the directory");
            return;
        };
        let stream = match mio::net::TcpStream::connect(addr) {
            Ok(s) => s,
            Err(e) => {
                let msg = format!("connect to {peer} at {addr}: {e}");
                self.link_down(peer, &msg);
                return;
            }
        };
        self.set_socket_options(&stream);
        let id = self.next_id;
        self.next_id += 1;
        let mut c = TcpConn::new(stream, Some(peer), true, self.cfg.max_frame.max(self.cfg.proto.chunk));
        if let (true, Some(k)) = (self.cfg.encrypt, &self.cfg.key) {
            c.encrypt(k);
        }
        if let Err(e) = watch_tcp(&self.tcp_set.registry, &mut c, id) {
            self.log_error(format!("register: {e}"));
            return;
        }
        let link = self.links.entry(peer).or_default();
        link.conn = Some(id);
        let mut h = Header::new(Kind::Hello, Channel::Control, self.me, peer);
        h.ack = link.recv.delivered();
        h.tag = self.incarnation;
        self.announce_terms(&mut h);
        match &self.cfg.key {
            Some(_) => {
                let n = match crate::auth::nonce() {
                    Ok(n) => n,
                    Err(e) => {
                        self.log_error(format!("no randomness for a handshake nonce: {e}"));
                        return;
                    }
                };
                c.nonce_mine = Some(n);
                c.queue(&Frame { header: h, payload: Bytes::copy_from_slice(&n) });
            }
            None => c.queue(&Frame::control(h)),
        }
        self.tcp.insert(id, c);
        // The connect may already be complete (loopback).
        self.tcp_writable(id);
    }

    /// The port's options on a new connection, the one it makes and the one it accepts
    /// alike (the listener carries none of them).
    fn set_socket_options(&mut self, stream: &mio::net::TcpStream) {
        self.watch_for_silence(stream);
        self.choose_congestion(stream);
        self.size_buffers(stream);
    }

    /// With [`PortConfig::keepalive`](super::PortConfig::keepalive), the kernel watches
    /// the connection for a silent peer.
    fn watch_for_silence(&mut self, stream: &mio::net::TcpStream) {
        if let Some(silence) = self.cfg.keepalive {
            if let Err(e) = crate::tcp::watch_for_silence(stream, silence) {
                self.log_error(format!("keepalive options: {e}"));
            }
        }
    }

    /// With [`PortConfig::tcp_buffer`](super::PortConfig::tcp_buffer) (and limits that
    /// allow it), the connection's kernel buffers are sized once, before anything is
    /// sent; a failure is unexpected: logged, the kernel's own sizing stays.
    fn size_buffers(&mut self, stream: &mio::net::TcpStream) {
        if let Some(bytes) = self.tcp_buffer {
            if let Err(e) = crate::tcp::set_buffers(stream, bytes) {
                self.log_error(format!("socket buffers of {bytes} bytes: {e}"));
            }
        }
    }

    /// With [`PortConfig::tcp_congestion`](super::PortConfig::tcp_congestion), the
    /// connection runs under the congestion control chosen for the port (checked when
    /// the port opened, so a failure here is unexpected: logged, the system's default
    /// stays).
    fn choose_congestion(&mut self, stream: &mio::net::TcpStream) {
        if let Some(name) = &self.cfg.tcp_congestion {
            if let Err(e) = crate::tcp::set_congestion(stream, name) {
                self.log_error(format!("congestion control {name}: {e}"));
            }
        }
    }

    pub(super) fn accept_tcp(&mut self) {
        loop {
            let Some(l) = self.tcp_listener.as_ref() else { return };
            match l.accept() {
                Ok((stream, _)) => {
                    self.set_socket_options(&stream);
                    let id = self.next_id;
                    self.next_id += 1;
                    let mut c = TcpConn::new(stream, None, false, self.cfg.max_frame.max(self.cfg.proto.chunk));
                    if let (true, Some(k)) = (self.cfg.encrypt, &self.cfg.key) {
                        c.encrypt(k);
                    }
                    if watch_tcp(&self.tcp_set.registry, &mut c, id).is_ok() {
                        self.tcp.insert(id, c);
                        self.tcp_readable(id);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.log_error(format!("accept on TCP listener: {e}"));
                    return;
                }
            }
        }
    }

    pub(super) fn tcp_writable(&mut self, id: usize) {
        let Some(c) = self.tcp.get_mut(&id) else { return };
        if c.state == ConnState::Connecting {
            match c.finish_connect() {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    let msg = format!("connect to {}: {e}", c.peer.map(|p| p.to_string()).unwrap_or_default());
                    self.conn_lost(id, &msg);
                    return;
                }
            }
        }
        let c = self.tcp.get_mut(&id).unwrap();
        if self.corked && c.state == ConnState::Established {
            // Written at `uncork` (`flush_tcp_backlog`). A handshake is never held:
            // `uncork` writes established connections only, and this writable edge
            // would not come again.
            return;
        }
        if let Err(e) = c.write_out() {
            self.conn_lost(id, &format!("write: {e}"));
            return;
        }
        if let Some(p) = c.peer {
            if c.state == ConnState::Established {
                self.flush_tcp(p);
            }
        }
    }

    pub(super) fn tcp_readable(&mut self, id: usize) {
        loop {
            let Some(c) = self.tcp.get_mut(&id) else { return };
            let read = if c.direct_header().is_some() {
                // After the piece read in place, the decoder holds at most the next
                // header: decoding it now lets that piece go in place from its start.
                let Some(outcome) = self.read_direct(id) else { return };
                Ok(outcome)
            } else {
                c.read_in()
            };
            let outcome = match read {
                Ok(o) => o,
                Err(e) if e.kind() == std::io::ErrorKind::InvalidData => {
                    // Link encryption refused the peer (plain, another key, or records
                    // that do not open): counted and logged like a failed authentication.
                    self.stats.auth_failures += 1;
                    let peer = self.tcp.get(&id).and_then(|c| c.peer).map_or_else(|| "a peer".to_string(), |p| p.to_string());
                    self.log_error(format!("connection from {peer} refused: {e}"));
                    self.conn_lost(id, &format!("read: {e}"));
                    return;
                }
                Err(e) => {
                    self.conn_lost(id, &format!("read: {e}"));
                    return;
                }
            };
            if !self.process_frames(id) {
                return;
            }
            match outcome {
                ReadOutcome::More => continue,
                ReadOutcome::Drained => break,
                ReadOutcome::Eof => {
                    self.conn_lost(id, "closed by peer");
                    return;
                }
            }
        }
        if let Some(p) = self.tcp.get(&id).and_then(|c| c.peer) {
            self.after_input(p);
        }
    }

    /// A waiter spinning on a rendezvous transfer reads and writes the TCP sockets
    /// itself, so the event thread stops watching them meanwhile: every arriving
    /// segment would wake it (an IPI and a context switch on a VM), and it would then
    /// contend for this state's lock with the spinner (≈40 µs of a 1 MiB message on
    /// loopback). Counted: the last spinner to leave ([`State::unquiet_tcp`]) hands
    /// the sockets back, and `epoll` reports at once whatever arrived meanwhile.
    ///
    /// The connections leave together, in their set (`tcp_set`): one `epoll_ctl` each
    /// way at any number of peers. While they are out, the spinner takes their edges
    /// from the set ([`State::poll_tcp`]), handshakes included.
    pub(super) fn quiet_tcp(&mut self) {
        self.tcp_quiet += 1;
        if self.tcp_quiet == 1 {
            if let Err(e) = self.tcp_set.set_watched(&self.registry, false) {
                // Left watched: the event thread is woken by arriving segments, as
                // without quieting.
                self.log_error(format!("taking the TCP connections from the event thread: {e}"));
            }
        }
    }

    /// Ends a [`State::quiet_tcp`].
    pub(super) fn unquiet_tcp(&mut self) {
        self.tcp_quiet -= 1;
        if self.tcp_quiet == 0 {
            if let Err(e) = self.tcp_set.set_watched(&self.registry, true) {
                // Without the event thread's watch, only spinners would read the
                // connections: drop them, and the links reconnect and replay.
                self.log_error(format!("handing the TCP connections back to the event thread: {e}"));
                let ids: Vec<usize> = self.tcp.keys().copied().collect();
                for id in ids {
                    self.conn_lost(id, &format!("epoll: {e}"));
                }
            }
        }
    }

    /// The event thread's part that `poll_tcp` (reading) leaves out, for a thread that
    /// stands in for it (a waiter that quieted the sockets, or any waiter when there is
    /// no event thread): writing what waits for room in the established connections'
    /// sockets. Without it, the rest of a large message written while the socket was
    /// full waited for the waiter to give up spinning and sleep in `epoll`.
    pub(super) fn flush_tcp_backlog(&mut self) {
        if self.corked {
            return;
        }
        let mut ids = std::mem::take(&mut self.scratch_ids);
        ids.extend(self.tcp.iter().filter(|(_, c)| c.state == ConnState::Established && c.queued() > 0).map(|(id, _)| *id));
        for id in ids.drain(..) {
            self.tcp_writable(id);
        }
        self.scratch_ids = ids;
    }

    /// Schedules or sends acknowledgements after input from `peer`.
    pub(super) fn after_input(&mut self, peer: Addr) {
        let Some(link) = self.links.get_mut(&peer) else { return };
        let pending = link.recv.pending_ack();
        if pending == 0 {
            return;
        }
        if pending >= 32 {
            self.send_ack(peer);
        } else if link.ack_due.is_none() {
            link.ack_due = Some(Instant::now() + Duration::from_millis(5));
            self.timed.insert(peer);
            self.kick = true;
        }
        self.flush_tcp(peer);
    }

    /// Acknowledges at once everything taken in on every link, as a closing port's last
    /// word: a delayed acknowledgement would never go, and each peer would keep the
    /// frames for a replay that cannot come and wait out its linger to close.
    pub(super) fn acknowledge_all(&mut self) {
        let owed: Vec<Addr> = self.links.iter().filter(|(_, l)| l.recv.pending_ack() > 0).map(|(p, _)| *p).collect();
        for peer in owed {
            self.send_ack(peer);
        }
    }

    pub(super) fn send_ack(&mut self, peer: Addr) {
        let Some(link) = self.links.get_mut(&peer) else { return };
        let Some(cid) = link.conn else { return };
        let Some(c) = self.tcp.get_mut(&cid) else { return };
        if c.state != ConnState::Established {
            return;
        }
        let mut h = Header::new(Kind::Ack, Channel::Control, self.me, peer);
        h.ack = link.recv.take_ack();
        link.ack_due = None;
        c.queue(&Frame::control(h));
        self.write_unless_corked(cid);
    }

    /// Writes connection `cid`'s queue to its socket, unless the port is corked
    /// ([`crate::Port::cork`]): then it stays queued for `uncork`
    /// (`flush_tcp_backlog`). A failed write drops the connection (logged with the
    /// peer it was for); the link replays on the next one.
    pub(super) fn write_unless_corked(&mut self, cid: usize) {
        if self.corked {
            return;
        }
        let Some(c) = self.tcp.get_mut(&cid) else { return };
        if let Err(e) = c.write_out() {
            let msg = match c.peer {
                Some(p) => format!("write to {p}: {e}"),
                None => format!("write: {e}"),
            };
            self.conn_lost(cid, &msg);
        }
    }

    /// Decodes and handles buffered frames of connection `id`. Returns false if the
    /// connection was dropped.
    pub(super) fn process_frames(&mut self, id: usize) -> bool {
        loop {
            let State { tcp, links, proto, stats, .. } = self;
            let Some(c) = tcp.get_mut(&id) else { return false };
            let state = c.state;
            let conn_peer = c.peer;
            let checks_payloads = c.checks_payloads();
            let handshake: (Header, Vec<u8>);
            match c.dec.next_frame() {
                Ok(None) => {
                    self.try_direct(id);
                    return true;
                }
                Err(e) => {
                    stats.frames_rejected += 1;
                    let from = c.stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
                    let msg = NetError::Frame { from, error: e }.to_string();
                    self.log_error(format!("{msg}; resetting the connection"));
                    self.conn_lost(id, &msg);
                    return false;
                }
                Ok(Some((h, payload))) => {
                    if matches!(h.kind, Kind::Hello | Kind::HelloAck | Kind::Auth) {
                        handshake = (h, payload.to_vec());
                    } else {
                        let err = if state != ConnState::Established || conn_peer != Some(h.src) {
                            Some(format!("{:?} frame from {} before handshake", h.kind, h.src))
                        } else if let Err(e) = crate::tcp::check_payload_sum(checks_payloads, &h) {
                            Some(refused(stats, c, e))
                        } else if h.flags & FLAG_SUM_AFTER != 0 || h.kind == Kind::Sum || c.pending.holds_pieces() {
                            // A piece whose checksum follows, its sum, or whatever dares
                            // come between them.
                            match Self::summed_frame(&mut c.pending, &h, payload) {
                                Ok(ready) => {
                                    ready.iter().try_for_each(|p| deliver(links, proto, stats, &p.header, p.payload.as_deref())).err()
                                }
                                Err(e) => Some(refused(stats, c, e)),
                            }
                        } else {
                            deliver(links, proto, stats, &h, Some(payload)).err()
                        };
                        if let Some(msg) = err {
                            self.log_error(format!("protocol error on connection to {}: {msg}", h.src));
                            self.conn_lost(id, &msg);
                            return false;
                        }
                        continue;
                    }
                }
            }
            if !self.handshake(id, &handshake.0, &handshake.1) {
                return false;
            }
        }
    }

    /// A frame of connection `c` that takes part in deferred checksums: a piece whose
    /// checksum follows (held, a copy of its payload kept), or a sum (the pieces it
    /// clears, to deliver). Anything else while pieces are held is out of step.
    fn summed_frame(pending: &mut PendingSums, h: &Header, payload: &[u8]) -> Result<Vec<Held>, FrameError> {
        if h.flags & FLAG_SUM_AFTER != 0 {
            if h.kind != Kind::Data {
                return Err(FrameError::SumOutOfStep(format!("a {:?} frame asks for a checksum after it", h.kind)));
            }
            let crc = crate::frame::crc32c(payload);
            pending.hold(*h, crc, Some(Bytes::copy_from_slice(payload)))?;
            return Ok(Vec::new());
        }
        if h.kind != Kind::Sum {
            return Err(FrameError::SumOutOfStep(format!("a {:?} frame came before the checksums of the pieces ahead of it", h.kind)));
        }
        match crate::frame::decode_sums(payload) {
            Some(sums) if sums.len() as u64 == h.total => pending.take_summed(&sums),
            _ => Err(FrameError::SumOutOfStep(format!("a checksum frame of {} bytes announcing {} entries", payload.len(), h.total))),
        }
    }

    /// Receives the incomplete frame at the front of connection `id`'s decoder straight
    /// into its message's buffer, when it is the next rendezvous data piece with at
    /// least [`DIRECT_MIN`] bytes still to come: the kernel's copy is then the only
    /// one (the decoder's would be a second, about 30 µs per MiB here).
    fn try_direct(&mut self, id: usize) {
        let State { tcp, links, proto, .. } = self;
        let Some(c) = tcp.get_mut(&id) else { return };
        if !c.can_read_direct() {
            return;
        }
        let Some((h, have)) = c.dec.partial_header() else { return };
        if !matches!(h.kind, Kind::Data | Kind::Eager) || c.peer != Some(h.src) || (h.len as usize - have) < DIRECT_MIN {
            return;
        }
        if crate::tcp::check_payload_sum(c.checks_payloads(), &h).is_err() {
            // Refused once whole, by `process_frames`.
            return;
        }
        let next = match c.pending.next_seq_after_held() {
            // Behind pieces that wait for their sum, only another such piece may go in
            // place (anything else is refused once whole, by `process_frames`).
            Some(seq) => h.seq == seq && h.flags & FLAG_SUM_AFTER != 0,
            None => links.get(&h.src).is_some_and(|l| l.recv.is_next(h.seq)),
        };
        if !next {
            return;
        }
        if let Some(dest) = proto.direct_destination(&h) {
            c.start_direct(h, dest);
        }
    }

    /// Reads more of the data frame connection `id` receives in place (see
    /// [`State::try_direct`]) and, once it is whole and its checksum matches, delivers
    /// it as [`State::process_frames`] would have. `None` when the connection was
    /// dropped (a read error, a bad checksum, a protocol error).
    fn read_direct(&mut self, id: usize) -> Option<ReadOutcome> {
        let State { tcp, links, proto, stats, .. } = self;
        let c = tcp.get_mut(&id)?;
        let h = *c.direct_header()?;
        // The receive cannot go away meanwhile: started transfers are not cancellable,
        // and a failed peer's connections are gone before its requests are failed.
        let dest = proto.in_place_buffer(&h).expect("a receive in progress stays until its data is in");
        let outcome = match c.read_direct(dest) {
            Ok(o) => o,
            Err(e) => {
                self.conn_lost(id, &format!("read: {e}"));
                return None;
            }
        };
        let error = match c.finish_direct(dest) {
            None => return Some(outcome),
            Some(Err(e)) => refused(stats, c, e),
            Some(Ok(Finished::Held)) => return Some(outcome),
            Some(Ok(Finished::Deliver(h))) => match deliver(links, proto, stats, &h, None) {
                Ok(()) => return Some(outcome),
                Err(msg) => format!("protocol error on connection to {}: {msg}", h.src),
            },
        };
        self.log_error(error.clone());
        self.conn_lost(id, &error);
        None
    }

    pub(super) fn handshake(&mut self, id: usize, h: &Header, payload: &[u8]) -> bool {
        use crate::auth::{Role, MAC_LEN, NONCE_LEN};
        let peer = h.src;
        if h.dst != self.me {
            self.log_error(format!("handshake from {peer} addressed to {}, not {}", h.dst, self.me));
            self.conn_lost(id, "misaddressed handshake");
            return false;
        }
        let key = self.cfg.key.clone();
        let c = self.tcp.get(&id).unwrap();
        // A peer that wants authentication when we have no key (or the reverse) is
        // refused: neither side can check the other.
        let refuse = |st: &mut State, why: String| {
            st.stats.auth_failures += 1;
            st.log_error(format!("connection from {peer} refused: {why}"));
            st.conn_lost(id, &why);
            false
        };
        match (h.kind, c.state) {
            (Kind::Hello, ConnState::Accepted) => match key {
                None if !payload.is_empty() => refuse(self, "it authenticates its links, this port has no key".into()),
                None => self.accept_hello(id, h, true),
                Some(_) if payload.len() != NONCE_LEN => refuse(self, "it did not authenticate (no key, or another key setting)".into()),
                Some(k) => {
                    let nonce_a = match crate::auth::nonce() {
                        Ok(n) => n,
                        Err(e) => return refuse(self, format!("no randomness for a nonce: {e}")),
                    };
                    let mut nonce_i = [0u8; NONCE_LEN];
                    nonce_i.copy_from_slice(payload);
                    let proof = k.proof(Role::Acceptor, &nonce_i, &nonce_a, peer, self.me);
                    let mut a = Header::new(Kind::HelloAck, Channel::Control, self.me, peer);
                    self.announce_terms(&mut a);
                    // A new incarnation starts from nothing (its link is reset once
                    // it has authenticated, in `accept_hello`).
                    let same = |l: &&Link| l.incarnation.is_none_or(|i| i == h.tag);
                    a.ack = self.links.get(&peer).filter(same).map_or(0, |l| l.recv.delivered());
                    a.tag = self.incarnation;
                    let c = self.tcp.get_mut(&id).unwrap();
                    c.queue(&Frame { header: a, payload: Bytes::from([&nonce_a[..], &proof[..]].concat()) });
                    c.peer = Some(peer);
                    c.state = ConnState::AuthWait;
                    c.nonce_mine = Some(nonce_a);
                    c.nonce_theirs = Some(nonce_i);
                    c.pending_hello = Some(*h);
                    self.tcp_writable(id);
                    self.tcp.contains_key(&id)
                }
            },
            (Kind::Auth, ConnState::AuthWait) if c.peer == Some(peer) => {
                let (Some(k), Some(nonce_a), Some(nonce_i), Some(hello)) = (key, c.nonce_mine, c.nonce_theirs, c.pending_hello) else {
                    return refuse(self, "authentication out of order".into());
                };
                if !k.verify(Role::Initiator, &nonce_i, &nonce_a, peer, self.me, payload) {
                    return refuse(self, "authentication failed (another key?)".into());
                }
                self.accept_hello(id, &hello, false)
            }
            (Kind::HelloAck, ConnState::HelloSent) if c.peer == Some(peer) => {
                match (&key, c.nonce_mine) {
                    (None, _) if !payload.is_empty() => return refuse(self, "it authenticates its links, this port has no key".into()),
                    (None, _) => {}
                    (Some(k), Some(nonce_i)) => {
                        if payload.len() != NONCE_LEN + MAC_LEN {
                            return refuse(self, "it did not authenticate (no key, or another key setting)".into());
                        }
                        let (nonce_a, proof) = payload.split_at(NONCE_LEN);
                        if !k.verify(Role::Acceptor, &nonce_i, nonce_a, self.me, peer, proof) {
                            return refuse(self, "authentication failed (another key?)".into());
                        }
                        let mine = k.proof(Role::Initiator, &nonce_i, nonce_a, self.me, peer);
                        let auth = Header::new(Kind::Auth, Channel::Control, self.me, peer);
                        self.tcp.get_mut(&id).unwrap().queue(&Frame { header: auth, payload: Bytes::copy_from_slice(&mine) });
                    }
                    (Some(_), None) => return refuse(self, "authentication out of order".into()),
                }
                self.check_incarnation(peer, h.tag);
                self.agree_terms(id, h);
                self.tcp.get_mut(&id).unwrap().state = ConnState::Established;
                self.established(peer, id, h.ack)
            }
            (k, s) => {
                self.log_error(format!("unexpected {k:?} from {peer} in state {s:?}"));
                self.conn_lost(id, "handshake out of order");
                false
            }
        }
    }

    /// A peer's `Hello` takes effect (at once, or once the peer proved it holds the
    /// key): the connection becomes the peer's link. `send_ack`: answer with `HelloAck`
    /// (an authenticated handshake sent it already).
    fn accept_hello(&mut self, id: usize, h: &Header, send_ack: bool) -> bool {
        let peer = h.src;
        self.check_incarnation(peer, h.tag);
        let link = self.links.entry(peer).or_default();
        if let Some(existing) = link.conn.filter(|&e| e != id) {
            let ours_pending = self.tcp.get(&existing).is_some_and(|e| e.initiator && e.state != ConnState::Established);
            if ours_pending && self.me < peer {
                // Simultaneous connect: the lower address's connection wins.
                self.close_tcp(id);
                return false;
            }
            // An established connection replaced by the peer's new one was lost on
            // its side before ours saw it fail (its reset may still be on the way):
            // counted as lost, as if we had read the reset first.
            let was_up = self.tcp.get(&existing).is_some_and(|e| e.state == ConnState::Established);
            self.close_tcp(existing);
            if was_up {
                self.stats.connections_lost += 1;
            }
        }
        self.agree_terms(id, h);
        let mut a = Header::new(Kind::HelloAck, Channel::Control, self.me, peer);
        self.announce_terms(&mut a);
        let link = self.links.get_mut(&peer).unwrap();
        link.conn = Some(id);
        let c = self.tcp.get_mut(&id).unwrap();
        c.peer = Some(peer);
        c.state = ConnState::Established;
        if send_ack {
            a.ack = link.recv.delivered();
            a.tag = self.incarnation;
            c.queue(&Frame::control(a));
        }
        self.established(peer, id, h.ack)
    }

    /// Whether this port trusts TCP's own checksums for its data
    /// ([`crate::tcp::TcpChecksums`]). An encrypted port does not say so: its seals
    /// check every byte, and its links carry no payload checksums in either setting.
    fn trusts_tcp(&self) -> bool {
        self.cfg.tcp_checksums == TcpChecksums::Headers && !self.cfg.encrypt
    }

    /// What this port says of its data in its `Hello` or `HelloAck` `h`: whether it
    /// trusts TCP ([`State::trusts_tcp`]), and then, in `total`, the largest payload it
    /// accepts (the pieces a peer that trusts TCP too may send it).
    fn announce_terms(&self, h: &mut Header) {
        if self.trusts_tcp() {
            h.flags |= FLAG_TRUST_TCP;
            h.total = self.cfg.max_frame as u64;
        }
    }

    /// Settles connection `id` by what the peer said in its handshake frame `h`: if
    /// both ends trust TCP, data goes without payload checksums, in pieces as large as
    /// both accept; otherwise checksummed, in pieces of `tcp_chunk`.
    fn agree_terms(&mut self, id: usize, h: &Header) {
        let both = self.trusts_tcp() && h.flags & FLAG_TRUST_TCP != 0;
        let chunk = both.then(|| self.cfg.max_frame.min(usize::try_from(h.total).unwrap_or(usize::MAX))).filter(|&c| c > 0);
        self.proto.set_peer_chunk(h.src, chunk);
        if both {
            if let Some(c) = self.tcp.get_mut(&id) {
                c.trust_tcp();
                self.stats.connections_trusting_tcp += 1;
            }
        }
    }

    /// A new incarnation of `peer` (it restarted): its old conversation is over.
    pub(super) fn check_incarnation(&mut self, peer: Addr, inc: u64) {
        let link = self.links.entry(peer).or_default();
        match link.incarnation {
            Some(old) if old != inc => {
                let conn = link.conn;
                *link = Link::new();
                link.conn = conn;
                link.incarnation = Some(inc);
                self.proto.peer_failed(peer, "peer restarted");
                self.proto.peer_recovered(peer);
            }
            _ => link.incarnation = Some(inc),
        }
        self.proto.peer_recovered(peer);
    }

    pub(super) fn established(&mut self, peer: Addr, id: usize, peer_has: u64) -> bool {
        self.stats.connections_established += 1;
        let link = self.links.get_mut(&peer).unwrap();
        link.down_since = None;
        link.retry_at = None;
        link.backoff = Duration::ZERO;
        let replay = match link.send.replay(peer_has) {
            Ok(r) => r,
            Err(e) => {
                let msg = e.to_string();
                self.log_error(format!("handshake with {peer}: {msg}"));
                self.conn_lost(id, &msg);
                return false;
            }
        };
        let c = self.tcp.get_mut(&id).unwrap();
        self.stats.frames_replayed += replay.len() as u64;
        for mut f in replay {
            f.header.ack = link.recv.delivered();
            c.queue(&f);
        }
        debug!("{}: link to {peer} established", self.me);
        self.flush_tcp(peer);
        self.tcp.contains_key(&id)
    }

    pub(super) fn close_tcp(&mut self, id: usize) {
        if let Some(mut c) = self.tcp.remove(&id) {
            let _ = self.tcp_set.registry.deregister(&mut c.stream);
            self.forget_undelivered(&c);
        }
    }

    /// Pieces of a connection given up that were read in place but not delivered (the
    /// one being read, those waiting for their sum) are cut from their buffers: their
    /// bytes come again when the link replays, appended from where the first started.
    fn forget_undelivered(&mut self, c: &TcpConn) {
        let in_place = c.pending.held().filter(|p| p.payload.is_none()).map(|p| &p.header);
        for h in in_place.chain(c.direct_header()) {
            // A claimed eager receive stays claimed: the frame's replay lands in it.
            if let Some(dest) = self.proto.in_place_buffer(h) {
                dest.truncate(h.offset as usize);
            }
        }
    }

    pub(super) fn conn_lost(&mut self, id: usize, reason: &str) {
        let Some(mut c) = self.tcp.remove(&id) else { return };
        let _ = self.tcp_set.registry.deregister(&mut c.stream);
        self.forget_undelivered(&c);
        self.stats.connections_lost += 1;
        debug!("{}: connection {id} lost: {reason}", self.me);
        if let Some(peer) = c.peer {
            if self.links.get(&peer).is_some_and(|l| l.conn == Some(id)) {
                self.link_down(peer, reason);
            }
        }
    }

    /// See [`crate::Port::forget_peer`].
    pub(super) fn forget_peer(&mut self, peer: Addr) {
        self.timed.remove(&peer);
        // The link goes first, so that dropping its connection does not take it down
        // (and reconnect it).
        if let Some(cid) = self.links.remove(&peer).and_then(|l| l.conn) {
            self.conn_lost(cid, "the peer left");
        }
        self.proto.peer_failed(peer, "the peer left");
    }

    pub(super) fn link_down(&mut self, peer: Addr, reason: &str) {
        let timeout = self.cfg.reconnect_timeout;
        let link = self.links.entry(peer).or_default();
        link.conn = None;
        self.timed.insert(peer);
        let now = Instant::now();
        let since = *link.down_since.get_or_insert(now);
        link.backoff = if link.backoff.is_zero() { Duration::from_millis(1) } else { (link.backoff * 2).min(Duration::from_millis(500)) };
        link.retry_at = Some(now + link.backoff);
        self.kick = true;
        if now.duration_since(since) > timeout {
            self.links.remove(&peer);
            self.log_error(format!("giving up on {peer} after {timeout:?}: {reason}"));
            self.proto.peer_failed(peer, reason);
        }
    }
}

/// Delivers frame `h` of an established link as its window admits it: with its payload
/// (`Some`, copied to where it goes) or, `None`, a data piece already read into its
/// message's buffer. The protocol error that drops the connection, if any.
fn deliver(
    links: &mut FxHashMap<Addr, Link>,
    proto: &mut Proto,
    stats: &mut PortStats,
    h: &Header,
    payload: Option<&[u8]>,
) -> Result<(), String> {
    let link = links.get_mut(&h.src).expect("established connection has a link");
    link.send.on_ack(h.ack).map_err(|e| e.to_string())?;
    if !h.kind.is_sequenced() {
        return Ok(());
    }
    match link.recv.admit(h.seq).map_err(|e| e.to_string())? {
        Admit::Deliver => match payload {
            Some(payload) => proto.on_frame(h, payload).map_err(|e| e.to_string())?,
            None if h.kind == Kind::Eager => {
                proto.eager_received_in_place(h).map_err(|e| e.to_string())?;
                stats.pieces_in_place += 1;
            }
            None => {
                proto.data_received_in_place(h).map_err(|e| e.to_string())?;
                stats.pieces_in_place += 1;
            }
        },
        Admit::Duplicate if payload.is_some() => stats.duplicates_dropped += 1,
        Admit::Duplicate => return Err(format!("data frame {} taken in place was already delivered", h.seq)),
    }
    Ok(())
}

/// Counts a frame of connection `c` refused for `error` and says why, for the log and
/// the connection's loss.
fn refused(stats: &mut PortStats, c: &TcpConn, error: FrameError) -> String {
    stats.frames_rejected += 1;
    let from = c.stream.peer_addr().map(|a| a.to_string()).unwrap_or_else(|_| "?".into());
    format!("{}; resetting the connection", NetError::Frame { from, error })
}
