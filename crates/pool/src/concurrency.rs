//! The concurrency cap: at most `max_parallel` sends in flight per client, waiting
//! callers served in arrival order.
//!
//! A small fair semaphore of our own (the pool has no executor, so no tokio
//! `Semaphore`): a permit is handed out on poll to the caller at the front of the
//! queue, so a caller that arrives while others wait never jumps the queue. While
//! nobody waits, a permit is one compare-exchange to take and one to give back. The
//! [`Permit`] guard gives it back on drop, so a cancelled call frees its permit.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

use crate::error::ConfigError;
use crate::sync::{AtomicUsize, Mutex, MutexGuard, Ordering, PoisonError, wake_from_drop};

#[derive(Debug)]
struct Waiter {
    id: u64,
    waker: Waker,
}

/// The queue; only touched under the lock.
#[derive(Debug)]
struct Queue {
    waiters: VecDeque<Waiter>,
    next_id: u64,
}

/// The most permits a [`Limiter`] can have: the free count shares one atomic word
/// with a flag.
pub const MAX_PERMITS: usize = usize::MAX >> 1;

/// Bit 0 of the word: some caller waits in the queue. The rest: free permits.
const QUEUED: usize = 1;
/// One free permit in the word.
const ONE: usize = 2;

/// A fair counting semaphore that also keeps in-flight figures.
///
/// The free permits and a "callers are queued" flag share one atomic word. While
/// nobody is queued, taking and returning a permit is a compare-exchange on that
/// word and nothing else; once somebody waits, every caller goes through the lock,
/// which keeps the queue in arrival order. The flag is set and cleared only under
/// the lock, each an atomic read-modify-write of the word (a compare-exchange to
/// set it, a `fetch_and` to clear it), so a lock-free caller either acts before the
/// change or sees it.
#[derive(Debug)]
pub struct Limiter {
    max: usize,
    /// `free * ONE | QUEUED?`.
    word: AtomicUsize,
    queue: Mutex<Queue>,
    peak: AtomicUsize,
}

impl Limiter {
    /// A limiter with `max` permits: at least 1 and at most [`MAX_PERMITS`].
    ///
    /// # Errors
    /// [`ConfigError`] naming `max_parallel` for 0 or more than [`MAX_PERMITS`].
    pub fn new(max: usize) -> Result<Self, ConfigError> {
        if max == 0 {
            return Err(ConfigError::new("max_parallel", "must be at least 1"));
        }
        if max > MAX_PERMITS {
            return Err(ConfigError::new(
                "max_parallel",
                "must be at most usize::MAX / 2",
            ));
        }
        Ok(Limiter {
            max,
            word: AtomicUsize::new(max * ONE),
            queue: Mutex::new(Queue {
                waiters: VecDeque::new(),
                next_id: 0,
            }),
            peak: AtomicUsize::new(0),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The number of permits.
    #[must_use]
    pub fn max(&self) -> usize {
        self.max
    }

    /// Permits held right now.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.max - self.word.load(Ordering::Acquire) / ONE
    }

    /// The most permits held at once since the limiter was made, or since the last
    /// [`take_peak_in_flight`](Self::take_peak_in_flight).
    #[must_use]
    pub fn peak_in_flight(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }

    /// [`peak_in_flight`](Self::peak_in_flight), and starts the next interval from
    /// the permits held now. A permit granted while this runs may count in the
    /// next interval instead of this one.
    pub fn take_peak_in_flight(&self) -> usize {
        let now = self.in_flight();
        // A grant that took its permit before `now` was read but has not raised the
        // peak yet is in `now`.
        self.peak.swap(now, Ordering::Relaxed).max(now)
    }

    /// Callers waiting for a permit right now.
    #[must_use]
    pub fn waiting(&self) -> usize {
        self.lock().waiters.len()
    }

    /// Waits for a permit. Cancel-safe: dropping the future leaves the queue.
    pub fn acquire(&self) -> Acquire<'_> {
        Acquire {
            limiter: self,
            queued: None,
        }
    }

    /// A permit at once, if one is free and nobody is queued for one; never waits
    /// and never queues.
    #[must_use]
    #[inline]
    pub fn try_acquire(&self) -> Option<Permit<'_>> {
        self.try_take_unqueued().then(|| self.grant())
    }

    /// Takes a free permit while nobody is queued, without the lock.
    #[inline]
    fn try_take_unqueued(&self) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        while word & QUEUED == 0 && word >= ONE {
            match self.word.compare_exchange_weak(
                word,
                word - ONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(current) => word = current,
            }
        }
        false
    }

    /// Returns a permit while nobody is queued, without the lock.
    #[inline]
    fn try_give_unqueued(&self) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        while word & QUEUED == 0 {
            match self.word.compare_exchange_weak(
                word,
                word + ONE,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return true,
                Err(current) => word = current,
            }
        }
        false
    }

    /// A permit just taken from the word.
    fn grant(&self) -> Permit<'_> {
        let held = self.in_flight();
        if held > self.peak.load(Ordering::Relaxed) {
            self.peak.fetch_max(held, Ordering::Relaxed);
        }
        Permit { limiter: self }
    }

    /// Under the lock, with the queue empty: takes a free permit, or sets the flag so
    /// the caller can queue. `true` if a permit was taken.
    fn take_or_flag(&self) -> bool {
        let mut word = self.word.load(Ordering::Acquire);
        loop {
            let next = if word >= ONE {
                word - ONE
            } else {
                word | QUEUED
            };
            match self
                .word
                .compare_exchange_weak(word, next, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => return word >= ONE,
                Err(current) => word = current,
            }
        }
    }

    /// Under the lock, after the queue emptied: lets callers skip the lock again.
    fn clear_flag(&self) {
        self.word.fetch_and(!QUEUED, Ordering::AcqRel);
    }

    /// Under the lock: the front waiter's waker, if a permit is free for it.
    fn wake_front(&self, queue: &Queue) -> Option<Waker> {
        if self.word.load(Ordering::Acquire) >= ONE {
            queue.waiters.front().map(|w| w.waker.clone())
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
        let Some(id) = self.queued else {
            if limiter.try_take_unqueued() {
                return Poll::Ready(limiter.grant());
            }
            // The waker to queue, cloned first, outside the lock: a clone that
            // panics leaves the flag as it was (set below, it would stay set with
            // nobody queued, and send every caller through the lock).
            let waker = cx.waker().clone();
            let mut queue = limiter.lock();
            // Nobody queued (the flag is clear) and a permit free: take it; otherwise
            // join the queue, setting the flag if this caller is the first.
            if queue.waiters.is_empty() && limiter.take_or_flag() {
                drop(queue);
                drop(waker);
                return Poll::Ready(limiter.grant());
            }
            let id = queue.next_id;
            queue.next_id += 1;
            queue.waiters.push_back(Waiter { id, waker });
            self.queued = Some(id);
            return Poll::Pending;
        };
        let mut queue = limiter.lock();
        // The flag is set while this caller is queued, so only lock holders change
        // the word: a free permit stays free until the front takes it.
        let free = limiter.word.load(Ordering::Acquire);
        if queue.waiters.front().is_some_and(|w| w.id == id) && free >= ONE {
            // A second permit free is one for the next in line: its waker, cloned
            // before anything changes (a clone that panics leaves the queue and the
            // count as they were).
            let next = if free >= 2 * ONE {
                queue.waiters.get(1).map(|w| w.waker.clone())
            } else {
                None
            };
            limiter.word.fetch_sub(ONE, Ordering::AcqRel);
            let served = queue.waiters.pop_front();
            self.queued = None;
            if queue.waiters.is_empty() {
                limiter.clear_flag();
            }
            drop(queue);
            // The guard after the lock (its drop takes the lock) and before anything
            // that may panic: the served waker's drop (maybe an older waker than this
            // poll's, so dropped after the lock) and the next one's wake. A panic out
            // of either unwinds through it, and the permit comes back.
            let permit = limiter.grant();
            drop(served);
            if let Some(w) = next {
                w.wake();
            }
            return Poll::Ready(permit);
        }
        // The waker replaced is dropped after the lock: its drop may be the last of a
        // task whose own waiting `Acquire` then takes the lock.
        let replaced = match queue.waiters.iter_mut().find(|w| w.id == id) {
            Some(w) if !w.waker.will_wake(cx.waker()) => {
                Some(std::mem::replace(&mut w.waker, cx.waker().clone()))
            }
            _ => None,
        };
        drop(queue);
        drop(replaced);
        Poll::Pending
    }
}

impl Drop for Acquire<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.queued {
            let limiter = self.limiter;
            let mut queue = limiter.lock();
            let was_front = queue.waiters.front().is_some_and(|w| w.id == id);
            // Dropped after the lock, as in `poll`.
            let removed = queue
                .waiters
                .iter()
                .position(|w| w.id == id)
                .and_then(|at| queue.waiters.remove(at));
            if queue.waiters.is_empty() {
                limiter.clear_flag();
            }
            let next = if was_front {
                limiter.wake_front(&queue)
            } else {
                None
            };
            drop(queue);
            drop(removed);
            if let Some(w) = next {
                wake_from_drop(w);
            }
        }
    }
}

/// One send's permit; returned when dropped.
#[must_use = "dropping the permit releases it at once"]
#[derive(Debug)]
pub struct Permit<'a> {
    limiter: &'a Limiter,
}

impl Drop for Permit<'_> {
    #[inline]
    fn drop(&mut self) {
        let limiter = self.limiter;
        if limiter.try_give_unqueued() {
            return;
        }
        give_back_queued(limiter);
    }
}

/// Somebody is queued (or was, a moment ago): returns the permit under the lock and
/// wakes the front. Out of line, so a drop with nobody queued inlines to its
/// compare-exchange.
#[inline(never)]
fn give_back_queued(limiter: &Limiter) {
    let queue = limiter.lock();
    limiter.word.fetch_add(ONE, Ordering::AcqRel);
    let next = limiter.wake_front(&queue);
    drop(queue);
    if let Some(w) = next {
        wake_from_drop(w);
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
    fn a_waker_whose_drop_reaches_back_into_the_queue_is_dropped_after_the_lock() {
        use crate::sync::test_support::{waker_dropping, without_deadlock};
        // A queued waiter's stored waker may be the last of a task that holds another
        // waiter, whose drop takes the queue's lock: replaced by a poll, removed when
        // its waiter gives up, or popped when it is served.
        without_deadlock(|| {
            let l: &'static Limiter = Box::leak(Box::new(Limiter::new(1).unwrap()));
            let held = l.try_acquire().unwrap();
            let queued = || {
                let mut waiter = l.acquire();
                assert!(poll(&mut waiter).is_pending());
                waiter
            };
            let mut a = l.acquire();
            let poll_with = |a: &mut Acquire<'static>, waker| {
                assert!(a.poll_unpin(&mut Context::from_waker(&waker)).is_pending());
            };
            // Replaced by a poll with another waker.
            poll_with(&mut a, waker_dropping(queued()));
            assert_eq!(l.waiting(), 2);
            assert!(poll(&mut a).is_pending());
            assert_eq!(l.waiting(), 1);
            // Removed when its waiter is dropped.
            poll_with(&mut a, waker_dropping(queued()));
            drop(a);
            assert_eq!(l.waiting(), 0);
            // Popped when its waiter is served (first in line, the other behind it).
            let mut b = queued();
            poll_with(&mut b, waker_dropping(queued()));
            drop(held);
            let Poll::Ready(permit) = poll(&mut b) else {
                panic!("the front waiter is served when a permit comes back")
            };
            assert_eq!((l.in_flight(), l.waiting()), (1, 0));
            drop(permit);
        });
    }

    #[test]
    fn a_woken_front_waiter_dropped_before_its_poll_passes_the_wake_on() {
        struct Count(std::sync::atomic::AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: std::sync::Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let l = Limiter::new(1).unwrap();
        let held = l.acquire().now_or_never().unwrap();
        let (mut a, mut b) = (l.acquire(), l.acquire());
        let woken = std::sync::Arc::new(Count(std::sync::atomic::AtomicUsize::new(0)));
        let waker = Waker::from(std::sync::Arc::clone(&woken));
        assert!(poll(&mut a).is_pending());
        assert!(b.poll_unpin(&mut Context::from_waker(&waker)).is_pending());
        // The permit comes back and wakes A, which gives up before it runs: B, next
        // in line, must be woken, or it waits for another permit.
        drop(held);
        assert_eq!(woken.0.load(Ordering::SeqCst), 0);
        drop(a);
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "B was not woken");
        let Poll::Ready(permit) = poll(&mut b) else {
            panic!("the wake-up was not passed on to the next in line")
        };
        assert_eq!((l.in_flight(), l.waiting()), (1, 0));
        drop(permit);
    }

    #[test]
    fn a_permit_dropped_while_a_panic_unwinds_survives_a_waker_that_panics() {
        use crate::sync::test_support::counting_waker;
        use std::panic::{AssertUnwindSafe, catch_unwind};
        // The permit comes back as a panic unwinds through its holder (an observer's,
        // say) and wakes the front, whose waker panics too: a second panic out of the
        // drop would abort the process.
        let l = Limiter::new(1).unwrap();
        let held = l.acquire().now_or_never().unwrap();
        let mut waiting = l.acquire();
        let (waker, woken) = counting_waker(true);
        assert!(
            waiting
                .poll_unpin(&mut Context::from_waker(&waker))
                .is_pending()
        );
        let unwound = catch_unwind(AssertUnwindSafe(move || {
            let _held = held;
            panic!("the holder panics");
        }));
        assert!(unwound.is_err());
        assert_eq!(woken.load(Ordering::SeqCst), 1, "the front was woken");
        // The permit is back, kept for the front.
        assert_eq!((l.in_flight(), l.waiting()), (0, 1));
        let Poll::Ready(permit) = poll(&mut waiting) else {
            panic!("the permit did not come back")
        };
        drop(permit);
        assert_eq!((l.in_flight(), l.waiting()), (0, 0));
    }

    #[test]
    fn a_front_waiter_dropped_while_a_panic_unwinds_survives_the_next_ones_panicking_waker() {
        use crate::sync::test_support::counting_waker;
        use std::panic::{AssertUnwindSafe, catch_unwind};
        let l = Limiter::new(1).unwrap();
        let held = l.acquire().now_or_never().unwrap();
        let (mut front, mut next) = (l.acquire(), l.acquire());
        assert!(poll(&mut front).is_pending());
        let (waker, woken) = counting_waker(true);
        assert!(
            next.poll_unpin(&mut Context::from_waker(&waker))
                .is_pending()
        );
        // The permit comes back for the front, which is dropped by a panic before it
        // takes it: the wake passed on to the next one panics.
        drop(held);
        let unwound = catch_unwind(AssertUnwindSafe(move || {
            let _front = front;
            panic!("the front's task panics");
        }));
        assert!(unwound.is_err());
        assert_eq!(woken.load(Ordering::SeqCst), 1, "the next one was woken");
        let Poll::Ready(permit) = poll(&mut next) else {
            panic!("the permit was not passed on")
        };
        drop(permit);
        assert_eq!((l.in_flight(), l.waiting()), (0, 0));
    }

    #[test]
    fn a_panic_out_of_the_next_ones_waker_while_the_front_is_served_loses_no_permit() {
        use crate::sync::test_support::counting_waker;
        use std::panic::{AssertUnwindSafe, catch_unwind};
        // Two permits come back while A and B wait: A, served, sees the second one
        // free and wakes B, whose waker panics. The panic leaves A's poll; the permit
        // A took must come back with it.
        let l = Limiter::new(2).unwrap();
        let held = (l.try_acquire().unwrap(), l.try_acquire().unwrap());
        let (mut a, mut b) = (l.acquire(), l.acquire());
        assert!(poll(&mut a).is_pending());
        let (waker, woken) = counting_waker(true);
        assert!(b.poll_unpin(&mut Context::from_waker(&waker)).is_pending());
        drop(held);
        // The permit stays out of the closure: a panic must come from the serving
        // poll itself (its wake of B), not from the permit's drop, which wakes B too.
        let served = catch_unwind(AssertUnwindSafe(|| poll(&mut a)));
        if let Ok(poll) = served {
            // Not dropped: its drop would wake B, whose waker panics, during this
            // panic's unwind, and abort the test binary instead of failing the test.
            std::mem::forget(poll);
            panic!("B's waker did not panic out of A's poll");
        }
        assert!(woken.load(Ordering::SeqCst) >= 1, "B was woken");
        assert_eq!(l.in_flight(), 0, "the permit A took came back");
        // Both permits serve B and a newcomer.
        let Poll::Ready(first) = poll(&mut b) else {
            panic!("B is served")
        };
        let second = l.try_acquire().expect("the second permit is free");
        drop((first, second, a));
        assert_eq!((l.in_flight(), l.waiting()), (0, 0));
    }

    #[test]
    fn the_last_waiter_giving_up_reopens_the_lock_free_path() {
        let l = Limiter::new(1).unwrap();
        let held = l.acquire().now_or_never().unwrap();
        let mut waiter = l.acquire();
        assert!(poll(&mut waiter).is_pending());
        drop(waiter);
        drop(held);
        assert_eq!((l.in_flight(), l.waiting()), (0, 0));
        // Every permit free and nobody queued: the lock-free take must succeed.
        assert!(l.try_acquire().is_some());
    }

    #[test]
    fn a_take_of_the_peak_counts_a_grant_that_has_not_raised_it_yet() {
        let l = Limiter::new(4).unwrap();
        let held = [l.try_acquire().unwrap(), l.try_acquire().unwrap()];
        // As if the second grant had taken its permit from the word but not yet
        // raised the peak when the take ran.
        l.peak.swap(1, Ordering::Relaxed);
        assert_eq!(l.take_peak_in_flight(), 2);
        assert_eq!(l.peak_in_flight(), 2, "the next interval starts from both");
        drop(held);
        assert_eq!(l.take_peak_in_flight(), 2);
        assert_eq!(l.take_peak_in_flight(), 0);
    }

    #[test]
    fn caps_and_serves_in_arrival_order() {
        let l = Limiter::new(2).unwrap();
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
    fn refuses_zero_and_more_than_the_word_holds() {
        assert_eq!(Limiter::new(0).unwrap_err().setting(), "max_parallel");
        assert!(Limiter::new(MAX_PERMITS + 1).is_err());
        let l = Limiter::new(MAX_PERMITS).unwrap();
        let p = l.acquire().now_or_never().unwrap();
        assert_eq!((l.in_flight(), l.max()), (1, MAX_PERMITS));
        drop(p);
        assert_eq!(l.in_flight(), 0);
    }

    #[test]
    fn the_queue_flag_sends_everybody_through_the_lock_until_it_empties() {
        let l = Limiter::new(1).unwrap();
        let p = l.acquire().now_or_never().unwrap();
        let mut a = l.acquire();
        assert!(poll(&mut a).is_pending());
        assert_eq!(l.word.load(Ordering::Relaxed) & QUEUED, QUEUED);
        // The permit comes back under the lock and waits for `a`; nobody can take it
        // without queueing behind `a`.
        drop(p);
        assert!(l.try_acquire().is_none());
        assert!(!l.try_take_unqueued());
        let Poll::Ready(pa) = poll(&mut a) else {
            panic!("a is first in line")
        };
        // The queue is empty again: the flag is down and the lock-free paths work.
        assert_eq!(l.word.load(Ordering::Relaxed) & QUEUED, 0);
        drop(pa);
        let p = l.try_acquire().expect("free, nobody queued");
        assert!(l.try_acquire().is_none());
        drop(p);
        assert!(l.try_take_unqueued());
        assert!(l.try_give_unqueued());
        assert_eq!((l.in_flight(), l.peak_in_flight()), (0, 1));
    }

    #[test]
    fn dropped_waiters_and_permits_leave_nothing_behind() {
        let l = Limiter::new(1).unwrap();
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
