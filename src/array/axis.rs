//! The axis helper shared by the op families: a possibly negative axis checked
//! against an operand's rank. It sits below the ops so none of them imports another
//! for it.

use crate::engine::Operand;
use crate::error::{NdError, Result};

/// Normalise a possibly negative axis into `0..ndim`, or `AxisOutOfRange`.
pub(crate) fn normalize_axis(
    op: &'static str,
    axis: isize,
    ndim: usize,
    o: &Operand<'_>,
) -> Result<usize> {
    let n = ndim as isize;
    let a = if axis < 0 { axis + n } else { axis };
    if a < 0 || a >= n {
        return Err(NdError::AxisOutOfRange {
            op,
            axis,
            array: o.desc(),
        });
    }
    Ok(a as usize)
}
