//! The synchronisation primitives behind the pool's shared state (breaker, permit
//! limiter, auth state, rate bucket), in one place so a model checker can stand in
//! for them.
//!
//! Normally these are `std::sync`'s own, re-exported: no wrapper, no cost.
//!
//! Under the internal-testing feature `shuttle` (not for users; see the crate's
//! `Cargo.toml`) each primitive decides when it is created: inside a
//! [shuttle](https://docs.rs/shuttle) execution it is shuttle's, so every lock and
//! atomic access is a scheduling point the model checker controls
//! (`crates/pool/tests/model_check.rs`); anywhere else it is `std`'s, so the rest of
//! the test suite still passes with `--all-features`. The choice is made once per
//! primitive, and every operation then goes to the same implementation.

#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize};
#[cfg(not(feature = "shuttle"))]
pub(crate) use std::sync::{Mutex, MutexGuard};

#[cfg(feature = "shuttle")]
pub(crate) use model::{AtomicBool, AtomicU64, AtomicUsize, Mutex, MutexGuard};

use std::any::Any;
use std::collections::BTreeMap;
use std::panic::AssertUnwindSafe;
pub(crate) use std::sync::PoisonError;
pub(crate) use std::sync::atomic::Ordering;
use std::task::Waker;

#[cfg(feature = "shuttle")]
mod model {
    use std::fmt;
    use std::ops::{Deref, DerefMut};
    use std::sync::atomic::Ordering;
    use std::sync::{LockResult, PoisonError};

    /// Whether the caller runs inside a shuttle execution (a task of
    /// `shuttle::check_*`), where shuttle's primitives must be used.
    fn in_model() -> bool {
        shuttle::current::try_get_current_task().is_some()
    }

    /// `std::sync::Mutex`, or shuttle's inside a shuttle execution.
    pub(crate) enum Mutex<T> {
        Std(std::sync::Mutex<T>),
        Model(shuttle::sync::Mutex<T>),
    }

    /// The guard of [`Mutex`].
    pub(crate) enum MutexGuard<'a, T> {
        Std(std::sync::MutexGuard<'a, T>),
        Model(shuttle::sync::MutexGuard<'a, T>),
    }

    impl<T> Mutex<T> {
        pub(crate) fn new(value: T) -> Self {
            if in_model() {
                Mutex::Model(shuttle::sync::Mutex::new(value))
            } else {
                Mutex::Std(std::sync::Mutex::new(value))
            }
        }

        pub(crate) fn lock(&self) -> LockResult<MutexGuard<'_, T>> {
            match self {
                Mutex::Std(m) => m
                    .lock()
                    .map(MutexGuard::Std)
                    .map_err(|e| PoisonError::new(MutexGuard::Std(e.into_inner()))),
                Mutex::Model(m) => m
                    .lock()
                    .map(MutexGuard::Model)
                    .map_err(|e| PoisonError::new(MutexGuard::Model(e.into_inner()))),
            }
        }
    }

    impl<T: fmt::Debug> fmt::Debug for Mutex<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self {
                Mutex::Std(m) => m.fmt(f),
                Mutex::Model(m) => m.fmt(f),
            }
        }
    }

    impl<T> Deref for MutexGuard<'_, T> {
        type Target = T;

        fn deref(&self) -> &T {
            match self {
                MutexGuard::Std(g) => g,
                MutexGuard::Model(g) => g,
            }
        }
    }

    impl<T> DerefMut for MutexGuard<'_, T> {
        fn deref_mut(&mut self) -> &mut T {
            match self {
                MutexGuard::Std(g) => g,
                MutexGuard::Model(g) => g,
            }
        }
    }

    /// `std::sync::atomic::AtomicUsize`, or shuttle's inside a shuttle execution.
    pub(crate) enum AtomicUsize {
        Std(std::sync::atomic::AtomicUsize),
        Model(shuttle::sync::atomic::AtomicUsize),
    }

    impl AtomicUsize {
        pub(crate) fn new(value: usize) -> Self {
            if in_model() {
                AtomicUsize::Model(shuttle::sync::atomic::AtomicUsize::new(value))
            } else {
                AtomicUsize::Std(std::sync::atomic::AtomicUsize::new(value))
            }
        }

        pub(crate) fn load(&self, order: Ordering) -> usize {
            match self {
                AtomicUsize::Std(a) => a.load(order),
                AtomicUsize::Model(a) => a.load(order),
            }
        }

        pub(crate) fn fetch_add(&self, value: usize, order: Ordering) -> usize {
            match self {
                AtomicUsize::Std(a) => a.fetch_add(value, order),
                AtomicUsize::Model(a) => a.fetch_add(value, order),
            }
        }

        pub(crate) fn fetch_sub(&self, value: usize, order: Ordering) -> usize {
            match self {
                AtomicUsize::Std(a) => a.fetch_sub(value, order),
                AtomicUsize::Model(a) => a.fetch_sub(value, order),
            }
        }

        pub(crate) fn swap(&self, value: usize, order: Ordering) -> usize {
            match self {
                AtomicUsize::Std(a) => a.swap(value, order),
                AtomicUsize::Model(a) => a.swap(value, order),
            }
        }

        pub(crate) fn fetch_max(&self, value: usize, order: Ordering) -> usize {
            match self {
                AtomicUsize::Std(a) => a.fetch_max(value, order),
                AtomicUsize::Model(a) => a.fetch_max(value, order),
            }
        }

        pub(crate) fn fetch_and(&self, value: usize, order: Ordering) -> usize {
            match self {
                AtomicUsize::Std(a) => a.fetch_and(value, order),
                AtomicUsize::Model(a) => a.fetch_and(value, order),
            }
        }

        pub(crate) fn compare_exchange_weak(
            &self,
            current: usize,
            new: usize,
            success: Ordering,
            failure: Ordering,
        ) -> Result<usize, usize> {
            match self {
                AtomicUsize::Std(a) => a.compare_exchange_weak(current, new, success, failure),
                AtomicUsize::Model(a) => a.compare_exchange_weak(current, new, success, failure),
            }
        }
    }

    impl fmt::Debug for AtomicUsize {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Debug::fmt(&self.load(Ordering::Relaxed), f)
        }
    }

    /// `std::sync::atomic::AtomicU64`, or shuttle's inside a shuttle execution.
    pub(crate) enum AtomicU64 {
        Std(std::sync::atomic::AtomicU64),
        Model(shuttle::sync::atomic::AtomicU64),
    }

    impl AtomicU64 {
        pub(crate) fn new(value: u64) -> Self {
            if in_model() {
                AtomicU64::Model(shuttle::sync::atomic::AtomicU64::new(value))
            } else {
                AtomicU64::Std(std::sync::atomic::AtomicU64::new(value))
            }
        }

        pub(crate) fn load(&self, order: Ordering) -> u64 {
            match self {
                AtomicU64::Std(a) => a.load(order),
                AtomicU64::Model(a) => a.load(order),
            }
        }

        pub(crate) fn store(&self, value: u64, order: Ordering) {
            match self {
                AtomicU64::Std(a) => a.store(value, order),
                AtomicU64::Model(a) => a.store(value, order),
            }
        }

        pub(crate) fn compare_exchange_weak(
            &self,
            current: u64,
            new: u64,
            success: Ordering,
            failure: Ordering,
        ) -> Result<u64, u64> {
            match self {
                AtomicU64::Std(a) => a.compare_exchange_weak(current, new, success, failure),
                AtomicU64::Model(a) => a.compare_exchange_weak(current, new, success, failure),
            }
        }
    }

    impl fmt::Debug for AtomicU64 {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Debug::fmt(&self.load(Ordering::Relaxed), f)
        }
    }

    /// `std::sync::atomic::AtomicBool`, or shuttle's inside a shuttle execution.
    pub(crate) enum AtomicBool {
        Std(std::sync::atomic::AtomicBool),
        Model(shuttle::sync::atomic::AtomicBool),
    }

    impl AtomicBool {
        pub(crate) fn new(value: bool) -> Self {
            if in_model() {
                AtomicBool::Model(shuttle::sync::atomic::AtomicBool::new(value))
            } else {
                AtomicBool::Std(std::sync::atomic::AtomicBool::new(value))
            }
        }

        pub(crate) fn load(&self, order: Ordering) -> bool {
            match self {
                AtomicBool::Std(a) => a.load(order),
                AtomicBool::Model(a) => a.load(order),
            }
        }

        pub(crate) fn store(&self, value: bool, order: Ordering) {
            match self {
                AtomicBool::Std(a) => a.store(value, order),
                AtomicBool::Model(a) => a.store(value, order),
            }
        }
    }

    impl fmt::Debug for AtomicBool {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            fmt::Debug::fmt(&self.load(Ordering::Relaxed), f)
        }
    }
}

/// The wakers of futures that wait for a shared state to change, kept inside that
/// state's lock, each under a key of its own so that a future dropped while it waits
/// takes its waker back out (nothing is left behind by callers that give up).
///
/// Every waker taken out (replaced, removed, or all of them to be woken) is handed
/// back to be dropped or woken after the lock is released: its drop may be the last
/// of a task whose own future then takes the same lock.
///
/// Kept in a map ordered by key, and keys are handed out in order: they are woken in
/// the order they first waited (and the same way in every run, so a seeded
/// simulation replays), and thousands of callers giving up or woken one by one (a
/// cooldown's waiters, when it ends) cost each a lookup, not a scan, and leave no
/// room behind.
#[derive(Debug, Default)]
pub(crate) struct Wakers {
    by_key: BTreeMap<u64, Waker>,
    next_key: u64,
}

/// The wakers taken out of a [`Wakers`] by [`Wakers::take`], to wake after the lock.
#[must_use = "wake them, after the lock is released"]
pub(crate) struct ToWake(BTreeMap<u64, Waker>);

impl ToWake {
    /// Wakes every one of them when the result is dropped, by a panic's unwinding
    /// too: for wakers taken before a callback that may panic (an observer's). A
    /// waker whose `wake` panics (an executor's bug) does not leave the others
    /// asleep for good: each is woken, and the first such panic goes on afterwards
    /// (unless another one unwinds already).
    pub(crate) fn on_drop(self) -> WakeOnDrop {
        WakeOnDrop(self.0)
    }
}

/// [`ToWake::on_drop`]'s guard.
pub(crate) struct WakeOnDrop(BTreeMap<u64, Waker>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        let panic = wake_all(std::mem::take(&mut self.0));
        // Out of a destructor while a panic unwinds, a second one would abort.
        if let Some(panic) = panic.filter(|_| !std::thread::panicking()) {
            std::panic::resume_unwind(panic);
        }
    }
}

/// Wakes `waker` from a destructor: while a panic unwinds, a panic of its `wake` is
/// swallowed, as a second panic out of a destructor would abort the process; the
/// waker's task is then left asleep, as it would be by any waker that cannot wake.
pub(crate) fn wake_from_drop(waker: Waker) {
    if std::thread::panicking() {
        let _ = std::panic::catch_unwind(AssertUnwindSafe(|| waker.wake()));
    } else {
        waker.wake();
    }
}

/// Wakes each of `wakers`, in key order, all of them even if one's `wake` panics;
/// returns the first such panic.
fn wake_all(wakers: BTreeMap<u64, Waker>) -> Option<Box<dyn Any + Send>> {
    let mut first = None;
    for waker in wakers.into_values() {
        if let Err(panic) = std::panic::catch_unwind(AssertUnwindSafe(|| waker.wake())) {
            first.get_or_insert(panic);
        }
    }
    first
}

impl Wakers {
    /// Keeps `waker` under `*key`, or under a new key (written to `*key`) if there is
    /// none or its waker was taken out meanwhile. Returns the waker it replaced, if
    /// `waker` would not wake the same task, to drop after the lock.
    #[must_use = "drop it after the lock is released"]
    pub(crate) fn register(&mut self, key: &mut Option<u64>, waker: &Waker) -> Option<Waker> {
        let held = key.and_then(|key| self.by_key.get_mut(&key));
        match held {
            Some(held) => (!held.will_wake(waker)).then(|| std::mem::replace(held, waker.clone())),
            None => {
                let new = self.next_key;
                self.next_key = new.wrapping_add(1);
                self.by_key.insert(new, waker.clone());
                *key = Some(new);
                None
            }
        }
    }

    /// Takes the waker under `key` out, if it is still there, to drop after the lock.
    #[must_use = "drop it after the lock is released"]
    pub(crate) fn remove(&mut self, key: u64) -> Option<Waker> {
        self.by_key.remove(&key)
    }

    /// Takes every waker out, to wake after the lock.
    pub(crate) fn take(&mut self) -> ToWake {
        ToWake(std::mem::take(&mut self.by_key))
    }

    /// How many wakers are kept.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_key.len()
    }
}

/// Helpers for the unit tests of the modules that keep wakers under a lock.
#[cfg(test)]
pub(crate) mod test_support {
    use std::sync::{Arc, Mutex};
    use std::task::{Wake, Waker};
    use std::time::Duration;

    /// Holds a value until the last clone of its waker is dropped.
    struct DropsOnLastRef<T>(Mutex<Option<T>>);

    impl<T: Send> Wake for DropsOnLastRef<T> {
        // Waking lets go of this reference and does nothing else; the value goes
        // with the last one (not `Waker::noop`, which has no reference to drop).
        fn wake(self: Arc<Self>) {
            drop(self);
        }
    }

    /// A waker that does nothing when woken and drops `value` with its last clone: a
    /// stand-in for the last waker of a task whose future, `value`, is dropped with it.
    pub(crate) fn waker_dropping<T: Send + 'static>(value: T) -> Waker {
        Waker::from(Arc::new(DropsOnLastRef(Mutex::new(Some(value)))))
    }

    /// Counts its wakes into a shared count, and panics on them if told to.
    struct Counted {
        woken: Arc<std::sync::atomic::AtomicUsize>,
        panics: bool,
    }

    impl Wake for Counted {
        fn wake(self: Arc<Self>) {
            self.woken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            assert!(!self.panics, "a waker that panics");
        }
    }

    /// A waker that counts its wakes (and panics on each when `panics`), and the
    /// count.
    pub(crate) fn counting_waker(panics: bool) -> (Waker, Arc<std::sync::atomic::AtomicUsize>) {
        let woken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let waker = Waker::from(Arc::new(Counted {
            woken: Arc::clone(&woken),
            panics,
        }));
        (waker, woken)
    }

    /// Runs `test` on a thread of its own and fails if it has not finished in 10 s,
    /// so a deadlock fails the test instead of hanging the suite.
    pub(crate) fn without_deadlock(test: impl FnOnce() + Send + 'static) {
        let (done, finished) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
            test();
            let _ = done.send(());
        });
        match finished.recv_timeout(Duration::from_secs(10)) {
            Ok(()) => thread.join().expect("the test thread"),
            // The thread panicked: report its panic.
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                if let Err(panic) = thread.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                panic!("deadlocked: a waker was dropped under the lock its drop takes")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_support::counting_waker;
    use super::*;
    use std::sync::atomic::Ordering;

    /// Three wakers in a `Wakers`, the first of which panics when woken, all taken,
    /// and how many of them were woken.
    fn taken() -> (ToWake, impl Fn() -> usize) {
        let mut wakers = Wakers::default();
        let mut counts = Vec::new();
        for panics in [true, false, false] {
            let (waker, woken) = counting_waker(panics);
            let _ = wakers.register(&mut None, &waker);
            counts.push(woken);
        }
        let woken = move || counts.iter().map(|c| c.load(Ordering::SeqCst)).sum();
        (wakers.take(), woken)
    }

    #[test]
    fn a_waker_that_panics_leaves_none_of_the_others_asleep() {
        let (to_wake, woken) = taken();
        let guard = to_wake.on_drop();
        let panicked = std::panic::catch_unwind(AssertUnwindSafe(|| drop(guard)));
        assert!(panicked.is_err(), "the panic goes on");
        assert_eq!(woken(), 3);
        // And no second panic out of the drop while another unwinds (which would
        // abort).
        let (to_wake, woken) = taken();
        let unwound = std::panic::catch_unwind(AssertUnwindSafe(move || {
            let _guard = to_wake.on_drop();
            panic!("the observer's panic");
        }));
        let message = unwound.unwrap_err();
        assert_eq!(
            message.downcast_ref::<&str>(),
            Some(&"the observer's panic")
        );
        assert_eq!(woken(), 3);
    }

    /// A waker that writes `index` into `log` when woken.
    struct Logged {
        index: usize,
        log: std::sync::Arc<std::sync::Mutex<Vec<usize>>>,
    }

    impl std::task::Wake for Logged {
        fn wake(self: std::sync::Arc<Self>) {
            self.log.lock().unwrap().push(self.index);
        }
    }

    #[test]
    fn wakers_are_woken_in_the_order_they_first_waited() {
        // A seeded simulation replays only if waiters resume the same way each run:
        // first come, first woken, even for one that registered a new waker since.
        let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let logged = |index| {
            Waker::from(std::sync::Arc::new(Logged {
                index,
                log: std::sync::Arc::clone(&log),
            }))
        };
        let mut wakers = Wakers::default();
        let mut keys = [None; 4];
        for (index, key) in keys.iter_mut().enumerate() {
            assert!(wakers.register(key, &logged(index)).is_none());
        }
        // Waiter 0 polled again with a waker of another task; waiter 2 gave up.
        let replaced = wakers.register(&mut keys[0], &logged(0));
        assert!(replaced.is_some(), "a waker of another task is replaced");
        drop(wakers.remove(keys[2].unwrap()));
        drop(wakers.take().on_drop());
        assert_eq!(*log.lock().unwrap(), [0, 1, 3]);
    }
}
