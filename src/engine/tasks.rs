//! The operations behind async task scopes (`crate::task`). A task's scope is one record
//! per shard it was polled on: a poll makes the record of the polling thread's shard
//! current, so arrays register in their own shard and a thread's chain of open scopes
//! stays in its shard.

use super::managers::Stats;
use super::records::Resource;
use super::scopes;
use super::shard::{self, Ctx, Shards, lock_needed, my_shard};
use super::slab::{ArrayId, ScopeId};
use crate::error::{Result, SourceLocation};

/// This thread's shard index.
#[inline]
pub(crate) fn this_shard() -> u32 {
    my_shard()
}

/// This thread's innermost open scope.
#[inline]
pub(crate) fn current_scope() -> Option<ScopeId> {
    scopes::current_scope()
}

/// Make `sid` this thread's innermost scope; returns the one it replaces.
#[inline]
pub(crate) fn replace_current_scope(sid: Option<ScopeId>) -> Option<ScopeId> {
    shard::CURRENT_SCOPE.with(|c| c.replace(sid))
}

/// Open a record of an async task's scope in this thread's shard, a child of `parent`
/// (this thread's current scope), without making it current. `primary`: the task's
/// first record, `None` for the first.
pub(crate) fn open_task_record(
    at: SourceLocation,
    parent: Option<ScopeId>,
    primary: Option<ScopeId>,
) -> ScopeId {
    let me = my_shard();
    let mut shards: Shards = smallvec::smallvec![me];
    parent.inspect(|p| shard::add(&mut shards, p.shard));
    primary.inspect(|p| shard::add(&mut shards, p.shard));
    Ctx::set(&shards).open_task_record(me, at, parent, primary)
}

/// Make `parent` the parent of task record `rec` (where its output escapes to).
pub(crate) fn set_task_parent(rec: ScopeId, parent: Option<ScopeId>) {
    let mut shards: Shards = smallvec::smallvec![rec.shard];
    parent.inspect(|p| shard::add(&mut shards, p.shard));
    Ctx::set(&shards).set_parent(rec, parent);
}

/// A task's output array `id`: if it is registered in any of the task's records
/// `recs`, drop those registrations and register it in `to` (or in no scope).
pub(crate) fn task_escape(recs: &[ScopeId], to: Option<ScopeId>, id: ArrayId) -> Result<()> {
    let mut first: Shards = smallvec::smallvec![id.shard];
    recs.iter().for_each(|r| shard::add(&mut first, r.shard));
    to.inspect(|t| shard::add(&mut first, t.shard));
    let mut ctx = lock_needed(&first, |ctx, out| {
        for &r in recs {
            ctx.unlink_shards(r, out);
        }
    });
    ctx.array(id)?;
    let mut moved = false;
    for &r in recs {
        moved |= ctx.unregister_from(r, id);
    }
    if moved && let Some(t) = to {
        ctx.register(t, id);
    }
    Ok(())
}

/// Close a task's scope: for each `(record, innermost)`, the scopes from `innermost`
/// (a scope opened inside the task and left open, or the record itself) up to the
/// record; the freed arrays record that the task ended by `end`. Sets this thread's
/// current scope as a close does (the caller restores it). Returns the resources to
/// close once no lock is held.
pub(crate) fn close_task(
    parts: &[(ScopeId, ScopeId)],
    end: crate::error::TaskEnd,
) -> Vec<Box<dyn Resource>> {
    let mut shards = Shards::new();
    for &(rec, cur) in parts {
        shard::add(&mut shards, rec.shard);
        shard::add(&mut shards, cur.shard);
    }
    let mut ctx = Ctx::set(&shards);
    let mut chain = smallvec::SmallVec::<[ScopeId; 8]>::new();
    for &(rec, cur) in parts {
        ctx.task_chain(rec, cur, end, &mut chain);
    }
    super::close_then_release(ctx, &chain, None)
}

/// The records of the innermost async task whose poll is running on this thread.
pub(crate) fn current_task_records() -> Option<smallvec::SmallVec<[ScopeId; 2]>> {
    let me = my_shard();
    let primary = Ctx::one(me).current_task_primary(me)?;
    Some(Ctx::one(primary.shard).task_members(primary))
}

/// Counters of the arrays registered in any of `sids` (an array or buffer counts
/// once).
pub(crate) fn scopes_stats(sids: &[ScopeId]) -> Stats {
    let mut ctx = Ctx::all();
    let mut ids = Vec::new();
    for &sid in sids {
        if let Some(s) = ctx.sh(sid.shard).scopes.get(sid) {
            ids.extend_from_slice(&s.arrays);
        }
    }
    ids.sort_unstable_by_key(|i| (i.shard, i.index, i.serial));
    ids.dedup();
    let mut seen = std::collections::HashSet::new();
    let mut stats = Stats {
        arrays: ids.len(),
        ..Stats::default()
    };
    for id in ids {
        if let Ok(o) = ctx.operand(id)
            && seen.insert(o.buffer_addr())
        {
            stats.buffers += 1;
            stats.bytes += o.buffer_bytes();
        }
    }
    stats.peak = stats.bytes;
    stats
}
