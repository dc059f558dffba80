//! The concurrency cap: at most `max_parallel` sends in flight per client, waiting
//! callers served in arrival order.
//!
//! A small fair semaphore of our own (the pool has no executor, so no tokio
//! `Semaphore`): a permit is handed out on poll to the caller at the front of the
//! queue, so a caller that arrives while others wait never jumps the queue. The
//! in-flight figures are kept by the [`Permit`] guard, so a cancelled call gives its
//! permit back and decrements them on drop.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::sync::{AtomicUsize, Mutex, MutexGuard, Ordering, PoisonError};

#[derive(Debug)]
struct Waiter {
    id: u64,
    waker: Waker,
}

#[derive(Debug)]
struct State {
    available: usize,
    waiters: VecDeque<Waiter>,
    next_id: u64,
}

/// A fair counting semaphore that also keeps in-flight figures.
#[derive(Debug)]
pub struct Limiter {
    max: usize,
    state: Mutex<State>,
    in_flight: AtomicUsize,
    peak: AtomicUsize,
}

impl Limiter {
    /// A limiter with `max` permits (at least 1; the builder refuses 0).
    #[must_use]
    pub fn new(max: usize) -> Self {
        Limiter {
            max,
            state: Mutex::new(State {
                available: max,
                waiters: VecDeque::new(),
                next_id: 0,
            }),
            in_flight: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of permits.
    #[must_use]
    pub fn max(&self) -> usize {
        self.max
    }

    /// Permits held right now.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// The most permits ever held at once.
    #[must_use]
    pub fn peak_in_flight(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// Callers waiting for a permit right now.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Waits for a permit. Dropping the future leaves the queue and takes nothing.
    pub fn acquire(&self) -> Acquire<'_> {
        Acquire {
            limiter: self,
            queued: None,
        }
    }

    fn grant(&self) -> Permit<'_> {
        let now = self.in_flight.fetch_add(1, Ordering::Relaxed) + 1;
        self.peak.fetch_max(now, Ordering::Relaxed);
        Permit { limiter: self }
    }

    /// Wakes the caller at the front of the queue if a permit is free.
    fn wake_front(state: &State) -> Option<Waker> {
        if state.available > 0 {
            state.waiters.front().map(|w| w.waker.clone())
        } else {
            None
        }
    }
}

/// The future of [`Limiter::acquire`].
#[must_use = "futures do nothing unless polled"]
#[derive(Debug)]
pub struct Acquire<'a> {
    limiter: &'a Limiter,
    queued: Option<u64>,
}

impl<'a> Future for Acquire<'a> {
    type Output = Permit<'a>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Permit<'a>> {
        let limiter = self.limiter;
        let mut state = limiter.lock();
        match self.queued {
            None if state.available > 0 && state.waiters.is_empty() => {
                state.available -= 1;
                drop(state);
                Poll::Ready(limiter.grant())
            }
            None => {
                let id = state.next_id;
                state.next_id += 1;
                state.waiters.push_back(Waiter {
                    id,
                    waker: cx.waker().clone(),
                });
                self.queued = Some(id);
                Poll::Pending
            }
            Some(id) => {
                if state.available > 0 && state.waiters.front().is_some_and(|w| w.id == id) {
                    state.available -= 1;
                    state.waiters.pop_front();
                    self.queued = None;
                    // Another permit may be free for the next in line.
                    let next = Limiter::wake_front(&state);
                    drop(state);
                    if let Some(w) = next {
                        w.wake();
                    }
                    return Poll::Ready(limiter.grant());
                }
                if let Some(w) = state.waiters.iter_mut().find(|w| w.id == id)
                    && !w.waker.will_wake(cx.waker())
                {
                    w.waker = cx.waker().clone();
                }
                Poll::Pending
            }
        }
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.queued {
            let mut state = self.limiter.lock();
            let was_front = state.waiters.front().is_some_and(|w| w.id == id);
            state.waiters.retain(|w| w.id != id);
            let next = if was_front {
                Limiter::wake_front(&state)
            } else {
                None
            };
            drop(state);
            if let Some(w) = next {
                w.wake();
            }
        }
    }
}

/// A held permit; dropping it gives it back and wakes the next caller in line.
#[must_use = "dropping the permit releases it at once"]
#[derive(Debug)]
pub struct Permit<'a> {
    limiter: &'a Limiter,
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        self.limiter.in_flight.fetch_sub(1, Ordering::Relaxed);
        let mut state = self.limiter.lock();
        state.available += 1;
        let next = Limiter::wake_front(&state);
        drop(state);
        if let Some(w) = next {
            w.wake();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt;
    use futures::task::noop_waker_ref;

    fn poll<F: Future + Unpin>(f: &mut F) -> Poll<F::Output> {
        f.poll_unpin(&mut Context::from_waker(noop_waker_ref()))
    }

    #[test]
    fn caps_and_serves_in_arrival_order() {
        let l = Limiter::new(2);
        let p1 = l.acquire().now_or_never().unwrap();
        let p2 = l.acquire().now_or_never().unwrap();
        assert_eq!((l.in_flight(), l.peak_in_flight()), (2, 2));
        let mut a = l.acquire();
        let mut b = l.acquire();
        assert!(poll(&mut a).is_pending());
        assert!(poll(&mut b).is_pending());
        assert_eq!(l.waiting(), 2);
        drop(p1);
        // A newcomer does not jump the queue.
        let mut c = l.acquire();
        assert!(poll(&mut c).is_pending());
        // b is not at the front: it waits while a is served.
        assert!(poll(&mut b).is_pending());
        let Poll::Ready(pa) = poll(&mut a) else {
            panic!("a is first in line")
        };
        drop(p2);
        let Poll::Ready(pb) = poll(&mut b) else {
            panic!("b is next")
        };
        assert!(poll(&mut c).is_pending());
        drop((pa, pb));
        assert!(poll(&mut c).is_ready());
        assert_eq!(l.peak_in_flight(), 2);
    }

    #[test]
    fn dropped_waiters_and_permits_leave_nothing_behind() {
        let l = Limiter::new(1);
        let p = l.acquire().now_or_never().unwrap();
        let mut a = l.acquire();
        let mut b = l.acquire();
        assert!(poll(&mut a).is_pending() && poll(&mut b).is_pending());
        drop(a); // the front waiter gives up
        drop(p);
        let Poll::Ready(pb) = poll(&mut b) else {
            panic!("b moves to the front")
        };
        assert_eq!(l.in_flight(), 1);
        drop(pb);
        assert_eq!((l.in_flight(), l.waiting()), (0, 0));
        assert!(l.acquire().now_or_never().is_some());
    }
}
