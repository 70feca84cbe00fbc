//! The limiter's background work: leases and give-backs run as tracked tasks, so a caller that drops
//! its future strands nothing and [`crate::Limiter::shutdown`] can wait for all of them; the sweeper stops on
//! the cancellation token.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Tracked tasks, the sweeper's stop signal, and whether the limiter is shut down.
#[derive(Debug, Default)]
pub(crate) struct Background {
    tracker: TaskTracker,
    cancel: CancellationToken,
    closed: AtomicBool,
}

impl Background {
    /// Runs `task` in the background, tracked. Needs a tokio runtime.
    pub(crate) fn spawn<F>(&self, task: F) -> tokio::task::JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        self.tracker.spawn(task)
    }

    /// Whether the limiter is shut down: no new work starts.
    #[inline]
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// The sweeper's stop signal.
    pub(crate) fn cancelled(&self) -> tokio_util::sync::WaitForCancellationFuture<'_> {
        self.cancel.cancelled()
    }

    /// Shuts down: refuses new work, stops the sweeper, and waits for every tracked task.
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.cancel.cancel();
        self.tracker.close();
        self.tracker.wait().await;
    }
}
