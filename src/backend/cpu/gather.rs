//! Index-array kernels: `index_select` (and its reverse, `index_add`), `gather`,
//! `scatter_add`, `take`, `boolean_mask` and `masked_fill`, as plain loops over slices
//! and [`Layout`]s. The indices arrive already checked ([`checked_indices`]).

use super::copy::{copy_block, for_each_offset};
use crate::dtype::Native;
use crate::layout::{Layout, for_each_row};
use crate::shape::{Dims, Shape};

/// Check that every index lies in `0..bound`: the valid indices as `usize`, or the
/// position and value of the first bad one.
pub(crate) fn checked_indices(
    idx: &[i64],
    bound: usize,
) -> std::result::Result<Vec<usize>, (usize, i64)> {
    idx.iter()
        .enumerate()
        .map(|(p, &v)| {
            if v < 0 || v as u64 >= bound as u64 {
                Err((p, v))
            } else {
                Ok(v as usize)
            }
        })
        .collect()
}

/// `index_select`: the input viewed as `[outer, n, inner]` around `axis`; `out` (size
/// `outer * idx.len() * inner`, row-major) gets `src[o, idx[j], i]` at `(o, j, i)`.
pub(crate) fn index_select_kernel<T: Copy>(
    src: &[T],
    l: &Layout,
    axis: usize,
    idx: &[usize],
    out: &mut [T],
) {
    if out.is_empty() {
        return;
    }
    let dims = l.shape.dims();
    let (inner_d, inner_s) = (&dims[axis + 1..], &l.strides[axis + 1..]);
    let inner: usize = inner_d.iter().product();
    let sa = l.strides[axis];
    let mut w = 0;
    for_each_offset(
        &dims[..axis],
        &l.strides[..axis],
        l.offset as isize,
        |base| {
            for &j in idx {
                copy_block(
                    src,
                    inner_d,
                    inner_s,
                    base + j as isize * sa,
                    &mut out[w..w + inner],
                );
                w += inner;
            }
        },
    );
}

/// The reverse of [`index_select_kernel`]: `out` (contiguous, `out_dims`) gets
/// `src[o, j, i]` added at `(o, idx[j], i)`; `src` is row-major
/// `[outer, idx.len(), inner]`.
pub(crate) fn index_add_kernel<T: Native>(
    out: &mut [T],
    out_dims: &[usize],
    axis: usize,
    idx: &[usize],
    src: &[T],
) {
    let outer: usize = out_dims[..axis].iter().product();
    let n = out_dims[axis];
    let inner: usize = out_dims[axis + 1..].iter().product();
    if inner == 0 {
        return;
    }
    for o in 0..outer {
        for (j, &k) in idx.iter().enumerate() {
            let s = &src[(o * idx.len() + j) * inner..][..inner];
            let d = &mut out[(o * n + k) * inner..][..inner];
            for (d, &s) in d.iter_mut().zip(s) {
                *d = d.add(s);
            }
        }
    }
}

/// `gather`: for every position `p` of the index array (shape `idx_dims`, values `idx`
/// in row-major order), `out[p] = src[p with p[axis] = idx[p]]`.
pub(crate) fn gather_kernel<T: Copy>(
    src: &[T],
    l: &Layout,
    axis: usize,
    idx_dims: &[usize],
    idx: &[usize],
    out: &mut [T],
) {
    if out.is_empty() {
        return;
    }
    let mut strides = l.strides.clone();
    let sa = strides[axis];
    strides[axis] = 0;
    let mut p = 0;
    for_each_offset(idx_dims, &strides, l.offset as isize, |o| {
        out[p] = src[(o + idx[p] as isize * sa) as usize];
        p += 1;
    });
}

/// `scatter_add`: for every position `p` of the index array, `out[p with p[axis] =
/// idx[p]] += src[p]`; `out` is contiguous with `out_dims`, `src` has layout `sl`.
pub(crate) fn scatter_add_kernel<T: Native>(
    out: &mut [T],
    out_dims: &[usize],
    axis: usize,
    idx_dims: &[usize],
    idx: &[usize],
    src: &[T],
    sl: &Layout,
) {
    if idx.is_empty() {
        return;
    }
    let mut os = Shape(Dims::from_slice(out_dims)).contiguous_strides();
    let osa = os[axis];
    os[axis] = 0;
    let mut p = 0;
    for_each_row(
        idx_dims,
        [&os, &sl.strides],
        [0, sl.offset],
        |off, len, s| {
            for i in 0..len as isize {
                let d = (off[0] + i * s[0] + idx[p] as isize * osa) as usize;
                out[d] = out[d].add(src[(off[1] + i * s[1]) as usize]);
                p += 1;
            }
        },
    );
}

/// `take`: `out[k] = src[flat index idx[k]]` (row-major flat indices into `l`).
pub(crate) fn take_kernel<T: Copy>(src: &[T], l: &Layout, idx: &[usize], out: &mut [T]) {
    if l.is_contiguous() {
        for (o, &i) in out.iter_mut().zip(idx) {
            *o = src[l.offset + i];
        }
        return;
    }
    let dims = l.shape.dims();
    for (o, &i) in out.iter_mut().zip(idx) {
        let (mut rem, mut at) = (i, l.offset as isize);
        for d in (0..dims.len()).rev() {
            at += (rem % dims[d]) as isize * l.strides[d];
            rem /= dims[d];
        }
        *o = src[at as usize];
    }
}

/// `boolean_mask`: the rows of `src` (viewed as `[prod(dims[..k]), inner]`, `k =
/// mask_ndim`) where `mask` (row-major over the leading `k` dims) is set, in order.
pub(crate) fn boolean_mask_kernel<T: Copy>(
    src: &[T],
    l: &Layout,
    mask_ndim: usize,
    mask: &[bool],
    out: &mut [T],
) {
    if out.is_empty() {
        return;
    }
    let dims = l.shape.dims();
    let (inner_d, inner_s) = (&dims[mask_ndim..], &l.strides[mask_ndim..]);
    let inner: usize = inner_d.iter().product();
    let (mut p, mut w) = (0, 0);
    let (lead_d, lead_s) = (&dims[..mask_ndim], &l.strides[..mask_ndim]);
    for_each_offset(lead_d, lead_s, l.offset as isize, |base| {
        if mask[p] {
            copy_block(src, inner_d, inner_s, base, &mut out[w..w + inner]);
            w += inner;
        }
        p += 1;
    });
}

/// `masked_fill`: `out` (contiguous, `l`'s shape) is `src` with `value` where `mask`
/// (Bool bytes with layout `ml`, broadcastable to `l`'s shape) is set.
pub(crate) fn masked_fill_kernel<T: Copy>(
    src: &[T],
    l: &Layout,
    mask: &[u8],
    ml: &Layout,
    value: T,
    out: &mut [T],
) {
    if out.is_empty() {
        return;
    }
    let os = l.shape.contiguous_strides();
    let ms = ml.broadcast_strides(&l.shape);
    for_each_row(
        l.shape.dims(),
        [&os, &l.strides, &ms],
        [0, l.offset, ml.offset],
        |off, len, s| {
            for i in 0..len as isize {
                let m = mask[(off[2] + i * s[2]) as usize] != 0;
                out[(off[0] + i * s[0]) as usize] = if m {
                    value
                } else {
                    src[(off[1] + i * s[1]) as usize]
                };
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Strides;
    use crate::shape::Shape;

    fn layout(shape: &[usize], strides: &[isize], offset: usize) -> Layout {
        Layout {
            shape: Shape::from(shape),
            strides: Strides::from_slice(strides),
            offset,
        }
    }

    #[test]
    fn index_select_rows_and_columns() {
        let src: Vec<i32> = (0..6).collect(); // [[0,1,2],[3,4,5]]
        let l = Layout::contiguous(Shape::from([2, 3]));
        let mut out = vec![0; 9];
        index_select_kernel(&src, &l, 0, &[1, 0, 1], &mut out);
        assert_eq!(out, vec![3, 4, 5, 0, 1, 2, 3, 4, 5]);
        let mut out = vec![0; 4];
        index_select_kernel(&src, &l, 1, &[2, 0], &mut out);
        assert_eq!(out, vec![2, 0, 5, 3]);
        // The transpose [3, 2] (strides [1, 3]).
        let t = layout(&[3, 2], &[1, 3], 0);
        let mut out = vec![0; 2];
        index_select_kernel(&src, &t, 0, &[2], &mut out);
        assert_eq!(out, vec![2, 5]);
    }

    #[test]
    fn index_add_reverses_index_select() {
        let mut out = vec![0i64; 6];
        index_add_kernel(&mut out, &[3, 2], 0, &[2, 0, 2], &[1, 2, 3, 4, 5, 6]);
        assert_eq!(out, vec![3, 4, 0, 0, 6, 8]);
    }

    #[test]
    fn gather_and_scatter_add() {
        let src: Vec<f64> = (0..6).map(f64::from).collect(); // [[0,1,2],[3,4,5]]
        let l = Layout::contiguous(Shape::from([2, 3]));
        let mut out = vec![0.0; 4];
        gather_kernel(&src, &l, 1, &[2, 2], &[2, 0, 1, 1], &mut out);
        assert_eq!(out, vec![2.0, 0.0, 4.0, 4.0]);
        let mut out = vec![0.0; 3];
        gather_kernel(&src, &l, 0, &[1, 3], &[1, 0, 1], &mut out);
        assert_eq!(out, vec![3.0, 1.0, 5.0]);
        let mut acc = vec![0.0; 6];
        let s = Layout::contiguous(Shape::from([2, 2]));
        scatter_add_kernel(
            &mut acc,
            &[2, 3],
            1,
            &[2, 2],
            &[2, 2, 0, 1],
            &[1.0, 2.0, 3.0, 4.0],
            &s,
        );
        assert_eq!(acc, vec![0.0, 0.0, 3.0, 3.0, 4.0, 0.0]);
    }

    #[test]
    fn take_on_strided_views() {
        let src: Vec<u8> = (0..6).collect();
        let t = layout(&[3, 2], &[1, 3], 0); // transpose of [[0,1,2],[3,4,5]]
        let mut out = vec![0u8; 3];
        take_kernel(&src, &t, &[1, 4, 5], &mut out);
        assert_eq!(out, vec![3, 2, 5]);
        let rev = layout(&[3], &[-2], 4); // [4, 2, 0]
        take_kernel(&src, &rev, &[0, 2, 1], &mut out);
        assert_eq!(out, vec![4, 0, 2]);
    }

    #[test]
    fn masks() {
        let src: Vec<i32> = (0..6).collect();
        let l = Layout::contiguous(Shape::from([3, 2]));
        let mut out = vec![0; 4];
        boolean_mask_kernel(&src, &l, 1, &[true, false, true], &mut out);
        assert_eq!(out, vec![0, 1, 4, 5]);
        let mut out = vec![0; 6];
        let m = layout(&[2], &[1], 0);
        masked_fill_kernel(&src, &l, &[0, 1], &m, -1, &mut out);
        assert_eq!(out, vec![0, -1, 2, -1, 4, -1]);
    }

    #[test]
    fn bad_indices_name_position_and_value() {
        assert_eq!(checked_indices(&[0, 2, 3], 3), Err((2, 3)));
        assert_eq!(checked_indices(&[-1], 3), Err((0, -1)));
        assert_eq!(checked_indices(&[0, 2], 3), Ok(vec![0, 2]));
        assert_eq!(checked_indices(&[], 0), Ok(vec![]));
    }
}
