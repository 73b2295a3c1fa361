//! Copy and fill loops shared by many ops: walking the offsets of a strided block,
//! copying it out in row-major order, copying a (broadcast) array into a strided place
//! of a larger one (`broadcast_to`, `concat`, `stack`, `pad`), the all-axes gather
//! behind `tile`, the triangles of `tril`/`triu`, and converting a fill value to an
//! element type.

use super::strided::Strided;
use crate::DType;
use crate::dtype::Native;
use crate::error::{NdError, Result};
use crate::layout::{Layout, for_each_row};
use crate::shape::Shape;

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

/// Copy `src` (broadcast to `shape`) into `out`, element `(i..)` going to
/// `out_base + sum(i_k * out_strides[k])`.
pub(crate) fn copy_strided<T: Native>(
    out: &mut [T],
    out_strides: &[isize],
    out_base: usize,
    src: Strided<'_, T>,
    shape: &Shape,
) {
    let data = src.data;
    let ss = src.layout.broadcast_strides(shape);
    for_each_row(
        shape.dims(),
        [out_strides, &ss],
        [out_base, src.layout.offset],
        |off, len, s| {
            let (o, i) = (off[0] as usize, off[1]);
            if s[0] == 1 && s[1] == 1 {
                out[o..o + len].copy_from_slice(&data[i as usize..i as usize + len]);
            } else if s[0] == 1 && s[1] == 0 {
                // A broadcast row (e.g. a one-element array expanded): a fill.
                out[o..o + len].fill(data[i as usize]);
            } else {
                for k in 0..len as isize {
                    out[(off[0] + k * s[0]) as usize] = data[(i + k * s[1]) as usize];
                }
            }
        },
    );
}

/// `out[i_0, .., i_n] = src[offset + sum_d maps[d][i_d] * strides[d]]`: a gather along
/// every axis at once (`tile` uses it with `i % n`). `out` has `prod(maps[d].len())`
/// elements, row-major.
pub(crate) fn gather_axes_kernel<T: Copy>(
    src: &[T],
    strides: &[isize],
    offset: usize,
    maps: &[Vec<usize>],
    out: &mut [T],
) {
    if out.is_empty() {
        return;
    }
    let nd = maps.len();
    if nd == 0 {
        out[0] = src[offset];
        return;
    }
    let (last, sl) = (&maps[nd - 1], strides[nd - 1]);
    let mut idx = vec![0usize; nd - 1];
    let mut w = 0;
    loop {
        let base = offset as isize
            + (0..nd - 1)
                .map(|d| maps[d][idx[d]] as isize * strides[d])
                .sum::<isize>();
        for &j in last {
            out[w] = src[(base + j as isize * sl) as usize];
            w += 1;
        }
        let mut d = nd - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < maps[d].len() {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// `tril` (`lower`) or `triu` over the last two axes of `l` (batched over the others):
/// element `(.., i, j)` is kept when `j - i <= k` (tril) or `j - i >= k` (triu), else 0.
pub(crate) fn tri_kernel<T: Native>(src: &[T], l: &Layout, k: i64, lower: bool, out: &mut [T]) {
    if out.is_empty() {
        return;
    }
    let (dims, nd) = (l.shape.dims(), l.shape.ndim());
    let (rows, cols) = (dims[nd - 2], dims[nd - 1]);
    let (sr, sc) = (l.strides[nd - 2], l.strides[nd - 1]);
    let mut w = 0;
    for_each_offset(
        &dims[..nd - 2],
        &l.strides[..nd - 2],
        l.offset as isize,
        |base| {
            for i in 0..rows {
                for j in 0..cols {
                    let d = j as i64 - i as i64;
                    let keep = if lower { d <= k } else { d >= k };
                    out[w] = if keep {
                        src[(base + i as isize * sr + j as isize * sc) as usize]
                    } else {
                        T::ZERO
                    };
                    w += 1;
                }
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_axes_tiles_and_handles_scalars() {
        let src = [1, 2, 3];
        let mut out = [0; 6];
        gather_axes_kernel(&src, &[0, 1], 0, &[vec![0, 0], vec![0, 1, 2]], &mut out);
        assert_eq!(out, [1, 2, 3, 1, 2, 3]);
        let mut one = [0];
        gather_axes_kernel(&src, &[], 2, &[], &mut one);
        assert_eq!(one, [3]);
    }

    #[test]
    fn triangles() {
        let src: Vec<i64> = (1..=6).collect(); // [[1,2,3],[4,5,6]]
        let l = Layout::contiguous(Shape::from([2, 3]));
        let mut out = vec![0; 6];
        tri_kernel(&src, &l, 0, true, &mut out);
        assert_eq!(out, vec![1, 0, 0, 4, 5, 0]);
        tri_kernel(&src, &l, 1, false, &mut out);
        assert_eq!(out, vec![0, 2, 3, 0, 0, 6]);
    }
}
