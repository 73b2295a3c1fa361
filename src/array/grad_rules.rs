//! The gradient rules of the ops recorded with a [`Rule`] variant, beside the ops: each
//! maps the gradient `g` of a node's output to the gradients of the inputs that need
//! one, written with ordinary ndscope ops (run unrecorded, inside the scope `backward`
//! opens), so they run wherever the ops run. A gradient whose input was broadcast is
//! summed over the broadcast axes back to the input's shape
//! ([`NDArray::unbroadcast`]). The pass that walks the tape (`autograd/backward.rs`)
//! calls [`Node::input_grads`]; it imports nothing from here.

use super::linalg::matmul_t;
use crate::autograd::{Grads, Node, ReduceKind, Rule, arr, nones};
use crate::error::Result;
use crate::opkind::{BinOp, UnOp};
use crate::shape::{Dims, keep_dims_shape};
use crate::{NDArray, Shape};
use smallvec::SmallVec;

impl NDArray {
    /// `self` summed over the axes that broadcasting added or stretched so it has
    /// `shape` (a gradient brought back to its input's shape).
    pub(crate) fn unbroadcast(self, shape: &Shape) -> Result<NDArray> {
        unbroadcast(self, shape)
    }
}

/// Sum `g` over the axes that broadcasting added or stretched so it has `shape`.
fn unbroadcast(g: NDArray, shape: &Shape) -> Result<NDArray> {
    let gs = g.try_shape()?;
    if &gs == shape {
        return Ok(g);
    }
    let (gd, td) = (gs.dims(), shape.dims());
    let lead = gd.len() - td.len();
    let mut axes: SmallVec<[isize; 4]> = (0..lead as isize).collect();
    for (i, &t) in td.iter().enumerate() {
        if t == 1 && gd[lead + i] != 1 {
            axes.push((lead + i) as isize);
        }
    }
    if axes.is_empty() {
        return g.try_reshape(shape.clone());
    }
    if axes.len() == lead {
        // Only added axes: summing them away leaves `shape` (one op).
        return g.try_sum_axes(&axes, false);
    }
    // Stretched axes too: keep every summed axis as 1, then drop the added ones.
    let s = g.try_sum_axes(&axes, true)?;
    if lead == 0 {
        Ok(s)
    } else {
        s.try_reshape(shape.clone())
    }
}

/// A 0-d zero of `g`'s dtype (for `where_`).
fn zero_like(g: NDArray) -> Result<NDArray> {
    g.try_manager()?
        .try_zeros(Shape(Dims::new()), g.try_dtype()?)
}

/// Masked gradient: `g` where `mask`, else 0.
fn masked(mask: NDArray, g: NDArray) -> Result<NDArray> {
    mask.try_where_(g, zero_like(g)?)
}

/// `g` (a product's gradient with the batch dimensions of both operands) summed to
/// `shape`, an operand's shape whose batch dimensions are `batch` of `other`'s:
/// nothing to do when the operand's batch dimensions are the broadcast ones.
fn unbroadcast_batch(g: NDArray, shape: &Shape, other: &Shape) -> Result<NDArray> {
    let batch = |s: &Shape| Shape(s.dims()[..s.ndim() - 2].iter().copied().collect());
    let mine = batch(shape);
    if Shape::broadcast(&mine, &batch(other)).as_ref() == Some(&mine) {
        Ok(g)
    } else {
        unbroadcast(g, shape)
    }
}

impl Node {
    /// The gradients of this node's inputs (None where not needed) given its output's
    /// `g` as an array.
    pub(crate) fn input_grads(&self, g: NDArray) -> Result<Grads> {
        input_grads(self, g)
    }
}

fn input_grads(node: &Node, g: NDArray) -> Result<Grads> {
    let need = |i: usize| node.needs & (1 << i) != 0;
    let x = arr(node.inputs[0]);
    let out = arr(node.output);
    let mut r: Grads = nones(node.inputs.len());
    match &node.rule {
        Rule::Binary(op) => {
            let y = arr(node.inputs[1]);
            let (gx, gy) = match op {
                BinOp::Add => (Some(g), need(1).then_some(g)),
                BinOp::Sub => (Some(g), if need(1) { Some(g.try_neg()?) } else { None }),
                BinOp::Mul => (
                    if need(0) { Some(g.try_mul(y)?) } else { None },
                    if need(1) { Some(g.try_mul(x)?) } else { None },
                ),
                BinOp::Div => (
                    if need(0) { Some(g.try_div(y)?) } else { None },
                    if need(1) {
                        Some(g.try_mul(x)?.try_div(y.try_square()?)?.try_neg()?)
                    } else {
                        None
                    },
                ),
                BinOp::Pow => (
                    if need(0) {
                        Some(g.try_mul(y)?.try_mul(x.try_pow(y.try_sub(1.0)?)?)?)
                    } else {
                        None
                    },
                    if need(1) {
                        Some(g.try_mul(out)?.try_mul(x.try_log()?)?)
                    } else {
                        None
                    },
                ),
                BinOp::Maximum | BinOp::Minimum => {
                    // Ties go to x.
                    let to_x = if *op == BinOp::Maximum {
                        x.try_ge(y)?
                    } else {
                        x.try_le(y)?
                    };
                    let zero = zero_like(g)?;
                    (
                        if need(0) {
                            Some(to_x.try_where_(g, zero)?)
                        } else {
                            None
                        },
                        if need(1) {
                            Some(to_x.try_where_(zero, g)?)
                        } else {
                            None
                        },
                    )
                }
            };
            if need(0)
                && let Some(gx) = gx
            {
                r[0] = Some(unbroadcast(gx, &node.shapes[0])?);
            }
            if need(1)
                && let Some(gy) = gy
            {
                r[1] = Some(unbroadcast(gy, &node.shapes[1])?);
            }
            return Ok(r);
        }
        Rule::Scalar { op, s, left } => {
            let s = *s;
            r[0] = Some(match (op, left) {
                (BinOp::Add, _) => g,
                (BinOp::Sub, false) => g,
                (BinOp::Sub, true) => g.try_neg()?,
                (BinOp::Mul, _) => g.try_mul(s)?,
                (BinOp::Div, false) => g.try_div(s)?,
                // d(s/x) = -s/x^2
                (BinOp::Div, true) => g.try_mul(-s)?.try_div(x.try_square()?)?,
                (BinOp::Pow, false) => g.try_mul(x.try_pow(s - 1.0)?.try_mul(s)?)?,
                // d(s^x) = s^x ln s
                (BinOp::Pow, true) => g.try_mul(out)?.try_mul(s.ln())?,
                (BinOp::Maximum, _) => masked(x.try_ge(s)?, g)?,
                (BinOp::Minimum, _) => masked(x.try_le(s)?, g)?,
            });
        }
        Rule::Unary(op) => {
            r[0] = Some(match op {
                UnOp::Neg => g.try_neg()?,
                UnOp::Abs => {
                    let zero = zero_like(g)?;
                    x.try_gt(0.0)?
                        .try_where_(g, x.try_lt(0.0)?.try_where_(g.try_neg()?, zero)?)?
                }
                UnOp::Square => g.try_mul(x)?.try_mul(2.0)?,
                UnOp::Relu => masked(x.try_gt(0.0)?, g)?,
                UnOp::Exp => g.try_mul(out)?,
                UnOp::Log => g.try_div(x)?,
                UnOp::Sqrt => g.try_mul(0.5)?.try_div(out)?,
                UnOp::Sin => g.try_mul(x.try_cos()?)?,
                UnOp::Cos => g.try_mul(x.try_sin()?)?.try_neg()?,
                UnOp::Tanh => g.try_mul(1.0 - out.try_square()?)?,
                UnOp::Sigmoid => g.try_mul(out)?.try_mul(1.0 - out)?,
            });
        }
        Rule::Reduce { kind, axes } => {
            let xs = &node.shapes[0];
            let (ks, count) = keep_dims_shape(xs, axes);
            let gk = g.try_reshape(ks.clone())?;
            r[0] = Some(match kind {
                ReduceKind::Sum => gk.try_broadcast_to(xs.clone())?,
                ReduceKind::Mean => gk.try_div(count as f64)?.try_broadcast_to(xs.clone())?,
                ReduceKind::Max | ReduceKind::Min => {
                    // Ties share the gradient equally.
                    let mask = x.try_eq(out.try_reshape(ks)?)?;
                    let ones = mask.try_to_dtype(g.try_dtype()?)?;
                    let n = ones.try_sum_axes(&axes_all(axes, xs.ndim()), true)?;
                    ones.try_mul(gk.try_div(n)?)?
                }
                ReduceKind::Prod => gk.try_mul(prod_others(x, axes, &ks)?)?,
            });
        }
        Rule::Matmul => {
            let y = arr(node.inputs[1]);
            let (xs, ys) = (&node.shapes[0], &node.shapes[1]);
            if xs.ndim() == 1 && ys.ndim() == 1 {
                if need(0) {
                    r[0] = Some(g.try_mul(y)?);
                }
                if need(1) {
                    r[1] = Some(g.try_mul(x)?);
                }
                return Ok(r);
            }
            if xs.ndim() == 2 && ys.ndim() == 2 {
                // The common case: no promotion and no batch dimensions to sum.
                if need(0) {
                    r[0] = Some(matmul_t(g, y, [false, true])?);
                }
                if need(1) {
                    r[1] = Some(matmul_t(x, g, [true, false])?);
                }
                return Ok(r);
            }
            // Promote 1-D operands as numpy does, then the usual 2-D rules per batch.
            let x2 = if xs.ndim() == 1 {
                x.try_reshape([1, xs.dims()[0]])?
            } else {
                x
            };
            let y2 = if ys.ndim() == 1 {
                y.try_reshape([ys.dims()[0], 1])?
            } else {
                y
            };
            let g2 = if xs.ndim() == 1 || ys.ndim() == 1 {
                let gs = g.try_shape()?;
                let mut g2dims: Dims = gs.0.clone();
                if xs.ndim() == 1 {
                    let n = g2dims.len();
                    g2dims.insert(n - 1, 1);
                }
                if ys.ndim() == 1 {
                    g2dims.push(1);
                }
                g.try_reshape(Shape(g2dims))?
            } else {
                g
            };
            let promote = |s: &Shape, row: bool| {
                if s.ndim() != 1 {
                    s.clone()
                } else if row {
                    Shape::from([1, s.dims()[0]])
                } else {
                    Shape::from([s.dims()[0], 1])
                }
            };
            let (x2s, y2s) = (promote(xs, true), promote(ys, false));
            if need(0) {
                let gx = unbroadcast_batch(matmul_t(g2, y2, [false, true])?, &x2s, &y2s)?;
                r[0] = Some(if &x2s == xs {
                    gx
                } else {
                    gx.try_reshape(xs.clone())?
                });
            }
            if need(1) {
                let gy = unbroadcast_batch(matmul_t(x2, g2, [true, false])?, &y2s, &x2s)?;
                r[1] = Some(if &y2s == ys {
                    gy
                } else {
                    gy.try_reshape(ys.clone())?
                });
            }
            return Ok(r);
        }
        Rule::Reshape => r[0] = Some(g.try_reshape(node.shapes[0].clone())?),
        Rule::Permute(perm) => {
            let nd = node.shapes[0].ndim();
            let perm: Dims = perm.clone().unwrap_or_else(|| (0..nd).rev().collect());
            let mut inv: Dims = SmallVec::from_elem(0, nd);
            for (i, &p) in perm.iter().enumerate() {
                inv[p] = i;
            }
            r[0] = Some(g.try_permute(&inv)?);
        }
        Rule::BroadcastTo => r[0] = Some(unbroadcast(g, &node.shapes[0])?),
        Rule::Get(index) => {
            let z = g
                .try_manager()?
                .try_zeros(node.shapes[0].clone(), g.try_dtype()?)?;
            z.try_set(index, g)?;
            r[0] = Some(z);
        }
        Rule::Where => {
            let cond = x;
            let zero = zero_like(g)?;
            if need(1) {
                r[1] = Some(unbroadcast(cond.try_where_(g, zero)?, &node.shapes[1])?);
            }
            if need(2) {
                r[2] = Some(unbroadcast(cond.try_where_(zero, g)?, &node.shapes[2])?);
            }
            return Ok(r);
        }
        Rule::Concat { axis, stack } => {
            let nd = g.try_shape()?.ndim() as isize;
            let ax = if *axis < 0 { axis + nd } else { *axis } as usize;
            let mut start = 0usize;
            for (i, s) in node.shapes.iter().enumerate() {
                let len = if *stack { 1 } else { s.dims()[ax] };
                if need(i) {
                    let mut idx = String::new();
                    for _ in 0..ax {
                        idx.push_str(":,");
                    }
                    if *stack {
                        idx.push_str(&start.to_string());
                    } else {
                        idx.push_str(&format!("{start}:{}", start + len));
                    }
                    let part = g.try_get(&idx)?;
                    // A contiguous copy, so later in-place accumulation never aliases g.
                    r[i] = Some(part.try_reshape(s.clone())?.try_mul(1.0)?);
                }
                start += len;
            }
            return Ok(r);
        }
        Rule::ToDType => r[0] = Some(g.try_to_dtype(x.try_dtype()?)?),
        Rule::Custom(b) => {
            let inputs: SmallVec<[NDArray; 3]> = node.inputs.iter().map(|&id| arr(id)).collect();
            let cx = crate::autograd::BackwardCtx {
                inputs: &inputs,
                shapes: &node.shapes,
                output: out,
                needs: node.needs,
            };
            let mut gs = b.backward(&cx, g)?;
            gs.resize(node.inputs.len(), None);
            for (i, gi) in gs.iter_mut().enumerate() {
                match gi.take() {
                    Some(v) if cx.need(i) => *gi = Some(unbroadcast(v, &node.shapes[i])?),
                    _ => {}
                }
            }
            return Ok(gs);
        }
    }
    if !need(0) {
        r[0] = None;
    }
    Ok(r)
}

/// For each element of `x`, the product of the other elements of its reduction group
/// (`axes`; `ks` is the reduced shape with kept dims). Exact with zeros, as PyTorch:
/// with no zero in a group it is `prod / x`; with one zero, the zero element gets the
/// product of the nonzero ones and the others 0; with two or more zeros, all 0.
fn prod_others(x: NDArray, axes: &Option<SmallVec<[isize; 4]>>, ks: &Shape) -> Result<NDArray> {
    let nd = x.try_shape()?.ndim();
    let axes = axes_all(axes, nd);
    let dtype = x.try_dtype()?;
    let m = x.try_manager()?;
    let one = m.try_ones(Shape(Dims::new()), dtype)?;
    let zero = m.try_zeros(Shape(Dims::new()), dtype)?;
    let is_zero = x.try_eq(0.0)?;
    let zeros = is_zero.try_to_dtype(dtype)?.try_sum_axes(&axes, true)?;
    let safe = is_zero.try_where_(one, x)?;
    let p = safe.try_prod_axes(&axes, true)?;
    debug_assert_eq!(p.try_shape()?, *ks);
    let at_zero = zeros.try_eq(1.0)?.try_where_(p, zero)?;
    let elsewhere = zeros.try_eq(0.0)?.try_where_(p.try_div(safe)?, zero)?;
    is_zero.try_where_(at_zero, elsewhere)
}

fn axes_all(axes: &Option<SmallVec<[isize; 4]>>, nd: usize) -> SmallVec<[isize; 4]> {
    axes.clone().unwrap_or_else(|| (0..nd as isize).collect())
}
