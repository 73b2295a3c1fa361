//! Copy and fill loops shared by many ops: walking the offsets of a strided block,
//! copying it out in row-major order, and converting a fill value to an element type.

use crate::DType;
use crate::dtype::Native;
use crate::error::{NdError, Result};
use crate::layout::for_each_row;

/// Call `f(offset)` for every element of the sub-array with `dims`/`strides` starting
/// at `base`, in row-major order (once for a 0-d sub-array, never if a dim is 0).
pub(crate) fn for_each_offset(
    dims: &[usize],
    strides: &[isize],
    base: isize,
    mut f: impl FnMut(isize),
) {
    for_each_row(dims, [strides], [0], |off, len, s| {
        for i in 0..len as isize {
            f(base + off[0] + i * s[0]);
        }
    });
}

/// Copy the sub-array with `dims`/`strides` starting at `start` into `out` in row-major
/// order (`out.len()` is its size).
pub(crate) fn copy_block<T: Copy>(
    src: &[T],
    dims: &[usize],
    strides: &[isize],
    start: isize,
    out: &mut [T],
) {
    let mut w = 0;
    for_each_row(dims, [strides], [0], |off, len, s| {
        let o = start + off[0];
        if s[0] == 1 {
            out[w..w + len].copy_from_slice(&src[o as usize..o as usize + len]);
        } else {
            for (i, d) in out[w..w + len].iter_mut().enumerate() {
                *d = src[(o + i as isize * s[0]) as usize];
            }
        }
        w += len;
    });
}

/// `value` as a `T` of `dtype` (Bool stores `value != 0`), or `InvalidArgument` for a
/// non-finite value into an integer array.
pub(crate) fn fill_value<T: Native>(op: &'static str, value: f64, dtype: DType) -> Result<T> {
    if dtype == DType::Bool {
        return Ok(T::from_i64((value != 0.0) as i64));
    }
    if !dtype.is_float() && !value.is_finite() {
        return Err(NdError::invalid(
            op,
            format!("cannot store {value} in a {dtype} array"),
        ));
    }
    Ok(T::from_f64(value))
}
