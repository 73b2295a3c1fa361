//! The engine: the one place that owns buffers and array records.
//!
//! # Design
//!
//! A single [`Registry`] behind one global lock holds four generational slabs
//! ([`slab::Slab`]): array records, data buffers, managers and scopes. Public handles
//! (`NDArray`, `NDManager`, `NDScope`) are ids into it; they never hold pointers.
//!
//! * **Array record** ([`ArrayRec`]): buffer id, layout, dtype, owning manager and its
//!   position in that manager's list, scope registrations (scope id + position in the
//!   scope's list), retain count, creation site and (verbose) backtrace, and the home
//!   manager of a temporary attach. Positions make every link and unlink O(1)
//!   (swap-remove and fix the moved entry), so creating, registering, escaping,
//!   unregistering and freeing never search.
//! * **Buffer** ([`BufMeta`]): an `Arc<Buffer>` plus the arrays that view it. Its bytes
//!   are charged to the manager of its first holder; when that holder dies the charge
//!   passes to the next, so views never double-count and a view outliving its base keeps
//!   its bytes accounted.
//! * **Manager** ([`ManagerRec`]): parent link and position, children, owned arrays,
//!   and statistics for its whole subtree, kept exact by walking the (short) ancestor
//!   chain on every change. The system manager is the root, so its statistics are the
//!   process-wide ones.
//! * **Scope** ([`ScopeRec`]): its parent scope on the same thread and the arrays
//!   registered in it. The innermost open scope of each thread is a thread-local id.
//! * Autograd adds three fields to the array record (and nothing else to the engine):
//!   a parameter's gradient array (freed with the parameter), and tape holds with an
//!   `orphaned` mark, which keep an intermediate alive for a gradient tape past the
//!   close of its scope without counting as a user reference (see [`Registry::hold`]).
//! * A freed record leaves a tombstone ([`ClosedInfo`]) in a graveyard ring (the last
//!   [`CLOSED_DETAILS_KEPT`] frees) that makes use-after-close errors
//!   say what the array was and where and why it was freed.
//!
//! Ops run in [`run_op`]: inputs are resolved under the lock; small work is computed
//! right there (one lock round trip per op), large work is computed with the lock
//! released on `Arc` snapshots of the input buffers, which are marked as read outside
//! the lock so that in-place writers (always under the lock) wait for them. User code
//! (a [`crate::Resource`]'s `close`) never runs under the lock.

mod count_alloc;
pub(crate) mod kernels;
pub(crate) mod layout;
pub(crate) mod slab;
pub(crate) mod storage;

use crate::diag::{config, profile};
use crate::dtype::Native;
use crate::error::{ArrayDesc, CloseReason, ClosedInfo, NdError, Result, SourceLocation};
use crate::{DType, Shape};
pub use count_alloc::CountingAllocator;
pub(crate) use layout::Layout;
use parking_lot::{Mutex, MutexGuard};
pub(crate) use slab::Id;
use slab::{Graveyard, Slab};
use smallvec::SmallVec;
use std::cell::Cell;
use std::sync::Arc;
pub(crate) use storage::Buffer;

/// Something a manager or a scope owns and closes once when it closes.
///
/// Arrays are handled by the engine directly; implement this for your own native
/// handles, or use [`crate::NDList`], to make them live and die with a manager or scope.
pub trait Resource: Send {
    /// Release the resource. Called exactly once, never under the engine lock, so it may
    /// use ndscope freely.
    fn close(&mut self);
}

/// Inputs with at least this many elements in total are computed with the lock released.
const OUTSIDE_LOCK_WORK: usize = 1 << 15;

/// The system manager's id: the root of the manager tree, never closed.
pub(crate) const SYSTEM: Id = Id {
    index: 0,
    generation: 1,
};

pub(crate) struct ArrayRec {
    pub buffer: Id,
    pub layout: Layout,
    pub dtype: DType,
    pub manager: Id,
    mgr_pos: u32,
    scopes: SmallVec<[(Id, u32); 1]>,
    retains: u32,
    pub created_at: SourceLocation,
    #[cfg_attr(feature = "untracked", allow(dead_code))]
    created_bt: Option<Arc<str>>,
    temp_home: Option<Id>,
    // ---- autograd (see `crate::autograd`): a small, self-contained addition.
    /// The gradient array of a parameter (`set_requires_gradient(true)`); freed with it.
    pub grad: Option<Id>,
    /// Holds by gradient tapes: like retains they keep the array alive past the close of
    /// its scopes, but they are not user references (not in `ref_count`), so dropping
    /// the last one frees the array only if a scope close wanted to free it meanwhile.
    holds: u32,
    /// Set (to the scope's opening site) when a scope close left the array alive only
    /// because of tape holds; the last `unhold` then frees it.
    orphaned: Option<SourceLocation>,
}

/// Why an array was freed, as recorded on the hot path (expanded into a
/// [`CloseReason`] only when an error reports it).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cause {
    Explicit,
    Release,
    /// The scope opened at this line closed.
    Scope(SourceLocation),
    /// This manager closed (its name is looked up when reported).
    Manager(Id),
}

/// Backtraces at creation and at close (verbose mode).
type Traces = (Option<Arc<str>>, Option<Arc<str>>);

/// What a freed array was: the compact tombstone kept in the graveyard.
struct Tomb {
    shape: Shape,
    dtype: DType,
    created_at: SourceLocation,
    closed_at: Option<SourceLocation>,
    cause: Cause,
}

struct BufMeta {
    buf: Arc<Buffer>,
    /// Arrays viewing this buffer; the first is the one its bytes are charged to.
    holders: SmallVec<[Id; 2]>,
}

/// Live counters of a manager's subtree.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    pub arrays: usize,
    pub buffers: usize,
    pub bytes: usize,
    pub peak: usize,
    pub allocations: u64,
}

pub(crate) struct ManagerRec {
    parent: Option<Id>,
    parent_pos: u32,
    children: Vec<Id>,
    arrays: Vec<Id>,
    pub name: String,
    pub capped: bool,
    pub stats: Stats,
    resources: Vec<Box<dyn Resource>>,
}

pub(crate) struct ScopeRec {
    parent: Option<Id>,
    /// Nesting depth on its thread (outermost = 0), to find the innermost registration.
    depth: u32,
    arrays: Vec<Id>,
    pub opened_at: SourceLocation,
    resources: Vec<Box<dyn Resource>>,
}

pub(crate) struct Registry {
    arrays: Slab<ArrayRec>,
    /// What recently freed arrays were, for use-after-close errors.
    graves: Graveyard<Tomb>,
    /// Backtraces of recently freed arrays (verbose mode only).
    traces: Graveyard<Traces>,
    buffers: Slab<BufMeta>,
    /// Emptied `Arc<Buffer>` shells kept for reuse, so a new buffer costs no allocation
    /// for its `Arc` (the block itself comes from the caching pool).
    spare_arcs: Vec<Arc<Buffer>>,
    /// Emptied scope array lists kept for reuse by the next scopes.
    spare_lists: Vec<Vec<Id>>,
    managers: Slab<ManagerRec>,
    /// Names of recently closed managers.
    manager_graves: Graveyard<String>,
    scopes: Slab<ScopeRec>,
}

/// A freed array's details (creating line, close site and reason) survive this many
/// later frees; after that a use of it reports `NdError::ClosedUnknown`.
pub(crate) const CLOSED_DETAILS_KEPT: usize = 4096;

static ENGINE: Mutex<Registry> = Mutex::new(Registry {
    arrays: Slab::new(),
    graves: Graveyard::new(CLOSED_DETAILS_KEPT + 1),
    traces: Graveyard::new(CLOSED_DETAILS_KEPT + 1),
    buffers: Slab::new(),
    spare_arcs: Vec::new(),
    spare_lists: Vec::new(),
    managers: Slab::new(),
    manager_graves: Graveyard::new(1024),
    scopes: Slab::new(),
});

thread_local! {
    /// The innermost open scope of this thread.
    static CURRENT_SCOPE: Cell<Option<Id>> = const { Cell::new(None) };
}

/// Lock the registry (creating the system manager on first use).
pub(crate) fn lock() -> MutexGuard<'static, Registry> {
    let mut g = ENGINE.lock();
    if g.managers.len() == 0 {
        let id = g.managers.insert(ManagerRec::new("system".into(), None, 0));
        debug_assert_eq!(id, SYSTEM);
    }
    g
}

pub(crate) fn current_scope() -> Option<Id> {
    CURRENT_SCOPE.with(|c| c.get())
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

impl ManagerRec {
    fn new(name: String, parent: Option<Id>, parent_pos: u32) -> Self {
        ManagerRec {
            parent,
            parent_pos,
            children: Vec::new(),
            arrays: Vec::new(),
            name,
            capped: false,
            stats: Stats::default(),
            resources: Vec::new(),
        }
    }
}

/// Where a new array's data comes from.
pub(crate) enum Data {
    /// A fresh buffer, laid out contiguously.
    New(Buffer),
    /// A view of an existing buffer.
    Share(Id),
}

/// A resolved op input: read-only access to an array's data and metadata.
pub(crate) struct Operand<'a> {
    buf: &'a Buffer,
    pub layout: &'a Layout,
    pub dtype: DType,
    pub id: Id,
    pub created_at: SourceLocation,
    buffer_id: Id,
    /// The owning manager (an op's result goes to its first input's).
    manager: Id,
}

impl Operand<'_> {
    /// The whole buffer as `T` (index it with `layout`).
    pub(crate) fn data<T: Native>(&self) -> &[T] {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size_in_bytes());
        // SAFETY: operands exist only while the engine guarantees there is no writer
        // (under the lock with no in-place op running, or marked as outside readers,
        // which in-place writers wait for).
        unsafe { self.buf.slice::<T>() }
    }

    pub(crate) fn shape(&self) -> &Shape {
        &self.layout.shape
    }

    pub(crate) fn buffer_addr(&self) -> usize {
        self.buf.addr()
    }

    pub(crate) fn buffer_bytes(&self) -> usize {
        self.buf.bytes()
    }

    pub(crate) fn desc(&self) -> Box<ArrayDesc> {
        Box::new(ArrayDesc {
            uid: self.id.uid(),
            shape: self.layout.shape.clone(),
            dtype: self.dtype,
            created_at: self.created_at,
        })
    }
}

/// The writable target of an in-place op. `layout` may be narrowed (e.g. to a slice
/// of the target) before writing; it must stay within the target's buffer.
pub(crate) struct OperandMut<'a> {
    buf: &'a Buffer,
    pub layout: Layout,
    pub dtype: DType,
    pub id: Id,
    pub created_at: SourceLocation,
}

impl OperandMut<'_> {
    pub(crate) fn data_mut<T: Native>(&mut self) -> &mut [T] {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size_in_bytes());
        // SAFETY: built only by `run_inplace`, under the lock, after waiting until no op
        // reads this buffer outside the lock; inputs that share the buffer were copied
        // out first, so this is the only live slice of it.
        unsafe { self.buf.slice_mut::<T>() }
    }

    pub(crate) fn desc(&self) -> Box<ArrayDesc> {
        Box::new(ArrayDesc {
            uid: self.id.uid(),
            shape: self.layout.shape.clone(),
            dtype: self.dtype,
            created_at: self.created_at,
        })
    }
}

/// What an op produced.
pub(crate) enum Output {
    /// A new contiguous array.
    New {
        buf: Buffer,
        shape: Shape,
        dtype: DType,
    },
    /// A view of input `of` with another layout.
    View { of: usize, layout: Layout },
}

impl Registry {
    // ---------------------------------------------------------------- lookups

    pub(crate) fn array(&self, id: Id) -> Result<&ArrayRec> {
        match self.arrays.get(id) {
            Some(r) => Ok(r),
            None => Err(self.closed_error(id)),
        }
    }

    #[cold]
    fn closed_error(&self, id: Id) -> NdError {
        let Some(t) = self.graves.find(id) else {
            return NdError::ClosedUnknown { uid: id.uid() };
        };
        let reason = match t.cause {
            Cause::Explicit => CloseReason::Explicit,
            Cause::Release => CloseReason::Release,
            Cause::Scope(opened_at) => CloseReason::ScopeClose { opened_at },
            Cause::Manager(mid) => CloseReason::ManagerClose {
                manager: match self.managers.get(mid) {
                    Some(m) => m.name.clone(),
                    None => match self.manager_closed_error(mid) {
                        NdError::ManagerClosed { name } => name,
                        _ => unreachable!(),
                    },
                },
            },
        };
        let (created_backtrace, closed_backtrace) =
            self.traces.find(id).cloned().unwrap_or_default();
        NdError::Closed(Box::new(ClosedInfo {
            array: ArrayDesc {
                uid: id.uid(),
                shape: t.shape.clone(),
                dtype: t.dtype,
                created_at: t.created_at,
            },
            closed_at: t.closed_at,
            reason,
            created_backtrace,
            closed_backtrace,
        }))
    }

    #[cold]
    fn manager_closed_error(&self, id: Id) -> NdError {
        let name = match self.manager_graves.find(id) {
            Some(name) => name.clone(),
            None => format!("#{}", id.uid()),
        };
        NdError::ManagerClosed { name }
    }

    fn array_mut(&mut self, id: Id) -> &mut ArrayRec {
        self.arrays
            .get_mut(id)
            .expect("engine invariant: linked array is live")
    }

    pub(crate) fn is_live(&self, id: Id) -> bool {
        self.arrays.get(id).is_some()
    }

    pub(crate) fn manager(&self, id: Id) -> Result<&ManagerRec> {
        match self.managers.get(id) {
            Some(m) => Ok(m),
            None => Err(self.manager_closed_error(id)),
        }
    }

    pub(crate) fn manager_mut(&mut self, id: Id) -> Result<&mut ManagerRec> {
        self.manager(id)?;
        Ok(self.managers.get_mut(id).expect("checked live"))
    }

    pub(crate) fn manager_parent(&self, id: Id) -> Result<Option<Id>> {
        Ok(self.manager(id)?.parent)
    }

    pub(crate) fn manager_children(&self, id: Id) -> Result<&[Id]> {
        Ok(&self.manager(id)?.children)
    }

    pub(crate) fn manager_arrays(&self, id: Id) -> Result<&[Id]> {
        Ok(&self.manager(id)?.arrays)
    }

    /// Bytes charged to this array: its buffer's size if it is the buffer's first
    /// holder, else 0 (views share their base's bytes).
    pub(crate) fn charged_bytes(&self, id: Id) -> usize {
        let Some(r) = self.arrays.get(id) else {
            return 0;
        };
        let meta = self.buffers.get(r.buffer).expect("live buffer");
        if meta.holders.first() == Some(&id) {
            meta.buf.bytes()
        } else {
            0
        }
    }

    pub(crate) fn scope_rec(&self, id: Id) -> Option<&ScopeRec> {
        self.scopes.get(id)
    }

    fn accepts(&self, mgr: Id) -> Result<()> {
        let m = self.manager(mgr)?;
        if m.capped {
            return Err(NdError::ManagerCapped {
                name: m.name.clone(),
            });
        }
        Ok(())
    }

    pub(crate) fn desc(&self, id: Id) -> Result<Box<ArrayDesc>> {
        let r = self.array(id)?;
        Ok(Box::new(ArrayDesc {
            uid: id.uid(),
            shape: r.layout.shape.clone(),
            dtype: r.dtype,
            created_at: r.created_at,
        }))
    }

    pub(crate) fn operand(&self, id: Id) -> Result<Operand<'_>> {
        let r = self.array(id)?;
        let meta = self
            .buffers
            .get(r.buffer)
            .expect("engine invariant: live array has a buffer");
        Ok(Operand {
            buf: &meta.buf,
            layout: &r.layout,
            dtype: r.dtype,
            id,
            created_at: r.created_at,
            buffer_id: r.buffer,
            manager: r.manager,
        })
    }

    // ---------------------------------------------------------------- statistics

    /// Add deltas to a manager and all its ancestors.
    fn adjust(&mut self, mut mid: Id, arrays: isize, buffers: isize, bytes: isize, allocs: u64) {
        loop {
            let m = self
                .managers
                .get_mut(mid)
                .expect("engine invariant: owner is live");
            let s = &mut m.stats;
            s.arrays = s.arrays.wrapping_add_signed(arrays);
            s.buffers = s.buffers.wrapping_add_signed(buffers);
            s.bytes = s.bytes.wrapping_add_signed(bytes);
            s.allocations += allocs;
            s.peak = s.peak.max(s.bytes);
            match m.parent {
                Some(p) => mid = p,
                None => return,
            }
        }
    }

    pub(crate) fn stats(&self, mgr: Id) -> Result<Stats> {
        Ok(self.manager(mgr)?.stats)
    }

    /// Start measuring the process peak from now: returns the saved peak for
    /// [`Registry::end_peak_window`].
    pub(crate) fn begin_peak_window(&mut self) -> usize {
        let s = &mut self.managers.get_mut(SYSTEM).expect("system").stats;
        let saved = s.peak;
        s.peak = s.bytes;
        saved
    }

    /// The peak reached since `begin_peak_window`; restores the overall peak.
    pub(crate) fn end_peak_window(&mut self, saved: usize) -> usize {
        let s = &mut self.managers.get_mut(SYSTEM).expect("system").stats;
        let window = s.peak;
        s.peak = s.peak.max(saved);
        window
    }

    pub(crate) fn reset_peak(&mut self) {
        for m in self.managers.iter_mut() {
            m.stats.peak = m.stats.bytes;
        }
    }

    // ---------------------------------------------------------------- arrays

    /// Register a new array in `mgr` (and in this thread's innermost scope).
    pub(crate) fn insert_array(
        &mut self,
        mgr: Id,
        data: Data,
        layout: Layout,
        dtype: DType,
        at: SourceLocation,
    ) -> Result<Id> {
        self.accepts(mgr)?;
        let (buffer, new_bytes) = match data {
            Data::New(buf) => {
                let bytes = buf.bytes();
                let buf = self.wrap_buffer(buf);
                let holders = SmallVec::new();
                (self.buffers.insert(BufMeta { buf, holders }), Some(bytes))
            }
            Data::Share(b) => (b, None),
        };
        let m = self.managers.get_mut(mgr).expect("checked above");
        let mgr_pos = m.arrays.len() as u32;
        let id = self.arrays.insert(ArrayRec {
            buffer,
            layout,
            dtype,
            manager: mgr,
            mgr_pos,
            scopes: SmallVec::new(),
            retains: 0,
            created_at: at,
            created_bt: backtrace(),
            temp_home: None,
            grad: None,
            holds: 0,
            orphaned: None,
        });
        self.managers
            .get_mut(mgr)
            .expect("checked above")
            .arrays
            .push(id);
        // A new buffer's first holder is charged for it; a view adds only an array.
        self.buffers
            .get_mut(buffer)
            .expect("live buffer")
            .holders
            .push(id);
        match new_bytes {
            Some(bytes) => self.adjust(mgr, 1, 1, bytes as isize, 1),
            None => self.adjust(mgr, 1, 0, 0, 0),
        }
        if let Some(scope) = current_scope() {
            self.register(scope, id);
        }
        Ok(id)
    }

    /// An `Arc` around `buf`, reusing a spare shell when one is kept.
    fn wrap_buffer(&mut self, buf: Buffer) -> Arc<Buffer> {
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
    fn recycle_arc(&mut self, mut arc: Arc<Buffer>) {
        const MAX_SPARE_ARCS: usize = 1024;
        if let Some(b) = Arc::get_mut(&mut arc) {
            *b = Buffer::empty();
            if self.spare_arcs.len() < MAX_SPARE_ARCS {
                self.spare_arcs.push(arc);
            }
        }
    }

    /// Drop `id` from its buffer's holders. When `id` was the holder charged for the
    /// buffer, returns its bytes and the manager of the next holder, which takes over
    /// the charge (the caller moves the charge: first off `id`'s manager, then onto the
    /// next one, so peaks never count it twice).
    fn remove_holder(&mut self, buffer: Id, id: Id) -> Option<(usize, Option<Id>)> {
        let meta = self.buffers.get_mut(buffer).expect("live buffer");
        let bytes = meta.buf.bytes();
        let i = meta
            .holders
            .iter()
            .position(|&h| h == id)
            .expect("engine invariant: holder is listed");
        meta.holders.remove(i);
        let next = meta.holders.first().copied();
        if next.is_none() {
            // Dropping the Arc frees the block unless an op outside the lock still
            // reads it, in which case that op's snapshot frees it.
            if let Some(meta) = self.buffers.remove(buffer) {
                self.recycle_arc(meta.buf);
            }
        }
        (i == 0).then(|| (bytes, next.map(|n| self.array_mut(n).manager)))
    }

    fn unlink_from_manager(&mut self, id: Id) {
        let (mid, pos) = {
            let r = self.array_mut(id);
            (r.manager, r.mgr_pos as usize)
        };
        let list = &mut self.managers.get_mut(mid).expect("owner is live").arrays;
        list.swap_remove(pos);
        if let Some(&moved) = list.get(pos) {
            self.array_mut(moved).mgr_pos = pos as u32;
        }
    }

    fn link_to_manager(&mut self, id: Id, mid: Id) {
        let list = &mut self.managers.get_mut(mid).expect("target is live").arrays;
        list.push(id);
        let pos = (list.len() - 1) as u32;
        let r = self.array_mut(id);
        r.manager = mid;
        r.mgr_pos = pos;
    }

    /// Move an array to another manager, carrying its counts and buffer charge.
    fn move_array(&mut self, id: Id, to: Id) -> Result<()> {
        self.accepts(to)?;
        let (from, buffer) = {
            let r = self.array(id)?;
            (r.manager, r.buffer)
        };
        if from == to {
            return Ok(());
        }
        let meta = self.buffers.get(buffer).expect("live buffer");
        let charged = meta.holders.first() == Some(&id);
        let bytes = meta.buf.bytes() as isize;
        self.unlink_from_manager(id);
        self.adjust(
            from,
            -1,
            -(charged as isize),
            -(bytes * charged as isize),
            0,
        );
        self.link_to_manager(id, to);
        self.adjust(to, 1, charged as isize, bytes * charged as isize, 0);
        Ok(())
    }

    pub(crate) fn attach(&mut self, id: Id, to: Id) -> Result<()> {
        self.move_array(id, to)?;
        self.array_mut(id).temp_home = None;
        Ok(())
    }

    pub(crate) fn temp_attach(&mut self, id: Id, to: Id) -> Result<()> {
        let home = {
            let r = self.array(id)?;
            r.temp_home.unwrap_or(r.manager)
        };
        self.move_array(id, to)?;
        self.array_mut(id).temp_home = Some(home);
        Ok(())
    }

    /// Free an array now, whatever its count. Returns false if it was already dead.
    #[cfg_attr(feature = "untracked", allow(clippy::only_used_in_recursion))]
    pub(crate) fn free_array(&mut self, id: Id, at: Option<SourceLocation>, cause: Cause) -> bool {
        let Some(rec) = self.arrays.remove(id) else {
            return false;
        };
        // A parameter's gradient lives and dies with it.
        let grad = rec.grad;
        // Unlink from the manager's list (the record is gone, so fix positions here).
        let list = &mut self
            .managers
            .get_mut(rec.manager)
            .expect("owner is live")
            .arrays;
        let pos = rec.mgr_pos as usize;
        list.swap_remove(pos);
        if let Some(&moved) = list.get(pos) {
            self.array_mut(moved).mgr_pos = pos as u32;
        }
        for &(sid, pos) in &rec.scopes {
            self.scope_unlink_at(sid, pos as usize);
        }
        match self.remove_holder(rec.buffer, id) {
            Some((bytes, next)) => {
                self.adjust(rec.manager, -1, -1, -(bytes as isize), 0);
                if let Some(nm) = next {
                    self.adjust(nm, 0, 1, bytes as isize, 0);
                }
            }
            None => self.adjust(rec.manager, -1, 0, 0, 0),
        }
        #[cfg(not(feature = "untracked"))]
        {
            let closed_bt = backtrace();
            if rec.created_bt.is_some() || closed_bt.is_some() {
                self.traces.bury(id, (rec.created_bt, closed_bt));
            }
            self.graves.bury(
                id,
                Tomb {
                    shape: rec.layout.shape,
                    dtype: rec.dtype,
                    created_at: rec.created_at,
                    closed_at: at,
                    cause,
                },
            );
        }
        if let Some(g) = grad {
            self.free_array(g, at, cause);
        }
        true
    }

    // ---------------------------------------------------------------- autograd

    /// The gradient array of parameter `id`, if it requires one.
    pub(crate) fn grad(&self, id: Id) -> Result<Option<Id>> {
        Ok(self.array(id)?.grad)
    }

    /// Whether `id` is a live parameter (has a gradient array).
    pub(crate) fn is_param(&self, id: Id) -> bool {
        self.arrays.get(id).is_some_and(|r| r.grad.is_some())
    }

    /// Set or clear the gradient array of `id`.
    pub(crate) fn set_grad(&mut self, id: Id, grad: Option<Id>) -> Result<()> {
        self.array(id)?;
        self.array_mut(id).grad = grad;
        Ok(())
    }

    /// A tape hold: keeps `id` alive past the close of its scopes until `unhold`.
    pub(crate) fn hold(&mut self, id: Id) -> Result<()> {
        self.array(id)?;
        self.array_mut(id).holds += 1;
        Ok(())
    }

    /// Drop a tape hold; frees the array if it was the last hold and a scope close
    /// found the array held only by tapes. A freed array is ignored.
    pub(crate) fn unhold(&mut self, id: Id) {
        let Some(r) = self.arrays.get_mut(id) else {
            return;
        };
        r.holds = r.holds.saturating_sub(1);
        if r.holds == 0
            && r.retains == 0
            && r.scopes.is_empty()
            && let Some(opened_at) = r.orphaned
        {
            self.free_array(id, None, Cause::Scope(opened_at));
        }
    }

    pub(crate) fn retain(&mut self, id: Id) -> Result<u32> {
        self.array(id)?;
        let r = self.array_mut(id);
        r.retains += 1;
        Ok(r.retains + r.scopes.len() as u32)
    }

    pub(crate) fn ref_count(&self, id: Id) -> Result<u32> {
        let r = self.array(id)?;
        Ok(r.retains + r.scopes.len() as u32)
    }

    /// Drop one reference; free the array when none is left. Returns whether it freed.
    pub(crate) fn release(&mut self, id: Id, at: SourceLocation) -> Result<bool> {
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
            let depth = |sid: Id| self.scopes.get(sid).map_or(0, |s| s.depth);
            let (i, _) = r
                .scopes
                .iter()
                .enumerate()
                .max_by_key(|(_, (sid, _))| depth(*sid))
                .expect("count > 1");
            let (sid, pos) = self.array_mut(id).scopes.swap_remove(i);
            self.scope_unlink_at(sid, pos as usize);
        }
        Ok(false)
    }

    // ---------------------------------------------------------------- scopes

    /// Register `id` in scope `sid` (no-op if it already is).
    pub(crate) fn register(&mut self, sid: Id, id: Id) {
        let Some(scope) = self.scopes.get_mut(sid) else {
            return;
        };
        let r = self.arrays.get_mut(id).expect("registering a live array");
        if r.scopes.iter().any(|&(s, _)| s == sid) {
            return;
        }
        r.scopes.push((sid, scope.arrays.len() as u32));
        r.orphaned = None;
        scope.arrays.push(id);
    }

    /// Remove the entry at `pos` of scope `sid`'s list, fixing the moved entry.
    fn scope_unlink_at(&mut self, sid: Id, pos: usize) {
        let Some(scope) = self.scopes.get_mut(sid) else {
            return;
        };
        scope.arrays.swap_remove(pos);
        if let Some(&moved) = scope.arrays.get(pos) {
            let r = self.array_mut(moved);
            if let Some(e) = r.scopes.iter_mut().find(|(s, _)| *s == sid) {
                e.1 = pos as u32;
            }
        }
    }

    /// Drop `id`'s registration in `sid`; returns whether it had one.
    fn unregister_from(&mut self, sid: Id, id: Id) -> bool {
        let Some(r) = self.arrays.get_mut(id) else {
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
    pub(crate) fn escape(&mut self, sid: Id, id: Id) -> Result<()> {
        self.array(id)?;
        if self.unregister_from(sid, id) {
            let parent = self.scopes.get(sid).and_then(|s| s.parent);
            if let Some(p) = parent {
                self.register(p, id);
            }
        }
        Ok(())
    }

    /// Remove `id` from every scope.
    pub(crate) fn unregister_all(&mut self, id: Id) -> Result<()> {
        self.array(id)?;
        while let Some((sid, pos)) = self.array_mut(id).scopes.pop() {
            self.scope_unlink_at(sid, pos as usize);
        }
        Ok(())
    }

    pub(crate) fn open_scope(&mut self, at: SourceLocation) -> Id {
        let parent = current_scope();
        let depth = parent
            .and_then(|p| self.scopes.get(p))
            .map_or(0, |p| p.depth + 1);
        let arrays = self.spare_lists.pop().unwrap_or_default();
        let id = self.scopes.insert(ScopeRec {
            parent,
            depth,
            arrays,
            opened_at: at,
            resources: Vec::new(),
        });
        CURRENT_SCOPE.with(|c| c.set(Some(id)));
        id
    }

    /// Close scope `sid` of this thread and every scope opened inside it. Returns the
    /// resources to close once the lock is released.
    pub(crate) fn close_scope(
        &mut self,
        sid: Id,
        at: Option<SourceLocation>,
    ) -> Result<Vec<Box<dyn Resource>>> {
        if self.scopes.get(sid).is_none() {
            return Ok(Vec::new()); // already closed (e.g. by an outer scope)
        }
        // The scopes to close: from the innermost up to `sid`.
        let mut chain = SmallVec::<[Id; 4]>::new();
        let mut cur = current_scope();
        while let Some(c) = cur {
            chain.push(c);
            if c == sid {
                break;
            }
            cur = self.scopes.get(c).and_then(|s| s.parent);
        }
        if chain.last() != Some(&sid) {
            return Err(NdError::Scope {
                msg: "this scope is not open on the current thread".into(),
            });
        }
        let mut resources = Vec::new();
        for &c in &chain {
            let mut scope = self.scopes.remove(c).expect("open scope");
            for id in scope.arrays.drain(..) {
                let Some(r) = self.arrays.get_mut(id) else {
                    continue;
                };
                if let Some(i) = r.scopes.iter().position(|&(s, _)| s == c) {
                    r.scopes.swap_remove(i);
                }
                if r.scopes.is_empty() && r.retains == 0 && r.holds > 0 {
                    // Kept for a gradient tape; its last `unhold` frees it.
                    r.orphaned = Some(scope.opened_at);
                } else if r.scopes.is_empty() && r.retains == 0 {
                    self.free_array(id, at, Cause::Scope(scope.opened_at));
                }
            }
            resources.extend(scope.resources.into_iter().rev());
            CURRENT_SCOPE.with(|cs| cs.set(scope.parent));
            // Keep the emptied list for the next scope (a steady loop then opens scopes
            // without allocating); drop very large or surplus ones.
            if self.spare_lists.len() < 64 && scope.arrays.capacity() <= 1 << 16 {
                self.spare_lists.push(scope.arrays);
            }
        }
        Ok(resources)
    }

    pub(crate) fn scope_add_resource(
        &mut self,
        sid: Id,
        r: Box<dyn Resource>,
    ) -> Result<(), Box<dyn Resource>> {
        match self.scopes.get_mut(sid) {
            Some(s) => {
                s.resources.push(r);
                Ok(())
            }
            None => Err(r),
        }
    }

    pub(crate) fn scope_arrays(&self, sid: Id) -> &[Id] {
        self.scopes
            .get(sid)
            .map(|s| s.arrays.as_slice())
            .unwrap_or(&[])
    }

    // ---------------------------------------------------------------- managers

    pub(crate) fn new_manager(&mut self, parent: Id, name: Option<String>) -> Result<Id> {
        let pos = self.manager(parent)?.children.len() as u32;
        let id = self
            .managers
            .insert(ManagerRec::new(String::new(), Some(parent), pos));
        let m = self.managers.get_mut(id).expect("just inserted");
        m.name = name.unwrap_or_else(|| format!("manager#{}", id.uid()));
        self.managers
            .get_mut(parent)
            .expect("checked")
            .children
            .push(id);
        Ok(id)
    }

    pub(crate) fn manager_add_resource(
        &mut self,
        mid: Id,
        r: Box<dyn Resource>,
    ) -> Result<(), (NdError, Box<dyn Resource>)> {
        match self.manager_mut(mid) {
            Ok(m) => {
                m.resources.push(r);
                Ok(())
            }
            Err(e) => Err((e, r)),
        }
    }

    /// Close a manager and its subtree. Returns the resources to close after the lock
    /// is released. The system manager is never closed.
    pub(crate) fn close_manager(&mut self, mid: Id, at: SourceLocation) -> Vec<Box<dyn Resource>> {
        let mut resources = Vec::new();
        if mid != SYSTEM && self.managers.get(mid).is_some() {
            self.close_manager_into(mid, at, &mut resources);
        }
        resources
    }

    fn close_manager_into(
        &mut self,
        mid: Id,
        at: SourceLocation,
        out: &mut Vec<Box<dyn Resource>>,
    ) {
        while let Some(&child) = self.managers.get(mid).and_then(|m| m.children.last()) {
            self.close_manager_into(child, at, out);
        }
        while let Some(&id) = self.managers.get(mid).and_then(|m| m.arrays.last()) {
            let home = self.array_mut(id).temp_home;
            let returned = home.is_some_and(|h| self.managers.get(h).is_some())
                && self.attach(id, home.expect("checked")).is_ok();
            if !returned {
                self.free_array(id, Some(at), Cause::Manager(mid));
            }
        }
        let mut rec = self.managers.remove(mid).expect("live");
        self.manager_graves.bury(mid, std::mem::take(&mut rec.name));
        out.extend(rec.resources.into_iter().rev());
        if let Some(p) = rec.parent {
            let list = &mut self
                .managers
                .get_mut(p)
                .expect("parent outlives child")
                .children;
            let pos = rec.parent_pos as usize;
            list.swap_remove(pos);
            if let Some(&moved) = list.get(pos) {
                self.managers.get_mut(moved).expect("sibling").parent_pos = pos as u32;
            }
        }
    }
}

/// Close resources outside the lock (innermost/most recent first). Every resource is
/// closed even if one panics; the first panic is then resumed.
pub(crate) fn close_resources(resources: Vec<Box<dyn Resource>>) {
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

// -------------------------------------------------------------------- op execution

/// Run op `name` over `inputs`; its result belongs to the first input's manager.
pub(crate) fn run_op(
    name: &'static str,
    inputs: &[Id],
    at: SourceLocation,
    f: impl FnOnce(&[Operand<'_>]) -> Result<Output>,
) -> Result<Id> {
    if !profile::active() {
        return run_op_inner(inputs, at, f);
    }
    let input_shapes = {
        let g = lock();
        inputs
            .iter()
            .map(|&id| g.array(id).map(|r| r.layout.shape.clone()))
            .collect::<Result<Vec<_>>>()?
    };
    let t0 = std::time::Instant::now();
    let id = run_op_inner(inputs, at, f)?;
    let duration = t0.elapsed();
    let g = lock();
    profile::record(profile::OpRecord {
        name,
        input_shapes,
        output_shape: g.array(id)?.layout.shape.clone(),
        bytes_added: g.charged_bytes(id),
        duration,
    });
    Ok(id)
}

fn run_op_inner(
    inputs: &[Id],
    at: SourceLocation,
    f: impl FnOnce(&[Operand<'_>]) -> Result<Output>,
) -> Result<Id> {
    let mut g = lock();
    let mut ops = SmallVec::<[Operand<'_>; 3]>::new();
    for &id in inputs {
        ops.push(g.operand(id)?);
    }
    // Resolved above, so `ops[0]` exists; its manager owns the result.
    let mgr = ops[0].manager;
    g.accepts(mgr)?;
    let work: usize = ops.iter().map(|o| o.layout.size()).sum();
    if work < OUTSIDE_LOCK_WORK {
        let out = f(&ops)?;
        let buffers: SmallVec<[Id; 3]> = ops.iter().map(|o| o.buffer_id).collect();
        drop(ops);
        return register_output(&mut g, mgr, out, &buffers, inputs, at);
    }
    // Large work: compute on snapshots with the lock released.
    let snaps: SmallVec<[Snapshot; 3]> = ops
        .iter()
        .map(|o| {
            let buf = g.buffers.get(o.buffer_id).expect("live").buf.clone();
            buf.begin_outside_read();
            Snapshot {
                buf,
                layout: o.layout.clone(),
                dtype: o.dtype,
                id: o.id,
                created_at: o.created_at,
                buffer_id: o.buffer_id,
                manager: o.manager,
            }
        })
        .collect();
    drop(ops);
    drop(g);
    let out = {
        let ops: SmallVec<[Operand<'_>; 3]> = snaps
            .iter()
            .map(|s| Operand {
                buf: &s.buf,
                layout: &s.layout,
                dtype: s.dtype,
                id: s.id,
                created_at: s.created_at,
                buffer_id: s.buffer_id,
                manager: s.manager,
            })
            .collect();
        f(&ops)
    };
    for s in &snaps {
        s.buf.end_outside_read();
    }
    let mut g = lock();
    let out = out?;
    let buffers: SmallVec<[Id; 3]> = snaps.iter().map(|s| s.buffer_id).collect();
    // An input may have been freed meanwhile: a view of it can no longer be made.
    if let Output::View { of, .. } = &out {
        g.array(inputs[*of])?;
    }
    drop(snaps);
    register_output(&mut g, mgr, out, &buffers, inputs, at)
}

/// An op input held across the unlocked compute of a large op.
struct Snapshot {
    buf: Arc<Buffer>,
    layout: Layout,
    dtype: DType,
    id: Id,
    created_at: SourceLocation,
    buffer_id: Id,
    manager: Id,
}

fn register_output(
    g: &mut Registry,
    mgr: Id,
    out: Output,
    buffers: &[Id],
    inputs: &[Id],
    at: SourceLocation,
) -> Result<Id> {
    match out {
        Output::New { buf, shape, dtype } => {
            g.insert_array(mgr, Data::New(buf), Layout::contiguous(shape), dtype, at)
        }
        Output::View { of, layout } => {
            let dtype = g.array(inputs[of])?.dtype;
            g.insert_array(mgr, Data::Share(buffers[of]), layout, dtype, at)
        }
    }
}

/// Create an array from a filled buffer in `mgr`.
pub(crate) fn create(
    mgr: Id,
    buf: Buffer,
    shape: Shape,
    dtype: DType,
    at: SourceLocation,
) -> Result<Id> {
    let mut g = lock();
    g.insert_array(mgr, Data::New(buf), Layout::contiguous(shape), dtype, at)
}

/// Run an in-place op writing `target`, reading `inputs`.
pub(crate) fn run_inplace(
    target: Id,
    inputs: &[Id],
    f: impl FnOnce(OperandMut<'_>, &[Operand<'_>]) -> Result<()>,
) -> Result<()> {
    let mut g = lock();
    // Wait until no op reads the target outside the lock (they hold no lock, so they
    // finish; new ones cannot start while we hold it).
    loop {
        let r = g.array(target)?;
        let meta = g.buffers.get(r.buffer).expect("live");
        if !meta.buf.has_outside_readers() {
            break;
        }
        MutexGuard::unlocked(&mut g, std::thread::yield_now);
    }
    let r = g.array(target)?;
    let tbuf = &g.buffers.get(r.buffer).expect("live").buf;
    // Inputs sharing the target's buffer are copied out first so reads never alias
    // the write.
    let mut copies: SmallVec<[Option<(Buffer, Layout)>; 2]> = SmallVec::new();
    for &id in inputs {
        let o = g.operand(id)?;
        copies.push(if o.buf.addr() == tbuf.addr() && o.buf.bytes() != 0 {
            Some(kernels::materialize(&o)?)
        } else {
            None
        });
    }
    let mut ops = SmallVec::<[Operand<'_>; 2]>::new();
    for (i, &id) in inputs.iter().enumerate() {
        let mut o = g.operand(id)?;
        if let Some((b, l)) = &copies[i] {
            o.buf = b;
            o.layout = l;
        }
        ops.push(o);
    }
    let t = OperandMut {
        buf: tbuf,
        layout: r.layout.clone(),
        dtype: r.dtype,
        id: target,
        created_at: r.created_at,
    };
    f(t, &ops)
}

/// Read an array under the lock.
pub(crate) fn read<R>(id: Id, f: impl FnOnce(&Operand<'_>) -> R) -> Result<R> {
    let g = lock();
    let o = g.operand(id)?;
    Ok(f(&o))
}
