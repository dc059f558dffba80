//! The timer set of a [`VirtualRuntime`](crate::VirtualRuntime): exact removal, firing
//! in (deadline, creation order).
//!
//! Live timers sit in a slab (exact: a removed timer is gone at once and never
//! fires); their order is kept by a min-heap of `(deadline, seq, slot)` keys. A
//! removed timer's key stays in the heap until it surfaces and is skipped, or until
//! the heap is compacted, which happens whenever stale keys outnumber live ones by a
//! margin, so memory stays proportional to the live timers.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::task::Waker;

use vantage_api_pool::Instant;

/// Stale heap keys tolerated beyond the live count before compacting.
const COMPACT_SLACK: usize = 32;

/// Names one registered timer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TimerId {
    pub(crate) deadline: Instant,
    pub(crate) seq: u64,
    slot: u32,
}

struct Slot {
    /// The `seq` of the timer in this slot; `None` when vacant.
    seq: Option<u64>,
    waker: Option<Waker>,
}

#[derive(Default)]
pub(crate) struct Timers {
    slots: Vec<Slot>,
    free: Vec<u32>,
    heap: BinaryHeap<Reverse<(Instant, u64, u32)>>,
    live: usize,
    next_seq: u64,
}

impl Timers {
    /// Registers a timer; `seq` (creation order) breaks ties between equal deadlines.
    pub(crate) fn insert(&mut self, deadline: Instant) -> TimerId {
        let seq = self.next_seq;
        self.next_seq += 1;
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None => {
                let slot = u32::try_from(self.slots.len())
                    .expect("more than 4 billion timers pending on one VirtualRuntime");
                self.slots.push(Slot {
                    seq: None,
                    waker: None,
                });
                slot
            }
        };
        let entry = &mut self.slots[slot as usize];
        entry.seq = Some(seq);
        entry.waker = None;
        self.heap.push(Reverse((deadline, seq, slot)));
        self.live += 1;
        TimerId {
            deadline,
            seq,
            slot,
        }
    }

    fn is_live(&self, seq: u64, slot: u32) -> bool {
        self.slots
            .get(slot as usize)
            .is_some_and(|s| s.seq == Some(seq))
    }

    /// Removes a timer if it is still registered: `None` if it was not, else its
    /// waker, if it had one, for the caller to drop once it holds no lock (a waker's
    /// drop may run anything, a sleep's drop on this runtime included).
    pub(crate) fn remove(&mut self, id: TimerId) -> Option<Option<Waker>> {
        if !self.is_live(id.seq, id.slot) {
            return None;
        }
        let waker = self.vacate(id.slot);
        if self.heap.len() > 2 * self.live + COMPACT_SLACK {
            let slots = &self.slots;
            self.heap
                .retain(|Reverse((_, seq, slot))| slots[*slot as usize].seq == Some(*seq));
        }
        Some(waker)
    }

    fn vacate(&mut self, slot: u32) -> Option<Waker> {
        let entry = &mut self.slots[slot as usize];
        entry.seq = None;
        self.free.push(slot);
        self.live -= 1;
        entry.waker.take()
    }

    /// The waker slot of a registered timer; `None` if it is not registered.
    pub(crate) fn waker_mut(&mut self, id: TimerId) -> Option<&mut Option<Waker>> {
        if !self.is_live(id.seq, id.slot) {
            return None;
        }
        Some(&mut self.slots[id.slot as usize].waker)
    }

    /// The earliest registered deadline.
    pub(crate) fn first(&mut self) -> Option<Instant> {
        while let Some(&Reverse((deadline, seq, slot))) = self.heap.peek() {
            if self.is_live(seq, slot) {
                return Some(deadline);
            }
            self.heap.pop();
        }
        None
    }

    /// Removes every timer due at or before `now`, in (deadline, creation order),
    /// moving the wakers of those that have one into `out`.
    pub(crate) fn take_due(&mut self, now: Instant, out: &mut Vec<Waker>) {
        while let Some(&Reverse((deadline, seq, slot))) = self.heap.peek() {
            if deadline > now {
                break;
            }
            self.heap.pop();
            if self.is_live(seq, slot)
                && let Some(waker) = self.vacate(slot)
            {
                out.push(waker);
            }
        }
    }

    /// How many timers are registered.
    pub(crate) fn len(&self) -> usize {
        self.live
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::task::Wake;
    use std::time::Duration;

    use super::*;

    struct Tag(usize, Arc<std::sync::Mutex<Vec<usize>>>);
    impl Wake for Tag {
        fn wake(self: Arc<Self>) {
            self.1.lock().unwrap().push(self.0);
        }
    }

    fn at(ms: u64) -> Instant {
        Instant::ORIGIN + Duration::from_millis(ms)
    }

    #[test]
    fn fires_in_deadline_then_creation_order_and_skips_removed() {
        let log = Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut timers = Timers::default();
        let deadlines = [30, 10, 30, 20, 10, 40];
        let ids: Vec<TimerId> = deadlines
            .iter()
            .enumerate()
            .map(|(i, &ms)| {
                let id = timers.insert(at(ms));
                *timers.waker_mut(id).unwrap() =
                    Some(Waker::from(Arc::new(Tag(i, Arc::clone(&log)))));
                id
            })
            .collect();
        assert!(timers.remove(ids[3]).is_some_and(|waker| waker.is_some()));
        assert!(timers.remove(ids[3]).is_none(), "removing twice is a no-op");
        assert_eq!(timers.len(), 5);
        assert_eq!(timers.first(), Some(at(10)));
        let mut wakers = Vec::new();
        timers.take_due(at(30), &mut wakers);
        wakers.into_iter().for_each(Waker::wake);
        assert_eq!(*log.lock().unwrap(), [1, 4, 0, 2]);
        assert_eq!(timers.len(), 1);
        assert_eq!(timers.first(), Some(at(40)));
        assert!(timers.waker_mut(ids[0]).is_none(), "fired timers are gone");
    }

    #[test]
    fn removed_timers_do_not_pile_up() {
        let mut timers = Timers::default();
        let keep = timers.insert(at(1));
        for i in 0..100_000 {
            let id = timers.insert(at(10 + i));
            timers.remove(id);
        }
        assert_eq!(timers.len(), 1);
        assert!(
            timers.heap.len() <= 2 + COMPACT_SLACK + 1,
            "{}",
            timers.heap.len()
        );
        assert!(timers.slots.len() <= 2);
        assert_eq!(timers.first(), Some(keep.deadline));
    }

    #[test]
    fn a_reused_slot_does_not_revive_a_stale_key() {
        let mut timers = Timers::default();
        let old = timers.insert(at(5));
        timers.remove(old);
        let new = timers.insert(at(50));
        assert_eq!(timers.first(), Some(at(50)));
        assert!(timers.remove(old).is_none());
        assert!(timers.remove(new).is_some());
        assert_eq!(timers.first(), None);
    }
}
