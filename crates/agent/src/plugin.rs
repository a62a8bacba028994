//! Plug-ins: GePSeA's top layer.
//!
//! A plug-in names itself, declares which components and primitives it uses, and
//! handles requests that applications address to it by name (`Op::Plugin`). It runs
//! on one of the agent's job threads, never on the event loop, so it may block; calls
//! of one client are handled in the order they were sent. It reaches the components and
//! primitives only through [`Context::services`] — the same [`crate::api::Api`] an
//! application uses — so a plug-in cannot depend on agent internals, and built-in and
//! application plug-ins register the same way ([`Registry::register`]).
//! `docs/plugins.md` walks through writing one.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::api::{ApiError, Services};
use crate::core::compress::Engine;
use crate::core::Client;

/// The components and primitives a plug-in may use (declared, shown by `status`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Uses {
    Advertising,
    BulletinBoard,
    Locks,
    DataCache,
    SortMerge,
    Parsing,
    Compression,
    GlobalMemory,
    ProcessState,
    LoadBalancing,
    DataStreaming,
}

/// What a plug-in can reach while handling a request.
pub struct Context<'a> {
    /// The process that sent the request.
    pub caller: Client,
    /// This agent's node.
    pub node: u32,
    /// The agents' API (components and primitives).
    pub services: &'a dyn Services,
    /// The same API, owned: for work the plug-in hands to its own threads and that
    /// outlives the request (e.g. writing results in the background, so that the job
    /// thread is free for the next request).
    pub background: Arc<dyn Services>,
    /// The same API on behalf of this agent itself rather than of the caller: for
    /// locks held per node. A lock is held per process, and one caller's requests can
    /// run on many agents at once (the master's prefetches, say): under the caller's
    /// name, the second agent to ask would be told the lock is already its own.
    pub agent: &'a dyn Services,
    /// The compression engine (with any registered application codecs).
    pub engine: &'a Engine,
    /// A node-local directory for the plug-in's files (e.g. data staged from shared
    /// storage): emptied when the agent starts and removed when it stops.
    pub scratch: &'a std::path::Path,
}

/// A plug-in failed on a request.
#[derive(Debug, thiserror::Error)]
pub enum PluginError {
    #[error("bad request: {0}")]
    BadRequest(String),
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Api(#[from] ApiError),
}

pub trait Plugin: Send + Sync {
    /// The name applications address it by.
    fn name(&self) -> &str;
    /// What it uses.
    fn uses(&self) -> &[Uses];
    /// Handles one request; the returned bytes are the reply.
    fn handle(&self, ctx: &Context<'_>, request: &[u8]) -> Result<Vec<u8>, PluginError>;
    /// A process of this node died (drop whatever the plug-in kept for it).
    fn process_died(&self, _client: Client) {}
    /// What the plug-in wants `gepsea agent status` to show (under its name).
    fn status(&self) -> Option<serde_json::Value> {
        None
    }
}

/// The plug-ins an agent serves.
#[derive(Default, Clone)]
pub struct Registry {
    plugins: BTreeMap<String, Arc<dyn Plugin>>,
}

impl Registry {
    pub fn new() -> Self {
        Self::default()
    }

    /// Every built-in plug-in.
    pub fn with_builtins() -> Self {
        let mut r = Self::new();
        r.register(Arc::new(builtin::Append::default())).unwrap();
        r.register(Arc::new(builtin::Counter)).unwrap();
        r
    }

    /// Adds a plug-in; a second plug-in of the same name is refused.
    pub fn register(&mut self, p: Arc<dyn Plugin>) -> Result<(), String> {
        let name = p.name().to_string();
        if name.is_empty() || self.plugins.contains_key(&name) {
            return Err(format!("a plug-in named {name:?} is already registered (or the name is empty)"));
        }
        self.plugins.insert(name, p);
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Plugin>> {
        self.plugins.get(name)
    }

    pub fn names(&self) -> Vec<String> {
        self.plugins.keys().cloned().collect()
    }

    pub fn describe(&self) -> Vec<(String, Vec<Uses>)> {
        self.plugins.iter().map(|(n, p)| (n.clone(), p.uses().to_vec())).collect()
    }

    /// The plug-ins' own status, by name (those that have one).
    pub fn statuses(&self) -> BTreeMap<String, serde_json::Value> {
        self.plugins.iter().filter_map(|(n, p)| Some((n.clone(), p.status()?))).collect()
    }

    /// The components and primitives the registered plug-ins use, each once, in
    /// layer order (what `gepsea agent status` lists as in use).
    pub fn components_in_use(&self) -> Vec<Uses> {
        let mut all: Vec<Uses> = self.plugins.values().flat_map(|p| p.uses().to_vec()).collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    pub fn all(&self) -> impl Iterator<Item = &Arc<dyn Plugin>> {
        self.plugins.values()
    }
}

/// The built-in plug-ins.
pub mod builtin {
    use std::collections::HashMap;
    use std::fs::OpenOptions;
    use std::io::Write;
    use std::path::PathBuf;

    use parking_lot::Mutex;

    use super::*;
    use crate::api::{Api, Cas};
    use crate::wire::Codec;

    /// A request to [`Append`].
    #[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Eq)]
    pub struct AppendRequest {
        pub path: PathBuf,
        /// Compress with zstd at this level (0: store as is).
        pub zstd_level: i32,
        #[serde(with = "serde_bytes")]
        pub data: Vec<u8>,
    }

    /// `append`: output offload. The application hands over a chunk of results and goes
    /// on computing; the agent compresses it (compression engine) and appends it to the
    /// file. Each chunk becomes one zstd frame, and concatenated frames are one valid
    /// zstd stream, so the file decompresses to the chunks in the order each client
    /// sent them. Replies with the file's new length (8 bytes, little endian).
    #[derive(Default)]
    pub struct Append {
        files: Mutex<HashMap<PathBuf, std::fs::File>>,
    }

    impl Plugin for Append {
        fn name(&self) -> &str {
            "append"
        }
        fn uses(&self) -> &[Uses] {
            &[Uses::Compression]
        }
        fn handle(&self, ctx: &Context<'_>, request: &[u8]) -> Result<Vec<u8>, PluginError> {
            let req: AppendRequest = postcard::from_bytes(request).map_err(|e| PluginError::BadRequest(format!("append request: {e}")))?;
            if !req.path.is_absolute() {
                return Err(PluginError::BadRequest(format!(
                    "append path {} must be absolute (the agent's working directory is not the caller's)",
                    req.path.display()
                )));
            }
            let chunk = if req.zstd_level > 0 {
                ctx.engine.compress(&Codec::Zstd, req.zstd_level, &req.data).map_err(|e| PluginError::Failed(e.to_string()))?
            } else {
                req.data
            };
            let mut files = self.files.lock();
            if !files.contains_key(&req.path) {
                let f = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(&req.path)
                    .map_err(|e| PluginError::Failed(format!("opening {}: {e}", req.path.display())))?;
                files.insert(req.path.clone(), f);
            }
            let f = files.get_mut(&req.path).unwrap();
            f.write_all(&chunk).map_err(|e| PluginError::Failed(format!("writing {}: {e}", req.path.display())))?;
            let len = f.metadata().map_err(|e| PluginError::Failed(e.to_string()))?.len();
            Ok(len.to_le_bytes().to_vec())
        }
    }

    /// `counter`: the example plug-in of `docs/plugins.md`. The request names a counter;
    /// the plug-in increments it on the bulletin board with a compare-and-swap loop and
    /// replies with the new value (8 bytes, little endian).
    pub struct Counter;

    impl Plugin for Counter {
        fn name(&self) -> &str {
            "counter"
        }
        fn uses(&self) -> &[Uses] {
            &[Uses::BulletinBoard]
        }
        fn handle(&self, ctx: &Context<'_>, request: &[u8]) -> Result<Vec<u8>, PluginError> {
            let name = std::str::from_utf8(request).map_err(|_| PluginError::BadRequest("counter name must be UTF-8".into()))?;
            let key = format!("counter/{name}");
            loop {
                let (version, value) = match ctx.services.board_get(&key)? {
                    Some(v) => (
                        v.version,
                        u64::from_le_bytes(v.value.try_into().map_err(|_| PluginError::Failed(format!("{key} is not a counter")))?),
                    ),
                    None => (0, 0),
                };
                if let Cas::Written(_) = ctx.services.board_cas(&key, version, &(value + 1).to_le_bytes())? {
                    return Ok((value + 1).to_le_bytes().to_vec());
                }
            }
        }
    }
}
