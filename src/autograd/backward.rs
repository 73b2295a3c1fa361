//! The backward pass: walks the tape from the loss back to the leaves, asks each
//! node's rule (the op's [`super::Backward`] impl, beside the op) for its inputs'
//! gradients, kept lazy ([`LazyGrad`]) where a rule only scales or passes them on, and
//! adds them into the parameters' gradients in place.

use super::{BackwardCtx, Base, Env, LEAF, LazyGrad, LazyGrads, NO_SLOT, Node, Tape};
use crate::backend::cpu;
use crate::dtype::{Native, dispatch_float};
use crate::engine::{self, ArrayId, Layout};
use crate::error::{NdError, Result};
use crate::{NDArray, NDManager, Shape};
use smallvec::SmallVec;

/// Run backward over `tape`'s nodes from `loss`, adding into the parameters'
/// gradients. The gradient of a node's output is kept in its slot (the node's index)
/// and a parameter's in its leaf slot, so no map is built.
pub(super) fn run(tape: &mut Tape, loss: NDArray) -> Result<()> {
    let mut slots = std::mem::take(&mut tape.slots);
    let r = run_in(tape, loss, &mut slots);
    slots.clear();
    tape.slots = slots;
    r
}

/// [`run`] with `slots` (empty) as the scratch for the gradients.
fn run_in(tape: &Tape, loss: NDArray, slots: &mut Vec<Option<LazyGrad>>) -> Result<()> {
    let nodes = &tape.nodes;
    let (shape, dtype, manager, loss_is_param) = engine::loss_info(loss.id)?;
    let env = Env {
        manager: NDManager { id: manager },
        dtype,
    };
    let seed = LazyGrad {
        base: Base::Ones(shape),
        scale: 1.0,
    };
    // One slot per node, one per parameter, and one for a loss that is a parameter
    // the tape never read.
    slots.resize(nodes.len() + tape.leaf_ids.len() + 1, None);
    let (grads, leaves) = slots.split_at_mut(nodes.len());
    let mut loss_leaf: Option<ArrayId> = None;
    match tape.tracked.get(&loss.id) {
        Some(&i) => grads[i as usize] = Some(seed),
        None if loss_is_param => {
            let slot = match tape.leaf_ids.iter().position(|&id| id == loss.id) {
                Some(s) => s,
                None => {
                    loss_leaf = Some(loss.id);
                    tape.leaf_ids.len()
                }
            };
            leaves[slot] = Some(seed);
        }
        None => {
            return Err(NdError::invalid(
                "backward",
                "the loss was not computed from an array that requires a gradient while \
                 this GradientCollector was recording",
            ));
        }
    }
    for (n, node) in nodes.iter().enumerate().rev() {
        let Some(g) = grads[n].take() else {
            continue;
        };
        let inputs = input_grads(node, g, &env)?;
        for (i, gi) in inputs.into_iter().enumerate() {
            let Some(gi) = gi else { continue };
            let d = node.dest[i];
            let slot = match d {
                NO_SLOT => continue,
                _ if d & LEAF != 0 => &mut leaves[(d & !LEAF) as usize],
                _ => &mut grads[d as usize],
            };
            *slot = Some(match slot.take() {
                Some(prev) => prev.add(gi, &env)?,
                None => gi,
            });
        }
    }
    // Add into the parameters' gradients in place, all or nothing: if one gradient
    // array was freed (e.g. with a manager the parameter has left), fail before
    // changing any of them. The common case takes one engine lock for all of them.
    let ids = tape.leaf_ids.iter().copied().chain(loss_leaf);
    let mut params: SmallVec<[ArrayId; 4]> = SmallVec::new();
    let mut gs: SmallVec<[LazyGrad; 4]> = SmallVec::new();
    for (id, g) in ids.zip(leaves.iter_mut()) {
        if let Some(g) = g.take() {
            params.push(id);
            gs.push(g);
        }
    }
    let values: SmallVec<[Option<(ArrayId, bool)>; 4]> = gs
        .iter()
        .map(|g| match &g.base {
            Base::Arr(a) => Some((a.id, false)),
            Base::Unreduced(a, _) => Some((a.id, true)),
            Base::Ones(_) => None,
        })
        .collect();
    let done = engine::add_to_grads(&params, &values, &mut |i, mut t, v| {
        let scale = gs[i].scale;
        let reduce = matches!(gs[i].base, Base::Unreduced(..));
        dispatch_float!(t.dtype, T => {
            let s = T::from_f64(scale);
            match &v {
                None => cpu::assign_unary::<T>(t.strided::<T>(), move |p| p.add(s)),
                Some(b) if reduce && b.shape() != &t.layout.shape => {
                    // What `unbroadcast`'s sum op computes, then added as below.
                    let sums = unbroadcast_sums::<T>(b, &t.layout.shape);
                    let layout = Layout::contiguous(t.layout.shape.clone());
                    let b = cpu::Strided { data: &sums, layout: &layout };
                    if scale == 1.0 {
                        cpu::assign_binary::<T>(t.strided::<T>(), b, |p, q| p.add(q))
                    } else {
                        cpu::assign_binary::<T>(t.strided::<T>(), b, move |p, q| {
                            p.add(q.mul(s))
                        })
                    }
                }
                Some(b) if scale == 1.0 => {
                    cpu::assign_binary::<T>(t.strided::<T>(), b, |p, q| p.add(q))
                }
                Some(b) => cpu::assign_binary::<T>(t.strided::<T>(), b, move |p, q| {
                    p.add(q.mul(s))
                }),
            }
        }, else unreachable!("a gradient is float"));
    });
    if done {
        return Ok(());
    }
    let mut updates: SmallVec<[(NDArray, LazyGrad); 4]> = SmallVec::new();
    for (id, g) in params.into_iter().zip(gs) {
        if let Ok(Some(pg)) = engine::grad(id) {
            updates.push((NDArray { id: pg }, g.settle()?));
        }
    }
    for (pg, _) in &updates {
        pg.try_shape()?;
    }
    for (pg, g) in updates {
        accumulate(pg, g)?;
    }
    Ok(())
}

/// The sums of `b` over the axes that broadcasting added or stretched to reach it from
/// `shape`, row-major: the values of `unbroadcast`'s sum op, computed by the same
/// kernels in the same order (so bit for bit the same).
fn unbroadcast_sums<T: Native>(b: &engine::Operand<'_>, shape: &Shape) -> cpu::Accs<T> {
    let (gd, td) = (b.shape().dims(), shape.dims());
    let lead = gd.len() - td.len();
    let mut axes: SmallVec<[usize; 4]> = (0..lead).collect();
    for (i, &t) in td.iter().enumerate() {
        if t == 1 && gd[lead + i] != 1 {
            axes.push(lead + i);
        }
    }
    if cpu::prefers_outer(b.layout, &axes) {
        cpu::Accs::from_vec(cpu::reduce_outer::<T, T>(b, &axes, T::ZERO, |acc, x| {
            acc.add(x)
        }))
    } else {
        cpu::reduce::<T, T>(b, &axes, T::ZERO, |acc, d, s, n, st| {
            acc.add(cpu::sum_row(d, s, n, st))
        })
    }
}

/// `pg += g` in place, with `g`'s scale fused into the kernel.
fn accumulate(pg: NDArray, g: LazyGrad) -> Result<()> {
    const OP: &str = "backward";
    let scale = g.scale;
    match g.base {
        Base::Unreduced(..) => unreachable!("settled"),
        Base::Ones(_) => engine::run_inplace(pg.id, &[], |mut t, _| {
            dispatch_float!(t.dtype, T => {
                let s = T::from_f64(scale);
                cpu::assign_unary::<T>(&mut t, move |p| p.add(s));
            }, else return Err(NdError::UnsupportedDType { op: OP, dtype: t.dtype, array: t.desc() }));
            Ok(())
        }),
        Base::Arr(b) => engine::run_inplace(pg.id, &[b.id], |mut t, o| {
            let b = &o[0];
            if t.dtype != b.dtype {
                return Err(NdError::DTypeMismatch {
                    op: OP,
                    lhs: t.desc(),
                    rhs: b.desc(),
                });
            }
            if Shape::broadcast(&t.layout.shape, b.shape()).as_ref() != Some(&t.layout.shape) {
                return Err(NdError::ShapeMismatch {
                    op: OP,
                    lhs: t.desc(),
                    rhs: b.desc(),
                });
            }
            dispatch_float!(t.dtype, T => {
                    if scale == 1.0 {
                        cpu::assign_binary::<T>(&mut t, b, |p, q| p.add(q));
                    } else {
                        let s = T::from_f64(scale);
                        cpu::assign_binary::<T>(&mut t, b, move |p, q| p.add(q.mul(s)));
                    }
                }, else return Err(NdError::UnsupportedDType { op: OP, dtype: t.dtype, array: t.desc() }));
            Ok(())
        }),
    }
}

/// The gradients of `node`'s inputs (None where not needed) given its output's `g`,
/// from the node's rule.
fn input_grads(node: &Node, g: LazyGrad, env: &Env) -> Result<LazyGrads> {
    let g = g.settle()?;
    let cx = BackwardCtx {
        ids: &node.inputs,
        shapes: &node.shapes,
        output: arr(node.output),
        needs: node.needs,
        env,
    };
    let mut r = node.rule.backward_lazy(&cx, g)?;
    if r.len() != node.inputs.len() {
        r.resize(node.inputs.len(), None);
    }
    for (i, gi) in r.iter_mut().enumerate() {
        if !cx.need(i) {
            *gi = None;
        }
    }
    Ok(r)
}

use super::arr;
