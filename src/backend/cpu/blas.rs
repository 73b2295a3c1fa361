//! Large f32/f64 matrix products through the system OpenBLAS (feature `openblas`).
//!
//! `gemm` (pure Rust, the default) matches OpenBLAS where it can use AVX-512, but its
//! AVX2 kernels reach about two thirds of OpenBLAS's single-core rate on an AVX2-only
//! CPU (BENCHMARKS.md). With the feature on, [`super::matmul::matmul_2d`] hands the
//! products that are large enough to be worth it to `cblas_sgemm` / `cblas_dgemm`,
//! when both operands have unit stride along one axis (what CBLAS can describe) and
//! the calling thread may use every core ([`super::fork::may_fork`]: no shard lock
//! held, not a rayon worker). Everything else stays on `gemm`. OpenBLAS runs its own
//! threads, which never run ndscope code, so calling it cannot re-enter the engine.
//!
//! Linking needs the library (`libopenblas-dev` on Debian and Ubuntu); OpenBLAS with
//! 32-bit integers (the usual build) is assumed, so dimensions past `i32::MAX` stay on
//! `gemm`.

use super::strided::Mat;
use crate::dtype::Native;
use std::any::TypeId;

#[cfg(test)]
thread_local! {
    /// Products this thread computed here (tests check that the engine takes this path).
    static CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

const ROW_MAJOR: i32 = 101;
const NO_TRANS: i32 = 111;
const TRANS: i32 = 112;

#[link(name = "openblas")]
unsafe extern "C" {
    fn cblas_sgemm(
        order: i32,
        trans_a: i32,
        trans_b: i32,
        m: i32,
        n: i32,
        k: i32,
        alpha: f32,
        a: *const f32,
        lda: i32,
        b: *const f32,
        ldb: i32,
        beta: f32,
        c: *mut f32,
        ldc: i32,
    );
    fn cblas_dgemm(
        order: i32,
        trans_a: i32,
        trans_b: i32,
        m: i32,
        n: i32,
        k: i32,
        alpha: f64,
        a: *const f64,
        lda: i32,
        b: *const f64,
        ldb: i32,
        beta: f64,
        c: *mut f64,
        ldc: i32,
    );
}

/// How CBLAS reads a `rows x cols` matrix with these strides (row-major): as it is
/// (unit column stride) or transposed (unit row stride), with its leading dimension.
fn describe(x: &Mat<'_, impl Native>, rows: usize, cols: usize) -> Option<(i32, i32)> {
    let ld = |s: isize, min: usize| {
        let s = usize::try_from(s).ok()?;
        (s >= min.max(1)).then(|| i32::try_from(s).ok()).flatten()
    };
    if (x.cs == 1 || cols == 1)
        && let Some(ld) = ld(x.rs, cols)
    {
        return Some((NO_TRANS, ld));
    }
    if (x.rs == 1 || rows == 1)
        && let Some(ld) = ld(x.cs, rows)
    {
        return Some((TRANS, ld));
    }
    None
}

/// `out[m, n] = a[m, k] @ b[k, n]` (contiguous `out`) through OpenBLAS; `false` (and
/// nothing written) when this product is not one for OpenBLAS (see the module docs).
/// The caller has checked that every element of `a` and `b` is inside its slice.
pub(crate) fn matmul<T: Native>(
    m: usize,
    n: usize,
    k: usize,
    a: &Mat<'_, T>,
    b: &Mat<'_, T>,
    out: &mut [T],
) -> bool {
    let t = TypeId::of::<T>();
    let (f32_, f64_) = (t == TypeId::of::<f32>(), t == TypeId::of::<f64>());
    let dims = (i32::try_from(m), i32::try_from(n), i32::try_from(k));
    let (Ok(mi), Ok(ni), Ok(ki)) = dims else {
        return false;
    };
    let (Some((ta, lda)), Some((tb, ldb))) = (describe(a, m, k), describe(b, k, n)) else {
        return false;
    };
    if !(f32_ || f64_) || out.len() < m * n {
        return false;
    }
    // SAFETY: `a` and `b` lie inside their slices (checked by the caller, for any
    // strides), and `describe` only accepts a layout CBLAS indexes exactly as the
    // strides do (unit stride on one axis, leading dimension the other stride, at
    // least the row length CBLAS requires); `out` holds `m * n` elements written
    // row-major with leading dimension `n`. `T` is f32 or f64 as checked above, so
    // the pointer casts keep the element type. beta = 0: `out` is not read.
    unsafe {
        let (pa, pb) = (a.data.as_ptr().offset(a.off), b.data.as_ptr().offset(b.off));
        let pc = out.as_mut_ptr();
        // The two calls differ only in the function (and the element type it infers).
        macro_rules! call {
            ($gemm:ident) => {
                $gemm(
                    ROW_MAJOR,
                    ta,
                    tb,
                    mi,
                    ni,
                    ki,
                    1.0,
                    pa.cast(),
                    lda,
                    pb.cast(),
                    ldb,
                    0.0,
                    pc.cast(),
                    ni,
                )
            };
        }
        if f32_ {
            call!(cblas_sgemm);
        } else {
            call!(cblas_dgemm);
        }
    }
    #[cfg(test)]
    CALLS.with(|c| c.set(c.get() + 1));
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `a @ b` by the definition, in f64.
    fn reference<T: Native + Into<f64>>(
        m: usize,
        n: usize,
        k: usize,
        a: &Mat<'_, T>,
        b: &Mat<'_, T>,
    ) -> Vec<f64> {
        let at = |x: &Mat<'_, T>, i: usize, j: usize| {
            x.data[(x.off + i as isize * x.rs + j as isize * x.cs) as usize].into()
        };
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| at(a, i, p) * at(b, p, j)).sum();
            }
        }
        out
    }

    fn data<T: Native>(len: usize, seed: usize) -> Vec<T> {
        (0..len)
            .map(|i| T::from_f64(((i * 7 + seed * 3) % 17) as f64 / 8.0 - 1.0))
            .collect()
    }

    /// Every layout CBLAS can describe gives the definition's values: plain, either
    /// operand transposed, a leading dimension wider than the row, an offset.
    #[test]
    fn every_describable_layout_matches_the_definition() {
        let (m, n, k) = (37, 29, 45);
        // Each operand stored in a buffer with room for padding and an offset of 3.
        let a_rows = data::<f32>(3 + m * (k + 5), 1); // row-major, ld = k + 5
        let a_cols = data::<f32>(3 + k * m, 2); // column-major: rs = 1, cs = m
        let b_rows = data::<f32>(3 + k * n, 3);
        let b_cols = data::<f32>(3 + n * (k + 2), 4); // rs = 1, cs = k + 2
        let a_layouts = [
            Mat {
                data: &a_rows,
                off: 3,
                rs: (k + 5) as isize,
                cs: 1,
            },
            Mat {
                data: &a_cols,
                off: 3,
                rs: 1,
                cs: m as isize,
            },
        ];
        let b_layouts = [
            Mat {
                data: &b_rows,
                off: 3,
                rs: n as isize,
                cs: 1,
            },
            Mat {
                data: &b_cols,
                off: 3,
                rs: 1,
                cs: (k + 2) as isize,
            },
        ];
        for a in &a_layouts {
            for b in &b_layouts {
                let mut out = vec![f32::NAN; m * n];
                assert!(matmul(m, n, k, a, b, &mut out), "describable");
                let want = reference(m, n, k, a, b);
                for (got, want) in out.iter().zip(&want) {
                    assert!((*got as f64 - want).abs() < 1e-4, "{got} vs {want}");
                }
            }
        }
        // f64 too.
        let a64 = data::<f64>(m * k, 5);
        let b64 = data::<f64>(k * n, 6);
        let (a, b) = (
            Mat {
                data: &a64,
                off: 0,
                rs: k as isize,
                cs: 1,
            },
            Mat {
                data: &b64,
                off: 0,
                rs: 1,
                cs: k as isize,
            },
        );
        let mut out = vec![f64::NAN; m * n];
        assert!(matmul(m, n, k, &a, &b, &mut out));
        for (got, want) in out.iter().zip(reference(m, n, k, &a, &b)) {
            assert!((got - want).abs() < 1e-12);
        }
    }

    /// Layouts CBLAS cannot express are left to gemm, with nothing written: a
    /// broadcast (zero) stride, a negative stride, no unit stride, and other dtypes.
    #[test]
    fn undescribable_layouts_are_declined() {
        let (m, n, k) = (4, 3, 5);
        let buf = data::<f32>(200, 7);
        let b = Mat {
            data: &buf,
            off: 0,
            rs: n as isize,
            cs: 1,
        };
        let declined = [
            Mat {
                data: &buf,
                off: 0,
                rs: 0,
                cs: 1,
            }, // rows broadcast
            Mat {
                data: &buf,
                off: 100,
                rs: -(k as isize),
                cs: 1,
            }, // rows reversed
            Mat {
                data: &buf,
                off: 0,
                rs: 2 * k as isize,
                cs: 2,
            }, // every other column
        ];
        for a in &declined {
            let mut out = vec![7.0f32; m * n];
            assert!(!matmul(m, n, k, a, &b, &mut out));
            assert!(out.iter().all(|&x| x == 7.0), "nothing written");
        }
        let ints = vec![1i32; 64];
        let (ai, bi) = (
            Mat {
                data: &ints,
                off: 0,
                rs: 4,
                cs: 1,
            },
            Mat {
                data: &ints,
                off: 0,
                rs: 4,
                cs: 1,
            },
        );
        let mut out = vec![0i32; 16];
        assert!(!matmul(4, 4, 4, &ai, &bi, &mut out));
    }

    /// The engine's matmul takes this path for a large product on an ordinary thread
    /// and gives the definition's values (through the public API).
    #[test]
    fn large_products_through_the_api_match_the_definition() {
        use crate::{DType, NDManager};
        let mgr = NDManager::new();
        let (m, n, k) = (160, 150, 140); // 3.4 M multiply-adds: past the threshold
        let av: Vec<f32> = data(m * k, 8);
        let bv: Vec<f32> = data(n * k, 9);
        let a = mgr.create(av.as_slice(), [m, k]);
        let b = mgr.create(bv.as_slice(), [n, k]).transpose(); // a transposed view
        assert_eq!(b.dtype(), DType::F32);
        let before = CALLS.with(std::cell::Cell::get);
        let got = a.matmul(b).to_vec::<f32>().unwrap();
        assert!(
            CALLS.with(std::cell::Cell::get) > before,
            "went to OpenBLAS"
        );
        let (ma, mb) = (
            Mat {
                data: &av,
                off: 0,
                rs: k as isize,
                cs: 1,
            },
            Mat {
                data: &bv,
                off: 0,
                rs: 1,
                cs: k as isize,
            },
        );
        for (g, w) in got.iter().zip(reference(m, n, k, &ma, &mb)) {
            assert!((*g as f64 - w).abs() < 1e-3, "{g} vs {w}");
        }
        mgr.close();
    }

    /// Two ordinary threads multiplying at once both go to OpenBLAS (its own threads
    /// serve both calls) and both get the definition's values.
    #[test]
    fn concurrent_products_from_two_threads_are_exact() {
        use crate::NDManager;
        let (m, n, k) = (150, 140, 130);
        let av: Vec<f32> = data(m * k, 10);
        let bv: Vec<f32> = data(k * n, 11);
        let want = reference(
            m,
            n,
            k,
            &Mat {
                data: &av,
                off: 0,
                rs: k as isize,
                cs: 1,
            },
            &Mat {
                data: &bv,
                off: 0,
                rs: n as isize,
                cs: 1,
            },
        );
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let mgr = NDManager::new();
                    let a = mgr.create(av.as_slice(), [m, k]);
                    let b = mgr.create(bv.as_slice(), [k, n]);
                    for _ in 0..20 {
                        let before = CALLS.with(std::cell::Cell::get);
                        let got = a.matmul(b).to_vec::<f32>().unwrap();
                        assert_eq!(CALLS.with(std::cell::Cell::get), before + 1);
                        for (g, w) in got.iter().zip(&want) {
                            assert!((*g as f64 - w).abs() < 1e-3, "{g} vs {w}");
                        }
                    }
                    mgr.close();
                });
            }
        });
    }
}
