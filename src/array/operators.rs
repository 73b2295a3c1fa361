//! `std::ops` for handles: `a + b`, `a * 2.0`, `2.0 * a`, `-a`, `a += b`.
//!
//! The right side is generic over [`Scalar`] (f32, f64, i32, i64, u8); the left side is
//! implemented for `f64` and `i64` only, so that float and integer literals infer
//! (two float impls on the left would make `let d = 2.0 * a; d.shape()` ambiguous).
//! Operators panic with the [`crate::NdError`] message; use the `try_*` methods to get
//! the error instead.

use super::NDArray;
use super::ops::{Rhs, binary, binary_inplace, unary};
use crate::dtype::Scalar;
use crate::error::unwrap;
use crate::opkind::{BinOp, UnOp};
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};
use std::panic::Location;

macro_rules! operator {
    ($Trait:ident, $method:ident, $Assign:ident, $assign:ident, $op:expr) => {
        impl $Trait<NDArray> for NDArray {
            type Output = NDArray;
            #[track_caller]
            fn $method(self, rhs: NDArray) -> NDArray {
                unwrap(binary(
                    self,
                    $op,
                    Rhs::Array(rhs),
                    false,
                    Location::caller(),
                ))
            }
        }

        impl<S: Scalar> $Trait<S> for NDArray {
            type Output = NDArray;
            #[track_caller]
            fn $method(self, rhs: S) -> NDArray {
                unwrap(binary(self, $op, Rhs::from(rhs), false, Location::caller()))
            }
        }

        impl $Trait<NDArray> for f64 {
            type Output = NDArray;
            #[track_caller]
            fn $method(self, rhs: NDArray) -> NDArray {
                unwrap(binary(rhs, $op, Rhs::from(self), true, Location::caller()))
            }
        }

        impl $Trait<NDArray> for i64 {
            type Output = NDArray;
            #[track_caller]
            fn $method(self, rhs: NDArray) -> NDArray {
                unwrap(binary(rhs, $op, Rhs::from(self), true, Location::caller()))
            }
        }

        impl $Assign<NDArray> for NDArray {
            #[track_caller]
            fn $assign(&mut self, rhs: NDArray) {
                unwrap(binary_inplace(*self, $op, Rhs::Array(rhs)))
            }
        }

        impl<S: Scalar> $Assign<S> for NDArray {
            #[track_caller]
            fn $assign(&mut self, rhs: S) {
                unwrap(binary_inplace(*self, $op, Rhs::from(rhs)))
            }
        }
    };
}

operator!(Add, add, AddAssign, add_assign, BinOp::Add);
operator!(Sub, sub, SubAssign, sub_assign, BinOp::Sub);
operator!(Mul, mul, MulAssign, mul_assign, BinOp::Mul);
operator!(Div, div, DivAssign, div_assign, BinOp::Div);

impl Neg for NDArray {
    type Output = NDArray;
    #[track_caller]
    fn neg(self) -> NDArray {
        unwrap(unary(self, UnOp::Neg, Location::caller()))
    }
}
