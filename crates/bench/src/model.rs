//! A discrete-event model of parallel BLAST with and without agents, for node counts
//! this machine cannot host (`gepsea-bench cluster --replay` validates it against the
//! replayed runs up to 36 nodes, then extrapolates to 128 and 1,000).
//!
//! The model is sans-IO and deterministic: it takes a workload (every task's search
//! time and archive size, every batch's merge and write time, the whole-database
//! fallbacks a merge asks for) and a few costs, and plays both architectures:
//!
//! - **mpiBLAST** (no agent): one master, a single server taking messages in arrival
//!   order. A worker asks for a task, searches, sends its archive and waits for the
//!   master to take it and hand out the next task. When a batch's last fragment
//!   arrives the master merges it and writes its part before it reads the next
//!   message: this is where workers wait as they grow in number (the paper's 92 % →
//!   71 %).
//! - **agents**: workers take tasks from the load balancer, search, hand the archive to
//!   their node's agent (which parses it) and go on. The batch's merger (placed by the
//!   load balancer: the agent with the fewest batches placed and not yet written;
//!   statically: batch modulo nodes; or one agent for all) receives the hits
//!   (compressed across nodes), merges and writes when the batch is complete.
//!
//! In both, tasks are queued batch by batch and a merge's whole-database fallbacks go
//! to the front of the queue, as the two masters do — except, with agents, in the load
//! balancer's end-game (at most [`ENDGAME_TASKS_PER_WORKER`] fragment tasks per worker
//! queued), where fragment tasks go first. The mpiBLAST master hands an idle
//! worker the oldest task on the fragment it searched last (mpiBLAST's fragment
//! affinity, `gepsea_blast::schedule`), else the oldest task: with fewer workers than
//! fragments each worker goes through its fragment batch after batch, and the first
//! batches complete late (4 workers on 8 fragments: the first part was written after
//! 75 s of a 207 s run). The agents' load balancer prefers the fragments a node holds,
//! and a node holds the fragment it searches and the one it prefetches: the traces
//! show each node alternating between two fragments batch by batch, which the model
//! plays as plain batch order. Agents' work shares `shared_cores` cores when the nodes
//! are emulated on one machine, or runs on each node's own spare core.
//!
//! The agents' master runs every batch's statistics (the two BLAST+ runs a report
//! needs besides the formatter) ahead of the results, in two lanes from the start, on
//! the cores the agents' work runs on; a batch's write waits for its statistics if a
//! lane has them under way, and runs them itself if no lane has got to them yet (the
//! traced `stats_ahead_seconds`; a write that ran its own has them in its time).
//!
//! Both end with the workers released once every batch is written, then the launch's
//! own costs (`fixed_seconds`, measured): for mpiBLAST they include the master's
//! assembly of the parts; the agents write their pieces of the output in place as
//! they go (since 2026-11-28), so theirs is a few hundred milliseconds of ending.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, VecDeque};

use gepsea_agent::primitives::balance::ENDGAME_TASKS_PER_WORKER;

/// One batch of the workload, as traced by a real (replayed) run.
#[derive(Clone, Debug, Default)]
pub struct BatchWork {
    /// Search time, archive bytes and parse time (on the searching node's agent, in
    /// agent mode) of each fragment's task, fragment `i`'s at `i`.
    pub fragments: Vec<(f64, u64, f64)>,
    /// Whole-database searches the merge asks for (search time, archive bytes).
    pub whole: Vec<(f64, u64)>,
    pub merge_seconds: f64,
    pub write_seconds: f64,
    /// Of `write_seconds`, the writing thread's own CPU (not its BLAST+ programs'):
    /// what an agent's own CPU counts of the write. Zero when unknown.
    pub write_own_seconds: f64,
    /// The statistics runs of the batch's report when the master ran them ahead of its
    /// results (agents; `write_seconds` then holds none of them), else 0.
    pub stats_ahead_seconds: f64,
}

/// Who merges a batch in agent mode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assign {
    Dynamic,
    Static,
    Single,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Arch {
    Mpiblast,
    Agents { assign: Assign, compress: bool },
}

/// Costs the model is given (measured, never fitted to the runs it is checked on).
#[derive(Clone, Debug)]
pub struct Costs {
    /// Rate between nodes, bytes/s.
    pub link_bytes_per_second: f64,
    /// Runtime compression (zstd -3) of archives, bytes/s, and the ratio it reaches.
    pub compress_bytes_per_second: f64,
    pub compress_ratio: f64,
    /// A worker's round trip for a task (asking, getting it), seconds.
    pub take_seconds: f64,
    /// Cores the agents' work shares (`None`: every agent has its own).
    pub shared_cores: Option<usize>,
    /// CPU an agent spends on itself whatever its work (its loop and event thread with
    /// nothing to do, looking for new agents), in cores, while the run lasts. It takes
    /// that much of the cores the agents' work runs on: all agents' share of the shared
    /// cores, or one agent's of its own core.
    pub agent_own_cores: f64,
    /// CPU seconds the agents spend on each task beyond parsing its archive (taking it
    /// from the load balancer, the worker's hand-over, the messages that go with its
    /// result), on the searching node's agent as the search ends.
    pub agent_cpu_per_task: f64,
    /// CPU seconds one agent spends starting (process, shared memory, meeting the
    /// others), on the cores the agents' work runs on, from the start.
    pub agent_start_cpu: f64,
    /// CPU seconds the rest of the machine spends per task when the nodes are emulated
    /// on it (the workers handing their archives over, the master, the kernel's
    /// networking, the storage link's `ssh`): it takes the shared cores as each search
    /// ends, but holds up no agent. Only with `shared_cores`: on a real cluster it runs
    /// on the workers', the master's and the storage node's own cores.
    pub rest_cpu_per_task: f64,
    /// Launch, start-up, final assembly: everything that does not depend on the tasks.
    pub fixed_seconds: f64,
}

/// What the model predicts for one run.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Outcome {
    pub wall_seconds: f64,
    /// Workers' time in search over their time on the job (to the release).
    pub search_fraction: f64,
    /// Workers' time in search over their active time (first task taken to last
    /// result handed over).
    pub active_search_fraction: f64,
}

/// A pool of `n` identical servers (cores), first come first served, of which a steady
/// `busy` cores' worth goes to other work (the agents' own CPU): every piece of work
/// takes `n / (n - busy)` times as long.
struct Pool {
    free_at: Vec<f64>,
    stretch: f64,
}
impl Pool {
    fn new(n: usize, busy: f64) -> Pool {
        let n = n.max(1);
        // Never more than 90 % of the cores: past that the run is starved and the model
        // has nothing left to say about it.
        let busy = busy.clamp(0.0, 0.9 * n as f64);
        Pool { free_at: vec![0.0; n], stretch: n as f64 / (n as f64 - busy) }
    }
    /// The core to run work ready at `ready` on: the one it can start on first; of
    /// those free by then, the one freed last, so that a piece of work that must wait
    /// (a write waiting for its statistics) does not take a core that is idle now
    /// from work that is ready now (`new` makes at least one core).
    fn first_free(&mut self, ready: f64) -> &mut f64 {
        self.free_at.iter_mut().min_by(|a, b| a.max(ready).total_cmp(&b.max(ready)).then(b.total_cmp(a))).expect("a pool has a core")
    }
    /// Spreads `work` seconds (of a whole core) evenly over every core from the start.
    fn spread(&mut self, work: f64) {
        let each = work * self.stretch / self.free_at.len() as f64;
        for core in &mut self.free_at {
            *core += each;
        }
    }
    /// Runs `work` seconds (of a whole core) no earlier than `ready`; returns its end.
    fn run(&mut self, ready: f64, work: f64) -> f64 {
        let stretched = work * self.stretch;
        let core = self.first_free(ready);
        *core = core.max(ready) + stretched;
        *core
    }
    /// Runs a short piece of work (parsing or compressing one archive, merging one
    /// batch) that the kernel's time slicing lets through at once instead of queueing
    /// it behind whole writes: it ends `work` (stretched) after `ready`, and the cores
    /// still lose that much time for the work queued on them.
    fn run_short(&mut self, ready: f64, work: f64) -> f64 {
        let stretched = work * self.stretch;
        let core = self.first_free(ready);
        *core = core.max(ready) + stretched;
        ready + stretched
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
struct Ev {
    t: f64,
    seq: u64,
    kind: Kind,
}
#[derive(Clone, Copy, Debug, PartialEq)]
enum Kind {
    /// A worker is free for a task.
    WorkerFree(usize),
    /// A worker's search ended (agent mode): its archive, of `bytes`, takes `parse`
    /// seconds on its node's agent before it goes to the batch's merger.
    Searched { batch: usize, worker: usize, bytes: u64, parse: f64 },
    /// A task's archive reached its merger (or the master): (batch, worker).
    Arrived(usize, usize),
    /// A batch's merge ended (its fallbacks may now be searched).
    Merged(usize),
    /// An agent wrote a batch's part: one batch less placed on it.
    Written(usize),
}
impl Eq for Ev {}
impl Ord for Ev {
    fn cmp(&self, o: &Self) -> Ordering {
        // Earliest first (BinaryHeap is a max-heap), then in submission order.
        o.t.total_cmp(&self.t).then(o.seq.cmp(&self.seq))
    }
}
impl PartialOrd for Ev {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

struct Queue {
    heap: BinaryHeap<Ev>,
    seq: u64,
}
impl Queue {
    fn push(&mut self, t: f64, kind: Kind) {
        self.seq += 1;
        self.heap.push(Ev { t, seq: self.seq, kind });
    }
}

/// A task waiting to be searched: (batch, search seconds, archive bytes, seconds to
/// parse its archive on the searching node's agent, fragment or `None` for the whole
/// database).
type Task = (usize, f64, u64, f64, Option<usize>);

/// The next task for idle worker `w` (`last`: the fragment it searched last). Urgent
/// fallbacks are at the front; then, with `affinity` (the mpiBLAST master), the oldest
/// task on `last`; then the oldest. With `endgame_workers` (the agents' load balancer
/// and its number of workers), once no more fragment tasks than
/// [`ENDGAME_TASKS_PER_WORKER`] per worker are queued the oldest of them goes first.
fn next_task(queue: &mut VecDeque<Task>, last: Option<usize>, affinity: bool, endgame_workers: Option<usize>) -> Option<Task> {
    if let Some(workers) = endgame_workers {
        let limit = ENDGAME_TASKS_PER_WORKER * workers;
        if queue.iter().filter(|t| t.4.is_some()).take(limit + 1).count() <= limit {
            if let Some(pos) = queue.iter().position(|t| t.4.is_some()) {
                return queue.remove(pos);
            }
        }
    }
    let urgent = queue.front()?.4.is_none();
    let pos = if affinity && last.is_some() && !urgent { queue.iter().position(|t| t.4 == last).unwrap_or(0) } else { 0 };
    queue.remove(pos)
}

/// Every fragment's task, batch by batch, as both masters submit them: batches
/// complete one after another.
fn queued(workload: &[BatchWork]) -> VecDeque<Task> {
    let mut queue = VecDeque::new();
    for (b, w) in workload.iter().enumerate() {
        for (f, &(s, bytes, parse)) in w.fragments.iter().enumerate() {
            queue.push_back((b, s, bytes, parse, Some(f)));
        }
    }
    queue
}

/// The agents' master's threads that run the batches' statistics ahead of their
/// results (`gepsea_blast` `accel::ahead`).
const AHEAD_LANES: usize = 2;

/// Whose statistics runs a batch's write uses.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Stats {
    /// Nobody has claimed them yet.
    Pending,
    /// The master's, ready at this time.
    Ahead(f64),
    /// The writer runs them itself (it got to the batch before the master did).
    Writer,
}

/// The master's statistics runs ahead: its lanes take the batches in order, on the
/// cores the agents' work runs on, skipping those a writer claimed first.
struct Ahead {
    lanes: [f64; AHEAD_LANES],
    next: usize,
    stats: Vec<Stats>,
}
impl Ahead {
    fn new(batches: usize) -> Ahead {
        Ahead { lanes: [0.0; AHEAD_LANES], next: 0, stats: vec![Stats::Pending; batches] }
    }
    /// Starts every run a lane is free for by `t`.
    fn advance(&mut self, t: f64, workload: &[BatchWork], cores: &mut Pool) {
        while self.next < self.stats.len() {
            let lane = (0..AHEAD_LANES).min_by(|&a, &b| self.lanes[a].total_cmp(&self.lanes[b])).unwrap_or(0);
            if self.lanes[lane] > t {
                break;
            }
            let b = self.next;
            self.next += 1;
            if self.stats[b] == Stats::Pending && workload[b].stats_ahead_seconds > 0.0 {
                let done = cores.run(self.lanes[lane], workload[b].stats_ahead_seconds);
                self.lanes[lane] = done;
                self.stats[b] = Stats::Ahead(done);
            }
        }
    }
    /// For batch `b`'s write starting at `t`: when its statistics are ready, and the
    /// seconds of statistics runs its writer adds to the write.
    fn for_writer(&mut self, b: usize, t: f64, workload: &[BatchWork], cores: &mut Pool) -> (f64, f64) {
        self.advance(t, workload, cores);
        match self.stats[b] {
            Stats::Ahead(done) => (t.max(done), 0.0),
            _ => {
                self.stats[b] = Stats::Writer;
                (t, workload[b].stats_ahead_seconds)
            }
        }
    }
}

/// Plays `workload` on `workers` nodes (one worker each) under `arch`.
pub fn simulate(workload: &[BatchWork], workers: usize, arch: Arch, costs: &Costs) -> Outcome {
    let workers = workers.max(1);
    let nb = workload.len();
    let mut queue = queued(workload);
    let mut ev = Queue { heap: BinaryHeap::new(), seq: 0 };
    for w in 0..workers {
        ev.push(0.0, Kind::WorkerFree(w));
    }
    let mut arrived = vec![0usize; nb];
    let mut whole_arrived = vec![0usize; nb];
    let mut written = 0usize;
    let mut searched = 0.0;
    let mut idle: Vec<usize> = Vec::new();
    // The master (mpiBLAST) is one server; in agent mode each agent is one, sharing a
    // pool of cores.
    let mut master_free = 0.0f64;
    let mut agent_free = vec![0.0f64; workers];
    let mut agent_load = vec![0.0f64; workers];
    let mut merger: Vec<Option<usize>> = vec![None; nb];
    let mut last_fragment: Vec<Option<usize>> = vec![None; workers];
    let mpiblast = arch == Arch::Mpiblast;
    // Every agent's own CPU comes off the cores: the same few when emulated, its own
    // node's on a real cluster (one core per worker). mpiBLAST's master uses none.
    let agents_own = if mpiblast { 0.0 } else { costs.agent_own_cores * workers as f64 };
    let mut cores = Pool::new(costs.shared_cores.unwrap_or(workers), agents_own);
    if !mpiblast {
        cores.spread(costs.agent_start_cpu * workers as f64);
    }
    let mut ahead = Ahead::new(if mpiblast { 0 } else { nb });
    let mut end = 0.0f64;
    // Per worker: first task taken, last result handed over.
    let mut active: Vec<Option<(f64, f64)>> = vec![None; workers];

    while let Some(Ev { t, kind, .. }) = ev.heap.pop() {
        // The master's statistics runs take the cores as their lanes come free, in time
        // order with the work booked at these events.
        ahead.advance(t, workload, &mut cores);
        match kind {
            Kind::WorkerFree(w) => match next_task(&mut queue, last_fragment[w], mpiblast, (!mpiblast).then_some(workers)) {
                Some(task) => {
                    if task.4.is_some() {
                        last_fragment[w] = task.4;
                    }
                    // mpiBLAST: the hand-out is the master's reply, already counted.
                    let start = t + if mpiblast { 0.0 } else { costs.take_seconds };
                    searched += task.1;
                    active[w].get_or_insert((start, start)).1 = start;
                    let done = start + task.1;
                    let (b, _, bytes, parse, _) = task;
                    if mpiblast {
                        ev.push(done + bytes as f64 / costs.link_bytes_per_second, Kind::Arrived(b, w));
                    } else {
                        // The archive's handling is booked on the cores when the search
                        // ends, in time order with the merges and writes booked then.
                        ev.push(done, Kind::Searched { batch: b, worker: w, bytes, parse });
                        ev.push(done, Kind::WorkerFree(w));
                        if let Some(a) = &mut active[w] {
                            a.1 = done;
                        }
                    }
                }
                None => idle.push(w),
            },
            Kind::Searched { batch: b, worker: w, bytes, parse } => {
                // The batch's merger is placed when its first result arrives, by the
                // load balancer: the agent with the fewest batches placed and not yet
                // written.
                let m = *merger[b].get_or_insert_with(|| {
                    let m = pick_merger(arch, b, w, &agent_load);
                    agent_load[m] += 1.0;
                    m
                });
                // The searching node's agent parses the archive first (and hands the
                // task over).
                let handle = parse + costs.agent_cpu_per_task;
                let parsed = if handle > 0.0 { cores.run_short(t, handle) } else { t };
                if costs.shared_cores.is_some() && costs.rest_cpu_per_task > 0.0 {
                    cores.run_short(t, costs.rest_cpu_per_task);
                }
                let at = if m == w {
                    parsed
                } else {
                    let (compress, ratio) = match arch {
                        Arch::Agents { compress: true, .. } => {
                            (bytes as f64 / costs.compress_bytes_per_second, costs.compress_ratio.max(1.0))
                        }
                        _ => (0.0, 1.0),
                    };
                    let c = if compress > 0.0 { cores.run_short(parsed, compress) } else { parsed };
                    c + bytes as f64 / ratio / costs.link_bytes_per_second
                };
                ev.push(at, Kind::Arrived(b, w));
            }
            Kind::Arrived(b, w) => {
                // Fallbacks are queued only once every fragment's archive is in.
                let w_frag = arrived[b] < workload[b].fragments.len();
                if w_frag {
                    arrived[b] += 1;
                } else {
                    whole_arrived[b] += 1;
                }
                let merges_now = w_frag && arrived[b] == workload[b].fragments.len();
                let writes_now = (merges_now && workload[b].whole.is_empty()) || (!w_frag && whole_arrived[b] == workload[b].whole.len());
                let merge = if merges_now { workload[b].merge_seconds } else { 0.0 };
                let write = if writes_now { workload[b].write_seconds } else { 0.0 };
                let finished;
                if mpiblast {
                    let start = master_free.max(t);
                    // The master takes the result when it gets to the message.
                    if let Some(a) = &mut active[w] {
                        a.1 = start;
                    }
                    let merged = start + merge;
                    finished = merged + write;
                    master_free = finished;
                    if merges_now {
                        ev.push(merged, Kind::Merged(b));
                    }
                    // The worker gets its next task once the master is done with this.
                    ev.push(finished + costs.take_seconds, Kind::WorkerFree(w));
                } else {
                    let m = merger[b].unwrap_or(0);
                    if merges_now || writes_now {
                        let start = agent_free[m].max(t);
                        let merged = cores.run_short(start, merge);
                        finished = if writes_now {
                            let (ready, stats) = ahead.for_writer(b, merged, workload, &mut cores);
                            cores.run(ready, write + stats)
                        } else {
                            cores.run(merged, write)
                        };
                        agent_free[m] = finished;
                        if merges_now {
                            ev.push(merged, Kind::Merged(b));
                        }
                        if writes_now {
                            ev.push(finished, Kind::Written(m));
                        }
                    } else {
                        finished = t;
                    }
                }
                if writes_now {
                    written += 1;
                    end = end.max(finished);
                }
            }
            Kind::Written(m) => agent_load[m] = (agent_load[m] - 1.0).max(0.0),
            Kind::Merged(b) => {
                // Fallbacks are urgent: ahead of every fragment task, in their order.
                for &(s, bytes) in workload[b].whole.iter().rev() {
                    queue.push_front((b, s, bytes, 0.0, None));
                }
                if !workload[b].whole.is_empty() {
                    for w in idle.drain(..) {
                        let at = if mpiblast { master_free.max(t) } else { t };
                        ev.push(at, Kind::WorkerFree(w));
                    }
                }
            }
        }
    }
    debug_assert_eq!(written, nb);
    let span = end.max(1e-9);
    let active_total: f64 = active.iter().flatten().map(|(a, b)| b - a).sum();
    Outcome {
        wall_seconds: end + costs.fixed_seconds,
        search_fraction: searched / (workers as f64 * span),
        active_search_fraction: searched / active_total.max(1e-9),
    }
}

/// The merger of `batch`, whose first result is on `asking`'s node. Dynamic: the least
/// loaded agent, the asking one on a tie, then the lowest.
fn pick_merger(arch: Arch, batch: usize, asking: usize, load: &[f64]) -> usize {
    let nodes = load.len().max(1);
    match arch {
        Arch::Agents { assign: Assign::Static, .. } => batch % nodes,
        Arch::Agents { assign: Assign::Single, .. } => 0,
        _ => (0..load.len())
            .min_by(|&a, &b| load[a].total_cmp(&load[b]).then((a != asking).cmp(&(b != asking))).then(a.cmp(&b)))
            .unwrap_or(0),
    }
}

/// `workload` repeated `times` times (weak scaling: the same work per worker at more
/// nodes).
pub fn repeated(workload: &[BatchWork], times: usize) -> Vec<BatchWork> {
    (0..times.max(1)).flat_map(|_| workload.iter().cloned()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn costs() -> Costs {
        Costs {
            link_bytes_per_second: 1e9,
            compress_bytes_per_second: 1e9,
            compress_ratio: 10.0,
            take_seconds: 0.0,
            shared_cores: None,
            agent_own_cores: 0.0,
            agent_cpu_per_task: 0.0,
            agent_start_cpu: 0.0,
            rest_cpu_per_task: 0.0,
            fixed_seconds: 0.0,
        }
    }

    fn batch(frag: &[f64], merge: f64, write: f64) -> BatchWork {
        BatchWork {
            fragments: frag.iter().map(|&s| (s, 0, 0.0)).collect(),
            whole: vec![],
            merge_seconds: merge,
            write_seconds: write,
            write_own_seconds: 0.0,
            stats_ahead_seconds: 0.0,
        }
    }

    #[test]
    fn one_worker_without_merge_costs_is_the_sum_of_its_searches() {
        let w = vec![batch(&[1.0, 2.0], 0.0, 0.0), batch(&[3.0, 4.0], 0.0, 0.0)];
        for arch in [Arch::Mpiblast, Arch::Agents { assign: Assign::Dynamic, compress: true }] {
            let o = simulate(&w, 1, arch, &costs());
            assert!((o.wall_seconds - 10.0).abs() < 1e-9, "{arch:?}: {o:?}");
            assert!((o.search_fraction - 1.0).abs() < 1e-9);
        }
    }

    #[test]
    fn the_master_s_merges_hold_workers_back_and_agents_merge_in_parallel() {
        // 8 batches of 2 one-second fragments, 1 s to merge and 1 s to write each, on
        // 8 workers. mpiBLAST: the master does 16 s of merging and writing in a row.
        let w: Vec<BatchWork> = (0..8).map(|_| batch(&[1.0, 1.0], 1.0, 1.0)).collect();
        let mpi = simulate(&w, 8, Arch::Mpiblast, &costs());
        assert!(mpi.wall_seconds >= 16.0, "{mpi:?}");
        let agents = simulate(&w, 8, Arch::Agents { assign: Assign::Dynamic, compress: false }, &costs());
        // Two rounds of searching, then at most a few merges in parallel.
        assert!(agents.wall_seconds <= 6.0, "{agents:?}");
        assert!(agents.search_fraction > mpi.search_fraction);
        // One merger for all is the master again, but off the workers' path.
        let single = simulate(&w, 8, Arch::Agents { assign: Assign::Single, compress: false }, &costs());
        assert!(single.wall_seconds >= 16.0 && single.wall_seconds < mpi.wall_seconds + 2.0, "{single:?}");
        // Agents sharing one core are no better than one merger.
        let shared =
            simulate(&w, 8, Arch::Agents { assign: Assign::Dynamic, compress: false }, &Costs { shared_cores: Some(1), ..costs() });
        assert!(shared.wall_seconds >= 16.0, "{shared:?}");
    }

    #[test]
    fn the_agents_own_cpu_slows_their_work_on_the_cores_they_share() {
        // One batch of one fragment on one worker: search 1 s, then merge 1 s and write
        // 3 s on the one shared core, of which 4 agents take 0.125 cores each.
        let w = vec![batch(&[1.0], 1.0, 3.0)];
        let agents = Arch::Agents { assign: Assign::Dynamic, compress: false };
        let alone = Costs { shared_cores: Some(1), ..costs() };
        assert!((simulate(&w, 4, agents, &alone).wall_seconds - 5.0).abs() < 1e-9);
        let busy = Costs { agent_own_cores: 0.125, ..alone.clone() };
        // The agents' work gets half the core: 1 + 2 × (1 + 3).
        assert!((simulate(&w, 4, agents, &busy).wall_seconds - 9.0).abs() < 1e-9);
        // On a real cluster each agent's own CPU comes off its own node's core.
        let own = Costs { shared_cores: None, agent_own_cores: 0.5, ..costs() };
        assert!((simulate(&w, 4, agents, &own).wall_seconds - 9.0).abs() < 1e-9);
        // mpiBLAST has no agents.
        assert!((simulate(&w, 4, Arch::Mpiblast, &busy).wall_seconds - 5.0).abs() < 1e-9);
        // Handing the task over costs the agents 0.5 s on the core as the search ends:
        // the merge starts at 1.5 s, the write ends at 5.5 s.
        let per_task = Costs { agent_cpu_per_task: 0.5, ..alone.clone() };
        assert!((simulate(&w, 4, agents, &per_task).wall_seconds - 5.5).abs() < 1e-9);
        // 4 agents starting at 0.5 s each hold the core for 2 s from the start: the
        // merge, ready at 1 s, waits for it (2-3 s), the write follows (3-6 s).
        let start = Costs { agent_start_cpu: 0.5, ..alone.clone() };
        assert!((simulate(&w, 4, agents, &start).wall_seconds - 6.0).abs() < 1e-9);
        assert!((simulate(&w, 4, Arch::Mpiblast, &start).wall_seconds - 5.0).abs() < 1e-9);
    }

    #[test]
    fn the_rest_of_the_machine_takes_the_shared_cores_and_holds_up_no_agent() {
        // Search 1 s, merge 1 s, write 3 s on one shared core. The rest of the machine
        // takes the core for 0.5 s as the search ends: the merge, time-sliced, still
        // ends at 2 s, but the core is busy to 2.5 s and the write ends at 5.5 s.
        let w = vec![batch(&[1.0], 1.0, 3.0)];
        let agents = Arch::Agents { assign: Assign::Dynamic, compress: false };
        let shared = Costs { shared_cores: Some(1), rest_cpu_per_task: 0.5, ..costs() };
        assert!((simulate(&w, 4, agents, &shared).wall_seconds - 5.5).abs() < 1e-9);
        // On a real cluster it runs on other nodes' cores.
        let own = Costs { shared_cores: None, ..shared.clone() };
        assert!((simulate(&w, 4, agents, &own).wall_seconds - 5.0).abs() < 1e-9);
        // The mpiBLAST master's times were traced on the machine it shared.
        assert!((simulate(&w, 4, Arch::Mpiblast, &shared).wall_seconds - 5.0).abs() < 1e-9);
    }

    #[test]
    fn a_short_parse_is_not_queued_behind_a_long_write() {
        // One shared core, two workers. Batch 0 (search 1 s) writes for 10 s; batch 1's
        // archive (search 2 s) takes 0.5 s to parse, then its 5 s fallback, then a 1 s
        // write. Time-sliced, the parse ends at 2.5 s and the fallback at 7.5 s; the
        // write waits for the core: 1 + 10 + 0.5 (the parse's time) + 1 = 12.5 s.
        // Queued first come first served it would be 2 + 9.5 + 5 + 1 = 17.5 s.
        let mut b1 = batch(&[2.0], 0.0, 1.0);
        b1.fragments[0].2 = 0.5;
        b1.whole = vec![(5.0, 0)];
        let w = vec![batch(&[1.0], 0.0, 10.0), b1];
        let c = Costs { shared_cores: Some(1), ..costs() };
        let o = simulate(&w, 2, Arch::Agents { assign: Assign::Dynamic, compress: false }, &c);
        assert!((o.wall_seconds - 12.5).abs() < 1e-9, "{o:?}");
    }

    #[test]
    fn the_mpiblast_master_keeps_a_worker_on_its_fragment() {
        // 2 workers, 4 fragments, 2 batches of 1 s searches, no merge, 1 s writes. With
        // affinity each worker searches its fragment in both batches before it moves to
        // another fragment; without, batch by batch.
        let w = vec![batch(&[1.0, 1.0, 1.0, 1.0], 0.0, 1.0), batch(&[1.0, 1.0, 1.0, 1.0], 0.0, 1.0)];
        let q = queued(&w);
        let order = |affinity: bool| {
            let mut q = q.clone();
            let mut last = [None, None];
            let mut got = Vec::new();
            for i in 0..8 {
                let t = next_task(&mut q, last[i % 2], affinity, None).unwrap();
                last[i % 2] = t.4;
                got.push((t.0, t.4.unwrap()));
            }
            got
        };
        assert_eq!(order(true), vec![(0, 0), (0, 1), (1, 0), (1, 1), (0, 2), (0, 3), (1, 2), (1, 3)]);
        assert_eq!(order(false), vec![(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1), (1, 2), (1, 3)]);
        // An urgent fallback goes first whatever the worker searched last.
        let mut urgent = q.clone();
        urgent.push_front((0, 5.0, 0, 0.0, None));
        assert_eq!(next_task(&mut urgent.clone(), Some(3), true, None).map(|t| t.4), Some(None));
        // The agents' load balancer with 8 fragment tasks queued: for 3 workers not yet
        // the end-game; for 4 it is, and the oldest fragment task goes first.
        assert_eq!(next_task(&mut urgent.clone(), Some(3), false, Some(3)).map(|t| t.4), Some(None));
        assert_eq!(next_task(&mut urgent, Some(3), false, Some(4)).map(|t| t.4), Some(Some(0)));
        // Played: batch 0's fragments 2 and 3 are searched third (done at 3 s), its
        // write ends at 4 s, and batch 1's last fragment, handed out after that write,
        // is done at 5 s and written by 6 s.
        let mpi = simulate(&w, 2, Arch::Mpiblast, &costs());
        assert!((mpi.wall_seconds - 6.0).abs() < 1e-9, "{mpi:?}");
    }

    #[test]
    fn fallbacks_are_searched_after_the_merge_and_before_the_write() {
        let mut b = batch(&[1.0], 1.0, 1.0);
        b.whole = vec![(5.0, 0)];
        for arch in [Arch::Mpiblast, Arch::Agents { assign: Assign::Dynamic, compress: false }] {
            let o = simulate(std::slice::from_ref(&b), 2, arch, &costs());
            // search 1 + merge 1 + fallback 5 + write 1.
            assert!((o.wall_seconds - 8.0).abs() < 1e-9, "{arch:?}: {o:?}");
        }
    }

    #[test]
    fn statistics_run_ahead_take_the_cores_before_any_batch_is_complete() {
        // One shared core, one worker, 2 batches of one 2 s search; writes of 1 s and
        // statistics of 1 s each. Ahead: the statistics fill the core while the worker
        // searches (0-2 s), the writes follow each search: 2-3, 4-5.
        let mut w = vec![batch(&[2.0], 0.0, 1.0), batch(&[2.0], 0.0, 1.0)];
        for b in &mut w {
            b.stats_ahead_seconds = 1.0;
        }
        let c = Costs { shared_cores: Some(1), ..costs() };
        let arch = Arch::Agents { assign: Assign::Dynamic, compress: false };
        assert_eq!(simulate(&w, 1, arch, &c).wall_seconds, 5.0);
        // In the writes instead (as the traces of writers that ran them show it): 2-4, 4-6.
        let inside: Vec<BatchWork> = (0..2).map(|_| batch(&[2.0], 0.0, 2.0)).collect();
        assert_eq!(simulate(&inside, 1, arch, &c).wall_seconds, 6.0);
        // mpiBLAST's master runs none ahead (its traced writes hold them), and its
        // worker waits for each write: 0-2 search, 2-4 write, 4-6 search, 6-8 write.
        assert_eq!(simulate(&inside, 1, Arch::Mpiblast, &c).wall_seconds, 8.0);
    }

    #[test]
    fn a_writer_that_gets_to_its_batch_first_runs_its_statistics_itself() {
        // 3 batches of one 1 s search on 4 nodes; statistics of 10 s each. The master's
        // two lanes take batches 0 and 1 at once (ready at 10 s); batch 2 is complete at
        // 1 s, before a lane is free, so its writer runs them: 1 + 10 + 1 = 12 s.
        let mut w: Vec<BatchWork> = (0..3).map(|_| batch(&[1.0], 0.0, 1.0)).collect();
        for b in &mut w {
            b.stats_ahead_seconds = 10.0;
        }
        let arch = Arch::Agents { assign: Assign::Dynamic, compress: false };
        assert_eq!(simulate(&w, 4, arch, &costs()).wall_seconds, 12.0);
    }
}
