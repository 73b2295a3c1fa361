//! Elementwise ops: broadcasting binary arithmetic and comparisons, unary math, and
//! their in-place forms. Every op has a `try_*` form and a panicking form.

use super::NDArray;
use crate::autograd::{self, Rule};
use crate::backend::cpu;
use crate::dtype::{Float, Native, Scalar, ScalarValue, dispatch, dispatch_float};
use crate::engine::{self, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::opkind::{BinOp, UnOp};
use crate::{DType, Shape};
use std::panic::Location;

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

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmpOp {
    Eq,
    Ne,
    Gt,
    Ge,
    Lt,
    Le,
}

impl CmpOp {
    fn name(self) -> &'static str {
        match self {
            CmpOp::Eq => "eq",
            CmpOp::Ne => "ne",
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
        }
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
        Rhs::Array(y) => engine::run_op(name, &[x.id, y.id], at, |o| {
            let (a, b) = (&o[0], &o[1]);
            same_dtype(name, a, b)?;
            numeric(name, a)?;
            let shape = broadcast_shape(name, a, b)?;
            let buf = dispatch!(a.dtype, T => per_binop!(op, O =>
                cpu::map_binary::<T, T>(a, b, &shape, |p, q| arith(O, p, q))))?;
            Ok(Output::New {
                buf,
                shape,
                dtype: a.dtype,
            })
        })?,
        Rhs::Scalar(s) => engine::run_op(name, &[x.id], at, |o| {
            let a = &o[0];
            numeric(name, a)?;
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
        Rhs::Array(y) => autograd::record(&[x.id, y.id], id, || Rule::Binary(op)),
        Rhs::Scalar(s) => autograd::record(&[x.id], id, || Rule::Scalar {
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
        Rhs::Array(y) => engine::run_op(name, &[x.id, y.id], at, |o| {
            let (a, b) = (&o[0], &o[1]);
            same_dtype(name, a, b)?;
            let shape = broadcast_shape(name, a, b)?;
            let buf = dispatch!(a.dtype, T => per_cmpop!(op, O =>
                cpu::map_binary::<T, u8>(a, b, &shape, |p, q| compare(O, p, q))))?;
            Ok(Output::New {
                buf,
                shape,
                dtype: DType::Bool,
            })
        })?,
        Rhs::Scalar(s) => engine::run_op(name, &[x.id], at, |o| {
            let a = &o[0];
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
    let id = engine::run_op(name, &[x.id], at, |o| {
        let a = &o[0];
        numeric(name, a)?;
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
    autograd::record(&[x.id], id, || Rule::Unary(op));
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
        Rhs::Array(y) => engine::run_inplace(x.id, &[y.id], |mut t, o| {
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
            dispatch!(t.dtype, T => per_binop!(op, O =>
                cpu::assign_binary::<T>(&mut t, b, |p, q| arith(O, p, q))));
            Ok(())
        }),
        Rhs::Scalar(s) => engine::run_inplace(x.id, &[], |mut t, _| {
            if t.dtype == DType::Bool {
                return Err(NdError::UnsupportedDType {
                    op: name,
                    dtype: t.dtype,
                    array: t.desc(),
                });
            }
            dispatch!(t.dtype, T => {
                let s: T = s.cast();
                per_binop!(op, O => cpu::assign_unary::<T>(&mut t, move |p| arith(O, p, s)))
            });
            Ok(())
        }),
    }
}

macro_rules! binary_methods {
    ($($(#[$doc:meta])* $name:ident, $try_name:ident, $op:expr;)*) => {
        impl NDArray {
            $(
                twins! {
                    $(#[$doc])*
                    /// Panics with the error's message on failure (see the `try_` form).
                    pub fn $name,
                    $(#[$doc])*
                    /// Errors: `Closed`, `DTypeMismatch`, `ShapeMismatch` (not broadcastable),
                    /// `UnsupportedDType` (Bool), `ManagerClosed`/`ManagerCapped`.
                    pub fn $try_name(self, rhs: impl Into<Rhs>) -> NDArray {
                        binary(self, $op, rhs.into(), false, Location::caller())
                    }
                }
            )*
        }
    };
}

binary_methods! {
    /// Elementwise power `self ** rhs`, broadcasting. Integer powers wrap on overflow;
    /// a negative integer exponent gives `1 / x^n` truncated toward zero: 1 for a base
    /// of 1, 1 or -1 for a base of -1 (by the exponent's parity), and 0 for every other
    /// base, 0 included (PyTorch's integer semantics; numpy raises an error instead).
    pow, try_pow, BinOp::Pow;
    /// Elementwise maximum (NaN propagates), broadcasting.
    maximum, try_maximum, BinOp::Maximum;
    /// Elementwise minimum (NaN propagates), broadcasting.
    minimum, try_minimum, BinOp::Minimum;
}

impl NDArray {
    /// Elementwise `self + rhs` (the `+` operator's fallible form).
    #[track_caller]
    pub fn try_add(self, rhs: impl Into<Rhs>) -> Result<NDArray> {
        binary(self, BinOp::Add, rhs.into(), false, Location::caller())
    }

    /// Elementwise `self - rhs`.
    #[track_caller]
    pub fn try_sub(self, rhs: impl Into<Rhs>) -> Result<NDArray> {
        binary(self, BinOp::Sub, rhs.into(), false, Location::caller())
    }

    /// Elementwise `self * rhs`.
    #[track_caller]
    pub fn try_mul(self, rhs: impl Into<Rhs>) -> Result<NDArray> {
        binary(self, BinOp::Mul, rhs.into(), false, Location::caller())
    }

    /// Elementwise `self / rhs` (integer division by zero gives 0).
    #[track_caller]
    pub fn try_div(self, rhs: impl Into<Rhs>) -> Result<NDArray> {
        binary(self, BinOp::Div, rhs.into(), false, Location::caller())
    }

    /// In place `self += rhs` (DJL's `addi`); `rhs` must broadcast to `self`'s shape.
    pub fn try_addi(self, rhs: impl Into<Rhs>) -> Result<()> {
        binary_inplace(self, BinOp::Add, rhs.into())
    }

    /// In place `self -= rhs`.
    pub fn try_subi(self, rhs: impl Into<Rhs>) -> Result<()> {
        binary_inplace(self, BinOp::Sub, rhs.into())
    }

    /// In place `self *= rhs`.
    pub fn try_muli(self, rhs: impl Into<Rhs>) -> Result<()> {
        binary_inplace(self, BinOp::Mul, rhs.into())
    }

    /// In place `self /= rhs`.
    pub fn try_divi(self, rhs: impl Into<Rhs>) -> Result<()> {
        binary_inplace(self, BinOp::Div, rhs.into())
    }

    /// Elementwise `-self` (the unary `-` operator's fallible form).
    #[track_caller]
    pub fn try_neg(self) -> Result<NDArray> {
        unary(self, UnOp::Neg, Location::caller())
    }
}

macro_rules! compare_methods {
    ($($(#[$doc:meta])* $name:ident, $try_name:ident, $op:expr;)*) => {
        impl NDArray {
            $(
                twins! {
                    $(#[$doc])*
                    /// Gives a Bool array; panics with the error's message on failure.
                    ///
                    /// With an array `rhs` both sides must have the same dtype. With a scalar
                    /// `rhs`, a float array takes the scalar in its dtype, while integer and
                    /// Bool arrays compare as numbers (false = 0, true = 1) without converting
                    /// the scalar first, as numpy does: `[false, true].ge(0.5)` is
                    /// `[false, true]` and a U8 array is never below -3.
                    #[allow(clippy::should_implement_trait)]
                    pub fn $name,
                    $(#[$doc])*
                    /// Errors: `Closed`, `DTypeMismatch`, `ShapeMismatch`.
                    pub fn $try_name(self, rhs: impl Into<Rhs>) -> NDArray {
                        comparison(self, $op, rhs.into(), Location::caller())
                    }
                }
            )*
        }
    };
}

compare_methods! {
    /// Elementwise `self == rhs`, broadcasting. Not differentiable: a Bool result.
    eq, try_eq, CmpOp::Eq;
    /// Elementwise `self != rhs`, broadcasting. Not differentiable: a Bool result.
    ne, try_ne, CmpOp::Ne;
    /// Elementwise `self > rhs`, broadcasting. Not differentiable: a Bool result.
    gt, try_gt, CmpOp::Gt;
    /// Elementwise `self >= rhs`, broadcasting. Not differentiable: a Bool result.
    ge, try_ge, CmpOp::Ge;
    /// Elementwise `self < rhs`, broadcasting. Not differentiable: a Bool result.
    lt, try_lt, CmpOp::Lt;
    /// Elementwise `self <= rhs`, broadcasting. Not differentiable: a Bool result.
    le, try_le, CmpOp::Le;
}

macro_rules! unary_methods {
    ($($(#[$doc:meta])* $name:ident, $try_name:ident, $op:expr;)*) => {
        impl NDArray {
            $(
                twins! {
                    $(#[$doc])*
                    /// Panics with the error's message on failure.
                    pub fn $name,
                    $(#[$doc])*
                    /// Errors: `Closed`, `UnsupportedDType`.
                    pub fn $try_name(self) -> NDArray {
                        unary(self, $op, Location::caller())
                    }
                }
            )*
        }
    };
}

unary_methods! {
    /// Elementwise absolute value.
    abs, try_abs, UnOp::Abs;
    /// Elementwise square.
    square, try_square, UnOp::Square;
    /// Elementwise `max(x, 0)`; NaN stays NaN (as numpy's `maximum(x, 0)` and PyTorch's
    /// `relu`). Its gradient is 1 where `x > 0` and 0 elsewhere, NaN included (as
    /// PyTorch).
    relu, try_relu, UnOp::Relu;
    /// Elementwise `e^x` (float dtypes).
    exp, try_exp, UnOp::Exp;
    /// Elementwise natural logarithm (float dtypes).
    log, try_log, UnOp::Log;
    /// Elementwise square root (float dtypes).
    sqrt, try_sqrt, UnOp::Sqrt;
    /// Elementwise sine (float dtypes).
    sin, try_sin, UnOp::Sin;
    /// Elementwise cosine (float dtypes).
    cos, try_cos, UnOp::Cos;
    /// Elementwise hyperbolic tangent (float dtypes).
    tanh, try_tanh, UnOp::Tanh;
    /// Elementwise logistic sigmoid `1 / (1 + e^-x)` (float dtypes).
    sigmoid, try_sigmoid, UnOp::Sigmoid;
}
