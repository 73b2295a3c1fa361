//! The operations autograd needs from the engine: parameters and their gradients,
//! zeroing and accumulating them in place, what recording an op reads, and tape holds.

use super::exec::lock_arrays;
use super::shard::{Ctx, my_shard};
use super::slab::ArrayId;
use super::{Cause, Layout, Storage, lock_for_free, lock_record, records};
use crate::backend::cpu;
use crate::dtype::{dispatch, dispatch_float};
use crate::error::{NdError, Result, SourceLocation};
use crate::{DType, Shape};

/// The gradient array of parameter `id`, if it requires one.
pub(crate) fn grad(id: ArrayId) -> Result<Option<ArrayId>> {
    Ok(lock_record(id).array(id)?.grad)
}

/// Whether `id` is a live parameter (has a gradient array).
pub(crate) fn is_param(id: ArrayId) -> bool {
    lock_record(id).array(id).is_ok_and(|r| r.grad.is_some())
}

/// Make `grad` the gradient of `id` unless it has one already (then `grad` is freed
/// and the existing one returned): two threads racing get one gradient.
pub(crate) fn install_grad(id: ArrayId, grad: ArrayId) -> Result<ArrayId> {
    let mut ctx = lock_arrays(&[id, grad]);
    let existing = ctx.array(id)?.grad;
    if let Some(g) = existing {
        ctx.free_array(grad, None, Cause::Explicit);
        return Ok(g);
    }
    ctx.array_mut(id).grad = Some(grad);
    ctx.sh(id.shard).params.push(id);
    Ok(grad)
}

/// Remove and free the gradient of `id` (no-op without one).
pub(crate) fn drop_grad(id: ArrayId, at: SourceLocation) -> Result<()> {
    let mut ctx = Ctx::all();
    let g = ctx.array(id)?.grad;
    ctx.array_mut(id).grad = None;
    if let Some(g) = g {
        ctx.free_array(g, Some(at), Cause::Explicit);
    }
    Ok(())
}

/// Zero the gradients of the live parameters created on this thread (what a collector
/// on this thread zeroes; see [`is_mine`]), pruning dead parameters. A gradient that
/// owns its buffer is zeroed here, under the lock this already holds; the others (a
/// view of the gradient was taken, or it lives in another shard) are returned for the
/// caller to zero with an in-place op, which waits for their outside readers.
pub(crate) fn zero_my_param_grads() -> Vec<ArrayId> {
    let me = my_shard();
    let mut ctx = Ctx::one(me);
    let sh = ctx.sh(me);
    let mut params = std::mem::take(&mut sh.params);
    let mut grads = smallvec::SmallVec::<[ArrayId; 16]>::new();
    params.retain(|&p| match sh.arrays.get(p).and_then(|r| r.grad) {
        Some(g) => {
            if is_mine(p) {
                grads.push(g);
            }
            true
        }
        None => false,
    });
    sh.params = params;
    let mut rest = Vec::new();
    for g in grads {
        match sh.arrays.get(g).map(|r| &r.store) {
            Some(records::Store::Own(buf))
                if g.shard == me && buf.device() == crate::Device::Cpu =>
            {
                // SAFETY: `g` is the only array viewing `buf` (`Own`), so no other
                // slice of it exists, no op reads it outside a lock (a snapshot would
                // have moved it to a shared record first), and its shard's lock is
                // held exclusively here. Every bit pattern of zeros is 0 of every
                // float type, and the buffer is the array's contiguous data.
                unsafe { buf.fill_zero() };
            }
            Some(_) => rest.push(g),
            None => {}
        }
    }
    rest
}

/// The gradient array of a parameter, writable in place under its shard's lock: what
/// [`add_to_grads`] hands its kernel.
pub(crate) struct GradMut<'a> {
    buf: &'a Storage,
    pub layout: &'a Layout,
    pub dtype: DType,
}

impl GradMut<'_> {
    /// The gradient's whole buffer and layout, as the kernels take them.
    pub(crate) fn strided<T: crate::dtype::Native>(&mut self) -> cpu::StridedMut<'_, T> {
        debug_assert_eq!(std::mem::size_of::<T>(), self.dtype.size_in_bytes());
        cpu::StridedMut {
            // SAFETY: built only by `add_to_grads`, under the exclusive lock of the
            // gradient's shard, for a gradient that owns its buffer (`Own`: no view
            // and no outside reader of it exists) and that no value read alongside
            // shares; `&mut self` keeps a second slice from being taken.
            data: unsafe { self.buf.slice_mut::<T>() },
            layout: self.layout,
        }
    }
}

/// Backward's last step in one lock round trip: for each `params[i]` that is live and
/// has a gradient array, call `f(i, gradient, value)` with `value` the operand of
/// `values[i]`'s array (`None`: no array, e.g. a gradient of ones), for `f` to add it
/// into the gradient in place. Only the common case is done here: every array in one
/// shard, every gradient a float array and the sole viewer of its buffer, no value
/// sharing a gradient's buffer, each value of its gradient's dtype and broadcastable
/// to its shape or, where `values[i]`'s flag is set (a value to be summed over its
/// broadcast axes), the gradient's shape broadcastable to the value's. Otherwise
/// nothing is done and `false` returned, for the caller to take the general path
/// (which also reports the errors).
pub(crate) fn add_to_grads(
    params: &[ArrayId],
    values: &[Option<(ArrayId, bool)>],
    scales: &[f64],
) -> bool {
    let Some(first) = params.first() else {
        return true;
    };
    let s = first.shard;
    if params
        .iter()
        .chain(values.iter().flatten().map(|(v, _)| v))
        .any(|i| i.shard != s)
    {
        return false;
    }
    // No `NoFork`: as any in-place write, a large gradient is added in across the
    // kernel pool, under the lock (see `cpu::fork`).
    let ctx = Ctx::one(s);
    let sh = ctx.shr(s);
    // Check everything before writing anything.
    let mut grads: smallvec::SmallVec<[Option<&records::ArrayRec>; 4]> = smallvec::SmallVec::new();
    for (i, &p) in params.iter().enumerate() {
        let Some(g) = sh.arrays.get(p).and_then(|r| r.grad) else {
            grads.push(None); // a closed parameter, or one without a gradient now
            continue;
        };
        if g.shard != s {
            return false;
        }
        let Some(gr) = sh.arrays.get(g) else {
            return false; // closed by hand: the general path reports it
        };
        // Host gradients only: the general path reports another device.
        if !matches!(gr.store, records::Store::Own(_))
            || !gr.dtype.is_float()
            || sh.data_of(gr).device() != crate::Device::Cpu
        {
            return false;
        }
        if let Some((v, reduce)) = values[i] {
            let Some(vr) = sh.arrays.get(v) else {
                return false;
            };
            if sh.data_of(vr).device() != crate::Device::Cpu {
                return false;
            }
            let (gs, vs) = (&gr.layout.shape, &vr.layout.shape);
            let to = if reduce { vs } else { gs };
            if vr.dtype != gr.dtype || Shape::broadcast(gs, vs).as_ref() != Some(to) {
                return false;
            }
        }
        grads.push(Some(gr));
    }
    // No value may read a buffer that one of the gradients is (an `Own` buffer has
    // one viewer, but a value may be that gradient array itself).
    for (v, _) in values.iter().flatten() {
        let vaddr = sh.arrays.get(*v).map(|r| sh.data_of(r).addr());
        if grads
            .iter()
            .flatten()
            .any(|g| Some(sh.data_of(g).addr()) == vaddr)
        {
            return false;
        }
    }
    for (i, g) in grads.iter().enumerate() {
        let Some(gr) = g else { continue };
        let value = values[i].and_then(|(v, _)| ctx.operand(v).ok());
        let sum = values[i].is_some_and(|(_, s)| s);
        let mut t = GradMut {
            buf: sh.data_of(gr),
            layout: &gr.layout,
            dtype: gr.dtype,
        };
        dispatch_float!(t.dtype, T => {
            let v = value.as_ref().map(cpu::Strided::<T>::from);
            cpu::grad::add_into::<T>(t.strided::<T>(), v, scales[i], sum);
        }, else unreachable!("a gradient is float"));
    }
    true
}

/// `pg += scale * v` in place (`v` `None`: all ones), `v` of `pg`'s dtype and
/// broadcastable to its shape (or, with `sum`, summed over its broadcast axes down to
/// it): the general path of [`add_to_grads`], one array at a time. `op` names the
/// caller in errors.
pub(crate) fn add_into(
    op: &'static str,
    pg: ArrayId,
    v: Option<ArrayId>,
    scale: f64,
    sum: bool,
) -> Result<()> {
    let vs: smallvec::SmallVec<[ArrayId; 1]> = v.into_iter().collect();
    super::run_inplace_on(op, pg, &vs, |mut t, o| {
        let v = o.first();
        if let Some(b) = v {
            if t.dtype != b.dtype {
                return Err(NdError::DTypeMismatch {
                    op,
                    lhs: t.desc(),
                    rhs: b.desc(),
                });
            }
            let (ts, bs) = (&t.layout.shape, b.shape());
            let to = if sum { bs } else { ts };
            if Shape::broadcast(ts, bs).as_ref() != Some(to) {
                return Err(NdError::ShapeMismatch {
                    op,
                    lhs: t.desc(),
                    rhs: b.desc(),
                });
            }
        }
        #[cfg(feature = "gpu")]
        if let Some(g) = t.gpu() {
            if !t.dtype.is_float() {
                return Err(NdError::UnsupportedDType {
                    op,
                    dtype: t.dtype,
                    array: t.desc(),
                });
            }
            // A value to be summed down to the gradient's shape is summed first (a
            // reduction kernel), then added in.
            use crate::backend::wgpu::reduce::{Reduce, reduce};
            use crate::backend::wgpu::{inplace, kernels};
            return match v.and_then(|o| o.gpu()) {
                Some(x) if sum && x.layout.shape != t.layout.shape => {
                    let ts = t.layout.shape.clone();
                    // The added leading axes and the stretched ones; the sum has
                    // the gradient's elements in its order (only size-1 axes differ).
                    let (xd, td) = (x.layout.shape.dims(), ts.dims());
                    let lead = xd.len() - td.len();
                    let axes: Vec<usize> = (0..xd.len())
                        .filter(|&d| d < lead || (td[d - lead] == 1 && xd[d] != 1))
                        .collect();
                    let (red, _) = reduce(op, Reduce::Sum, x, &axes)?;
                    let l = Layout::contiguous(ts);
                    let view = kernels::View {
                        buf: &red,
                        layout: &l,
                        dtype: x.dtype,
                    };
                    inplace::add_scaled(op, g, Some(view), scale)
                }
                x => inplace::add_scaled(op, g, x, scale),
            };
        }
        dispatch_float!(t.dtype, T => {
            let v = v.map(cpu::Strided::<T>::from);
            cpu::grad::add_into::<T>((&mut t).into(), v, scale, sum);
        }, else return Err(NdError::UnsupportedDType { op, dtype: t.dtype, array: t.desc() }));
        Ok(())
    })
}

/// Set every element of `id` to zero in place.
pub(crate) fn zero_fill(id: ArrayId) -> Result<()> {
    super::run_inplace_on("zero_grad", id, &[], |mut t, _| {
        #[cfg(feature = "gpu")]
        if let Some(g) = t.gpu() {
            return crate::backend::wgpu::inplace::fill("zero_grad", g, 0.0);
        }
        dispatch!(t.dtype, T => cpu::assign_unary::<T>(&mut t, |_| <T as crate::dtype::Native>::ZERO));
        Ok(())
    })
}

/// What recording an op needs from the engine, read under one lock round trip.
pub(crate) struct TapeInfo {
    /// Bit `i`: input `i` is a parameter (has a gradient array).
    pub params: u8,
    /// Whether the output is a live float array.
    pub float: bool,
    /// The inputs' shapes; empty unless the op is recorded (an input is a parameter or
    /// in `tracked`, and the output is float).
    pub shapes: smallvec::SmallVec<[Shape; 3]>,
}

/// Per input: whether it is a parameter; whether `output` is a live float array; and,
/// only if the op will be recorded (`tracked` (a mask of inputs already on the tape) or
/// a parameter input, and a float output), the inputs' shapes. `None` if an input is
/// closed. One lock round trip.
pub(crate) fn tape_info(inputs: &[ArrayId], output: ArrayId, tracked: u8) -> Option<TapeInfo> {
    let ctx = if inputs.iter().all(|i| i.shard == output.shard) {
        Ctx::one(output.shard)
    } else {
        let mut shards: smallvec::SmallVec<[u32; 4]> = inputs.iter().map(|i| i.shard).collect();
        shards.push(output.shard);
        Ctx::set(&shards)
    };
    let mut params = 0u8;
    for (i, &id) in inputs.iter().enumerate() {
        if ctx.array(id).ok()?.grad.is_some() {
            params |= 1 << i;
        }
    }
    let float = ctx.array(output).is_ok_and(|r| r.dtype.is_float());
    let mut shapes = smallvec::SmallVec::new();
    if float && (params | tracked) != 0 {
        for &id in inputs {
            shapes.push(ctx.array(id).ok()?.layout.shape.clone());
        }
    }
    Some(TapeInfo {
        params,
        float,
        shapes,
    })
}

/// `id`'s shape and dtype, and whether it is a parameter, under one lock (the
/// loss of a backward pass).
pub(crate) fn loss_info(id: ArrayId) -> Result<(Shape, DType, bool)> {
    let ctx = lock_record(id);
    let r = ctx.array(id)?;
    Ok((r.layout.shape.clone(), r.dtype, r.grad.is_some()))
}

/// Whether `id` was created on this thread (a parameter its collectors zero when
/// they start). The parameters an exited thread left in the shard this thread adopted
/// are not: each collector zeroes them when its tape first records them, as it does
/// another thread's.
pub(crate) fn is_mine(id: ArrayId) -> bool {
    super::shard::created_here(id)
}

/// Tape holds on each of `ids`: each keeps its array alive past the close of its
/// scopes until [`unhold`]; taken under one lock round trip; the ids that
/// could not be held (closed arrays) are removed from `ids`.
pub(crate) fn hold_all(ids: &mut smallvec::SmallVec<[ArrayId; 4]>) {
    if ids.is_empty() {
        return;
    }
    let mut ctx = lock_arrays(ids);
    ids.retain(|id| ctx.hold(*id).is_ok());
}

/// Drop one tape hold on each of `ids` (see [`unhold`]): those whose release stays in
/// this thread's shard under one lock, the others one by one.
pub(crate) fn unhold_all(ids: &[ArrayId]) {
    let me = my_shard();
    let mut rest: smallvec::SmallVec<[ArrayId; 4]> = smallvec::SmallVec::new();
    {
        let mut ctx = Ctx::one(me);
        for &id in ids {
            // The common case: the array stays alive (its scope is open, or another
            // hold or a retain keeps it), so dropping the hold is a decrement.
            if id.shard == me
                && let Ctx::One(_, sh) = &mut ctx
                && let Some(r) = sh.arrays.get_mut(id)
                && (r.holds > 1 || r.retains > 0 || !r.scopes.is_empty())
            {
                r.holds = r.holds.saturating_sub(1);
                continue;
            }
            let local = id.shard == me && matches!(&ctx, Ctx::One(_, sh) if sh.free_is_local(id));
            if local {
                ctx.unhold(id);
            } else {
                rest.push(id);
            }
        }
    }
    for id in rest {
        unhold(id);
    }
}

/// Drop a tape hold (see [`Ctx::unhold`]).
pub(crate) fn unhold(id: ArrayId) {
    lock_for_free(id).unhold(id)
}

#[cfg(test)]
mod tests {
    use crate::{DType, GradientCollector, NDManager};

    /// A large gradient is zeroed (by a new collector) and added into (by backward's
    /// last step, [`super::add_to_grads`]) with its kernel split across the kernel
    /// pool, under the lock: in-place writes take no `NoFork` (see `cpu::fork`).
    #[test]
    fn a_large_gradient_is_zeroed_and_added_into_on_the_kernel_pool() {
        use crate::backend::cpu::{fork_threads, forks_handed_over};
        let m = NDManager::new();
        let n = 1 << 19;
        let p = m.zeros([n], DType::F32).set_requires_gradient(true);
        let v = m.full([n], 2.0, DType::F32);
        let splits = fork_threads() > 1;
        let before = forks_handed_over();
        let gc = GradientCollector::new();
        assert_eq!(forks_handed_over() > before, splits, "zeroing");
        let before = forks_handed_over();
        assert!(super::add_to_grads(&[p.id], &[Some((v.id, false))], &[0.5]));
        assert_eq!(forks_handed_over() > before, splits, "adding in");
        let g = p.gradient().to_vec::<f32>().unwrap();
        assert!(g.iter().all(|&e| e == 1.0));
        drop(gc);
        m.close();
    }

    /// Issue 10, point 5 (collectors on two threads never interfere) when a thread
    /// adopts the shard of one that exited: thread A makes a parameter and exits, this
    /// thread trains it, and thread C, which adopted A's shard, starts a collector
    /// between this thread's backward and its read of the gradient. C's collector must
    /// leave that gradient alone (it zeroed it when "mine" meant "lives in my shard"),
    /// and must still zero the parameters C itself made.
    #[test]
    fn a_collector_on_an_adopted_shard_zeroes_only_its_threads_parameters() {
        let m = NDManager::new();
        let mut adopted = 0;
        for _ in 0..20 {
            let ma = m.clone();
            let w = std::thread::spawn(move || {
                ma.create(&[1.0f32, 2.0], [2]).set_requires_gradient(true)
            })
            .join()
            .unwrap();
            {
                let gc = GradientCollector::new();
                gc.backward((w * 3.0).sum()).unwrap();
            }
            assert_eq!(w.gradient().to_vec::<f32>().unwrap(), [3.0, 3.0]);
            let mc = m.clone();
            let (here, own_grad) = std::thread::spawn(move || {
                let p = mc.create(&[5.0f32], [1]).set_requires_gradient(true);
                {
                    let gc = GradientCollector::new();
                    gc.backward((p * 2.0).sum()).unwrap();
                }
                assert_eq!(p.gradient().to_vec::<f32>().unwrap(), [2.0]);
                let _gc = GradientCollector::new(); // zeroes `p`'s gradient, not `w`'s
                (
                    p.id.shard == w.id.shard,
                    p.gradient().to_vec::<f32>().unwrap(),
                )
            })
            .join()
            .unwrap();
            assert_eq!(
                own_grad,
                [0.0],
                "a collector zeroes its thread's parameters"
            );
            // Another test's thread may have exited in between and been adopted instead.
            if here {
                adopted += 1;
                assert_eq!(w.gradient().to_vec::<f32>().unwrap(), [3.0, 3.0]);
            }
        }
        assert!(adopted > 0, "no thread adopted the exited thread's shard");
        m.close();
    }
}
