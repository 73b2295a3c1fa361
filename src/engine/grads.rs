//! The operations autograd needs from the engine: parameters and their gradients,
//! zeroing and accumulating them in place, what recording an op reads, and tape holds.

use super::exec::lock_arrays;
use super::shard::{Ctx, my_shard};
use super::slab::{ArrayId, ScopeId};
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
                // float type, and the buffer is the array's contiguous data. The zeros
                // are written when the gradient is first read or written, so never
                // when backward hands it a value's buffer (`add_to_grads`).
                unsafe { buf.zero_lazily() };
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
///
/// A gradient known to be zero (zeroed by a new collector, written by nothing since:
/// [`Storage::is_zero`]) takes its value's buffer instead, PyTorch's "the first
/// gradient is assigned", when that value dies unread right after: it is registered
/// in `dying` (backward's scope, closed when this returns) and nothing else, is held
/// by no retain or tape, is read by no other parameter, has the gradient's dtype,
/// layout and byte size, and its scale is 1. The value then holds the zeros and is
/// freed with the scope. The gradient keeps its handle, its manager and its charge
/// (the bytes are the same); only the block under it changes.
pub(crate) fn add_to_grads(
    params: &[ArrayId],
    values: &[Option<(ArrayId, bool)>],
    scales: &[f64],
    dying: ScopeId,
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
    let mut ctx = Ctx::one(s);
    let sh = ctx.shr(s);
    // Check everything before writing anything.
    let mut grads: smallvec::SmallVec<[Option<&records::ArrayRec>; 4]> = smallvec::SmallVec::new();
    // The gradients that take their value's buffer: (gradient, value).
    let mut takes: smallvec::SmallVec<[(ArrayId, ArrayId); 4]> = smallvec::SmallVec::new();
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
            // (A value to be summed over its broadcast axes has none when it has the
            // gradient's layout, which `takes_over` asks.)
            if takes_over(gr, vr, dying) && scales[i] == 1.0 {
                let once = values.iter().flatten().filter(|(w, _)| *w == v).count() == 1;
                if once && !params.contains(&v) {
                    takes.push((g, v));
                    grads.push(None); // nothing to add
                    continue;
                }
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
    drop(grads);
    let sh = ctx.sh(s);
    for (g, v) in takes {
        let value = std::mem::replace(own_storage(sh, v), Storage::empty());
        let zeros = std::mem::replace(own_storage(sh, g), value);
        *own_storage(sh, v) = zeros;
    }
    true
}

/// Whether gradient `gr` (a host float array owning its buffer) may take the buffer
/// of the value whose record is `vr` instead of adding it in: see [`add_to_grads`].
/// The caller checks what concerns the other parameters and the value's scale.
fn takes_over(gr: &records::ArrayRec, vr: &records::ArrayRec, dying: ScopeId) -> bool {
    let (records::Store::Own(gb), records::Store::Own(vb)) = (&gr.store, &vr.store) else {
        return false;
    };
    gb.is_zero()
        && vb.device() == crate::Device::Cpu
        && vb.bytes() == gb.bytes()
        && vr.dtype == gr.dtype
        && vr.layout == gr.layout
        && vr.retains == 0
        && vr.holds == 0
        && vr.grad.is_none()
        && vr.scopes.len() == 1
        && vr.scopes[0].0 == dying
}

/// The buffer of live array `id`, which [`add_to_grads`] checked owns it.
fn own_storage(sh: &mut super::shard::Shard, id: ArrayId) -> &mut Storage {
    match sh.arrays.get_mut(id).map(|r| &mut r.store) {
        Some(records::Store::Own(b)) => b,
        _ => unreachable!("checked by add_to_grads: a live array owning its buffer"),
    }
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
    use super::{ArrayId, lock_arrays, zero_fill};
    use crate::{DType, GradientCollector, NDManager};

    /// A large gradient is zeroed lazily by a new collector (no pass over memory, so
    /// no kernel split), and backward's last step ([`super::add_to_grads`]) writes
    /// its zeros and adds into it with both kernels split across the kernel pool,
    /// under the lock: in-place writes take no `NoFork` (see `cpu::fork`).
    #[test]
    fn a_large_gradient_is_zeroed_and_added_into_on_the_kernel_pool() {
        use crate::backend::cpu::{fork_threads, forks_handed_over};
        let m = NDManager::new();
        let n = 1 << 19;
        let p = m.zeros([n], DType::F32).set_requires_gradient(true);
        let v = m.full([n], 2.0, DType::F32);
        let splits = fork_threads() > 1;
        let scope = crate::NDScope::new(); // not `v`'s: `v` is added in, not taken
        let add = || {
            assert!(super::add_to_grads(
                &[p.id],
                &[Some((v.id, false))],
                &[0.5],
                scope.id()
            ))
        };
        add(); // the gradient holds ones: the zeros below must overwrite them
        let before = forks_handed_over();
        let gc = GradientCollector::new();
        assert_eq!(forks_handed_over(), before, "zeroing writes nothing yet");
        add();
        assert_eq!(
            forks_handed_over() > before,
            splits,
            "zeroing and adding in"
        );
        drop(scope);
        let g = p.gradient().to_vec::<f32>().unwrap();
        assert!(g.iter().all(|&e| e == 1.0));
        drop(gc);
        m.close();
    }

    /// The address of live array `id`'s buffer.
    fn addr(id: ArrayId) -> usize {
        lock_arrays(&[id]).operand(id).unwrap().buffer_addr()
    }

    /// A zeroed gradient takes the buffer of a value that dies with backward's scope,
    /// and of no other: each condition of `takes_over` and `add_to_grads` is needed,
    /// and breaking any one of them is caught here (the value read later, or a
    /// gradient written since its zeroing, would see the wrong numbers).
    #[test]
    fn a_zeroed_gradient_takes_only_a_dying_values_buffer() {
        let m = NDManager::new();
        let n = 64;
        let p = m.zeros([n], DType::F32).set_requires_gradient(true);
        let q = m.zeros([n], DType::F32).set_requires_gradient(true);
        let g = |a: crate::NDArray| a.gradient().to_vec::<f32>().unwrap();
        let add = |ps: &[&crate::NDArray], v: &crate::NDArray, scale: f64, s: &crate::NDScope| {
            let ids: Vec<ArrayId> = ps.iter().map(|p| p.id).collect();
            let vals = vec![Some((v.id, false)); ids.len()];
            assert!(super::add_to_grads(
                &ids,
                &vals,
                &vec![scale; ids.len()],
                s.id()
            ));
        };
        let outer = crate::NDScope::new();
        let kept = m.full([n], 5.0, DType::F32); // registered in `outer`
        let scope = crate::NDScope::new();
        // Taken: the gradient is p's old buffer's successor, the value holds the zeros.
        let gc = GradientCollector::new();
        let v = m.full([n], 3.0, DType::F32);
        let at = addr(v.id);
        add(&[&p], &v, 1.0, &scope);
        assert_eq!(addr(p.gradient().id), at, "taken");
        assert_eq!(g(p), vec![3.0; n]);
        assert_eq!(v.to_vec::<f32>().unwrap(), vec![0.0; n]);
        // Not zero any more: added into.
        let w = m.full([n], 2.0, DType::F32);
        add(&[&p], &w, 1.0, &scope);
        assert_eq!((addr(p.gradient().id), g(p)), (at, vec![5.0; n]), "added");
        drop(gc);
        // A value registered in another scope than backward's is read later.
        drop(GradientCollector::new()); // zeroes the gradients
        add(&[&p], &kept, 1.0, &scope);
        assert_eq!(g(p), vec![5.0; n]);
        assert_eq!(
            kept.to_vec::<f32>().unwrap(),
            vec![5.0; n],
            "another scope's"
        );
        // A retained value, and one held by a tape, outlive the scope.
        drop(GradientCollector::new()); // zeroes the gradients
        let r = m.full([n], 7.0, DType::F32);
        r.retain();
        add(&[&p], &r, 1.0, &scope);
        assert_eq!(r.to_vec::<f32>().unwrap(), vec![7.0; n], "retained");
        r.release();
        drop(GradientCollector::new()); // zeroes the gradients
        let h = m.full([n], 8.0, DType::F32);
        let mut held = smallvec::smallvec![h.id];
        super::hold_all(&mut held);
        add(&[&p], &h, 1.0, &scope);
        assert_eq!(h.to_vec::<f32>().unwrap(), vec![8.0; n], "held");
        super::unhold_all(&held);
        // A scaled value is added (the buffer holds the unscaled numbers).
        drop(GradientCollector::new()); // zeroes the gradients
        let s = m.full([n], 4.0, DType::F32);
        add(&[&p], &s, 0.5, &scope);
        assert_eq!(g(p), vec![2.0; n], "scaled");
        // A gradient written since its zeroing is added into.
        drop(GradientCollector::new()); // zeroes the gradients
        zero_fill(p.gradient().id).unwrap(); // zero, but written by an op: not known
        let z = m.full([n], 6.0, DType::F32);
        add(&[&p], &z, 1.0, &scope);
        assert_eq!(z.to_vec::<f32>().unwrap(), vec![6.0; n], "written since");
        // Two parameters reading one value both get it.
        drop(GradientCollector::new()); // zeroes the gradients
        let two = m.full([n], 9.0, DType::F32);
        add(&[&p, &q], &two, 1.0, &scope);
        assert_eq!((g(p), g(q)), (vec![9.0; n], vec![9.0; n]), "shared value");
        // A value to be summed down to the gradient's shape that has that shape (what
        // layer_norm's rule hands back) is taken; one of a broadcast shape is summed.
        drop(GradientCollector::new());
        let u = m.full([n], 1.5, DType::F32);
        let at = addr(u.id);
        assert!(super::add_to_grads(
            &[p.id],
            &[Some((u.id, true))],
            &[1.0],
            scope.id()
        ));
        assert_eq!(
            (addr(p.gradient().id), g(p)),
            (at, vec![1.5; n]),
            "same shape"
        );
        drop(GradientCollector::new());
        let wide = m.full([2, n], 0.5, DType::F32);
        assert!(super::add_to_grads(
            &[p.id],
            &[Some((wide.id, true))],
            &[1.0],
            scope.id()
        ));
        assert_eq!(g(p), vec![1.0; n], "summed over the broadcast axis");
        drop(scope);
        drop(outer);
        assert_eq!(
            m.memory().live_arrays,
            4,
            "the parameters and their gradients"
        );
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
