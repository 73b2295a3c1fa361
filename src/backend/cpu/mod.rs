//! The CPU backend: 64-byte-aligned host buffers from a caching pool, and kernels that
//! loop over plain slices.
//!
//! A kernel reads [`Strided`] data (a slice plus the [`Layout`](crate::layout::Layout)
//! that maps indices into it) and writes a new [`Buffer`] or a [`StridedMut`]. It knows
//! nothing of the registry, so it is tested on plain vectors (`tests.rs` beside this
//! file). The engine turns an op's resolved inputs into these views.
//!
//! * [`buffer`]: data blocks, and the [`pool`] that recycles them;
//! * [`strided`]: the typed views kernels read and write;
//! * [`elementwise`], [`reduce`](mod@reduce), [`matmul`] (and `blas`, the optional OpenBLAS path):
//!   the kernels shared by many ops;
//! * [`copy`]: strided block copies and fill values; [`gather`]: the index-array
//!   kernels (`index_select`, `gather`, `scatter_add`, `take`, masks);
//! * [`nn`]: softmax, `where`, one-hot, embedding and loss loops; [`norm`]: the
//!   `layer_norm`/`batch_norm` kernel and the running-statistics update;
//! * [`conv`]: im2col/col2im and `conv2d`'s forward and gradient kernels; [`pool2d`]:
//!   max and average pooling (the window geometry is [`crate::backend::window`],
//!   shared with the GPU);
//! * [`grad`]: adding a (scaled, possibly broadcast) gradient into a parameter's;
//! * [`fork`](mod@fork): when a large kernel may split its work across threads, and where;
//!   [`simd`]: running a loop compiled for the widest vector unit the CPU has.

#[cfg(feature = "openblas")]
mod blas;

/// Work (elements) above which the im2col/col2im and pooling loops run on several
/// threads.
pub(crate) const PARALLEL_WORK: usize = 1 << 15;

pub(crate) mod buffer;
pub(crate) mod conv;
pub(crate) mod copy;
pub(crate) mod elementwise;
pub(crate) mod fork;
pub(crate) mod gather;
pub(crate) mod grad;
pub(crate) mod matmul;
pub(crate) mod nn;
pub(crate) mod norm;
pub(crate) mod pool;
pub(crate) mod pool2d;
pub(crate) mod reduce;
pub(crate) mod simd;
pub(crate) mod strided;
#[cfg(test)]
mod tests;

pub(crate) use buffer::{Buffer, PoolVec, new_filled, new_overwritten};
pub(crate) use elementwise::{assign_binary, assign_unary, map_binary, map_unary, to_vec};
#[cfg(test)]
pub(crate) use fork::fork_threads;
#[cfg(test)]
pub(crate) use fork::forks_handed_over;
pub(crate) use fork::{NoFork, PARALLEL_FLOPS, fork, may_fork};
pub(crate) use matmul::matmul_2d;
pub(crate) use reduce::{Accs, prefers_outer, reduce, reduce_outer, sum_row};
pub(crate) use strided::{Mat, Strided, StridedMut};
