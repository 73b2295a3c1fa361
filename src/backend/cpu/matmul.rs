//! Matrix products: `gemm` for real work, a plain loop for tiny products, OpenBLAS
//! under the `openblas` feature (see `super::blas`).

use super::fork::{PARALLEL_FLOPS, fork, fork_threads, may_fork};
use super::strided::Mat;
use crate::dtype::Native;

/// Products of at most this many multiply-adds skip gemm (see [`matmul_2d`]).
const TINY_MATMUL_FLOPS: usize = 256;

/// `out[m, n] = a[m, k] @ b[k, n]` into a contiguous `out` (row stride `n`).
pub(crate) fn matmul_2d<T: Native>(
    m: usize,
    n: usize,
    k: usize,
    a: Mat<'_, T>,
    b: Mat<'_, T>,
    out: &mut [T],
) {
    debug_assert!(out.len() >= m * n);
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        out[..m * n].iter_mut().for_each(|o| *o = T::ZERO);
        return;
    }
    // Matrix-vector products with a tiny inner dimension over contiguous rows (e.g.
    // [1000,2] x [2,1]): a fixed-width loop the compiler vectorises beats gemm's setup.
    if n == 1 && k <= 4 && a.cs == 1 && a.rs == k as isize && a.off >= 0 {
        let rows = &a.data[a.off as usize..a.off as usize + m * k];
        let col = |p: usize| b.data[(b.off + p as isize * b.rs) as usize];
        let out = &mut out[..m];
        match k {
            1 => return matvec_small::<T, 1>(rows, [col(0)], out),
            2 => return matvec_small::<T, 2>(rows, [col(0), col(1)], out),
            3 => return matvec_small::<T, 3>(rows, [col(0), col(1), col(2)], out),
            _ => return matvec_small::<T, 4>(rows, [col(0), col(1), col(2), col(3)], out),
        }
    }
    let gemm_type = std::any::TypeId::of::<T>();
    let is_float =
        gemm_type == std::any::TypeId::of::<f32>() || gemm_type == std::any::TypeId::of::<f64>();
    // gemm's setup (dispatch, packing decisions) costs about 3,000 instructions: tiny
    // products (a [2,64] x [64,1] gradient takes 128 multiply-adds) are cheaper as
    // the plain loop below.
    if is_float && m * n * k > TINY_MATMUL_FLOPS {
        // Check that every element gemm will touch is inside the slices: the lowest and
        // highest indices of a strided matrix are at corners (either stride may be
        // negative, so take each dimension's extreme separately).
        let in_bounds = |x: &Mat<'_, T>, rows: usize, cols: usize| {
            let (r, c) = ((rows as isize - 1) * x.rs, (cols as isize - 1) * x.cs);
            let lo = x.off + r.min(0) + c.min(0);
            let hi = x.off + r.max(0) + c.max(0);
            lo >= 0 && hi < x.data.len() as isize
        };
        assert!(in_bounds(&a, m, k));
        assert!(in_bounds(&b, k, n));
        let flops = m * n * k;
        #[cfg(feature = "openblas")]
        if flops >= PARALLEL_FLOPS && may_fork() && super::blas::matmul(m, n, k, &a, &b, out) {
            return;
        }
        let mut call = |par| {
            // SAFETY: the asserts above keep every lhs/rhs element gemm reads inside
            // `a.data` and `b.data` (index maps are affine, so every visited index lies
            // between the lowest and highest corner, both checked in range), and `out`
            // holds m*n contiguous elements written with row stride n, column stride 1.
            // T is f32 or f64 (checked by TypeId), which gemm supports. `read_dst` is
            // false, so the destination's old contents are not read.
            unsafe {
                gemm::gemm(
                    m,
                    n,
                    k,
                    out.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.data.as_ptr().offset(a.off),
                    a.cs,
                    a.rs,
                    b.data.as_ptr().offset(b.off),
                    b.cs,
                    b.rs,
                    T::ZERO,
                    T::ONE,
                    false,
                    false,
                    false,
                    par,
                );
            }
        };
        if flops >= PARALLEL_FLOPS && may_fork() {
            // gemm splits its work on the pool it is called in: the kernel pool.
            fork(|| call(gemm::Parallelism::Rayon(fork_threads())));
        } else {
            call(gemm::Parallelism::None);
        }
        return;
    }
    for i in 0..m {
        for j in 0..n {
            let mut acc = T::ZERO;
            for p in 0..k {
                let x = a.data[(a.off + i as isize * a.rs + p as isize * a.cs) as usize];
                let y = b.data[(b.off + p as isize * b.rs + j as isize * b.cs) as usize];
                acc = acc.add(x.mul(y));
            }
            out[i * n + j] = acc;
        }
    }
}

/// `out[i] = rows[i] . col` for rows of constant width `K`.
fn matvec_small<T: Native, const K: usize>(rows: &[T], col: [T; K], out: &mut [T]) {
    for (o, r) in out.iter_mut().zip(rows.chunks_exact(K)) {
        let mut acc = r[0].mul(col[0]);
        for p in 1..K {
            acc = acc.add(r[p].mul(col[p]));
        }
        *o = acc;
    }
}
