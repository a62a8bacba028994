//! Local links: shared-memory connections to ports on this node (accepting and
//! connecting over the Unix socket, draining rings, noticing a dead peer).

use super::*;

impl State {
    pub(super) fn accept_unix(&mut self) {
        loop {
            match self.unix_listener.accept() {
                Ok((s, _)) => {
                    if let Err(why) = crate::trust::peer_allowed(&s) {
                        self.log_error(format!("refused a shared-memory connection: {why}"));
                        continue;
                    }
                    // SAFETY: converting an owned descriptor between wrapper types.
                    let std_sock = unsafe { std::os::unix::net::UnixStream::from_raw_fd(s.into_raw_fd()) };
                    let _ = std_sock.set_nonblocking(false);
                    match ShmConn::accept(std_sock) {
                        Ok(c) => {
                            let peer = c.peer;
                            self.proto.peer_recovered(peer);
                            let id = self.add_shm(c);
                            self.shm_send.entry(peer).or_insert(id);
                            self.drain_shm(id);
                        }
                        Err(e) => self.log_error(format!("shared-memory handshake refused: {e}")),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    self.log_error(format!("accept on unix socket: {e}"));
                    return;
                }
            }
        }
    }

    pub(super) fn add_shm(&mut self, mut c: ShmConn) -> usize {
        let id = self.next_id;
        self.next_id += 1;
        c.set_awake(self.awake > 0);
        let bell = c.my_bell.raw();
        let _ = self.registry.register(&mut SourceFd(&bell), bell_token(id), Interest::READABLE);
        let _ = self.registry.register(&mut c.sock, shm_sock_token(id), Interest::READABLE);
        self.shm.insert(id, c);
        self.shm_ids.push(id);
        id
    }

    pub(super) fn connect_shm(&mut self, peer: Addr) -> Result<usize, NetError> {
        let dir = self.cfg.runtime_dir();
        let path = dir.join(format!("port-{}.sock", peer.port));
        let sock = std::os::unix::net::UnixStream::connect(&path)
            .map_err(|e| NetError::Unreachable { peer, reason: format!("{}: {e}", path.display()) })?;
        // Whole records, and room for the largest frame (a ring takes records of up to
        // half its size).
        let largest = crate::ring::record_size(COMPACT_MAX + self.cfg.proto.chunk.max(self.cfg.proto.eager_threshold));
        let ring_bytes = self.cfg.ring_bytes.max(2 * largest).next_multiple_of(2 * crate::ring::RECORD_ALIGN);
        let c = ShmConn::create(self.me, peer, sock, ring_bytes)?;
        let id = self.add_shm(c);
        self.shm_send.insert(peer, id);
        Ok(id)
    }

    pub(super) fn drain_shm(&mut self, id: usize) {
        let State { shm, proto, cfg, space_owed, .. } = self;
        let Some(c) = shm.get_mut(&id) else { return };
        let max = cfg.max_frame.max(cfg.proto.chunk);
        let mut consumed = false;
        let mut failure = None;
        let (src, dst) = (c.peer, proto.addr());
        loop {
            let r = c.rx.pop_with(|rec| -> Result<(), NetError> {
                let (h, hlen) =
                    Header::decode_compact(rec, src, dst, max).map_err(|e| NetError::Frame { from: "shared memory".into(), error: e })?;
                let payload = &rec[hlen..];
                h.check_payload(payload).map_err(|e| NetError::Frame { from: "shared memory".into(), error: e })?;
                proto.on_frame(&h, payload)
            });
            match r {
                None => break,
                Some(res) => {
                    consumed = true;
                    if let Err(e) = res {
                        failure = Some(e);
                        break;
                    }
                }
            }
        }
        if consumed {
            c.owe_space();
            *space_owed = true;
        }
        if let Some(e) = failure {
            let peer = c.peer;
            self.log_error(format!("shared-memory connection with {peer}: {e}"));
            self.drop_shm(id, &e.to_string());
        }
    }

    pub(super) fn check_shm_alive(&mut self, id: usize) {
        let Some(c) = self.shm.get_mut(&id) else { return };
        let mut b = [0u8; 64];
        use std::io::Read;
        match c.sock.read(&mut b) {
            Ok(0) => {
                // Peer exited: take what it left in the ring, then fail what remains.
                self.drain_shm(id);
                let peer = self.shm[&id].peer;
                debug!("{}: shared-memory peer {peer} closed", self.me);
                self.drop_shm(id, "process exited (shared-memory connection closed)");
            }
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => {
                self.drain_shm(id);
                self.drop_shm(id, &format!("shared-memory socket error: {e}"));
            }
        }
    }

    pub(super) fn drop_shm(&mut self, id: usize, reason: &str) {
        if let Some(mut c) = self.shm.remove(&id) {
            self.shm_ids.retain(|&x| x != id);
            let bell = c.my_bell.raw();
            let _ = self.registry.deregister(&mut SourceFd(&bell));
            let _ = self.registry.deregister(&mut c.sock);
            let peer = c.peer;
            let others = self.shm.values().any(|o| o.peer == peer);
            if self.shm_send.get(&peer) == Some(&id) {
                self.shm_send.remove(&peer);
            }
            if !others {
                self.proto.peer_failed(peer, reason);
            } else if !self.shm_send.contains_key(&peer) {
                if let Some((oid, _)) = self.shm.iter().find(|(_, o)| o.peer == peer) {
                    self.shm_send.insert(peer, *oid);
                }
            }
        }
    }
}
