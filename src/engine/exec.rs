//! Op execution: resolve inputs, run the kernel, register the result.
//!
//! * **Small work** (under [`OUTSIDE_LOCK_WORK`] elements) is computed under the locks
//!   of the shards involved. When every input (record and buffer) lives in this
//!   thread's shard, that is one uncontended lock round trip per op: only the owning
//!   thread normally takes that lock; another thread that reads one of these arrays
//!   waits at most one small kernel. An input from another shard adds that shard's
//!   lock for the duration of the small kernel.
//! * **Snapshot path.** Large work reads
//!   `Arc` snapshots of the input buffers with no lock held. The snapshots are marked
//!   as outside reads all at once (under the locks of the buffers' shards) so that
//!   in-place writers, which write under those locks, wait for them (parked, not
//!   spinning); a writer that waits announces itself, and outside reads that would
//!   start meanwhile wait for it, holding nothing ([`take_snapshots`]). Then the result
//!   is registered under this thread's shard lock.
//! * **In-place writes** (`super::inplace`) lock the shards of the target and the
//!   inputs, wait until no outside read of the target's buffer is in flight, copy out
//!   inputs that alias the target, and write.

use super::arrays::Data;
use super::devices::{on_host, on_one_device};
use super::oplog;
use super::records::{ArrayRec, Store};
use super::shard::{Ctx, Shards, my_shard};
use super::slab::{ArrayId, MgrId};
use super::{Buffer, Layout, Storage};
use crate::backend::cpu::{self, NoFork, Strided, StridedMut};
use crate::dtype::{Native, dispatch};
use crate::error::{ArrayDesc, NdError, Result, SourceLocation};
use crate::{DType, Device, Shape};
use parking_lot::{Condvar, Mutex};
use smallvec::SmallVec;
use std::sync::Arc;

/// Inputs with at least this many elements in total are computed with no lock held.
const OUTSIDE_LOCK_WORK: usize = 1 << 15;

/// A resolved op input: read-only access to an array's data and metadata.
#[derive(Clone, Copy)]
pub(crate) struct Operand<'a> {
    pub(super) buf: &'a Storage,
    pub layout: &'a Layout,
    pub dtype: DType,
    pub id: ArrayId,
    pub created_at: SourceLocation,
    /// The owning manager (an op's result goes to its first input's).
    manager: MgrId,
}

impl<'a> Operand<'a> {
    /// The operand of array `id` with record `r` and data `buf`.
    #[inline]
    pub(super) fn of(id: ArrayId, r: &'a ArrayRec, buf: &'a Storage) -> Operand<'a> {
        Operand {
            buf,
            layout: &r.layout,
            dtype: r.dtype,
            id,
            created_at: r.created_at,
            manager: r.manager,
        }
    }

    /// The whole buffer as `T` (index it with `layout`).
    pub(crate) fn data<T: Native>(&self) -> &[T] {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size_in_bytes());
        // SAFETY: operands exist only while the engine guarantees there is no writer:
        // under the lock of the buffer's shard (writers take it), or marked as an
        // outside read (writers wait for those to end).
        unsafe { self.buf.slice::<T>() }
    }

    pub(crate) fn shape(&self) -> &Shape {
        &self.layout.shape
    }

    /// The device the operand's data lives on.
    #[inline]
    pub(crate) fn device(&self) -> Device {
        self.buf.device()
    }

    /// The operand's GPU buffer and layout, if its data lives on a GPU.
    #[cfg(feature = "gpu")]
    pub(crate) fn gpu(&self) -> Option<crate::backend::wgpu::kernels::View<'_>> {
        self.buf
            .gpu()
            .map(|buf| crate::backend::wgpu::kernels::View {
                buf,
                layout: self.layout,
                dtype: self.dtype,
            })
    }

    pub(crate) fn buffer_addr(&self) -> usize {
        self.buf.addr()
    }

    /// Size of the whole buffer the operand views, in bytes.
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
    pub(super) buf: &'a Storage,
    pub layout: Layout,
    pub dtype: DType,
    pub id: ArrayId,
    pub created_at: SourceLocation,
}

impl OperandMut<'_> {
    /// The target's GPU buffer and layout, if its data lives on a GPU.
    #[cfg(feature = "gpu")]
    pub(crate) fn gpu(&self) -> Option<crate::backend::wgpu::inplace::ViewMut<'_>> {
        self.buf
            .gpu()
            .map(|buf| crate::backend::wgpu::inplace::ViewMut {
                buf,
                layout: &self.layout,
                dtype: self.dtype,
            })
    }

    /// The target's data and layout at once (what [`StridedMut`] holds).
    pub(crate) fn split_mut<T: Native>(&mut self) -> (&mut [T], &Layout) {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size_in_bytes());
        // SAFETY: built only by `run_inplace`, under the lock of the buffer's shard,
        // after waiting until no outside read of this buffer is in flight; inputs that
        // share the buffer were copied out first, so this is the only live slice of it
        // (`&mut self` keeps a second one from being taken through this operand).
        (unsafe { self.buf.slice_mut::<T>() }, &self.layout)
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

// An operand is what a CPU kernel reads: its data as a typed slice plus its layout.
impl<'a, T: Native> From<&'a Operand<'_>> for Strided<'a, T> {
    #[inline]
    fn from(o: &'a Operand<'_>) -> Self {
        Strided {
            data: o.data::<T>(),
            layout: o.layout,
        }
    }
}

impl<'a, T: Native> From<&'a mut OperandMut<'_>> for StridedMut<'a, T> {
    #[inline]
    fn from(o: &'a mut OperandMut<'_>) -> Self {
        let (data, layout) = o.split_mut::<T>();
        StridedMut { data, layout }
    }
}

/// Copy an operand into a new contiguous buffer of the same dtype.
pub(crate) fn materialize(o: &Operand<'_>) -> Result<(Buffer, Layout)> {
    let buf = dispatch!(o.dtype, T => cpu::map_unary::<T, T>(o, |x| x)?);
    Ok((buf, Layout::contiguous(o.layout.shape.clone())))
}

/// Error for a dtype an op does not support.
pub(crate) fn unsupported(op: &'static str, o: &Operand<'_>) -> NdError {
    NdError::UnsupportedDType {
        op,
        dtype: o.dtype,
        array: o.desc(),
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
    /// A new contiguous array whose data lives on any device (a device kernel's result).
    #[cfg(feature = "gpu")]
    Stored {
        buf: Storage,
        shape: Shape,
        dtype: DType,
    },
}

#[cfg(feature = "gpu")]
impl Output {
    /// A new contiguous array of a device kernel's buffer.
    pub(crate) fn device(
        buf: crate::backend::wgpu::GpuBuffer,
        shape: Shape,
        dtype: DType,
    ) -> Output {
        Output::Stored {
            buf: buf.into(),
            shape,
            dtype,
        }
    }
}

/// Resolved inputs.
type Operands<'a> = SmallVec<[Operand<'a>; 3]>;

impl Ctx {
    /// Push the operands of `ids` to `ops` (their shards are locked; a record's buffer
    /// record lives in its shard). Inlined into each op's path: a call here costs
    /// more than the common case's loop.
    #[inline(always)]
    fn resolve<'a>(&'a self, ids: &[ArrayId], ops: &mut Operands<'a>) -> Result<()> {
        if let Ctx::One(s, sh) = self {
            // The common case: one shard holds every input.
            for &id in ids {
                debug_assert_eq!(id.shard, *s);
                let r: &ArrayRec = sh.rec(id)?;
                ops.push(Operand::of(id, r, sh.data_of(r)));
            }
            return Ok(());
        }
        for &id in ids {
            ops.push(self.operand(id)?);
        }
        Ok(())
    }

    pub(crate) fn operand(&self, id: ArrayId) -> Result<Operand<'_>> {
        let sh = self.shr(id.shard);
        let r: &ArrayRec = sh.rec(id)?;
        Ok(Operand::of(id, r, sh.data_of(r)))
    }
}

/// Lock the shards of these arrays (their buffer records live there too),
/// exclusively.
pub(crate) fn lock_arrays(ids: &[ArrayId]) -> Ctx {
    if let [first, rest @ ..] = ids
        && rest.iter().all(|i| i.shard == first.shard)
    {
        return Ctx::one(first.shard); // the common case: one shard
    }
    let want: SmallVec<[u32; 4]> = ids.iter().map(|i| i.shard).collect();
    Ctx::set(&want)
}

/// Lock this thread's shard `me` exclusively and the other shards of `ids` shared: an
/// op reads its inputs and writes only its result (a first view of another shard's
/// data also writes that shard; [`register_output`] upgrades then).
fn lock_inputs(ids: &[ArrayId], me: u32) -> Ctx {
    let shards: SmallVec<[u32; 4]> = ids.iter().map(|i| i.shard).collect();
    Ctx::reading(&shards, me)
}

/// Run op `name` over `inputs`; its result belongs to the first input's manager.
pub(crate) fn run_op(
    name: &'static str,
    inputs: &[ArrayId],
    at: SourceLocation,
    f: impl FnOnce(&[Operand<'_>]) -> Result<Output>,
) -> Result<ArrayId> {
    run_logged(name, inputs, at, false, f)
}

/// [`run_op_inner`], recorded in an open `profile` window.
#[inline]
fn run_logged(
    name: &'static str,
    inputs: &[ArrayId],
    at: SourceLocation,
    any_device: bool,
    f: impl FnOnce(&[Operand<'_>]) -> Result<Output>,
) -> Result<ArrayId> {
    if !oplog::active() {
        return run_op_inner(name, inputs, at, any_device, f);
    }
    let input_shapes = inputs
        .iter()
        .map(|&id| super::shape(id))
        .collect::<Result<Vec<_>>>()?;
    let t0 = std::time::Instant::now();
    let id = run_op_inner(name, inputs, at, any_device, f)?;
    let duration = t0.elapsed();
    let ctx = Ctx::read_only(&[id.shard]);
    oplog::record(oplog::OpRecord {
        name,
        input_shapes,
        output_shape: ctx.array(id)?.layout.shape.clone(),
        bytes_added: ctx.charged_bytes(id),
        duration,
    });
    Ok(id)
}

/// Run op `name`, which has kernels on more than one device, over `inputs`: as
/// [`run_op`], but `f` also sees operands on a GPU (all on one device) and branches on
/// their device (`Operand::device`). Inputs on different devices are a
/// `DeviceMismatch`, nothing allocated. Device work is only queued, so it runs under
/// the locks whatever its size.
#[inline]
pub(crate) fn run_op_on(
    name: &'static str,
    inputs: &[ArrayId],
    at: SourceLocation,
    f: impl FnOnce(&[Operand<'_>]) -> Result<Output>,
) -> Result<ArrayId> {
    // Without a GPU backend every operand is on the host: the plain op path.
    run_logged(name, inputs, at, cfg!(feature = "gpu"), f)
}

fn run_op_inner(
    name: &'static str,
    inputs: &[ArrayId],
    at: SourceLocation,
    any_device: bool,
    f: impl FnOnce(&[Operand<'_>]) -> Result<Output>,
) -> Result<ArrayId> {
    let me = my_shard();
    // Small work: compute under the locks of the shards involved (only this thread's
    // when every input lives there, the common case).
    let mut ctx = if inputs.iter().all(|i| i.shard == me) {
        Ctx::one(me)
    } else {
        lock_inputs(inputs, me)
    };
    let mut ops = Operands::new();
    ctx.resolve(inputs, &mut ops)?;
    let on_device = if any_device {
        on_one_device(name, &ops)?
    } else {
        on_host(name, &ops)?;
        false
    };
    let work: usize = ops.iter().map(|o| o.layout.size()).sum();
    if work >= OUTSIDE_LOCK_WORK && !on_device {
        drop(ops);
        drop(ctx);
        return run_op_unlocked(me, inputs, at, f); // devices checked above: data never moves
    }
    // Resolved above, so `ops[0]` exists; its manager owns the result.
    let mgr = ops[0].manager;
    let out = {
        let _locked = NoFork::new();
        f(&ops)?
    };
    drop(ops);
    register_output(&mut ctx, me, mgr, out, inputs, at)
}

/// The snapshot path: compute with no lock held.
fn run_op_unlocked(
    me: u32,
    inputs: &[ArrayId],
    at: SourceLocation,
    f: impl FnOnce(&[Operand<'_>]) -> Result<Output>,
) -> Result<ArrayId> {
    let mut snaps = take_snapshots(inputs)?;
    let mgr = snaps[0].manager;
    // Fail before computing if the result could not be registered.
    {
        let mut ctx = Ctx::one(me);
        ctx.sh(me).accepts(mgr)?;
    }
    let out = {
        let ops: SmallVec<[Operand<'_>; 3]> = snaps.iter().map(Snapshot::operand).collect();
        f(&ops)
    };
    drop_snapshots(&mut snaps);
    let out = out?;
    let mut ctx = lock_inputs(inputs, me);
    // An input may have been freed meanwhile: a view of it can no longer be made.
    if let Output::View { of, .. } = &out {
        ctx.array(inputs[*of])?;
    }
    register_output(&mut ctx, me, mgr, out, inputs, at)
}

/// An op input held across an unlocked compute.
struct Snapshot {
    buf: Arc<Storage>,
    layout: Layout,
    dtype: DType,
    id: ArrayId,
    created_at: SourceLocation,
    manager: MgrId,
    reading: bool,
}

/// Snapshots of every input, marked as outside reads all at once, under the locks of
/// their shards (which writers hold).
///
/// An input whose buffer an announced writer is waiting to write is not read now: the
/// op releases everything, waits for that writer, and starts over. It holds no read
/// while it waits, so readers and writers never wait on each other in a cycle (a read
/// taken input by input could hold one buffer while it waits for another's writer,
/// whose thread may wait for a read of the first). Writers thus get their turn however
/// many large reads keep coming.
fn take_snapshots(inputs: &[ArrayId]) -> Result<SmallVec<[Snapshot; 3]>> {
    let shards: Shards = inputs.iter().map(|i| i.shard).collect();
    loop {
        let mut ctx = Ctx::read_only(&shards);
        let mut own = false;
        for &id in inputs {
            own |= matches!(ctx.array(id)?.store, Store::Own(_));
        }
        if own {
            // A snapshot shares the buffer: move own buffers into buffer records first.
            drop(ctx);
            ctx = Ctx::set(&shards);
            for &id in inputs {
                ctx.array(id)?;
                ctx.sh(id.shard).share(id);
            }
        }
        // The buffer record of each input (all shared now).
        let bufs: SmallVec<[&Arc<Storage>; 3]> = inputs
            .iter()
            .map(|&id| match ctx.array(id).expect("checked above").store {
                Store::Shared(b) => &ctx.buffer(b).buf,
                Store::Own(_) => unreachable!("shared above"),
            })
            .collect();
        if let Some(buf) = bufs.iter().find(|b| b.has_writers()) {
            let buf = Arc::clone(buf);
            drop(bufs);
            drop(ctx);
            wait_for_writers(&buf);
            continue;
        }
        let mut snaps: SmallVec<[Snapshot; 3]> = inputs
            .iter()
            .zip(bufs)
            .map(|(&id, buf)| {
                let r = ctx.array(id).expect("checked above");
                Snapshot {
                    buf: buf.clone(),
                    layout: r.layout.clone(),
                    dtype: r.dtype,
                    id,
                    created_at: r.created_at,
                    manager: r.manager,
                    reading: false,
                }
            })
            .collect();
        // Marked under the locks of the buffers' shards, which writers hold.
        for s in &mut snaps {
            s.buf.begin_outside_read();
            s.reading = true;
        }
        return Ok(snaps);
    }
}

impl Snapshot {
    fn operand(&self) -> Operand<'_> {
        Operand {
            buf: &self.buf,
            layout: &self.layout,
            dtype: self.dtype,
            id: self.id,
            created_at: self.created_at,
            manager: self.manager,
        }
    }
}

impl Drop for Snapshot {
    fn drop(&mut self) {
        if self.reading {
            end_outside_read(&self.buf);
        }
    }
}

fn drop_snapshots(snaps: &mut [Snapshot]) {
    for s in snaps {
        if s.reading {
            s.reading = false;
            end_outside_read(&s.buf);
        }
    }
}

/// Writers waiting for outside reads to end park here.
pub(super) static READS_DONE: (Mutex<()>, Condvar) = (Mutex::new(()), Condvar::new());

fn end_outside_read(buf: &Storage) {
    if buf.end_outside_read() {
        // The last outside read ended and a writer may be waiting.
        let _g = READS_DONE.0.lock();
        READS_DONE.1.notify_all();
    }
}

/// Park until no announced writer of `buf` is left.
fn wait_for_writers(buf: &Storage) {
    let mut g = READS_DONE.0.lock();
    while buf.has_writers() {
        READS_DONE
            .1
            .wait_for(&mut g, std::time::Duration::from_millis(1));
    }
}

fn register_output(
    ctx: &mut Ctx,
    me: u32,
    mgr: MgrId,
    out: Output,
    inputs: &[ArrayId],
    at: SourceLocation,
) -> Result<ArrayId> {
    match out {
        Output::New { buf, shape, dtype } => ctx.insert_array(
            me,
            mgr,
            Data::New(buf.into()),
            Layout::contiguous(shape),
            dtype,
            at,
        ),
        #[cfg(feature = "gpu")]
        Output::Stored { buf, shape, dtype } => ctx.insert_array(
            me,
            mgr,
            Data::New(buf),
            Layout::contiguous(shape),
            dtype,
            at,
        ),
        Output::View { of, layout } => {
            let src = inputs[of];
            // A view shares its input's buffer record: an input that owns its buffer
            // moves it into one, which writes the input's shard.
            if !ctx.holds_mut(src.shard) && matches!(ctx.array(src)?.store, Store::Own(_)) {
                relock_with(ctx, src.shard);
            }
            // (Checked again: the input may have been freed while relocking.)
            let r = ctx.array(src)?;
            let dtype = r.dtype;
            let b = match r.store {
                Store::Shared(b) => b,
                Store::Own(_) => ctx.sh(src.shard).share(src),
            };
            if b.shard != me {
                // A view of another shard's data goes through this shard's proxy of
                // it, which may have to be made (under the home's lock).
                let home = ctx.buffer(b).home_of(b);
                let has_proxy = ctx.holds(home.shard)
                    && ctx
                        .shr(home.shard)
                        .buffers
                        .get(home)
                        .is_some_and(|h| h.proxies.iter().any(|p| p.shard == me));
                if home.shard != me && !has_proxy && !ctx.holds_mut(home.shard) {
                    // Making the proxy writes the home's shard: lock it exclusively.
                    relock_with(ctx, home.shard);
                    // A live input's record stays shared, so `b` is still its record.
                    ctx.array(src)?;
                }
                ctx.sh(me).accepts(mgr)?;
            }
            let vb = ctx.view_buffer(me, b);
            ctx.insert_array(me, mgr, Data::Share(vb), layout, dtype, at)
        }
    }
}

/// Unlock `ctx` and lock its shards and `s`, all exclusively.
fn relock_with(ctx: &mut Ctx, s: u32) {
    let mut want = ctx.held();
    want.push(s);
    drop(std::mem::replace(ctx, Ctx::Some(SmallVec::new())));
    *ctx = Ctx::set(&want);
}

/// Create an array from a filled buffer in `mgr`.
pub(crate) fn create(
    mgr: MgrId,
    buf: Buffer,
    shape: Shape,
    dtype: DType,
    at: SourceLocation,
) -> Result<ArrayId> {
    #[cfg(feature = "gpu")]
    if let Device::Gpu(n) = super::manager_device(mgr)? {
        // A manager on a GPU creates there: the values made on the host go up once.
        let ctx = crate::backend::wgpu::ctx(n)?;
        // SAFETY: the buffer was just made and is not shared.
        let bytes = unsafe { buf.slice::<u8>() };
        let n_bytes = shape.size() * dtype.size_in_bytes();
        let dev = crate::backend::wgpu::upload("create", ctx, &bytes[..n_bytes], dtype)?;
        return create_stored(mgr, dev.into(), shape, dtype, at);
    }
    create_stored(mgr, buf.into(), shape, dtype, at)
}

/// Create an array in `mgr` from a filled buffer already on the manager's device (a
/// device kernel's second output, such as the softmax a loss saves for its gradient).
pub(crate) fn create_stored(
    mgr: MgrId,
    buf: Storage,
    shape: Shape,
    dtype: DType,
    at: SourceLocation,
) -> Result<ArrayId> {
    let me = my_shard();
    let mut ctx = Ctx::one(me);
    ctx.insert_array(
        me,
        mgr,
        Data::New(buf),
        Layout::contiguous(shape),
        dtype,
        at,
    )
}

/// A new array of `shape` and `dtype` holding `value`, beside array `like`: on its
/// device, owned by its manager, registered in the current scope (a parameter's
/// gradient, a backward seed, a `*_like` constructor). Errors: `Closed` (`like`),
/// `InvalidArgument` (a value an integer dtype cannot hold), the manager's.
pub(crate) fn full_beside(
    like: ArrayId,
    shape: Shape,
    value: f64,
    dtype: DType,
    at: SourceLocation,
) -> Result<ArrayId> {
    const OP: &str = "full_like";
    run_op_on(OP, &[like], at, |o| {
        let _ = o; // (read only with the `gpu` feature)
        // Checked before anything is allocated, on any device.
        #[cfg_attr(not(feature = "gpu"), allow(unused_variables))]
        let v = dispatch!(dtype, T => cpu::copy::fill_value::<T>(OP, value, dtype)?.to_f64());
        #[cfg(feature = "gpu")]
        if let Some(g) = o[0].gpu() {
            let buf = crate::backend::wgpu::inplace::filled(OP, g.buf.ctx(), &shape, dtype, v)?;
            return Ok(Output::Stored {
                buf: buf.into(),
                shape,
                dtype,
            });
        }
        let buf = dispatch!(dtype, T => {
            let v: T = cpu::copy::fill_value(OP, value, dtype)?;
            cpu::new_overwritten::<T>(shape.size(), |out| out.fill(v))?
        });
        Ok(Output::New { buf, shape, dtype })
    })
}

/// A view of `one` (an array of shape `[]`: all its strides become 0) as an array of
/// `shape`, through [`Layout::broadcast_strides`]: nothing is written or copied
/// (PyTorch's `expand`).
pub(crate) fn broadcast_view(one: ArrayId, shape: Shape, at: SourceLocation) -> Result<ArrayId> {
    run_op_on("broadcast_view", &[one], at, |o| {
        let l = &o[0].layout;
        debug_assert_eq!(l.shape.ndim(), 0, "a view of a 0-d array");
        Ok(Output::View {
            of: 0,
            layout: Layout {
                strides: l.broadcast_strides(&shape),
                shape,
                offset: l.offset,
            },
        })
    })
}

/// Read an array under the locks of its shard and its buffer's.
pub(crate) fn read<R>(id: ArrayId, f: impl FnOnce(&Operand<'_>) -> R) -> Result<R> {
    let ctx = Ctx::read_only(&[id.shard]);
    let _locked = NoFork::new();
    let o = ctx.operand(id)?;
    host_copy(&o, f)
}

/// `f` of operand `o` as seen on the host: `o` itself where its data lives there, else
/// a host copy of its buffer with its layout (this waits for the device's queued work
/// and copies the whole buffer back). Ops whose device kernels need values on the host
/// (index arrays checked against their bounds, a mask's count) read them here.
pub(crate) fn host_copy<R>(o: &Operand<'_>, f: impl FnOnce(&Operand<'_>) -> R) -> Result<R> {
    #[cfg(feature = "gpu")]
    if let Some(g) = o.gpu() {
        let n = g.buf.bytes() / crate::backend::wgpu::elem_bytes(o.dtype);
        let host = crate::backend::wgpu::download(g.buf, n, o.dtype)?;
        let copy = Storage::from(cpu::new_overwritten::<u8>(host.len(), |d| {
            d.copy_from_slice(&host)
        })?);
        let o = Operand { buf: &copy, ..*o };
        return Ok(f(&o));
    }
    Ok(f(o))
}

#[cfg(test)]
mod tests {
    /// The engine computes an op and a read under its locks with forking off, and
    /// turns it back on when it lets go (the in-place half: `inplace`'s tests).
    #[test]
    fn the_engine_holds_no_fork_while_it_computes_under_a_lock() {
        let m = crate::NDManager::new();
        let a = m.ones([4], crate::DType::F32);
        assert!(!super::read(a.id, |_| crate::backend::cpu::may_fork()).unwrap());
        let mut seen = None;
        let b = super::run_op("probe", &[a.id], std::panic::Location::caller(), |o| {
            seen = Some(crate::backend::cpu::may_fork());
            Ok(super::Output::View {
                of: 0,
                layout: o[0].layout.clone(),
            })
        })
        .unwrap();
        assert_eq!(seen, Some(false));
        // Outside the lock a kernel may fork again, where the kernel pool has two
        // threads or more (a one-thread pool never forks).
        let threads = crate::backend::cpu::fork_threads();
        assert_eq!(crate::backend::cpu::may_fork(), threads > 1);
        let _ = b;
        m.close();
    }
}
