//! A TCP relay for the link tests: it records every byte that passes, can cut the
//! connections it carries, and can alter one byte.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};

/// Relays connections to `target`, records what passes (both directions), and cuts
/// every connection on demand. Its thread ends with the test process.
pub struct Relay {
    pub addr: SocketAddr,
    /// What passed, one record per direction of each connection: a message's bytes
    /// stay contiguous (one shared record would interleave the two directions'
    /// reads).
    wire: Arc<Mutex<Vec<Vec<u8>>>>,
    open: Arc<Mutex<Vec<TcpStream>>>,
}

impl Relay {
    /// A relay that inverts the byte at offset `flip` of the first connection's first
    /// direction (the connecting side's bytes), once.
    pub fn altering(target: SocketAddr, flip: Option<usize>) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let wire = Arc::new(Mutex::new(Vec::new()));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (w, o) = (wire.clone(), open.clone());
        std::thread::spawn(move || {
            for client in l.incoming().flatten() {
                let Ok(server) = TcpStream::connect(target) else { continue };
                o.lock().unwrap().extend([client.try_clone().unwrap(), server.try_clone().unwrap()]);
                for (mut from, mut to) in [(client.try_clone().unwrap(), server.try_clone().unwrap()), (server, client)] {
                    let w = w.clone();
                    let record = {
                        let mut w = w.lock().unwrap();
                        w.push(Vec::new());
                        w.len() - 1
                    };
                    let mut flip = if record == 0 { flip } else { None };
                    std::thread::spawn(move || {
                        let mut buf = vec![0u8; 1 << 16];
                        let mut passed = 0;
                        while let Ok(n) = from.read(&mut buf) {
                            if n == 0 {
                                break;
                            }
                            if let Some(at) = flip.filter(|&at| at < passed + n) {
                                buf[at - passed] ^= 0xff;
                                flip = None;
                            }
                            passed += n;
                            // Recorded before it is passed on: once the receiver has a
                            // message, its bytes are in the record.
                            w.lock().unwrap()[record].extend_from_slice(&buf[..n]);
                            if to.write_all(&buf[..n]).is_err() {
                                break;
                            }
                        }
                        let _ = to.shutdown(Shutdown::Both);
                    });
                }
            }
        });
        Relay { addr, wire, open }
    }

    pub fn cut(&self) {
        for s in self.open.lock().unwrap().drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// What the first connection's connecting side sent.
    pub fn first_record(&self) -> Vec<u8> {
        self.wire.lock().unwrap()[0].clone()
    }

    /// Every direction's record, one after the other.
    pub fn wire(&self) -> Vec<u8> {
        self.wire.lock().unwrap().concat()
    }
}
