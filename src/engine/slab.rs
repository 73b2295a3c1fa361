//! Generational slabs (the id scheme behind arrays, buffers, managers and scopes) and a
//! graveyard (what recently freed entries were, for diagnostics).
//!
//! An [`Id<K>`] is `{ shard, index, serial }`, typed by the kind `K` of record it names
//! ([`ArrayK`], [`BufferK`], [`ManagerK`], [`ScopeK`]), so an array id can never be
//! used where a manager id is expected. `shard` names the engine shard holding the
//! record (always 0 for managers, which live in one global table). The serial is taken
//! from a process-wide counter per kind, in blocks (so shards rarely touch it): each
//! entry ever inserted has its own, so a stale id never reaches a new entry (the ABA
//! problem behind DJL's "uid is not unique" bug), and the serial doubles as a small,
//! readable, never-reused uid (`#1`, `#2`, ...; in order within one thread).
//! Freed slots are reused last-in-first-out, so the slot a new array gets is the one
//! just freed and still in cache.
//!
//! Tombstones do not live in the slots: a freed entry's description goes to a
//! [`Graveyard`], a ring of the most recent ones, searched only when a stale id is used
//! (an error path). The hot path therefore writes one ring entry per free and never
//! walks cold slots.

use std::marker::PhantomData;
use std::num::NonZeroU64;
use std::sync::atomic::{AtomicU64, Ordering};

/// Kind marker: array records.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ArrayK {}
/// Kind marker: data buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum BufferK {}
/// Kind marker: managers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ManagerK {}
/// Kind marker: scopes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum ScopeK {}

/// A generational id of a record of kind `K`: shard, slot index, and serial number.
pub(crate) struct Id<K> {
    pub shard: u32,
    pub index: u32,
    /// Never 0 (serials start at 1), so an `Option<Id>` is no larger than an `Id`.
    pub serial: NonZeroU64,
    _kind: PhantomData<fn() -> K>,
}

/// An array's id.
pub(crate) type ArrayId = Id<ArrayK>;
/// A data buffer's id.
pub(crate) type BufId = Id<BufferK>;
/// A manager's id.
pub(crate) type MgrId = Id<ManagerK>;
/// A scope's id.
pub(crate) type ScopeId = Id<ScopeK>;

impl<K> Clone for Id<K> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<K> Copy for Id<K> {}
impl<K> PartialEq for Id<K> {
    #[inline]
    fn eq(&self, o: &Self) -> bool {
        self.serial == o.serial && self.index == o.index && self.shard == o.shard
    }
}
impl<K> Eq for Id<K> {}
impl<K> std::hash::Hash for Id<K> {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        // Serials are unique per kind: they alone identify the entry.
        h.write_u64(self.serial.get());
    }
}
impl<K> std::fmt::Debug for Id<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "#{}@{}:{}", self.serial, self.shard, self.index)
    }
}

impl<K> Id<K> {
    pub(crate) const fn new(shard: u32, index: u32, serial: u64) -> Self {
        let Some(serial) = NonZeroU64::new(serial) else {
            panic!("serial numbers start at 1");
        };
        Id {
            shard,
            index,
            serial,
            _kind: PhantomData,
        }
    }

    /// The entry's serial number: unique over the process's lifetime (per kind).
    pub(crate) fn uid(self) -> u64 {
        self.serial.get()
    }
}

/// Serial numbers handed out in blocks of this many, so inserting rarely touches the
/// shared counter.
const SERIAL_BLOCK: u64 = 1024;

/// A per-kind source of serial numbers shared by every slab of that kind.
pub(crate) struct Serials(AtomicU64);

impl Serials {
    pub(crate) const fn new() -> Self {
        Serials(AtomicU64::new(1))
    }

    /// A bound above every serial handed out so far (in blocks, to any slab): a slab
    /// that starts a new block after reading it numbers its next entries from here up.
    pub(crate) fn issued(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

struct Slot<L> {
    serial: u64,
    value: Option<L>,
}

pub(crate) struct Slab<K, L> {
    slots: Vec<Slot<L>>,
    free: Vec<u32>,
    live: usize,
    shard: u32,
    serials: &'static Serials,
    /// The next serial number of the current block, and the block's end.
    next_serial: u64,
    end_serial: u64,
    _kind: PhantomData<fn() -> K>,
}

impl<K, L> Slab<K, L> {
    pub(crate) const fn new(shard: u32, serials: &'static Serials) -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            live: 0,
            shard,
            serials,
            next_serial: 0,
            end_serial: 0,
            _kind: PhantomData,
        }
    }

    /// Give up the rest of the current block of serials: the next entry starts a new
    /// one (above [`Serials::issued`] read from now on).
    pub(crate) fn end_serial_block(&mut self) {
        self.next_serial = self.end_serial;
    }

    #[inline]
    fn serial(&mut self) -> u64 {
        if self.next_serial == self.end_serial {
            self.next_serial = self.serials.0.fetch_add(SERIAL_BLOCK, Ordering::Relaxed);
            self.end_serial = self.next_serial + SERIAL_BLOCK;
        }
        let s = self.next_serial;
        self.next_serial += 1;
        s
    }

    /// Insert an entry; its id names it until it is removed.
    #[inline]
    pub(crate) fn insert(&mut self, value: L) -> Id<K> {
        self.insert_with(move || value)
    }

    /// Insert the value `make` builds, built straight in its slot: a large record
    /// built on the stack and then copied in would be read back right after its
    /// stores, which stalls the copy (store forwarding fails on the wide loads).
    #[inline(always)]
    pub(crate) fn insert_with(&mut self, make: impl FnOnce() -> L) -> Id<K> {
        self.live += 1;
        let serial = self.serial();
        let index = match self.free.pop() {
            Some(index) => index,
            None => {
                let index = u32::try_from(self.slots.len()).expect("more than 2^32 live ids");
                self.slots.push(Slot {
                    serial: 0,
                    value: None,
                });
                index
            }
        };
        let slot = &mut self.slots[index as usize];
        debug_assert!(slot.value.is_none());
        slot.serial = serial;
        slot.value = Some(make());
        Id::new(self.shard, index, serial)
    }

    #[inline]
    pub(crate) fn get(&self, id: Id<K>) -> Option<&L> {
        match self.slots.get(id.index as usize) {
            Some(Slot {
                serial,
                value: Some(v),
            }) if *serial == id.serial.get() => Some(v),
            _ => None,
        }
    }

    #[inline]
    pub(crate) fn get_mut(&mut self, id: Id<K>) -> Option<&mut L> {
        match self.slots.get_mut(id.index as usize) {
            Some(Slot {
                serial,
                value: Some(v),
            }) if *serial == id.serial.get() => Some(v),
            _ => None,
        }
    }

    /// Remove a live entry and return it (`None` if `id` is stale).
    #[inline]
    pub(crate) fn remove(&mut self, id: Id<K>) -> Option<L> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.serial != id.serial.get() {
            return None;
        }
        let v = slot.value.take()?;
        self.live -= 1;
        self.free.push(id.index);
        Some(v)
    }

    /// Remove a live entry in place: `take` moves out what the caller keeps, then the
    /// rest is dropped where it lies (the entry itself is never copied). `None` if
    /// `id` is stale.
    #[inline]
    pub(crate) fn remove_with<R>(
        &mut self,
        id: Id<K>,
        take: impl FnOnce(&mut L) -> R,
    ) -> Option<R> {
        let slot = self.slots.get_mut(id.index as usize)?;
        if slot.serial != id.serial.get() {
            return None;
        }
        let kept = take(slot.value.as_mut()?);
        slot.value = None;
        self.live -= 1;
        self.free.push(id.index);
        Some(kept)
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }

    /// Number of slots ever allocated (live, free and retired).
    #[cfg(test)]
    pub(crate) fn capacity_used(&self) -> usize {
        self.slots.len()
    }
}

/// The descriptions of the last `capacity` freed entries: a fixed ring overwritten in
/// place (no shifting, no reallocation once full).
pub(crate) struct Graveyard<K, D> {
    ring: Vec<(Id<K>, D)>,
    next: usize,
    capacity: usize,
}

impl<K, D> Graveyard<K, D> {
    pub(crate) const fn new(capacity: usize) -> Self {
        Graveyard {
            ring: Vec::new(),
            next: 0,
            capacity,
        }
    }

    /// Record what `id` was; forgets the oldest record beyond capacity.
    #[inline]
    pub(crate) fn bury(&mut self, id: Id<K>, tombstone: D) {
        self.bury_with(id, move || tombstone);
    }

    /// [`Graveyard::bury`] with the record built by `make` straight in its ring slot
    /// (no copy of a tombstone just built on the stack).
    #[inline(always)]
    pub(crate) fn bury_with(&mut self, id: Id<K>, make: impl FnOnce() -> D) {
        if self.ring.len() < self.capacity {
            self.ring.push((id, make()));
        } else {
            self.ring[self.next] = (id, make());
        }
        // A compare, not `%`: a division costs more than the rest of a bury.
        self.next += 1;
        if self.next == self.capacity {
            self.next = 0;
        }
    }

    /// What `id` was, if it is still remembered. O(capacity): error paths only.
    pub(crate) fn find(&self, id: Id<K>) -> Option<&D> {
        self.ring.iter().find(|(i, _)| *i == id).map(|(_, d)| d)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    static S: Serials = Serials::new();

    #[test]
    fn stale_ids_never_reach_new_entries() {
        let mut s: Slab<ArrayK, u32> = Slab::new(0, &S);
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
        let mut s: Slab<ArrayK, u32> = Slab::new(0, &S);
        for i in 0..1000 {
            let id = s.insert(i);
            s.remove(id);
        }
        assert_eq!(s.capacity_used(), 1);
        assert_eq!(s.len(), 0);
    }

    #[test]
    fn uids_are_serial_numbers_within_a_slab() {
        static OWN: Serials = Serials::new();
        let mut s: Slab<ArrayK, u32> = Slab::new(0, &OWN);
        let a = s.insert(0);
        s.remove(a);
        let b = s.insert(1);
        assert_eq!((a.uid(), b.uid()), (1, 2));
        // A second slab (another shard) draws from the next block: never the same uid.
        let mut t: Slab<ArrayK, u32> = Slab::new(1, &OWN);
        let c = t.insert(2);
        assert_eq!(c.uid(), 1 + SERIAL_BLOCK);
        assert_eq!(c.shard, 1);
    }

    #[test]
    fn graveyard_keeps_the_newest() {
        let mut g: Graveyard<ArrayK, u32> = Graveyard::new(2);
        let id = |index| ArrayId::new(0, index, index as u64);
        g.bury(id(1), 10);
        g.bury(id(2), 20);
        g.bury(id(3), 30);
        assert_eq!(g.find(id(1)), None);
        assert_eq!(g.find(id(2)), Some(&20));
        assert_eq!(g.find(id(3)), Some(&30));
    }
}
