//! A generational slab (the id scheme behind arrays, managers and scopes) and a
//! graveyard (what recently freed entries were, for diagnostics).
//!
//! An [`Id`] is `{ index, generation }`, where the generation is a serial number taken
//! from a 64-bit counter at insertion: each entry ever inserted has its own, so a stale
//! id never reaches a new entry (the ABA problem behind DJL's "uid is not unique" bug),
//! and the serial doubles as a small, readable, never-reused uid (`#1`, `#2`, ...).
//! Freed slots are reused last-in-first-out, so the slot a new array gets is the one
//! just freed and still in cache.
//!
//! Tombstones do not live in the slots: a freed entry's description goes to a
//! [`Graveyard`], a ring of the most recent ones, searched only when a stale id is used
//! (an error path). The hot path therefore writes one ring entry per free and never
//! walks cold slots.

/// A generational id: slot index plus the serial number of the entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Id {
    pub index: u32,
    pub generation: u64,
}

impl Id {
    /// The entry's serial number: unique over the process's lifetime.
    pub(crate) fn uid(self) -> u64 {
        self.generation
    }
}

struct Slot<L> {
    generation: u64,
    value: Option<L>,
}

pub(crate) struct Slab<L> {
    slots: Vec<Slot<L>>,
    free: Vec<u32>,
    live: usize,
    /// The next serial number (the first entry gets 1).
    next_serial: u64,
}

impl<L> Slab<L> {
    pub(crate) const fn new() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            next_serial: 1,
        }
    }

    pub(crate) fn insert(&mut self, value: L) -> Id {
        self.live += 1;
        let generation = self.next_serial;
        self.next_serial += 1;
        let index = match self.free.pop() {
            Some(index) => {
                let slot = &mut self.slots[index as usize];
                debug_assert!(slot.value.is_none());
                *slot = Slot {
                    generation,
                    value: Some(value),
                };
                index
            }
            None => {
                let index = u32::try_from(self.slots.len()).expect("more than 2^32 live ids");
                self.slots.push(Slot {
                    generation,
                    value: Some(value),
                });
                index
            }
        };
        Id { index, generation }
    }

    #[inline]
    pub(crate) fn get(&self, id: Id) -> Option<&L> {
        match self.slots.get(id.index as usize) {
            Some(Slot {
                generation,
                value: Some(v),
            }) if *generation == id.generation => Some(v),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: Id) -> Option<&mut L> {
        match self.slots.get_mut(id.index as usize) {
            Some(Slot {
                generation,
                value: Some(v),
            }) if *generation == id.generation => Some(v),
            _ => None,
        }
    }

    /// Remove a live entry and return it (`None` if `id` is stale).
    pub(crate) fn remove(&mut self, id: Id) -> Option<L> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.generation != id.generation {
            return None;
        }
        let v = slot.value.take()?;
        self.live -= 1;
        self.free.push(id.index);
        Some(v)
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Number of slots ever allocated (live, free and retired).
    #[cfg(test)]
    pub(crate) fn capacity_used(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn iter_mut(&mut self) -> impl Iterator<Item = &mut L> {
        self.slots.iter_mut().filter_map(|s| s.value.as_mut())
    }
}

/// The descriptions of the last `capacity` freed entries: a fixed ring overwritten in
/// place (no shifting, no reallocation once full).
pub(crate) struct Graveyard<D> {
    ring: Vec<(Id, D)>,
    next: usize,
    capacity: usize,
}

impl<D> Graveyard<D> {
    pub(crate) const fn new(capacity: usize) -> Self {
        Graveyard {
            ring: Vec::new(),
            next: 0,
            capacity,
        }
    }

    /// Record what `id` was; forgets the oldest record beyond capacity.
    #[inline]
    pub(crate) fn bury(&mut self, id: Id, tombstone: D) {
        if self.ring.len() < self.capacity {
            self.ring.push((id, tombstone));
        } else {
            self.ring[self.next] = (id, tombstone);
        }
        self.next = (self.next + 1) % self.capacity;
    }

    /// What `id` was, if it is still remembered. O(capacity): error paths only.
    pub(crate) fn find(&self, id: Id) -> Option<&D> {
        self.ring.iter().find(|(i, _)| *i == id).map(|(_, d)| d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_ids_never_reach_new_entries() {
        let mut s: Slab<u32> = Slab::new();
        let a = s.insert(1);
        assert_eq!(s.remove(a), Some(1));
        assert_eq!(s.remove(a), None);
        let b = s.insert(2);
        assert_eq!(b.index, a.index, "the freed slot is reused first");
        assert_ne!(b, a);
        assert!(s.get(a).is_none());
        assert_eq!(s.get(b), Some(&2));
        assert_ne!(a.uid(), b.uid());
    }

    #[test]
    fn churn_stays_in_one_slot() {
        let mut s: Slab<u32> = Slab::new();
        for i in 0..1000 {
            let id = s.insert(i);
            s.remove(id);
        }
        assert_eq!(s.capacity_used(), 1);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn uids_are_serial_numbers() {
        let mut s: Slab<u32> = Slab::new();
        let a = s.insert(0);
        s.remove(a);
        let b = s.insert(1);
        assert_eq!((a.uid(), b.uid()), (1, 2));
    }

    #[test]
    fn graveyard_keeps_the_newest() {
        let mut g: Graveyard<u32> = Graveyard::new(2);
        let id = |index| Id {
            index,
            generation: 0,
        };
        g.bury(id(1), 10);
        g.bury(id(2), 20);
        g.bury(id(3), 30);
        assert_eq!(g.find(id(1)), None);
        assert_eq!(g.find(id(2)), Some(&20));
        assert_eq!(g.find(id(3)), Some(&30));
    }
}
