//! Linear algebra: `matmul` (numpy's rules: 1-D promotion, batched with broadcasting of
//! the batch dimensions) and its alias `dot`.
//!
//! Each operand is read in place through its strides (a transposed view is not copied):
//! every batch is one [`cpu::matmul_2d`] call (`gemm` for f32/f64) writing straight
//! into the contiguous result.

use super::NDArray;
use super::ops::{Rhs, binary, same_dtype};
use crate::DType;
use crate::autograd::{
    self, Backward, BackwardCtx, Base, Grads, LazyGrad, LazyGrads, nones, via_arrays,
};
use crate::backend::cpu;
use crate::backend::cpu::new_overwritten;
use crate::dtype::dispatch;
use crate::engine::{self, Operand, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::layout::{Strides, for_each_row};
use crate::opkind::BinOp;
use crate::shape::{Dims, Shape};
use rayon::prelude::*;
use smallvec::SmallVec;
use std::panic::Location;

/// An operand seen as a stack of matrices.
struct MatView<'a> {
    rows: usize,
    cols: usize,
    rs: isize,
    cs: isize,
    batch: &'a [usize],
    batch_strides: &'a [isize],
}

/// View `o` as `[..batch, rows, cols]`; a 1-D operand becomes one row (`as_row`, the
/// left side) or one column (the right side), as numpy promotes it.
fn mat_view<'a>(o: &'a Operand<'_>, as_row: bool) -> MatView<'a> {
    let (d, s) = (o.layout.shape.dims(), &o.layout.strides[..]);
    let nd = d.len();
    if nd == 1 {
        let (k, st) = (d[0], s[0]);
        // The unused stride of the size-1 dimension is set as if the vector were
        // contiguous in the other direction; it is never multiplied by a non-zero index.
        let other = st.wrapping_mul(k.max(1) as isize);
        let (rows, cols, rs, cs) = if as_row {
            (1, k, other, st)
        } else {
            (k, 1, st, other)
        };
        return MatView {
            rows,
            cols,
            rs,
            cs,
            batch: &[],
            batch_strides: &[],
        };
    }
    MatView {
        rows: d[nd - 2],
        cols: d[nd - 1],
        rs: s[nd - 2],
        cs: s[nd - 1],
        batch: &d[..nd - 2],
        batch_strides: &s[..nd - 2],
    }
}

impl MatView<'_> {
    /// The view with rows and columns swapped when `t`.
    fn transposed(self, t: bool) -> Self {
        if !t {
            return self;
        }
        MatView {
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
            ..self
        }
    }
}

/// Strides of batch dims `dims` (with `strides`) broadcast to `target`.
fn batch_strides(dims: &[usize], strides: &[isize], target: &Shape) -> Strides {
    let n = target.ndim();
    let k = dims.len();
    let mut out = Strides::from_elem(0, n);
    for i in 0..k {
        let t = n - k + i;
        out[t] = if dims[i] == 1 && target.dims()[t] != 1 {
            0
        } else {
            strides[i]
        };
    }
    out
}

/// `x^T @ y` (`trans[0]`), `x @ y^T` (`trans[1]`) or both, where `^T` swaps the last
/// two axes (operands of at least 2 dimensions), with [`NDArray::matmul`]'s batch
/// rules, reading the operands in place: one op where `permute` + `matmul` are two.
/// For gradient rules, which run unrecorded: the result is never recorded.
#[track_caller]
pub(crate) fn matmul_t(x: NDArray, y: NDArray, trans: [bool; 2]) -> Result<NDArray> {
    matmul_impl(x, y, "matmul", Location::caller(), trans)
}

fn matmul_impl(
    x: NDArray,
    y: NDArray,
    op: &'static str,
    at: SourceLocation,
    trans: [bool; 2],
) -> Result<NDArray> {
    let id = engine::run_op_on(op, &[x.id, y.id], at, |o| {
        let (a, b) = (&o[0], &o[1]);
        same_dtype(op, a, b)?;
        if a.dtype == DType::Bool {
            return Err(engine::unsupported(op, a));
        }
        for (operand, t) in [(a, trans[0]), (b, trans[1])] {
            if t && operand.shape().ndim() < 2 {
                return Err(NdError::invalid(
                    op,
                    format!(
                        "a transposed operand needs at least two dimensions, got {}",
                        operand.desc()
                    ),
                ));
            }
            if operand.shape().ndim() == 0 {
                return Err(NdError::invalid(
                    op,
                    format!(
                        "operands must have at least one dimension, got a 0-d array ({})",
                        operand.desc()
                    ),
                ));
            }
        }
        let mismatch = || NdError::ShapeMismatch {
            op,
            lhs: a.desc(),
            rhs: b.desc(),
        };
        let (va, vb) = (
            mat_view(a, true).transposed(trans[0]),
            mat_view(b, false).transposed(trans[1]),
        );
        if va.cols != vb.rows {
            return Err(mismatch());
        }
        let (m, k, n) = (va.rows, va.cols, vb.cols);
        // Matrices (no batch dimensions), the common case: one product at the
        // operands' offsets, without the batch bookkeeping below.
        let single = va.batch.is_empty() && vb.batch.is_empty();
        let batch = if single {
            Shape::default()
        } else {
            Shape::broadcast(&Shape::from(va.batch), &Shape::from(vb.batch)).ok_or_else(mismatch)?
        };
        let mut out_dims: Dims = batch.0.clone();
        if a.shape().ndim() > 1 {
            out_dims.push(m);
        }
        if b.shape().ndim() > 1 {
            out_dims.push(n);
        }
        let shape = Shape(out_dims);
        let total = shape.checked_size().ok_or_else(|| {
            NdError::shape(op, format!("the result shape {shape} overflows usize"))
        })?;
        let mn = m * n;
        // Element offsets of each batch's matrices, in row-major batch order.
        let mut offsets = SmallVec::<[(isize, isize); 1]>::with_capacity(batch.size());
        if single {
            offsets.push((a.layout.offset as isize, b.layout.offset as isize));
        } else if mn > 0 {
            let (sa, sb) = (
                batch_strides(va.batch, va.batch_strides, &batch),
                batch_strides(vb.batch, vb.batch_strides, &batch),
            );
            for_each_row(
                batch.dims(),
                [&sa, &sb],
                [a.layout.offset, b.layout.offset],
                |off, len, s| {
                    for i in 0..len as isize {
                        offsets.push((off[0] + i * s[0], off[1] + i * s[1]));
                    }
                },
            );
        }
        #[cfg(feature = "gpu")]
        if let (Some(ga), Some(gb)) = (a.gpu(), b.gpu()) {
            use crate::backend::wgpu::kernels::{MatView, matmul};
            let (ma, mb) = (
                MatView {
                    buf: ga.buf,
                    rs: va.rs,
                    cs: va.cs,
                },
                MatView {
                    buf: gb.buf,
                    rs: vb.rs,
                    cs: vb.cs,
                },
            );
            let buf = matmul(op, ma, mb, (m, n, k), &offsets, a.dtype)?;
            return Ok(Output::device(buf, shape, a.dtype));
        }
        let buf = dispatch!(a.dtype, T => {
            let (da, db) = (a.data::<T>(), b.data::<T>());
            let one = |(oa, ob): (isize, isize), out: &mut [T]| {
                let lhs = cpu::Mat { data: da, off: oa, rs: va.rs, cs: va.cs };
                let rhs = cpu::Mat { data: db, off: ob, rs: vb.rs, cs: vb.cs };
                cpu::matmul_2d(m, n, k, lhs, rhs, out);
            };
            new_overwritten::<T>(total, |out| {
                if mn == 0 {
                    return;
                }
                let per = mn.saturating_mul(k);
                // Many products each too small to split itself (`matmul_2d` splits one of
                // `PARALLEL_FLOPS` or more): the stack is split, a product per task.
                if offsets.len() > 1
                    && cpu::may_fork()
                    && per < cpu::PARALLEL_FLOPS
                    && per.saturating_mul(offsets.len()) >= cpu::PARALLEL_FLOPS
                {
                    cpu::fork(|| {
                        out.par_chunks_mut(mn)
                            .zip(offsets[..].par_iter())
                            .for_each(|(out, &off)| one(off, out))
                    });
                } else {
                    out.chunks_mut(mn)
                        .zip(&offsets)
                        .for_each(|(out, &off)| one(off, out));
                }
            })
        })?;
        Ok(Output::New {
            buf,
            shape,
            dtype: a.dtype,
        })
    })?;
    if trans == [false, false] {
        autograd::record(&[x.id, y.id], id, || MatmulRule);
    }
    Ok(NDArray { id })
}

impl NDArray {
    twins! {
        /// Matrix product with numpy's `matmul` rules: 2-D × 2-D is the matrix product;
        /// a 1-D left operand is a row vector and a 1-D right operand a column vector,
        /// whose added dimension is removed from the result (1-D × 1-D gives a 0-d inner
        /// product); N-D operands are stacks of matrices in the last two dimensions, with
        /// the leading (batch) dimensions broadcast. Transposed and strided views are read
        /// in place. f32/f64 use a tuned `gemm`; integers wrap. Panics on failure.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let a = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
        /// let v = m.create(&[1.0f32, 1.0], [2]);
        /// assert_eq!(a.matmul(v).to_vec::<f32>()?, vec![3.0, 7.0]);
        /// assert_eq!(v.matmul(a).shape().dims(), &[2]);
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn matmul,
        /// [`NDArray::matmul`]. Errors: `ShapeMismatch` (inner dimensions differ or batch
        /// dimensions do not broadcast), `DTypeMismatch`, `UnsupportedDType` (Bool),
        /// `InvalidArgument` (a 0-d operand), `Closed`, `ManagerClosed`/`ManagerCapped`.
        pub fn try_matmul(self, rhs: NDArray) -> NDArray {
            matmul_impl(self, rhs, "matmul", Location::caller(), [false, false])
        }

        /// Dot product, an alias of [`NDArray::matmul`] that also accepts 0-d operands
        /// (then it is the elementwise product, as `numpy.dot`). For 1-D and 2-D operands it
        /// agrees with `numpy.dot`; N-D operands follow `matmul`'s batched rules (not
        /// `numpy.dot`'s tensor product). Panics on failure.
        pub fn dot,
        /// [`NDArray::dot`]. Errors as [`NDArray::try_matmul`].
        pub fn try_dot(self, rhs: NDArray) -> NDArray {
            dot_impl(self, rhs, Location::caller())
        }
    }
}

fn dot_impl(x: NDArray, y: NDArray, at: SourceLocation) -> Result<NDArray> {
    let scalar = engine::shape(x.id)?.ndim() == 0 || engine::shape(y.id)?.ndim() == 0;
    if scalar {
        binary(x, BinOp::Mul, Rhs::Array(y), false, at)
    } else {
        matmul_impl(x, y, "dot", at, [false, false])
    }
}

/// The gradient of numpy `matmul` (1-D operands promoted, batch dimensions summed
/// back): `g @ yᵀ` and `xᵀ @ g`, with a lazy scale kept out of the products.
pub(crate) struct MatmulRule;

impl Backward for MatmulRule {
    fn name(&self) -> &'static str {
        "matmul"
    }

    fn saves(&self, n: usize) -> (u8, bool) {
        (BackwardCtx::all(n), false)
    }

    fn backward_lazy(&self, cx: &BackwardCtx<'_>, g: LazyGrad) -> Result<LazyGrads> {
        let Base::Arr(b) = g.base else {
            return via_arrays(self, cx, g);
        };
        let scale = g.scale;
        // The rule sums batch dimensions itself: the gradients have their inputs' shapes.
        Ok(self
            .backward(cx, b)?
            .into_iter()
            .map(|gi| gi.map(|a| LazyGrad::arr(a).scaled(scale)))
            .collect())
    }

    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        let (x, y) = (cx.input(0), cx.input(1));
        let mut r: Grads = nones(2);
        let (xs, ys) = (&cx.shapes[0], &cx.shapes[1]);
        if xs.ndim() == 1 && ys.ndim() == 1 {
            if cx.need(0) {
                r[0] = Some(g.try_mul(y)?);
            }
            if cx.need(1) {
                r[1] = Some(g.try_mul(x)?);
            }
            return Ok(r);
        }
        if xs.ndim() == 2 && ys.ndim() == 2 {
            // The common case: no promotion and no batch dimensions to sum.
            if cx.need(0) {
                r[0] = Some(matmul_t(g, y, [false, true])?);
            }
            if cx.need(1) {
                r[1] = Some(matmul_t(x, g, [true, false])?);
            }
            return Ok(r);
        }
        // Promote 1-D operands as numpy does, then the usual 2-D rules per batch.
        let x2 = if xs.ndim() == 1 {
            x.try_reshape([1, xs.dims()[0]])?
        } else {
            x
        };
        let y2 = if ys.ndim() == 1 {
            y.try_reshape([ys.dims()[0], 1])?
        } else {
            y
        };
        let g2 = if xs.ndim() == 1 || ys.ndim() == 1 {
            let gs = g.try_shape()?;
            let mut g2dims: Dims = gs.0.clone();
            if xs.ndim() == 1 {
                let n = g2dims.len();
                g2dims.insert(n - 1, 1);
            }
            if ys.ndim() == 1 {
                g2dims.push(1);
            }
            g.try_reshape(Shape(g2dims))?
        } else {
            g
        };
        let promote = |s: &Shape, row: bool| {
            if s.ndim() != 1 {
                s.clone()
            } else if row {
                Shape::from([1, s.dims()[0]])
            } else {
                Shape::from([s.dims()[0], 1])
            }
        };
        let (x2s, y2s) = (promote(xs, true), promote(ys, false));
        if cx.need(0) {
            let gx = unbroadcast_batch(matmul_t(g2, y2, [false, true])?, &x2s, &y2s)?;
            r[0] = Some(if &x2s == xs {
                gx
            } else {
                gx.try_reshape(xs.clone())?
            });
        }
        if cx.need(1) {
            let gy = unbroadcast_batch(matmul_t(x2, g2, [true, false])?, &y2s, &x2s)?;
            r[1] = Some(if &y2s == ys {
                gy
            } else {
                gy.try_reshape(ys.clone())?
            });
        }
        Ok(r)
    }
}

/// `g` (a product's gradient with the batch dimensions of both operands) summed to
/// `shape`, an operand's shape whose batch dimensions are `batch` of `other`'s:
/// nothing to do when the operand's batch dimensions are the broadcast ones.
fn unbroadcast_batch(g: NDArray, shape: &Shape, other: &Shape) -> Result<NDArray> {
    let batch = |s: &Shape| Shape(s.dims()[..s.ndim() - 2].iter().copied().collect());
    let mine = batch(shape);
    if Shape::broadcast(&mine, &batch(other)).as_ref() == Some(&mine) {
        Ok(g)
    } else {
        g.unbroadcast(shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NDManager;
    use crate::engine::Layout;

    /// A strided view of `a` (what `transpose` and slicing will produce).
    fn view(a: NDArray, dims: &[usize], strides: &[isize], offset: usize) -> NDArray {
        let layout = Layout {
            shape: Shape::from(dims),
            strides: Strides::from_slice(strides),
            offset,
        };
        let id = engine::run_op("view", &[a.id], Location::caller(), |_| {
            Ok(Output::View { of: 0, layout })
        })
        .unwrap();
        NDArray { id }
    }

    fn naive(a: &[f64], b: &[f64], m: usize, k: usize, n: usize) -> Vec<f64> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        out
    }

    #[test]
    fn transposed_views_are_read_in_place() {
        let m = NDManager::new();
        // a = [[1,2,3],[4,5,6]]; a^T is [3,2] with strides [1,3].
        let a = m.create(&[1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
        let at = view(a, &[3, 2], &[1, 3], 0);
        let before = m.memory().live_buffers;
        let p = a.matmul(at); // a a^T = [[14, 32], [32, 77]]
        assert_eq!(p.to_vec::<f64>().unwrap(), vec![14.0, 32.0, 32.0, 77.0]);
        let q = at.matmul(a); // a^T a, 3x3
        let expect = naive(
            &[1.0, 4.0, 2.0, 5.0, 3.0, 6.0],
            &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0],
            3,
            2,
            3,
        );
        assert_eq!(q.to_vec::<f64>().unwrap(), expect);
        // Only the two results were allocated: no copies of the view.
        assert_eq!(m.memory().live_buffers, before + 2);
        // Integers through the naive loop, on the same transposed view.
        let ai = m.create(&[1i32, 2, 3, 4, 5, 6], [2, 3]);
        let ait = view(ai, &[3, 2], &[1, 3], 0);
        assert_eq!(
            ai.matmul(ait).to_vec::<i32>().unwrap(),
            vec![14, 32, 32, 77]
        );
        m.close();
    }

    #[test]
    fn offset_and_negative_strides() {
        let m = NDManager::new();
        let data: Vec<f32> = (0..12).map(|i| i as f32).collect();
        let base = m.create(&data, [12]);
        // Rows 1..3 of a [4,3] matrix, reversed columns: [[5,4,3],[8,7,6]].
        let a = view(base, &[2, 3], &[3, -1], 5);
        let b = m.create(&[1.0f32, 0.0, 0.0, 1.0, 1.0, 1.0], [3, 2]);
        // [[5,4,3],[8,7,6]] @ [[1,0],[0,1],[1,1]] = [[8,7],[14,13]]
        assert_eq!(
            a.matmul(b).to_vec::<f32>().unwrap(),
            vec![8.0, 7.0, 14.0, 13.0]
        );
        m.close();
    }
}
