//! `gepsea agent status`: the agent's state as JSON (configuration, view, peers,
//! processes, locks, cache, tasks, plug-ins), built from the loop's own state.

use super::*;

#[derive(Serialize)]
pub(super) struct Status {
    node: u32,
    pid: u32,
    namespace: String,
    listen: Option<String>,
    rendezvous: Option<String>,
    /// Whether links to other agents are authenticated with a key.
    authenticated: bool,
    /// Whether links to other agents are encrypted.
    encrypted: bool,
    /// The TCP congestion control chosen for links to other agents (`--tcp-congestion`);
    /// `None`: the system's, `system_congestion`.
    tcp_congestion: Option<String>,
    /// The system's default TCP congestion control, as this agent sees it.
    system_congestion: Option<String>,
    /// The kernel buffers of each link to another agent, each way (`--tcp-buffer`, where
    /// the system's limits allow it); `None`: the kernel sizes them.
    tcp_buffer: Option<usize>,
    /// What the links to other agents checksum: `full`, or `headers` (data payloads
    /// trusted to TCP on links whose other end does the same; `--tcp-checksums`).
    tcp_checksums: &'static str,
    ready: bool,
    expected_nodes: Option<usize>,
    /// This agent's incarnation (a restarted agent of a node has a new one).
    incarnation: u64,
    /// This agent replaced a dead agent of its node in a running job.
    restarted: bool,
    view: Vec<u32>,
    /// The other agents in the view: node, pid and incarnation (0 until its hello).
    peers: Vec<(u32, u32, u64)>,
    dead: Vec<u32>,
    /// Agents let back into the view after they had been declared dead.
    rejoins: u64,
    /// Owner-routed operations held back (a join's hand-overs or lock re-registration).
    deferred_ops: usize,
    scheduler: Option<u32>,
    peer_timeout_ms: u64,
    cache_bytes_limit: usize,
    gma_bytes_limit: u64,
    clients: Vec<StatusClient>,
    board_keys: usize,
    locks: Vec<StatusLock>,
    cache_objects: Vec<String>,
    cache_bytes: usize,
    gma_blocks: usize,
    gma_bytes: u64,
    merge_streams: usize,
    tasks: Option<StatusTasks>,
    plugins: Vec<(String, Vec<crate::plugin::Uses>)>,
    /// Components and primitives some plug-in uses.
    components: Vec<crate::plugin::Uses>,
    /// Plug-ins' own status, by name (e.g. a storage site's progress).
    plugin_status: std::collections::BTreeMap<String, serde_json::Value>,
    requests_served: u64,
    peer_messages: u64,
}

#[derive(Serialize)]
pub(super) struct StatusClient {
    port: u32,
    pid: u32,
    name: String,
    activity: Activity,
    subscribed_unread: usize,
}

#[derive(Serialize)]
pub(super) struct StatusLock {
    name: String,
    holders: Vec<String>,
    waiting: Vec<String>,
}

#[derive(Serialize)]
pub(super) struct StatusTasks {
    queued: usize,
    running: usize,
    idle_takers: usize,
    assigned_total: u64,
    settling: bool,
}

impl Agent {
    pub(super) fn status(&self) -> Status {
        Status {
            node: self.me,
            pid: std::process::id(),
            namespace: self.cfg.namespace.clone(),
            listen: self.port.listen_addr().map(|a| a.to_string()),
            rendezvous: self.cfg.rendezvous.as_ref().map(|p| p.display().to_string()),
            authenticated: self.cfg.key.is_some(),
            encrypted: self.cfg.encrypt,
            tcp_congestion: self.port.tcp_congestion(),
            system_congestion: gepsea_net::tcp::ipv4_setting("tcp_congestion_control").ok(),
            tcp_buffer: self.port.tcp_buffer(),
            tcp_checksums: self.port.tcp_checksums().name(),
            ready: self.ready,
            expected_nodes: self.cfg.nodes,
            incarnation: self.incarnation,
            restarted: self.restarted,
            view: self.view.clone(),
            peers: self.known.iter().filter_map(|(n, v)| v.map(|(pid, inc)| (*n, pid, inc))).collect(),
            dead: self.dead.iter().copied().collect(),
            rejoins: self.rejoins,
            deferred_ops: self.deferred.len(),
            scheduler: self.scheduler_node,
            peer_timeout_ms: self.cfg.peer_timeout.as_millis() as u64,
            cache_bytes_limit: self.cfg.cache_bytes,
            gma_bytes_limit: self.cfg.gma_bytes,
            clients: {
                let mut v: Vec<StatusClient> = self
                    .clients
                    .iter()
                    .map(|(p, c)| StatusClient {
                        port: *p,
                        pid: c.pid,
                        name: c.name.clone(),
                        activity: c.activity,
                        subscribed_unread: c.inbox.unread(),
                    })
                    .collect();
                v.sort_by_key(|c| c.port);
                v
            },
            board_keys: self.board.len(),
            locks: self
                .locks
                .snapshot()
                .into_iter()
                .map(|(name, h, w)| StatusLock {
                    name,
                    holders: h.iter().map(|(c, m)| format!("{}.{} {m:?}", c.node, c.process)).collect(),
                    waiting: w.iter().map(|(c, m)| format!("{}.{} {m:?}", c.node, c.process)).collect(),
                })
                .collect(),
            cache_objects: self.store.names(),
            cache_bytes: self.store.bytes(),
            gma_blocks: self.gma.blocks(),
            gma_bytes: self.gma.used(),
            merge_streams: self.merges.len(),
            tasks: self.scheduler.as_ref().map(|s| StatusTasks {
                queued: s.queued(),
                running: s.running(),
                idle_takers: s.idle_takers(),
                assigned_total: s.assigned_total,
                settling: s.settling(),
            }),
            plugins: self.registry.describe(),
            components: self.registry.components_in_use(),
            plugin_status: self.registry.statuses(),
            requests_served: self.requests_served,
            peer_messages: self.peer_messages,
        }
    }
}
