//! Scopes on locked shards. A scope's record lives in the shard of the thread that
//! opened it; an array registered in it may live in another shard (an array made on
//! another thread and registered by hand), in which case the operation holds both.
//!
//! An async task's scope (`crate::task`) is one record per shard it was polled on,
//! each an ordinary scope of that shard (so a thread's chain of open scopes never
//! leaves its shard), tagged with a [`TaskTag`] that records how the task ended.

use super::arrays::RegDrop;
use super::records::{Cause, Resource, ScopeRec};
use super::shard::{CURRENT_SCOPE, Ctx, Shards, add};
use super::slab::{ArrayId, ScopeId};
use crate::error::{NdError, Result, SourceLocation, TaskEnd};
use smallvec::SmallVec;

/// What makes a scope record part of an async task's scope.
pub(crate) struct TaskTag {
    /// How the task ended, recorded in its arrays' tombstones when the record closes
    /// (set just before; `Cancelled` until then).
    pub end: TaskEnd,
    /// The task's first record; it lists all of them (`members`).
    pub primary: ScopeId,
    /// On the primary record: every record of the task, itself included.
    pub members: SmallVec<[ScopeId; 2]>,
}

impl ScopeRec {
    /// What freeing an array registered here records.
    #[inline]
    fn cause(&self) -> Cause {
        match &self.task {
            None => Cause::Scope(self.opened_at),
            Some(t) => Cause::Task(self.opened_at, t.end),
        }
    }
}

pub(crate) fn current_scope() -> Option<ScopeId> {
    CURRENT_SCOPE.with(|c| c.get())
}

impl Ctx {
    /// Register `id` in scope `sid` (no-op if it already is or the scope is closed).
    pub(crate) fn register(&mut self, sid: ScopeId, id: ArrayId) {
        if sid.shard == id.shard {
            // The common case (an array made on this thread): one shard.
            let sh = self.sh(sid.shard);
            let Some(scope) = sh.scopes.get_mut(sid) else {
                return;
            };
            let r = sh.arrays.get_mut(id).expect("registering a live array");
            if r.scopes.iter().any(|&(s, _)| s == sid) {
                return;
            }
            r.scopes.push((sid, scope.arrays.len() as u32));
            r.clear_orphaned();
            scope.arrays.push(id);
            return;
        }
        let Some(scope) = self.shr(sid.shard).scopes.get(sid) else {
            return;
        };
        let pos = scope.arrays.len() as u32;
        let r = self.array_mut(id);
        if r.scopes.iter().any(|&(s, _)| s == sid) {
            return;
        }
        r.scopes.push((sid, pos));
        r.clear_orphaned();
        let scope = self.sh(sid.shard).scopes.get_mut(sid).expect("checked");
        scope.arrays.push(id);
        if id.shard != sid.shard && !scope.foreign.contains(&id.shard) {
            scope.foreign.push(id.shard);
        }
    }

    /// Remove the entry at `pos` of scope `sid`'s list, fixing the moved entry.
    pub(crate) fn scope_unlink_at(&mut self, sid: ScopeId, pos: usize) {
        let Some(scope) = self.sh(sid.shard).scopes.get_mut(sid) else {
            return;
        };
        scope.arrays.swap_remove(pos);
        super::slab::shrink(&mut scope.arrays);
        if let Some(&moved) = scope.arrays.get(pos) {
            let r = self.array_mut(moved);
            if let Some(e) = r.scopes.iter_mut().find(|(s, _)| *s == sid) {
                e.1 = pos as u32;
            }
        }
    }

    /// Drop `id`'s registration in `sid`; returns whether it had one.
    pub(crate) fn unregister_from(&mut self, sid: ScopeId, id: ArrayId) -> bool {
        let Some(r) = self.sh(id.shard).arrays.get_mut(id) else {
            return false;
        };
        let Some(i) = r.scopes.iter().position(|&(s, _)| s == sid) else {
            return false;
        };
        let (_, pos) = r.scopes.swap_remove(i);
        self.scope_unlink_at(sid, pos as usize);
        true
    }

    /// Move `id`'s registration in `sid` to `sid`'s parent scope (or drop it at the
    /// outermost scope). Arrays not registered in `sid` are left alone.
    pub(crate) fn escape(&mut self, sid: ScopeId, id: ArrayId) -> Result<()> {
        self.array(id)?;
        if self.unregister_from(sid, id) {
            let parent = self.shr(sid.shard).scopes.get(sid).and_then(|s| s.parent);
            if let Some(p) = parent {
                self.register(p, id);
            }
        }
        Ok(())
    }

    /// Remove `id` from every scope: it lives with its manager from now on, so a
    /// tape-held array whose scope already closed is no longer freed when the tape
    /// lets go of it.
    pub(crate) fn unregister_all(&mut self, id: ArrayId) -> Result<()> {
        self.array(id)?;
        self.array_mut(id).clear_orphaned();
        while let Some((sid, pos)) = self.array_mut(id).scopes.pop() {
            self.scope_unlink_at(sid, pos as usize);
        }
        Ok(())
    }

    /// Open a scope of this thread in shard `s` (this thread's).
    pub(crate) fn open_scope(&mut self, s: u32, at: SourceLocation) -> ScopeId {
        let id = self.insert_scope(s, at, current_scope());
        CURRENT_SCOPE.with(|c| c.set(Some(id)));
        id
    }

    /// A new scope record in shard `s`, a child of `parent` (whose shard must be held),
    /// not made current.
    fn insert_scope(&mut self, s: u32, at: SourceLocation, parent: Option<ScopeId>) -> ScopeId {
        let depth = self.depth_below(parent);
        let sh = self.sh(s);
        let arrays = sh.spare_lists.pop().unwrap_or_default();
        sh.scopes.insert(ScopeRec {
            parent,
            depth,
            arrays,
            foreign: SmallVec::new(),
            opened_at: at,
            resources: Vec::new(),
            task: None,
        })
    }

    /// Open a record of an async task's scope in shard `s` (this thread's), a child of
    /// `parent` (this thread's current scope), without making it current. `primary` is
    /// the task's first record (`None`: this is the first); the new record is added
    /// to its member list. Shard `s` and the shards of `parent` and `primary` must be
    /// held.
    pub(crate) fn open_task_record(
        &mut self,
        s: u32,
        at: SourceLocation,
        parent: Option<ScopeId>,
        primary: Option<ScopeId>,
    ) -> ScopeId {
        let id = self.insert_scope(s, at, parent);
        let tag = TaskTag {
            end: TaskEnd::Cancelled,
            primary: primary.unwrap_or(id),
            members: SmallVec::new(),
        };
        self.sh(s).scopes.get_mut(id).expect("just inserted").task = Some(Box::new(tag));
        let p = primary.unwrap_or(id);
        if let Some(t) = self
            .sh(p.shard)
            .scopes
            .get_mut(p)
            .and_then(|r| r.task.as_mut())
        {
            t.members.push(id);
        }
        id
    }

    /// The depth of a child of `parent` (whose shard must be held).
    fn depth_below(&self, parent: Option<ScopeId>) -> u32 {
        parent
            .and_then(|p| self.shr(p.shard).scopes.get(p))
            .map_or(0, |p| p.depth + 1)
    }

    /// Make `parent` the parent of scope `sid` (a task record that is now polled where
    /// `parent` is current). Both shards must be held.
    pub(crate) fn set_parent(&mut self, sid: ScopeId, parent: Option<ScopeId>) {
        let depth = self.depth_below(parent);
        if let Some(r) = self.sh(sid.shard).scopes.get_mut(sid) {
            r.parent = parent;
            r.depth = depth;
        }
    }

    /// Append to `chain` the open scopes from `innermost` up to the task record `rec`
    /// (innermost first), and record `end` on `rec`. If `rec` is not above
    /// `innermost` (which should not happen), only `rec`.
    pub(crate) fn task_chain(
        &mut self,
        rec: ScopeId,
        innermost: ScopeId,
        end: TaskEnd,
        chain: &mut SmallVec<[ScopeId; 8]>,
    ) {
        let start = chain.len();
        let mut cur = Some(innermost);
        while let Some(c) = cur {
            chain.push(c);
            if c == rec || !self.holds(c.shard) {
                break;
            }
            cur = self.shr(c.shard).scopes.get(c).and_then(|s| s.parent);
        }
        if chain.last() != Some(&rec) {
            chain.truncate(start);
            chain.push(rec);
        }
        if let Some(t) = self
            .sh(rec.shard)
            .scopes
            .get_mut(rec)
            .and_then(|r| r.task.as_mut())
        {
            t.end = end;
        }
    }

    /// The records of the innermost async task whose scope is open on this thread
    /// (walking up from its innermost scope, in this thread's shard `s`, held).
    pub(crate) fn current_task_primary(&self, s: u32) -> Option<ScopeId> {
        let mut cur = current_scope();
        while let Some(c) = cur {
            if c.shard != s {
                return None;
            }
            let r = self.shr(s).scopes.get(c)?;
            if let Some(t) = &r.task {
                return Some(t.primary);
            }
            cur = r.parent;
        }
        None
    }

    /// The member records of the task whose primary record is `primary` (held).
    pub(crate) fn task_members(&self, primary: ScopeId) -> SmallVec<[ScopeId; 2]> {
        self.shr(primary.shard)
            .scopes
            .get(primary)
            .and_then(|r| r.task.as_ref())
            .map(|t| t.members.clone())
            .unwrap_or_default()
    }

    /// The scopes a close of `sid` closes: from this thread's innermost up to `sid`.
    pub(crate) fn close_chain(&self, sid: ScopeId) -> Result<SmallVec<[ScopeId; 4]>> {
        let mut chain = SmallVec::new();
        let mut cur = current_scope();
        while let Some(c) = cur {
            chain.push(c);
            if c == sid {
                return Ok(chain);
            }
            let rec = self.shr(c.shard).scopes.get(c);
            if rec.is_some_and(|s| s.task.is_some()) {
                // An async task being polled: the scopes outside it belong to whoever
                // polls it, and the task's own scope closes only when the task ends.
                return Err(NdError::Scope {
                    msg: "this scope is outside the async task (`scope_async`) being \
                          polled: it cannot be closed from inside the task"
                        .into(),
                });
            }
            cur = rec.and_then(|s| s.parent);
        }
        Err(NdError::Scope {
            msg: "this scope is not open on the current thread".into(),
        })
    }

    /// Add the shards unlinking an entry of scope `sid` touches to `out`.
    pub(crate) fn unlink_shards(&self, sid: ScopeId, out: &mut Shards) {
        add(out, sid.shard);
        if self.holds(sid.shard)
            && let Some(s) = self.shr(sid.shard).scopes.get(sid)
        {
            for &f in &s.foreign {
                add(out, f);
            }
        }
    }

    /// Close the scopes of `chain` (innermost first; they live in locked shards).
    /// Returns the resources to close once no lock is held. An array whose release
    /// needs a shard not held here (another thread's array, the last view of another
    /// thread's data) is pushed to `later` for [`Ctx::drop_registration`] under its
    /// own locks.
    pub(crate) fn close_scopes(
        &mut self,
        chain: &[ScopeId],
        at: Option<SourceLocation>,
        later: &mut Vec<(ArrayId, ScopeId, Cause)>,
    ) -> Vec<Box<dyn Resource>> {
        let mut resources = Vec::new();
        for &c in chain {
            let Some(mut scope) = self.sh(c.shard).scopes.remove(c) else {
                continue;
            };
            let cause = scope.cause();
            for id in scope.arrays.drain(..) {
                if !self.holds(id.shard) {
                    later.push((id, c, cause));
                    continue;
                }
                // The common case in one lookup: the array's shard is all it touches.
                match self.sh(id.shard).drop_registration_here(id, c, cause) {
                    RegDrop::Kept => {}
                    RegDrop::Free => {
                        self.free_array(id, at, cause);
                    }
                    RegDrop::Elsewhere => {
                        let mut need = Shards::new();
                        self.free_shards(id, &mut need);
                        if need.iter().all(|&s| self.holds(s)) {
                            self.free_registered(id, c, cause, at);
                        } else {
                            later.push((id, c, cause));
                        }
                    }
                }
            }
            if !scope.resources.is_empty() {
                resources.extend(scope.resources.into_iter().rev());
            }
            CURRENT_SCOPE.with(|cs| cs.set(scope.parent));
            // Keep the emptied list for the next scope (a steady loop then opens scopes
            // without allocating); drop very large or surplus ones.
            let sh = self.sh(c.shard);
            if sh.spare_lists.len() < 64 && scope.arrays.capacity() <= 1 << 16 {
                sh.spare_lists.push(scope.arrays);
            }
        }
        resources
    }

    /// Drop `id`'s registration in the closed scope `c` and free it (recording
    /// `cause`, from [`ScopeRec::cause`]) if nothing else holds it.
    pub(crate) fn drop_registration(
        &mut self,
        id: ArrayId,
        c: ScopeId,
        cause: Cause,
        at: Option<SourceLocation>,
    ) {
        match self.sh(id.shard).drop_registration_here(id, c, cause) {
            RegDrop::Kept => {}
            RegDrop::Free => {
                self.free_array(id, at, cause);
            }
            RegDrop::Elsewhere => self.free_registered(id, c, cause, at),
        }
    }

    /// [`RegDrop::Elsewhere`]: nothing but `c` holds live array `id`; drop that
    /// registration and free the array across the shards the caller locked.
    fn free_registered(
        &mut self,
        id: ArrayId,
        c: ScopeId,
        cause: Cause,
        at: Option<SourceLocation>,
    ) {
        let r = self.sh(id.shard).arrays.get_mut(id).expect("checked live");
        if let Some(i) = r.scopes.iter().position(|&(s, _)| s == c) {
            r.scopes.swap_remove(i);
        }
        self.free_array(id, at, cause);
    }

    pub(crate) fn scope_add_resource(
        &mut self,
        sid: ScopeId,
        r: Box<dyn Resource>,
    ) -> std::result::Result<(), Box<dyn Resource>> {
        match self.sh(sid.shard).scopes.get_mut(sid) {
            Some(s) => {
                s.resources.push(r);
                Ok(())
            }
            None => Err(r),
        }
    }
}
