//! Wakers whose `clone` panics, against the permit queue. Such a waker can only be
//! made by hand from a `RawWaker` (a safe `Wake` cannot panic on clone), hence the
//! one `unsafe` of the workspace's tests.
#![allow(unsafe_code)]

use std::cell::Cell;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::mpsc;
use std::task::{Context, Poll, RawWaker, RawWakerVTable, Waker};
use std::time::Duration;

use vantage_api_pool::concurrency::Limiter;

thread_local! {
    /// Set: the next clone of a [`panicking_clone`] waker on this thread panics
    /// (once). Per thread, so tests running side by side cannot trip each other.
    static PANIC_ON_CLONE: Cell<bool> = const { Cell::new(false) };
}

unsafe fn clone(data: *const ()) -> RawWaker {
    if PANIC_ON_CLONE.replace(false) {
        panic!("a waker whose clone panics");
    }
    RawWaker::new(data, &VTABLE)
}

unsafe fn nothing(_: *const ()) {}

static VTABLE: RawWakerVTable = RawWakerVTable::new(clone, nothing, nothing, nothing);

/// A waker that does nothing, and whose clone panics once [`PANIC_ON_CLONE`] is set.
fn panicking_clone() -> Waker {
    // SAFETY: the vtable's functions ignore the data pointer, and a clone returns
    // the same vtable.
    unsafe { Waker::from_raw(RawWaker::new(std::ptr::null(), &VTABLE)) }
}

fn poll_with<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

#[test]
fn a_next_waker_whose_clone_panics_neither_deadlocks_the_queue_nor_loses_a_permit() {
    // Two permits come back while A and B wait: A, served, sees the second one free
    // for B and clones B's waker, which panics. The queue's lock must not be held
    // by anything the unwinding drops that takes it (a deadlock), and the permit
    // A was about to take must stay free.
    let (done, finished) = mpsc::channel();
    let test = std::thread::spawn(move || {
        let limiter = Limiter::new(2).unwrap();
        let held = (
            limiter.try_acquire().unwrap(),
            limiter.try_acquire().unwrap(),
        );
        let (mut a, mut b) = (limiter.acquire(), limiter.acquire());
        assert!(poll_with(&mut a, Waker::noop()).is_pending());
        assert!(poll_with(&mut b, &panicking_clone()).is_pending());
        drop(held);
        PANIC_ON_CLONE.set(true);
        let served = catch_unwind(AssertUnwindSafe(|| {
            poll_with(&mut a, Waker::noop()).is_ready()
        }));
        assert!(served.is_err(), "B's waker panicked out of A's poll");
        assert_eq!(limiter.in_flight(), 0, "no permit taken");
        // A is still first in line and takes a permit; B the other.
        let Poll::Ready(first) = poll_with(&mut a, Waker::noop()) else {
            panic!("A is served")
        };
        let Poll::Ready(second) = poll_with(&mut b, Waker::noop()) else {
            panic!("B is served")
        };
        assert_eq!(limiter.in_flight(), 2);
        drop((first, second));
        assert_eq!((limiter.in_flight(), limiter.waiting()), (0, 0));
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(10)) {
        Ok(()) => test.join().unwrap(),
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = test.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            panic!("deadlocked: a permit was dropped under the queue's lock")
        }
    }
}

#[test]
fn a_waker_whose_clone_panics_as_its_caller_would_queue_leaves_the_lock_free_path_open() {
    // Every permit held, A would be the first to queue: its waker's clone panics.
    // The "somebody is queued" flag must not be left set with nobody queued, which
    // would send every later caller through the lock.
    let limiter = Limiter::new(1).unwrap();
    let held = limiter.try_acquire().unwrap();
    let mut a = limiter.acquire();
    PANIC_ON_CLONE.set(true);
    let joined = catch_unwind(AssertUnwindSafe(|| {
        poll_with(&mut a, &panicking_clone()).is_pending()
    }));
    assert!(joined.is_err(), "the clone panicked out of A's poll");
    drop((a, held));
    assert_eq!((limiter.in_flight(), limiter.waiting()), (0, 0));
    assert!(
        limiter.try_acquire().is_some(),
        "nobody waits and the permit is free: the lock-free take gets it"
    );
}
