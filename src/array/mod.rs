//! [`NDArray`]: the `Copy` handle to an engine-owned array.
//!
//! The handle is a 16-byte generational id (shard, slot index and serial number); all data
//! and metadata live in the engine.
//! Copying a handle does not copy data and does not change ownership or counts: the
//! array lives until its manager closes, the scope it is registered in closes, or it is
//! closed or released explicitly (see the crate docs for the rules).

mod axis;
mod conv;
pub(crate) mod device;
mod display;
mod dropout;
pub(crate) mod gather;
pub(crate) mod grad;
mod index;
pub(crate) mod linalg;
mod logical;
mod nn;
mod operators;
mod ops;
mod reduce;
mod shape_ops;
mod stats;
mod unary;

pub use ops::Rhs;

use crate::backend::cpu;
use crate::dtype::{Element, dispatch};
use crate::engine::{self, ArrayId};
use crate::error::{NdError, Result, twins, unwrap};
use crate::{DType, Device, NDManager, Shape};
use std::panic::Location;

/// A handle to an n-dimensional array owned by an [`NDManager`].
///
/// `Copy + Send + Sync`, 16 bytes. Equality and hashing are identity (two handles are
/// equal when they name the same array), never fail, and keep working after close.
/// Arithmetic works on handles directly:
///
/// ```
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let a = m.create(&[1.0f32, 2.0, 3.0], [3]);
/// let b = m.ones([3], DType::F32);
/// let c = a * 2.0 + b - 1;          // literals infer; no `&`, no `?`, no `.clone()`
/// assert_eq!(c.shape().dims(), &[3]);
/// assert_eq!(c.to_vec::<f32>()?, vec![2.0, 4.0, 6.0]);
/// let d = 2.0 * a - 1;
/// assert_eq!(d.to_vec::<f32>()?, vec![1.0, 3.0, 5.0]);
/// # Ok::<(), ndscope::NdError>(())
/// ```
///
/// Handles are deliberately not ordered (`a < b` does not compile; the elementwise
/// comparisons are [`NDArray::lt`] and friends); to order arrays by identity, for a
/// `BTreeMap` or a stable sort, use [`NDArray::uid`].
///
/// ```compile_fail
/// # use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let (a, b) = (m.ones([2], DType::F32), m.zeros([2], DType::F32));
/// let _ = a < b; // identities have no order: use a.lt(b) (elementwise) or a.uid()
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NDArray {
    pub(crate) id: ArrayId,
}

const _: () = assert!(std::mem::size_of::<NDArray>() <= 16);

impl NDArray {
    /// A process-unique id, never reused (even after the array is freed).
    pub fn uid(self) -> u64 {
        self.id.uid()
    }

    twins! {
        /// The shape. Panics if the array is closed (see [`NDArray::try_shape`]).
        pub fn shape,
        /// The shape, or `Closed`.
        pub fn try_shape(self) -> Shape {
            engine::shape(self.id)
        }
    }

    twins! {
        /// The dtype. Panics if the array is closed.
        pub fn dtype,
        /// The dtype, or `Closed`.
        pub fn try_dtype(self) -> DType {
            engine::dtype(self.id)
        }
    }

    /// Number of elements. Panics if the array is closed.
    #[track_caller]
    pub fn size(self) -> usize {
        unwrap(self.try_shape()).size()
    }

    /// Number of dimensions. Panics if the array is closed.
    #[track_caller]
    pub fn ndim(self) -> usize {
        unwrap(self.try_shape()).ndim()
    }

    twins! {
        /// The owning manager. Panics if the array is closed.
        pub fn manager,
        /// The owning manager, or `Closed`.
        pub fn try_manager(self) -> NDManager {
            Ok(NDManager {
                id: engine::manager_of(self.id)?,
            })
        }
    }

    twins! {
        /// The device the array's data lives on: its manager's for what the manager
        /// creates, the target's for a `to_device` copy, its inputs' for an op's
        /// result. Panics if the array is closed.
        pub fn device,
        /// The device the array lives on, or `Closed`.
        pub fn try_device(self) -> Device {
            engine::device_of(self.id)
        }
    }

    twins! {
        /// A copy of this array on `device`, owned like any op's result (by this
        /// array's manager, registered in the current scope) with its own record;
        /// gradients flow through it. There is never a silent round trip: each call is
        /// one explicit copy. Panics on error.
        ///
        /// ```
        /// use ndscope::{Device, NDManager};
        /// let m = NDManager::new();
        /// let a = m.create(&[1.0f32, 2.0], [2]);
        /// let b = a.to_device(Device::Cpu);
        /// assert_ne!(a, b);
        /// assert_eq!(b.to_vec::<f32>()?, vec![1.0, 2.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn to_device,
        /// [`NDArray::to_device`]. Errors: `Closed`, `NoDevice` (no such device),
        /// `Unsupported` (a GPU in this build), `OutOfMemory`.
        pub fn try_to_device(self, device: Device) -> NDArray {
            crate::adapters::check(device)?;
            device::to_device(self, device, Location::caller())
        }
    }

    twins! {
        /// Move this array's data to `device` in place: the handle, its manager, scopes,
        /// reference count and gradient (moved with it) stay, so everything holding the
        /// handle (a model, an optimizer's state) sees the data there. The old buffer goes
        /// back to its device's pool at once. This is how a model goes to a GPU
        /// ([`Module::to_device`](crate::nn::Module::to_device)); [`NDArray::to_device`]
        /// is the copy, with a gradient that flows back. Panics on error.
        ///
        /// ```
        /// use ndscope::{Device, NDManager};
        /// let m = NDManager::new();
        /// let a = m.create(&[1.0f32, 2.0], [2]);
        /// a.move_to_device(Device::Cpu); // already there: nothing to do
        /// assert_eq!(a.device(), Device::Cpu);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn move_to_device,
        /// [`NDArray::move_to_device`]. Errors: `Closed`, `NoDevice`, `Unsupported` (a GPU
        /// in a build without the `gpu` feature), `UnsupportedDTypeOn`, `OutOfMemory`,
        /// `InvalidArgument` (a view shares the array's data, so it would be left
        /// behind; or a gradient tape being recorded depends on the array). Nothing
        /// changes on an error, except when the gradient cannot follow (out of memory
        /// on the device): the array has moved and its gradient has not (move it with
        /// `gradient().move_to_device(..)`).
        pub fn try_move_to_device(self, device: Device) -> () {
            crate::adapters::check(device)?;
            device::move_to_device(self, device)
        }
    }

    /// Whether the array has been freed.
    pub fn is_closed(self) -> bool {
        !engine::is_live(self.id)
    }

    /// Free the array now, whatever its reference count. Idempotent. Views of it keep
    /// the shared data alive.
    #[track_caller]
    pub fn close(self) {
        engine::close_array(self.id, Location::caller());
    }

    /// The elements in row-major order. `T` must match the dtype (`bool` for Bool).
    pub fn to_vec<T: Element>(self) -> Result<Vec<T>> {
        engine::read(self.id, |o| {
            if o.dtype != T::DTYPE {
                return Err(NdError::ElementType {
                    op: "to_vec",
                    requested: T::DTYPE,
                    array: o.desc(),
                });
            }
            Ok(dispatch!(o.dtype, N => cpu::to_vec::<N>(o)
                .into_iter()
                .map(|x| if T::DTYPE.is_float() {
                    T::elem_from_f64(crate::dtype::Native::to_f64(x))
                } else {
                    T::elem_from_i64(crate::dtype::Native::to_i64(x))
                })
                .collect()))
        })?
    }

    /// The single element of a one-element array.
    pub fn to_scalar<T: Element>(self) -> Result<T> {
        let v = self.to_vec::<T>()?;
        if v.len() != 1 {
            let array = engine::desc(self.id)?;
            return Err(NdError::Index {
                op: "to_scalar",
                msg: format!("{} elements, expected exactly 1", v.len()),
                array,
            });
        }
        Ok(v[0])
    }

    twins! {
        /// Move ownership to the system manager: no manager close will free it; the caller
        /// (or a scope it is still registered in) must. Does not unregister it from scopes.
        pub fn detach,
        /// [`NDArray::detach`], or `Closed`.
        pub fn try_detach(self) -> NDArray {
            engine::attach(self.id, engine::SYSTEM)?;
            Ok(self)
        }
    }

    twins! {
        /// Move ownership to `manager`.
        pub fn attach,
        /// [`NDArray::attach`], or `Closed` / `ManagerClosed` / `ManagerCapped`.
        pub fn try_attach(self, manager: &NDManager) -> NDArray {
            engine::attach(self.id, manager.id)?;
            Ok(self)
        }
    }

    twins! {
        /// Move ownership to `manager` until it closes; then the array returns to the
        /// manager it came from instead of being freed (it is freed if that one closed).
        pub fn temp_attach,
        /// [`NDArray::temp_attach`], or an error.
        pub fn try_temp_attach(self, manager: &NDManager) -> NDArray {
            engine::temp_attach(self.id, manager.id)?;
            Ok(self)
        }
    }

    twins! {
        /// Add a reference: the array survives the close of the scopes it is registered in
        /// until a matching [`NDArray::release`] (or its manager's close, or `close()`).
        /// Returns the new count.
        pub fn retain,
        /// [`NDArray::retain`], or `Closed`.
        pub fn try_retain(self) -> u32 {
            engine::retain(self.id)
        }
    }

    twins! {
        /// Drop a reference; frees the array when none is left (so one `release()` frees an
        /// unscoped, unretained array). Returns whether it freed. Panics on a freed array.
        pub fn release,
        /// [`NDArray::release`], or `Closed` for an array already freed.
        pub fn try_release(self) -> bool {
            engine::release(self.id, Location::caller())
        }
    }

    twins! {
        /// Scope registrations plus outstanding retains.
        pub fn ref_count,
        /// [`NDArray::ref_count`], or `Closed`.
        pub fn try_ref_count(self) -> u32 {
            engine::ref_count(self.id)
        }
    }
}

impl std::fmt::Debug for NDArray {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match engine::desc(self.id) {
            Ok(d) => write!(f, "NDArray(#{} {}{})", d.uid, d.dtype, d.shape),
            Err(_) => write!(f, "NDArray(#{} closed)", self.uid()),
        }
    }
}
