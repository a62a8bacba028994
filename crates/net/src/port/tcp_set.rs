//! The TCP connections' own `epoll` set, which the port's `epoll` watches as one
//! descriptor.
//!
//! Two things cost a system call per connection when every TCP socket sat in the
//! port's `epoll` directly, and both grow with the peers an agent has (35 in a 36-node
//! group):
//! - a thread that spins on the port (an agent's loop after work, a waiter on a
//!   rendezvous transfer) takes the sockets from the event thread so that arriving
//!   segments do not wake it (`State::quiet_tcp`): an `epoll_ctl` per socket to leave
//!   and one to come back, about 100 µs for 35 peers, so it was given up past 4
//!   connections;
//! - the spinner reads the sockets itself (`State::poll_tcp`), one `read` per socket
//!   per pass, most of them finding nothing.
//!
//! In a set of their own, the sockets are quieted by taking the set's one descriptor
//! out of the port's `epoll` and back (one `epoll_ctl` each way, at any number of
//! peers), and a spinner with many connections asks the set which of them have news
//! (one `epoll_wait` with no timeout) and reads only those. Everything stays
//! edge-triggered: every reader of a socket reads it until it would block, so an edge
//! taken from the set by either thread is never left half-served. Whatever arrives while
//! the set is out of the port's `epoll` stays in the set's ready list, and putting the
//! set back reports it at once.

use std::io;
use std::os::fd::AsRawFd;
use std::time::Duration;

use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Registry, Token};

/// Edges taken from the set per `epoll_wait`; a full batch is followed by another.
const BATCH: usize = 64;

pub(super) struct TcpSet {
    poll: Poll,
    /// Where the TCP sockets are registered (the set's own registry).
    pub(super) registry: Registry,
    /// Taken while a drain hands edges out, so that a drain never nests in another.
    events: Option<Events>,
    /// Whether the port's `epoll` watches the set now, and under which token.
    watched: bool,
    token: Token,
}

impl TcpSet {
    /// An empty set, watched by `port` under `token`.
    pub(super) fn new(port: &Registry, token: Token) -> io::Result<TcpSet> {
        let poll = Poll::new()?;
        let registry = poll.registry().try_clone()?;
        port.register(&mut SourceFd(&poll.as_raw_fd()), token, Interest::READABLE)?;
        Ok(TcpSet { poll, registry, events: Some(Events::with_capacity(BATCH)), watched: true, token })
    }

    pub(super) fn is_watched(&self) -> bool {
        self.watched
    }

    /// Takes the set out of the port's `epoll` (`port`), or puts it back.
    pub(super) fn set_watched(&mut self, port: &Registry, watched: bool) -> io::Result<()> {
        if watched == self.watched {
            return Ok(());
        }
        let fd = self.poll.as_raw_fd();
        if watched {
            port.register(&mut SourceFd(&fd), self.token, Interest::READABLE)?;
        } else {
            port.deregister(&mut SourceFd(&fd))?;
        }
        self.watched = watched;
        Ok(())
    }

    /// Takes the edges waiting in the set without blocking, as (token, readable,
    /// writable), into `out`. Returns false when a drain is already under way (its
    /// caller takes the rest) or the set could not be read; `out` may then be empty.
    /// `more` is set when the batch was full and another may be waiting.
    pub(super) fn take_edges(&mut self, out: &mut Vec<(Token, bool, bool)>, more: &mut bool) -> bool {
        let Some(mut events) = self.events.take() else { return false };
        let ok = self.poll.poll(&mut events, Some(Duration::ZERO)).is_ok();
        let mut n = 0;
        for ev in events.iter() {
            n += 1;
            out.push((ev.token(), ev.is_readable() || ev.is_read_closed(), ev.is_writable()));
        }
        *more = ok && n == BATCH;
        self.events = Some(events);
        ok
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn edges_wait_in_the_set_while_it_is_unwatched_and_are_reported_when_it_returns() {
        const SET: Token = Token(4);
        let mut port = Poll::new().unwrap();
        let mut set = TcpSet::new(port.registry(), SET).unwrap();
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut client = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        let (server, _) = listener.accept().unwrap();
        server.set_nonblocking(true).unwrap();
        let mut server = mio::net::TcpStream::from_std(server);
        set.registry.register(&mut server, Token(100), Interest::READABLE).unwrap();

        let mut events = Events::with_capacity(8);
        set.set_watched(port.registry(), false).unwrap();
        assert!(!set.is_watched());
        client.write_all(b"x").unwrap();
        client.flush().unwrap();
        // Unwatched: the port's epoll hears nothing.
        port.poll(&mut events, Some(Duration::from_millis(50))).unwrap();
        assert!(events.is_empty());
        // Back in the port's epoll, the edge that came meanwhile is reported at once...
        set.set_watched(port.registry(), true).unwrap();
        port.poll(&mut events, Some(Duration::from_secs(5))).unwrap();
        assert_eq!(events.iter().map(|e| e.token()).collect::<Vec<_>>(), vec![SET]);
        // ...and the set names the socket.
        let (mut edges, mut more) = (Vec::new(), true);
        assert!(set.take_edges(&mut edges, &mut more));
        assert_eq!(edges, vec![(Token(100), true, false)]);
        assert!(!more);
        // Taken: not reported again until new data comes.
        edges.clear();
        assert!(set.take_edges(&mut edges, &mut more));
        assert!(edges.is_empty());
    }
}
