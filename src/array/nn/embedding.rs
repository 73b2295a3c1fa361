//! `embedding`: rows of a `[V, D]` table at integer ids, and its gradient (the rows
//! added back at their ids).

use super::{float_operands, int_ids};
use crate::array::NDArray;
use crate::array::gather::picked_on_device;
use crate::autograd::{self, Backward, BackwardCtx, Grads};
use crate::backend::cpu;
use crate::backend::cpu::nn::{embedding_grad_kernel, embedding_kernel};
use crate::backend::cpu::{new_filled, new_overwritten};
use crate::dtype::dispatch_float;
use crate::engine::{self, Output};
use crate::error::{NdError, Result, SourceLocation, twins};
use crate::shape::Shape;
use smallvec::smallvec;
use std::panic::Location;

fn embedding_impl(table: NDArray, ids: NDArray, at: SourceLocation) -> Result<NDArray> {
    const OP: &str = "embedding";
    let id = engine::run_op_on(OP, &[table.id, ids.id], at, |o| {
        let (t, i) = (&o[0], &o[1]);
        float_operands(OP, t, &[])?;
        let td = t.shape().dims();
        if td.len() != 2 {
            return Err(NdError::invalid(
                OP,
                format!("the table must be 2-D [V, D], got shape {}", t.shape()),
            ));
        }
        let (v, d) = (td[0], td[1]);
        let rows = int_ids(OP, i, v, "id")?;
        let mut dims = i.shape().0.clone();
        dims.push(d);
        let shape = Shape(dims);
        let total = shape.checked_size().ok_or_else(|| {
            NdError::shape(OP, format!("the result shape {shape} overflows usize"))
        })?;
        if let Some(out) = picked_on_device(OP, t, &shape, |ids, out| {
            let table = cpu::Strided {
                data: ids,
                layout: t.layout,
            };
            embedding_kernel(table, &rows, out)
        })? {
            return Ok(out);
        }
        let buf = dispatch_float!(t.dtype, T => {
            new_overwritten::<T>(total, |out| embedding_kernel::<T>(t.into(), &rows, out))?
        }, else unreachable!("checked above"));
        Ok(Output::New {
            buf,
            shape,
            dtype: t.dtype,
        })
    })?;
    autograd::record(&[table.id, ids.id], id, || EmbeddingRule);
    Ok(NDArray { id })
}

/// `embedding`'s gradient: the output gradient's rows added into a zero `[V, D]` table
/// at their ids (repeated ids accumulate).
struct EmbeddingRule;

impl Backward for EmbeddingRule {
    fn name(&self) -> &'static str {
        "embedding"
    }
    fn saves(&self, _: usize) -> (u8, bool) {
        (0b10, false)
    }
    fn backward(&self, cx: &BackwardCtx<'_>, g: NDArray) -> Result<Grads> {
        if !cx.need(0) {
            return Ok(smallvec![None, None]);
        }
        const OP: &str = "embedding_grad";
        let shape = cx.shapes[0].clone();
        let (v, d) = (shape.dims()[0], shape.dims()[1]);
        let id = engine::run_op_on(OP, &[g.id, cx.input(1).id], Location::caller(), |o| {
            let rows = int_ids(OP, &o[1], v, "id")?;
            #[cfg(feature = "gpu")]
            if let Some(gg) = o[0].gpu() {
                use crate::backend::wgpu::gather::{Csr, sum_into};
                // Row k of g goes to row rows[k], in the CPU's order.
                let dest: Vec<u32> = rows
                    .iter()
                    .flat_map(|&r| (0..d).map(move |c| (r as usize * d + c) as u32))
                    .collect();
                let from = crate::array::gather::row_major_positions(o[0].layout);
                let map = Csr::new(OP, v * d, &dest, &from)?;
                let buf = sum_into(OP, None, gg, &shape, &map)?;
                return Ok(Output::device(buf, shape.clone(), o[0].dtype));
            }
            let buf = dispatch_float!(o[0].dtype, T => {
                let gd = cpu::to_vec::<T>(&o[0]);
                new_filled::<T>(v * d, |out| embedding_grad_kernel(&gd, &rows, d, out))?
            }, else return Err(engine::unsupported(OP, &o[0])));
            Ok(Output::New {
                buf,
                shape: shape.clone(),
                dtype: o[0].dtype,
            })
        })?;
        Ok(smallvec![Some(NDArray { id }), None])
    }
}

impl NDArray {
    twins! {
        /// Rows of this `[V, D]` table (F32/F64) at integer `ids` of any shape: the result
        /// is `ids.shape + [D]`, as PyTorch's `embedding`. Differentiable in the table (the
        /// gradient adds each row's gradient at its id; repeated ids accumulate). Panics on
        /// failure.
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let table = m.create(&[0.0f32, 1.0, 10.0, 11.0, 20.0, 21.0], [3, 2]);
        /// let ids = m.create(&[2i64, 0, 2], [3]);
        /// assert_eq!(table.embedding(ids).to_vec::<f32>()?, vec![20.0, 21.0, 0.0, 1.0, 20.0, 21.0]);
        /// # m.close();
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn embedding,
        /// [`NDArray::embedding`]. Errors: `UnsupportedDType` (a table that is not F32/F64,
        /// float or Bool ids), `InvalidArgument` (a table that is not 2-D), `Index` (an id
        /// that is negative or `>= V`), `InvalidShape`, `Closed`.
        pub fn try_embedding(self, ids: NDArray) -> NDArray {
            embedding_impl(self, ids, Location::caller())
        }
    }
}
