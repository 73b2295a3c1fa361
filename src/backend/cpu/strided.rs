//! Typed views over plain slices: what every CPU kernel reads and writes.

use crate::layout::Layout;

/// Elements of type `T` in `data`, laid out by `layout`: what a kernel reads.
#[derive(Clone, Copy)]
pub(crate) struct Strided<'a, T> {
    pub data: &'a [T],
    pub layout: &'a Layout,
}

/// Elements of type `T` in `data`, laid out by `layout`: what an in-place kernel writes.
pub(crate) struct StridedMut<'a, T> {
    pub data: &'a mut [T],
    pub layout: &'a Layout,
}

/// A 2-D strided matrix operand: element (i, j) is at `off + i*rs + j*cs`.
pub(crate) struct Mat<'a, T> {
    pub data: &'a [T],
    pub off: isize,
    pub rs: isize,
    pub cs: isize,
}
