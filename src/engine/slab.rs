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
//! A slab gives its memory back as its entries go: at most [`SLACK`] vacant slots lie
//! above its last live one. A remove that would leave more drops the whole vacant
//! tail, and a vector left at a quarter of its capacity shrinks to half. A million
//! short-lived arrays thus leave no million slots behind once they are freed, in
//! whatever order. Only the tail can go, since ids name slot indices: a slot that
//! outlives a burst keeps the slots below it (they are reused first). Serials stay
//! unique, so an index handed out again after its slot was dropped never meets an old
//! id's serial. The slack lets a steady loop (a training step's few dozen
//! temporaries, made at the top of the slab and freed each step) reuse its slots from
//! the free list, as any other, instead of dropping them and pushing them again each
//! step (a slot is moved whole when pushed: a 232-byte copy for an array's). The
//! slab tracks its last live slot as entries come and go: a remove of that slot looks
//! down only over the vacant slots that join the tail.
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

/// How many vacant slots may lie above a slab's last live one before they are given
/// back (some dozens of array records: 15 KB for the array slab).
const SLACK: usize = 64;

pub(crate) struct Slab<K, L> {
    /// At most [`SLACK`] vacant slots lie above the last live one.
    slots: Vec<Slot<L>>,
    /// The slots up to the last live one (0 if none is live): the slots above it are
    /// the vacant tail. Kept exact by every insert and remove.
    top: usize,
    /// The vacant slots, most recently vacated last. An entry at or above
    /// `slots.len()` is stale (its slot went with the tail) and is skipped when
    /// popped. The slab only grows when this list is empty, so a stale entry never
    /// comes to name a slot again.
    free: Vec<u32>,
    /// How many entries of `free` are stale.
    stale: usize,
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
            top: 0,
            free: Vec::new(),
            stale: 0,
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
        let index = loop {
            match self.free.pop() {
                Some(index) if (index as usize) < self.slots.len() => break index,
                Some(_) => self.stale -= 1, // its slot went with the tail
                None => {
                    let index = u32::try_from(self.slots.len()).expect("more than 2^32 live ids");
                    self.slots.push(Slot {
                        serial: 0,
                        value: None,
                    });
                    break index;
                }
            }
        };
        // A slot of the vacant tail (or a new one) cuts the tail there.
        self.top = self.top.max(index as usize + 1);
        let slot = &mut self.slots[index as usize];
        debug_assert!(slot.value.is_none());
        slot.serial = serial;
        // The slot is vacant, so there is nothing to drop: `forget` of the `None`
        // spares the call to the entry's drop glue that an assignment makes.
        std::mem::forget(slot.value.replace(make()));
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
        self.vacated(id.index);
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
        self.vacated(id.index);
        Some(kept)
    }

    /// Slot `index` was just emptied: list it free, and if it was the last live slot,
    /// grow the vacant tail over it and over the vacant slots below it, giving the
    /// tail back once it is longer than [`SLACK`].
    #[inline(always)]
    fn vacated(&mut self, index: u32) {
        self.live -= 1;
        self.free.push(index);
        if index as usize + 1 == self.top {
            self.lower_top();
        }
    }

    /// The last live slot was vacated: find the live one below it. Each slot passed
    /// joins the vacant tail, and a slot leaves the tail only when an insert takes it
    /// or one above it (at most [`SLACK`] slots are cut off so), so this is O(1) a
    /// remove, amortised, and O([`SLACK`]) at worst unless a give-back follows, which
    /// drops each slot passed.
    #[inline]
    fn lower_top(&mut self) {
        let mut top = self.top - 1;
        while let Some(i) = top.checked_sub(1)
            && self.slots.get(i).is_some_and(|s| s.value.is_none())
        {
            top = i;
        }
        self.top = top;
        if self.slots.len() - top > SLACK {
            self.give_back();
        }
    }

    /// Drop the vacant tail, the free list's stale entries once they are half of it,
    /// and the vectors' capacity beyond twice their length once it passes four times.
    /// Each dropped slot was pushed once and each stale entry is dropped once, so this
    /// costs O(1) a remove, amortised. (`truncate` drops the slots in place; `pop`
    /// would move each out whole.)
    #[cold]
    #[inline(never)]
    fn give_back(&mut self) {
        let n = self.top;
        self.stale += self.slots.len() - n; // each was listed free
        self.slots.truncate(n);
        if self.stale > self.free.len() / 2 {
            self.free.retain(|&i| (i as usize) < n);
            self.stale = 0;
        }
        shrink(&mut self.slots);
        shrink(&mut self.free);
    }

    pub(crate) fn len(&self) -> usize {
        self.live
    }
}

/// A list's memory follows it down: once a vector holds under a quarter of its
/// capacity (and more than 64 slots of capacity), its capacity halves to twice its
/// length. Growth doubles and this halves, so a list that swings about one length
/// never reallocates, and one left small after a burst gives the burst's memory back.
#[inline]
pub(crate) fn shrink<T>(v: &mut Vec<T>) {
    if v.capacity() > 64 && v.len() < v.capacity() / 4 {
        v.shrink_to(v.len() * 2);
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

    impl<K, L> Slab<K, L> {
        /// Number of slots held (live and vacant).
        pub(crate) fn capacity_used(&self) -> usize {
            self.slots.len()
        }

        /// The memory the slab holds: slot and free-list capacity, in bytes.
        pub(crate) fn bytes_held(&self) -> usize {
            self.slots.capacity() * std::mem::size_of::<Slot<L>>() + self.free.capacity() * 4
        }
    }

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
        let keep = s.insert(7);
        let first = s.insert(0);
        s.remove(first);
        for i in 0..1000 {
            let id = s.insert(i);
            assert_eq!(id.index, first.index, "the slot just vacated is reused");
            s.remove(id);
            assert_eq!(s.capacity_used(), 2, "its vacant slot stays (the slack)");
        }
        // A loop's several temporaries keep their slots too, in whatever order they go.
        for i in 0..1000 {
            let mut ids: Vec<_> = (0..10).map(|k| s.insert(i + k)).collect();
            if i % 2 == 1 {
                ids.reverse();
            }
            for id in ids {
                s.remove(id);
            }
            assert_eq!(s.capacity_used(), 11);
        }
        check_invariants(&s);
        // A burst past the slack goes back whole.
        let ids: Vec<_> = (0..SLACK as u32 + 10).map(|k| s.insert(k)).collect();
        for id in ids {
            s.remove(id);
        }
        check_invariants(&s);
        assert_eq!(s.capacity_used(), 1);
        assert_eq!(s.len(), 1);
        assert_eq!(s.get(keep), Some(&7));
    }

    /// Checks what the slab promises after every step: at most [`SLACK`] vacant slots
    /// lie above the last live one, and `top` names it; the free list names each
    /// vacant slot once and its stale entries (at or above the
    /// length) number `stale`, and a vector holds at most four times its length
    /// beyond 64 slots of capacity.
    fn check_invariants(s: &Slab<ArrayK, u32>) {
        let tail = s
            .slots
            .iter()
            .rev()
            .take_while(|x| x.value.is_none())
            .count();
        assert!(tail <= SLACK, "a vacant tail of {tail} slots");
        assert_eq!(s.slots.len() - tail, s.top, "the last live slot");
        let n = s.slots.len();
        let mut listed = vec![false; n];
        let mut stale = 0;
        for &i in &s.free {
            let i = i as usize;
            if i >= n {
                stale += 1;
                continue;
            }
            assert!(s.slots[i].value.is_none(), "free slot {i} is vacant");
            assert!(!listed[i], "slot {i} listed free twice");
            listed[i] = true;
        }
        assert_eq!(stale, s.stale);
        let vacant = s.slots.iter().filter(|x| x.value.is_none()).count();
        assert_eq!(s.free.len() - stale, vacant, "every vacant slot is listed");
        assert_eq!(n - vacant, s.live);
        for cap in [s.slots.capacity(), s.free.capacity()] {
            assert!(
                cap <= 64 || cap <= 4 * n.max(s.free.len()) + 4,
                "capacity {cap}"
            );
        }
    }

    /// A small deterministic generator (xorshift), so the orders repeat.
    fn xorshift(state: &mut u64) -> u64 {
        *state ^= *state << 13;
        *state ^= *state >> 7;
        *state ^= *state << 17;
        *state
    }

    #[test]
    fn a_burst_gives_its_slots_back_in_any_order() {
        for order in ["created", "reversed", "shuffled"] {
            let mut s: Slab<ArrayK, u32> = Slab::new(0, &S);
            let keep = s.insert(u32::MAX);
            let empty = s.bytes_held();
            let mut ids: Vec<_> = (0..10_000).map(|i| s.insert(i)).collect();
            assert!(s.bytes_held() > 100 * empty.max(64));
            match order {
                "reversed" => ids.reverse(),
                "shuffled" => {
                    let mut st = 0x9E37_79B9_7F4A_7C15;
                    for i in (1..ids.len()).rev() {
                        ids.swap(i, xorshift(&mut st) as usize % (i + 1));
                    }
                }
                _ => {}
            }
            for (k, &id) in ids.iter().enumerate() {
                assert!(s.remove(id).is_some());
                if k % 997 == 0 {
                    check_invariants(&s);
                }
            }
            check_invariants(&s);
            assert!(
                s.capacity_used() <= 1 + SLACK,
                "{order}: the survivor's slot and the slack"
            );
            assert!(s.bytes_held() <= 8 * (SLACK + 2) * std::mem::size_of::<Slot<u32>>());
            assert_eq!(s.get(keep), Some(&u32::MAX));
            // Old ids stay dead, and the slots handed out again are fresh ones.
            assert!(
                ids.iter()
                    .all(|&id| s.get(id).is_none() && s.remove(id).is_none())
            );
            let again: Vec<_> = (0..100).map(|i| s.insert(i)).collect();
            assert!(again.iter().all(|a| !ids.contains(a) && a.index >= 1));
            assert!(again.iter().zip(0..).all(|(&a, i)| s.get(a) == Some(&i)));
            check_invariants(&s);
        }
    }

    #[test]
    fn a_survivor_keeps_the_slots_below_it_and_they_are_reused_first() {
        let mut s: Slab<ArrayK, u32> = Slab::new(0, &S);
        let ids: Vec<_> = (0..10_000).map(|i| s.insert(i)).collect();
        let survivor = ids[5_000];
        for &id in ids.iter().filter(|&&id| id != survivor) {
            s.remove(id);
        }
        check_invariants(&s);
        assert_eq!(s.capacity_used(), 5_001);
        // The 5,000 vacant slots below the survivor are reused before the slab grows,
        // never the survivor's, and each once.
        let again: Vec<_> = (0..5_000).map(|i| s.insert(i + 20_000)).collect();
        assert_eq!(s.capacity_used(), 5_001);
        check_invariants(&s);
        assert_eq!(s.get(survivor), Some(&5_000));
        assert!(
            again
                .iter()
                .zip(20_000..)
                .all(|(&a, i)| s.get(a) == Some(&i))
        );
        assert_eq!(s.insert(0).index, 5_001, "then it grows");
    }

    #[test]
    fn random_inserts_and_removes_keep_the_slab_true() {
        let mut s: Slab<ArrayK, u32> = Slab::new(0, &S);
        let mut model: Vec<(ArrayId, u32)> = Vec::new();
        let mut st = 0x2545_F491_4F6C_DD1D;
        for step in 0..40_000u32 {
            // Phases of growth and of shrinking, so the tail swings both ways.
            let grow = (step / 5_000) % 2 == 0;
            let r = xorshift(&mut st);
            if model.is_empty() || (r % 10 < 7) == grow {
                model.push((s.insert(step), step));
            } else {
                let (id, v) = model.swap_remove(r as usize / 10 % model.len());
                assert_eq!(s.remove(id), Some(v));
                assert_eq!(s.remove(id), None);
            }
            if step % 1_000 == 0 {
                check_invariants(&s);
                assert!(model.iter().all(|&(id, v)| s.get(id) == Some(&v)));
            }
        }
        for (id, v) in model.drain(..) {
            assert_eq!(s.remove(id), Some(v));
        }
        check_invariants(&s);
        assert_eq!(s.len(), 0);
        assert!(s.capacity_used() <= SLACK);
    }

    /// The engine's slabs and lists give a burst's memory back: a closed manager's
    /// million-array burst (here 50,000) leaves its shard's array slab as it was, and
    /// a long-lived manager's list shrinks as its arrays are closed one by one.
    #[test]
    fn a_freed_burst_leaves_the_engine_as_it_was() {
        use crate::{DType, NDManager};
        let me = super::super::shard::my_shard();
        let held = || super::super::shard::shard(me).read().arrays.bytes_held();
        let m = NDManager::new();
        let a = m.zeros([2], DType::F32);
        let before = held();
        let burst = NDManager::new();
        for _ in 0..50_000 {
            burst.zeros([1], DType::F32);
        }
        assert!(held() > before + 50_000 * 100);
        burst.close();
        assert!(
            held() <= before.max(64 * 256),
            "{} against {before}",
            held()
        );
        let list_cap = || {
            let sh = super::super::shard::shard(me).read();
            sh.entry_ref(m.id).map_or(0, |e| e.arrays.capacity())
        };
        // 50,000 arrays of `m` made, then closed one by one: `cap` (a list's capacity)
        // grows past them, then falls back.
        let one_by_one = |cap: &dyn Fn() -> usize, list: &str| {
            let xs: Vec<_> = (0..50_000).map(|_| m.zeros([1], DType::F32)).collect();
            assert!(cap() >= 50_000);
            for x in xs {
                x.close();
            }
            assert!(cap() <= 64, "the {list} list shrank to {}", cap());
        };
        one_by_one(&list_cap, "manager's");
        assert!(held() <= before.max(64 * 256));
        // So does an open scope's list.
        let scope = crate::NDScope::new();
        let sid = super::super::shard::CURRENT_SCOPE
            .with(|c| c.get())
            .expect("open");
        let scope_cap = || {
            let sh = super::super::shard::shard(sid.shard).read();
            sh.scopes.get(sid).map_or(0, |r| r.arrays.capacity())
        };
        one_by_one(&scope_cap, "scope's");
        drop(scope);
        assert_eq!(a.to_vec::<f32>().unwrap(), vec![0.0; 2]);
        m.close();
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
