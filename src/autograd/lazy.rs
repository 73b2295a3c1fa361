//! The gradient that flows backward between rules: `scale * base`, where the base is an
//! array, all ones of a shape, or an array still to be summed over broadcast axes. A
//! rule that only scales, reshapes or passes its gradient on
//! ([`super::Backward::backward_lazy`]) keeps it lazy, so the seed, `mean`'s `1/n`,
//! `neg` and `x / 2` cost no op until a rule needs an array, and a parameter's
//! broadcast gradient is summed inside the kernel that adds it in.

use crate::error::Result;
use crate::{DType, NDArray, Shape};

/// A gradient flowing backward, kept as `scale * base` so that scalar factors
/// (`x / 2`, `mean`, `square`'s 2, `neg`) and the all-ones seed cost no op until a
/// rule needs the array: [`LazyGrad::array`].
#[derive(Clone, Debug)]
pub(crate) struct LazyGrad {
    /// What is scaled.
    pub base: Base,
    /// The scalar factor.
    pub scale: f64,
}

/// The unscaled part of a [`LazyGrad`].
#[derive(Clone, Debug)]
pub(crate) enum Base {
    /// An array (a gradient computed by a rule, or a forward array such as the input
    /// of `square`).
    Arr(NDArray),
    /// All ones of this shape (the seed and what `sum`/`mean`/`reshape` make of it).
    Ones(Shape),
    /// An array still to be summed over its broadcast axes to this shape
    /// ([`NDArray::unbroadcast`]): deferred so that a parameter's gradient, which gets it as
    /// its only contribution, sums it in the kernel that adds it in (no array made).
    /// Made an array ([`LazyGrad::settle`]) before anything else reads it.
    Unreduced(NDArray, Shape),
}

/// From this many elements [`LazyGrad::strided_array`] makes all ones on the CPU as a
/// stride-0 view of one element (below, an array: a small fill costs less than the
/// view's op; the GPU's kernels read contiguous gradients).
const ONES_VIEW_FROM: usize = 4096;

/// Where [`LazyGrad::array`] creates the arrays of [`Base::Ones`]: beside the loss (its
/// manager and device), in its dtype.
pub(crate) struct Env {
    pub(super) loss: NDArray,
    pub(super) dtype: DType,
}

impl LazyGrad {
    /// Whether this is a multiple of all ones (no array yet).
    pub(crate) fn is_ones(&self) -> bool {
        matches!(self.base, Base::Ones(_))
    }

    /// `a` itself.
    pub(crate) fn arr(a: NDArray) -> LazyGrad {
        LazyGrad {
            base: Base::Arr(a),
            scale: 1.0,
        }
    }

    /// `s` times this gradient.
    pub(crate) fn scaled(self, s: f64) -> LazyGrad {
        LazyGrad {
            scale: self.scale * s,
            ..self
        }
    }

    /// [`LazyGrad::array`] for a rule whose kernel reads its gradient through the
    /// gradient's strides (the normalisations): a large multiple of all ones on the CPU
    /// is a stride-0 view of one element (PyTorch's `expand`), so no pass writes, and
    /// the kernel reads, no array of ones. Kernels that want a contiguous gradient
    /// (conv2d's gather, the pooling scatter) take [`LazyGrad::array`]: through a view
    /// they measured slower than a filled array.
    pub(crate) fn strided_array(self, env: &Env) -> Result<NDArray> {
        match &self.base {
            Base::Ones(shape)
                if shape.size() >= ONES_VIEW_FROM
                    && crate::engine::device_of(env.loss.id)? == crate::Device::Cpu =>
            {
                let at = std::panic::Location::caller();
                let one =
                    crate::engine::full_beside(env.loss.id, ().into(), self.scale, env.dtype, at)?;
                // The view keeps the element's buffer; the scalar array itself is
                // closed whether or not the view was made.
                let view = crate::engine::broadcast_view(one, shape.clone(), at);
                crate::engine::close_array(one, at);
                Ok(NDArray { id: view? })
            }
            _ => self.array(env),
        }
    }

    /// `scale * base` as an array (no op when the scale is 1 and the base an array).
    pub(crate) fn array(self, env: &Env) -> Result<NDArray> {
        let g = self.settle()?;
        match g.base {
            Base::Ones(shape) => {
                let at = std::panic::Location::caller();
                let id = crate::engine::full_beside(env.loss.id, shape, g.scale, env.dtype, at)?;
                Ok(NDArray { id })
            }
            Base::Arr(a) if g.scale == 1.0 => Ok(a),
            Base::Arr(a) => a.try_mul(g.scale),
            Base::Unreduced(..) => unreachable!("settled"),
        }
    }

    /// The same gradient with a [`Base::Unreduced`] base summed to its shape.
    pub(crate) fn settle(self) -> Result<LazyGrad> {
        match self.base {
            Base::Unreduced(a, shape) => Ok(LazyGrad {
                base: Base::Arr(a.unbroadcast(&shape)?),
                scale: self.scale,
            }),
            _ => Ok(self),
        }
    }

    /// The sum of two gradients of one array.
    pub(crate) fn add(self, other: LazyGrad, env: &Env) -> Result<LazyGrad> {
        let (this, other) = (self.settle()?, other.settle()?);
        match (this.base, other.base) {
            (Base::Ones(s), Base::Ones(_)) => Ok(LazyGrad {
                base: Base::Ones(s),
                scale: this.scale + other.scale,
            }),
            (Base::Arr(a), Base::Arr(b)) if this.scale == other.scale => Ok(LazyGrad {
                base: Base::Arr(a.try_add(b)?),
                scale: this.scale,
            }),
            (a, b) => {
                let a = LazyGrad { base: a, ..this }.array(env)?;
                let b = LazyGrad { base: b, ..other }.array(env)?;
                Ok(LazyGrad::arr(a.try_add(b)?))
            }
        }
    }

    /// [`NDArray::unbroadcast`]: summed over broadcast axes to `shape`.
    pub(crate) fn unbroadcast(self, shape: &Shape) -> Result<LazyGrad> {
        match self.base {
            Base::Ones(gs) => {
                if gs == *shape {
                    return Ok(LazyGrad {
                        base: Base::Ones(gs),
                        ..self
                    });
                }
                // Each element of the result sums this many ones.
                let (n, m) = (gs.size(), shape.size());
                let count = n.checked_div(m).map_or(1.0, |c| c as f64);
                Ok(LazyGrad {
                    base: Base::Ones(shape.clone()),
                    scale: self.scale * count,
                })
            }
            // Summed when read (see `Base::Unreduced`).
            Base::Arr(a) => Ok(LazyGrad {
                base: Base::Unreduced(a, shape.clone()),
                scale: self.scale,
            }),
            Base::Unreduced(..) => self.settle()?.unbroadcast(shape),
        }
    }
}
