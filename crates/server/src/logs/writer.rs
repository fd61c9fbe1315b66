//! The writer thread and the queue to it.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

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

/// The writer thread: takes every line waiting, writes them to `out` in
/// blocks, and writes again as soon as the queue is empty, until stopped
/// or every sender is gone.
pub(super) fn write_out(lines: &Receiver<Message>, mut out: impl Write, dropped: &AtomicU64) {
    let mut block = Block::default();
    loop {
        let Ok(mut message) = lines.recv() else {
            return;
        };
        loop {
            match message {
                Message::Line(line) => {
                    if block.bytes.len() + line.len() > BLOCK_BYTES {
                        block.write(&mut out, dropped);
                    }
                    block.bytes.extend_from_slice(&line);
                    block.lines += 1;
                }
                Message::Stop(done) => {
                    block.write(&mut out, dropped);
                    let _ = done.send(());
                    return;
                }
            }
            match lines.try_recv() {
                Ok(next) => message = next,
                Err(_) => break,
            }
        }
        block.write(&mut out, dropped);
    }
}

/// Lines gathered for one `write`.
#[derive(Debug, Default)]
struct Block {
    bytes: Vec<u8>,
    lines: u64,
}

impl Block {
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
    fn lines_standard_error_refuses_are_counted_dropped() {
        let lines = vec![b"one\n".to_vec(), b"two\n".to_vec(), b"three\n".to_vec()];
        assert_eq!(write_through(&lines, Refusing), (true, 3));
    }
}
