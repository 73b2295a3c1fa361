//! Conversions to and from the `ndarray` crate (feature `ndarray`).

use crate::dtype::Element;
use crate::error::{NdError, Result, unwrap};
use crate::{NDArray, NDManager};
use ndarray::{ArrayBase, ArrayD, Data, Dimension, IxDyn};

impl NDArray {
    /// A new array of `manager` (registered in the current scope) holding a copy of
    /// an `ndarray` array of any dimension and layout, in its logical (row-major)
    /// order. `T` is `f32`, `f64`, `i32`, `i64`, `u8` or `bool`. Needs the feature
    /// `ndarray`. Panics on error (see [`NDArray::try_from_ndarray`]).
    ///
    /// ```
    /// use ndscope::{NDArray, NDManager};
    /// let m = NDManager::new();
    /// let a = ndarray::arr2(&[[1.0f32, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    /// let x = NDArray::from_ndarray(&m, &a.t());         // a transposed view: copied as seen
    /// assert_eq!(x.shape().dims(), &[3, 2]);
    /// assert_eq!(x.to_vec::<f32>()?, vec![1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    /// let back = x.to_ndarray::<f32>()?;                 // ArrayD<f32>
    /// assert_eq!(back, a.t().into_dyn());
    /// # Ok::<(), ndscope::NdError>(())
    /// ```
    #[track_caller]
    pub fn from_ndarray<T, S, D>(manager: &NDManager, array: &ArrayBase<S, D>) -> NDArray
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        unwrap(NDArray::try_from_ndarray(manager, array))
    }

    /// [`NDArray::from_ndarray`]. Errors: `ManagerClosed`/`ManagerCapped`,
    /// `OutOfMemory`.
    #[track_caller]
    pub fn try_from_ndarray<T, S, D>(
        manager: &NDManager,
        array: &ArrayBase<S, D>,
    ) -> Result<NDArray>
    where
        T: Element,
        S: Data<Elem = T>,
        D: Dimension,
    {
        let shape = array.shape().to_vec();
        match array.as_slice() {
            Some(s) => manager.try_create(s, shape),
            None => {
                let v: Vec<T> = array.iter().copied().collect();
                manager.try_create(&v, shape)
            }
        }
    }

    /// A copy of the array as an `ndarray::ArrayD<T>` in standard (row-major)
    /// layout. `T` must match the dtype (`bool` for `Bool`), as for
    /// [`NDArray::to_vec`], which this mirrors (no panicking form). Needs the feature
    /// `ndarray`. Errors: `ElementType`, `Closed`.
    pub fn to_ndarray<T: Element>(self) -> Result<ArrayD<T>> {
        let shape = self.try_shape()?;
        let v = self.to_vec::<T>()?;
        ArrayD::from_shape_vec(IxDyn(shape.dims()), v)
            .map_err(|e| NdError::shape("to_ndarray", e.to_string()))
    }
}
