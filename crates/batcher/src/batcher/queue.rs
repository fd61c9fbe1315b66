//! The bounded queue from the handles to the worker: callers push under one
//! short lock, the worker takes everything queued in one swap.
//!
//! Hand-written instead of Tokio's bounded `mpsc`, which it replaced: a
//! send there makes four atomic changes on four cache lines that every
//! sender writes (the semaphore's permits, the tail index, the block's
//! ready bits, the receiver's waker), and in the in-memory profile of 300
//! callers the channel was the batcher's largest cost (13.8% of all
//! samples, BENCHMARKS.md, "The batcher alone, in memory"). Here a push is one short lock (one line
//! that both cores write, where Tokio's send wrote four), and wakes the
//! worker only if it has registered to be woken since it last took. The
//! worker takes a whole burst by swapping buffers, so neither side
//! allocates in steady state, and it spends Tokio's cooperative budget per
//! take as the channel did, so a steady stream of requests cannot keep it
//! from yielding.
//!
//! The semantics are the channel's: bounded (a full queue refuses, or with
//! [`Overflow::Wait`](super::Overflow::Wait) the sender waits its turn for
//! a place), closed by the worker at shutdown while what is queued can
//! still be taken, finished once every handle is gone and the queue is
//! empty, and emptied when the worker goes away, so every queued caller
//! learns it through its dropped reply sender.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::mem;
use std::sync::atomic::{AtomicBool, Ordering::SeqCst};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{ready, Context, Poll, Waker};

use tokio::sync::Semaphore;
use tokio::task::coop;

/// A queue of at most `capacity` items, as its two ends: the handles'
/// (one, shared by every clone of a handle) and the worker's. `waiting`
/// senders wait for a place with [`Sender::push`] instead of being refused.
pub(crate) fn queue<T>(capacity: usize, waiting: bool) -> (Sender<T>, Receiver<T>) {
    let queue = Arc::new(Queue::new(capacity, waiting));
    (
        Sender {
            queue: Arc::clone(&queue),
        },
        Receiver { queue },
    )
}

/// The handles' end; dropping it tells the worker no more items will come.
#[derive(Debug)]
pub(crate) struct Sender<T> {
    queue: Arc<Queue<T>>,
}

impl<T> Sender<T> {
    /// Queues `item` if there is room, waking the worker if it sleeps.
    pub(crate) fn try_push(&self, item: T) -> Result<(), PushError<T>> {
        // A waiting queue counts its places in permits, which a push
        // without one would leave unbalanced.
        debug_assert!(self.queue.space.is_none(), "a waiting queue takes `push`");
        let state = self.queue.lock();
        if state.items.len() >= self.queue.capacity && !self.is_closed() {
            return Err(PushError::Full(item));
        }
        self.queue.append(state, item)
    }

    /// Queues `item`, first waiting for a place if the queue is full (for
    /// a queue made `waiting`; otherwise as [`try_push`](Self::try_push)).
    /// Cancel safe: dropped while waiting, it has queued nothing.
    pub(crate) async fn push(&self, item: T) -> Result<(), PushError<T>> {
        let Some(space) = &self.queue.space else {
            return self.try_push(item);
        };
        match space.acquire().await {
            // The place is given back when the worker takes the item.
            Ok(permit) => permit.forget(),
            Err(_) => return Err(PushError::Closed(item)), // closed meanwhile
        }
        self.queue.append(self.queue.lock(), item)
    }

    /// Whether pushes are refused: the worker closed the queue or is gone.
    pub(crate) fn is_closed(&self) -> bool {
        self.queue.is_closed()
    }

    /// How many items wait to be taken.
    pub(crate) fn len(&self) -> usize {
        self.queue.lock().items.len()
    }
}

impl<T> Drop for Sender<T> {
    /// The last handle is gone: the worker finishes once the queue is
    /// empty.
    fn drop(&mut self) {
        let worker = {
            let mut state = self.queue.lock();
            state.senders_gone = true;
            state.worker.take()
        };
        if let Some(worker) = worker {
            worker.wake();
        }
    }
}

/// The worker's end; dropping it closes the queue and drops what it holds.
#[derive(Debug)]
pub(crate) struct Receiver<T> {
    queue: Arc<Queue<T>>,
}

impl<T> Receiver<T> {
    /// Waits until there are items and moves up to `limit` of them, oldest
    /// first, into `into`, returning how many; 0 once the queue is closed
    /// or every handle is gone, and it is empty. Cancel safe: items are
    /// only taken by the call that returns them.
    pub(crate) async fn take(&self, into: &mut VecDeque<T>, limit: usize) -> usize {
        poll_fn(|cx| self.queue.poll_take(cx, into, limit)).await
    }

    /// Refuses further pushes; what is queued can still be taken.
    pub(crate) fn close(&self) {
        {
            let _state = self.queue.lock();
            self.queue.closed.store(true, SeqCst);
        }
        if let Some(space) = &self.queue.space {
            space.close();
        }
    }

    /// How many items wait to be taken.
    pub(crate) fn len(&self) -> usize {
        self.queue.lock().items.len()
    }
}

impl<T> Drop for Receiver<T> {
    /// The worker is gone: closes the queue and drops what it holds, so
    /// every queued caller sees its reply sender dropped.
    fn drop(&mut self) {
        self.close();
        let items = mem::take(&mut self.queue.lock().items);
        drop(items); // outside the lock: dropping a sender wakes its caller
    }
}

/// Why a push failed; the item comes back.
#[derive(Debug)]
pub(crate) enum PushError<T> {
    /// The queue holds as many items as it may.
    Full(T),
    /// The worker closed the queue or is gone.
    Closed(T),
}

/// A bounded multi-producer, single-consumer queue.
#[derive(Debug)]
struct Queue<T> {
    state: Mutex<State<T>>,
    /// No more pushes: the worker closed the queue, or went away. Set
    /// under the lock, and read without it by a caller deciding whether to
    /// load directly.
    closed: AtomicBool,
    capacity: usize,
    /// With [`Overflow::Wait`](super::Overflow::Wait): one permit per free
    /// place, so waiting senders are served in order, and one that is
    /// cancelled while waiting holds nothing.
    space: Option<Semaphore>,
}

#[derive(Debug)]
struct State<T> {
    items: VecDeque<T>,
    /// The worker's waker while it waits for an item.
    worker: Option<Waker>,
    /// Every handle is gone: once the queue is empty, nothing more comes.
    senders_gone: bool,
}

impl<T> Queue<T> {
    fn new(capacity: usize, waiting: bool) -> Self {
        Self {
            state: Mutex::new(State {
                items: VecDeque::new(),
                worker: None,
                senders_gone: false,
            }),
            closed: AtomicBool::new(false),
            capacity,
            space: waiting.then(|| Semaphore::new(capacity)),
        }
    }

    // Nothing panics while the lock is held, and every state it can hold
    // is consistent, so a poisoned lock is used as it is.
    fn lock(&self) -> MutexGuard<'_, State<T>> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `item` unless the queue is closed, and wakes the worker if it
    /// sleeps, after the lock is released.
    fn append(&self, mut state: MutexGuard<'_, State<T>>, item: T) -> Result<(), PushError<T>> {
        if self.is_closed() {
            return Err(PushError::Closed(item));
        }
        state.items.push_back(item);
        let worker = state.worker.take();
        drop(state);
        if let Some(worker) = worker {
            worker.wake();
        }
        Ok(())
    }

    fn poll_take(&self, cx: &mut Context<'_>, into: &mut VecDeque<T>, limit: usize) -> Poll<usize> {
        debug_assert!(limit > 0, "the worker only receives with room");
        // Out of budget: yield to the runtime, which polls again soon.
        let coop = ready!(coop::poll_proceed(cx));
        let mut state = self.lock();
        if state.items.is_empty() {
            if self.is_closed() || state.senders_gone {
                return Poll::Ready(0);
            }
            match &mut state.worker {
                Some(waker) if waker.will_wake(cx.waker()) => {}
                slot => *slot = Some(cx.waker().clone()),
            }
            return Poll::Pending;
        }
        let taken = if state.items.len() <= limit && into.is_empty() {
            // The whole burst at once; the queue keeps `into`'s allocation.
            mem::swap(&mut state.items, into);
            into.len()
        } else {
            // From the front of a ring: the rest does not move.
            let n = limit.min(state.items.len());
            into.extend(state.items.drain(..n));
            n
        };
        drop(state);
        coop.made_progress();
        if let Some(space) = &self.space {
            space.add_permits(taken);
        }
        Poll::Ready(taken)
    }

    fn is_closed(&self) -> bool {
        self.closed.load(SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn within<F: std::future::Future>(what: &str, f: F) -> F::Output {
        tokio::time::timeout(Duration::from_secs(5), f)
            .await
            .unwrap_or_else(|_| panic!("never: {what}"))
    }

    #[tokio::test]
    async fn items_come_out_in_order_within_the_limit() {
        let (tx, rx) = queue(8, false);
        for i in 0..5 {
            tx.try_push(i).unwrap();
        }
        let mut out = VecDeque::new();
        assert_eq!(rx.take(&mut out, 3).await, 3);
        assert_eq!(out, [0, 1, 2]);
        out.clear();
        assert_eq!(rx.take(&mut out, 3).await, 2);
        assert_eq!(out, [3, 4]);
        assert_eq!(tx.len(), 0);
    }

    #[test]
    fn a_full_queue_refuses_and_a_closed_one_too() {
        let (tx, rx) = queue(2, false);
        tx.try_push(1).unwrap();
        tx.try_push(2).unwrap();
        assert!(matches!(tx.try_push(3), Err(PushError::Full(3))));
        rx.close();
        assert!(tx.is_closed());
        assert!(matches!(tx.try_push(4), Err(PushError::Closed(4))));
        assert_eq!(tx.len(), 2, "what was queued stays");
    }

    #[tokio::test]
    async fn a_closed_queue_is_drained_before_it_reports_the_end() {
        let (tx, rx) = queue(4, false);
        tx.try_push(1).unwrap();
        rx.close();
        assert_eq!(rx.take(&mut VecDeque::new(), 4).await, 1);
        assert_eq!(rx.take(&mut VecDeque::new(), 4).await, 0);

        let (tx, rx) = queue(4, false);
        tx.try_push(1).unwrap();
        drop(tx);
        assert_eq!(rx.take(&mut VecDeque::new(), 4).await, 1);
        assert_eq!(rx.take(&mut VecDeque::new(), 4).await, 0);
    }

    #[tokio::test]
    async fn a_sleeping_worker_is_woken_by_a_push_and_by_the_last_handle() {
        let (tx, rx) = queue(4, false);
        let worker = tokio::spawn(async move {
            let mut out = VecDeque::new();
            let first = rx.take(&mut out, 4).await;
            let end = rx.take(&mut VecDeque::new(), 4).await;
            (first, out, end)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        tx.try_push(7).unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(tx);
        let (first, out, end) = within("the worker is woken", worker).await.unwrap();
        assert_eq!((first, end), (1, 0));
        assert_eq!(out, [7]);
    }

    #[tokio::test]
    async fn a_waiting_sender_gets_the_place_the_worker_frees() {
        let (tx, rx) = queue(1, true);
        let tx = Arc::new(tx);
        tx.push(1).await.unwrap();
        let sender = tokio::spawn({
            let tx = Arc::clone(&tx);
            async move { tx.push(2).await.is_ok() }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!sender.is_finished(), "full: the sender waits");
        assert_eq!(rx.take(&mut VecDeque::new(), 1).await, 1);
        assert!(within("the freed place goes to the waiting sender", sender)
            .await
            .unwrap());
        assert_eq!(tx.len(), 1);

        // Closing releases a waiting sender with its item.
        let waiting = tokio::spawn({
            let tx = Arc::clone(&tx);
            async move { tx.push(3).await }
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        rx.close();
        let refused = within("closing wakes waiting senders", waiting)
            .await
            .unwrap();
        assert!(matches!(refused, Err(PushError::Closed(3))));
    }

    #[test]
    fn a_dropped_worker_end_drops_what_the_queue_held() {
        let (tx, rx) = queue(4, false);
        let item = Arc::new(());
        tx.try_push(Arc::clone(&item)).unwrap();
        drop(rx);
        assert_eq!(Arc::strong_count(&item), 1, "the queued item was dropped");
        assert!(tx.is_closed());
        assert!(matches!(
            tx.try_push(Arc::clone(&item)),
            Err(PushError::Closed(_))
        ));
    }
}
