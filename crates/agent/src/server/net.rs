//! gepsea-net plumbing: posting receives, sending envelopes to clients and peers, and
//! turning completions into requests and replies.

use super::*;

impl Agent {
    pub(super) fn post_receives(&mut self) {
        let r = self.port.irecv_into(None, Some(TAG_REQUEST), self.buffers.take());
        self.net.insert(r, NetOp::RecvRequest);
        let r = self.port.irecv_into(None, Some(TAG_PEER), self.buffers.take());
        self.net.insert(r, NetOp::RecvPeer);
    }

    /// Sends are detached: a failed one shows up as its peer's failure (an agent's
    /// `PeerFailed`, a client's closed registration socket), and taking a completion
    /// event for each would cost the loop more than the send.
    pub(super) fn send_env<T: serde::Serialize>(&mut self, dst: Addr, tag: u64, message: &T) {
        let counter = &mut self.large_counter;
        self.encoder.send_detached(&self.port, dst, tag, message, || {
            *counter += 1;
            TAG_LARGE | *counter
        });
    }

    pub(super) fn send_peer(&mut self, node: u32, m: &PeerMsg) {
        if node == self.me {
            self.loopback.push_back(m.clone());
        } else {
            self.cork();
            // Held-back messages go first: each agent's messages stay in order.
            self.flush_lazy();
            self.send_env(Addr::new(node, 0), TAG_PEER, m);
        }
    }

    /// Messages to other agents leave at the end of the loop's pass (`Agent::turn`),
    /// each agent's in one write (a board write's backup copy and its answer; a
    /// release's answer and the next lock's grant): each write is a system call that
    /// also runs the receiver's network input path, and the last message waited
    /// behind the others'. Corked at the first such message only, so that a pass with
    /// local work alone takes no extra lock.
    fn cork(&mut self) {
        if !self.corked {
            self.corked = true;
            self.port.cork();
        }
    }

    /// Sends `m` to another agent with the next message to any agent, or within
    /// [`LAZY_FOR`], or before the loop sleeps, whichever comes first: for a message
    /// nobody waits for (the owner's answer to an early-answered release). In a lock
    /// pair loop the release and the next lock request arrive back to back; the
    /// release's answer was a write of its own, and the grant waited behind its
    /// system call. Held back, it leaves with the grant in one write (see
    /// `Agent::turn`'s cork).
    ///
    /// The release itself is not held back: measured on 4 nodes contending for one
    /// lock, holding it cost ≈12 % of the lock pairs (the next holder waited for it).
    pub(super) fn send_peer_lazy(&mut self, node: u32, m: PeerMsg) {
        if node == self.me {
            self.loopback.push_back(m);
            return;
        }
        if self.lazy.is_empty() {
            self.lazy_deadline = Some(Instant::now() + LAZY_FOR);
        }
        self.lazy.push((node, m));
    }

    /// Sends every held-back message now.
    pub(super) fn flush_lazy(&mut self) {
        if self.lazy.is_empty() {
            return;
        }
        self.lazy_deadline = None;
        for (node, m) in std::mem::take(&mut self.lazy) {
            self.send_env(Addr::new(node, 0), TAG_PEER, &m);
        }
    }

    pub(super) fn reply(&mut self, to: ReplyTo, r: Reply) {
        match to {
            ReplyTo::Local(tx) => {
                let _ = tx.send(r);
            }
            ReplyTo::Peer { node, op } => self.send_peer(node, &PeerMsg::Reply { op, reply: r }),
            ReplyTo::Discard => {}
            ReplyTo::Client { port, id } => {
                self.cancellable.remove(&(port, id));
                if self.clients.contains_key(&port) {
                    self.send_env(Addr::new(self.me, port), TAG_REPLY | id, &r);
                }
            }
        }
    }

    pub(super) fn net_completed(&mut self, id: ReqId) {
        let Some(kind) = self.net.remove(&id) else { return };
        let Some(res) = self.port.take_completed(id) else {
            self.net.insert(id, kind);
            return;
        };
        match (kind, res) {
            // The receive is posted again after the message is handled, so that the
            // reply goes out first: one that arrives meanwhile waits as unexpected and
            // matches when posted.
            (NetOp::RecvRequest, res) => {
                if let Ok(Completion::Received(m)) = res {
                    self.envelope(m.src, false, &m.data);
                    self.buffers.give_back(m.data);
                }
                let r = self.port.irecv_into(None, Some(TAG_REQUEST), self.buffers.take());
                self.net.insert(r, NetOp::RecvRequest);
            }
            (NetOp::RecvPeer, res) => {
                if let Ok(Completion::Received(m)) = res {
                    self.envelope(m.src, true, &m.data);
                    self.buffers.give_back(m.data);
                }
                let r = self.port.irecv_into(None, Some(TAG_PEER), self.buffers.take());
                self.net.insert(r, NetOp::RecvPeer);
            }
            (NetOp::RecvLarge { src, peer }, Ok(Completion::Received(m))) => self.body(src, peer, &m.data),
            (NetOp::RecvLarge { src, .. }, Err(e)) => warn!("node {}: large message from {src} lost: {e}", self.me),
            (NetOp::Rma { reply_to_port, id, .. }, res) => {
                let reply = match res {
                    Ok(Completion::Put) => Reply::Ok,
                    Ok(Completion::Got(d)) => Reply::Data(d),
                    Ok(other) => Reply::err(ErrorKind::Failed, format!("unexpected completion {other:?}")),
                    Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
                };
                if let Some(port) = reply_to_port {
                    self.reply(ReplyTo::Client { port, id }, reply);
                } else if let Some((_, to)) = self.peer_ops.remove(&id) {
                    self.reply(to, reply);
                }
            }
            _ => {}
        }
    }

    pub(super) fn envelope(&mut self, src: Addr, peer: bool, data: &[u8]) {
        match decode::<Envelope>("envelope", data) {
            Ok(Envelope::Inline(b)) => self.body(src, peer, b),
            Ok(Envelope::Large { len, tag }) => {
                if len as usize > MAX_BODY || tag & TAG_LARGE == 0 {
                    warn!("node {}: {src} announced a body of {len} bytes (limit {MAX_BODY}) on tag {tag:#x}; ignored", self.me);
                    return;
                }
                let r = self.port.irecv(Some(src), Some(tag), len as usize);
                self.net.insert(r, NetOp::RecvLarge { src, peer });
            }
            Err(e) => warn!("node {}: dropping a message from {src}: {e}", self.me),
        }
    }

    pub(super) fn body(&mut self, src: Addr, peer: bool, body: &[u8]) {
        if peer {
            self.peer_messages += 1;
            match decode::<PeerMsg>("agent message", body) {
                Ok(m) => {
                    if super::spin::is_background(&m) {
                        self.background_messages += 1;
                    }
                    self.peer_msg(src.node, m)
                }
                Err(e) => warn!("node {}: dropping a message from agent {}: {e}", self.me, src.node),
            }
            return;
        }
        if src.node != self.me || !self.clients.contains_key(&src.port) {
            warn!("node {}: request from unregistered port {src}; ignored", self.me);
            return;
        }
        match decode::<Request>("request", body) {
            Ok(r) => self.request(Client::new(self.me, src.port), r.op, ReplyTo::Client { port: src.port, id: r.id }),
            Err(e) => {
                // The id is the first field; answer it if it can be read at all.
                let id = postcard::take_from_bytes::<u64>(body).map(|(id, _)| id).ok();
                warn!("node {}: malformed request from {src}: {e}", self.me);
                if let Some(id) = id {
                    self.reply(
                        ReplyTo::Client { port: src.port, id },
                        Reply::err(ErrorKind::BadRequest, format!("{e} (is the client library the agent's version?)")),
                    );
                }
            }
        }
    }
}
