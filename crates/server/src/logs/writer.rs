//! The writer thread and the queue to it.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use crossbeam_channel::{Receiver, Sender};
use tracing_subscriber::fmt::MakeWriter;

/// The writer thread writes lines in blocks of up to this many bytes.
const BLOCK_BYTES: usize = 64 * 1024;

/// What the writer thread is sent.
#[derive(Debug)]
pub(super) enum Message {
    Line(Vec<u8>),
    /// Write out what came before, then say so.
    Stop(Sender<()>),
}

/// The queue's sending end, as the writer of each formatted line.
#[derive(Debug)]
pub(super) struct Queue {
    pub(super) lines: Sender<Message>,
    pub(super) dropped: Arc<AtomicU64>,
}

impl<'a> MakeWriter<'a> for Queue {
    type Writer = &'a Queue;

    fn make_writer(&'a self) -> &'a Queue {
        self
    }
}

impl Write for &Queue {
    /// Queues `line` (the formatter writes each line whole, at once), or
    /// drops it when the queue is full.
    fn write(&mut self, line: &[u8]) -> io::Result<usize> {
        if self.lines.try_send(Message::Line(line.to_vec())).is_err() {
            self.dropped.fetch_add(1, Relaxed);
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// How long the writer thread lets lines gather after writing while they
/// keep coming. Blocked on the queue instead, it was woken for every few
/// lines, and spun and yielded each time before sleeping again: 2% of the
/// server's CPU on the no-database route (BENCHMARKS.md, "Over HTTP"). A sleeping
/// writer is not woken by the lines queued meanwhile; after a quiet spell
/// it blocks on the queue, so an idle server has no timer running.
const GATHER: Duration = Duration::from_millis(2);

/// The writer thread: takes every line waiting and writes them to `out` in
/// blocks; while lines keep coming, every [`GATHER`], else as soon as one
/// comes; until stopped or every sender is gone.
pub(super) fn write_out(lines: &Receiver<Message>, mut out: impl Write, dropped: &AtomicU64) {
    let mut block = Block::default();
    while let Ok(first) = lines.recv() {
        let mut next = Some(first);
        while let Some(message) = next {
            // It and every message waiting behind it.
            for message in std::iter::once(message).chain(lines.try_iter()) {
                match message {
                    Message::Line(line) => block.add(&line, &mut out, dropped),
                    Message::Stop(done) => {
                        block.write(&mut out, dropped);
                        let _ = done.send(());
                        return;
                    }
                }
            }
            block.write(&mut out, dropped);
            std::thread::sleep(GATHER);
            next = lines.try_recv().ok();
        }
    }
}

/// Lines gathered for one `write`.
#[derive(Debug, Default)]
struct Block {
    bytes: Vec<u8>,
    lines: u64,
}

impl Block {
    /// Adds `line`, writing the block first if `line` would overfill it.
    fn add(&mut self, line: &[u8], out: &mut impl Write, dropped: &AtomicU64) {
        if self.bytes.len() + line.len() > BLOCK_BYTES {
            self.write(out, dropped);
        }
        self.bytes.extend_from_slice(line);
        self.lines += 1;
    }

    /// Writes the block to `out`; lines `out` refuses are counted dropped.
    fn write(&mut self, out: &mut impl Write, dropped: &AtomicU64) {
        if self.lines == 0 {
            return;
        }
        if out
            .write_all(&self.bytes)
            .and_then(|()| out.flush())
            .is_err()
        {
            dropped.fetch_add(self.lines, Relaxed);
        }
        self.bytes.clear();
        self.lines = 0;
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::{Arc, Mutex};

    use super::*;

    /// Lines written, shared with the subscriber that writes them.
    #[derive(Clone, Default)]
    pub(in crate::logs) struct Buffer(pub(in crate::logs) Arc<Mutex<Vec<u8>>>);

    impl Write for Buffer {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl MakeWriter<'_> for Buffer {
        type Writer = Self;

        fn make_writer(&self) -> Self {
            self.clone()
        }
    }

    /// A standard error that refuses every write, as a full disk does.
    struct Refusing;

    impl Write for Refusing {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::other("no space left on device"))
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    /// `lines`, then a stop, through the writer thread's loop into `out`:
    /// whether the stop was answered, and the lines counted dropped.
    fn write_through(lines: &[Vec<u8>], out: impl Write) -> (bool, u64) {
        let (queue, received) = crossbeam_channel::bounded(lines.len() + 1);
        for line in lines {
            queue.send(Message::Line(line.clone())).unwrap();
        }
        let (done, written) = crossbeam_channel::bounded(1);
        queue.send(Message::Stop(done)).unwrap();
        let dropped = AtomicU64::new(0);
        write_out(&received, out, &dropped);
        (written.try_recv().is_ok(), dropped.load(Relaxed))
    }

    #[test]
    fn queued_lines_are_written_in_order_before_the_stop_is_answered() {
        // Three blocks' worth, so blocks are cut and written in turn.
        let lines: Vec<Vec<u8>> = (0..3 * BLOCK_BYTES / 100)
            .map(|n| format!("{n:099}\n").into_bytes())
            .collect();
        let out = Buffer::default();
        assert_eq!(write_through(&lines, out.clone()), (true, 0));
        assert_eq!(*out.0.lock().unwrap(), lines.concat());
    }

    #[test]
    fn a_line_is_written_without_waiting_for_more_lines_or_a_stop() {
        let (queue, received) = crossbeam_channel::bounded(16);
        let out = Buffer::default();
        let writer = {
            let out = out.clone();
            std::thread::spawn(move || write_out(&received, out, &AtomicU64::new(0)))
        };
        let written = |expected: &[u8]| {
            let deadline = std::time::Instant::now() + Duration::from_secs(10);
            while *out.0.lock().unwrap() != expected {
                assert!(std::time::Instant::now() < deadline, "not written");
                std::thread::sleep(Duration::from_millis(1));
            }
        };
        // While the writer waits on the queue, then (most likely) while it
        // sleeps after writing, then after it went back to the queue.
        for pause in [0, 0, 50] {
            std::thread::sleep(Duration::from_millis(pause));
            let before = out.0.lock().unwrap().clone();
            queue.send(Message::Line(b"one\n".to_vec())).unwrap();
            written(&[before.as_slice(), b"one\n"].concat());
        }
        drop(queue);
        writer.join().unwrap();
    }

    #[test]
    fn lines_standard_error_refuses_are_counted_dropped() {
        let lines = vec![b"one\n".to_vec(), b"two\n".to_vec(), b"three\n".to_vec()];
        assert_eq!(write_through(&lines, Refusing), (true, 3));
    }
}
