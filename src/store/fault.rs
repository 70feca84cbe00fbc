//! Faults injected between simulated processes and one in-process store, as a production fleet meets them with
//! Redis: the store refusing, hanging, frozen (`SIGSTOP`: calls queued and applied in order at the thaw), losing
//! replies, its clock stepped, its state rolled back to a snapshot (what a failover loses under asynchronous
//! replication); and each process's own link partitioned, refused or slow, the process paused or killed.
//!
//! One [`Faults`] owns the store; each process's limiter is given its own [`FaultyStore`] link
//! ([`Faults::link`]). A call is applied when it reaches the store, whatever its caller does meanwhile: it travels
//! on a task of its own, so a caller that times out (the limiter's store timeout) or is dropped does not
//! unsend it, just as a command written to a Redis socket runs whether or not its reply is awaited. This is how
//! `tokenlease simulate --seed` (FoundationDB's simulator and TigerBeetle's VOPR are the models) searches the
//! engine's fault paths on virtual time.
//!
//! Everything runs on tokio's clock: under paused time a run is deterministic, given the same order of calls.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{oneshot, watch};

use super::call::{Call, Op};
use super::memory::Snapshot;
use super::{BoxFuture, MemoryStore, Store};
use crate::algorithm::Reply;
use crate::clock::Clock;
use crate::decision::Source;
use crate::error::{StoreError, StoreErrorKind};

/// What the store does with the calls that reach it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StoreFault {
    /// Applies each call and answers it.
    #[default]
    Healthy,
    /// Refuses each call at once (`ECONNREFUSED`: the server is down), applying nothing.
    Refusing,
    /// Never answers and applies nothing (a black hole: the host is gone); callers time out.
    Hanging,
    /// Queues each call and answers nothing until thawed, then applies the queued calls in the order they came
    /// and answers them (a `SIGSTOP`ped Redis: the calls of callers that timed out meanwhile still run).
    Frozen,
    /// Applies each call and loses its reply: the caller times out although the store moved.
    LosingReplies,
}

/// What one process's link to the store does with its calls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LinkFault {
    /// Carries calls both ways.
    #[default]
    Up,
    /// Refuses each call at once, applying nothing (the process cannot connect).
    Refused,
    /// Carries nothing either way (a partition): calls are not applied and callers time out.
    Partitioned,
}

/// A simulated process's life, as the fault layer sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Life {
    /// Its calls go out as sent.
    #[default]
    Running,
    /// Stopped (`SIGSTOP`): what it sends leaves only when it resumes, and what comes back waits for it too.
    Paused,
    /// Gone: calls already on their way are applied, none sent after.
    Killed,
}

/// One process's link.
#[derive(Debug, Clone, Copy, Default)]
struct Link {
    fault: LinkFault,
    /// Added to the store's round trip, half each way.
    latency: Duration,
    life: Life,
}

/// The state every link and [`Faults`] share.
#[derive(Debug)]
struct World {
    store: StoreFault,
    /// Each process's link, by its number (made healthy on first use).
    links: BTreeMap<usize, Link>,
    /// The calls that reached a frozen store, in order, each with the way back to its caller.
    frozen: VecDeque<(Call, oneshot::Sender<Result<Reply, StoreError>>)>,
    /// The state kept by [`Faults::snapshot`], with the tokens granted since.
    snapshot: Option<(Snapshot, u64)>,
}

/// The store's clock: the clock the fleet runs on, stepped ahead by [`Faults::step_clock`].
#[derive(Debug)]
struct SteppedClock {
    inner: Arc<dyn Clock>,
    step_ns: AtomicU64,
}

impl Clock for SteppedClock {
    fn now_ns(&self) -> u64 {
        self.inner.now_ns().saturating_add(self.step_ns.load(Ordering::Relaxed))
    }
}

#[derive(Debug)]
struct Shared {
    store: MemoryStore,
    clock: Arc<SteppedClock>,
    /// The store's round trip, half each way.
    rtt: Duration,
    /// How long a call waits for its answer unless it carries its own timeout, as a Redis store's is configured.
    timeout: Duration,
    world: Mutex<World>,
    /// Moves on every change of a fault, to wake the calls waiting for a paused process to resume.
    changed: watch::Sender<u64>,
}

/// A fleet's faults over one in-process store: create it, give each process's limiter a [`Faults::link`], then
/// turn faults on and off while the fleet runs (`tokenlease simulate --seed` draws them from a seed).
///
/// ```
/// use std::sync::Arc;
/// use std::time::Duration;
/// use tokenlease::{Faults, StoreFault, TokioClock};
///
/// # tokio_test_block_on(async {
/// let faults = Faults::new(Arc::new(TokioClock::new()), Duration::from_millis(1), Duration::from_millis(50));
/// let link = faults.link(0);
/// faults.set_store(StoreFault::Frozen); // SIGSTOP: calls queue
/// faults.set_store(StoreFault::Healthy); // the thaw applies them in order
/// # let _ = link;
/// # });
/// # fn tokio_test_block_on<F: std::future::Future>(f: F) -> F::Output {
/// #     tokio::runtime::Builder::new_current_thread().enable_time().start_paused(true).build().unwrap().block_on(f)
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Faults {
    shared: Arc<Shared>,
}

/// One process's link to the store of a [`Faults`]: give it to that process's limiter
/// ([`crate::LimiterBuilder::store`]). Each call travels on a task of its own (it needs a tokio runtime with its
/// timer enabled), waits half the round trip, meets the store's and the link's faults when it arrives, then
/// waits the other half.
#[derive(Debug)]
pub struct FaultyStore {
    shared: Arc<Shared>,
    process: usize,
}

/// What a call met on its way.
enum Way {
    /// Answered with this, after the way back.
    Answer(Result<Reply, StoreError>),
    /// Queued in the frozen store: the answer comes at the thaw.
    Queued(oneshot::Receiver<Result<Reply, StoreError>>),
    /// No answer ever comes: the caller times out.
    Lost,
}

impl Faults {
    /// A healthy store on `clock` (the fleet's clock, tokio's in a simulation) answering after `rtt`, with no
    /// fault anywhere, whose calls give up after `timeout` unless they carry their own (as a [`crate::RedisStore`]
    /// is connected with the limiter's timeout: give both the same).
    pub fn new(clock: Arc<dyn Clock>, rtt: Duration, timeout: Duration) -> Self {
        let clock = Arc::new(SteppedClock {
            inner: clock,
            step_ns: AtomicU64::new(0),
        });
        let store = MemoryStore::with_clock(clock.clone());
        let world = World {
            store: StoreFault::Healthy,
            links: BTreeMap::new(),
            frozen: VecDeque::new(),
            snapshot: None,
        };
        let shared = Shared {
            store,
            clock,
            rtt,
            timeout,
            world: Mutex::new(world),
            changed: watch::Sender::new(0),
        };
        Self {
            shared: Arc::new(shared),
        }
    }

    /// The link of process `process` (any number; one link a process).
    pub fn link(&self, process: usize) -> Arc<FaultyStore> {
        self.shared.world().link(process);
        Arc::new(FaultyStore {
            shared: self.shared.clone(),
            process,
        })
    }

    /// Sets what the store does from now on. Leaving [`StoreFault::Frozen`] applies the queued calls in order
    /// (each answered unless the new fault loses replies or hangs: a thawed server answers what it ran).
    pub fn set_store(&self, fault: StoreFault) {
        let mut world = self.shared.world();
        world.store = fault;
        if fault != StoreFault::Frozen {
            while let Some((call, reply)) = world.frozen.pop_front() {
                let result = self.shared.apply(&mut world, &call);
                if !matches!(fault, StoreFault::Hanging | StoreFault::LosingReplies) {
                    let _ = reply.send(result);
                }
            }
        }
        drop(world);
        self.shared.changed.send_modify(|n| *n += 1);
    }

    /// Sets what process `process`'s link does from now on.
    pub fn set_link(&self, process: usize, fault: LinkFault) {
        self.shared.world().link(process).fault = fault;
    }

    /// Adds `extra` to process `process`'s round trip from now on (half each way).
    pub fn set_latency(&self, process: usize, extra: Duration) {
        self.shared.world().link(process).latency = extra;
    }

    /// Stops process `process` (`SIGSTOP`) or lets it go on: while stopped, its calls leave and its replies
    /// arrive only when it goes on. (Its timers still run on the shared clock: a stopped caller's timeout fires
    /// when it resumes or before; the simulation also stops its callers.)
    pub fn set_paused(&self, process: usize, paused: bool) {
        {
            let mut world = self.shared.world();
            let link = world.link(process);
            if link.life != Life::Killed {
                link.life = if paused { Life::Paused } else { Life::Running };
            }
        }
        self.shared.changed.send_modify(|n| *n += 1);
    }

    /// Kills process `process` (`kill -9`): the calls it sent are still applied, none sent from now on.
    pub fn kill(&self, process: usize) {
        self.shared.world().link(process).life = Life::Killed;
        self.shared.changed.send_modify(|n| *n += 1);
    }

    /// Steps the store's clock ahead by `step` (a failover to a server whose clock is ahead). The store's clock
    /// never goes back, as Redis's `TIME` read by a script does not between two calls of one server.
    pub fn step_clock(&self, step: Duration) {
        let ns = u64::try_from(step.as_nanos()).unwrap_or(u64::MAX);
        self.shared.clock.step_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Keeps the store's state now, to go back to with [`Faults::rollback`] (a replica's copy).
    pub fn snapshot(&self) {
        let snapshot = self.shared.store.snapshot();
        self.shared.world().snapshot = Some((snapshot, 0));
    }

    /// Puts back the state kept by the last [`Faults::snapshot`] (a failover to a replica that missed what the
    /// master applied since), and returns the tokens the store granted in the span lost: what a limiter on that
    /// store cannot help selling twice. 0, changing nothing, when no snapshot was kept.
    pub fn rollback(&self) -> u64 {
        let mut world = self.shared.world();
        match world.snapshot.take() {
            Some((snapshot, granted)) => {
                self.shared.store.restore(snapshot);
                granted
            }
            None => 0,
        }
    }

    /// The store itself (what the fleet shares), to read its keys.
    pub fn store(&self) -> &MemoryStore {
        &self.shared.store
    }
}

impl Shared {
    fn world(&self) -> MutexGuard<'_, World> {
        // A panic while the lock was held leaves a world that is still whole: each change is one assignment.
        self.world.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Applies `call` to the store, counting what it granted toward the snapshot's lost span.
    fn apply(&self, world: &mut World, call: &Call) -> Result<Reply, StoreError> {
        let result = self.store.run_sync(call);
        if let (Ok(reply), Some((_, granted))) = (&result, world.snapshot.as_mut()) {
            if takes(&call.op) {
                *granted += reply.granted;
            }
        }
        result
    }

    /// Waits while process `process` is paused; whether it is still alive.
    async fn wait_running(&self, process: usize) -> bool {
        let mut changed = self.changed.subscribe();
        loop {
            match self.world().link(process).life {
                Life::Running => return true,
                Life::Killed => return false,
                Life::Paused => {}
            }
            if changed.changed().await.is_err() {
                return false;
            }
        }
    }

    /// The call arriving at the store now from `process`.
    fn arrive(&self, process: usize, call: Call) -> Way {
        let mut world = self.world();
        match world.link(process).fault {
            LinkFault::Up => {}
            LinkFault::Refused => return Way::Answer(Err(refused(call.script().name()))),
            LinkFault::Partitioned => return Way::Lost,
        }
        match world.store {
            StoreFault::Healthy => Way::Answer(self.apply(&mut world, &call)),
            StoreFault::Refusing => Way::Answer(Err(refused(call.script().name()))),
            StoreFault::Hanging => Way::Lost,
            StoreFault::Frozen => {
                let (tx, rx) = oneshot::channel();
                world.frozen.push_back((call, tx));
                Way::Queued(rx)
            }
            StoreFault::LosingReplies => {
                let _ = self.apply(&mut world, &call);
                Way::Lost
            }
        }
    }

    /// Half the round trip of `process`'s link, in whole ms (tokio's timer rounds up to them).
    fn half_trip(&self, process: usize) -> Duration {
        let latency = self.world().link(process).latency;
        let half = (self.rtt + latency) / 2;
        Duration::from_millis(u64::try_from(half.as_millis()).unwrap_or(u64::MAX))
    }

    /// A call's whole way: out, at the store, back. `None`: no answer ever comes.
    async fn travel(self: Arc<Self>, process: usize, call: Call) -> Option<Result<Reply, StoreError>> {
        if !self.wait_running(process).await {
            return None;
        }
        sleep(self.half_trip(process)).await;
        let result = match self.arrive(process, call) {
            Way::Answer(result) => result,
            Way::Queued(rx) => rx.await.ok()?,
            Way::Lost => return None,
        };
        sleep(self.half_trip(process)).await;
        // The link may have broken on the way back, or the process stopped.
        if self.world().link(process).fault == LinkFault::Partitioned || !self.wait_running(process).await {
            return None;
        }
        Some(result)
    }
}

impl World {
    /// Process `process`'s link, made healthy on first use.
    fn link(&mut self, process: usize) -> &mut Link {
        self.links.entry(process).or_default()
    }
}

/// Whether a call takes from the limit (what a rollback may let the fleet take again): a give-back, a beat or a
/// reset does not.
fn takes(op: &Op) -> bool {
    !matches!(
        op,
        Op::TokenReturn { .. } | Op::LeakyReturn { .. } | Op::Fleet(_) | Op::Reset
    )
}

/// The error of a call (or `ping`) to a store that refuses connections.
fn refused(script: &'static str) -> StoreError {
    StoreError {
        kind: StoreErrorKind::Io,
        script,
        message: "connection refused (simulated fault)".into(),
        source: None,
    }
}

/// `answer`, or the store's timeout error for `script` once `timeout` has passed, as a Redis store's calls end.
async fn within<T>(
    timeout: Duration,
    script: &'static str,
    answer: impl std::future::Future<Output = Result<T, StoreError>>,
) -> Result<T, StoreError> {
    tokio::time::timeout(timeout, answer)
        .await
        .unwrap_or_else(|_| Err(StoreError::timeout(script, timeout)))
}

async fn sleep(d: Duration) {
    if !d.is_zero() {
        tokio::time::sleep(d).await;
    }
}

impl Store for FaultyStore {
    fn run<'a>(&'a self, call: &'a Call) -> BoxFuture<'a, Result<Reply, StoreError>> {
        let shared = self.shared.clone();
        let (process, timeout) = (self.process, call.timeout.unwrap_or(self.shared.timeout));
        let script = call.script().name();
        // Sent now, on a task of its own: applied whatever the caller does meanwhile.
        let sent = tokio::spawn(shared.travel(process, call.clone()));
        let answer = async {
            match sent.await {
                Ok(Some(result)) => result,
                // No answer ever: the timeout ends the wait, as it does a caller of a silent Redis.
                _ => std::future::pending().await,
            }
        };
        Box::pin(within(timeout, script, answer))
    }

    fn source(&self) -> Source {
        Source::Memory
    }

    fn ping(&self) -> BoxFuture<'_, Result<(), StoreError>> {
        let shared = self.shared.clone();
        let (process, timeout) = (self.process, self.shared.timeout);
        let ping = async move {
            if !shared.wait_running(process).await {
                return std::future::pending().await;
            }
            sleep(shared.half_trip(process)).await;
            let fault = {
                let mut world = shared.world();
                (world.link(process).fault, world.store)
            };
            match fault {
                (LinkFault::Up, StoreFault::Healthy) => {
                    sleep(shared.half_trip(process)).await;
                    Ok(())
                }
                (LinkFault::Refused, _) | (LinkFault::Up, StoreFault::Refusing) => Err(refused("ping")),
                _ => std::future::pending().await,
            }
        };
        Box::pin(within(timeout, "ping", ping))
    }
}
