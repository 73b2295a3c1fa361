//! The engine: the one place that owns buffers and array records.
//!
//! # Design
//!
//! Public handles (`NDArray`, `NDManager`, `NDScope`) are typed ids ([`slab::Id`]:
//! shard, slot, serial); they never hold pointers. The rest of the crate calls the
//! functions of this module, named for what they do; nothing outside `engine/` sees a
//! lock or a record.
//!
//! * **Shards** ([`shard`]): each thread that uses ndscope owns a shard (an `RwLock`)
//!   holding the records of the arrays, buffers and scopes it creates and its share of
//!   every manager. The common case (a thread working on arrays it created, in its own
//!   scopes) locks only its own shard, so independent threads never contend. An
//!   operation that reaches into other shards asks which ones it touches
//!   ([`shard::lock_needed`]) and locks exactly those, in index order; an op that only
//!   reads another thread's arrays takes that shard shared. A thread's shard outlives
//!   it (the next new thread adopts it), so arrays outlive their thread.
//! * **Array record** ([`records::ArrayRec`]): data, layout, dtype, owning
//!   manager and its position in that manager's list (in the shard), scope
//!   registrations (scope id + position in the scope's list), retain count, tape holds,
//!   creation site, gradient. Positions make every link and unlink O(1) (swap-remove
//!   and fix the moved entry), so creating, registering, escaping, unregistering and
//!   freeing never search.
//! * **Data** ([`records::Store`]): an array that is the only viewer of its buffer (most
//!   arrays: op results, parameters, batches) keeps the buffer in its record, charged to
//!   it, so creating and freeing it touches nothing else. Its first view, or a large
//!   op reading it outside the lock, moves the buffer into a shared record:
//! * **Buffer** ([`records::BufMeta`]): an `Arc<Buffer>` plus the arrays of the shard
//!   that view it. Every array's buffer record is in its own shard: the data's home
//!   record where it was made, a proxy record in each other shard that views it, so a
//!   thread slicing another thread's data set works in its own shard. Its bytes are
//!   charged to one holder; when that holder dies the charge passes to another, so
//!   views never double-count and a view outliving its base keeps its bytes accounted.
//! * **Managers** ([`managers`]): the tree (parent, children, name, cap, resources) is
//!   one global table, touched only by manager operations and by the first array of a
//!   manager in a shard. Each shard keeps an entry per manager with the arrays it owns
//!   there and that shard's counters of its subtree; `memory()` sums the shards.
//! * **Scopes** ([`scopes`]): a scope's record lives in its thread's shard with the
//!   arrays registered in it. The innermost open scope of each thread is a
//!   thread-local id. A scope closes under its shard's lock; the few arrays whose
//!   release reaches other shards are released right after, each under its own locks.
//!   An async task's scope ([`tasks`]) is one record per shard its future was polled
//!   on, so a scope follows its task across worker threads.
//! * A freed record leaves a tombstone ([`records::Tomb`]) in its shard's graveyard
//!   ring (the last [`shard::CLOSED_DETAILS_KEPT`] frees of that shard) that makes
//!   use-after-close errors say what the array was and where and why it was freed.
//! * **Ops** ([`exec`]): the op path resolves inputs, runs a backend kernel and registers
//!   the result. Kernels and buffers live in the backend layer (`crate::backend`), which
//!   sees slices, [`Layout`]s and dtypes and imports nothing from here. [`exec`] says
//!   when a lock is held. User code (a [`Resource`]'s `close`) never runs under a lock.
//! * **Gradients** ([`grads`]): what autograd asks of the engine (a parameter's
//!   gradient, zeroing and accumulating gradients in place under one lock, what
//!   recording an op reads, tape holds).
//!
//! Lock order: shards in index order, then the global manager table. A manager close
//! additionally serialises on its own lock, taken before any other.

mod arrays;
mod count_alloc;
mod devices;
mod exec;
mod grads;
mod inplace;
mod managers;
pub(crate) mod oplog;
mod records;
mod scopes;
mod shard;
pub(crate) mod slab;
mod storage;
mod tasks;

pub(crate) use crate::backend::cpu::Buffer;
pub(crate) use crate::layout::Layout;
pub use count_alloc::CountingAllocator;
pub(crate) use devices::{device_of, gpu_arrays, move_data};
#[cfg(feature = "gpu")]
pub(crate) use exec::create_stored;
pub(crate) use exec::{
    Operand, OperandMut, Output, broadcast_view, create, full_beside, host_copy, materialize, read,
    run_op, run_op_on, unsupported,
};
pub(crate) use grads::{
    TapeInfo, add_into, add_to_grads, drop_grad, grad, hold_all, install_grad, is_mine, is_param,
    loss_info, tape_info, unhold_all, zero_fill, zero_my_param_grads,
};
pub(crate) use inplace::{run_inplace, run_inplace_on};
pub(crate) use managers::{SYSTEM, Stats};
pub(crate) use records::Cause;
pub use records::Resource;
pub(crate) use slab::{ArrayId, MgrId, ScopeId};
pub(crate) use storage::Storage;
pub(crate) use tasks::{
    close_task, current_scope, current_task_records, open_task_record, replace_current_scope,
    scopes_stats, set_task_parent, task_escape, this_shard,
};

use crate::error::{ArrayDesc, Result, SourceLocation};
use crate::{DType, Shape};
use exec::lock_arrays;
use records::ScopeRec;
use shard::{Ctx, Shards, lock_needed, my_shard};

/// Lock the shard of `id` alone (metadata of the record only).
#[inline]
fn lock_record(id: ArrayId) -> Ctx {
    Ctx::one(id.shard)
}

/// Lock what freeing `id` may touch (usually just its shard).
#[inline]
fn lock_for_free(id: ArrayId) -> Ctx {
    let ctx = lock_record(id);
    if let Ctx::One(_, sh) = &ctx
        && sh.free_is_local(id)
    {
        return ctx;
    }
    drop(ctx);
    lock_needed(&[id.shard], |ctx, out| ctx.free_shards(id, out))
}

// -------------------------------------------------------------------- arrays

pub(crate) fn shape(id: ArrayId) -> Result<Shape> {
    Ok(lock_record(id).array(id)?.layout.shape.clone())
}

pub(crate) fn dtype(id: ArrayId) -> Result<DType> {
    Ok(lock_record(id).array(id)?.dtype)
}

pub(crate) fn manager_of(id: ArrayId) -> Result<MgrId> {
    Ok(lock_record(id).array(id)?.manager)
}

pub(crate) fn is_live(id: ArrayId) -> bool {
    lock_record(id).is_live(id)
}

pub(crate) fn desc(id: ArrayId) -> Result<Box<ArrayDesc>> {
    lock_record(id).desc(id)
}

/// Free `id` now, whatever its count (idempotent).
pub(crate) fn close_array(id: ArrayId, at: SourceLocation) {
    lock_for_free(id).free_array(id, Some(at), Cause::Explicit);
}

/// Move `id` to manager `to` (`SYSTEM` detaches).
pub(crate) fn attach(id: ArrayId, to: MgrId) -> Result<()> {
    lock_arrays(&[id]).attach(id, to)
}

/// Move `id` to `to` until `to` closes, then back home.
pub(crate) fn temp_attach(id: ArrayId, to: MgrId) -> Result<()> {
    lock_arrays(&[id]).temp_attach(id, to)
}

pub(crate) fn retain(id: ArrayId) -> Result<u32> {
    lock_record(id).retain(id)
}

pub(crate) fn release(id: ArrayId, at: SourceLocation) -> Result<bool> {
    lock_for_free(id).release(id, at)
}

pub(crate) fn ref_count(id: ArrayId) -> Result<u32> {
    lock_record(id).ref_count(id)
}

// -------------------------------------------------------------------- scopes

pub(crate) fn open_scope(at: SourceLocation) -> ScopeId {
    let me = my_shard();
    let mut ctx = Ctx::one(me);
    let id = ctx.open_scope(me, at);
    ctx.unlock();
    id
}

/// Close scope `sid` of this thread and every scope opened inside it. Returns the
/// resources to close once no lock is held.
pub(crate) fn close_scope(
    sid: ScopeId,
    at: Option<SourceLocation>,
) -> Result<Vec<Box<dyn Resource>>> {
    // This thread's scopes live in its shard: close them under that lock, freeing
    // what can be freed there; the few arrays whose release reaches other shards
    // follow, each under its own locks.
    let mut ctx = Ctx::one(sid.shard);
    if current_scope() == Some(sid) {
        // The common case, the innermost scope: the chain is `sid` alone (what
        // `close_chain` finds first), with no list to build and no look-up first
        // (`close_scopes` skips a scope that is already closed).
        return Ok(close_then_release(ctx, &[sid], at));
    }
    if ctx.sh(sid.shard).scopes.get(sid).is_none() {
        return Ok(Vec::new()); // already closed (e.g. by an outer scope)
    }
    let chain = ctx.close_chain(sid)?;
    Ok(close_then_release(ctx, &chain, at))
}

/// Close the scopes of `chain` under `ctx` (freeing what can be freed there), then
/// release the few arrays whose release reaches other shards, each under its own
/// locks. Returns the resources to close once no lock is held.
fn close_then_release(
    mut ctx: Ctx,
    chain: &[ScopeId],
    at: Option<SourceLocation>,
) -> Vec<Box<dyn Resource>> {
    let mut later = Vec::new();
    let resources = ctx.close_scopes(chain, at, &mut later);
    ctx.unlock();
    if later.is_empty() {
        return resources; // the common case: every array was freed under `ctx`
    }
    for (id, c, cause) in later {
        lock_needed(&[id.shard], |ctx, out| ctx.free_shards(id, out))
            .drop_registration(id, c, cause, at);
    }
    resources
}

/// Lock what unlinking `id` from its scopes (and from `also`) touches.
fn lock_scopes_of(id: ArrayId, also: Option<ScopeId>) -> Ctx {
    if also.is_none_or(|sid| sid.shard == id.shard) {
        // The common case: the array and its scopes live in one shard and no scope
        // lists another shard's array. Checked under that shard's lock alone, with no
        // list of shards to build.
        let ctx = lock_record(id);
        if let Ctx::One(s, sh) = &ctx
            && also.is_none_or(|sid| records::scope_is_local(*s, &sh.scopes, sid))
            && sh.arrays.get(id).is_none_or(|r| {
                r.scopes
                    .iter()
                    .all(|&(sid, _)| records::scope_is_local(*s, &sh.scopes, sid))
            })
        {
            return ctx;
        }
    }
    let mut first: Shards = smallvec::smallvec![id.shard];
    if let Some(sid) = also {
        shard::add(&mut first, sid.shard);
    }
    lock_needed(&first, |ctx, out| {
        if let Some(sid) = also {
            ctx.unlink_shards(sid, out);
        }
        if let Some(r) = ctx.shr(id.shard).arrays.get(id) {
            for &(s, _) in &r.scopes {
                ctx.unlink_shards(s, out);
            }
        }
    })
}

/// Lock what registering `id` in scope `sid` (or moving it from there) touches.
fn lock_scope_and(sid: ScopeId, id: ArrayId) -> Ctx {
    lock_scopes_of(id, Some(sid))
}

pub(crate) fn escape(sid: ScopeId, id: ArrayId) -> Result<()> {
    lock_scope_and(sid, id).escape(sid, id)
}

/// Register `id` in scope `sid` (one more reference).
pub(crate) fn register(sid: ScopeId, id: ArrayId) -> Result<()> {
    let mut ctx = lock_scope_and(sid, id);
    ctx.array(id)?;
    ctx.register(sid, id);
    Ok(())
}

/// Remove `id` from every scope.
pub(crate) fn unregister_all(id: ArrayId) -> Result<()> {
    lock_scopes_of(id, None).unregister_all(id)
}

/// Close `r` with scope `sid`; gives it back if the scope is closed.
pub(crate) fn scope_add_resource(
    sid: ScopeId,
    r: Box<dyn Resource>,
) -> std::result::Result<(), Box<dyn Resource>> {
    Ctx::one(sid.shard).scope_add_resource(sid, r)
}

/// The arrays registered in scope `sid` now.
pub(crate) fn scope_arrays(sid: ScopeId) -> Vec<ArrayId> {
    let mut ctx = Ctx::one(sid.shard);
    ctx.sh(sid.shard)
        .scopes
        .get(sid)
        .map(|s| s.arrays.clone())
        .unwrap_or_default()
}

/// Where scope `sid` was opened, if it is open.
pub(crate) fn scope_opened_at(sid: ScopeId) -> Option<SourceLocation> {
    let mut ctx = Ctx::one(sid.shard);
    ctx.sh(sid.shard)
        .scopes
        .get(sid)
        .map(|s: &ScopeRec| s.opened_at)
}

/// Counters of the arrays registered in scope `sid` (buffers shared by several of
/// them count once).
pub(crate) fn scope_stats(sid: ScopeId) -> Stats {
    scopes_stats(&[sid])
}

// -------------------------------------------------------------------- managers

pub(crate) use managers::{
    add_resource as manager_add_resource, arrays as manager_arrays, begin_peak_window,
    cap as cap_manager, children as manager_children, device as manager_device, end_peak_window,
    is_capped, name as manager_name, name_of as manager_name_of, new_manager,
    parent as manager_parent, reset_peak, set_name as set_manager_name, stats,
    tree as manager_tree,
};

/// `ManagerClosed` unless `mid` is open (checked in this thread's shard: an entry
/// there proves it open, so repeated checks touch no shared state).
pub(crate) fn check_manager(mid: MgrId) -> Result<()> {
    let me = my_shard();
    Ctx::one(me).sh(me).entry(mid).map(|_| ())
}

/// Close a manager and its subtree; its resources close after every lock is released.
pub(crate) fn close_manager(mid: MgrId, at: SourceLocation) {
    close_resources(managers::close(mid, at));
}

/// One live array as a leak report sees it.
pub(crate) struct LiveArray {
    pub manager: MgrId,
    pub created_at: SourceLocation,
    pub bytes: usize,
}

/// The live arrays owned directly by each of `managers`, with their charged bytes.
pub(crate) fn live_arrays(managers: &[MgrId]) -> Vec<LiveArray> {
    let ctx = Ctx::all();
    let mut out = Vec::new();
    for s in ctx.held() {
        let sh = ctx.shr(s);
        for &m in managers {
            let Some(e) = sh.entry_ref(m) else { continue };
            for &id in &e.arrays {
                let Ok(r) = ctx.array(id) else { continue };
                out.push(LiveArray {
                    manager: m,
                    created_at: r.created_at,
                    bytes: ctx.charged_bytes(id),
                });
            }
        }
    }
    out
}

/// Close resources outside every lock (innermost/most recent first). Every resource
/// is closed even if one panics; the first panic is then resumed.
pub(crate) fn close_resources(resources: Vec<Box<dyn Resource>>) {
    if resources.is_empty() {
        return; // most scopes own no resource: no unwind guard to set up
    }
    let mut first_panic = None;
    for mut r in resources {
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| r.close()));
        if let Err(p) = result {
            first_panic.get_or_insert(p);
        }
    }
    if let Some(p) = first_panic {
        std::panic::resume_unwind(p);
    }
}
