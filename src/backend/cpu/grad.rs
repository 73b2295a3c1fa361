//! Adding a gradient into a parameter's gradient in place: `t += scale * v`, with the
//! scale fused into the one pass, and `v` optionally summed first over the axes that
//! broadcasting added or stretched (what the backward pass's `unbroadcast` would have
//! made an array of), so a parameter's broadcast gradient costs no temporary array.

use super::{Accs, Strided, StridedMut, assign_binary, assign_unary};
use super::{prefers_outer, reduce, reduce_outer, sum_row};
use crate::dtype::Native;
use crate::layout::Layout;
use crate::shape::Shape;
use smallvec::SmallVec;

/// `t += scale * v`; `v` `None` stands for all ones (`t += scale`). `v` broadcasts to
/// `t`'s shape, or, with `sum`, is summed over its broadcast axes down to `t`'s shape
/// first.
pub(crate) fn add_into<T: Native>(
    t: StridedMut<'_, T>,
    v: Option<Strided<'_, T>>,
    scale: f64,
    sum: bool,
) {
    let s = T::from_f64(scale);
    let Some(v) = v else {
        assign_unary::<T>(t, move |p| p.add(s));
        return;
    };
    if sum && v.layout.shape != t.layout.shape {
        let sums = unbroadcast_sums::<T>(v, &t.layout.shape);
        let layout = Layout::contiguous(t.layout.shape.clone());
        return add_scaled(
            t,
            Strided {
                data: &sums,
                layout: &layout,
            },
            scale,
        );
    }
    add_scaled(t, v, scale)
}

fn add_scaled<T: Native>(t: StridedMut<'_, T>, v: Strided<'_, T>, scale: f64) {
    if scale == 1.0 {
        assign_binary::<T>(t, v, |p, q| p.add(q));
    } else {
        let s = T::from_f64(scale);
        assign_binary::<T>(t, v, move |p, q| p.add(q.mul(s)));
    }
}

/// The sums of `b` over the axes that broadcasting added or stretched to reach it from
/// `shape`, row-major: the values of `unbroadcast`'s sum op, computed by the same
/// kernels in the same order (so bit for bit the same).
fn unbroadcast_sums<T: Native>(b: Strided<'_, T>, shape: &Shape) -> Accs<T> {
    let (gd, td) = (b.layout.shape.dims(), shape.dims());
    let lead = gd.len() - td.len();
    let mut axes: SmallVec<[usize; 4]> = (0..lead).collect();
    for (i, &t) in td.iter().enumerate() {
        if t == 1 && gd[lead + i] != 1 {
            axes.push(lead + i);
        }
    }
    if prefers_outer(b.layout, &axes) {
        Accs::from_vec(reduce_outer::<T, T>(b, &axes, T::ZERO, |acc, x| acc.add(x)))
    } else {
        reduce::<T, T>(b, &axes, T::ZERO, |acc, d, s, n, st| {
            acc.add(sum_row(d, s, n, st))
        })
    }
}
