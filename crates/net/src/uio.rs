//! Reading a socket straight into a message buffer's unused capacity.
//!
//! A rendezvous message between nodes is received into the buffer the application
//! posted, with no stop in the connection's frame decoder (see `port::remote`'s direct
//! reads): one copy, the kernel's, where there were two. The buffer's capacity past its
//! length is uninitialised, and `std::io::Read` only takes initialised slices, so this
//! is one `readv` on the raw descriptor — with a second slice for the bytes that follow
//! (the next frame's header), so that one system call ends a piece and starts the next.

use std::io;
use std::os::fd::RawFd;

/// Reads from `fd` into `dest`'s spare capacity (at most `want` bytes, appended: the
/// length grows by what arrived there) and then into `tail`, in one `readv`. Returns
/// the bytes read in all; those beyond `want` are at the start of `tail`. `Ok(0)` is
/// the end of the stream; `WouldBlock` comes back as an error, as from `read`.
pub fn readv_spare(fd: RawFd, dest: &mut Vec<u8>, want: usize, tail: &mut [u8]) -> io::Result<usize> {
    let want = want.min(dest.capacity() - dest.len());
    let iov = [
        libc::iovec {
            // SAFETY: `len <= capacity`, so the pointer is inside (or one past) the
            // allocation, and the `want` bytes after it are spare capacity (clamped
            // above).
            iov_base: unsafe { dest.as_mut_ptr().add(dest.len()) }.cast(),
            iov_len: want,
        },
        libc::iovec { iov_base: tail.as_mut_ptr().cast(), iov_len: tail.len() },
    ];
    // SAFETY: both iovecs name memory we own exclusively for the duration of the call
    // (`dest`'s spare capacity and the `tail` slice, both borrowed mutably), and the
    // kernel writes no more than their lengths.
    let n = unsafe { libc::readv(fd, iov.as_ptr(), 2) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let n = n as usize;
    // SAFETY: the kernel filled the first iovec before the second, so the first
    // `min(n, want)` bytes of the spare capacity are now initialised.
    unsafe { dest.set_len(dest.len() + n.min(want)) };
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;
    use std::os::fd::AsRawFd;
    use std::os::unix::net::UnixStream;

    #[test]
    fn fills_the_spare_capacity_first_then_the_tail() {
        let (mut a, b) = UnixStream::pair().unwrap();
        b.set_nonblocking(true).unwrap();
        a.write_all(b"0123456789abcdef").unwrap();
        let mut dest = Vec::with_capacity(64);
        dest.extend_from_slice(b"xy");
        let mut tail = [0u8; 4];
        let n = readv_spare(b.as_raw_fd(), &mut dest, 10, &mut tail).unwrap();
        assert_eq!(n, 14);
        assert_eq!(dest, b"xy0123456789");
        assert_eq!(&tail, b"abcd");
        // The rest, then nothing: WouldBlock, and the buffer unchanged.
        let n = readv_spare(b.as_raw_fd(), &mut dest, 100, &mut tail).unwrap();
        assert_eq!((n, &dest[12..]), (2, &b"ef"[..]));
        let e = readv_spare(b.as_raw_fd(), &mut dest, 100, &mut tail).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        assert_eq!(dest.len(), 14);
        // Never past the capacity, whatever is asked.
        a.write_all(&[7u8; 100]).unwrap();
        let n = readv_spare(b.as_raw_fd(), &mut dest, 1000, &mut tail).unwrap();
        assert_eq!(n, 64 - 14 + 4);
        assert_eq!(dest.len(), 64);
        drop(a);
        let mut rest = Vec::with_capacity(100);
        let n = readv_spare(b.as_raw_fd(), &mut rest, 100, &mut []).unwrap();
        assert_eq!((n, rest.len()), (46, 46));
        assert_eq!(readv_spare(b.as_raw_fd(), &mut rest, 100, &mut []).unwrap(), 0);
    }
}
