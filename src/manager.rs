//! [`NDManager`]: the tree of owners. Every array has exactly one owning manager;
//! closing a manager closes its sub-managers and frees every array it owns.

use crate::backend::cpu::new_filled;
use crate::diag::{MemoryStats, human_bytes};
#[allow(unused_imports)]
use crate::dtype::Element as _;
use crate::dtype::{Element, Native, dispatch};
use crate::engine::{self, MgrId, Resource};
use crate::error::{NdError, Result, SourceLocation, twins, unwrap};
use crate::random;
use crate::{DType, Device, NDArray, Shape};
use std::fmt::Write as _;
use std::panic::Location;

/// An owner of arrays, in a tree rooted at [`NDManager::system()`].
///
/// A handle (an id) that is `Clone` but not `Copy`: cloning is cheap and the clones
/// refer to the same manager; dropping a handle closes nothing (close a manager with
/// [`NDManager::close`]). Equality is identity. Arrays created through a manager belong
/// to it; an op's result belongs to the manager of its first input.
///
/// ```
/// use ndscope::{DType, NDManager};
/// let m = NDManager::new();
/// let a = m.ones([2, 2], DType::F32);
/// let sub = m.new_sub_manager();
/// let b = sub.zeros([3], DType::F64);
/// assert_eq!(m.memory().live_arrays, 2); // counts include sub-managers
/// m.close(); // closes `sub` too, and frees `a` and `b`
/// assert!(a.is_closed() && b.is_closed() && !sub.is_open());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct NDManager {
    pub(crate) id: MgrId,
}

impl std::fmt::Debug for NDManager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = self.name();
        write!(f, "NDManager({name})")
    }
}

impl Default for NDManager {
    fn default() -> Self {
        NDManager::new()
    }
}

fn check_shape(op: &'static str, shape: &Shape, dtype: DType) -> Result<usize> {
    let n = shape
        .checked_size()
        .ok_or_else(|| NdError::shape(op, format!("{shape} has more elements than usize holds")))?;
    n.checked_mul(dtype.size_in_bytes())
        .filter(|&b| b <= isize::MAX as usize)
        .ok_or_else(|| {
            NdError::shape(
                op,
                format!("{shape} of {dtype} overflows the address space"),
            )
        })?;
    Ok(n)
}

/// Fill a new buffer of `dtype` with `f(i)` converted from f64, called for `i = 0, 1, ...`
/// in order (so `f` may draw from a generator).
fn filled(n: usize, dtype: DType, mut f: impl FnMut(usize) -> f64) -> Result<engine::Buffer> {
    dispatch!(dtype, T => new_filled::<T>(n, |out| {
        for (i, o) in out.iter_mut().enumerate() {
            *o = if dtype == DType::Bool {
                T::from_f64((f(i) != 0.0) as u8 as f64)
            } else {
                T::from_f64(f(i))
            };
        }
    }))
}

impl NDManager {
    /// The root manager. It is never closed (`close()` on it does nothing); arrays that
    /// are `detach()`ed belong to it.
    pub fn system() -> NDManager {
        NDManager { id: engine::SYSTEM }
    }

    /// A new manager, child of the system manager.
    #[allow(clippy::new_without_default)]
    pub fn new() -> NDManager {
        NDManager::system().new_sub_manager()
    }

    twins! {
        /// A new child of this manager. Panics if this manager is closed.
        pub fn new_sub_manager,
        /// A new child of this manager, or `ManagerClosed`.
        pub fn try_new_sub_manager(&self) -> NDManager {
            let id = engine::new_manager(self.id, None, None)?;
            Ok(NDManager { id })
        }

        /// A new manager on `device`, child of the system manager (DJL's
        /// `NDManager.newBaseManager(device)`): every array it creates lives there, and
        /// its sub-managers inherit the device. Panics on error.
        ///
        /// ```
        /// use ndscope::{Device, NDManager};
        /// let m = NDManager::new_on(Device::Cpu);
        /// assert_eq!(m.zeros([2], ndscope::DType::F32).device(), Device::Cpu);
        /// ```
        pub fn new_on,
        /// [`NDManager::new_on`]. Errors: `NoDevice` when [`devices`](crate::devices)
        /// lists no such device; `Unsupported` for a GPU in this build (device arrays
        /// come with the wgpu backend).
        pub fn try_new_on(device: Device) -> NDManager {
            crate::adapters::check(device)?;
            #[cfg(feature = "gpu")]
            if let Device::Gpu(n) = device {
                crate::backend::wgpu::ctx(n)?; // opened now, so a broken device fails here
            }
            let id = engine::new_manager(engine::SYSTEM, None, Some(device))?;
            Ok(NDManager { id })
        }
    }

    /// The device this manager's arrays live on (inherited by its sub-managers);
    /// `Device::Cpu` for a closed manager.
    pub fn device(&self) -> Device {
        engine::manager_device(self.id).unwrap_or_default()
    }

    /// The parent manager (`None` for the system manager or a closed manager).
    pub fn parent(&self) -> Option<NDManager> {
        engine::manager_parent(self.id)
            .ok()
            .flatten()
            .map(|id| NDManager { id })
    }

    /// The open sub-managers, in creation order except where closes reordered them.
    pub fn children(&self) -> Vec<NDManager> {
        engine::manager_children(self.id)
            .map(|c| c.into_iter().map(|id| NDManager { id }).collect())
            .unwrap_or_default()
    }

    /// The arrays this manager owns directly (not those of sub-managers).
    pub fn arrays(&self) -> Vec<NDArray> {
        engine::manager_arrays(self.id)
            .map(|c| c.into_iter().map(|id| NDArray { id }).collect())
            .unwrap_or_default()
    }

    /// The manager's name (`manager#N` unless set; kept after close).
    pub fn name(&self) -> String {
        engine::manager_name_of(self.id)
    }

    /// Rename the manager (shown in diagnostics).
    pub fn set_name(&self, name: impl Into<String>) {
        engine::set_manager_name(self.id, name.into());
    }

    /// Whether the manager is open.
    pub fn is_open(&self) -> bool {
        engine::manager_name(self.id).is_ok()
    }

    /// Close the manager: its sub-managers close first (recursively), then every array
    /// it owns is freed (arrays temporarily attached here return to their home manager
    /// instead), then its attached resources close. Idempotent. The parent forgets it at
    /// once. Does nothing on the system manager. Safe to call from any thread, also
    /// while other threads use the manager's arrays.
    #[track_caller]
    pub fn close(&self) {
        engine::close_manager(self.id, Location::caller());
    }

    /// Stop this manager from taking new arrays (creating in it, or attaching to it,
    /// becomes `ManagerCapped`); its sub-managers keep working.
    pub fn cap(&self) {
        engine::cap_manager(self.id);
    }

    /// Whether the manager is capped.
    pub fn is_capped(&self) -> bool {
        engine::is_capped(self.id)
    }

    /// Counters for this manager and its whole subtree (zero once closed).
    pub fn memory(&self) -> MemoryStats {
        engine::stats(self.id)
            .map(MemoryStats::from_stats)
            .unwrap_or_default()
    }

    /// Attach a resource: it is closed when this manager closes. If the manager is
    /// already closed the resource is closed at once and `ManagerClosed` returned.
    pub fn attach_resource(&self, resource: impl Resource + 'static) -> Result<()> {
        let r = engine::manager_add_resource(self.id, Box::new(resource));
        match r {
            Ok(()) => Ok(()),
            Err((e, mut r)) => {
                r.close();
                Err(e)
            }
        }
    }

    /// The manager tree below (and including) this manager: one line per manager with
    /// its direct array count and subtree counts and bytes, followed by its top three
    /// creation sites.
    pub fn debug_dump(&self) -> String {
        let Ok(tree) = engine::manager_tree(self.id) else {
            return format!("{} (closed)\n", self.name());
        };
        let mut out = String::new();
        for (id, depth, name, capped) in tree {
            let direct = engine::manager_arrays(id).map(|a| a.len()).unwrap_or(0);
            let s = engine::stats(id).unwrap_or_default();
            let _ = writeln!(
                out,
                "{:indent$}{}{}: {} arrays here, subtree {} arrays / {} buffers / {} (peak {})",
                "",
                name,
                if capped { " [capped]" } else { "" },
                direct,
                s.arrays,
                s.buffers,
                human_bytes(s.bytes),
                human_bytes(s.peak),
                indent = depth * 2
            );
            let sites = crate::diag::leaks::report(id, false).sites;
            for site in sites.iter().take(3) {
                let _ = writeln!(
                    out,
                    "{:indent$}  {} arrays, {} from {}",
                    "",
                    site.count,
                    human_bytes(site.bytes),
                    site.location,
                    indent = depth * 2
                );
            }
        }
        out
    }

    // ------------------------------------------------------------ creation

    /// On a GPU manager, F32 samples drawn on the device ([`random`]'s counter-based
    /// generator) from the distribution `dist` checks and returns; `None` elsewhere
    /// (the host draws them).
    #[cfg(feature = "gpu")]
    fn random_on_device(
        &self,
        n: usize,
        shape: &Shape,
        dtype: DType,
        at: SourceLocation,
        dist: impl FnOnce() -> Result<crate::backend::wgpu::random::Dist>,
    ) -> Option<Result<NDArray>> {
        let Device::Gpu(g) = self.device() else {
            return None;
        };
        if dtype != DType::F32 {
            return None;
        }
        Some((|| {
            let dist = dist()?;
            engine::check_manager(self.id)?;
            let ctx = crate::backend::wgpu::ctx(g)?;
            let buf = crate::backend::wgpu::random::random(ctx, n, dist, random::key())?;
            let id = engine::create_stored(self.id, buf.into(), shape.clone(), dtype, at)?;
            Ok(NDArray { id })
        })())
    }

    fn make(
        &self,
        op: &'static str,
        shape: Shape,
        dtype: DType,
        at: SourceLocation,
        f: impl FnMut(usize) -> f64,
    ) -> Result<NDArray> {
        let n = check_shape(op, &shape, dtype)?;
        engine::check_manager(self.id)?; // fail fast before filling a buffer
        let buf = filled(n, dtype, f)?;
        Ok(NDArray {
            id: engine::create(self.id, buf, shape, dtype, at)?,
        })
    }

    twins! {
        /// An array holding `data` (row-major) with `shape`.
        ///
        /// ```
        /// # use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let a = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
        /// assert_eq!(a.to_vec::<f32>()?, vec![1.0, 2.0, 3.0, 4.0]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn create,

        /// [`NDManager::create`], or `InvalidShape` when `data.len()` is not the shape's size.
        pub fn try_create<T: Element>(&self, data: &[T], shape: impl Into<Shape>) -> NDArray {
            let at = Location::caller();
            let shape = shape.into();
            let n = check_shape("create", &shape, T::DTYPE)?;
            if n != data.len() {
                return Err(NdError::shape(
                    "create",
                    format!(
                        "{} values cannot fill shape {shape} ({n} elements)",
                        data.len()
                    ),
                ));
            }
            engine::check_manager(self.id)?;
            let buf = dispatch!(T::DTYPE, N => new_filled::<N>(n, |out| {
                for (o, &x) in out.iter_mut().zip(data) {
                    *o = if T::DTYPE.is_float() { N::from_f64(x.elem_to_f64()) } else { N::from_i64(x.elem_to_i64()) };
                }
            }))?;
            Ok(NDArray {
                id: engine::create(self.id, buf, shape, T::DTYPE, at)?,
            })
        }
    }

    /// A scalar (0-d) array.
    #[track_caller]
    pub fn scalar<T: Element>(&self, value: T) -> NDArray {
        unwrap(self.try_create(&[value], ()))
    }

    twins! {
        /// An array of zeros.
        pub fn zeros,
        /// An array of zeros, or an error for a closed/capped manager or bad shape.
        pub fn try_zeros(&self, shape: impl Into<Shape>, dtype: DType) -> NDArray {
            self.try_full(shape, 0.0, dtype)
        }
    }

    twins! {
        /// An array of ones.
        pub fn ones,
        /// An array of ones, or an error.
        pub fn try_ones(&self, shape: impl Into<Shape>, dtype: DType) -> NDArray {
            self.try_full(shape, 1.0, dtype)
        }
    }

    twins! {
        /// An array filled with `value` (converted to `dtype`).
        pub fn full,
        /// An array filled with `value`, or an error.
        pub fn try_full(&self, shape: impl Into<Shape>, value: f64, dtype: DType) -> NDArray {
            self.make("full", shape.into(), dtype, Location::caller(), |_| value)
        }
    }

    twins! {
        /// `start, start + step, ...` below `stop` (numpy's `arange`), 1-D.
        pub fn arange,
        /// [`NDManager::arange`], or `InvalidArgument` for a zero or non-finite step.
        pub fn try_arange(&self, start: f64, stop: f64, step: f64, dtype: DType) -> NDArray {
            if step == 0.0 || !step.is_finite() || !start.is_finite() || !stop.is_finite() {
                return Err(NdError::invalid(
                    "arange",
                    format!(
                        "start {start}, stop {stop}, step {step}: need finite values and a non-zero step"
                    ),
                ));
            }
            let n = ((stop - start) / step).ceil().max(0.0) as usize;
            self.make("arange", Shape::from([n]), dtype, Location::caller(), |i| {
                start + i as f64 * step
            })
        }
    }

    twins! {
        /// `num` evenly spaced values from `start` to `stop` inclusive, 1-D.
        pub fn linspace,
        /// [`NDManager::linspace`], or an error.
        pub fn try_linspace(&self, start: f64, stop: f64, num: usize, dtype: DType) -> NDArray {
            let step = if num > 1 {
                (stop - start) / (num - 1) as f64
            } else {
                0.0
            };
            self.make(
                "linspace",
                Shape::from([num]),
                dtype,
                Location::caller(),
                |i| {
                    if i + 1 == num && num > 1 {
                        stop
                    } else {
                        start + i as f64 * step
                    }
                },
            )
        }
    }

    twins! {
        /// The `n x n` identity matrix.
        pub fn eye,
        /// [`NDManager::eye`], or an error.
        pub fn try_eye(&self, n: usize, dtype: DType) -> NDArray {
            self.make("eye", Shape::from([n, n]), dtype, Location::caller(), |i| {
                (i / n.max(1) == i % n.max(1)) as u8 as f64
            })
        }
    }

    twins! {
        /// Samples of N(`loc`, `scale`²); seed with [`random::seed`].
        pub fn random_normal,
        /// [`NDManager::random_normal`], or an error (also for a negative or NaN scale).
        pub fn try_random_normal(&self, loc: f64, scale: f64, shape: impl Into<Shape>, dtype: DType) -> NDArray {
            let at = Location::caller();
            let shape = shape.into();
            check_shape("random_normal", &shape, dtype)?;
            #[cfg(feature = "gpu")]
            if let Some(a) = self.random_on_device(shape.size(), &shape, dtype, at, || {
                random::check_normal(loc, scale)?;
                Ok(crate::backend::wgpu::random::Dist::Normal(loc as f32, scale as f32))
            }) {
                return a;
            }
            random::draw_normal(loc, scale, |next| {
                self.make("random_normal", shape, dtype, at, |_| next())
            })?
        }
    }

    twins! {
        /// Samples of U[`low`, `high`).
        pub fn random_uniform,
        /// [`NDManager::random_uniform`], or an error (also when `low > high` or either is
        /// not finite).
        pub fn try_random_uniform(&self, low: f64, high: f64, shape: impl Into<Shape>, dtype: DType) -> NDArray {
            let at = Location::caller();
            let shape = shape.into();
            check_shape("random_uniform", &shape, dtype)?;
            #[cfg(feature = "gpu")]
            if let Some(a) = self.random_on_device(shape.size(), &shape, dtype, at, || {
                random::check_uniform(low, high)?;
                Ok(crate::backend::wgpu::random::Dist::Uniform(low as f32, high as f32))
            }) {
                return a;
            }
            random::draw_uniform(low, high, |next| {
                self.make("random_uniform", shape, dtype, at, |_| next())
            })?
        }
    }

    /// Samples of U[`low`, `high`) (`normal`: N(`low`, `high`)) drawn by the thread's
    /// host generator whatever this manager's device (uploaded to it), so the same seed
    /// gives the same values on every device: what a model's initialisation uses.
    #[track_caller]
    pub(crate) fn try_random_host(
        &self,
        normal: bool,
        (a, b): (f64, f64),
        shape: Shape,
        dtype: DType,
    ) -> Result<NDArray> {
        let at = Location::caller();
        let op = if normal {
            "random_normal"
        } else {
            "random_uniform"
        };
        let n = check_shape(op, &shape, dtype)?;
        let values = if normal {
            random::normal(a, b, n)?
        } else {
            random::uniform(a, b, n)?
        };
        self.make(op, shape, dtype, at, |i| values[i])
    }

    twins! {
        /// Uniform random integers in `[low, high)`.
        pub fn random_integer,
        /// [`NDManager::random_integer`], or an error when `low >= high`.
        pub fn try_random_integer(&self, low: i64, high: i64, shape: impl Into<Shape>, dtype: DType) -> NDArray {
            let at = Location::caller();
            let shape = shape.into();
            let n = check_shape("random_integer", &shape, dtype)?;
            let values = random::integers(low, high, n)?;
            engine::check_manager(self.id)?;
            let buf = dispatch!(dtype, T => new_filled::<T>(n, |out| {
                for (o, &v) in out.iter_mut().zip(&values) {
                    *o = T::from_i64(v);
                }
            }))?;
            Ok(NDArray {
                id: engine::create(self.id, buf, shape, dtype, at)?,
            })
        }
    }

    twins! {
        /// A random permutation of `0..n` as a 1-D I64 array (numpy's
        /// `random.permutation(n)`, PyTorch's `randperm`), for shuffling a data set.
        /// Reproducible under [`random::seed`].
        ///
        /// ```
        /// use ndscope::{NDManager, random};
        /// let m = NDManager::new();
        /// random::seed(3);
        /// let p = m.random_permutation(5).to_vec::<i64>()?;
        /// let mut sorted = p.clone();
        /// sorted.sort();
        /// assert_eq!(sorted, vec![0, 1, 2, 3, 4]);
        /// random::seed(3);
        /// assert_eq!(m.random_permutation(5).to_vec::<i64>()?, p);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn random_permutation,
        /// [`NDManager::random_permutation`], or an error (`InvalidShape` for an `n` whose
        /// array would not fit in memory, `ManagerClosed`/`ManagerCapped`).
        pub fn try_random_permutation(&self, n: usize) -> NDArray {
            let at = Location::caller();
            let shape = Shape::from([n]);
            check_shape("random_permutation", &shape, DType::I64)?;
            engine::check_manager(self.id)?;
            let values = random::permutation(n)?;
            let buf = new_filled::<i64>(n, |out| out.copy_from_slice(&values))?;
            Ok(NDArray {
                id: engine::create(self.id, buf, shape, DType::I64, at)?,
            })
        }
    }

    twins! {
        /// A Bool array of `shape` whose elements are independently true with probability
        /// `p` (PyTorch's `bernoulli`). Reproducible under [`random::seed`].
        ///
        /// ```
        /// use ndscope::NDManager;
        /// let m = NDManager::new();
        /// let b = m.random_bernoulli(1.0, [2, 2]);
        /// assert_eq!(b.to_vec::<bool>()?, vec![true; 4]);
        /// assert_eq!(m.random_bernoulli(0.0, [3]).to_vec::<bool>()?, vec![false; 3]);
        /// # Ok::<(), ndscope::NdError>(())
        /// ```
        pub fn random_bernoulli,
        /// [`NDManager::random_bernoulli`], or an error (`InvalidArgument` for a `p` outside
        /// `[0, 1]` or NaN, `InvalidShape`, `ManagerClosed`/`ManagerCapped`).
        pub fn try_random_bernoulli(&self, p: f64, shape: impl Into<Shape>) -> NDArray {
            self.bernoulli_at("random_bernoulli", p, shape.into(), Location::caller())
        }
    }

    /// A Bool Bernoulli(`p`) array created at `at` (`op` names the caller in errors).
    pub(crate) fn bernoulli_at(
        &self,
        op: &'static str,
        p: f64,
        shape: Shape,
        at: SourceLocation,
    ) -> Result<NDArray> {
        let n = check_shape(op, &shape, DType::Bool)?;
        let bits = random::bernoulli(op, p, n)?;
        engine::check_manager(self.id)?;
        let buf = new_filled::<u8>(n, |out| out.copy_from_slice(&bits))?;
        Ok(NDArray {
            id: engine::create(self.id, buf, shape, DType::Bool, at)?,
        })
    }
}
