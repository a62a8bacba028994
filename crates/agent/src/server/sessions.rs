//! The registration socket: local clients connect and register, and are watched, so a
//! client that dies is noticed by its closed socket.

use super::*;

impl Agent {
    pub(super) fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    if let Err(why) = gepsea_net::trust::peer_allowed(&stream) {
                        warn!("refused a client: {why}");
                        continue;
                    }
                    if self.sessions.len() >= self.cfg.max_sessions {
                        let why = format!(
                            "node {}: {} connections already open on the registration socket (the limit; raise --max-sessions)",
                            self.me,
                            self.sessions.len()
                        );
                        warn!("refused a client: {why}");
                        let _ = unix::write(&mut stream, &encode(&LocalReply::Refused(why)));
                        continue;
                    }
                    let t = Token(self.next_session);
                    self.next_session += 1;
                    if self.poll.registry().register(&mut stream, t, Interest::READABLE).is_ok() {
                        self.sessions.insert(t, Session { stream, buf: Vec::new(), port: None });
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    warn!("accepting a client: {e}");
                    return;
                }
            }
        }
    }

    pub(super) fn session_ready(&mut self, t: Token) {
        let mut closed = false;
        let mut frames = Vec::new();
        if let Some(s) = self.sessions.get_mut(&t) {
            let mut chunk = [0u8; 4096];
            loop {
                match s.stream.read(&mut chunk) {
                    Ok(0) => {
                        closed = true;
                        break;
                    }
                    Ok(n) => s.buf.extend_from_slice(&chunk[..n]),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                    Err(_) => {
                        closed = true;
                        break;
                    }
                }
            }
            loop {
                match unix::split(&mut s.buf) {
                    Ok(Some(f)) => frames.push(Ok(f)),
                    Ok(None) => break,
                    Err(e) => {
                        frames.push(Err(e));
                        break;
                    }
                }
            }
        }
        for f in frames {
            let reply = match f {
                Ok(body) => match decode::<LocalRequest>("registration message", &body) {
                    Ok(r) => self.local_request(t, r),
                    Err(e) => LocalReply::Refused(e.to_string()),
                },
                Err(e) => {
                    closed = true;
                    LocalReply::Refused(format!("malformed registration frame: {e}"))
                }
            };
            if let Some(s) = self.sessions.get_mut(&t) {
                let _ = unix::write(&mut s.stream, &encode(&reply));
            }
        }
        if closed {
            if let Some(mut s) = self.sessions.remove(&t) {
                let _ = self.poll.registry().deregister(&mut s.stream);
                if let Some(p) = s.port {
                    self.client_died(p);
                }
            }
        }
    }

    pub(super) fn local_request(&mut self, t: Token, r: LocalRequest) -> LocalReply {
        match r {
            LocalRequest::Status => LocalReply::Status(serde_json::to_string_pretty(&self.status()).unwrap()),
            LocalRequest::Register { pid, name } => {
                if let Some(p) = self.sessions.get(&t).and_then(|s| s.port) {
                    return LocalReply::Refused(format!("this connection is already registered (port {p}); a process registers once"));
                }
                if let Some((p, _)) = self.clients.iter().find(|(_, c)| c.pid == pid) {
                    return LocalReply::Refused(format!(
                        "process {pid} is already registered with this agent (port {p}); a process registers once"
                    ));
                }
                // Skip ports whose socket still exists: processes that registered with
                // a dead predecessor of this agent may still hold them.
                while self.runtime_dir.join(format!("port-{}.sock", self.next_port)).exists() {
                    self.next_port += 1;
                }
                let port = self.next_port;
                self.next_port += 1;
                self.sessions.get_mut(&t).unwrap().port = Some(port);
                self.clients.insert(
                    port,
                    ClientInfo {
                        session: t,
                        pid,
                        name: name.clone(),
                        inbox: Inbox::new(),
                        parked: None,
                        activity: Activity::Idle,
                        holds: Vec::new(),
                    },
                );
                info!("node {}: registered {name:?} (pid {pid}) as port {port}", self.me);
                self.publish_state();
                LocalReply::Registered { node: self.me, port, namespace: self.cfg.namespace.clone(), ready: self.ready }
            }
        }
    }

    pub(super) fn client_died(&mut self, port: u32) {
        let Some(c) = self.clients.remove(&port) else { return };
        info!("node {}: client {:?} (pid {}, port {port}) is gone; releasing what it held", self.me, c.name, c.pid);
        let _ = c.session;
        let client = Client::new(self.me, port);
        self.cancellable.retain(|(p, _), _| *p != port);
        let takes: Vec<u64> = self.takes.iter().filter(|(_, (c, _, _))| *c == client).map(|(o, _)| *o).collect();
        for op in takes {
            self.takes.remove(&op);
        }
        self.holding.retain(|_, c| *c != client);
        self.held_locks.retain(|(_, c), _| *c != client);
        self.after_release.retain(|(_, c), _| *c != client);
        // Its port socket stays behind if it was killed.
        let _ = std::fs::remove_file(self.runtime_dir.join(format!("port-{port}.sock")));
        for p in self.registry.all() {
            p.process_died(client);
        }
        for n in self.view.clone() {
            self.send_peer(n, &PeerMsg::ProcessDied { client });
        }
        self.publish_state();
    }
}
