//! A TCP relay on loopback in front of a real server, whose connections the
//! test can cut at a moment of its choosing (a network failure, not a mock:
//! the bytes on either side are the real protocol's). New connections after
//! a cut are relayed again.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// A running relay; on drop it cuts its connections and stops accepting.
pub struct Relay {
    /// Where to connect instead of the server.
    pub port: u16,
    open: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
}

impl Relay {
    /// Relay 127.0.0.1:PORT (free) to 127.0.0.1:`target`.
    pub fn start(target: u16) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let port = listener.local_addr()?.port();
        let open: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let tracked = open.clone();
        let stop = Arc::new(AtomicBool::new(false));
        let stopping = stop.clone();
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                if stopping.load(Ordering::SeqCst) {
                    return;
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let (Ok(c2), Ok(s2)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                if let (Ok(mut list), Ok(c3), Ok(s3)) =
                    (tracked.lock(), client.try_clone(), server.try_clone())
                {
                    list.push(c3);
                    list.push(s3);
                }
                std::thread::spawn(move || pump(client, server));
                std::thread::spawn(move || pump(s2, c2));
            }
        });
        Ok(Self { port, open, stop })
    }

    /// Cut every connection relayed so far, both ways, at once.
    pub fn cut(&self) {
        if let Ok(mut list) = self.open.lock() {
            for s in list.drain(..) {
                let _ = s.shutdown(Shutdown::Both);
            }
        }
    }
}

fn pump(mut from: TcpStream, mut to: TcpStream) {
    let mut buf = [0u8; 16 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so that it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        self.cut();
    }
}
