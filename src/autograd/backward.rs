//! The backward pass: walks the tape from the loss back to the leaves, asks each
//! node's rule for its inputs' gradients (`rules.rs`, or a [`super::Backward`] impl
//! beside the op) and accumulates them into the parameters' gradients. Small
//! elementwise rules run on a fast path over plain buffers ([`G`]) without making
//! arrays.

use super::{LEAF, NO_SLOT, Node, ReduceKind, Rule, Tape};
use crate::backend::cpu;
use crate::dtype::{Native, dispatch_float};
use crate::engine::{self, ArrayId, Layout};
use crate::error::{NdError, Result};
use crate::opkind::{BinOp, UnOp};
use crate::{DType, NDArray, NDManager, Shape};
use smallvec::SmallVec;

/// A gradient flowing backward, kept as `scale * base` so that scalar factors
/// (`x / 2`, `mean`, `square`'s 2, `neg`) and the all-ones seed cost no op until a
/// rule needs the array: [`G::array`].
#[derive(Clone, Debug)]
pub(super) struct G {
    base: Base,
    scale: f64,
}

#[derive(Clone, Debug)]
enum Base {
    /// An array (a gradient computed by a rule, or a forward array such as the input
    /// of `square`).
    Arr(NDArray),
    /// All ones of this shape (the seed and what `sum`/`mean`/`reshape` make of it).
    Ones(Shape),
    /// An array still to be summed over its broadcast axes to this shape
    /// ([`NDArray::unbroadcast`]): deferred so that a parameter's gradient, which gets it as
    /// its only contribution, sums it in the kernel that adds it in (no array made).
    /// Made an array ([`G::settle`]) before anything else reads it.
    Unreduced(NDArray, Shape),
}

/// Where [`G::array`] creates the arrays of [`Base::Ones`]: the loss's manager and dtype.
struct Env {
    manager: NDManager,
    dtype: DType,
}

impl G {
    fn arr(a: NDArray) -> G {
        G {
            base: Base::Arr(a),
            scale: 1.0,
        }
    }

    fn scaled(self, s: f64) -> G {
        G {
            scale: self.scale * s,
            ..self
        }
    }

    /// `scale * base` as an array (no op when the scale is 1 and the base an array).
    fn array(self, env: &Env) -> Result<NDArray> {
        let g = self.settle()?;
        match g.base {
            Base::Ones(shape) => env.manager.try_full(shape, g.scale, env.dtype),
            Base::Arr(a) if g.scale == 1.0 => Ok(a),
            Base::Arr(a) => a.try_mul(g.scale),
            Base::Unreduced(..) => unreachable!("settled"),
        }
    }

    /// The same gradient with a [`Base::Unreduced`] base summed to its shape.
    fn settle(self) -> Result<G> {
        match self.base {
            Base::Unreduced(a, shape) => Ok(G {
                base: Base::Arr(a.unbroadcast(&shape)?),
                scale: self.scale,
            }),
            _ => Ok(self),
        }
    }

    /// The sum of two gradients of one array.
    fn add(self, other: G, env: &Env) -> Result<G> {
        let (this, other) = (self.settle()?, other.settle()?);
        match (this.base, other.base) {
            (Base::Ones(s), Base::Ones(_)) => Ok(G {
                base: Base::Ones(s),
                scale: this.scale + other.scale,
            }),
            (Base::Arr(a), Base::Arr(b)) if this.scale == other.scale => Ok(G {
                base: Base::Arr(a.try_add(b)?),
                scale: this.scale,
            }),
            (a, b) => {
                let a = G { base: a, ..this }.array(env)?;
                let b = G { base: b, ..other }.array(env)?;
                Ok(G::arr(a.try_add(b)?))
            }
        }
    }

    /// [`NDArray::unbroadcast`]: summed over broadcast axes to `shape`.
    fn unbroadcast(self, shape: &Shape) -> Result<G> {
        match self.base {
            Base::Ones(gs) => {
                if gs == *shape {
                    return Ok(G {
                        base: Base::Ones(gs),
                        ..self
                    });
                }
                // Each element of the result sums this many ones.
                let (n, m) = (gs.size(), shape.size());
                let count = n.checked_div(m).map_or(1.0, |c| c as f64);
                Ok(G {
                    base: Base::Ones(shape.clone()),
                    scale: self.scale * count,
                })
            }
            // Summed when read (see `Base::Unreduced`).
            Base::Arr(a) => Ok(G {
                base: Base::Unreduced(a, shape.clone()),
                scale: self.scale,
            }),
            Base::Unreduced(..) => self.settle()?.unbroadcast(shape),
        }
    }
}

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
fn run_in(tape: &Tape, loss: NDArray, slots: &mut Vec<Option<G>>) -> Result<()> {
    let nodes = &tape.nodes;
    let (shape, dtype, manager, loss_is_param) = engine::loss_info(loss.id)?;
    let env = Env {
        manager: NDManager { id: manager },
        dtype,
    };
    let seed = G {
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
    let mut gs: SmallVec<[G; 4]> = SmallVec::new();
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
    let mut updates: SmallVec<[(NDArray, G); 4]> = SmallVec::new();
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
fn accumulate(pg: NDArray, g: G) -> Result<()> {
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

/// The gradients of `node`'s inputs (None where not needed) given its output's `g`:
/// the rules that only scale, reshape or pass `g` on keep it lazy; the others get it
/// as an array ([`input_grads_arr`]).
fn input_grads(node: &Node, g: G, env: &Env) -> Result<SmallVec<[Option<G>; 3]>> {
    let g = g.settle()?;
    let need = |i: usize| node.needs & (1 << i) != 0;
    let x = arr(node.inputs[0]);
    let mut r: SmallVec<[Option<G>; 3]> = nones(node.inputs.len());
    let ones = matches!(g.base, Base::Ones(_));
    match &node.rule {
        Rule::Binary(op @ (BinOp::Add | BinOp::Sub)) => {
            // `g` has the output's shape: an input of that shape takes it as it is.
            let out = Shape::broadcast(&node.shapes[0], &node.shapes[1]);
            let fit = |g: G, i: usize| -> Result<G> {
                if out.as_ref() == Some(&node.shapes[i]) {
                    Ok(g)
                } else {
                    g.unbroadcast(&node.shapes[i])
                }
            };
            if need(1) {
                let gy = if *op == BinOp::Sub {
                    g.clone().scaled(-1.0)
                } else {
                    g.clone()
                };
                r[1] = Some(fit(gy, 1)?);
            }
            if need(0) {
                r[0] = Some(fit(g, 0)?);
            }
            return Ok(r);
        }
        Rule::Binary(BinOp::Mul) if !ones => {
            let Base::Arr(b) = g.base else { unreachable!() };
            let y = arr(node.inputs[1]);
            for (i, other) in [(0, y), (1, x)] {
                if need(i) {
                    let gi = G {
                        base: Base::Arr(b.try_mul(other)?),
                        scale: g.scale,
                    };
                    r[i] = Some(gi.unbroadcast(&node.shapes[i])?);
                }
            }
            return Ok(r);
        }
        Rule::Scalar { op, s, left } => {
            let s = *s;
            let gx = match (op, left) {
                (BinOp::Add, _) | (BinOp::Sub, false) => Some(g.clone()),
                (BinOp::Sub, true) => Some(g.clone().scaled(-1.0)),
                (BinOp::Mul, _) => Some(g.clone().scaled(s)),
                (BinOp::Div, false) => Some(G {
                    scale: g.scale / s,
                    ..g.clone()
                }),
                _ => None,
            };
            if let Some(gx) = gx {
                r[0] = Some(gx);
                return Ok(r);
            }
        }
        Rule::Unary(UnOp::Neg) => {
            r[0] = Some(g.scaled(-1.0));
            return Ok(r);
        }
        Rule::Unary(op @ (UnOp::Square | UnOp::Exp)) => {
            // square: g * x * 2; exp: g * out.
            let (by, factor) = if *op == UnOp::Square {
                (x, 2.0)
            } else {
                (arr(node.output), 1.0)
            };
            let base = match g.base {
                Base::Ones(_) => by,
                Base::Arr(b) => b.try_mul(by)?,
                Base::Unreduced(..) => unreachable!("settled"),
            };
            r[0] = Some(G {
                base: Base::Arr(base),
                scale: g.scale * factor,
            });
            return Ok(r);
        }
        Rule::Reduce {
            kind: kind @ (ReduceKind::Sum | ReduceKind::Mean),
            axes,
        } => {
            let xs = &node.shapes[0];
            let (ks, count) = keep_dims_shape(xs, axes);
            let scale = if *kind == ReduceKind::Mean {
                g.scale / count as f64
            } else {
                g.scale
            };
            let base = match g.base {
                Base::Ones(_) => Base::Ones(xs.clone()),
                Base::Arr(b) => Base::Arr(b.try_reshape(ks)?.try_broadcast_to(xs.clone())?),
                Base::Unreduced(..) => unreachable!("settled"),
            };
            r[0] = Some(G { base, scale });
            return Ok(r);
        }
        Rule::Matmul if !ones => {
            let Base::Arr(b) = g.base else { unreachable!() };
            let scale = g.scale;
            let gs = node.input_grads(b)?;
            return Ok(gs
                .into_iter()
                .map(|gi| gi.map(|a| G::arr(a).scaled(scale)))
                .collect());
        }
        Rule::Reshape | Rule::Permute(_) if ones => {
            r[0] = Some(G {
                base: Base::Ones(node.shapes[0].clone()),
                scale: g.scale,
            });
            return Ok(r);
        }
        Rule::BroadcastTo => {
            r[0] = Some(g.unbroadcast(&node.shapes[0])?);
            return Ok(r);
        }
        _ => {}
    }
    let g = g.array(env)?;
    Ok(node
        .input_grads(g)?
        .into_iter()
        .map(|gi| gi.map(G::arr))
        .collect())
}

use super::{arr, nones};
use crate::shape::keep_dims_shape;
