//! The work of the agent's job threads, done through [`InProc`], the same API
//! applications use: cache fetches and hand-overs through the directory, advert
//! batches, lock keys.

use super::*;

pub(super) use crate::core::{lock_key, merge_key};

pub(super) fn take_adverts(inbox: &mut Inbox, max: u32) -> Vec<AdvertMsg> {
    let mut v = Vec::new();
    while v.len() < max.max(1) as usize {
        match inbox.read() {
            Some(a) => v.push(AdvertMsg { publisher: a.publisher, seq: a.seq, topic: a.topic, body: a.body.to_vec() }),
            None => break,
        }
    }
    v
}

/// Adds or removes `node` in `name`'s directory entry (compare-and-swap loop).
pub(super) fn dir_update(s: &InProc, name: &str, node: u32, present: bool) -> Result<(), ApiError> {
    use crate::api::{Api, Cas};
    let key = dir_key(name);
    loop {
        let cur = s.board_get(&key)?;
        let (version, entry) = match &cur {
            Some(v) => (v.version, Some(v.value.as_slice())),
            None => (0, None),
        };
        let new = with_holder(entry, node, present);
        if entry == Some(new.as_slice()) {
            return Ok(());
        }
        if let Cas::Written(_) = s.board_cas(&key, version, &new)? {
            return Ok(());
        }
    }
}

/// A cache miss: find a live holder in the directory, fetch, keep a copy, register it.
pub(super) fn cache_fetch(s: &InProc, name: &str, me: u32) -> Reply {
    use crate::api::Api;
    if let Ok(Reply::Data(d)) = s.internal(Internal::LocalGet { name: name.to_string() }) {
        return Reply::Data(d);
    }
    let entry = match s.board_get(&dir_key(name)) {
        Ok(v) => v,
        Err(e) => return Reply::err(ErrorKind::Failed, e.to_string()),
    };
    let hs = holders(entry.as_ref().map(|v| v.value.as_slice()));
    let mut errors = Vec::new();
    for h in hs.into_iter().filter(|&h| h != me) {
        match s.internal(Internal::FetchFrom { node: h, name: name.to_string() }) {
            Ok(Reply::Data(d)) => {
                if s.internal(Internal::StoreLocal { name: name.to_string(), data: d.clone() }).is_ok() {
                    let _ = dir_update(s, name, me, true);
                }
                return Reply::Data(d);
            }
            Ok(_) => {}
            Err(e) => errors.push(format!("node {h}: {e}")),
        }
    }
    if errors.is_empty() {
        Reply::err(ErrorKind::NotFound, format!("no live node caches {name:?}"))
    } else {
        Reply::err(ErrorKind::NotFound, format!("no live node could provide {name:?} ({})", errors.join("; ")))
    }
}

/// Keeps `data` in this node's cache and registers this node in the directory.
pub(super) fn store_and_register(s: &InProc, name: String, data: Vec<u8>, me: u32) -> Reply {
    if let Err(e) = s.internal(Internal::StoreLocal { name: name.clone(), data }) {
        return Reply::err(e.kind().unwrap_or(ErrorKind::Failed), e.to_string());
    }
    match dir_update(s, &name, me, true) {
        Ok(()) => Reply::Ok,
        Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
    }
}

/// Moves a cached object to node `to` instead of duplicating it.
pub(super) fn swap(s: &InProc, name: &str, me: u32, to: u32) -> Reply {
    let data = match s.internal(Internal::LocalGet { name: name.to_string() }) {
        Ok(Reply::Data(d)) => d,
        _ => return Reply::err(ErrorKind::NotFound, format!("{name:?} is not cached on node {me}; only a holder can swap it away")),
    };
    if to == me {
        return Reply::Ok;
    }
    if let Err(e) = s.internal(Internal::StoreAt { node: to, name: name.to_string(), data }) {
        return Reply::err(e.kind().unwrap_or(ErrorKind::Failed), e.to_string());
    }
    let _ = s.internal(Internal::DropLocal { name: name.to_string() });
    match dir_update(s, name, me, false) {
        Ok(()) => Reply::Ok,
        Err(e) => Reply::err(ErrorKind::Failed, e.to_string()),
    }
}

/// Runs one job. A panic inside it (a plug-in's bug) becomes a `Failed` reply to the
/// job's caller: otherwise the caller would wait for a reply that never comes, and the
/// pool thread, gone with the panic, would swallow every job queued behind it.
pub(super) fn run_job(work: impl FnOnce(&InProc) -> Reply, svc: &InProc) -> Reply {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| work(svc))) {
        Ok(reply) => reply,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            warn!("a job of client {:?} panicked: {what}", svc.client);
            Reply::err(ErrorKind::Failed, format!("the agent's job failed (a bug): {what}"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panicking_job_answers_failed_and_the_next_job_still_runs() {
        let poll = Poll::new().unwrap();
        let waker = Arc::new(Waker::new(poll.registry(), Token(0)).unwrap());
        let (tx, _rx) = crossbeam_channel::unbounded();
        let svc = InProc { tx, waker, client: Client::new(1, 2) };
        let v: Vec<u32> = Vec::new();
        let r = run_job(|_| Reply::Node(v[2]), &svc);
        let Reply::Err(e) = r else { panic!("a panic must answer with an error, got {r:?}") };
        assert_eq!(e.kind, ErrorKind::Failed);
        assert!(e.message.contains("index out of bounds"), "{}", e.message);
        assert_eq!(run_job(|_| Reply::Node(7), &svc), Reply::Node(7));
    }
}
