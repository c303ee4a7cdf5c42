//! Runs the shared async code to completion on the caller's thread, for sync connections.
//!
//! A sync connection's [`Store`](crate::store::Store) futures do their work when first polled and
//! are ready at once, and a sync body is a plain closure: a sync job's future completes in its
//! first poll, on the caller's thread, as straight-line code would (thread-locals, panics and
//! blocking calls behave exactly as in sync code). Should a future ever be pending, the thread
//! parks until it is woken, so this is a correct executor in any case, not a busy loop.

use std::future::{Future, poll_fn};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};
use std::thread::Thread;

struct Unpark(Thread);

impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.unpark();
    }
}

thread_local! {
    static WAKER: Waker = Waker::from(Arc::new(Unpark(std::thread::current())));
}

/// Polls `future` to completion on this thread.
pub(crate) fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    WAKER.with(|waker| {
        let mut cx = Context::from_waker(waker);
        loop {
            if let Poll::Ready(output) = future.as_mut().poll(&mut cx) {
                return output;
            }
            std::thread::park();
        }
    })
}

/// Polls `future`, turning a panic in any poll into `Err`, so that the caller can clean up (roll a
/// job's transaction back, back a delivery off) before the panic goes on or is reported.
pub(crate) async fn catch_panic<O>(
    future: impl Future<Output = O>,
) -> Result<O, Box<dyn std::any::Any + Send>> {
    let mut future = pin!(future);
    poll_fn(
        |cx| match catch_unwind(AssertUnwindSafe(|| future.as_mut().poll(cx))) {
            Ok(Poll::Pending) => Poll::Pending,
            Ok(Poll::Ready(output)) => Poll::Ready(Ok(output)),
            Err(panic) => Poll::Ready(Err(panic)),
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::block_on;

    #[test]
    fn ready_futures_complete_in_place() {
        assert_eq!(block_on(async { 40 + 2 }), 42);
    }

    #[test]
    fn pending_futures_are_woken() {
        let (sender, receiver) = std::sync::mpsc::channel::<()>();
        let waited = block_on(std::future::poll_fn(move |cx| {
            if receiver.try_recv().is_ok() {
                return std::task::Poll::Ready("woken");
            }
            let (sender, waker) = (sender.clone(), cx.waker().clone());
            std::thread::spawn(move || {
                let _ = sender.send(());
                waker.wake();
            });
            std::task::Poll::Pending
        }));
        assert_eq!(waited, "woken");
    }
}
