//! A receive buffer that another process writes into.
//!
//! A large message between two ports on one node is copied by both ends at once (see
//! `proto::copy`): the receiver reads the first part from the sender with
//! `process_vm_readv` while the sender writes the rest into the receiver's buffer with
//! `process_vm_writev`. Two cores copy instead of one, and on these machines a copy is
//! bound by the core, not by memory (two 1 MiB copies at once: 9.6–10 GB/s, one:
//! 4.3–5.7 GB/s, AMD EPYC guest).
//!
//! The sender holds the buffer's address for as long as its write may run, so the
//! buffer must not be freed (and its memory handed to something else) before the
//! sender has said it is done. A [`LentBuf`] is that promise: dropping one whose writer
//! has not reported back leaks the allocation instead of freeing it. Leaks happen only
//! when a transfer is abandoned half way (the peer failed, the port was dropped).

use std::mem::ManuallyDrop;

/// A posted receive buffer (capacity at least the message) lent to the peer's write.
#[derive(Debug)]
pub struct LentBuf {
    buf: ManuallyDrop<Vec<u8>>,
    /// A remote writer may still write into the buffer: never free it.
    lent: bool,
}

impl LentBuf {
    /// Takes `buf` (emptied); the peer may write into it until [`LentBuf::returned`].
    pub fn new(mut buf: Vec<u8>) -> Self {
        buf.clear();
        LentBuf { buf: ManuallyDrop::new(buf), lent: true }
    }

    /// Address of byte `offset` of the buffer, for the peer to write to.
    ///
    /// # Panics
    /// If `offset` is beyond the capacity.
    pub fn addr(&self, offset: usize) -> u64 {
        assert!(offset <= self.buf.capacity());
        self.buf.as_ptr() as u64 + offset as u64
    }

    /// The peer has reported that its write is over (done or failed): the buffer is
    /// ours alone again and may be freed.
    pub fn returned(&mut self) {
        self.lent = false;
    }

    /// Whether the peer may still be writing.
    pub fn is_lent(&self) -> bool {
        self.lent
    }

    /// Hands the vector to a local copy (which replaces its contents from offset 0 and
    /// gives it back with [`LentBuf::put_back`]); meanwhile this holds nothing.
    pub fn take(&mut self) -> Vec<u8> {
        std::mem::take(&mut *self.buf)
    }

    /// Puts back the vector a local copy took with [`LentBuf::take`].
    pub fn put_back(&mut self, buf: Vec<u8>) {
        let empty = std::mem::replace(&mut *self.buf, buf);
        debug_assert_eq!(empty.capacity(), 0);
    }

    /// Writes `bytes` at `offset`, past whatever the vector's length says (into the
    /// capacity the message will fill).
    ///
    /// # Panics
    /// If the bytes do not fit in the capacity.
    pub fn write_at(&mut self, offset: usize, bytes: &[u8]) {
        let end = offset.checked_add(bytes.len()).expect("offset overflow");
        assert!(end <= self.buf.capacity(), "write of {end} bytes into a buffer of {}", self.buf.capacity());
        // SAFETY: `offset..end` lies inside the allocation (checked above); the source
        // is a separate borrowed slice, so the ranges cannot overlap. No reference to
        // the spare capacity exists, so writing through the raw pointer aliases
        // nothing.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.buf.as_mut_ptr().add(offset), bytes.len()) };
    }

    /// The message: the first `len` bytes, every one of which has been written (by
    /// a local copy, [`LentBuf::write_at`], or the peer's write that it reported).
    ///
    /// # Panics
    /// If the peer may still be writing, or `len` exceeds the capacity.
    pub fn into_message(mut self, len: usize) -> Vec<u8> {
        assert!(!self.lent, "a lent buffer's contents are not final");
        assert!(len <= self.buf.capacity());
        let mut buf = std::mem::take(&mut *self.buf);
        // SAFETY: `len <= capacity`, and the protocol (`proto::copy`) only calls this
        // once it has counted `len` bytes written over disjoint ranges covering
        // `0..len`: by the kernel for our own copy or for the peer's write (which the
        // peer reported: a local process we verified by its pid, trusted with our
        // bytes as the shared-memory rings trust it), or by `write_at`.
        unsafe { buf.set_len(len) };
        buf
    }
}

impl Drop for LentBuf {
    fn drop(&mut self) {
        if !self.lent {
            // SAFETY: dropped exactly once, here; nothing uses `buf` after.
            unsafe { ManuallyDrop::drop(&mut self.buf) };
        }
        // Otherwise leaked on purpose: the peer may still write into it.
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_land_past_the_length_and_make_the_message() {
        let mut b = LentBuf::new(Vec::with_capacity(100));
        let base = b.addr(0);
        assert_eq!(b.addr(60), base + 60);
        b.write_at(60, &[7u8; 40]);
        let mut v = b.take();
        assert_eq!(v.capacity(), 100);
        v.extend_from_slice(&[1u8; 60]);
        b.put_back(v);
        b.returned();
        let m = b.into_message(100);
        assert_eq!(&m[..60], &[1u8; 60]);
        assert_eq!(&m[60..], &[7u8; 40]);
        assert_eq!(m.as_ptr() as u64, base, "the same allocation, never moved");
    }

    #[test]
    #[should_panic(expected = "into a buffer of 10")]
    fn a_write_beyond_the_capacity_panics() {
        LentBuf::new(Vec::with_capacity(10)).write_at(5, &[0u8; 6]);
    }

    #[test]
    #[should_panic(expected = "not final")]
    fn a_lent_buffer_is_not_a_message() {
        LentBuf::new(Vec::with_capacity(10)).into_message(0);
    }

    #[test]
    fn dropping_a_returned_buffer_frees_it_and_a_lent_one_leaks_it() {
        // Both must simply not crash (a leak is not observable here; Miri would
        // report the first as freed and the second as leaked).
        let mut b = LentBuf::new(vec![1u8; 4096]);
        b.returned();
        drop(b);
        drop(LentBuf::new(vec![1u8; 16]));
    }
}
