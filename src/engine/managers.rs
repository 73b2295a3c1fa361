//! Managers: one global table for the tree (parent, children, name, cap, resources),
//! and in every shard an entry per manager that has arrays there ([`MgrEntry`]: the
//! arrays it owns in that shard and that shard's counters for its subtree).
//!
//! The hot path never touches the global table: a shard that already has an entry for
//! a manager knows it is open (a close removes its entries from every shard before the
//! manager's slot can be reused) and whether it is capped. The first array of a
//! manager in a shard looks the manager up in the global table (that shard's lock is
//! held; the global lock is always taken last) and creates the entry and its
//! ancestors' entries.
//!
//! Counters are kept per shard for each manager's subtree (an ancestor walk over the
//! entries of the shard, which only its thread touches); `memory()` sums them over the
//! shards. Peaks are per shard too: a manager's reported peak is the sum of its
//! shards' peaks, exact when one thread uses it and otherwise an upper bound of the
//! true simultaneous peak (threads do not share a clock per op).

use super::records::{Cause, Resource};
use super::shard::{Ctx, Shard};
use super::slab::{ArrayId, Graveyard, ManagerK, MgrId, Serials, Slab};
use crate::Device;
use crate::error::{NdError, Result, SourceLocation};
use parking_lot::{Mutex, MutexGuard};

/// Live counters of a manager's subtree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    pub arrays: usize,
    pub buffers: usize,
    pub bytes: usize,
    pub peak: usize,
    pub allocations: u64,
}

impl MgrEntry {
    /// Add deltas to this entry's counters; the parent, whose counters take them next.
    #[inline(always)]
    fn count(&mut self, arrays: isize, buffers: isize, bytes: isize, allocs: u64) -> Option<MgrId> {
        let s = &mut self.stats;
        s.arrays = s.arrays.wrapping_add_signed(arrays);
        s.buffers = s.buffers.wrapping_add_signed(buffers);
        s.bytes = s.bytes.wrapping_add_signed(bytes);
        s.allocations += allocs;
        s.peak = s.peak.max(s.bytes);
        self.parent
    }
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.arrays += o.arrays;
        self.buffers += o.buffers;
        self.bytes += o.bytes;
        self.peak += o.peak;
        self.allocations += o.allocations;
    }
}

/// A manager's part in one shard.
pub(crate) struct MgrEntry {
    pub id: MgrId,
    pub parent: Option<MgrId>,
    pub capped: bool,
    /// The arrays of this shard the manager owns directly.
    pub arrays: Vec<ArrayId>,
    /// This shard's counters for the manager's whole subtree.
    pub stats: Stats,
}

/// A manager, its parent and whether it is capped.
type TreeInfo = (MgrId, Option<MgrId>, bool);

/// The global part of a manager.
pub(crate) struct MgrRec {
    pub parent: Option<MgrId>,
    parent_pos: u32,
    pub children: Vec<MgrId>,
    pub name: String,
    pub capped: bool,
    /// Where the manager's arrays live (inherited from the parent).
    pub device: Device,
    /// Set at the start of a close: no shard may create an entry for it any more.
    closing: bool,
    resources: Vec<Box<dyn Resource>>,
}

pub(crate) struct Managers {
    slab: Slab<ManagerK, MgrRec>,
    /// Names of recently closed managers.
    graves: Graveyard<ManagerK, String>,
}

static MANAGER_SERIALS: Serials = Serials::new();
static MANAGERS: Mutex<Managers> = Mutex::new(Managers {
    slab: Slab::new(0, &MANAGER_SERIALS),
    graves: Graveyard::new(1024),
});
/// Manager closes run one at a time (a close spans several lock phases).
static CLOSING: Mutex<()> = Mutex::new(());

/// The system manager's id: the root of the manager tree, never closed.
pub(crate) const SYSTEM: MgrId = MgrId::new(0, 0, 1);

/// Lock the global manager table (creating the system manager on first use).
pub(crate) fn table() -> MutexGuard<'static, Managers> {
    let mut g = MANAGERS.lock();
    if g.slab.len() == 0 {
        let id = g
            .slab
            .insert(MgrRec::new("system".into(), None, 0, Device::Cpu));
        debug_assert_eq!(id, SYSTEM);
    }
    g
}

impl MgrRec {
    fn new(name: String, parent: Option<MgrId>, parent_pos: u32, device: Device) -> Self {
        MgrRec {
            parent,
            parent_pos,
            children: Vec::new(),
            name,
            capped: false,
            device,
            closing: false,
            resources: Vec::new(),
        }
    }
}

impl Managers {
    pub(crate) fn get(&self, id: MgrId) -> Result<&MgrRec> {
        match self.slab.get(id) {
            Some(m) => Ok(m),
            None => Err(self.closed_error(id)),
        }
    }

    fn get_mut(&mut self, id: MgrId) -> Result<&mut MgrRec> {
        self.get(id)?;
        Ok(self.slab.get_mut(id).expect("checked live"))
    }

    #[cold]
    fn closed_error(&self, id: MgrId) -> NdError {
        NdError::ManagerClosed {
            name: self.name_of(id),
        }
    }

    fn name_of(&self, id: MgrId) -> String {
        match self.slab.get(id) {
            Some(m) => m.name.clone(),
            None => match self.graves.find(id) {
                Some(name) => name.clone(),
                None => format!("#{}", id.uid()),
            },
        }
    }

    /// The ancestors chain of an open manager that may take arrays, from `id` up.
    fn chain(&self, id: MgrId) -> Result<smallvec::SmallVec<[TreeInfo; 4]>> {
        let mut out = smallvec::SmallVec::new();
        let mut cur = Some(id);
        while let Some(c) = cur {
            let m = self.get(c)?;
            if m.closing {
                return Err(self.closed_error(c));
            }
            out.push((c, m.parent, m.capped));
            cur = m.parent;
        }
        Ok(out)
    }

    /// `id` and its whole subtree, children before parents, the latest child first.
    fn subtree_post_order(&self, id: MgrId) -> Vec<MgrId> {
        let mut out = Vec::new();
        fn walk(t: &Managers, id: MgrId, out: &mut Vec<MgrId>) {
            if let Some(m) = t.slab.get(id) {
                // Latest child first, as a close pops its parent's list.
                for &c in m.children.iter().rev() {
                    walk(t, c, out);
                }
                out.push(id);
            }
        }
        walk(self, id, &mut out);
        out
    }
}

/// `ManagerCapped` for `mgr`.
#[cold]
#[inline(never)]
fn capped(mgr: MgrId) -> NdError {
    NdError::ManagerCapped { name: name_of(mgr) }
}

/// A manager's name, also after it closed (`#uid` once forgotten).
pub(crate) fn name_of(id: MgrId) -> String {
    table().name_of(id)
}

impl Shard {
    /// This shard's entry for manager `id`, created (with its ancestors') on first use.
    /// Fails if the manager is closed. Does not check the cap.
    #[inline]
    pub(crate) fn entry(&mut self, id: MgrId) -> Result<&mut MgrEntry> {
        let i = id.index as usize;
        let have = matches!(self.mgrs.get(i), Some(Some(e)) if e.id == id);
        if !have {
            self.create_entries(id)?;
        }
        Ok(self.mgrs[i].as_mut().expect("entry present"))
    }

    /// The entry of an open manager known to have one here.
    #[inline]
    pub(crate) fn entry_mut(&mut self, id: MgrId) -> &mut MgrEntry {
        match self.mgrs.get_mut(id.index as usize) {
            Some(Some(e)) if e.id == id => e,
            _ => panic!("ndscope engine invariant: no shard entry for a live owner"),
        }
    }

    /// The entry for `id` if this shard has one.
    pub(crate) fn entry_ref(&self, id: MgrId) -> Option<&MgrEntry> {
        match self.mgrs.get(id.index as usize) {
            Some(Some(e)) if e.id == id => Some(e),
            _ => None,
        }
    }

    #[cold]
    fn create_entries(&mut self, id: MgrId) -> Result<()> {
        let chain = table().chain(id)?;
        for (mid, parent, capped) in chain {
            let i = mid.index as usize;
            if self.mgrs.len() <= i {
                self.mgrs.resize_with(i + 1, || None);
            }
            if matches!(&self.mgrs[i], Some(e) if e.id == mid) {
                break; // its ancestors have entries too
            }
            self.mgrs[i] = Some(MgrEntry {
                id: mid,
                parent,
                capped,
                arrays: Vec::new(),
                stats: Stats::default(),
            });
        }
        Ok(())
    }

    /// An entry for a manager that is closing (a close sends arrays home to it).
    fn force_entry(&mut self, id: MgrId, parent: Option<MgrId>, capped: bool) {
        let i = id.index as usize;
        if self.mgrs.len() <= i {
            self.mgrs.resize_with(i + 1, || None);
        }
        if !matches!(&self.mgrs[i], Some(e) if e.id == id) {
            self.mgrs[i] = Some(MgrEntry {
                id,
                parent,
                capped,
                arrays: Vec::new(),
                stats: Stats::default(),
            });
        }
    }

    /// `ManagerClosed` or `ManagerCapped` unless `mgr` takes new arrays.
    /// Its entry here otherwise.
    /// (Inlined into every insert: the error is built out of line.)
    #[inline(always)]
    pub(crate) fn accepts(&mut self, mgr: MgrId) -> Result<&mut MgrEntry> {
        let e = self.entry(mgr)?;
        if e.capped {
            return Err(capped(mgr));
        }
        Ok(e)
    }

    /// Add deltas to a manager's counters and its ancestors' (in this shard).
    #[inline]
    pub(crate) fn adjust(
        &mut self,
        mid: MgrId,
        arrays: isize,
        buffers: isize,
        bytes: isize,
        allocs: u64,
    ) {
        self.count_from(Some(mid), arrays, buffers, bytes, allocs);
    }

    /// [`Shard::adjust`] from `next` up (nothing for `None`).
    #[inline(always)]
    fn count_from(
        &mut self,
        mut next: Option<MgrId>,
        arrays: isize,
        buffers: isize,
        bytes: isize,
        allocs: u64,
    ) {
        while let Some(mid) = next {
            next = self.entry_mut(mid).count(arrays, buffers, bytes, allocs);
        }
    }

    /// List array `id` under `mgr` (whose entry exists: [`Shard::accepts`]) and count
    /// it there and above, `buffers`, `bytes` and `allocs` with it; its position in the
    /// list. One look-up of the entry serves the list and the first counters.
    #[inline(always)]
    pub(crate) fn link(
        &mut self,
        mgr: MgrId,
        id: ArrayId,
        buffers: isize,
        bytes: isize,
        allocs: u64,
    ) -> u32 {
        let e = self.entry_mut(mgr);
        e.arrays.push(id);
        let pos = (e.arrays.len() - 1) as u32;
        let up = e.count(1, buffers, bytes, allocs);
        self.count_from(up, 1, buffers, bytes, allocs);
        pos
    }

    /// Take the array at `pos` of `mgr`'s list out of it (the last one moves into its
    /// place, and its record learns the position) and uncount it there and above,
    /// `buffers` and `bytes` (signed deltas) with it.
    #[inline(always)]
    pub(crate) fn unlink(&mut self, mgr: MgrId, pos: usize, buffers: isize, bytes: isize) {
        let e = self.entry_mut(mgr);
        e.arrays.swap_remove(pos);
        super::slab::shrink(&mut e.arrays);
        let moved = e.arrays.get(pos).copied();
        let up = e.count(-1, buffers, bytes, 0);
        self.count_from(up, -1, buffers, bytes, 0);
        if let Some(moved) = moved {
            self.arrays
                .get_mut(moved)
                .expect("listed array is live")
                .mgr_pos = pos as u32;
        }
    }
}

/// Entries for `id` (a closing manager) and its ancestors in shard `sh`.
fn force_entries(sh: &mut Shard, id: MgrId, closing: &[TreeInfo]) {
    let mut cur = Some(id);
    while let Some(c) = cur {
        if sh.entry_ref(c).is_some() {
            return;
        }
        match closing.iter().find(|i| i.0 == c) {
            Some(&(_, parent, capped)) => {
                sh.force_entry(c, parent, capped);
                cur = parent;
            }
            None => {
                // An open ancestor outside the closing subtree.
                let _ = sh.entry(c);
                return;
            }
        }
    }
}

// ------------------------------------------------------------------ the tree

/// A new child of `parent`, on `device` (`None`: the parent's).
pub(crate) fn new_manager(
    parent: MgrId,
    name: Option<String>,
    device: Option<Device>,
) -> Result<MgrId> {
    let mut t = table();
    let p = t.get(parent)?;
    if p.closing {
        return Err(t.closed_error(parent));
    }
    let pos = p.children.len() as u32;
    let device = device.unwrap_or(p.device);
    let id = t
        .slab
        .insert(MgrRec::new(String::new(), Some(parent), pos, device));
    t.slab.get_mut(id).expect("just inserted").name =
        name.unwrap_or_else(|| format!("manager#{}", id.uid()));
    t.get_mut(parent).expect("checked").children.push(id);
    Ok(id)
}

/// The manager's device.
pub(crate) fn device(id: MgrId) -> Result<Device> {
    Ok(table().get(id)?.device)
}

pub(crate) fn check_open(id: MgrId) -> Result<()> {
    table().get(id).map(|_| ())
}

pub(crate) fn parent(id: MgrId) -> Result<Option<MgrId>> {
    Ok(table().get(id)?.parent)
}

pub(crate) fn children(id: MgrId) -> Result<Vec<MgrId>> {
    Ok(table().get(id)?.children.clone())
}

/// The manager's name, or `ManagerClosed` (which carries the remembered name).
pub(crate) fn name(id: MgrId) -> Result<String> {
    Ok(table().get(id)?.name.clone())
}

pub(crate) fn set_name(id: MgrId, name: String) {
    if let Ok(m) = table().get_mut(id) {
        m.name = name;
    }
}

pub(crate) fn is_capped(id: MgrId) -> bool {
    table().get(id).is_ok_and(|m| m.capped)
}

/// Stop `id` from taking arrays: in the table, then in every shard's entry.
pub(crate) fn cap(id: MgrId) {
    match table().get_mut(id) {
        Ok(m) => m.capped = true,
        Err(_) => return,
    }
    for s in 0..super::shard::shard_count() as u32 {
        let mut sh = super::shard::shard(s).write();
        if let Some(Some(e)) = sh.mgrs.get_mut(id.index as usize)
            && e.id == id
        {
            e.capped = true;
        }
    }
}

pub(crate) fn add_resource(
    id: MgrId,
    r: Box<dyn Resource>,
) -> std::result::Result<(), (NdError, Box<dyn Resource>)> {
    let mut t = table();
    match t.get_mut(id) {
        Ok(m) => {
            m.resources.push(r);
            Ok(())
        }
        Err(e) => Err((e, r)),
    }
}

/// Counters of `id`'s subtree, summed over the shards (all locked: one instant).
pub(crate) fn stats(id: MgrId) -> Result<Stats> {
    check_open(id)?;
    let ctx = Ctx::all();
    let mut total = Stats::default();
    for s in ctx.held() {
        if let Some(e) = ctx.shr(s).entry_ref(id) {
            total.add(&e.stats);
        }
    }
    Ok(total)
}

/// The arrays `id` owns directly, over every shard.
pub(crate) fn arrays(id: MgrId) -> Result<Vec<ArrayId>> {
    check_open(id)?;
    let ctx = Ctx::all();
    let mut out = Vec::new();
    for s in ctx.held() {
        if let Some(e) = ctx.shr(s).entry_ref(id) {
            out.extend_from_slice(&e.arrays);
        }
    }
    Ok(out)
}

/// Set every peak to the current bytes.
pub(crate) fn reset_peak() {
    let mut ctx = Ctx::all();
    for s in ctx.held() {
        for e in ctx.sh(s).mgrs.iter_mut().flatten() {
            e.stats.peak = e.stats.bytes;
        }
    }
}

/// Start measuring the process peak from now: returns the saved peaks for
/// [`end_peak_window`].
pub(crate) fn begin_peak_window() -> Vec<usize> {
    let mut ctx = Ctx::all();
    let mut saved = Vec::new();
    for s in ctx.held() {
        let sh = ctx.sh(s);
        let e = sh.entry(SYSTEM).expect("system is open");
        saved.push(e.stats.peak);
        e.stats.peak = e.stats.bytes;
    }
    saved
}

/// The process peak reached since `begin_peak_window`; restores the overall peaks.
pub(crate) fn end_peak_window(saved: &[usize]) -> usize {
    let mut ctx = Ctx::all();
    let mut window = 0;
    for s in ctx.held() {
        let e = ctx.sh(s).entry(SYSTEM).expect("system is open");
        window += e.stats.peak;
        let before = saved.get(s as usize).copied().unwrap_or(0);
        e.stats.peak = e.stats.peak.max(before);
    }
    window
}

/// Close a manager and its subtree. Returns the resources to close once no lock is
/// held. The system manager is never closed.
pub(crate) fn close(mid: MgrId, at: SourceLocation) -> Vec<Box<dyn Resource>> {
    if mid == SYSTEM {
        return Vec::new();
    }
    let _one_at_a_time = CLOSING.lock();
    // 1. Mark the subtree closing: no shard creates entries for it from now on.
    let order_info = {
        let mut t = table();
        if t.slab.get(mid).is_none() {
            return Vec::new();
        }
        let order = t.subtree_post_order(mid);
        let mut info = Vec::with_capacity(order.len());
        for &m in &order {
            let r = t.slab.get_mut(m).expect("live");
            r.closing = true;
            info.push((m, r.parent, r.capped));
        }
        info
    };
    let order: Vec<MgrId> = order_info.iter().map(|i| i.0).collect();
    // 2. Free their arrays (or send temporarily attached ones home) in every shard.
    {
        let mut ctx = Ctx::all();
        let shards = ctx.held();
        for (k, &m) in order.iter().enumerate() {
            for &s in &shards {
                while let Some(id) = ctx
                    .sh(s)
                    .entry_ref(m)
                    .and_then(|e| e.arrays.last().copied())
                {
                    // A temporarily attached array goes home if its home is still open
                    // (also a manager of this subtree that closes later: it is freed
                    // then, with that manager named as the cause).
                    let home = ctx.array_mut(id).temp_home();
                    let returned = home.is_some_and(|h| {
                        if let Some(j) = order.iter().position(|&o| o == h) {
                            if j < k {
                                return false;
                            }
                            force_entries(ctx.sh(s), h, &order_info);
                        }
                        ctx.attach(id, h).is_ok()
                    });
                    if !returned {
                        ctx.free_array(id, Some(at), Cause::Manager(m));
                    }
                }
                let sh = ctx.sh(s);
                if let Some(slot) = sh.mgrs.get_mut(m.index as usize)
                    && slot.as_ref().is_some_and(|e| e.id == m)
                {
                    *slot = None;
                }
            }
        }
    }
    // 3. Forget them in the tree.
    let mut out = Vec::new();
    let mut t = table();
    for &m in &order {
        let mut rec = t.slab.remove(m).expect("live");
        t.graves.bury(m, std::mem::take(&mut rec.name));
        out.extend(rec.resources.into_iter().rev());
        if let Some(p) = rec.parent
            && let Some(pr) = t.slab.get_mut(p)
        {
            let pos = rec.parent_pos as usize;
            pr.children.swap_remove(pos);
            if let Some(&moved) = pr.children.get(pos) {
                t.slab.get_mut(moved).expect("sibling").parent_pos = pos as u32;
            }
        }
    }
    out
}

/// The tree below `root` (pre-order with depths).
pub(crate) fn tree(root: MgrId) -> Result<Vec<(MgrId, usize, String, bool)>> {
    let t = table();
    t.get(root)?;
    let mut out = Vec::new();
    let mut stack = vec![(root, 0usize)];
    while let Some((id, d)) = stack.pop() {
        let Ok(m) = t.get(id) else { continue };
        out.push((id, d, m.name.clone(), m.capped));
        for &c in m.children.iter().rev() {
            stack.push((c, d + 1));
        }
    }
    Ok(out)
}
