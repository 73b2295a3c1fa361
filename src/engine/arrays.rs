//! Array lifecycle on locked shards: insert, free, move between managers, reference
//! counts and tape holds. Every function here runs on a [`Ctx`] that holds the locks of
//! the shards it touches; [`Ctx::free_shards`] tells the callers in `mod.rs` which
//! shards those are.

#[cfg(not(feature = "untracked"))]
use super::records::Tomb;
use super::records::{ArrayRec, BufMeta, Cause, ColdRec, ScopeRec, Store};
use super::shard::{CURRENT_SCOPE, Ctx, Shard, Shards, add};
use super::slab::{ArrayId, BufId, BufferK, MgrId, ScopeId, ScopeK, Slab};
use super::{Layout, Storage};
use crate::config;
use crate::error::{Result, SourceLocation};
use crate::{DType, Device};
use smallvec::SmallVec;
use std::sync::Arc;

/// Where a new array's data comes from.
pub(crate) enum Data {
    /// A fresh buffer, laid out contiguously.
    New(Storage),
    /// A view of an existing buffer.
    Share(BufId),
}

#[inline]
fn backtrace() -> Option<Arc<str>> {
    if config::verbose() {
        capture_backtrace()
    } else {
        None
    }
}

#[cold]
#[inline(never)]
fn capture_backtrace() -> Option<Arc<str>> {
    Some(Arc::from(
        std::backtrace::Backtrace::force_capture().to_string(),
    ))
}

/// What [`Shard::drop_registration_here`] did.
pub(crate) enum RegDrop {
    /// The array lives on (or was already dead).
    Kept,
    /// The registration is gone and nothing holds the array: free it now.
    Free,
    /// Freeing it would touch another shard: nothing was done.
    Elsewhere,
}

impl Shard {
    /// Whether freeing `id` (of this shard) touches no other shard: the fast check
    /// before [`Ctx::free_shards`].
    #[inline]
    pub(crate) fn free_is_local(&self, id: ArrayId) -> bool {
        let Some(r) = self.arrays.get(id) else {
            return true; // nothing to free
        };
        Self::rec_free_is_local(id.shard, r, &self.scopes, &self.buffers)
            && r.grad
                .is_none_or(|g| g.shard == id.shard && self.free_is_local(g))
    }

    /// [`Shard::free_is_local`] for record `r` of this shard `s`, but for its gradient
    /// (takes the two slabs it reads, so a caller may hold `r` mutably).
    #[inline]
    fn rec_free_is_local(
        s: u32,
        r: &ArrayRec,
        scopes: &Slab<ScopeK, ScopeRec>,
        buffers: &Slab<BufferK, BufMeta>,
    ) -> bool {
        r.scopes
            .iter()
            .all(|&(sc, _)| super::records::scope_is_local(s, scopes, sc))
            && match r.store {
                Store::Own(_) => true,
                Store::Shared(b) => buffers.get(b).is_none_or(|m| {
                    // Data only this shard views, or not the last holder of its
                    // record: nothing outside this shard changes.
                    (m.home.is_none() && m.proxies.is_empty()) || m.holders.len() > 1
                }),
            }
    }

    /// What a closing scope `c` does to its array `id` of this shard, in one lookup:
    /// drop the registration, mark a tape-held orphan, and say whether the array is
    /// now to be freed. A free that might touch another shard, or that also frees a
    /// gradient, is left to the caller untouched ([`RegDrop::Elsewhere`]), for
    /// [`Ctx::drop_registration`] under the locks it needs.
    #[inline(always)]
    pub(crate) fn drop_registration_here(
        &mut self,
        id: ArrayId,
        c: ScopeId,
        cause: Cause,
    ) -> RegDrop {
        let Shard {
            arrays,
            scopes,
            buffers,
            ..
        } = self;
        let Some(r) = arrays.get_mut(id) else {
            return RegDrop::Kept;
        };
        let at = r.scopes.iter().position(|&(x, _)| x == c);
        let others = r.scopes.len() - usize::from(at.is_some());
        let frees = others == 0 && r.retains == 0 && r.holds == 0;
        if frees && (r.grad.is_some() || !Self::rec_free_is_local(id.shard, r, scopes, buffers)) {
            return RegDrop::Elsewhere;
        }
        if let Some(i) = at {
            r.scopes.swap_remove(i);
        }
        if frees {
            return RegDrop::Free;
        }
        if others == 0 && r.retains == 0 {
            // Kept for a gradient tape (`holds > 0`); its last `unhold` frees it,
            // recording this close's cause (a scope's, or an async task's and how it
            // ended).
            r.cold_mut().orphaned = Some(cause);
        }
        RegDrop::Kept
    }

    /// An `Arc` around `buf`, reusing a spare shell when one is kept.
    pub(crate) fn wrap_buffer(&mut self, buf: Storage) -> Arc<Storage> {
        match self.spare_arcs.pop() {
            Some(mut shell) => {
                *Arc::get_mut(&mut shell).expect("spare shells are unique") = buf;
                shell
            }
            None => Arc::new(buf),
        }
    }

    /// Release a dead buffer's block to the pool and keep its `Arc` shell for reuse
    /// (when no snapshot shares it; a snapshot's drop frees both then).
    fn recycle_arc(&mut self, mut arc: Arc<Storage>) {
        const MAX_SPARE_ARCS: usize = 1024;
        if let Some(b) = Arc::get_mut(&mut arc) {
            *b = Storage::empty();
            if self.spare_arcs.len() < MAX_SPARE_ARCS {
                self.spare_arcs.push(arc);
            }
        }
    }
}

impl Ctx {
    /// Add the shards freeing `id` touches to `out`: its own, its buffer's (and, when
    /// `id` is charged for a buffer viewed from several shards, the next holder's,
    /// which takes over the charge), its scopes' (and theirs, see
    /// [`Ctx::unlink_shards`]), and its gradient's. Reads only locked shards; a shard
    /// it cannot look into yet is added for the caller's next round.
    pub(crate) fn free_shards(&self, id: ArrayId, out: &mut Shards) {
        add(out, id.shard);
        if !self.holds(id.shard) {
            return;
        }
        let Some(r) = self.shr(id.shard).arrays.get(id) else {
            return; // nothing to free
        };
        // The buffer record is in this shard; its last holder's free may drop a proxy
        // (touching the home) or pass the charge to another shard's record.
        if let Store::Shared(b) = r.store
            && let m = self.buffer(b)
            && (m.home.is_some() || !m.proxies.is_empty())
        {
            let home = m.home_of(b);
            // The last holder of a record drops a proxy from its home, and if charged
            // passes the charge to another record.
            if m.holders.len() == 1 {
                add(out, home.shard);
                if m.carries
                    && self.holds(home.shard)
                    && let Some(hm) = self.shr(home.shard).buffers.get(home)
                {
                    for p in &hm.proxies {
                        add(out, p.shard);
                    }
                }
            }
        }
        for &(sc, _) in &r.scopes {
            self.unlink_shards(sc, out);
        }
        if let Some(g) = r.grad {
            self.free_shards(g, out);
        }
    }

    /// Register a new array in `mgr` (and in this thread's innermost scope) in shard
    /// `s`, which the caller holds exclusively; a view's buffer record (from
    /// [`Ctx::view_buffer`]) is in `s` too.
    pub(crate) fn insert_array(
        &mut self,
        s: u32,
        mgr: MgrId,
        data: Data,
        layout: Layout,
        dtype: DType,
        at: SourceLocation,
    ) -> Result<ArrayId> {
        let sh = self.sh(s);
        let mgr_pos = sh.accepts(mgr)?.arrays.len() as u32;
        #[cfg(feature = "gpu")]
        super::devices::count_array(
            match &data {
                Data::New(buf) => buf.device(),
                Data::Share(b) => sh.buffers.get(*b).map_or(Device::Cpu, |m| m.buf.device()),
            },
            1,
        );
        let (store, new_bytes, shared) = match data {
            // A new buffer stays in its array's record until something shares it.
            Data::New(buf) => {
                let bytes = buf.bytes();
                (Store::Own(buf), bytes, None)
            }
            Data::Share(b) => {
                debug_assert_eq!(b.shard, s, "views use a buffer record of their shard");
                (Store::Shared(b), 0, Some(b))
            }
        };
        let id = sh.arrays.insert_with(|| ArrayRec {
            store,
            layout,
            dtype,
            manager: mgr,
            mgr_pos,
            scopes: SmallVec::new(),
            retains: 0,
            holds: 0,
            created_at: at,
            grad: None,
            cold: backtrace().map(|bt| {
                Box::new(ColdRec {
                    created_bt: Some(bt),
                    ..Default::default()
                })
            }),
        });
        let pos = match shared {
            // A new buffer is charged to its array; a view adds only an array.
            None => sh.link(mgr, id, 1, new_bytes as isize, 1),
            Some(b) => {
                let pos = sh.link(mgr, id, 0, 0, 0);
                let meta = sh.buffers.get_mut(b).expect("live buffer");
                meta.holders.push(id);
                pos
            }
        };
        debug_assert_eq!(pos, mgr_pos, "the record's position in its manager's list");
        if let Some(scope) = CURRENT_SCOPE.with(|c| c.get()) {
            self.register(scope, id);
        }
        Ok(id)
    }

    /// A buffer record in shard `s` through which an array of `s` can view buffer
    /// `b` (of a locked shard): `b` itself, its home, or this shard's proxy of it
    /// (created on first use, which needs the home's shard locked).
    pub(crate) fn view_buffer(&mut self, s: u32, b: BufId) -> BufId {
        if b.shard == s {
            return b;
        }
        let home = self.buffer(b).home_of(b);
        if home.shard == s {
            return home;
        }
        let hm = self.shr(home.shard).buffers.get(home).expect("live home");
        if let Some(&p) = hm.proxies.iter().find(|p| p.shard == s) {
            return p;
        }
        let buf = hm.buf.clone();
        let p = self.sh(s).buffers.insert(BufMeta {
            buf,
            holders: Default::default(),
            carries: false,
            home: Some(home),
            proxies: SmallVec::new(),
        });
        let hm = self
            .sh(home.shard)
            .buffers
            .get_mut(home)
            .expect("live home");
        hm.proxies.push(p);
        p
    }

    /// Drop `id` from its buffer's holders. When `id` was the holder charged for the
    /// buffer, returns its bytes and the holder that takes over the charge (the caller
    /// moves the charge: first off `id`'s manager, then onto the next holder's, so
    /// peaks never count it twice): the next holder of the same record, else the
    /// home's first, else the first proxy's (proxies in the order they were made).
    /// A proxy left without holders is dropped; the data is freed when no record
    /// holds it.
    fn remove_holder(&mut self, b: BufId, id: ArrayId) -> Option<(usize, Option<ArrayId>)> {
        let meta = self.sh(b.shard).buffers.get_mut(b).expect("live buffer");
        let bytes = meta.buf.bytes();
        let i = meta.holders.remove(id);
        let charged = meta.carries && i == 0;
        if let Some(next) = meta.holders.first() {
            return charged.then_some((bytes, Some(next)));
        }
        // The record has no holder left.
        meta.carries = false;
        let home = meta.home_of(b);
        if home != b {
            drop(self.sh(b.shard).buffers.remove(b));
            let hm = self
                .sh(home.shard)
                .buffers
                .get_mut(home)
                .expect("live home");
            hm.proxies.retain(|p| *p != b);
        }
        let hsh = self.sh(home.shard);
        let hm = hsh.buffers.get_mut(home).expect("live home");
        if hm.holders.is_empty() && hm.proxies.is_empty() {
            // Dropping the Arc frees the block unless an op outside the lock still
            // reads it, in which case that op's snapshot frees it.
            let hm = hsh.buffers.remove(home).expect("live");
            hsh.recycle_arc(hm.buf);
            return charged.then_some((bytes, None));
        }
        if !charged {
            return None;
        }
        if let Some(next) = hm.holders.first() {
            hm.carries = true;
            return Some((bytes, Some(next)));
        }
        let p = hm.proxies[0];
        let pm = self.sh(p.shard).buffers.get_mut(p).expect("live proxy");
        pm.carries = true;
        Some((bytes, pm.holders.first()))
    }

    /// Move an array to another manager, carrying its counts and buffer charge.
    fn move_array(&mut self, id: ArrayId, to: MgrId) -> Result<()> {
        let s = id.shard;
        self.sh(s).accepts(to)?;
        let (from, pos) = {
            let r = self.array(id)?;
            (r.manager, r.mgr_pos as usize)
        };
        if from == to {
            return Ok(());
        }
        let charge = self.charge(id);
        let charged = charge.is_some();
        let bytes = charge.unwrap_or(0) as isize;
        let sh = self.sh(s);
        sh.unlink(from, pos, -(charged as isize), -bytes);
        let new_pos = sh.link(to, id, charged as isize, bytes, 0);
        let r = sh.arrays.get_mut(id).expect("checked");
        r.manager = to;
        r.mgr_pos = new_pos;
        Ok(())
    }

    pub(crate) fn attach(&mut self, id: ArrayId, to: MgrId) -> Result<()> {
        self.move_array(id, to)?;
        if let Some(c) = &mut self.array_mut(id).cold {
            c.temp_home = None;
        }
        Ok(())
    }

    pub(crate) fn temp_attach(&mut self, id: ArrayId, to: MgrId) -> Result<()> {
        let home = {
            let r = self.array(id)?;
            r.temp_home().unwrap_or(r.manager)
        };
        self.move_array(id, to)?;
        self.array_mut(id).cold_mut().temp_home = Some(home);
        Ok(())
    }

    /// Free an array now, whatever its count. Returns false if it was already dead.
    #[cfg_attr(feature = "untracked", allow(clippy::only_used_in_recursion))]
    pub(crate) fn free_array(
        &mut self,
        id: ArrayId,
        at: Option<SourceLocation>,
        cause: Cause,
    ) -> bool {
        let s = id.shard;
        let Shard {
            arrays,
            graves,
            buffers,
            ..
        } = self.sh(s);
        let Some(r) = arrays.get_mut(id) else {
            return false;
        };
        // (Without a GPU backend every array is on the CPU: no lookup.)
        #[cfg(not(feature = "gpu"))]
        let _ = buffers;
        #[cfg(feature = "gpu")]
        let device = match &r.store {
            Store::Own(buf) => buf.device(),
            Store::Shared(b) => buffers.get(*b).map_or(Device::Cpu, |m| m.buf.device()),
        };
        #[cfg(feature = "gpu")]
        super::devices::count_array(device, -1);
        #[cfg(not(feature = "gpu"))]
        #[cfg_attr(feature = "untracked", allow(unused_variables))]
        let device = Device::Cpu;
        // Read what outlives the record straight from it (a record-sized copy read
        // back right after it is written stalls the loads), write its tombstone
        // straight into the graveyard ring, then drop the record where it lies: an own
        // buffer goes back to the pool.
        let (manager, mgr_pos, grad) = (r.manager, r.mgr_pos as usize, r.grad);
        // A parameter's gradient lives and dies with it (freed last, below).
        let store = match &r.store {
            Store::Own(buf) => Err(buf.bytes()),
            Store::Shared(b) => Ok(*b),
        };
        let scopes = std::mem::take(&mut r.scopes);
        #[cfg_attr(feature = "untracked", allow(unused_variables))]
        let cold = r.cold.take();
        #[cfg(not(feature = "untracked"))]
        graves.bury_with(id, || Tomb {
            shape: std::mem::take(&mut r.layout.shape),
            dtype: r.dtype,
            created_at: r.created_at,
            closed_at: at,
            cause,
            device,
        });
        #[cfg(feature = "untracked")]
        let _ = graves;
        arrays.remove_with(id, |_| ());
        for &(sid, pos) in &scopes {
            self.scope_unlink_at(sid, pos as usize);
        }
        // The charge the array carried, and the holder that takes it over (counted
        // after the array is uncounted, so no manager's peak sees both at once).
        let (charged, bytes, heir) = match store {
            Err(bytes) => (1, bytes, None),
            Ok(b) => match self.remove_holder(b, id) {
                Some((bytes, next)) => (1, bytes, next),
                None => (0, 0, None),
            },
        };
        self.sh(s)
            .unlink(manager, mgr_pos, -charged, -(bytes as isize));
        if let Some(n) = heir {
            let nm = self.array_mut(n).manager;
            self.sh(n.shard).adjust(nm, 0, 1, bytes as isize, 0);
        }
        #[cfg(not(feature = "untracked"))]
        {
            let sh = self.sh(s);
            let closed_bt = backtrace();
            let created_bt = cold.and_then(|c| c.created_bt);
            if created_bt.is_some() || closed_bt.is_some() {
                sh.traces.bury(id, (created_bt, closed_bt));
            }
        }
        if let Some(g) = grad {
            self.free_array(g, at, cause);
        }
        true
    }

    // ------------------------------------------------------------ counts and holds

    pub(crate) fn retain(&mut self, id: ArrayId) -> Result<u32> {
        self.array(id)?;
        let r = self.array_mut(id);
        r.retains += 1;
        Ok(r.retains + r.scopes.len() as u32)
    }

    pub(crate) fn ref_count(&self, id: ArrayId) -> Result<u32> {
        let r = self.array(id)?;
        Ok(r.retains + r.scopes.len() as u32)
    }

    /// Drop one reference; free the array when none is left. Returns whether it freed.
    pub(crate) fn release(&mut self, id: ArrayId, at: SourceLocation) -> Result<bool> {
        let r = self.array(id)?;
        let count = r.retains + r.scopes.len() as u32;
        if count <= 1 {
            self.free_array(id, Some(at), Cause::Release);
            return Ok(true);
        }
        if r.retains > 0 {
            self.array_mut(id).retains -= 1;
        } else {
            // Only scope registrations hold it: give up the innermost scope's.
            let scopes = r.scopes.clone();
            let (i, _) = scopes
                .iter()
                .enumerate()
                .max_by_key(|(_, (sid, _))| {
                    self.shr(sid.shard).scopes.get(*sid).map_or(0, |s| s.depth)
                })
                .expect("count > 1");
            let (sid, pos) = self.array_mut(id).scopes.swap_remove(i);
            self.scope_unlink_at(sid, pos as usize);
        }
        Ok(false)
    }

    /// A tape hold: keeps `id` alive past the close of its scopes until `unhold`.
    pub(crate) fn hold(&mut self, id: ArrayId) -> Result<()> {
        self.array(id)?;
        self.array_mut(id).holds += 1;
        Ok(())
    }

    /// Drop a tape hold; frees the array if it was the last hold and a scope close
    /// found the array held only by tapes. A freed array is ignored.
    pub(crate) fn unhold(&mut self, id: ArrayId) {
        let Some(r) = self.sh(id.shard).arrays.get_mut(id) else {
            return;
        };
        r.holds = r.holds.saturating_sub(1);
        if r.holds == 0
            && r.retains == 0
            && r.scopes.is_empty()
            && let Some(cause) = r.orphaned()
        {
            self.free_array(id, None, cause);
        }
    }
}
