//! The fused in-place update kernels of the optimizers.
//!
//! Each update writes one array (a parameter or a state buffer) from itself and two
//! inputs of the same shape, element by element, in one pass: `t = f(t, a, b)`. No
//! temporary array is made, and nothing is allocated: the op goes straight through
//! the in-place op path ([`ext::update_in_place`]), like `addi`.

use crate::NDArray;
use crate::autograd;
use crate::dtype::{Float, dispatch_float};
use crate::error::{NdError, Result};
use crate::ext;
use crate::layout::{Layout, for_each_row};

/// One elementwise update rule `t = apply(t, a, b)`, instantiated per float type, and
/// the same rule in WGSL for a target on a GPU.
pub(crate) trait Update {
    /// The new value of the target element `t` given the inputs' elements `a`, `b`.
    fn apply<T: Float>(&self, t: T, a: T, b: T) -> T;

    /// [`Update::apply`] as a WGSL expression over `t`, `x` (for `a`) and `y` (for
    /// `b`), written into `out` (empty), its constants named by [`Scalars::push`], in
    /// the same order of operations (so the device rounds as the host does, up to fused
    /// multiply-adds). `out` and `s` are reused from step to step, so writing the
    /// expression allocates nothing once they have grown.
    #[cfg(feature = "gpu")]
    fn wgsl(&self, s: &mut Scalars, out: &mut String);
}

/// The constants of a WGSL update rule, in the order the kernel binds them.
#[cfg(feature = "gpu")]
#[derive(Default)]
pub(crate) struct Scalars(pub(crate) smallvec::SmallVec<[f64; 8]>);

#[cfg(feature = "gpu")]
impl Scalars {
    /// Bind `v` and return its name in the kernel (`s`, then `s1`, `s2`, ...).
    pub(crate) fn push(&mut self, v: f64) -> &'static str {
        const NAMES: [&str; 8] = ["s", "s1", "s2", "s3", "s4", "s5", "s6", "s7"];
        self.0.push(v);
        NAMES[self.0.len() - 1]
    }
}

#[cfg(feature = "gpu")]
thread_local! {
    /// The expression and scalars of the last device update on this thread, reused.
    static WGSL: std::cell::RefCell<(String, Scalars)> = Default::default();
}

/// `t[i] = f(t[i], a[i], b[i])` over three arrays of one shape, each read through its
/// layout (`lt` for `t`, and so on).
pub(crate) fn zip3_inplace<T: Copy>(
    t: &mut [T],
    lt: &Layout,
    a: &[T],
    la: &Layout,
    b: &[T],
    lb: &Layout,
    mut f: impl FnMut(T, T, T) -> T,
) {
    debug_assert!(lt.shape == la.shape && lt.shape == lb.shape);
    if lt.is_contiguous() && la.is_contiguous() && lb.is_contiguous() {
        let n = lt.size();
        let t = &mut t[lt.offset..lt.offset + n];
        let a = &a[la.offset..la.offset + n];
        let b = &b[lb.offset..lb.offset + n];
        for ((x, &y), &z) in t.iter_mut().zip(a).zip(b) {
            *x = f(*x, y, z);
        }
        return;
    }
    for_each_row(
        lt.shape.dims(),
        [&lt.strides, &la.strides, &lb.strides],
        [lt.offset, la.offset, lb.offset],
        |off, len, s| {
            for i in 0..len as isize {
                let ti = (off[0] + i * s[0]) as usize;
                t[ti] = f(
                    t[ti],
                    a[(off[1] + i * s[1]) as usize],
                    b[(off[2] + i * s[2]) as usize],
                );
            }
        },
    );
}

/// Run `rule` in place on `target` with inputs `a` and `b` (same shape and float
/// dtype as `target`). Errors: `Closed`, `DTypeMismatch`, `ShapeMismatch`,
/// `UnsupportedDType`, and `InvalidArgument` while a gradient tape depends on `target`;
/// `target` is unchanged on an error.
pub(crate) fn update(
    op: &'static str,
    target: NDArray,
    a: NDArray,
    b: NDArray,
    rule: &impl Update,
) -> Result<()> {
    autograd::check_inplace(op, target.id)?;
    ext::update_in_place_on(op, target, [a, b], |mut t, o| {
        for x in o {
            if x.dtype() != t.dtype() {
                return Err(NdError::DTypeMismatch {
                    op,
                    lhs: t.desc(),
                    rhs: x.desc(),
                });
            }
            if x.shape() != &t.layout().shape {
                return Err(NdError::ShapeMismatch {
                    op,
                    lhs: t.desc(),
                    rhs: x.desc(),
                });
            }
        }
        let [a, b] = o;
        #[cfg(feature = "gpu")]
        if t.dtype().is_float() {
            let on_device = WGSL.with_borrow_mut(|(expr, s)| {
                t.update_on_device(op, &[a, b], || {
                    expr.clear();
                    s.0.clear();
                    rule.wgsl(s, expr);
                    (expr.as_str(), &s.0[..])
                })
            });
            if let Some(r) = on_device {
                return r;
            }
        }
        dispatch_float!(t.dtype(), T => {
            let (a, b) = (a.view::<T>(), b.view::<T>());
            let t = t.view_mut::<T>();
            zip3_inplace::<T>(
                t.data,
                t.layout,
                a.data,
                a.layout,
                b.data,
                b.layout,
                |x, y, z| rule.apply(x, y, z),
            );
            Ok(())
        }, else Err(NdError::UnsupportedDType {
            op,
            dtype: t.dtype(),
            array: t.desc(),
        }))
    })
}

/// Sum of the squares of `a`'s elements, in f64 (read in place, nothing allocated).
pub(crate) fn sum_of_squares(op: &'static str, a: NDArray) -> Result<f64> {
    ext::read(a, |o| {
        dispatch_float!(o.dtype(), T => {
            let v = o.view::<T>();
            let (d, l) = (v.data, v.layout);
            let mut acc = 0.0f64;
            for_each_row(l.shape.dims(), [&l.strides], [l.offset], |off, len, s| {
                for i in 0..len as isize {
                    let v = crate::dtype::Native::to_f64(d[(off[0] + i * s[0]) as usize]);
                    acc += v * v;
                }
            });
            Ok(acc)
        }, else Err(NdError::UnsupportedDType {
            op,
            dtype: o.dtype(),
            array: o.desc(),
        }))
    })?
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Shape;
    use smallvec::SmallVec;

    #[test]
    fn contiguous_and_strided_walks_agree() {
        // t = t + 10 a + 100 b over a [2, 3] target; `b` read transposed from [3, 2].
        let lt = Layout::contiguous(Shape::from([2, 3]));
        let mut t = vec![1.0f64, 2.0, 3.0, 4.0, 5.0, 6.0];
        let a = vec![0.0f64, 1.0, 2.0, 3.0, 4.0, 5.0];
        let bt = vec![0.0f64, 3.0, 1.0, 4.0, 2.0, 5.0]; // [3, 2], its transpose is `a`
        let lb = Layout {
            shape: Shape::from([2, 3]),
            strides: SmallVec::from_slice(&[1, 2]),
            offset: 0,
        };
        zip3_inplace(&mut t, &lt, &a, &lt, &bt, &lb, |x, y, z| {
            x + 10.0 * y + 100.0 * z
        });
        assert_eq!(t, vec![1.0, 112.0, 223.0, 334.0, 445.0, 556.0]);
        // An offset target, contiguous: only its window changes.
        let mut t = vec![9.0f64, 1.0, 1.0, 9.0];
        let lt = Layout {
            shape: Shape::from([2]),
            strides: SmallVec::from_slice(&[1]),
            offset: 1,
        };
        let one = Layout::contiguous(Shape::from([2]));
        zip3_inplace(
            &mut t,
            &lt,
            &[2.0, 3.0],
            &one,
            &[0.0, 0.0],
            &one,
            |x, y, _| x * y,
        );
        assert_eq!(t, vec![9.0, 2.0, 3.0, 9.0]);
    }
}
