//! The application's side of a [`Port`]: opening it, sends and receives on the three
//! channels, RMA, completion (`test`/`wait`), events and statistics. Calls take the
//! state's lock and push their own sends straight out; `wait` itself is in `wait.rs`.

use super::*;

impl Port {
    /// Opens the port: binds its Unix socket (and TCP listener), publishes its address,
    /// starts the event thread.
    pub fn open(cfg: PortConfig) -> Result<Port, NetError> {
        if cfg.encrypt && cfg.key.is_none() {
            return Err(NetError::EncryptWithoutKey);
        }
        if let Some(name) = &cfg.tcp_congestion {
            crate::tcp::check_congestion(name)?;
        }
        if let Some(Err(e)) = crate::tcp::buffer_setting_from_env() {
            return Err(e);
        }
        if let Some(Err(e)) = crate::tcp::checksums_from_env() {
            return Err(e);
        }
        crate::trust::check_namespace(&cfg.namespace)?;
        let me = cfg.addr;
        let dir = cfg.runtime_dir();
        crate::trust::ensure_private_dir(&dir)?;
        let sock_path = dir.join(format!("port-{}.sock", me.port));
        let unix_listener = bind_unix(&sock_path, me).inspect_err(|_| {
            // Leave no directories made for a port that never opened (empty ones only:
            // other ports of the node or namespace may be using them).
            let _ = std::fs::remove_dir(&dir);
            if let Some(ns_dir) = dir.parent() {
                let _ = std::fs::remove_dir(ns_dir);
            }
        })?;
        let tcp_listener = match cfg.listen {
            Some(a) => Some(mio::net::TcpListener::bind(a).map_err(|e| NetError::io(format!("listening on {a}"), e))?),
            None => None,
        };
        let mut dir_entry = None;
        if let (Some(d), Some(l)) = (&cfg.directory, &tcp_listener) {
            let local = l.local_addr().map_err(|e| NetError::io("listener address", e))?;
            std::fs::create_dir_all(d).map_err(|e| NetError::io(format!("creating directory {}", d.display()), e))?;
            let entry = directory_entry(d, me);
            let tmp = entry.with_extension(format!("tmp{}", std::process::id()));
            std::fs::write(&tmp, local.to_string()).map_err(|e| NetError::io(format!("writing {}", tmp.display()), e))?;
            std::fs::rename(&tmp, &entry).map_err(|e| NetError::io(format!("publishing {}", entry.display()), e))?;
            dir_entry = Some(entry);
        }
        let poll = Poll::new().map_err(|e| NetError::io("epoll", e))?;
        let registry = poll.registry().try_clone().map_err(|e| NetError::io("epoll", e))?;
        let waker = Waker::new(poll.registry(), WAKER).map_err(|e| NetError::io("waker", e))?;
        let mut unix_listener = unix_listener;
        registry.register(&mut unix_listener, UNIX_LISTENER, Interest::READABLE).map_err(|e| NetError::io("register", e))?;
        let tcp_set = tcp_set::TcpSet::new(&registry, TCP_SET).map_err(|e| NetError::io("epoll for the TCP connections", e))?;
        let mut tcp_listener = tcp_listener;
        if let Some(l) = tcp_listener.as_mut() {
            registry.register(l, TCP_LISTENER, Interest::READABLE).map_err(|e| NetError::io("register", e))?;
        }
        let incarnation = {
            let mut b = [0u8; 8];
            let _ = getrandom(&mut b);
            u64::from_le_bytes(b) | 1
        };
        let spin = cfg.spin;
        let snooze_after = cfg.snooze_after;
        let lease = cfg.lease;
        let progress = cfg.progress;
        let linger = cfg.linger;
        let trace = match &cfg.trace {
            Some(p) => Some(crate::trace::Tracer::create(p).map_err(|e| NetError::io(format!("creating the trace {}", p.display()), e))?),
            None => None,
        };
        let timer = match progress {
            Progress::Thread => {
                // Deadlines go through a timerfd: epoll's timeout only has millisecond
                // resolution.
                let t = crate::timer::Timer::new()?;
                registry
                    .register(&mut SourceFd(&t.raw()), TIMER, Interest::READABLE)
                    .map_err(|e| NetError::io("registering the timer", e))?;
                Some(Arc::new(t))
            }
            Progress::Inline => None,
        };
        let mut proto = Proto::new(me, cfg.proto.clone());
        proto.set_remote_chunk(cfg.tcp_chunk.min(cfg.max_frame).max(1));
        // An encrypted link opens records before it can decode a frame, so nothing is
        // read in place there, and its 64 KiB messages were slower eager (a ping-pong
        // 111-138 µs one way against 80-107 by rendezvous): both ends of a link encrypt
        // or neither does, so the limit agrees.
        if !cfg.encrypt {
            proto.set_remote_eager(cfg.tcp_eager.min(cfg.max_frame));
            // Only plain links carry payload checksums, and a port that trusts TCP
            // sends them only to peers that do not (after the pieces: `tcp::SUM_AFTER_MIN`).
            proto.set_sum_ahead(cfg.tcp_checksums == crate::tcp::TcpChecksums::Full);
        }
        proto.offer_single_copy(cfg.single_copy.then(std::process::id));
        proto.help_split_copies(cfg.progress == Progress::Thread);
        let tcp_buffer = cfg.tcp_buffer.filter(|&bytes| crate::tcp::buffers_allowed(bytes, crate::tcp::buffer_limit()));
        let st = State {
            proto,
            me,
            incarnation,
            cfg,
            tcp_buffer,
            registry,
            unix_listener,
            tcp_listener,
            shm: FxHashMap::default(),
            shm_ids: Vec::new(),
            shm_send: FxHashMap::default(),
            tcp: FxHashMap::default(),
            links: FxHashMap::default(),
            scratch: Vec::new(),
            scratch_ids: Vec::new(),
            next_room_look: Instant::now(),
            space_owed: false,
            next_id: 0,
            awake: 0,
            in_wait: 0,
            waiters: 0,
            app_bell: Bell::new()?,
            app_bell_set: false,
            stats: PortStats::default(),
            kick: false,
            lease: None,
            app_polling: false,
            corked: false,
            last_return: None,
            answer_spin_until: None,
            thread_wake_at: None,
            timer: timer.clone(),
            shm_retry: HashMap::new(),
            timed: HashSet::new(),
            tcp_set,
            tcp_edges: Vec::new(),
            tcp_quiet: 0,
            quiet_lingers: false,
        };
        let sh = Arc::new(Shared {
            st: Mutex::new(st),
            cv: Condvar::new(),
            poll: Mutex::new(poll),
            waker,
            shutdown: AtomicBool::new(false),
            sock_path,
            dir_entry,
            spin,
            snooze_after,
            lease,
            progress,
            linger,
            trace,
            handover: Default::default(),
            busy_looks: AtomicU64::new(0),
            timer,
        });
        let thread = if progress == Progress::Thread {
            let sh2 = sh.clone();
            Some(
                std::thread::Builder::new()
                    .name(format!("gepsea-net {me}"))
                    .spawn(move || event_thread(sh2))
                    .map_err(|e| NetError::io("spawning event thread", e))?,
            )
        } else {
            None
        };
        Ok(Port { sh, thread, addr: me })
    }

    /// This port's address.
    pub fn addr(&self) -> Addr {
        self.addr
    }

    /// The TCP address the port listens on, if any.
    pub fn listen_addr(&self) -> Option<SocketAddr> {
        self.sh.st.lock().tcp_listener.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The congestion control this port's TCP connections run under, when it chose one
    /// ([`PortConfig::tcp_congestion`](super::PortConfig::tcp_congestion)); `None`: the
    /// system's default.
    pub fn tcp_congestion(&self) -> Option<String> {
        self.sh.st.lock().cfg.tcp_congestion.clone()
    }

    /// The kernel buffers, each way, this port's TCP connections get
    /// ([`PortConfig::tcp_buffer`](super::PortConfig::tcp_buffer)); `None`: the kernel
    /// sizes them, as asked or because the system's limits are below the size asked.
    pub fn tcp_buffer(&self) -> Option<usize> {
        self.sh.st.lock().tcp_buffer
    }

    /// What this port checksums on its TCP links ([`PortConfig::tcp_checksums`]); a
    /// link carries data without payload checksums only if its other end trusts TCP too.
    pub fn tcp_checksums(&self) -> crate::tcp::TcpChecksums {
        self.sh.st.lock().cfg.tcp_checksums
    }

    /// Adds or replaces the TCP address of a remote port.
    pub fn add_route(&self, peer: Addr, addr: SocketAddr) {
        self.sh.st.lock().cfg.routes.insert(peer, addr);
    }

    pub(super) fn with<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut st = self.sh.st.lock();
        let r = f(&mut st);
        run_copies(&mut st);
        st.flush_all();
        st.settle_space();
        st.update_app_bell();
        self.kick_if_needed(&mut st);
        r
    }

    /// Sends `data` to `dst` with `tag` on the normal channel, as [`Port::isend`], and
    /// forgets it: there is no request to wait for or test and, with events on, no
    /// [`Event::Completed`]. A message that cannot be delivered shows up as its peer's
    /// failure ([`Event::PeerFailed`]). For an event loop's replies and notifications:
    /// a small one to a process on this node goes straight into the ring even with
    /// events on, and none of them costs the loop an event to take.
    pub fn send_detached(&self, dst: Addr, tag: u64, data: impl Into<Bytes>) {
        self.detached_on(dst, tag, Payload::Owned(data.into()))
    }

    /// [`Port::send_detached`] from a borrowed buffer, as [`Port::isend_copy`]: a small
    /// message to a process on this node is copied straight into the ring, anything
    /// else into a buffer of its own first. For a caller that encodes each message
    /// into the same buffer.
    pub fn send_detached_copy(&self, dst: Addr, tag: u64, data: &[u8]) {
        self.detached_on(dst, tag, Payload::Borrowed(data))
    }

    fn detached_on(&self, dst: Addr, tag: u64, data: Payload<'_>) {
        if let Some(t) = &self.sh.trace {
            t.record("send", dst, data.as_slice().len());
        }
        if self.direct_send(dst, Channel::Normal, tag, data.as_slice(), true).is_some() {
            return;
        }
        let data = data.into_bytes();
        self.with(|st| {
            let id = st.proto.isend(dst, tag, data);
            st.proto.detach(id);
        });
    }

    /// Starts a tagged send of `data` to `dst` on the normal channel (eager up to the
    /// threshold, rendezvous above).
    pub fn isend(&self, dst: Addr, tag: u64, data: impl Into<Bytes>) -> ReqId {
        self.send_on(Channel::Normal, dst, tag, Payload::Owned(data.into()))
    }

    /// Like [`Port::isend`], from a borrowed buffer: a small message to a connected
    /// peer on this node is copied straight into the ring (no allocation, no
    /// reference count); anything else is first copied into a buffer of its own. The
    /// buffer can be reused as soon as this returns, as after `MPI_Bsend`.
    pub fn isend_copy(&self, dst: Addr, tag: u64, data: &[u8]) -> ReqId {
        self.send_on(Channel::Normal, dst, tag, Payload::Borrowed(data))
    }

    /// Blocking [`Port::isend_copy`].
    pub fn send_copy(&self, dst: Addr, tag: u64, data: &[u8]) -> Result<(), NetError> {
        let r = self.isend_copy(dst, tag, data);
        self.wait(r).map(|_| ())
    }

    /// The send path of `isend`, `isend_copy` and `send_system`: a small message to a
    /// connected local peer goes straight into the ring (see [`Port::direct_send`]);
    /// anything else becomes a request of the protocol (its bytes copied first if they
    /// are borrowed).
    pub(super) fn send_on(&self, channel: Channel, dst: Addr, tag: u64, data: Payload<'_>) -> ReqId {
        let bytes = data.as_slice();
        if let Some(t) = &self.sh.trace {
            t.record(if channel == Channel::System { "sys-send" } else { "send" }, dst, bytes.len());
        }
        if let Some(id) = self.direct_send(dst, channel, tag, bytes, false) {
            return id;
        }
        let data = data.into_bytes();
        self.with(|st| {
            let id = match channel {
                Channel::System => st.proto.send_system(dst, tag, data),
                _ => st.proto.isend(dst, tag, data),
            };
            st.settled_at_once(id)
        })
    }

    /// A small message to a connected peer on this node with nothing queued ahead of
    /// it goes straight into the ring: no request, no queue, finished on return.
    /// `detached`: nobody will ask about it ([`Port::send_detached`]), so it may go
    /// this way even with events on.
    pub(super) fn direct_send(&self, dst: Addr, channel: Channel, tag: u64, data: &[u8], detached: bool) -> Option<ReqId> {
        if dst.node != self.addr.node {
            return None;
        }
        let mut st = self.sh.st.lock();
        let (h, id) = if detached {
            st.proto.direct_eager_detached(dst, channel, tag, data.len())?
        } else {
            st.proto.direct_eager(dst, channel, tag, data.len())?
        };
        if st.push_shm_now(&h, data) {
            Some(id | PRESETTLED)
        } else {
            st.proto.direct_eager_unsent(dst, channel);
            None
        }
    }

    /// Posts a receive for up to `capacity` bytes from `src` (`None`: any) with `tag`
    /// (`None`: any).
    pub fn irecv(&self, src: Option<Addr>, tag: Option<u64>, capacity: usize) -> ReqId {
        self.with(|st| st.proto.irecv(src, tag, capacity))
    }

    /// Like [`Port::irecv`], receiving into `buf` (capacity is the limit), so that
    /// large buffers can be reused instead of faulted in afresh.
    pub fn irecv_into(&self, src: Option<Addr>, tag: Option<u64>, buf: Vec<u8>) -> ReqId {
        self.with(|st| st.proto.irecv_into(src, tag, buf))
    }

    /// Sends a small message into `dst`'s system-channel pool.
    pub fn send_system(&self, dst: Addr, tag: u64, data: impl Into<Bytes>) -> ReqId {
        self.send_on(Channel::System, dst, tag, Payload::Owned(data.into()))
    }

    /// Takes a message from the system pool, if one is there.
    pub fn try_recv_system(&self) -> Option<Message> {
        let m = self.with(|st| {
            st.progress();
            st.proto.recv_system()
        });
        self.traced_system(m)
    }

    /// Waits up to `timeout` for a system-channel message.
    pub fn recv_system(&self, timeout: Duration) -> Result<Message, NetError> {
        self.traced_system(self.wait_until(timeout, |st| st.proto.recv_system())).ok_or(NetError::Timeout(timeout))
    }

    pub(super) fn traced_system(&self, m: Option<Message>) -> Option<Message> {
        if let (Some(t), Some(m)) = (&self.sh.trace, &m) {
            t.record("sys-recv", m.src, m.data.len());
        }
        m
    }

    /// Records a receive handed to the application.
    pub(super) fn traced(&self, r: Option<Result<Completion, NetError>>) -> Option<Result<Completion, NetError>> {
        if let (Some(t), Some(Ok(Completion::Received(m)))) = (&self.sh.trace, &r) {
            t.record("recv", m.src, m.data.len());
        }
        r
    }

    /// Exposes a zeroed region of `len` bytes under `region` for remote put/get.
    pub fn expose(&self, region: u64, len: usize) -> Result<(), NetError> {
        self.with(|st| st.proto.expose(region, len))
    }

    /// Withdraws a region exposed with [`Port::expose`].
    pub fn unexpose(&self, region: u64) -> Result<(), NetError> {
        self.with(|st| st.proto.unexpose(region))
    }

    /// Reads or writes a local region.
    pub fn with_region<R>(&self, region: u64, f: impl FnOnce(&mut [u8]) -> R) -> Result<R, NetError> {
        self.with(|st| st.proto.region(region).map(|r| f(r)))
    }

    /// Writes `data` at `offset` of `dst`'s region.
    pub fn put(&self, dst: Addr, region: u64, offset: u64, data: impl Into<Bytes>) -> ReqId {
        let data = data.into();
        self.with(|st| st.proto.put(dst, region, offset, data))
    }

    /// Reads `len` bytes at `offset` of `dst`'s region.
    pub fn get(&self, dst: Addr, region: u64, offset: u64, len: usize) -> ReqId {
        self.with(|st| st.proto.get(dst, region, offset, len))
    }

    /// Makes progress once and returns the request's result if it has finished (the
    /// result is handed out once).
    pub fn test(&self, req: ReqId) -> Option<Result<Completion, NetError>> {
        if is_presettled(req) {
            return Some(Ok(Completion::Sent));
        }
        self.traced(self.with(|st| {
            st.progress();
            st.proto.take(req)
        }))
    }

    /// The result of a request whose [`Event::Completed`] was just taken, without the
    /// progress pass [`Port::test`] makes first: an event loop made that pass when it
    /// took the event, and a second one per request was pure cost on its path. Taking a
    /// result queues nothing and raises no event, so nothing is flushed either.
    pub fn take_completed(&self, req: ReqId) -> Option<Result<Completion, NetError>> {
        if is_presettled(req) {
            return Some(Ok(Completion::Sent));
        }
        let r = self.sh.st.lock().proto.take(req);
        self.traced(r)
    }

    /// Waits for a request to finish.
    pub fn wait(&self, req: ReqId) -> Result<Completion, NetError> {
        self.wait_timeout(req, FOREVER)
    }

    /// Waits up to `timeout`; on timeout the request keeps running.
    pub fn wait_timeout(&self, req: ReqId, timeout: Duration) -> Result<Completion, NetError> {
        if is_presettled(req) {
            return Ok(Completion::Sent);
        }
        if !self.sh.st.lock().proto.is_known(req) {
            return Err(NetError::UnknownRequest(req));
        }
        self.traced(self.wait_until(timeout, |st| st.proto.take(req))).unwrap_or(Err(NetError::Timeout(timeout)))
    }

    /// Waits until one of `reqs` finishes; returns its index and result.
    pub fn wait_any(&self, reqs: &[ReqId]) -> (usize, Result<Completion, NetError>) {
        self.wait_any_timeout(reqs, FOREVER).expect("wait_any without deadline")
    }

    /// As [`Port::wait_any`], giving up after `timeout` (`None`): for a loop that also
    /// has work arriving from elsewhere to look at now and then.
    pub fn wait_any_timeout(&self, reqs: &[ReqId], timeout: Duration) -> Option<(usize, Result<Completion, NetError>)> {
        if let Some(i) = reqs.iter().position(|&r| is_presettled(r)) {
            return Some((i, Ok(Completion::Sent)));
        }
        let (i, r) = self.wait_until(timeout, |st| reqs.iter().enumerate().find_map(|(i, r)| st.proto.take(*r).map(|x| (i, x))))?;
        Some((i, self.traced(Some(r)).expect("some")))
    }

    /// Cancels a posted receive that has not matched.
    pub fn cancel(&self, req: ReqId) -> bool {
        if is_presettled(req) {
            return false;
        }
        self.with(|st| st.proto.cancel(req))
    }

    /// Blocking send.
    pub fn send(&self, dst: Addr, tag: u64, data: impl Into<Bytes>) -> Result<(), NetError> {
        let r = self.isend(dst, tag, data);
        self.wait(r).map(|_| ())
    }

    /// Blocking receive.
    pub fn recv(&self, src: Option<Addr>, tag: Option<u64>, capacity: usize) -> Result<Message, NetError> {
        let r = self.irecv(src, tag, capacity);
        match self.wait(r)? {
            Completion::Received(m) => Ok(m),
            other => unreachable!("receive completed as {other:?}"),
        }
    }

    /// Turns on the event queue and returns a descriptor that is readable while events
    /// are pending, for use in the application's own `poll`/`epoll`.
    pub fn enable_events(&self) -> RawFd {
        self.with(|st| {
            st.proto.enable_events();
            st.app_bell.raw()
        })
    }

    /// The oldest pending event.
    pub fn next_event(&self) -> Option<Event> {
        self.with(|st| {
            st.progress();
            st.proto.next_event()
        })
    }

    /// Every pending event, appended to `out` after making progress on shared memory
    /// (as [`Port::next_event`] called until it answers `None`, under one lock).
    ///
    /// For an event loop that drains the queue on each turn: events that arrive and
    /// are taken within the same call never ring the event descriptor, where taking
    /// them one by one rings it when the first is found and clears it after the last
    /// (two system calls, about half the cost of a request to the agent on a VM).
    pub fn drain_events(&self, out: &mut Vec<Event>) {
        self.events_into(out, false)
    }

    /// As [`Port::drain_events`], after also reading every established TCP connection
    /// without waiting: for a loop that spins briefly after work (as the agent does)
    /// instead of waiting for the event thread to be woken.
    pub fn poll_events(&self, out: &mut Vec<Event>) {
        self.events_into(out, true)
    }

    /// Whether [`Port::drain_events`] would find something now: an event queued, or a
    /// record in a shared-memory ring (TCP connections are not looked at). One lock and
    /// a load per ring: for a loop that spins on it between full passes, as a waiter
    /// spins on its rings, so that a request is seen within nanoseconds of arriving.
    pub fn has_news(&self) -> bool {
        let mut st = self.sh.st.lock();
        st.proto.events_pending() > 0 || st.has_work()
    }

    fn events_into(&self, out: &mut Vec<Event>, read_tcp: bool) {
        self.with(|st| {
            if read_tcp {
                st.poll_tcp();
                st.flush_tcp_backlog();
            }
            st.progress();
            out.extend(std::iter::from_fn(|| st.proto.next_event()));
        })
    }

    /// Declares that the application polls the port itself from now on, as an event
    /// loop that spins for a while after work does ([`Port::poll_events`] in a loop):
    /// processes on this node then write into this port's rings without ringing its
    /// doorbell (a system call on their side, a wake-up of the event thread on ours),
    /// and the event thread stops watching the TCP connections, which `poll_events`
    /// reads (it would be woken by every segment, to compete for a core with the loop
    /// that reads it anyway). Call [`Port::stop_polling`] before blocking.
    pub fn start_polling(&self) {
        let mut st = self.sh.st.lock();
        if !st.app_polling {
            st.app_polling = true;
            st.set_awake(true);
            if self.sh.progress == Progress::Thread {
                st.quiet_tcp();
            }
        }
    }

    /// Ends [`Port::start_polling`]: peers ring the doorbell again. Anything that came
    /// in unannounced meanwhile is taken in first, and its events make the event
    /// descriptor readable, so a `poll`/`epoll` right after this misses nothing.
    pub fn stop_polling(&self) {
        let mut st = self.sh.st.lock();
        if !st.app_polling {
            return;
        }
        st.app_polling = false;
        if self.sh.progress == Progress::Thread {
            st.unquiet_tcp();
        }
        while st.set_awake(false) {
            st.set_awake(true);
            progress_all(&mut st);
        }
        st.flush_all();
        st.update_app_bell();
    }

    /// Holds TCP writes back until [`Port::uncork`]: messages sent meanwhile to other
    /// nodes are queued, and each connection's leave in one `writev`. For an event loop
    /// that answers several messages in one pass (an agent storing a board write sends
    /// the backup copy, then the answer, to the same agent): every write is a system
    /// call that also runs the receiving side's network input path (5-10 µs on these
    /// VMs), and the answer waited behind the copy's. A blocking call
    /// ([`Port::wait`] and its kind) uncorks first, so it cannot wait for its own
    /// held-back request.
    pub fn cork(&self) {
        self.sh.st.lock().corked = true;
    }

    /// Ends [`Port::cork`]: everything held back is written now.
    pub fn uncork(&self) {
        let mut st = self.sh.st.lock();
        st.uncork();
    }

    /// Transport counters.
    pub fn stats(&self) -> PortStats {
        let mut stats = self.sh.st.lock().stats.clone();
        stats.busy_looks = self.sh.busy_looks.load(Ordering::Relaxed);
        stats
    }

    /// Protocol counters.
    pub fn proto_stats(&self) -> crate::proto::ProtoStats {
        self.sh.st.lock().proto.stats.clone()
    }

    /// Fault injection for tests: offer single copies as process `pid` (a process this
    /// port is not), as a peer in another pid namespace would. Receivers must refuse
    /// them and fetch the data through the ring.
    #[doc(hidden)]
    pub fn claim_pid_for_single_copy(&self, pid: u32) {
        self.sh.st.lock().proto.offer_single_copy(Some(pid));
    }

    /// `peer` has left for good (it said so): its link goes now, with its connection
    /// and whatever was still unacknowledged to it, and operations waiting on it fail
    /// as if it had failed, as do new ones until `peer` connects again (a restarted
    /// process). Without this a clean leave looked like a lost connection: the link
    /// tried to reconnect for `reconnect_timeout`, and a closing port waited that long
    /// for acknowledgements that could not come.
    pub fn forget_peer(&self, peer: Addr) {
        let mut st = self.sh.st.lock();
        st.forget_peer(peer);
    }

    /// Fault injection for tests and operators: abruptly shuts down every TCP
    /// connection of this port (as a network failure would); links reconnect and replay.
    pub fn reset_connections(&self) {
        let st = self.sh.st.lock();
        for c in st.tcp.values() {
            let _ = c.stream.shutdown(std::net::Shutdown::Both);
        }
        drop(st);
        let _ = self.sh.waker.wake();
    }
}
