//! A TCP proxy that adds a fixed round-trip time, half each way, to reach
//! Postgres as if over a network (this kernel has no `netem`).
//!
//! Hand-written rather than toxiproxy or noxious: toxiproxy needs Go to
//! build, noxious publishes only its library on crates.io (no server, and
//! old tokio-util and mockall), and both add latency in whole milliseconds.
//! What the benchmark needs is one thing, a fixed delay per chunk that
//! keeps pipelining intact, and plain threads give it with sub-millisecond
//! precision: tokio's timers round up to the next millisecond.
//!
//! Each connection gets two pumps (client to server, server to client),
//! each a reader thread that stamps chunks with their due time and a
//! writer thread that sends each when due, so a chunk read while another
//! waits is not held up behind it.

use std::io::{Read as _, Write as _};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

/// A running proxy; stops accepting when dropped (open connections run on
/// until either side closes).
#[derive(Debug)]
pub struct DelayProxy {
    addr: SocketAddr,
    stopped: Arc<AtomicBool>,
    /// Half the added round trip, in nanoseconds, read for every chunk.
    one_way: Arc<AtomicU64>,
}

impl DelayProxy {
    /// Listens on a free loopback port and forwards each connection to
    /// `upstream`, delaying every chunk by `rtt / 2` in each direction.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub fn start(upstream: SocketAddr, rtt: Duration) -> std::io::Result<Self> {
        Self::start_with(upstream, rtt, false)
    }

    /// As [`start`](Self::start), with a round trip that
    /// [`set_rtt`](Self::set_rtt) changes while connections are open. Every
    /// chunk goes through the delaying threads, even at zero delay.
    ///
    /// # Errors
    ///
    /// When no loopback port can be bound.
    pub fn start_adjustable(upstream: SocketAddr, rtt: Duration) -> std::io::Result<Self> {
        Self::start_with(upstream, rtt, true)
    }

    /// Sets the added round trip of every connection, open or not, from
    /// the next chunk on.
    pub fn set_rtt(&self, rtt: Duration) {
        self.one_way.store(
            u64::try_from((rtt / 2).as_nanos()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    fn start_with(upstream: SocketAddr, rtt: Duration, adjustable: bool) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stopped = Arc::new(AtomicBool::new(false));
        let stop = Arc::clone(&stopped);
        let one_way = Arc::new(AtomicU64::new(
            u64::try_from((rtt / 2).as_nanos()).unwrap_or(u64::MAX),
        ));
        let delay = Arc::clone(&one_way);
        thread::Builder::new()
            .name("delay-proxy".into())
            .spawn(move || {
                for client in listener.incoming() {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let Ok(client) = client else { continue };
                    let delay = Delay {
                        one_way: Arc::clone(&delay),
                        adjustable,
                    };
                    if let Err(e) = connect(client, upstream, delay) {
                        eprintln!("delay proxy: cannot reach {upstream}: {e}");
                    }
                }
            })?;
        Ok(Self {
            addr,
            stopped,
            one_way,
        })
    }

    /// The address to connect to instead of the upstream.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.stopped.store(true, Ordering::Relaxed);
        // Wakes the accept loop so it sees the flag.
        let _ = TcpStream::connect(self.addr);
    }
}

/// How long chunks wait, shared by every connection of a proxy.
#[derive(Debug, Clone)]
struct Delay {
    one_way: Arc<AtomicU64>,
    /// The delay may change: chunks always go through the delaying threads.
    adjustable: bool,
}

impl Delay {
    fn now(&self) -> Duration {
        Duration::from_nanos(self.one_way.load(Ordering::Relaxed))
    }
}

fn connect(client: TcpStream, upstream: SocketAddr, one_way: Delay) -> std::io::Result<()> {
    let server = TcpStream::connect(upstream)?;
    for s in [&client, &server] {
        s.set_nodelay(true)?;
    }
    pump(client.try_clone()?, server.try_clone()?, one_way.clone())?;
    pump(server, client, one_way)
}

/// Copies `from` to `to`, each chunk `delay` after it was read.
fn pump(mut from: TcpStream, mut to: TcpStream, delay: Delay) -> std::io::Result<()> {
    if delay.now().is_zero() && !delay.adjustable {
        // No hand-off between threads: the proxy's own cost, and no more.
        thread::Builder::new()
            .name("delay-copy".into())
            .spawn(move || {
                let mut buf = vec![0u8; 64 * 1024];
                while let Ok(n @ 1..) = from.read(&mut buf) {
                    if to.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
                let _ = to.shutdown(Shutdown::Write);
            })?;
        return Ok(());
    }
    let (tx, rx) = mpsc::channel::<(Instant, Vec<u8>)>();
    thread::Builder::new()
        .name("delay-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + delay.now(), buf[..n].to_vec()))
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            // The channel closes; the writer half-closes after the rest.
        })?;
    thread::Builder::new()
        .name("delay-write".into())
        .spawn(move || {
            // The kernel lets a sleeping thread wake up to 50 µs late by
            // default, to batch timer wake-ups; a delay should be exact.
            let _ = nix::sys::prctl::set_timerslack(1);
            for (due, chunk) in rx {
                let now = Instant::now();
                if due > now {
                    thread::sleep(due - now);
                }
                if to.write_all(&chunk).is_err() {
                    break;
                }
            }
            let _ = to.shutdown(Shutdown::Write);
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback.
    fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for s in listener.incoming().flatten() {
                thread::spawn(move || {
                    let mut r = s.try_clone().unwrap();
                    let mut w = s;
                    let _ = std::io::copy(&mut r, &mut w);
                });
            }
        });
        addr
    }

    #[test]
    fn a_round_trip_takes_the_added_time_and_bytes_arrive_intact() {
        let proxy = DelayProxy::start(echo(), Duration::from_millis(20)).unwrap();
        let mut s = TcpStream::connect(proxy.addr()).unwrap();
        s.set_nodelay(true).unwrap();
        let mut rtts = Vec::new();
        for i in 0..5u8 {
            let start = Instant::now();
            s.write_all(&[i; 100]).unwrap();
            let mut got = [0u8; 100];
            s.read_exact(&mut got).unwrap();
            rtts.push(start.elapsed());
            assert_eq!(got, [i; 100]);
        }
        for rtt in rtts {
            assert!(rtt >= Duration::from_millis(20), "{rtt:?}");
        }
        // Pipelined messages arrive whole and in order.
        s.write_all(&[7; 10]).unwrap();
        s.write_all(&[8; 10]).unwrap();
        let mut got = [0u8; 20];
        s.read_exact(&mut got).unwrap();
        assert_eq!(got[..10], [7; 10]);
        assert_eq!(got[10..], [8; 10]);
    }

    #[test]
    fn an_adjustable_delay_applies_to_open_connections() {
        let proxy = DelayProxy::start_adjustable(echo(), Duration::ZERO).unwrap();
        let mut s = TcpStream::connect(proxy.addr()).unwrap();
        s.set_nodelay(true).unwrap();
        let round_trip = |s: &mut TcpStream| {
            let start = Instant::now();
            s.write_all(&[1; 10]).unwrap();
            let mut got = [0u8; 10];
            s.read_exact(&mut got).unwrap();
            start.elapsed()
        };
        assert!(round_trip(&mut s) < Duration::from_millis(20));
        proxy.set_rtt(Duration::from_millis(30));
        assert!(round_trip(&mut s) >= Duration::from_millis(30));
    }
}
