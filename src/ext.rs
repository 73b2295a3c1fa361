//! The extension API: the few engine services that a layer built on top of the array
//! API ([`nn`](crate::nn), [`optim`](crate::optim), [`io`](crate::io),
//! [`data`](crate::data)) may use where the public ops do not reach.
//!
//! Such a layer sees arrays ([`NDArray`]) and managers ([`NDManager`]), never ids,
//! records, shards or locks. When it needs a kernel of its own (an optimizer's fused
//! update, writing a checkpoint's bytes into an array, gathering a batch's rows), it
//! goes through one of the functions below, each a thin wrapper over the engine's op
//! path, named for what it does:
//!
//! * [`update_in_place`]: write an array in place from N same-shape inputs, in one pass,
//!   allocating nothing (what `addi` does); the closure gets the target as a
//!   [`StridedMut`] and the inputs as [`Strided`] views, under the engine's write
//!   guarantees (no reader in flight, inputs that alias the target copied out first);
//! * [`read`]: run a closure over an array's data (a [`Strided`] view) under the
//!   engine's read guarantees (no writer in flight);
//! * [`custom_op`]: a named op over input arrays that makes a new array, either from a
//!   new buffer or as a view of an input; the result belongs to the first input's
//!   manager and to the current scope, and the op appears in a
//!   [`profile`](crate::profile()) under its name. Not recorded for autograd;
//! * [`array_from_buffer`] and [`check_manager_open`]: a new array owned by a manager
//!   from a filled backend [`Buffer`] (a file's contents), and the check that a manager
//!   still takes arrays;
//! * [`desc`]: an array's description, for an error's message.
//!
//! The closures see the backend's views ([`Strided`], [`StridedMut`]: a slice plus the
//! [`Layout`] that maps indices into it) through [`Input`] and [`Target`], which also
//! carry the dtype and the description for errors. They run under the engine's locks:
//! they must not call back into the array API.
//!
//! Every wrapper is `#[inline]` and generic over its closure (nothing boxed), so a hot
//! path such as the optimizer step costs exactly what the engine call costs.

use crate::backend::cpu::{Buffer, Strided, StridedMut};
use crate::dtype::Native;
use crate::engine::{self, Operand, OperandMut};
use crate::error::{ArrayDesc, Result, SourceLocation};
use crate::layout::Layout;
use crate::{DType, NDArray, NDManager, Shape};

/// An input of [`update_in_place`], [`read`] or [`custom_op`]: an array's data, readable
/// while the closure runs.
#[derive(Clone, Copy)]
pub(crate) struct Input<'a>(&'a Operand<'a>);

impl<'a> Input<'a> {
    /// The element type.
    #[inline]
    pub(crate) fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Where the elements sit in the buffer ([`Input::view`]'s layout).
    #[inline]
    pub(crate) fn layout(&self) -> &'a Layout {
        self.0.layout
    }

    /// The shape.
    #[inline]
    pub(crate) fn shape(&self) -> &'a Shape {
        &self.0.layout.shape
    }

    /// The data as `T` (which must be the dtype's native type): the whole buffer,
    /// indexed through the layout.
    #[inline]
    pub(crate) fn view<T: Native>(&self) -> Strided<'a, T> {
        Strided::from(self.0)
    }

    /// The array's description, for an error.
    #[inline]
    pub(crate) fn desc(&self) -> Box<ArrayDesc> {
        self.0.desc()
    }
}

/// The array [`update_in_place`] writes.
pub(crate) struct Target<'a>(OperandMut<'a>);

impl Target<'_> {
    /// The element type.
    #[inline]
    pub(crate) fn dtype(&self) -> DType {
        self.0.dtype
    }

    /// Where the elements sit in the buffer ([`Target::view_mut`]'s layout).
    #[inline]
    pub(crate) fn layout(&self) -> &Layout {
        &self.0.layout
    }

    /// The data as `T` (which must be the dtype's native type), writable: the whole
    /// buffer, indexed through the layout. Write only the elements the layout selects.
    #[inline]
    pub(crate) fn view_mut<T: Native>(&mut self) -> StridedMut<'_, T> {
        StridedMut::from(&mut self.0)
    }

    /// The array's description, for an error.
    #[inline]
    pub(crate) fn desc(&self) -> Box<ArrayDesc> {
        self.0.desc()
    }

    /// For a target on a GPU: `t = expr` by a device kernel, where `rule()` gives
    /// `expr` and the scalars' values; `expr` is WGSL over
    /// `t`, the inputs as `x` and `y` (at most two, on the target's device, which the
    /// engine checked) and the scalars (in the target's dtype) as `s`, `s1`, `s2`, ...
    /// `None` for a target in host memory (use [`Target::view_mut`]).
    #[cfg(feature = "gpu")]
    pub(crate) fn update_on_device<'r>(
        &mut self,
        op: &'static str,
        inputs: &[Input<'_>],
        rule: impl FnOnce() -> (&'r str, &'r [f64]),
    ) -> Option<Result<()>> {
        use crate::backend::wgpu::{inplace, kernels};
        let t = self.0.gpu()?;
        let (expr, scalars) = rule();
        let views: smallvec::SmallVec<[kernels::View<'_>; 2]> =
            inputs.iter().filter_map(|x| x.0.gpu()).collect();
        debug_assert_eq!(views.len(), inputs.len(), "the engine keeps one device");
        let bits: smallvec::SmallVec<[u64; 8]> = scalars
            .iter()
            .map(|&v| kernels::scalar_bits(v, t.dtype))
            .collect();
        Some(inplace::assign_n(op, t, &views, expr, &bits))
    }
}

/// Write `target` in place from `inputs` (same dtype and shape: checking is the
/// closure's job), in one pass: `f` gets the target and the inputs, in order. Nothing
/// is allocated unless an input shares the target's buffer (it is copied out first,
/// so reads never alias the write).
///
/// Not recorded for autograd: call `autograd::check_inplace` first where a tape may
/// depend on `target`. Errors: `Closed` (the target or an input), and `f`'s.
#[inline]
pub(crate) fn update_in_place<const N: usize>(
    target: NDArray,
    inputs: [NDArray; N],
    f: impl FnOnce(Target<'_>, [Input<'_>; N]) -> Result<()>,
) -> Result<()> {
    let ids = inputs.map(|a| a.id);
    engine::run_inplace(target.id, &ids, |t, o| {
        f(Target(t), std::array::from_fn(|i| Input(&o[i])))
    })
}

/// [`update_in_place`] for an update `name` with a device kernel: `f` also sees a
/// target (and inputs, on its device) on a GPU, and must branch on
/// [`Target::update_on_device`] before touching host views. Inputs on another device
/// are a `DeviceMismatch`, nothing written.
#[inline]
pub(crate) fn update_in_place_on<const N: usize>(
    name: &'static str,
    target: NDArray,
    inputs: [NDArray; N],
    f: impl FnOnce(Target<'_>, [Input<'_>; N]) -> Result<()>,
) -> Result<()> {
    let ids = inputs.map(|a| a.id);
    engine::run_inplace_on(name, target.id, &ids, |t, o| {
        f(Target(t), std::array::from_fn(|i| Input(&o[i])))
    })
}

/// Run `f` over `a`'s data (read only). Errors: `Closed`.
#[inline]
pub(crate) fn read<R>(a: NDArray, f: impl FnOnce(Input<'_>) -> R) -> Result<R> {
    engine::read(a.id, |o| f(Input(o)))
}

/// What a [`custom_op`] produced: a new contiguous array from a buffer, or a view of
/// input `of` with another layout (within that input's buffer). The op path's own type.
pub(crate) use crate::engine::Output;

/// Op `name` over `inputs`: `f` gets their data and says what the result is (a new
/// buffer, or a view of an input). The result belongs to the first input's manager
/// and is registered in the current scope, created at `at`. Not recorded for autograd.
/// Errors: `Closed`, `ManagerClosed`/`ManagerCapped` (the first input's manager), and
/// `f`'s.
#[inline]
pub(crate) fn custom_op<const N: usize>(
    name: &'static str,
    inputs: [NDArray; N],
    at: SourceLocation,
    f: impl FnOnce([Input<'_>; N]) -> Result<Output>,
) -> Result<NDArray> {
    let ids = inputs.map(|a| a.id);
    let id = engine::run_op(name, &ids, at, |o| f(std::array::from_fn(|i| Input(&o[i]))))?;
    Ok(NDArray { id })
}

/// A new contiguous array of `m` holding `buf` (filled, `shape.size()` elements of
/// `dtype`), registered in the current scope, created at `at`. Errors:
/// `ManagerClosed`/`ManagerCapped`.
// Only `io` uses it today.
#[cfg_attr(not(feature = "io"), allow(dead_code))]
#[inline]
pub(crate) fn array_from_buffer(
    m: &NDManager,
    buf: Buffer,
    shape: Shape,
    dtype: DType,
    at: SourceLocation,
) -> Result<NDArray> {
    Ok(NDArray {
        id: engine::create(m.id, buf, shape, dtype, at)?,
    })
}

/// `ManagerClosed` unless `m` is open (a cap is not checked: see
/// [`NDManager::is_capped`]).
#[cfg_attr(not(feature = "io"), allow(dead_code))]
#[inline]
pub(crate) fn check_manager_open(m: &NDManager) -> Result<()> {
    engine::check_manager(m.id)
}

/// `a`'s description (uid, shape, dtype, creating line), for an error's message.
/// Errors: `Closed`.
#[inline]
pub(crate) fn desc(a: NDArray) -> Result<Box<ArrayDesc>> {
    engine::desc(a.id)
}
