//! Single-copy transfer between processes on one node (Linux cross-memory attach).
//!
//! A rendezvous message between two ports on one node does not have to travel through
//! the shared-memory ring at all: the sender's request-to-send carries its process id
//! and the address of its (immutable, kept-alive) buffer, and the receiver copies the
//! bytes straight into the posted buffer with `process_vm_readv` — one copy done by
//! the kernel, instead of one copy into the ring and one out of it. Measured on these
//! machines (Intel, 2 vCPUs): 20 GB/s at 1 MiB against 8.7 GB/s through the ring. That
//! is also what OpenMPI's shared-memory transport does (its "CMA single copy").
//!
//! The pid in a request to send is only trusted when it is the pid the kernel reports
//! for the other end of the shared-memory connection's Unix socket (`SO_PEERCRED`, in
//! the receiver's pid namespace): across pid namespaces, or from a confused peer, it
//! would name some other process. Such offers are refused and the data comes through
//! the ring (`PortStats::single_copies_not_from_peer`).
//!
//! The kernel checks the receiver's right to read the sender (same user, and no Yama or
//! seccomp policy forbidding it). When it refuses, the protocol falls back to the ring
//! for that message and stops offering single copy (`Proto::copy_done`), so a
//! restricted system costs one failed system call, not a failed transfer.

use std::io;

/// Copies `len` bytes at `addr` in process `pid` into `buf` (whose contents are
/// replaced; its capacity must be at least `len`).
pub fn read_into(pid: u32, addr: u64, len: usize, buf: &mut Vec<u8>) -> io::Result<()> {
    assert!(buf.capacity() >= len, "buffer of {} bytes for a {len}-byte copy", buf.capacity());
    buf.clear();
    // SAFETY: the local range is the buffer's spare capacity (at least `len`, checked
    // above), which nothing else references while the kernel writes it.
    unsafe { transfer(Direction::Read, pid, addr, buf.as_mut_ptr(), len)? };
    // SAFETY: the kernel initialised exactly `len` bytes from the start of the buffer
    // (`transfer` only succeeds once all of them moved), and `len <= capacity`.
    unsafe { buf.set_len(len) };
    Ok(())
}

/// Writes `src` at `addr` in process `pid` (the other half of a copy split between
/// sender and receiver, see `proto::copy`).
pub fn write_from(pid: u32, addr: u64, src: &[u8]) -> io::Result<()> {
    // SAFETY: the local range is the borrowed slice, which the kernel only reads.
    unsafe { transfer(Direction::Write, pid, addr, src.as_ptr() as *mut u8, src.len()) }
}

#[derive(Clone, Copy)]
enum Direction {
    /// `process_vm_readv`: from the other process into `local`.
    Read,
    /// `process_vm_writev`: from `local` into the other process.
    Write,
}

/// Moves `len` bytes between `local` (in this process) and `addr` in process `pid`,
/// calling again after a partial transfer.
///
/// # Safety
/// `local..local + len` must be valid for the direction: writable and referenced by
/// nothing else for a read, readable for a write.
unsafe fn transfer(dir: Direction, pid: u32, addr: u64, local: *mut u8, len: usize) -> io::Result<()> {
    let mut done = 0usize;
    while done < len {
        // SAFETY: `done < len`, so the pointer stays inside the caller's range.
        let ours = libc::iovec { iov_base: unsafe { local.add(done) }.cast(), iov_len: len - done };
        let theirs = libc::iovec { iov_base: (addr as usize + done) as *mut libc::c_void, iov_len: len - done };
        // SAFETY: our iovec covers the caller's range, valid for this direction (the
        // function's contract); the other names memory of another process, which the
        // kernel validates (EFAULT) and never touches in ours.
        let n = unsafe {
            match dir {
                Direction::Read => libc::process_vm_readv(pid as libc::pid_t, &ours, 1, &theirs, 1, 0),
                Direction::Write => libc::process_vm_writev(pid as libc::pid_t, &ours, 1, &theirs, 1, 0),
            }
        };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        if n == 0 {
            return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "process_vm_readv/writev moved nothing"));
        }
        done += n as usize;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_from_a_process_exactly() {
        let src: Vec<u8> = (0..3_000_000u32).map(|i| (i * 7 + i / 251) as u8).collect();
        let mut buf = Vec::with_capacity(src.len() + 10);
        buf.extend_from_slice(b"old contents");
        read_into(std::process::id(), src.as_ptr() as u64, src.len(), &mut buf).unwrap();
        assert_eq!(buf, src);
        read_into(std::process::id(), src.as_ptr() as u64 + 5, 100, &mut buf).unwrap();
        assert_eq!(buf, &src[5..105]);
        read_into(std::process::id(), src.as_ptr() as u64, 0, &mut buf).unwrap();
        assert!(buf.is_empty());
    }

    #[test]
    fn writes_into_a_process_exactly() {
        let src: Vec<u8> = (0..3_000_000u32).map(|i| (i * 11 + i / 253) as u8).collect();
        let mut dst = vec![0u8; src.len() + 10];
        write_from(std::process::id(), dst.as_mut_ptr() as u64 + 5, &src).unwrap();
        assert_eq!(&dst[5..5 + src.len()], &src[..]);
        assert!(dst[..5].iter().chain(&dst[5 + src.len()..]).all(|&b| b == 0), "nothing written outside");
        let e = write_from(std::process::id(), 8, &src[..64]).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        write_from(std::process::id(), 8, &[]).unwrap();
    }

    #[test]
    fn bad_address_or_process_is_an_error_not_a_crash() {
        let mut buf = Vec::with_capacity(64);
        let e = read_into(std::process::id(), 8, 64, &mut buf).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT), "{e}");
        assert!(buf.is_empty(), "nothing claimed on failure");
        let src = [1u8; 64];
        // Pid 0 names no process for process_vm_readv.
        let e = read_into(0, src.as_ptr() as u64, 64, &mut buf).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ESRCH), "{e}");
    }
}
