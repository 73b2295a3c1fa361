//! [`Layout`]: how an array's elements sit in its buffer (shape, strides in elements,
//! offset), and the strided row iteration every kernel is built on.

use crate::shape::{Dims, Shape};
use smallvec::SmallVec;

/// Strides in elements; negative for reversed slices, 0 for broadcast dimensions.
pub(crate) type Strides = SmallVec<[isize; 4]>;

/// Shape, strides and offset (in elements) of an array within its buffer.
#[derive(Debug, PartialEq)]
pub(crate) struct Layout {
    pub shape: Shape,
    pub strides: Strides,
    pub offset: usize,
}

impl Clone for Layout {
    #[inline]
    fn clone(&self) -> Self {
        Layout {
            shape: self.shape.clone(),
            strides: Strides::from_slice(&self.strides),
            offset: self.offset,
        }
    }
}

impl Layout {
    /// A row-major layout starting at element 0.
    #[inline]
    pub(crate) fn contiguous(shape: Shape) -> Layout {
        let strides = shape.contiguous_strides();
        Layout {
            shape,
            strides,
            offset: 0,
        }
    }

    /// Whether the elements are exactly `offset .. offset + size` in row-major order.
    #[inline]
    pub(crate) fn is_contiguous(&self) -> bool {
        let mut expected = 1isize;
        for (&d, &s) in self.shape.0.iter().zip(self.strides.iter()).rev() {
            if d != 1 && s != expected {
                return false;
            }
            expected *= d as isize;
        }
        true
    }

    pub(crate) fn size(&self) -> usize {
        self.shape.size()
    }

    /// Strides of this layout seen through a broadcast to `target` (which must be a
    /// valid broadcast of this shape): missing and size-1 dimensions get stride 0.
    pub(crate) fn broadcast_strides(&self, target: &Shape) -> Strides {
        let n = target.ndim();
        let k = self.shape.ndim();
        let mut out = Strides::from_elem(0, n);
        for i in 0..k {
            let t = n - k + i;
            out[t] = if self.shape.0[i] == 1 && target.0[t] != 1 {
                0
            } else {
                self.strides[i]
            };
        }
        out
    }
}

/// Call `f(offsets, inner_len, inner_strides)` once per innermost row of `shape`, where
/// `offsets[k]` is the element offset of operand `k` at the start of the row (its base
/// offset plus the outer indices times its strides). `strides[k]` must have
/// `shape.ndim()` entries. A 0-d shape is one row of length 1; a shape with a zero
/// dimension has no rows. Rows are as long as the layouts allow: inner dimensions that
/// every operand strides uniformly are merged, and a dimension of size 1 (whose stride
/// never matters) never splits a row, so `[n,1] + [1]` is one row of `n`, not `n` rows
/// of 1.
pub(crate) fn for_each_row<const K: usize>(
    shape: &[usize],
    strides: [&[isize]; K],
    base: [usize; K],
    mut f: impl FnMut([isize; K], usize, [isize; K]),
) {
    let nd = shape.len();
    let base = base.map(|b| b as isize);
    if nd == 0 {
        f(base, 1, [0; K]);
        return;
    }
    if shape.contains(&0) {
        return;
    }
    walk(shape, strides, base, row_of(shape, strides), f);
}

/// Call `f(src_start, src_step, dst_start, dst_step)` once per lane of `l` along `axis`:
/// the elements `src_start + i*src_step` of `l`'s buffer (`i < l.shape[axis]`), and
/// the same elements of a contiguous array of `l`'s shape (`dst_*`). The kernels that
/// work lane by lane (softmax, cumsum) write their result through it. No lanes when a
/// dimension is zero.
pub(crate) fn for_each_lane(
    l: &Layout,
    axis: usize,
    mut f: impl FnMut(isize, isize, isize, isize),
) {
    let dims = l.shape.dims();
    let out_strides = l.shape.contiguous_strides();
    let (mut outer, mut si, mut so) = (Dims::new(), Strides::new(), Strides::new());
    for d in (0..dims.len()).filter(|&d| d != axis) {
        outer.push(dims[d]);
        si.push(l.strides[d]);
        so.push(out_strides[d]);
    }
    if dims[axis] == 0 {
        return;
    }
    let (ss, ds) = (l.strides[axis], out_strides[axis]);
    for_each_row(&outer, [&si, &so], [l.offset, 0], |off, rows, s| {
        for r in 0..rows as isize {
            f(off[0] + r * s[0], ss, off[1] + r * s[1], ds);
        }
    });
}

/// Call `f` for each row that `row` (from [`row_of`]) describes.
#[inline(always)]
fn walk<const K: usize>(
    shape: &[usize],
    strides: [&[isize]; K],
    base: [isize; K],
    (inner, inner_len, inner_strides): (usize, usize, [isize; K]),
    mut f: impl FnMut([isize; K], usize, [isize; K]),
) {
    let outer = &shape[..inner];
    let mut idx: Dims = Dims::from_elem(0, outer.len());
    let mut off = base;
    loop {
        f(off, inner_len, inner_strides);
        // Odometer increment over the outer dimensions.
        let mut d = outer.len();
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            for k in 0..K {
                off[k] += strides[k][d];
            }
            if idx[d] < outer[d] {
                break;
            }
            for k in 0..K {
                off[k] -= strides[k][d] * outer[d] as isize;
            }
            idx[d] = 0;
        }
    }
}

/// The rows [`for_each_row`] walks for a shape with no zero dimension and at least one
/// dimension: `(first, len, strides)`, where dimensions `first..` form each row of
/// `len` elements with these strides.
fn row_of<const K: usize>(shape: &[usize], strides: [&[isize]; K]) -> (usize, usize, [isize; K]) {
    let nd = shape.len();
    // The row runs along the last dimension of size > 1: a size-1 dimension takes no
    // step, so its stride (a broadcast 0, or the operand's own) never matters.
    let mut inner = nd - 1;
    while inner > 0 && shape[inner] == 1 {
        inner -= 1;
    }
    let mut inner_len = shape[inner];
    let inner_strides: [isize; K] = std::array::from_fn(|k| strides[k][inner]);
    // Merge the dimensions outside it while every operand stays uniformly strided
    // across them (size-1 ones always merge): a contiguous array then becomes one long
    // row (fast, vectorisable), and so does `[n,1] + [1]`.
    while inner > 0 {
        let d = inner - 1;
        let mergeable = shape[d] == 1
            || (0..K).all(|k| strides[k][d] == inner_strides[k].wrapping_mul(inner_len as isize));
        if !mergeable || inner_len.checked_mul(shape[d]).is_none() {
            break;
        }
        inner_len *= shape[d];
        inner = d;
    }
    (inner, inner_len, inner_strides)
}

/// [`for_each_row`] for kernels that address every operand through its offsets (none
/// is written in visit order): when the rows would be short (a transposed view walked
/// along its last dimension: `[n,2]` with strides `[1,n]` is `n` rows of 2), the row
/// runs along the longest dimension instead, so per-row costs stop dominating. When the
/// rows are long but an operand is more contiguous along an outer axis (a transposed
/// view of a large matrix), they are walked in square tiles of that axis and the rows'
/// ([`walk_tiled`]), so each cache line of that operand is read once, not once per
/// element. Each element is still visited once, at the same offsets, in another order.
/// Operand 0 is the one written: if it repeats an element (a zero stride), the plain
/// order is kept, so the same write lands last.
pub(crate) fn for_each_row_any_order<const K: usize>(
    shape: &[usize],
    strides: [&[isize]; K],
    base: [usize; K],
    f: impl FnMut([isize; K], usize, [isize; K]),
) {
    /// Rows shorter than this are worth reordering for a dimension at least `GAIN`
    /// times longer (and at least this long).
    const SHORT: usize = 16;
    const GAIN: usize = 4;
    if shape.len() >= 2 && !shape.contains(&0) {
        let row = row_of(shape, strides);
        let (inner, len, _) = row;
        let repeats = || {
            shape
                .iter()
                .zip(strides[0])
                .any(|(&n, &st)| n > 1 && st == 0)
        };
        if len >= SHORT {
            // The common case: long rows already; in tiles when an operand is more
            // contiguous along another axis than along the rows (a transposed view).
            if let Some(q) = tile_axis(shape, strides, row)
                && !repeats()
            {
                return walk_tiled(shape, strides, base.map(|b| b as isize), row, q, f);
            }
            return walk(shape, strides, base.map(|b| b as isize), row, f);
        }
        let long = (0..inner).max_by_key(|&d| shape[d]);
        if let Some(long) = long
            && shape[long] >= (GAIN * len).max(SHORT)
            && !repeats()
        {
            // Move `long` last, the others in their order.
            let order: Dims = (0..shape.len())
                .filter(|&d| d != long)
                .chain([long])
                .collect();
            let dims: Dims = order.iter().map(|&d| shape[d]).collect();
            let st: [Strides; K] =
                std::array::from_fn(|k| order.iter().map(|&d| strides[k][d]).collect());
            return for_each_row(&dims, std::array::from_fn(|k| &st[k][..]), base, f);
        }
        return walk(shape, strides, base.map(|b| b as isize), row, f);
    }
    for_each_row(shape, strides, base, f)
}

/// The side of the square tiles of [`walk_tiled`], in elements: a tile of every operand
/// (`TILE` runs of `TILE` elements) stays in the L1 cache while it is walked.
const TILE: usize = 32;

/// The axis to tile the rows of `row` with, if any: for the first operand strided along
/// the rows (neither 1 nor a broadcast 0), the outer axis at least [`TILE`] long along
/// which it is most contiguous, when that beats its stride along the rows. Walking
/// `TILE` rows of that axis a `TILE`-long piece at a time then reads each of its cache
/// lines once, where whole rows would read a line per element.
fn tile_axis<const K: usize>(
    shape: &[usize],
    strides: [&[isize]; K],
    (inner, len, row_strides): (usize, usize, [isize; K]),
) -> Option<usize> {
    if len < TILE {
        return None;
    }
    let k = (0..K).find(|&k| row_strides[k].unsigned_abs() > 1)?;
    let q = (0..inner)
        .filter(|&d| shape[d] >= TILE && strides[k][d] != 0)
        .min_by_key(|&d| strides[k][d].unsigned_abs())?;
    (strides[k][q].unsigned_abs() < row_strides[k].unsigned_abs()).then_some(q)
}

/// [`walk`] in square tiles of axis `q` and the row's axis: for each index of the other
/// outer axes, [`TILE`] rows along `q`, each cut into `TILE`-long pieces, piece column
/// by piece column. Every element is visited once.
fn walk_tiled<const K: usize>(
    shape: &[usize],
    strides: [&[isize]; K],
    base: [isize; K],
    (inner, len, row_strides): (usize, usize, [isize; K]),
    q: usize,
    mut f: impl FnMut([isize; K], usize, [isize; K]),
) {
    let (nq, sq) = (
        shape[q],
        std::array::from_fn::<isize, K, _>(|k| strides[k][q]),
    );
    let mut plane = |b: [isize; K]| {
        for q0 in (0..nq).step_by(TILE) {
            for i0 in (0..len).step_by(TILE) {
                let n = TILE.min(len - i0);
                for j in q0..nq.min(q0 + TILE) {
                    let at = std::array::from_fn(|k| {
                        b[k] + j as isize * sq[k] + i0 as isize * row_strides[k]
                    });
                    f(at, n, row_strides);
                }
            }
        }
    };
    let others: Dims = (0..inner).filter(|&d| d != q).collect();
    if others.is_empty() {
        return plane(base);
    }
    let dims: Dims = others.iter().map(|&d| shape[d]).collect();
    let st: [Strides; K] = std::array::from_fn(|k| others.iter().map(|&d| strides[k][d]).collect());
    let starts = base.map(|b| b as usize);
    for_each_row(
        &dims,
        std::array::from_fn(|k| &st[k][..]),
        starts,
        |off, rows, s| {
            for r in 0..rows as isize {
                plane(std::array::from_fn(|k| off[k] + r * s[k]));
            }
        },
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_rows_merge_into_one() {
        let l = Layout::contiguous(Shape::from([2, 3, 4]));
        let mut rows = vec![];
        for_each_row(&[2, 3, 4], [&l.strides], [0], |o, n, s| {
            rows.push((o[0], n, s[0]))
        });
        assert_eq!(rows, vec![(0, 24, 1)]);
    }

    #[test]
    fn transposed_rows_walk_columns() {
        // A [2,3] array transposed to [3,2]: strides [1,3].
        let mut rows = vec![];
        for_each_row(&[3, 2], [&[1, 3]], [0], |o, n, s| {
            rows.push((o[0], n, s[0]))
        });
        assert_eq!(rows, vec![(0, 2, 3), (1, 2, 3), (2, 2, 3)]);
    }

    /// Size-1 dimensions never split rows, whatever their strides: `[n,1] + [1]`
    /// (a column plus a broadcast scalar) is one row, and every element is visited
    /// once at the right offsets.
    #[test]
    fn size_one_dimensions_do_not_split_rows() {
        // out [5,1] contiguous, a [5,1] contiguous, b [1] broadcast: strides [0, 1].
        let mut rows = vec![];
        for_each_row(
            &[5, 1],
            [&[1, 1], &[1, 1], &[0, 1]],
            [0, 3, 7],
            |o, n, s| rows.push((o, n, s)),
        );
        assert_eq!(rows, vec![([0, 3, 7], 5, [1, 1, 0])]);
        // All dimensions of size 1: one element.
        let mut rows = vec![];
        for_each_row(&[1, 1, 1], [&[9, 4, 2]], [6], |o, n, _| {
            rows.push((o[0], n))
        });
        assert_eq!(rows, vec![(6, 1)]);
        // A size-1 dimension between two others, against a plain enumeration.
        let (shape, st) = ([3usize, 1, 4], [13isize, 100, -2]);
        let mut seen = vec![];
        for_each_row(&shape, [&st], [50], |o, n, s| {
            seen.extend((0..n as isize).map(|i| o[0] + i * s[0]))
        });
        let mut want = vec![];
        for i in 0..3isize {
            for j in 0..4isize {
                want.push(50 + i * 13 + j * -2);
            }
        }
        assert_eq!(seen, want);
    }

    /// A transposed view is walked along its long dimension, and every element is
    /// still visited once at the offsets a plain enumeration gives.
    #[test]
    fn any_order_rows_run_along_the_long_dimension() {
        // [500,2] viewed from a [2,500] array (strides [1,500]), beside a contiguous
        // output (strides [2,1]) and a broadcast row ([2] -> strides [0,1]).
        let (shape, a, out, b) = ([500usize, 2], [1isize, 500], [2isize, 1], [0isize, 1]);
        let mut rows = 0;
        let mut seen = vec![];
        for_each_row_any_order(&shape, [&out, &a, &b], [0, 7, 3], |o, n, s| {
            rows += 1;
            for i in 0..n as isize {
                seen.push((o[0] + i * s[0], o[1] + i * s[1], o[2] + i * s[2]));
            }
        });
        assert_eq!(rows, 2, "two rows of 500, not 500 rows of 2");
        seen.sort();
        let mut want = vec![];
        for i in 0..500isize {
            for j in 0..2isize {
                want.push((i * 2 + j, 7 + i + j * 500, 3 + j));
            }
        }
        assert_eq!(seen, want);
        // Long rows already: the plain order, merged (a contiguous [4,1000]).
        let mut calls = vec![];
        for_each_row_any_order(&[4, 1000], [&[1000, 1]], [0], |o, n, s| {
            calls.push((o[0], n, s[0]))
        });
        assert_eq!(calls, vec![(0, 4000, 1)]);
    }

    #[test]
    fn zero_dims_and_scalars() {
        let mut count = 0;
        for_each_row(&[2, 0], [&[0, 1]], [0], |_, _, _| count += 1);
        assert_eq!(count, 0);
        for_each_row(&[], [&[]], [5], |o, n, _| {
            assert_eq!((o[0], n), (5, 1));
            count += 1
        });
        assert_eq!(count, 1);
    }

    #[test]
    fn contiguity() {
        assert!(Layout::contiguous(Shape::from([2, 3])).is_contiguous());
        let t = Layout {
            shape: Shape::from([3, 2]),
            strides: SmallVec::from_slice(&[1, 3]),
            offset: 0,
        };
        assert!(!t.is_contiguous());
    }
}
