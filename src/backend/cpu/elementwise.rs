//! Elementwise kernels: maps, zips and in-place assignments over strided data, built
//! on [`for_each_row`], whose rows are contiguous for contiguous arrays (so the inner
//! loops vectorise) and strided otherwise. Inner loops special-case the stride patterns
//! that matter: 1 (contiguous) and 0 (broadcast).

use super::buffer::{Buffer, new_overwritten};
use super::fork::{PARALLEL_ELEMS, fork, may_fork};
use super::strided::{Strided, StridedMut};
use crate::dtype::Native;
use crate::error::Result;
use crate::layout::{for_each_row, for_each_row_any_order};
use crate::shape::{Dims, Shape};
use rayon::prelude::*;
use smallvec::SmallVec;

/// The operand's elements in row-major order.
pub(crate) fn to_vec<'a, T: Native>(x: impl Into<Strided<'a, T>>) -> Vec<T> {
    let Strided { data, layout: l } = x.into();
    let mut out = Vec::with_capacity(l.size());
    for_each_row(l.shape.dims(), [&l.strides], [l.offset], |off, n, s| {
        let (start, step) = (off[0], s[0]);
        if step == 1 {
            out.extend_from_slice(&data[start as usize..start as usize + n]);
        } else {
            out.extend((0..n as isize).map(|i| data[(start + i * step) as usize]));
        }
    });
    out
}

/// `out[i] = f(x[i])` into a new contiguous buffer.
pub(crate) fn map_unary<'a, T: Native, U: Native>(
    x: impl Into<Strided<'a, T>>,
    f: impl Fn(T) -> U + Sync + Send + Copy,
) -> Result<Buffer> {
    let Strided {
        data: src,
        layout: l,
    } = x.into();
    let n = l.size();
    new_overwritten::<U>(n, |out| {
        // A zero-size view may carry an offset past the end of its (empty) buffer.
        if n == 0 {
            return;
        }
        if l.is_contiguous() {
            let src = &src[l.offset..l.offset + n];
            if n >= PARALLEL_ELEMS && may_fork() {
                fork(|| {
                    out.par_chunks_mut(PARALLEL_ELEMS / 4)
                        .zip(src.par_chunks(PARALLEL_ELEMS / 4))
                        .for_each(|(o, s)| map1(o, s, f))
                });
            } else {
                map1(out, src, f);
            }
            return;
        }
        if let Some(plane) = Transposed::of(l) {
            return plane.map(src, out, Map(f));
        }
        let out_strides = l.shape.contiguous_strides();
        out_rows(
            l.shape.dims(),
            [&out_strides, &l.strides],
            [0, l.offset],
            out,
            |out, off, len, s| {
                let (o0, s0) = (off[0] as usize, off[1]);
                if s[0] == 1 {
                    let dst = &mut out[o0..o0 + len];
                    if s[1] == 1 {
                        let src = &src[s0 as usize..s0 as usize + len];
                        dst.iter_mut().zip(src).for_each(|(o, &x)| *o = f(x));
                    } else {
                        // A transposed operand's tile row.
                        for (i, o) in dst.iter_mut().enumerate() {
                            *o = f(src[(s0 + i as isize * s[1]) as usize]);
                        }
                    }
                } else {
                    for i in 0..len as isize {
                        out[(off[0] + i * s[0]) as usize] = f(src[(s0 + i * s[1]) as usize]);
                    }
                }
            },
        );
    })
}

/// An operand whose last two axes are a transposed matrix: unit stride down the rows
/// (the second-to-last axis), a larger one along the columns, such as `a.transpose()`
/// of a row-major `a`, maybe under batch axes. A row-major result of it is a
/// transpose: element by element, either the reads or the writes stride across cache
/// lines. [`Transposed::map`] moves it in 4×4 blocks instead, each read as four
/// contiguous runs down the source's columns and written as four contiguous runs along
/// the result's rows, inside 32×32 tiles that stay in L1.
pub(super) struct Transposed<'l> {
    layout: &'l crate::layout::Layout,
    rows: usize,
    cols: usize,
    /// The source's stride along the result's columns.
    col_stride: isize,
}

impl<'l> Transposed<'l> {
    /// Blocks pay for themselves from 4×4 on; smaller planes take the row path.
    const BLOCK: usize = 4;
    /// Tiles of 32×32 elements: 4 KB of f32 read and written, within L1.
    const TILE: usize = 32;

    pub(super) fn of(layout: &'l crate::layout::Layout) -> Option<Self> {
        let nd = layout.shape.ndim();
        let d = layout.shape.dims();
        (nd >= 2
            && layout.strides[nd - 2] == 1
            && layout.strides[nd - 1].unsigned_abs() > 1
            && d[nd - 2] >= Self::BLOCK
            && d[nd - 1] >= Self::BLOCK)
            .then(|| Transposed {
                layout,
                rows: d[nd - 2],
                cols: d[nd - 1],
                col_stride: layout.strides[nd - 1],
            })
    }

    /// `out = e(x)` in row-major order, `out` as long as the layout's size. Planes are
    /// split across the kernel pool when large: by planes where there are several, else
    /// by slabs of whole rows.
    fn map<T: Native, U: Native>(&self, src: &[T], out: &mut [U], e: impl Elem<T, U>) {
        let l = self.layout;
        let nd = l.shape.ndim();
        let plane = self.rows * self.cols;
        // The first element of each plane (row-major over the batch axes).
        let mut bases: SmallVec<[isize; 1]> = SmallVec::new();
        for_each_row(
            &l.shape.dims()[..nd - 2],
            [&l.strides[..nd - 2]],
            [l.offset],
            |off, n, s| bases.extend((0..n as isize).map(|k| off[0] + k * s[0])),
        );
        if out.len() < PARALLEL_ELEMS || !may_fork() {
            for (k, (o, &b)) in out.chunks_mut(plane).zip(&bases).enumerate() {
                self.rows_of(src, b, 0, o, k * plane, e);
            }
        } else if bases.len() > 1 {
            fork(|| {
                out.par_chunks_mut(plane)
                    .zip(bases.par_iter())
                    .enumerate()
                    .for_each(|(k, (o, &b))| self.rows_of(src, b, 0, o, k * plane, e))
            });
        } else {
            let rows = (PARALLEL_ELEMS / 4)
                .div_ceil(self.cols)
                .next_multiple_of(Self::TILE);
            fork(|| {
                out.par_chunks_mut(rows * self.cols)
                    .enumerate()
                    .for_each(|(k, o)| {
                        self.rows_of(src, bases[0], k * rows, o, k * rows * self.cols, e)
                    })
            });
        }
    }

    /// Rows `first..` of the plane starting at `base`, as many as `out` holds (`out[0]`
    /// is element `start` of the result): tile by tile, the tile's full 4×4 blocks
    /// through [`blocks`], then its ragged edge (the rows below the blocks and the
    /// columns to their right) element by element.
    fn rows_of<T: Native, U: Native>(
        &self,
        src: &[T],
        base: isize,
        first: usize,
        out: &mut [U],
        start: usize,
        e: impl Elem<T, U>,
    ) {
        const B: usize = Transposed::BLOCK;
        let (cols, cs) = (self.cols, self.col_stride);
        let rows = out.len() / cols;
        // Source element of the plane's row `i` (counted from `first`), column `j`.
        let at = |i: usize, j: usize| base + (first + i) as isize + j as isize * cs;
        for i0 in (0..rows).step_by(Self::TILE) {
            let ie = rows.min(i0 + Self::TILE);
            for j0 in (0..cols).step_by(Self::TILE) {
                let je = cols.min(j0 + Self::TILE);
                let (h, w) = ((ie - i0) / B * B, (je - j0) / B * B);
                let corner = i0 * cols + j0;
                let tile = (&mut out[corner..], start + corner);
                blocks(src, at(i0, j0), cs, tile, cols, [h, w], e);
                for r in i0..ie {
                    let c0 = if r < i0 + h { j0 + w } else { j0 };
                    for c in c0..je {
                        let o = r * cols + c;
                        out[o] = e.one(start + o, src[at(r, c) as usize]);
                    }
                }
            }
        }
    }
}

/// What [`Transposed::map`] writes for each element, from the transposed operand's
/// value and the element's row-major index in the result (where a zip finds its other
/// operand's value).
trait Elem<T, U>: Copy + Sync + Send {
    /// The result's element `at`, of the transposed operand's `x`.
    fn one(&self, at: usize, x: T) -> U;
    /// The result's elements `at..at + 4` (along one row), of the transposed operand's.
    fn four(&self, at: usize, x: [T; 4]) -> [U; 4];
}

/// A map: `f(x)`.
#[derive(Clone, Copy)]
struct Map<F>(F);

impl<T, U, F: Fn(T) -> U + Copy + Sync + Send> Elem<T, U> for Map<F> {
    #[inline(always)]
    fn one(&self, _: usize, x: T) -> U {
        (self.0)(x)
    }
    #[inline(always)]
    fn four(&self, _: usize, x: [T; 4]) -> [U; 4] {
        x.map(self.0)
    }
}

/// A zip with `other`, an operand of the result's shape laid out like it (contiguous,
/// from `other[0]`): `f(x, y)`, or `f(y, x)` when the transposed operand is the right
/// one (`LEFT` false).
#[derive(Clone, Copy)]
struct Zip<'a, T, F, const LEFT: bool> {
    other: &'a [T],
    f: F,
}

impl<T: Native, U, F: Fn(T, T) -> U + Copy + Sync + Send, const LEFT: bool> Elem<T, U>
    for Zip<'_, T, F, LEFT>
{
    #[inline(always)]
    fn one(&self, at: usize, x: T) -> U {
        let y = self.other[at];
        if LEFT { (self.f)(x, y) } else { (self.f)(y, x) }
    }
    #[inline(always)]
    fn four(&self, at: usize, x: [T; 4]) -> [U; 4] {
        let y: &[T; 4] = self.other[at..at + 4].try_into().expect("a run of 4");
        std::array::from_fn(|k| {
            if LEFT {
                (self.f)(x[k], y[k])
            } else {
                (self.f)(y[k], x[k])
            }
        })
    }
}

/// `out[r * stride + c] = e(src[corner + r + c * cs])` for `r < h`, `c < w`, both
/// multiples of 4 (`tile` is `out` and the result's index of `out[0]`): the transposed
/// map in 4×4 blocks, each read as four contiguous runs down the source's columns and
/// written as four runs along `out`'s rows.
///
/// The bounds are checked once: the source indices are affine in `r` and `c`, so the
/// least and the greatest are at the rectangle's corners. Four-byte elements on x86_64
/// then go through SSE2's shuffles, which only move bits, and `e` maps each shuffled row
/// of four, which LLVM compiles to one vector operation for the simple maps (`x * s`).
/// A loop with a bounds check per block kept its counters on the stack and ran
/// `transposed_scale` at 285 µs on one thread against 197 for this one (bench/HISTORY.md,
/// 2026-12-07). Other sizes go element by element.
#[inline(always)]
fn blocks<T: Native, U: Native>(
    src: &[T],
    corner: isize,
    cs: isize,
    (out, start): (&mut [U], usize),
    stride: usize,
    [h, w]: [usize; 2],
    e: impl Elem<T, U>,
) {
    const B: usize = Transposed::BLOCK;
    debug_assert!(h % B == 0 && w % B == 0);
    if h == 0 || w == 0 {
        return;
    }
    let reach = (w as isize - 1) * cs;
    let (lo, hi) = (
        corner + reach.min(0),
        corner + h as isize - 1 + reach.max(0),
    );
    assert!(
        lo >= 0 && (hi as usize) < src.len() && (h - 1) * stride + w <= out.len(),
        "a transposed block runs past its buffer"
    );
    #[cfg(target_arch = "x86_64")]
    if std::mem::size_of::<T>() == 4 {
        use std::arch::x86_64::{
            _mm_loadu_ps, _mm_movehl_ps, _mm_movelh_ps, _mm_unpackhi_ps, _mm_unpacklo_ps,
        };
        for i in (0..h).step_by(B) {
            // The strip's first block: rows `i..i + 4`, columns `0..4`; each next block
            // is four columns on (the last step may point past the source: it is only
            // wrapped, never read).
            let mut p = src.as_ptr().wrapping_offset(corner + i as isize);
            let mut o = out.as_mut_ptr().wrapping_add(i * stride);
            for j in (0..w).step_by(B) {
                // SAFETY: SSE2 is part of every x86_64 CPU. The block reads the source
                // indices `corner + r + c * cs` for `r` in `i..i + 4`, `c` in
                // `j..j + 4` (`j` the columns done), all within `lo..=hi`, checked
                // against `src.len()` above; each run is four 4-byte elements (by
                // `T`'s size), read unaligned. It writes `out[(i + k) * stride + j..][..4]`,
                // within `(h - 1) * stride + w`, checked against `out.len()`, unaligned.
                // The shuffles only move bits, and every bit pattern is a value of each
                // 4-byte `Native` type (f32, i32), so the rows are valid `[T; 4]`.
                unsafe {
                    let run = |k: isize| _mm_loadu_ps(p.offset(k * cs).cast());
                    let (r0, r1, r2, r3) = (run(0), run(1), run(2), run(3));
                    let (t0, t1) = (_mm_unpacklo_ps(r0, r1), _mm_unpacklo_ps(r2, r3));
                    let (t2, t3) = (_mm_unpackhi_ps(r0, r1), _mm_unpackhi_ps(r2, r3));
                    let block = [
                        _mm_movelh_ps(t0, t1),
                        _mm_movehl_ps(t1, t0),
                        _mm_movelh_ps(t2, t3),
                        _mm_movehl_ps(t3, t2),
                    ];
                    for (k, v) in block.iter().enumerate() {
                        let row: [T; B] = std::mem::transmute_copy(v);
                        let at = start + (i + k) * stride + j;
                        o.add(k * stride)
                            .cast::<[U; B]>()
                            .write_unaligned(e.four(at, row));
                    }
                }
                p = p.wrapping_offset(B as isize * cs);
                o = o.wrapping_add(B);
            }
        }
        return;
    }
    for i in (0..h).step_by(B) {
        for j in (0..w).step_by(B) {
            for r in i..i + B {
                let o = r * stride + j;
                for (c, v) in (j..).zip(&mut out[o..o + B]) {
                    let x = src[(corner + r as isize + c as isize * cs) as usize];
                    *v = e.one(start + o + c - j, x);
                }
            }
        }
    }
}

/// `out = f(a, b)` with numpy broadcasting into a new contiguous buffer of `shape`.
pub(crate) fn map_binary<'a, 'b, T: Native, U: Native>(
    a: impl Into<Strided<'a, T>>,
    b: impl Into<Strided<'b, T>>,
    shape: &Shape,
    f: impl Fn(T, T) -> U + Sync + Send + Copy,
) -> Result<Buffer> {
    let (
        Strided {
            data: da,
            layout: la,
        },
        Strided {
            data: db,
            layout: lb,
        },
    ) = (a.into(), b.into());
    let n = shape.size();
    new_overwritten::<U>(n, |out| {
        // Zero-size views may carry offsets past the end of their (empty) buffers.
        if n == 0 {
            return;
        }
        if la.shape == *shape && lb.shape == *shape && la.is_contiguous() && lb.is_contiguous() {
            let (sa, sb) = (&da[la.offset..la.offset + n], &db[lb.offset..lb.offset + n]);
            if n >= PARALLEL_ELEMS && may_fork() {
                let c = PARALLEL_ELEMS / 4;
                fork(|| {
                    out.par_chunks_mut(c)
                        .zip(sa.par_chunks(c).zip(sb.par_chunks(c)))
                        .for_each(|(o, (x, y))| zip2(o, x, y, f))
                });
            } else {
                zip2(out, sa, sb, f);
            }
            return;
        }
        // A contiguous array and a single element (`x + b` with a [1] bias): one row
        // with the single element's stride 0.
        let (oa, ob) = (la.offset as isize, lb.offset as isize);
        if la.shape == *shape && la.is_contiguous() && lb.size() == 1 {
            return binary_row(out, da, oa, 1, db, ob, 0, f);
        }
        if lb.shape == *shape && lb.is_contiguous() && la.size() == 1 {
            return binary_row(out, da, oa, 0, db, ob, 1, f);
        }
        // A transposed operand and a contiguous one of the result's shape (`a.T + b`):
        // the transposed one in 4×4 blocks, the other read along the result's rows.
        if la.shape == *shape && lb.shape == *shape {
            if let (true, Some(t)) = (lb.is_contiguous(), Transposed::of(la)) {
                let other = &db[lb.offset..lb.offset + n];
                return t.map(da, out, Zip::<_, _, true> { other, f });
            }
            if let (true, Some(t)) = (la.is_contiguous(), Transposed::of(lb)) {
                let other = &da[la.offset..la.offset + n];
                return t.map(db, out, Zip::<_, _, false> { other, f });
            }
        }
        let out_strides = shape.contiguous_strides();
        let (sa, sb) = (la.broadcast_strides(shape), lb.broadcast_strides(shape));
        out_rows(
            shape.dims(),
            [&out_strides, &sa, &sb],
            [0, la.offset, lb.offset],
            out,
            |out, off, len, s| {
                if s[0] == 1 {
                    let dst = &mut out[off[0] as usize..off[0] as usize + len];
                    binary_row(dst, da, off[1], s[1], db, off[2], s[2], f);
                } else {
                    // A row along another dimension than the output's last.
                    for i in 0..len as isize {
                        out[(off[0] + i * s[0]) as usize] = f(
                            da[(off[1] + i * s[1]) as usize],
                            db[(off[2] + i * s[2]) as usize],
                        );
                    }
                }
            },
        );
    })
}

/// [`for_each_row_any_order`] over `out`, a new contiguous array of `shape` (operand 0,
/// from offset 0), and the operands it is computed from: `f(out, offsets, len, steps)`
/// for each row. Large arrays are split across the kernel pool in slabs of `out` along
/// its first axis longer than 1; `f` then gets the slab, and offsets into it.
fn out_rows<U: Send, const K: usize>(
    shape: &[usize],
    strides: [&[isize]; K],
    base: [usize; K],
    out: &mut [U],
    f: impl Fn(&mut [U], [isize; K], usize, [isize; K]) + Sync,
) {
    let axis = shape.iter().position(|&d| d > 1);
    let Some(axis) = axis.filter(|_| out.len() >= PARALLEL_ELEMS && may_fork()) else {
        return for_each_row_any_order(shape, strides, base, |o, n, s| f(out, o, n, s));
    };
    // Whole rows of the axis, enough for a quarter of the split threshold, in multiples
    // of 32 (so a transposed operand's tiles are not cut short at each slab's end).
    let inner: usize = shape[axis + 1..].iter().product();
    let rows = (PARALLEL_ELEMS / 4).div_ceil(inner).next_multiple_of(32);
    let sub = strides.map(|s| &s[axis..]);
    fork(|| {
        out.par_chunks_mut(rows * inner)
            .enumerate()
            .for_each(|(i, slab)| {
                let mut dims = Dims::from_slice(&shape[axis..]);
                dims[0] = slab.len() / inner;
                let at = std::array::from_fn(|k| {
                    let first = (i * rows) as isize * strides[k][axis];
                    if k == 0 {
                        0
                    } else {
                        (base[k] as isize + first) as usize
                    }
                });
                for_each_row_any_order(&dims, sub, at, |o, n, s| f(slab, o, n, s));
            })
    });
}

/// `out[i] = f(a[i], b[i])` over the shortest of the three, in groups of eight, each
/// read whole before it is written. LLVM turns a group into vector instructions with
/// no overlap check and no minimum length; as a plain loop, inlined into its caller,
/// it ran element by element for short rows (a [10] add: 10 scalar rounds).
#[inline(always)]
fn zip2<T: Copy, U: Copy>(out: &mut [U], a: &[T], b: &[T], f: impl Fn(T, T) -> U) {
    const W: usize = 8;
    let n = out.len().min(a.len()).min(b.len());
    let (out, a, b) = (&mut out[..n], &a[..n], &b[..n]);
    let mut groups = out.chunks_exact_mut(W);
    let (xs, ys) = (a.chunks_exact(W), b.chunks_exact(W));
    let (xr, yr) = (xs.remainder(), ys.remainder());
    for ((o, x), y) in groups.by_ref().zip(xs).zip(ys) {
        let v: [U; W] = std::array::from_fn(|i| f(x[i], y[i]));
        o.copy_from_slice(&v);
    }
    for ((o, &x), &y) in groups.into_remainder().iter_mut().zip(xr).zip(yr) {
        *o = f(x, y);
    }
}

/// `out[i] = f(a[i])` over the shorter of the two, in groups of eight (see [`zip2`]).
#[inline(always)]
fn map1<T: Copy, U: Copy>(out: &mut [U], a: &[T], f: impl Fn(T) -> U) {
    const W: usize = 8;
    let n = out.len().min(a.len());
    let (out, a) = (&mut out[..n], &a[..n]);
    let mut groups = out.chunks_exact_mut(W);
    let xs = a.chunks_exact(W);
    let xr = xs.remainder();
    for (o, x) in groups.by_ref().zip(xs) {
        let v: [U; W] = std::array::from_fn(|i| f(x[i]));
        o.copy_from_slice(&v);
    }
    for (o, &x) in groups.into_remainder().iter_mut().zip(xr) {
        *o = f(x);
    }
}

/// One row of a binary op with the stride patterns that matter specialised.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn binary_row<T: Copy, U: Copy>(
    dst: &mut [U],
    da: &[T],
    oa: isize,
    sa: isize,
    db: &[T],
    ob: isize,
    sb: isize,
    f: impl Fn(T, T) -> U,
) {
    let n = dst.len();
    match (sa, sb) {
        (1, 1) => zip2(
            dst,
            &da[oa as usize..oa as usize + n],
            &db[ob as usize..ob as usize + n],
            f,
        ),
        (1, 0) => {
            let y = db[ob as usize];
            map1(dst, &da[oa as usize..oa as usize + n], |x| f(x, y));
        }
        (0, 1) => {
            let x = da[oa as usize];
            map1(dst, &db[ob as usize..ob as usize + n], |y| f(x, y));
        }
        _ => {
            for (i, o) in dst.iter_mut().enumerate() {
                let i = i as isize;
                *o = f(da[(oa + i * sa) as usize], db[(ob + i * sb) as usize]);
            }
        }
    }
}

/// In place: `t = f(t, b)`, `b` broadcast to `t`'s shape (checked by the caller).
pub(crate) fn assign_binary<'a, 'b, T: Native>(
    t: impl Into<StridedMut<'a, T>>,
    b: impl Into<Strided<'b, T>>,
    f: impl Fn(T, T) -> T + Sync + Send + Copy,
) {
    let StridedMut {
        data: dt,
        layout: lt,
    } = t.into();
    let Strided {
        data: db,
        layout: lb,
    } = b.into();
    if lt.is_contiguous() && lb.shape == lt.shape && lb.is_contiguous() {
        // The common case (`w -= g * lr`, a gradient added in): two plain runs, split
        // across the kernel pool when large.
        let n = lt.size();
        if n > 0 {
            let t = &mut dt[lt.offset..lt.offset + n];
            let b = &db[lb.offset..lb.offset + n];
            let run = |t: &mut [T], b: &[T]| {
                for (p, &q) in t.iter_mut().zip(b) {
                    *p = f(*p, q);
                }
            };
            if n >= PARALLEL_ELEMS && may_fork() {
                let c = PARALLEL_ELEMS / 4;
                fork(|| {
                    t.par_chunks_mut(c)
                        .zip(b.par_chunks(c))
                        .for_each(|(t, b)| run(t, b))
                });
            } else {
                run(t, b);
            }
        }
        return;
    }
    let sb = lb.broadcast_strides(&lt.shape);
    let boff = lb.offset;
    for_each_row_any_order(
        lt.shape.dims(),
        [&lt.strides, &sb],
        [lt.offset, boff],
        |off, len, s| {
            for i in 0..len as isize {
                let ti = (off[0] + i * s[0]) as usize;
                dt[ti] = f(dt[ti], db[(off[1] + i * s[1]) as usize]);
            }
        },
    );
}

/// In place: `t = f(t)`.
pub(crate) fn assign_unary<'a, T: Native>(
    t: impl Into<StridedMut<'a, T>>,
    f: impl Fn(T) -> T + Sync + Send + Copy,
) {
    let StridedMut {
        data: dt,
        layout: lt,
    } = t.into();
    if lt.is_contiguous() {
        let n = lt.size();
        if n > 0 {
            let t = &mut dt[lt.offset..lt.offset + n];
            if n >= PARALLEL_ELEMS && may_fork() {
                fork(|| {
                    t.par_chunks_mut(PARALLEL_ELEMS / 4)
                        .for_each(|t| t.iter_mut().for_each(|p| *p = f(*p)))
                });
            } else {
                t.iter_mut().for_each(|p| *p = f(*p));
            }
        }
        return;
    }
    for_each_row_any_order(
        lt.shape.dims(),
        [&lt.strides],
        [lt.offset],
        |off, len, s| {
            for i in 0..len as isize {
                let ti = (off[0] + i * s[0]) as usize;
                dt[ti] = f(dt[ti]);
            }
        },
    );
}
