//! The public elementwise methods: each panicking method and its `try_` form come
//! from one definition ([`twins!`]) over the ops in the parent module.

use super::{Rhs, binary, binary_inplace, comparison, unary};
use crate::NDArray;
use crate::error::{Result, twins};
use crate::opkind::CmpOp;
use crate::opkind::{BinOp, UnOp};
use std::panic::Location;

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
