//! What the gradient rules beside the ops share: summing a gradient back to its
//! input's shape over broadcast axes ([`NDArray::unbroadcast`]), and a masked
//! gradient. Each op's rule is its [`crate::autograd::Backward`] impl, next to the op.

use crate::error::Result;
use crate::shape::Dims;
use crate::{NDArray, Shape};
use smallvec::SmallVec;

impl NDArray {
    /// `self` summed over the axes that broadcasting added or stretched so it has
    /// `shape` (a gradient brought back to its input's shape).
    pub(crate) fn unbroadcast(self, shape: &Shape) -> Result<NDArray> {
        unbroadcast(self, shape)
    }
}

/// Sum `g` over the axes that broadcasting added or stretched so it has `shape`.
pub(crate) fn unbroadcast(g: NDArray, shape: &Shape) -> Result<NDArray> {
    let gs = g.try_shape()?;
    if &gs == shape {
        return Ok(g);
    }
    let (gd, td) = (gs.dims(), shape.dims());
    let lead = gd.len() - td.len();
    let mut axes: SmallVec<[isize; 4]> = (0..lead as isize).collect();
    for (i, &t) in td.iter().enumerate() {
        if t == 1 && gd[lead + i] != 1 {
            axes.push((lead + i) as isize);
        }
    }
    if axes.is_empty() {
        return g.try_reshape(shape.clone());
    }
    if axes.len() == lead {
        // Only added axes: summing them away leaves `shape` (one op).
        return g.try_sum_axes(&axes, false);
    }
    // Stretched axes too: keep every summed axis as 1, then drop the added ones.
    let s = g.try_sum_axes(&axes, true)?;
    if lead == 0 {
        Ok(s)
    } else {
        s.try_reshape(shape.clone())
    }
}

/// A 0-d zero of `g`'s dtype (for `where_`), beside `g`.
pub(crate) fn zero_like(g: NDArray) -> Result<NDArray> {
    full_beside(g, Shape(Dims::new()), 0.0)
}

/// An array of `shape` holding `v` in `like`'s dtype, beside `like`: in its manager
/// and on its device. A rule's constants are made this way, not by `like`'s manager,
/// whose device may differ (an array copied or moved to a GPU keeps its manager).
pub(crate) fn full_beside(like: NDArray, shape: Shape, v: f64) -> Result<NDArray> {
    let at = std::panic::Location::caller();
    let id = crate::engine::full_beside(like.id, shape, v, like.try_dtype()?, at)?;
    Ok(NDArray { id })
}

/// Masked gradient: `g` where `mask`, else 0.
pub(crate) fn masked(mask: NDArray, g: NDArray) -> Result<NDArray> {
    mask.try_where_(g, zero_like(g)?)
}
