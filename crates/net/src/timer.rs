//! A `timerfd` for the event thread: epoll's own timeout has millisecond granularity
//! (mio rounds up), far too coarse for the 50 µs lease after which the event thread
//! takes over progress from an application that went off to compute.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use crate::error::NetError;

/// A one-shot monotonic timer whose descriptor becomes readable when it fires.
pub struct Timer(OwnedFd);

impl Timer {
    pub fn new() -> Result<Timer, NetError> {
        // SAFETY: plain syscall; the result is checked before it is wrapped.
        let fd = unsafe { libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_NONBLOCK | libc::TFD_CLOEXEC) };
        if fd < 0 {
            return Err(NetError::io("timerfd_create", std::io::Error::last_os_error()));
        }
        // SAFETY: fd is a new descriptor we own.
        Ok(Timer(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Fires once after `after` (`None`: disarm).
    pub fn arm(&self, after: Option<Duration>) {
        let value = after.map_or(timespec(Duration::ZERO), |d| timespec(d.max(Duration::from_nanos(1))));
        let spec = libc::itimerspec { it_interval: timespec(Duration::ZERO), it_value: value };
        // SAFETY: valid descriptor and a fully initialised itimerspec; no old value wanted.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, std::ptr::null_mut()) };
    }

    /// Fires once after `after`, or sooner if it was already set to (for a thread that
    /// arms it without the lock under which others may have set it meanwhile): one
    /// system call, a second only when an earlier setting has to be put back.
    pub fn arm_unless_sooner(&self, after: Duration) {
        let after = after.max(Duration::from_nanos(1));
        let zero = timespec(Duration::ZERO);
        let spec = libc::itimerspec { it_interval: zero, it_value: timespec(after) };
        let mut old = libc::itimerspec { it_interval: zero, it_value: zero };
        // SAFETY: valid descriptor, a fully initialised itimerspec, and room for the old one.
        unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &spec, &mut old) };
        let was = Duration::new(old.it_value.tv_sec as u64, old.it_value.tv_nsec as u32);
        if !was.is_zero() && was < after {
            let back = libc::itimerspec { it_interval: zero, it_value: old.it_value };
            // SAFETY: as above; no old value wanted.
            unsafe { libc::timerfd_settime(self.0.as_raw_fd(), 0, &back, std::ptr::null_mut()) };
        }
    }

    /// Consumes the expiration count after the timer fired.
    pub fn clear(&self) {
        let mut b = [0u8; 8];
        let _ = nix::unistd::read(self.0.as_raw_fd(), &mut b);
    }

    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec { tv_sec: d.as_secs() as libc::time_t, tv_nsec: d.subsec_nanos() as libc::c_long }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fires_with_sub_millisecond_precision() {
        let t = Timer::new().unwrap();
        let start = std::time::Instant::now();
        t.arm(Some(Duration::from_micros(200)));
        let mut p = libc::pollfd { fd: t.raw(), events: libc::POLLIN, revents: 0 };
        // SAFETY: one valid pollfd.
        let n = unsafe { libc::poll(&mut p, 1, 1000) };
        assert_eq!(n, 1);
        let waited = start.elapsed();
        assert!(waited >= Duration::from_micros(200), "fired early: {waited:?}");
        t.clear();
        t.arm(None);
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 5) }, 0, "a disarmed timer stays quiet");
    }

    #[test]
    fn arming_unless_sooner_keeps_an_earlier_setting_and_arms_a_disarmed_timer() {
        let t = Timer::new().unwrap();
        let mut p = libc::pollfd { fd: t.raw(), events: libc::POLLIN, revents: 0 };
        t.arm(Some(Duration::from_micros(200)));
        t.arm_unless_sooner(Duration::from_secs(30));
        // SAFETY: one valid pollfd.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1, "the earlier setting stands");
        t.clear();
        t.arm_unless_sooner(Duration::from_micros(300));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1, "a disarmed timer is armed");
        t.clear();
        t.arm(Some(Duration::from_secs(30)));
        t.arm_unless_sooner(Duration::from_micros(300));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::poll(&mut p, 1, 5000) }, 1, "a later setting is brought forward");
    }
}
