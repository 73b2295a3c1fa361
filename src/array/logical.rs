//! Logical ops on Bool arrays (`logical_and`, `logical_or`, `logical_xor`,
//! `logical_not`) and the truth reductions `any`/`all` (any dtype). None is
//! differentiable: their results are Bool, which carries no gradient.

use super::NDArray;
use super::ops::broadcast_shape;
use super::reduce::{normalize_axes, reduced_shape};
use crate::DType;
use crate::backend::cpu;
use crate::backend::cpu::new_overwritten;
use crate::dtype::{Native, dispatch};
use crate::engine::{self, Operand, Output};
use crate::error::{Result, SourceLocation, twins};
use std::panic::Location;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LogicOp {
    And,
    Or,
    Xor,
}

impl LogicOp {
    fn name(self) -> &'static str {
        match self {
            LogicOp::And => "logical_and",
            LogicOp::Or => "logical_or",
            LogicOp::Xor => "logical_xor",
        }
    }
}

fn bool_only(op: &'static str, a: &Operand<'_>) -> Result<()> {
    if a.dtype != DType::Bool {
        return Err(engine::unsupported(op, a));
    }
    Ok(())
}

fn logical(x: NDArray, op: LogicOp, y: NDArray, at: SourceLocation) -> Result<NDArray> {
    let name = op.name();
    let id = engine::run_op_on(name, &[x.id, y.id], at, |o| {
        let (a, b) = (&o[0], &o[1]);
        bool_only(name, a)?;
        bool_only(name, b)?;
        let shape = broadcast_shape(name, a, b)?;
        #[cfg(feature = "gpu")]
        if let (Some(ga), Some(gb)) = (a.gpu(), b.gpu()) {
            // Bool words are 0 or 1 on a device too.
            let expr = match op {
                LogicOp::And => "x & y",
                LogicOp::Or => "x | y",
                LogicOp::Xor => "x ^ y",
            };
            let buf = crate::backend::wgpu::kernels::elementwise_with(
                name,
                &[ga, gb],
                &shape,
                DType::Bool,
                "",
                expr,
                0,
            )?;
            return Ok(Output::device(buf, shape, DType::Bool));
        }
        // Bool bytes are 0 or 1, so the bitwise ops are the logical ones.
        let buf = match op {
            LogicOp::And => cpu::map_binary::<u8, u8>(a, b, &shape, |p, q| p & q),
            LogicOp::Or => cpu::map_binary::<u8, u8>(a, b, &shape, |p, q| p | q),
            LogicOp::Xor => cpu::map_binary::<u8, u8>(a, b, &shape, |p, q| p ^ q),
        }?;
        Ok(Output::New {
            buf,
            shape,
            dtype: DType::Bool,
        })
    })?;
    Ok(NDArray { id })
}

fn logical_not_impl(x: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "logical_not";
    let id = engine::run_op_on(OP, &[x.id], at, |o| {
        let a = &o[0];
        bool_only(OP, a)?;
        #[cfg(feature = "gpu")]
        if let Some(g) = a.gpu() {
            let buf = crate::backend::wgpu::kernels::elementwise_with(
                OP,
                &[g],
                a.shape(),
                DType::Bool,
                "",
                "x ^ 1u",
                0,
            )?;
            return Ok(Output::device(buf, a.shape().clone(), DType::Bool));
        }
        Ok(Output::New {
            buf: cpu::map_unary::<u8, u8>(a, |p| p ^ 1)?,
            shape: a.shape().clone(),
            dtype: DType::Bool,
        })
    })?;
    Ok(NDArray { id })
}

/// Whether any (`want == true`) / every (`want == false`) element of a strided row is
/// nonzero; stops at the first decisive element.
#[inline]
fn row_decides<T: Native>(data: &[T], start: isize, len: usize, stride: isize, any: bool) -> bool {
    // NaN is nonzero (true), as numpy's `bool(nan)`.
    let truthy = |v: T| v != T::ZERO;
    if stride == 1 {
        let row = &data[start as usize..start as usize + len];
        return if any {
            row.iter().any(|&v| truthy(v))
        } else {
            !row.iter().all(|&v| truthy(v))
        };
    }
    (0..len as isize).any(|i| truthy(data[(start + i * stride) as usize]) == any)
}

fn truth_reduction(
    x: NDArray,
    any: bool,
    axes: Option<&[isize]>,
    keep_dims: bool,
    at: SourceLocation,
) -> Result<NDArray> {
    let name = if any { "any" } else { "all" };
    let id = engine::run_op_on(name, &[x.id], at, |o| {
        let a = &o[0];
        let axes = normalize_axes(name, a, axes)?;
        let shape = reduced_shape(a.shape(), &axes, keep_dims);
        #[cfg(feature = "gpu")]
        if let Some(g) = a.gpu() {
            let buf = crate::backend::wgpu::reduce::truth(name, g, &axes, any, &shape)?;
            return Ok(Output::device(buf, shape, DType::Bool));
        }
        // The accumulator is "decided": any found a true / all found a false.
        let decided = dispatch!(a.dtype, T => cpu::reduce::<T, bool>(a, &axes, false,
            |done, d, s, n, st| done || row_decides(d, s, n, st, any)));
        let buf = new_overwritten::<u8>(decided.len(), |out| {
            for (o, &done) in out.iter_mut().zip(&decided) {
                *o = (done == any) as u8;
            }
        })?;
        Ok(Output::New {
            buf,
            shape,
            dtype: DType::Bool,
        })
    })?;
    Ok(NDArray { id })
}

impl NDArray {
    twins! {
        /// Elementwise logical AND of two Bool arrays, broadcasting (numpy's
        /// `logical_and`; other dtypes are an error: compare first, e.g. `x.gt(0)`).
        /// Panics with the error's message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let a = m.create(&[true, true, false, false], [4]);
        /// let b = m.create(&[true, false, true, false], [4]);
        /// assert_eq!(a.logical_and(b).to_vec::<bool>()?, vec![true, false, false, false]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn logical_and,
        /// [`NDArray::logical_and`]. Errors: `Closed`, `UnsupportedDType` (an operand is
        /// not Bool), `ShapeMismatch` (not broadcastable), `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: a Bool result.
        pub fn try_logical_and(self, other: NDArray) -> NDArray {
            logical(self, LogicOp::And, other, Location::caller())
        }
    }

    twins! {
        /// Elementwise logical OR of two Bool arrays, broadcasting. Panics with the error's
        /// message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let a = m.create(&[true, true, false, false], [4]);
        /// let b = m.create(&[true, false, true, false], [4]);
        /// assert_eq!(a.logical_or(b).to_vec::<bool>()?, vec![true, true, true, false]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn logical_or,
        /// [`NDArray::logical_or`]. Errors: `Closed`, `UnsupportedDType` (an operand is not
        /// Bool), `ShapeMismatch` (not broadcastable), `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: a Bool result.
        pub fn try_logical_or(self, other: NDArray) -> NDArray {
            logical(self, LogicOp::Or, other, Location::caller())
        }
    }

    twins! {
        /// Elementwise logical XOR of two Bool arrays, broadcasting. Panics with the
        /// error's message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let a = m.create(&[true, true, false, false], [4]);
        /// let b = m.create(&[true, false, true, false], [4]);
        /// assert_eq!(a.logical_xor(b).to_vec::<bool>()?, vec![false, true, true, false]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn logical_xor,
        /// [`NDArray::logical_xor`]. Errors: `Closed`, `UnsupportedDType` (an operand is
        /// not Bool), `ShapeMismatch` (not broadcastable), `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: a Bool result.
        pub fn try_logical_xor(self, other: NDArray) -> NDArray {
            logical(self, LogicOp::Xor, other, Location::caller())
        }
    }

    twins! {
        /// Elementwise logical NOT of a Bool array. Panics with the error's message on
        /// failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let a = m.create(&[true, false], [2]);
        /// assert_eq!(a.logical_not().to_vec::<bool>()?, vec![false, true]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn logical_not,
        /// [`NDArray::logical_not`]. Errors: `Closed`, `UnsupportedDType` (not Bool),
        /// `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: a Bool result.
        pub fn try_logical_not(self) -> NDArray {
            logical_not_impl(self, Location::caller())
        }
    }

    twins! {
        /// Whether any element is true, as a Bool 0-d array. Works on every dtype: nonzero
        /// is true, NaN included (as numpy). An empty array gives false. Panics with the
        /// error's message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// assert!(m.create(&[0.0f32, -2.0], [2]).any().to_scalar::<bool>()?);
        /// assert!(!m.create(&[false, false], [2]).any().to_scalar::<bool>()?);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn any,
        /// [`NDArray::any`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: a Bool result.
        pub fn try_any(self) -> NDArray {
            truth_reduction(self, true, None, false, Location::caller())
        }
    }

    twins! {
        /// Whether every element is true (nonzero; NaN counts as true), as a Bool 0-d
        /// array; any dtype. An empty array gives true (as numpy). Panics with the error's
        /// message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// assert!(!m.create(&[1i32, 0], [2]).all().to_scalar::<bool>()?);
        /// assert!(m.create(&[true, true], [2]).all().to_scalar::<bool>()?);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn all,
        /// [`NDArray::all`]. Errors: `Closed`, `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: a Bool result.
        pub fn try_all(self) -> NDArray {
            truth_reduction(self, false, None, false, Location::caller())
        }
    }

    twins! {
        /// [`NDArray::any`] over `axes` (negative counts from the end; `&[]` reduces
        /// nothing); with `keep_dims` the reduced axes stay as size 1. Panics with the
        /// error's message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[0u8, 0, 0, 3], [2, 2]);
        /// assert_eq!(x.any_axes(&[-1], false).to_vec::<bool>()?, vec![false, true]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn any_axes,
        /// [`NDArray::any_axes`]. Errors: `Closed`, `AxisOutOfRange`, `InvalidArgument` (a
        /// repeated axis), `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: a Bool result.
        pub fn try_any_axes(self, axes: &[isize], keep_dims: bool) -> NDArray {
            truth_reduction(self, true, Some(axes), keep_dims, Location::caller())
        }
    }

    twins! {
        /// [`NDArray::all`] over `axes` (negative counts from the end; `&[]` reduces
        /// nothing); with `keep_dims` the reduced axes stay as size 1. Panics with the
        /// error's message on failure (see the `try_` form).
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let x = m.create(&[1.0f64, 0.0, 2.0, 3.0], [2, 2]);
        /// assert_eq!(x.all_axes(&[0], true).to_vec::<bool>()?, vec![true, false]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn all_axes,
        /// [`NDArray::all_axes`]. Errors: `Closed`, `AxisOutOfRange`, `InvalidArgument` (a
        /// repeated axis), `ManagerClosed`/`ManagerCapped`.
        /// Not differentiable: a Bool result.
        pub fn try_all_axes(self, axes: &[isize], keep_dims: bool) -> NDArray {
            truth_reduction(self, false, Some(axes), keep_dims, Location::caller())
        }
    }
}
