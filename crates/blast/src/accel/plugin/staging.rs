//! Staging: database fragments brought into this node's scratch for its workers,
//! once however many ask at the same time, under the scratch budget (`scratch`), and
//! looked ahead of the task that will need them (data streaming).

use super::*;

impl BlastPlugin {
    /// Brings `fragment` into this node's scratch (see the module docs); returns its
    /// directory and where it came from. Counted in [`BlastPlugin::stage_counts`],
    /// unless `count_staged` is false and it was there already.
    pub(crate) fn stage(
        &self,
        ctx: &Context<'_>,
        job: &Path,
        spec: &JobSpec,
        fragment: usize,
        count_staged: bool,
    ) -> Result<(PathBuf, StageSource), PluginError> {
        let name = spec.fragments.get(fragment).ok_or_else(|| PluginError::BadRequest(format!("no fragment {fragment}")))?;
        let files =
            spec.fragment_files.get(fragment).ok_or_else(|| PluginError::BadRequest(format!("no file list for fragment {fragment}")))?;
        let object = fragment_object(name, files);
        let dir = ctx.scratch.join(&object);
        let lock = self.staging.lock().entry(object.clone()).or_default().clone();
        let _held = lock.lock();
        let (dir, source, room) = self.stage_locked(ctx, spec, name, files, dir, &object)?;
        let mut counts = self.stage_counts.lock();
        let c = counts.entry(job.to_path_buf()).or_default();
        if count_staged || source != StageSource::Staged {
            c.by_source[source as usize] += 1;
        }
        if let Some(room) = room {
            c.evicted += room.evicted;
            c.peak_bytes = c.peak_bytes.max(room.staged_after);
        }
        Ok((dir, source))
    }

    /// [`BlastPlugin::stage`] under the fragment's staging lock; also returns what
    /// making room for it did, if it was copied in.
    fn stage_locked(
        &self,
        ctx: &Context<'_>,
        spec: &JobSpec,
        name: &str,
        files: &BTreeMap<String, String>,
        dir: PathBuf,
        object: &str,
    ) -> Result<(PathBuf, StageSource, Option<scratch::Room>), PluginError> {
        if dir.is_dir() {
            // Handed out again: the most recently used (see `scratch`).
            scratch::touch(&dir);
            return Ok((dir, StageSource::Staged, None));
        }
        let was_here = ctx.services.global_state()?.iter().any(|s| s.node == ctx.node && s.holds.iter().any(|h| h == object));
        let fetch = || match ctx.services.cache_get(object) {
            Ok(b) => Ok(Some(b)),
            Err(ApiError::Agent { kind: ErrorKind::NotFound, message }) => {
                tracing::debug!("fragment {name} on node {}: {message}", ctx.node);
                Ok(None)
            }
            Err(e) => Err(PluginError::from(e)),
        };
        let (bundle, source) = match fetch()? {
            Some(b) => (b, if was_here { StageSource::Memory } else { StageSource::Peer }),
            None => {
                // Nobody has it: one agent of the whole cluster reads it from shared
                // storage while the others wait for it under a distributed lock, then
                // take it from that agent's memory.
                let lock = format!("blast-stage/{object}");
                // Held by this agent, not by the caller: the master's prefetches ask many
                // agents at once under one name.
                ctx.agent.lock(&lock, LockMode::Exclusive)?;
                let loaded = match fetch() {
                    Ok(Some(b)) => Ok((b, StageSource::Peer)),
                    Ok(None) => read_fragment(spec, files).map(|b| {
                        tracing::debug!("fragment {name}: read from storage by node {}", ctx.node);
                        // In this agent's memory and in the directory: other nodes
                        // fetch it from here instead of from shared storage.
                        if let Err(e) = ctx.services.cache_put(object, &b) {
                            tracing::warn!("fragment {name} not cached on node {} ({e}); others read it from storage", ctx.node);
                        }
                        (b, StageSource::Storage)
                    }),
                    Err(e) => Err(e),
                };
                let _ = ctx.agent.unlock(&lock);
                loaded?
            }
        };
        let contents: Vec<(String, Vec<u8>)> =
            postcard::from_bytes(&bundle).map_err(|e| failed(format!("fragment {name}: damaged cache object: {e}")))?;
        // Room under the budget first (without one, only the bytes staged are counted).
        let need: u64 = contents.iter().map(|(_, d)| d.len() as u64).sum();
        let budget = spec.scratch_bytes.unwrap_or(u64::MAX);
        let mut tries = 0;
        let room = loop {
            let mut reserved = self.scratch_reserved.lock();
            let staging = self.staging.lock();
            let busy = |o: &str| staging.get(o).is_some_and(|l| l.is_locked());
            let room = scratch::make_room(ctx.scratch, object, need, *reserved, budget, busy);
            // Other stagings finish in milliseconds; a copy being searched can take long.
            tries += 1;
            if room.fits(budget) || !room.others_in_the_way || tries == 100 {
                *reserved += need;
                break room;
            }
            drop((staging, reserved));
            std::thread::sleep(Duration::from_millis(20));
        };
        let written = self.write_staged(name, files, &contents, &dir, source);
        *self.scratch_reserved.lock() -= need;
        written.map(|()| (dir, source, Some(room)))
    }

    /// Writes a fragment's verified files into `dir` (through a `.partial` directory,
    /// renamed into place when complete).
    fn write_staged(
        &self,
        name: &str,
        files: &BTreeMap<String, String>,
        contents: &[(String, Vec<u8>)],
        dir: &Path,
        source: StageSource,
    ) -> Result<(), PluginError> {
        let tmp = dir.with_extension("partial");
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir_all(&tmp).map_err(|e| failed(format!("{}: {e}", tmp.display())))?;
        for (f, data) in contents {
            let want = files.get(f).ok_or_else(|| failed(format!("fragment {name}: unexpected file {f}")))?;
            let got = sha256_hex(data);
            if &got != want {
                let _ = std::fs::remove_dir_all(&tmp);
                return Err(failed(format!("fragment {name}: {f} has SHA-256 {got}, the manifest says {want} (from {source:?})")));
            }
            std::fs::write(tmp.join(f), data).map_err(|e| failed(format!("{}: {e}", tmp.join(f).display())))?;
        }
        if contents.len() != files.len() {
            let _ = std::fs::remove_dir_all(&tmp);
            return Err(failed(format!("fragment {name}: {} of {} files", contents.len(), files.len())));
        }
        std::fs::rename(&tmp, dir).map_err(|e| failed(format!("{}: {e}", dir.display())))?;
        Ok(())
    }

    /// Data streaming: asks the load balancer which fragment this node's workers will be
    /// handed next and stages it if it is not here yet — on a thread of its own, one
    /// look at a time, so that the worker's staging reply never waits for it. A worker
    /// switching fragments then finds its next one staged.
    pub(crate) fn look_ahead(&self, ctx: &Context<'_>, job: &Path, spec: &Arc<JobSpec>) {
        const TASKS_AHEAD: u32 = 1;
        if self.looking_ahead.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        let (services, node, scratch) = (ctx.background.clone(), ctx.node, ctx.scratch.to_path_buf());
        let (job, spec, prefetching, busy) = (job.to_path_buf(), spec.clone(), self.prefetching.clone(), self.looking_ahead.clone());
        let look = move || {
            let next = services.upcoming(TASKS_AHEAD).unwrap_or_default();
            let wanted: Vec<usize> = (0..spec.fragments.len())
                .filter(|&f| {
                    let object = fragment_object(&spec.fragments[f], &spec.fragment_files[f]);
                    next.contains(&object) && !scratch.join(&object).is_dir()
                })
                .filter(|&f| prefetching.lock().insert((job.clone(), f)))
                .collect();
            if !wanted.is_empty() {
                if let Ok(body) = postcard::to_stdvec(&BlastRequest::Prefetch { job, fragments: wanted, ahead: true }) {
                    // A failed prefetch only means the worker stages the fragment itself.
                    if let Err(e) = services.plugin_at(node, "blast", body) {
                        tracing::debug!("blast plug-in: lookahead staging: {e}");
                    }
                }
            }
            busy.store(false, std::sync::atomic::Ordering::Release);
        };
        if let Err(e) = std::thread::Builder::new().name("blast-lookahead".into()).spawn(look) {
            tracing::debug!("blast plug-in: no thread for lookahead staging: {e}");
            self.looking_ahead.store(false, std::sync::atomic::Ordering::Release);
        }
    }

    pub(crate) fn stage_counts(&self, job: &Path) -> StagingStats {
        self.stage_counts.lock().get(job).copied().unwrap_or_default()
    }
}
