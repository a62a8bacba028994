//! Single-producer, single-consumer byte ring for variable-length records.
//!
//! This is the intra-node data path: each connection between two ports on one node has
//! two of these in a shared memfd segment, one per direction. The producer copies a
//! record in, the consumer reads it in place and copies it once to where it belongs (a
//! posted receive buffer, the system pool, an RMA region): two copies in all, which on
//! these machines beats the kernel's single-copy CMA (see `docs/architecture.md`).
//!
//! Layout: the producer's `head` (bytes published) is its own; `tail` (bytes consumed,
//! written only by the consumer) is a monotonically increasing `u64` in shared memory on
//! its own 128-byte line, and so is the ring's `salt` (below). A record is a 16-byte
//! prefix (its *stamp*, then its payload length) followed by the payload,
//! padded to a 64-byte cache line: records start on a line of their own, so a small
//! message (prefix, compact frame header and up to a few dozen payload bytes) is one
//! line. A record never wraps: if it does not fit before the end of the buffer the
//! producer writes a wrap marker and starts again at offset 0. Records are at most half
//! the capacity, so an empty ring always accepts one.
//!
//! Publication: the producer writes a record's length and payload, then its stamp with
//! `Release`; the consumer loads the stamp at its `tail` with `Acquire` and, when it
//! is the one expected there, reads the record. The stamp is the record's absolute
//! position (a byte count that never repeats) mixed with the ring's random `salt`, so
//! neither zeroed memory nor the bytes an earlier lap left at that offset (a payload
//! may contain anything) pass for it. A consumer that waits on an empty ring therefore
//! spins on the line the next record will be written to, and a message costs one
//! cross-core line transfer, not two (the record's and `head`'s): 8-byte one way in a
//! bare ring of two pinned threads, 186–207 against 166–180 ns on the Intel guest of
//! 2026-12-06, and between two `gepsea-netpeer` processes 0.461 against 0.374 µs
//! (medians of 10 alternated rounds; `docs/benchmarks.md`). A wrap marker is stamped
//! after the record it points to, so a consumer that follows one finds that record
//! published. (`head` was shared until the stamps; nothing reads it now.)
//! `tail` is published with `Release` and loaded with `Acquire`, so the producer never
//! overwrites bytes the consumer is still reading; the producer caches it and reloads
//! it only when the cached value says "full", which keeps that line quiet.
//!
//! Under `--cfg loom` the same code runs on heap memory with per-byte
//! `loom::cell::UnsafeCell`s and one loom atomic per line for the stamps, so loom
//! checks that every byte read happens after it was written (`ring_loom` test).

#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

/// A record's prefix, in bytes: its stamp (8), its payload length (4) and 4 unused.
pub const PREFIX: usize = 16;
/// Where in the prefix the payload length is.
const LEN_AT: usize = 8;
/// Records start on cache-line boundaries.
pub const RECORD_ALIGN: usize = 64;
const WRAP: u32 = u32::MAX;

/// A value alone on its cache lines (128 bytes: adjacent-line prefetch pairs lines).
#[repr(C, align(128))]
pub struct Padded<T>(pub T);

/// The consumer's index of one ring, and the salt of its stamps. Lives in shared memory.
#[repr(C)]
pub struct RingControl {
    tail: Padded<AtomicU64>,
    salt: Padded<AtomicU64>,
}

impl RingControl {
    /// An empty ring's index, with a fresh salt.
    pub fn new() -> Self {
        RingControl { tail: Padded(AtomicU64::new(0)), salt: Padded(AtomicU64::new(fresh_salt())) }
    }

    /// Gives a ring found in zeroed shared memory its salt: by its creator, before the
    /// memory is shared (a later `Release` publishes it).
    pub fn init_salt(&self) {
        self.salt.0.store(fresh_salt(), Ordering::Relaxed);
    }
}

/// A random salt whose lowest bit is set: a stamp (a position, a multiple of 64, mixed
/// with it) is then never zero, so zeroed memory is never a published record.
fn fresh_salt() -> u64 {
    #[cfg(loom)]
    return 0x9e37_79b9_7f4a_7c15;
    #[cfg(not(loom))]
    {
        use std::hash::BuildHasher;
        // A hasher's keys are drawn from the OS at random: hashing anything gives a
        // random word.
        std::collections::hash_map::RandomState::new().hash_one(0u64) | 1
    }
}

impl Default for RingControl {
    fn default() -> Self {
        Self::new()
    }
}

/// Rounds a record of `payload` bytes up to its size in the ring.
pub fn record_size(payload: usize) -> usize {
    (PREFIX + payload + RECORD_ALIGN - 1) & !(RECORD_ALIGN - 1)
}

/// The largest payload a ring of `capacity` bytes accepts in one record.
pub fn max_payload(capacity: usize) -> usize {
    capacity / 2 - PREFIX
}

#[cfg(not(loom))]
mod storage {
    use std::sync::atomic::{AtomicU64, Ordering};

    /// Raw view of the ring's data bytes in shared memory.
    #[derive(Clone, Copy)]
    pub struct Storage {
        ptr: *mut u8,
        len: usize,
    }

    // SAFETY: the storage is a view into memory shared with another process; access is
    // coordinated by the ring protocol (the producer writes only bytes the consumer has
    // released and vice versa), not by Rust ownership.
    unsafe impl Send for Storage {}

    impl Storage {
        /// # Safety
        /// `ptr..ptr+len` must stay mapped and writable for the lifetime of the ring, and
        /// be used by at most one producer and one consumer following the ring protocol.
        pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
            Storage { ptr, len }
        }

        pub fn write(&self, off: usize, src: &[u8]) {
            assert!(off + src.len() <= self.len);
            // SAFETY: bounds checked above; the ring protocol guarantees the consumer is
            // not reading this range (it lies between tail+capacity and head).
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), self.ptr.add(off), src.len()) }
        }

        pub fn read_u32(&self, off: usize) -> u32 {
            let mut b = [0u8; 4];
            self.with_slice(off, 4, |s| b.copy_from_slice(s));
            u32::from_le_bytes(b)
        }

        fn stamp_cell(&self, off: usize) -> &AtomicU64 {
            assert!(off + 8 <= self.len && off.is_multiple_of(super::RECORD_ALIGN));
            // SAFETY: in bounds (checked) and 8-byte aligned (a record's start, and the
            // mapping is page-aligned); the word is only ever accessed atomically while
            // it can be concurrently accessed: a payload the producer wrote there on an
            // earlier lap was read by the consumer before it released the bytes.
            unsafe { &*(self.ptr.add(off) as *const AtomicU64) }
        }

        /// Publishes the record at `off` (its bytes written before).
        pub fn store_stamp(&self, off: usize, stamp: u64) {
            self.stamp_cell(off).store(stamp, Ordering::Release);
        }

        /// The stamp at `off`; the record's bytes are readable once it is the expected one.
        pub fn load_stamp(&self, off: usize) -> u64 {
            self.stamp_cell(off).load(Ordering::Acquire)
        }

        pub fn with_slice<R>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
            assert!(off + len <= self.len);
            // SAFETY: bounds checked; the range was published by the producer (its
            // record's stamp loaded with Acquire) and is not rewritten until the consumer
            // advances tail.
            f(unsafe { std::slice::from_raw_parts(self.ptr.add(off), len) })
        }
    }
}

#[cfg(loom)]
mod storage {
    use loom::cell::UnsafeCell;
    use loom::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    /// Loom model of the data bytes: one tracked cell per byte, and one atomic per
    /// line for the stamps (the real ring's first word of a record's line).
    #[derive(Clone)]
    pub struct Storage {
        cells: Arc<Vec<UnsafeCell<u8>>>,
        stamps: Arc<Vec<AtomicU64>>,
    }

    impl Storage {
        pub fn new_heap(len: usize) -> Self {
            Storage {
                cells: Arc::new((0..len).map(|_| UnsafeCell::new(0)).collect()),
                stamps: Arc::new((0..len / super::RECORD_ALIGN).map(|_| AtomicU64::new(0)).collect()),
            }
        }

        pub fn store_stamp(&self, off: usize, stamp: u64) {
            self.stamps[off / super::RECORD_ALIGN].store(stamp, Ordering::Release);
        }

        pub fn load_stamp(&self, off: usize) -> u64 {
            self.stamps[off / super::RECORD_ALIGN].load(Ordering::Acquire)
        }

        pub fn write(&self, off: usize, src: &[u8]) {
            for (i, b) in src.iter().enumerate() {
                // SAFETY: loom checks this access for races.
                self.cells[off + i].with_mut(|p| unsafe { *p = *b });
            }
        }

        pub fn read_u32(&self, off: usize) -> u32 {
            let mut b = [0u8; 4];
            self.with_slice(off, 4, |s| b.copy_from_slice(s));
            u32::from_le_bytes(b)
        }

        pub fn with_slice<R>(&self, off: usize, len: usize, f: impl FnOnce(&[u8]) -> R) -> R {
            // SAFETY: loom checks this access for races.
            let v: Vec<u8> = (off..off + len).map(|i| self.cells[i].with(|p| unsafe { *p })).collect();
            f(&v)
        }
    }
}

pub use storage::Storage;

/// Shared handle to the indices; in shared memory a raw pointer, under loom an `Arc`.
#[cfg(not(loom))]
#[derive(Clone, Copy)]
pub struct ControlRef(*const RingControl);
#[cfg(not(loom))]
// SAFETY: RingControl holds only atomics; the pointer targets a mapping that outlives
// the ring (the connection keeps the mapping alive).
unsafe impl Send for ControlRef {}
#[cfg(not(loom))]
impl ControlRef {
    /// # Safety
    /// `p` must point to an initialised `RingControl` that outlives every use.
    pub unsafe fn new(p: *const RingControl) -> Self {
        ControlRef(p)
    }
    fn get(&self) -> &RingControl {
        // SAFETY: guaranteed by the constructor's contract.
        unsafe { &*self.0 }
    }
}

#[cfg(loom)]
#[derive(Clone)]
pub struct ControlRef(std::sync::Arc<RingControl>);
#[cfg(loom)]
impl ControlRef {
    pub fn new_heap() -> Self {
        ControlRef(std::sync::Arc::new(RingControl::new()))
    }
    fn get(&self) -> &RingControl {
        &self.0
    }
}

/// Writing end of a ring.
pub struct Producer {
    ctl: ControlRef,
    data: Storage,
    cap: u64,
    head: u64,
    cached_tail: u64,
    salt: u64,
}

/// Reading end of a ring.
pub struct Consumer {
    ctl: ControlRef,
    data: Storage,
    cap: u64,
    tail: u64,
    salt: u64,
}

/// Creates both ends over indices and storage of `capacity` bytes (a multiple of 128,
/// so that half of it is whole records).
/// The control must be fresh (zero `tail`) or belong to a drained ring used with the
/// same capacity: the producer starts where the consumer is.
pub fn split(ctl: ControlRef, data: Storage, capacity: usize) -> (Producer, Consumer) {
    #[allow(clippy::clone_on_copy)] // ControlRef and Storage are not Copy under loom
    let p = producer(ctl.clone(), data.clone(), capacity);
    let c = consumer(ctl, data, capacity);
    (p, c)
}

/// The producer end alone (each process maps one end of each ring).
pub fn producer(ctl: ControlRef, data: Storage, capacity: usize) -> Producer {
    assert!(capacity.is_multiple_of(2 * RECORD_ALIGN));
    let tail = ctl.get().tail.0.load(Ordering::Acquire);
    let salt = ctl.get().salt.0.load(Ordering::Relaxed);
    Producer { ctl, data, cap: capacity as u64, head: tail, cached_tail: tail, salt }
}

/// The consumer end alone.
pub fn consumer(ctl: ControlRef, data: Storage, capacity: usize) -> Consumer {
    assert!(capacity.is_multiple_of(2 * RECORD_ALIGN));
    let tail = ctl.get().tail.0.load(Ordering::Relaxed);
    let salt = ctl.get().salt.0.load(Ordering::Relaxed);
    Consumer { ctl, data, cap: capacity as u64, tail, salt }
}

impl Producer {
    /// Appends one record made of `parts` concatenated. Returns `false` (and writes
    /// nothing) if the ring lacks room; the caller retries after the consumer advances.
    ///
    /// # Panics
    /// If the record is larger than [`max_payload`] of the capacity.
    pub fn try_push(&mut self, parts: &[&[u8]]) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        assert!(len <= max_payload(self.cap as usize), "record of {len} bytes exceeds ring limit");
        let rec = record_size(len) as u64;
        let pos = self.head % self.cap;
        let to_end = self.cap - pos;
        let need = if rec <= to_end { rec } else { to_end + rec };
        if self.head + need - self.cached_tail > self.cap {
            self.cached_tail = self.ctl.get().tail.0.load(Ordering::Acquire);
            if self.head + need - self.cached_tail > self.cap {
                return false;
            }
        }
        let (at, start) = if rec > to_end { (0, self.head + to_end) } else { (pos, self.head) };
        self.data.write(at as usize + LEN_AT, &(len as u32).to_le_bytes());
        let mut off = at as usize + PREFIX;
        for p in parts {
            self.data.write(off, p);
            off += p.len();
        }
        self.data.store_stamp(at as usize, start ^ self.salt);
        if rec > to_end {
            // After the record it leads to: a consumer that follows the marker finds
            // that record published.
            self.data.write(pos as usize + LEN_AT, &WRAP.to_le_bytes());
            self.data.store_stamp(pos as usize, self.head ^ self.salt);
        }
        self.head += need;
        true
    }

    /// Whether a record of `payload` bytes would fit now.
    pub fn fits(&mut self, payload: usize) -> bool {
        let rec = record_size(payload) as u64;
        let pos = self.head % self.cap;
        let to_end = self.cap - pos;
        let need = if rec <= to_end { rec } else { to_end + rec };
        if self.head + need - self.cached_tail <= self.cap {
            return true;
        }
        self.cached_tail = self.ctl.get().tail.0.load(Ordering::Acquire);
        self.head + need - self.cached_tail <= self.cap
    }

    /// Whether the consumer has released space since the producer last looked (after a
    /// failed [`Producer::try_push`], it may now succeed).
    pub fn space_released(&mut self) -> bool {
        let tail = self.ctl.get().tail.0.load(Ordering::Acquire);
        let moved = tail != self.cached_tail;
        self.cached_tail = tail;
        moved
    }

    /// True when the consumer has read everything published.
    pub fn is_drained(&self) -> bool {
        self.ctl.get().tail.0.load(Ordering::Acquire) == self.head
    }
}

impl Consumer {
    /// Reads the oldest record in place with `f` and releases it. `None` if empty.
    pub fn pop_with<R>(&mut self, f: impl FnOnce(&[u8]) -> R) -> Option<R> {
        let (at, len) = self.front()?;
        let r = self.data.with_slice(at + PREFIX, len, f);
        self.release(len);
        Some(r)
    }

    /// Like [`Consumer::pop_with`], but `f` may decline the record (return `None`), in
    /// which case it stays at the front of the ring (back-pressure: the receiver has no
    /// room for it yet).
    pub fn try_pop_with<R>(&mut self, f: impl FnOnce(&[u8]) -> Option<R>) -> Option<R> {
        let (at, len) = self.front()?;
        let r = self.data.with_slice(at + PREFIX, len, f)?;
        self.release(len);
        Some(r)
    }

    /// True if a record is waiting: the stamp at `tail` is the one a record published
    /// there carries. A waiter that calls this in a loop spins on the line the next
    /// record will be written to, which brings the record with its publication.
    pub fn has_data(&mut self) -> bool {
        self.data.load_stamp((self.tail % self.cap) as usize) == self.tail ^ self.salt
    }

    fn front(&mut self) -> Option<(usize, usize)> {
        if !self.has_data() {
            return None;
        }
        let mut pos = self.tail % self.cap;
        let mut len = self.data.read_u32(pos as usize + LEN_AT);
        if len == WRAP {
            self.tail += self.cap - pos;
            pos = 0;
            // The producer stamps the record before the marker; a ring whose producer
            // broke that order just looks empty until it does.
            if !self.has_data() {
                return None;
            }
            len = self.data.read_u32(LEN_AT);
        }
        Some((pos as usize, len as usize))
    }

    fn release(&mut self, len: usize) {
        self.tail += record_size(len) as u64;
        self.ctl.get().tail.0.store(self.tail, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn heap_ring(cap: usize) -> (Box<RingControl>, Vec<u64>, Producer, Consumer) {
        let ctl = Box::new(RingControl::new());
        let mut mem = vec![0u64; cap / 8];
        // SAFETY: ctl and mem outlive the ring ends in each test (returned alongside).
        let (p, c) = unsafe { split(ControlRef::new(&*ctl), Storage::new(mem.as_mut_ptr() as *mut u8, cap), cap) };
        (ctl, mem, p, c)
    }

    #[test]
    fn fifo_with_wraparound_and_backpressure() {
        let (_c, _m, mut p, mut c) = heap_ring(256);
        let mut expect = std::collections::VecDeque::new();
        let mut next = 0u32;
        for round in 0..500 {
            // Push until full with records of varying length.
            loop {
                let len = (next as usize * 7 + round) % 100;
                let body = vec![next as u8; len];
                if !p.try_push(&[&next.to_le_bytes(), &body]) {
                    break;
                }
                expect.push_back((next, len));
                next += 1;
            }
            // Drain some.
            for _ in 0..(round % 4 + 1) {
                if let Some((id, len)) = expect.pop_front() {
                    let got = c.pop_with(|r| r.to_vec()).unwrap();
                    assert_eq!(&got[..4], &id.to_le_bytes());
                    assert_eq!(got.len(), 4 + len);
                    assert!(got[4..].iter().all(|&b| b == id as u8));
                }
            }
        }
        while let Some((id, _)) = expect.pop_front() {
            assert_eq!(c.pop_with(|r| r[..4].to_vec()).unwrap(), id.to_le_bytes());
        }
        assert!(c.pop_with(|_| ()).is_none());
        assert!(p.is_drained());
    }

    #[test]
    fn only_a_published_record_is_taken_whatever_bytes_an_earlier_lap_left() {
        let (ctl, _m, mut p, mut c) = heap_ring(256);
        assert!(!c.has_data(), "zeroed memory is not a record");
        // Lap 1: one record of four lines whose payload covers offsets 64..256, every
        // word of it the position a record of lap 2 starting there will have (256 + its
        // offset), as an application's own counters might be.
        let body: Vec<u8> = (0..256 - PREFIX).step_by(8).flat_map(|i| ((256 + (PREFIX + i) as u64) & !63).to_le_bytes()).collect();
        assert!(p.try_push(&[&body[..128 - PREFIX]]));
        assert_eq!(c.pop_with(|r| r.len()), Some(128 - PREFIX));
        assert!(p.try_push(&[&body[..128 - PREFIX]]));
        assert_eq!(c.pop_with(|r| r.len()), Some(128 - PREFIX));
        // Lap 2: one one-line record at offset 0, taken; offset 64 holds lap 1's bytes.
        assert!(p.try_push(&[b"x"]));
        assert_eq!(c.pop_with(|r| r.to_vec()).unwrap(), b"x");
        assert!(!c.has_data(), "a payload holding the next position is not a record");
        assert_eq!(c.pop_with(|r| r.to_vec()), None);
        // (Unsalted, a stamp would be the bare position, and lap 1's bytes would pass.)
        assert_ne!(ctl.salt.0.load(Ordering::Relaxed), 0);
        assert!(p.try_push(&[b"y"]));
        assert_eq!(c.pop_with(|r| r.to_vec()).unwrap(), b"y");
    }

    #[test]
    fn declined_record_stays_at_front() {
        let (_c, _m, mut p, mut c) = heap_ring(256);
        assert!(p.try_push(&[b"abc"]));
        assert_eq!(c.try_pop_with(|_| None::<()>), None);
        assert_eq!(c.pop_with(|r| r.to_vec()).unwrap(), b"abc");
    }

    #[test]
    fn threads_stream_a_million_bytes_in_order() {
        let ctl = Box::leak(Box::new(RingControl::new()));
        let mem: &'static mut [u64] = Box::leak(vec![0u64; 1024 / 8].into_boxed_slice());
        // SAFETY: leaked allocations live for the rest of the process.
        let (mut p, mut c) = unsafe { split(ControlRef::new(ctl), Storage::new(mem.as_mut_ptr() as *mut u8, 1024), 1024) };
        let t = std::thread::spawn(move || {
            let mut i = 0u64;
            while i < 100_000 {
                if p.try_push(&[&i.to_le_bytes()]) {
                    i += 1;
                } else {
                    std::hint::spin_loop();
                }
            }
        });
        let mut want = 0u64;
        while want < 100_000 {
            if let Some(v) = c.pop_with(|r| u64::from_le_bytes(r.try_into().unwrap())) {
                assert_eq!(v, want);
                want += 1;
            }
        }
        t.join().unwrap();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;

    /// Three records through a 128-byte ring (two lines: the third wraps) while the
    /// consumer reads concurrently: every interleaving delivers them intact and in
    /// order, and loom finds no unsynchronised byte access.
    #[test]
    fn ring_loom() {
        loom::model(|| {
            let ctl = ControlRef::new_heap();
            let data = Storage::new_heap(128);
            let (mut p, mut c) = split(ctl, data, 128);
            let t = loom::thread::spawn(move || {
                for v in [0x11u8, 0x22, 0x33] {
                    while !p.try_push(&[&[v; 20]]) {
                        loom::thread::yield_now();
                    }
                }
            });
            let mut got = Vec::new();
            while got.len() < 3 {
                match c.pop_with(|r| r.to_vec()) {
                    Some(r) => got.push(r),
                    None => loom::thread::yield_now(),
                }
            }
            t.join().unwrap();
            assert_eq!(got, vec![vec![0x11; 20], vec![0x22; 20], vec![0x33; 20]]);
        });
    }
}
