//! Elementwise ops: broadcasting binary arithmetic and comparisons, unary math, and
//! their in-place forms, each defined once: checks, result shape and dtype, the
//! forward kernel, and the gradient rule ([`BinaryRule`], [`ScalarRule`],
//! [`UnaryRule`]). The public methods ([`methods`]) come from these definitions.

use super::NDArray;
use crate::array::grad::{masked, zero_like};
use crate::autograd::nones;
use crate::autograd::{
    self, Backward, BackwardCtx, Base, Grads, LazyGrad, LazyGrads, Rule, via_arrays,
};
use crate::backend::cpu;
use crate::dtype::{Float, Native, Scalar, ScalarValue, dispatch, dispatch_float};
use crate::engine::{self, Operand, Output};
use crate::error::{NdError, Result, SourceLocation};
use crate::opkind::{BinOp, CmpOp, UnOp};
use crate::{DType, Shape};

mod methods;

/// The right-hand side of a binary op: another array or a scalar.
///
/// Any [`NDArray`] or [`Scalar`] converts into it, so `a.try_add(b)` and
/// `a.try_add(2.0)` both work.
#[derive(Clone, Copy, Debug)]
pub enum Rhs {
    /// An array (broadcast against the left side).
    Array(NDArray),
    /// A scalar, converted to the left side's dtype (except in comparisons of integer
    /// and Bool arrays, which compare as numbers: see [`NDArray::ge`]).
    Scalar(ScalarValue),
}

impl From<NDArray> for Rhs {
    fn from(a: NDArray) -> Self {
        Rhs::Array(a)
    }
}

impl<S: Scalar> From<S> for Rhs {
    fn from(s: S) -> Self {
        Rhs::Scalar(s.value())
    }
}

/// Apply a binary arithmetic op to one pair of elements. Inlined into the kernels with
/// `op` constant, so the match disappears from the inner loop.
#[inline(always)]
fn arith<T: Native>(op: BinOp, x: T, y: T) -> T {
    match op {
        BinOp::Add => x.add(y),
        BinOp::Sub => x.sub(y),
        BinOp::Mul => x.mul(y),
        BinOp::Div => x.div(y),
        BinOp::Pow => x.pow(y),
        BinOp::Maximum => x.max_of(y),
        BinOp::Minimum => x.min_of(y),
    }
}

#[inline(always)]
fn compare<T: Native>(op: CmpOp, x: T, y: T) -> u8 {
    (match op {
        CmpOp::Eq => x == y,
        CmpOp::Ne => x != y,
        CmpOp::Gt => x > y,
        CmpOp::Ge => x >= y,
        CmpOp::Lt => x < y,
        CmpOp::Le => x <= y,
    }) as u8
}

/// Monomorphise `$body` once per constant op so inner loops carry no branch.
macro_rules! per_binop {
    ($op:expr, $O:ident => $body:expr) => {
        match $op {
            BinOp::Add => {
                const $O: BinOp = BinOp::Add;
                $body
            }
            BinOp::Sub => {
                const $O: BinOp = BinOp::Sub;
                $body
            }
            BinOp::Mul => {
                const $O: BinOp = BinOp::Mul;
                $body
            }
            BinOp::Div => {
                const $O: BinOp = BinOp::Div;
                $body
            }
            BinOp::Pow => {
                const $O: BinOp = BinOp::Pow;
                $body
            }
            BinOp::Maximum => {
                const $O: BinOp = BinOp::Maximum;
                $body
            }
            BinOp::Minimum => {
                const $O: BinOp = BinOp::Minimum;
                $body
            }
        }
    };
}

macro_rules! per_cmpop {
    ($op:expr, $O:ident => $body:expr) => {
        match $op {
            CmpOp::Eq => {
                const $O: CmpOp = CmpOp::Eq;
                $body
            }
            CmpOp::Ne => {
                const $O: CmpOp = CmpOp::Ne;
                $body
            }
            CmpOp::Gt => {
                const $O: CmpOp = CmpOp::Gt;
                $body
            }
            CmpOp::Ge => {
                const $O: CmpOp = CmpOp::Ge;
                $body
            }
            CmpOp::Lt => {
                const $O: CmpOp = CmpOp::Lt;
                $body
            }
            CmpOp::Le => {
                const $O: CmpOp = CmpOp::Le;
                $body
            }
        }
    };
}

/// The broadcast shape of two operands, or `ShapeMismatch`.
pub(crate) fn broadcast_shape(op: &'static str, a: &Operand<'_>, b: &Operand<'_>) -> Result<Shape> {
    Shape::broadcast(a.shape(), b.shape()).ok_or_else(|| NdError::ShapeMismatch {
        op,
        lhs: a.desc(),
        rhs: b.desc(),
    })
}

pub(crate) fn same_dtype(op: &'static str, a: &Operand<'_>, b: &Operand<'_>) -> Result<()> {
    if a.dtype != b.dtype {
        return Err(NdError::DTypeMismatch {
            op,
            lhs: a.desc(),
            rhs: b.desc(),
        });
    }
    Ok(())
}

fn numeric(op: &'static str, a: &Operand<'_>) -> Result<()> {
    if a.dtype == DType::Bool {
        return Err(engine::unsupported(op, a));
    }
    Ok(())
}

/// Elementwise binary arithmetic.
pub(crate) fn binary(
    x: NDArray,
    op: BinOp,
    rhs: Rhs,
    scalar_left: bool,
    at: SourceLocation,
) -> Result<NDArray> {
    let name = op.name();
    let id = match rhs {
        Rhs::Array(y) => engine::run_op_on(name, &[x.id, y.id], at, |o| {
            let (a, b) = (&o[0], &o[1]);
            same_dtype(name, a, b)?;
            numeric(name, a)?;
            let shape = broadcast_shape(name, a, b)?;
            #[cfg(feature = "gpu")]
            if let (Some(ga), Some(gb)) = (a.gpu(), b.gpu()) {
                let buf = crate::backend::wgpu::kernels::binary(op, ga, gb, &shape)?;
                return Ok(Output::device(buf, shape, a.dtype));
            }
            let buf = dispatch!(a.dtype, T => per_binop!(op, O =>
                cpu::map_binary::<T, T>(a, b, &shape, |p, q| arith(O, p, q))))?;
            Ok(Output::New {
                buf,
                shape,
                dtype: a.dtype,
            })
        })?,
        Rhs::Scalar(s) => engine::run_op_on(name, &[x.id], at, |o| {
            let a = &o[0];
            numeric(name, a)?;
            #[cfg(feature = "gpu")]
            if let Some(ga) = a.gpu() {
                let bits = s.bits(a.dtype);
                let buf = crate::backend::wgpu::kernels::binary_scalar(op, ga, bits, scalar_left)?;
                return Ok(Output::device(buf, a.shape().clone(), a.dtype));
            }
            let buf = dispatch!(a.dtype, T => {
                let s: T = s.cast();
                per_binop!(op, O => if scalar_left {
                    cpu::map_unary::<T, T>(a, move |p| arith(O, s, p))
                } else {
                    cpu::map_unary::<T, T>(a, move |p| arith(O, p, s))
                })
            })?;
            Ok(Output::New {
                buf,
                shape: a.shape().clone(),
                dtype: a.dtype,
            })
        })?,
    };
    match rhs {
        Rhs::Array(y) => autograd::record(&[x.id, y.id], id, || BinaryRule(op)),
        Rhs::Scalar(s) => autograd::record(&[x.id], id, || ScalarRule {
            op,
            s: autograd::scalar_f64(s),
            left: scalar_left,
        }),
    }
    Ok(NDArray { id })
}

/// Elementwise comparison to Bool.
pub(crate) fn comparison(x: NDArray, op: CmpOp, rhs: Rhs, at: SourceLocation) -> Result<NDArray> {
    let name = op.name();
    let id = match rhs {
        Rhs::Array(y) => engine::run_op_on(name, &[x.id, y.id], at, |o| {
            let (a, b) = (&o[0], &o[1]);
            same_dtype(name, a, b)?;
            let shape = broadcast_shape(name, a, b)?;
            #[cfg(feature = "gpu")]
            if let (Some(ga), Some(gb)) = (a.gpu(), b.gpu()) {
                let buf = crate::backend::wgpu::kernels::compare(op, ga, gb, &shape)?;
                return Ok(Output::device(buf, shape, DType::Bool));
            }
            let buf = dispatch!(a.dtype, T => per_cmpop!(op, O =>
                cpu::map_binary::<T, u8>(a, b, &shape, |p, q| compare(O, p, q))))?;
            Ok(Output::New {
                buf,
                shape,
                dtype: DType::Bool,
            })
        })?,
        Rhs::Scalar(s) => engine::run_op_on(name, &[x.id], at, |o| {
            let a = &o[0];
            #[cfg(feature = "gpu")]
            if let Some(ga) = a.gpu() {
                // The same rule as below, where the device can keep it exactly: a float
                // array takes the scalar in its dtype, an integer array an integer in
                // range.
                let bits = match (a.dtype, s) {
                    (DType::F32, s) => Some(u64::from((autograd::scalar_f64(s) as f32).to_bits())),
                    (DType::F64, s) => Some(autograd::scalar_f64(s).to_bits()),
                    (DType::I32, ScalarValue::Int(v)) => {
                        i32::try_from(v).ok().map(|v| u64::from(v as u32))
                    }
                    (DType::I64, ScalarValue::Int(v)) => Some(v as u64),
                    _ => None,
                };
                let Some(bits) = bits else {
                    return Err(NdError::Unsupported {
                        op: name,
                        device: a.device(),
                    });
                };
                let buf = crate::backend::wgpu::kernels::compare_scalar(op, ga, bits)?;
                return Ok(Output::device(buf, a.shape().clone(), DType::Bool));
            }
            // Float arrays take the scalar in their dtype. Integer and Bool arrays
            // compare as numbers (false = 0, true = 1), as numpy does: the scalar is
            // not first truncated, wrapped or cast to Bool (`[0u8].lt(-3)` is false,
            // `[1i32].ge(1.5)` is false, `[false, true].ge(0.5)` is `[false, true]`).
            let buf = match s {
                _ if a.dtype.is_float() => dispatch!(a.dtype, T => {
                    let s: T = s.cast();
                    per_cmpop!(op, O => cpu::map_unary::<T, u8>(a, move |p| compare(O, p, s)))
                }),
                ScalarValue::Int(s) => dispatch!(a.dtype, T => per_cmpop!(op, O =>
                    cpu::map_unary::<T, u8>(a, move |p| compare(O, p.to_i64(), s)))),
                ScalarValue::Float(s) => dispatch!(a.dtype, T => per_cmpop!(op, O =>
                    cpu::map_unary::<T, u8>(a, move |p| compare(O, p.to_f64(), s)))),
            }?;
            Ok(Output::New {
                buf,
                shape: a.shape().clone(),
                dtype: DType::Bool,
            })
        })?,
    };
    Ok(NDArray { id })
}

#[inline(always)]
fn float_un<T: Float>(op: UnOp, x: T) -> T {
    match op {
        UnOp::Exp => x.exp(),
        UnOp::Log => x.ln(),
        UnOp::Sqrt => x.sqrt(),
        UnOp::Sin => x.sin(),
        UnOp::Cos => x.cos(),
        UnOp::Tanh => x.tanh(),
        UnOp::Sigmoid => T::ONE.div(T::ONE.add(x.neg().exp())),
        _ => unreachable!("numeric unary ops are handled by num_un"),
    }
}

#[inline(always)]
fn num_un<T: Native>(op: UnOp, x: T) -> T {
    match op {
        UnOp::Abs => x.abs(),
        UnOp::Neg => x.neg(),
        UnOp::Square => x.mul(x),
        // NaN propagates, as numpy's `maximum(x, 0)` and PyTorch's `relu`.
        UnOp::Relu => x.max_of(T::ZERO),
        _ => unreachable!("float unary ops are handled by float_un"),
    }
}

/// Elementwise unary math.
pub(crate) fn unary(x: NDArray, op: UnOp, at: SourceLocation) -> Result<NDArray> {
    let name = op.name();
    let id = engine::run_op_on(name, &[x.id], at, |o| {
        let a = &o[0];
        numeric(name, a)?;
        #[cfg(feature = "gpu")]
        if let Some(ga) = a.gpu() {
            let buf = crate::backend::wgpu::kernels::unary(op, ga)?;
            return Ok(Output::device(buf, a.shape().clone(), a.dtype));
        }
        let buf = match op {
            UnOp::Abs | UnOp::Neg | UnOp::Square | UnOp::Relu => dispatch!(a.dtype, T => match op {
                UnOp::Abs => cpu::map_unary::<T, T>(a, |p| num_un(UnOp::Abs, p)),
                UnOp::Neg => cpu::map_unary::<T, T>(a, |p| num_un(UnOp::Neg, p)),
                UnOp::Square => cpu::map_unary::<T, T>(a, |p| num_un(UnOp::Square, p)),
                _ => cpu::map_unary::<T, T>(a, |p| num_un(UnOp::Relu, p)),
            }),
            _ => dispatch_float!(a.dtype, T => match op {
                UnOp::Exp => cpu::map_unary::<T, T>(a, |p| float_un(UnOp::Exp, p)),
                UnOp::Log => cpu::map_unary::<T, T>(a, |p| float_un(UnOp::Log, p)),
                UnOp::Sqrt => cpu::map_unary::<T, T>(a, |p| float_un(UnOp::Sqrt, p)),
                UnOp::Sin => cpu::map_unary::<T, T>(a, |p| float_un(UnOp::Sin, p)),
                UnOp::Cos => cpu::map_unary::<T, T>(a, |p| float_un(UnOp::Cos, p)),
                UnOp::Tanh => cpu::map_unary::<T, T>(a, |p| float_un(UnOp::Tanh, p)),
                _ => cpu::map_unary::<T, T>(a, |p| float_un(UnOp::Sigmoid, p)),
            }, else return Err(engine::unsupported(name, a))),
        }?;
        Ok(Output::New {
            buf,
            shape: a.shape().clone(),
            dtype: a.dtype,
        })
    })?;
    autograd::record(&[x.id], id, || UnaryRule(op));
    Ok(NDArray { id })
}

/// In place: `x = x op rhs`; `rhs` must broadcast to `x`'s shape.
pub(crate) fn binary_inplace(x: NDArray, op: BinOp, rhs: Rhs) -> Result<()> {
    let name = op.name();
    autograd::check_inplace(name, x.id)?;
    if let Rhs::Array(y) = rhs {
        autograd::check_inplace_source(name, x.id, y.id)?;
    }
    match rhs {
        Rhs::Array(y) => engine::run_inplace_on(name, x.id, &[y.id], |mut t, o| {
            let b = &o[0];
            if t.dtype != b.dtype {
                return Err(NdError::DTypeMismatch {
                    op: name,
                    lhs: t.desc(),
                    rhs: b.desc(),
                });
            }
            if t.dtype == DType::Bool {
                return Err(NdError::UnsupportedDType {
                    op: name,
                    dtype: t.dtype,
                    array: t.desc(),
                });
            }
            if Shape::broadcast(&t.layout.shape, b.shape()).as_ref() != Some(&t.layout.shape) {
                return Err(NdError::ShapeMismatch {
                    op: name,
                    lhs: t.desc(),
                    rhs: b.desc(),
                });
            }
            #[cfg(feature = "gpu")]
            if let Some(g) = t.gpu() {
                return crate::backend::wgpu::inplace::binary(op, g, b.gpu(), 0.0);
            }
            dispatch!(t.dtype, T => per_binop!(op, O =>
                cpu::assign_binary::<T>(&mut t, b, |p, q| arith(O, p, q))));
            Ok(())
        }),
        Rhs::Scalar(s) => engine::run_inplace_on(name, x.id, &[], |mut t, _| {
            if t.dtype == DType::Bool {
                return Err(NdError::UnsupportedDType {
                    op: name,
                    dtype: t.dtype,
                    array: t.desc(),
                });
            }
            #[cfg(feature = "gpu")]
            if let Some(g) = t.gpu() {
                return crate::backend::wgpu::inplace::binary(op, g, None, autograd::scalar_f64(s));
            }
            dispatch!(t.dtype, T => {
                let s: T = s.cast();
                per_binop!(op, O => cpu::assign_unary::<T>(&mut t, move |p| arith(O, p, s)))
            });
            Ok(())
        }),
    }
}

/// The gradient of `x op y` (broadcasting): `Add`/`Sub` pass the gradient on (lazily),
/// `Mul` multiplies it without materialising a lazy scale.
pub(crate) struct BinaryRule(pub BinOp);

impl Backward for BinaryRule {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn into_rule(self) -> Rule {
        use BinOp::*;
        Rule::Static(match self.0 {
            Add => &BinaryRule(Add),
            Sub => &BinaryRule(Sub),
            Mul => &BinaryRule(Mul),
            Div => &BinaryRule(Div),
            Pow => &BinaryRule(Pow),
            Maximum => &BinaryRule(Maximum),
            Minimum => &BinaryRule(Minimum),
        })
    }

    fn saves(&self, n: usize) -> (u8, bool) {
        match self.0 {
            BinOp::Add | BinOp::Sub => (0, false),
            BinOp::Pow => (BackwardCtx::all(n), true),
            _ => (BackwardCtx::all(n), false),
        }
    }

    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        let mut r = nones(2);
        match self.0 {
            op @ (BinOp::Add | BinOp::Sub) => {
                // `g` has the output's shape: an input of that shape takes it as it is.
                let out = Shape::broadcast(&cx.shapes[0], &cx.shapes[1]);
                let fit = |g: LazyGrad, i: usize| -> Result<LazyGrad> {
                    if out.as_ref() == Some(&cx.shapes[i]) {
                        Ok(g)
                    } else {
                        g.unbroadcast(&cx.shapes[i])
                    }
                };
                if cx.need(1) {
                    let gy = if op == BinOp::Sub {
                        g.clone().scaled(-1.0)
                    } else {
                        g.clone()
                    };
                    r[1] = Some(fit(gy, 1)?);
                }
                if cx.need(0) {
                    r[0] = Some(fit(g, 0)?);
                }
                Ok(r)
            }
            BinOp::Mul if !g.is_ones() => {
                let Base::Arr(b) = g.base else {
                    unreachable!("settled")
                };
                for (i, other) in [(0, cx.input(1)), (1, cx.input(0))] {
                    if cx.need(i) {
                        let gi = LazyGrad {
                            base: Base::Arr(b.try_mul(other)?),
                            scale: g.scale,
                        };
                        r[i] = Some(gi.unbroadcast(&cx.shapes[i])?);
                    }
                }
                Ok(r)
            }
            _ => via_arrays(self, cx, g),
        }
    }

    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (x, y, out) = (cx.input(0), cx.input(1), cx.output);
        let (n0, n1) = (cx.need(0), cx.need(1));
        let (gx, gy) = match self.0 {
            BinOp::Add => (Some(g), n1.then_some(g)),
            BinOp::Sub => (Some(g), if n1 { Some(g.try_neg()?) } else { None }),
            BinOp::Mul => (
                if n0 { Some(g.try_mul(y)?) } else { None },
                if n1 { Some(g.try_mul(x)?) } else { None },
            ),
            BinOp::Div => (
                if n0 { Some(g.try_div(y)?) } else { None },
                if n1 {
                    Some(g.try_mul(x)?.try_div(y.try_square()?)?.try_neg()?)
                } else {
                    None
                },
            ),
            BinOp::Pow => (
                if n0 {
                    Some(g.try_mul(y)?.try_mul(x.try_pow(y.try_sub(1.0)?)?)?)
                } else {
                    None
                },
                if n1 {
                    Some(g.try_mul(out)?.try_mul(x.try_log()?)?)
                } else {
                    None
                },
            ),
            op @ (BinOp::Maximum | BinOp::Minimum) => {
                // Ties go to x.
                let to_x = if op == BinOp::Maximum {
                    x.try_ge(y)?
                } else {
                    x.try_le(y)?
                };
                let zero = zero_like(g)?;
                (
                    if n0 {
                        Some(to_x.try_where_(g, zero)?)
                    } else {
                        None
                    },
                    if n1 {
                        Some(to_x.try_where_(zero, g)?)
                    } else {
                        None
                    },
                )
            }
        };
        Ok([gx, gy].into_iter().collect())
    }
}

/// The gradient of `x op s`, or `s op x` when `left`: the linear cases only scale the
/// gradient (lazily).
pub(crate) struct ScalarRule {
    pub op: BinOp,
    pub s: f64,
    pub left: bool,
}

impl Backward for ScalarRule {
    fn name(&self) -> &'static str {
        self.op.name()
    }

    fn saves(&self, _: usize) -> (u8, bool) {
        match self.op {
            BinOp::Add | BinOp::Sub | BinOp::Mul => (0, false),
            BinOp::Div if !self.left => (0, false),
            BinOp::Pow if self.left => (0, true),
            _ => (1, false),
        }
    }

    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        let gx = match (self.op, self.left) {
            (BinOp::Add, _) | (BinOp::Sub, false) => g,
            (BinOp::Sub, true) => g.scaled(-1.0),
            (BinOp::Mul, _) => g.scaled(self.s),
            (BinOp::Div, false) => LazyGrad {
                scale: g.scale / self.s,
                ..g
            },
            _ => return via_arrays(self, cx, g),
        };
        Ok([Some(gx)].into_iter().collect())
    }

    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (x, out, s) = (cx.input(0), cx.output, self.s);
        let gx = match (self.op, self.left) {
            (BinOp::Add, _) | (BinOp::Sub, false) => g,
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
        };
        Ok([Some(gx)].into_iter().collect())
    }
}

/// The gradient of elementwise unary math: `neg` scales (lazily), `square` and `exp`
/// multiply the gradient once by the input or the output.
pub(crate) struct UnaryRule(pub UnOp);

impl Backward for UnaryRule {
    fn name(&self) -> &'static str {
        self.0.name()
    }

    fn into_rule(self) -> Rule {
        use UnOp::*;
        Rule::Static(match self.0 {
            Abs => &UnaryRule(Abs),
            Neg => &UnaryRule(Neg),
            Square => &UnaryRule(Square),
            Relu => &UnaryRule(Relu),
            Exp => &UnaryRule(Exp),
            Log => &UnaryRule(Log),
            Sqrt => &UnaryRule(Sqrt),
            Sin => &UnaryRule(Sin),
            Cos => &UnaryRule(Cos),
            Tanh => &UnaryRule(Tanh),
            Sigmoid => &UnaryRule(Sigmoid),
        })
    }

    fn saves(&self, _: usize) -> (u8, bool) {
        match self.0 {
            UnOp::Neg => (0, false),
            UnOp::Exp | UnOp::Sqrt | UnOp::Tanh | UnOp::Sigmoid => (0, true),
            _ => (1, false),
        }
    }

    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        let gx = match self.0 {
            UnOp::Neg => g.scaled(-1.0),
            op @ (UnOp::Square | UnOp::Exp) => {
                // square: g * x * 2; exp: g * out.
                let (by, factor) = if op == UnOp::Square {
                    (cx.input(0), 2.0)
                } else {
                    (cx.output, 1.0)
                };
                let base = match g.base {
                    Base::Ones(_) => by,
                    Base::Arr(b) => b.try_mul(by)?,
                    Base::Unreduced(..) => unreachable!("settled"),
                };
                LazyGrad {
                    base: Base::Arr(base),
                    scale: g.scale * factor,
                }
            }
            _ => return via_arrays(self, cx, g),
        };
        Ok([Some(gx)].into_iter().collect())
    }

    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (x, out) = (cx.input(0), cx.output);
        let gx = match self.0 {
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
        };
        Ok([Some(gx)].into_iter().collect())
    }
}
