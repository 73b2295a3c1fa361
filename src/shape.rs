//! [`Shape`]: the dimensions of an array, and the broadcasting rule.

use smallvec::SmallVec;
use std::fmt;

/// Dimension list; four dimensions are stored inline without a heap allocation.
pub(crate) type Dims = SmallVec<[usize; 4]>;

/// The dimensions of an array. `()` (or an empty slice) is the shape of a scalar.
///
/// ```
/// use ndscope::Shape;
/// assert_eq!(Shape::from([2, 3]).size(), 6);
/// assert_eq!(Shape::from(()).ndim(), 0);
/// assert_eq!(Shape::from(vec![4]).to_string(), "[4]");
/// ```
#[derive(Eq, Default)]
pub struct Shape(pub(crate) Dims);

impl PartialEq for Shape {
    #[inline]
    fn eq(&self, other: &Self) -> bool {
        // An element loop: shapes are short, and the slice comparison calls `memcmp`.
        let (a, b) = (self.dims(), other.dims());
        a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
    }
}

impl std::hash::Hash for Shape {
    fn hash<H: std::hash::Hasher>(&self, h: &mut H) {
        self.dims().hash(h);
    }
}

impl Clone for Shape {
    #[inline]
    fn clone(&self) -> Self {
        // `from_slice` copies `Copy` items with one memcpy; the derived clone extends
        // element by element.
        Shape(Dims::from_slice(&self.0))
    }
}

impl Shape {
    /// The dimensions.
    #[inline]
    pub fn dims(&self) -> &[usize] {
        &self.0
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.0.len()
    }

    /// Number of elements (1 for a scalar). Saturates instead of overflowing; use
    /// [`Shape::checked_size`] to detect overflow.
    pub fn size(&self) -> usize {
        self.checked_size().unwrap_or(usize::MAX)
    }

    /// Number of elements, or `None` when the product overflows `usize`.
    pub fn checked_size(&self) -> Option<usize> {
        self.0.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
    }

    /// Row-major (C-order) strides in elements.
    pub(crate) fn contiguous_strides(&self) -> SmallVec<[isize; 4]> {
        let n = self.0.len();
        let mut strides: SmallVec<[isize; 4]> = if n <= 4 {
            SmallVec::from_slice(&[0isize; 4][..n])
        } else {
            SmallVec::from_elem(0, n)
        };
        let mut acc = 1isize;
        for (s, &d) in strides.iter_mut().zip(self.0.iter()).rev() {
            *s = acc;
            acc = acc.wrapping_mul(d.max(1) as isize);
        }
        strides
    }

    /// The numpy broadcast of two shapes, or `None` when they are incompatible.
    #[inline]
    pub(crate) fn broadcast(a: &Shape, b: &Shape) -> Option<Shape> {
        if a == b {
            return Some(a.clone()); // the common case, inlined
        }
        Shape::broadcast_unequal(a, b)
    }

    /// [`Shape::broadcast`] of two different shapes.
    #[inline(never)]
    fn broadcast_unequal(a: &Shape, b: &Shape) -> Option<Shape> {
        let n = a.ndim().max(b.ndim());
        let mut out = Dims::from_elem(0, n);
        for i in 0..n {
            let da = if i < n - a.ndim() {
                1
            } else {
                a.0[i - (n - a.ndim())]
            };
            let db = if i < n - b.ndim() {
                1
            } else {
                b.0[i - (n - b.ndim())]
            };
            out[i] = match (da, db) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => return None,
            };
        }
        Some(Shape(out))
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(Dims::from_slice(&d))
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(Dims::from_slice(d))
    }
}

impl<const N: usize> From<&[usize; N]> for Shape {
    fn from(d: &[usize; N]) -> Self {
        Shape(Dims::from_slice(d))
    }
}

impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(Dims::from_vec(d))
    }
}

impl From<&Vec<usize>> for Shape {
    fn from(d: &Vec<usize>) -> Self {
        Shape(Dims::from_slice(d))
    }
}

impl From<()> for Shape {
    fn from(_: ()) -> Self {
        Shape(Dims::new())
    }
}

impl From<&Shape> for Shape {
    fn from(s: &Shape) -> Self {
        s.clone()
    }
}

/// The shape with the reduced `axes` (all when `None`; negative count from the end)
/// kept as size 1, and the number of elements each output element reduces.
pub(crate) fn keep_dims_shape(
    shape: &Shape,
    axes: &Option<SmallVec<[isize; 4]>>,
) -> (Shape, usize) {
    let nd = shape.ndim();
    let norm: SmallVec<[usize; 4]> = match axes {
        None => (0..nd).collect(),
        Some(a) => a
            .iter()
            .map(|&x| {
                if x < 0 {
                    (x + nd as isize) as usize
                } else {
                    x as usize
                }
            })
            .collect(),
    };
    let mut count = 1;
    let dims: Dims = shape
        .dims()
        .iter()
        .enumerate()
        .map(|(d, &n)| {
            if norm.contains(&d) {
                count *= n;
                1
            } else {
                n
            }
        })
        .collect();
    (Shape(dims), count)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_numpy() {
        let b = |x: &[usize], y: &[usize]| Shape::broadcast(&x.into(), &y.into());
        assert_eq!(b(&[2, 3], &[3]), Some(Shape::from([2, 3])));
        assert_eq!(b(&[2, 1], &[1, 4]), Some(Shape::from([2, 4])));
        assert_eq!(b(&[], &[5]), Some(Shape::from([5])));
        assert_eq!(b(&[2, 3], &[2]), None);
        assert_eq!(b(&[0], &[1]), Some(Shape::from([0])));
    }

    #[test]
    fn strides_are_row_major() {
        assert_eq!(
            Shape::from([2, 3, 4]).contiguous_strides().as_slice(),
            &[12, 4, 1]
        );
    }
}
