//! A generational slab: the id scheme behind arrays, managers and scopes.
//!
//! An [`Id`] is `{ index, generation }`. A slot's generation is bumped each time the slot
//! is reused, so a stale id never reaches a new entry (the ABA problem that made DJL's
//! "uid is not unique" bug). When an entry dies its slot keeps a tombstone (what it was,
//! how it died) until the slot is reused; freed slots are reused first-in-first-out and
//! only once `slack` of them are waiting, so recent tombstones survive for diagnostics
//! while the table stays at most `live + slack` long. A slot whose generation would wrap
//! is retired, never reused.

use std::collections::VecDeque;

/// A generational id. `uid()` packs it into one `u64` that is never reused.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Id {
    pub index: u32,
    pub generation: u32,
}

impl Id {
    pub(crate) fn uid(self) -> u64 {
        ((self.generation as u64) << 32) | self.index as u64
    }
}

enum Entry<L, D> {
    Live(L),
    Dead(D),
}

struct Slot<L, D> {
    generation: u32,
    entry: Entry<L, D>,
}

/// What an id refers to now.
pub(crate) enum Lookup<'a, L, D> {
    Live(&'a L),
    /// Dead, with its tombstone.
    Dead(&'a D),
    /// Dead and its slot reused (or never valid): nothing is known.
    Gone,
}

pub(crate) struct Slab<L, D> {
    slots: Vec<Slot<L, D>>,
    free: VecDeque<u32>,
    slack: usize,
    live: usize,
}

impl<L, D> Slab<L, D> {
    pub(crate) const fn new(slack: usize) -> Self {
        Slab {
            slots: Vec::new(),
            free: VecDeque::new(),
            slack,
            live: 0,
        }
    }

    pub(crate) fn insert(&mut self, value: L) -> Id {
        self.live += 1;
        if self.free.len() > self.slack {
            let index = self.free.pop_front().expect("free list is non-empty");
            let slot = &mut self.slots[index as usize];
            slot.generation += 1;
            slot.entry = Entry::Live(value);
            return Id {
                index,
                generation: slot.generation,
            };
        }
        let index = u32::try_from(self.slots.len()).expect("more than 2^32 live ids");
        self.slots.push(Slot {
            generation: 0,
            entry: Entry::Live(value),
        });
        Id {
            index,
            generation: 0,
        }
    }

    pub(crate) fn get(&self, id: Id) -> Option<&L> {
        match self.slots.get(id.index as usize) {
            Some(Slot {
                generation,
                entry: Entry::Live(v),
            }) if *generation == id.generation => Some(v),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, id: Id) -> Option<&mut L> {
        match self.slots.get_mut(id.index as usize) {
            Some(Slot {
                generation,
                entry: Entry::Live(v),
            }) if *generation == id.generation => Some(v),
            _ => None,
        }
    }

    pub(crate) fn lookup(&self, id: Id) -> Lookup<'_, L, D> {
        match self.slots.get(id.index as usize) {
            Some(slot) if slot.generation == id.generation => match &slot.entry {
                Entry::Live(v) => Lookup::Live(v),
                Entry::Dead(d) => Lookup::Dead(d),
            },
            _ => Lookup::Gone,
        }
    }

    /// Kill a live entry, leaving the tombstone `tomb` makes from it; returns the entry.
    pub(crate) fn remove_with(&mut self, id: Id, tomb: impl FnOnce(&L) -> D) -> Option<L> {
        let slot = self.slots.get_mut(id.index as usize)?;
        let tombstone = match &slot.entry {
            Entry::Live(v) if slot.generation == id.generation => tomb(v),
            _ => return None,
        };
        let Entry::Live(v) = std::mem::replace(&mut slot.entry, Entry::Dead(tombstone)) else {
            unreachable!()
        };
        self.live -= 1;
        if slot.generation < u32::MAX {
            self.free.push_back(id.index);
        }
        Some(v)
    }

    /// Kill a live entry, leaving `tombstone`.
    pub(crate) fn remove(&mut self, id: Id, tombstone: D) -> Option<L> {
        self.remove_with(id, |_| tombstone)
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Number of slots ever allocated (live, dead and retired).
    #[cfg(test)]
    pub(crate) fn capacity_used(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut L> {
        self.slots.iter_mut().filter_map(|s| match &mut s.entry {
            Entry::Live(v) => Some(v),
            Entry::Dead(_) => None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_ids_never_reach_new_entries() {
        let mut s: Slab<u32, &str> = Slab::new(0);
        let a = s.insert(1);
        assert_eq!(s.remove(a, "gone"), Some(1));
        assert!(matches!(s.lookup(a), Lookup::Dead(&"gone")));
        let b = s.insert(2);
        assert_eq!(b.index, a.index);
        assert_ne!(b, a);
        assert!(s.get(a).is_none());
        assert!(matches!(s.lookup(a), Lookup::Gone));
        assert_eq!(s.get(b), Some(&2));
        assert_ne!(a.uid(), b.uid());
    }

    #[test]
    fn slack_delays_reuse_and_bounds_growth() {
        let mut s: Slab<u32, ()> = Slab::new(4);
        for i in 0..1000 {
            let id = s.insert(i);
            s.remove(id, ());
        }
        assert!(s.capacity_used() <= 5 + 1);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn wrapped_generation_retires_the_slot() {
        let mut s: Slab<u32, ()> = Slab::new(0);
        let a = s.insert(0);
        s.slots[a.index as usize].generation = u32::MAX;
        let a = Id {
            index: a.index,
            generation: u32::MAX,
        };
        s.remove(a, ());
        let b = s.insert(1);
        assert_ne!(b.index, a.index);
    }
}
