//! The records: what the engine knows of an array, a buffer and a scope, and the
//! forensics kept after an array is freed (tombstones that make use-after-close errors
//! name the array, its creating line, and where and why it was freed).
//!
//! The array record keeps its hot fields (buffer, layout, dtype, owner, scope
//! registrations, counts) together; the diagnostics it carries are one `&'static`
//! creation site (always) and a backtrace only in verbose mode.

use super::Layout;
use super::Storage;
use super::shard::{Ctx, Shard};
use super::slab::{ArrayId, BufId, MgrId, ScopeId, ScopeK, Slab};
use crate::DType;
use crate::Shape;
use crate::error::{ArrayDesc, CloseReason, ClosedInfo, NdError, SourceLocation};
use smallvec::SmallVec;
use std::sync::Arc;

/// Something a manager or a scope owns and closes once when it closes.
///
/// Arrays are handled by the engine directly; implement this for your own native
/// handles, or use [`crate::NDList`], to make them live and die with a manager or scope.
pub trait Resource: Send {
    /// Release the resource. Called exactly once, never under an engine lock, so it may
    /// use ndscope freely.
    fn close(&mut self);
}

pub(crate) struct ArrayRec {
    /// The data: the array's own buffer, or a shared buffer record of this shard.
    pub store: Store,
    pub layout: Layout,
    pub manager: MgrId,
    /// Position in the manager's array list of this shard.
    pub mgr_pos: u32,
    pub retains: u32,
    /// Holds by gradient tapes: like retains they keep the array alive past the close of
    /// its scopes, but they are not user references (not in `ref_count`), so dropping
    /// the last one frees the array only if a scope close wanted to free it meanwhile.
    pub holds: u32,
    pub dtype: DType,
    /// Scope registrations: scope and position in its list.
    pub scopes: SmallVec<[(ScopeId, u32); 1]>,
    pub created_at: SourceLocation,
    /// The gradient array of a parameter (`set_requires_gradient(true)`); freed with it.
    pub grad: Option<ArrayId>,
    /// The rare fields, out of line (`None` for almost every array): keeps the record
    /// small, so inserting and freeing one moves little memory.
    pub cold: Option<Box<ColdRec>>,
}

/// Where an array's data lives.
///
/// Most arrays are the only viewer of their buffer: an op's result, a parameter, a
/// batch. Such an array keeps the buffer in its record (`Own`), charged to it, and
/// creating or freeing it touches no buffer record. The first view of it (or an op
/// that reads it outside the lock) moves the buffer into a shared [`BufMeta`]
/// record with the array as its first, charged holder ([`Shard::share`]).
pub(crate) enum Store {
    /// The array's own buffer: no other array views it, and its bytes are charged to
    /// the array.
    Own(Storage),
    /// A buffer record of the array's shard (home or proxy), shared with views.
    Shared(BufId),
}

/// The fields of an [`ArrayRec`] that almost every array leaves empty.
#[derive(Default)]
pub(crate) struct ColdRec {
    /// The creation backtrace (verbose mode only).
    #[cfg_attr(feature = "untracked", allow(dead_code))]
    pub created_bt: Option<Arc<str>>,
    /// The manager a temporarily attached array returns to.
    pub temp_home: Option<MgrId>,
    /// Set (to the close's cause) when a scope close left the array alive only
    /// because of tape holds; the last `unhold` then frees it.
    pub orphaned: Option<Cause>,
}

impl ArrayRec {
    /// The manager a temporarily attached array returns to.
    #[inline]
    pub(crate) fn temp_home(&self) -> Option<MgrId> {
        self.cold.as_ref().and_then(|c| c.temp_home)
    }

    /// Why a scope close would have freed this tape-held array.
    #[inline]
    pub(crate) fn orphaned(&self) -> Option<Cause> {
        self.cold.as_ref().and_then(|c| c.orphaned)
    }

    /// The cold fields, for writing (made on first use).
    pub(crate) fn cold_mut(&mut self) -> &mut ColdRec {
        self.cold.get_or_insert_with(Default::default)
    }

    /// Forget a recorded orphaning (the array is registered or retained again).
    #[inline]
    pub(crate) fn clear_orphaned(&mut self) {
        if let Some(c) = &mut self.cold {
            c.orphaned = None;
        }
    }
}

/// A data buffer and the arrays of this shard that view it.
///
/// Every array's buffer record lives in the array's own shard. The shard that created
/// the data holds its *home* record; another shard that views it holds a *proxy*
/// record (same `Arc<Storage>`, its own holders, `home` set) listed in the home's
/// `proxies`. So views made and freed on one thread touch only its shard, even of
/// another thread's data. The buffer's bytes are charged to the first holder of the
/// one record (home or proxy) that `carries` the charge; when that holder goes, the
/// next holder of the record takes it, and when the record has none left, the home's
/// first holder, else the first proxy's.
/// An in-place write locks the home's shard and every proxy's, which excludes the
/// readers of all of them.
pub(crate) struct BufMeta {
    pub buf: Arc<Storage>,
    /// Arrays of this shard viewing the buffer.
    pub holders: Holders,
    /// Whether this record's first holder is charged for the bytes.
    pub carries: bool,
    /// For a proxy: the home record.
    pub home: Option<BufId>,
    /// For a home: the proxies in other shards (each has at least one holder).
    pub proxies: SmallVec<[BufId; 1]>,
}

/// The arrays of a buffer record, in creation order. Frees mostly come in creation
/// order too (a scope closes its arrays in the order they were made), so removing the
/// first one only moves a start index: no shifting of a long list of views.
#[derive(Default)]
pub(crate) struct Holders {
    ids: SmallVec<[ArrayId; 2]>,
    /// `ids[..start]` are removed.
    start: usize,
}

impl Holders {
    pub(crate) fn push(&mut self, id: ArrayId) {
        self.ids.push(id);
    }

    pub(crate) fn first(&self) -> Option<ArrayId> {
        self.ids.get(self.start).copied()
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len() - self.start
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Remove `id`; returns its position (0: it was the first).
    pub(crate) fn remove(&mut self, id: ArrayId) -> usize {
        let i = self.ids[self.start..]
            .iter()
            .position(|&h| h == id)
            .expect("engine invariant: holder is listed");
        if i == 0 {
            self.start += 1;
            if self.start == self.ids.len() {
                self.ids.clear();
                self.start = 0;
            } else if self.start >= 32 && self.start * 2 >= self.ids.len() {
                self.ids.drain(..self.start);
                self.start = 0;
            }
        } else {
            self.ids.remove(self.start + i);
        }
        i
    }
}

impl BufMeta {
    /// The home record of this buffer (itself for a home).
    pub(crate) fn home_of(&self, id: BufId) -> BufId {
        self.home.unwrap_or(id)
    }

    /// The array charged for the bytes, if it is one of this record's holders.
    pub(crate) fn charged(&self) -> Option<ArrayId> {
        if self.carries {
            self.holders.first()
        } else {
            None
        }
    }
}

/// A scope: its parent on the same thread and the arrays registered in it.
pub(crate) struct ScopeRec {
    pub parent: Option<ScopeId>,
    /// Nesting depth on its thread (outermost = 0), to find the innermost registration.
    pub depth: u32,
    pub arrays: Vec<ArrayId>,
    /// Shards of arrays from other shards ever registered here (unlinking an entry
    /// moves another entry, whose record may live there).
    pub foreign: SmallVec<[u32; 2]>,
    pub opened_at: SourceLocation,
    pub resources: Vec<Box<dyn Resource>>,
    /// Set on the records of an async task's scope (`crate::task`; see
    /// [`super::scopes::TaskTag`]); `None` for an ordinary scope.
    pub task: Option<Box<super::scopes::TaskTag>>,
}

/// Whether unlinking an entry of scope `sid` touches shard `s` (whose scope slab is
/// `scopes`) alone: the scope is `s`'s (or closed) and lists no other shard's array.
#[inline]
pub(crate) fn scope_is_local(s: u32, scopes: &Slab<ScopeK, ScopeRec>, sid: ScopeId) -> bool {
    sid.shard == s && scopes.get(sid).is_none_or(|x| x.foreign.is_empty())
}

/// Why an array was freed, as recorded on the hot path (expanded into a
/// [`CloseReason`] only when an error reports it).
#[derive(Clone, Copy, Debug)]
pub(crate) enum Cause {
    Explicit,
    Release,
    /// The scope opened at this line closed.
    Scope(SourceLocation),
    /// The scope of the async task created at this line closed, as the task ended so.
    Task(SourceLocation, crate::error::TaskEnd),
    /// This manager closed (its name is looked up when reported).
    Manager(MgrId),
}

/// Backtraces at creation and at close (verbose mode).
pub(crate) type Traces = (Option<Arc<str>>, Option<Arc<str>>);

/// What a freed array was: the compact tombstone kept in its shard's graveyard.
pub(crate) struct Tomb {
    pub shape: Shape,
    pub dtype: DType,
    pub created_at: SourceLocation,
    pub closed_at: Option<SourceLocation>,
    pub cause: Cause,
    /// Where its data lived.
    pub device: crate::Device,
}

impl Shard {
    /// The data of record `r` (an array of this shard).
    #[inline]
    pub(crate) fn data_of<'a>(&'a self, r: &'a ArrayRec) -> &'a Storage {
        match &r.store {
            Store::Own(b) => b,
            Store::Shared(b) => &self.buffers.get(*b).expect("live array has a buffer").buf,
        }
    }

    /// The shared buffer record of live array `id` of this shard, moving its own
    /// buffer into a new record (with `id` as the first, charged holder) if it has
    /// one.
    pub(crate) fn share(&mut self, id: ArrayId) -> BufId {
        let r = self.arrays.get_mut(id).expect("sharing a live array");
        let buf = match &mut r.store {
            Store::Shared(b) => return *b,
            Store::Own(b) => std::mem::replace(b, Storage::empty()),
        };
        let mut holders = Holders::default();
        holders.push(id);
        let buf = self.wrap_buffer(buf);
        let b = self.buffers.insert(BufMeta {
            buf,
            holders,
            carries: true,
            home: None,
            proxies: SmallVec::new(),
        });
        self.arrays.get_mut(id).expect("live").store = Store::Shared(b);
        b
    }

    /// The record of a live array of this shard.
    #[inline]
    pub(crate) fn rec(&self, id: ArrayId) -> crate::Result<&ArrayRec> {
        match self.arrays.get(id) {
            Some(r) => Ok(r),
            None => Err(self.closed_error(id)),
        }
    }

    /// Why `id` (a dead array of this shard) is not live.
    #[cold]
    pub(crate) fn closed_error(&self, id: ArrayId) -> NdError {
        let Some(t) = self.graves.find(id) else {
            return NdError::ClosedUnknown { uid: id.uid() };
        };
        let reason = match t.cause {
            Cause::Explicit => CloseReason::Explicit,
            Cause::Release => CloseReason::Release,
            Cause::Scope(opened_at) => CloseReason::ScopeClose { opened_at },
            Cause::Task(opened_at, end) => CloseReason::TaskScopeClose { opened_at, end },
            Cause::Manager(mid) => CloseReason::ManagerClose {
                manager: super::managers::name_of(mid),
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
            device: t.device,
            reason,
            created_backtrace,
            closed_backtrace,
        }))
    }
}

impl Ctx {
    /// The record of a live array (its shard must be locked).
    #[inline]
    pub(crate) fn array(&self, id: ArrayId) -> crate::Result<&ArrayRec> {
        self.shr(id.shard).rec(id)
    }

    /// The record of a live array, for changing it.
    #[inline]
    pub(crate) fn array_mut(&mut self, id: ArrayId) -> &mut ArrayRec {
        self.sh(id.shard)
            .arrays
            .get_mut(id)
            .expect("engine invariant: linked array is live")
    }

    pub(crate) fn is_live(&self, id: ArrayId) -> bool {
        self.shr(id.shard).arrays.get(id).is_some()
    }

    pub(crate) fn buffer(&self, id: BufId) -> &BufMeta {
        self.shr(id.shard)
            .buffers
            .get(id)
            .expect("engine invariant: live array has a buffer")
    }

    pub(crate) fn desc(&self, id: ArrayId) -> crate::Result<Box<ArrayDesc>> {
        let r = self.array(id)?;
        Ok(Box::new(ArrayDesc {
            uid: id.uid(),
            shape: r.layout.shape.clone(),
            dtype: r.dtype,
            created_at: r.created_at,
        }))
    }

    /// Bytes charged to this array: its buffer's size if it is the buffer's first
    /// holder, else 0 (views share their base's bytes).
    pub(crate) fn charged_bytes(&self, id: ArrayId) -> usize {
        self.charge(id).unwrap_or(0)
    }

    /// `Some(bytes of its buffer)` if live array `id` is charged for its buffer.
    pub(crate) fn charge(&self, id: ArrayId) -> Option<usize> {
        let r = self.array(id).ok()?;
        match r.store {
            Store::Own(ref b) => Some(b.bytes()),
            Store::Shared(b) => {
                let meta = self.buffer(b);
                (meta.charged() == Some(id)).then(|| meta.buf.bytes())
            }
        }
    }
}
