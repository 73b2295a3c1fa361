//! [`NDScope`] and [`scope`]: free every array created while a scope is open.
//!
//! Scopes form a per-thread stack. Every array created on a thread while a scope is
//! its innermost open scope is registered there, whatever its manager; closing the
//! scope releases that registration, which frees the array unless something else
//! holds a reference (an outer scope it escaped to, or a `retain()`). Arrays returned
//! from [`scope`] move to the enclosing scope, like TensorFlow.js `tf.tidy`.
//!
//! ```
//! use ndscope::{DType, NDManager};
//! let m = NDManager::new();
//! let x = m.ones([3], DType::F32);
//! let y = ndscope::scope(|| {
//!     let t = x * 3.0;  // freed when the scope closes
//!     t + 1.0           // returned: escapes to the enclosing scope (here: none)
//! });
//! assert_eq!(y.to_vec::<f32>()?, vec![4.0; 3]);
//! assert_eq!(m.memory().live_arrays, 2); // x and y; t is gone
//! # Ok::<(), ndscope::NdError>(())
//! ```

use crate::diag::MemoryStats;
use crate::engine::{self, Resource, ScopeId};
use crate::error::{twins, unwrap};
use crate::{NDArray, NDManager, NdError};
use std::collections::{BTreeMap, HashMap};
use std::marker::PhantomData;
use std::panic::Location;

/// A scope guard: arrays created on this thread while it is the innermost open scope
/// are freed when it is dropped (or [`NDScope::close`]d).
///
/// Scopes close in LIFO order; closing an outer scope first closes the inner ones. A
/// scope belongs to the thread that opened it: `NDScope` is not `Send`, so it cannot be
/// closed from another thread.
///
/// ```compile_fail
/// let s = ndscope::NDScope::new();
/// std::thread::spawn(move || drop(s)); // NDScope is !Send
/// ```
pub struct NDScope {
    id: ScopeId,
    _not_send: PhantomData<*const ()>,
}

impl NDScope {
    /// Open a scope on this thread; it becomes the innermost one.
    #[track_caller]
    #[allow(clippy::new_without_default)]
    pub fn new() -> NDScope {
        let id = engine::open_scope(Location::caller());
        NDScope {
            id,
            _not_send: PhantomData,
        }
    }

    /// The engine's id of this scope.
    pub(crate) fn id(&self) -> ScopeId {
        self.id
    }

    twins! {
        /// Move `array` from this scope to the enclosing scope (or out of every scope when
        /// this is the outermost). Arrays not registered in this scope are left alone.
        /// Returns the array for chaining.
        pub fn escape,
        /// [`NDScope::escape`], or `Closed` for a freed array.
        pub fn try_escape(&self, array: NDArray) -> NDArray {
            engine::escape(self.id, array.id)?;
            Ok(array)
        }
    }

    twins! {
        /// Register an array created elsewhere in this scope too (DJL's `NDScope.register`:
        /// one more reference; the scope's close releases it). Registering an array this
        /// scope already holds does nothing. Ownership does not change (to move an array
        /// to another manager, see [`NDArray::attach`]).
        pub fn register,
        /// [`NDScope::register`], or `Closed`.
        pub fn try_register(&self, array: NDArray) -> NDArray {
            engine::register(self.id, array.id)?;
            Ok(array)
        }
    }

    /// Remove `array` from every scope (DJL's `NDScope.unregister`): only its manager
    /// owns it then. Same as [`NDArray::keep`].
    #[track_caller]
    pub fn unregister(array: NDArray) -> NDArray {
        unwrap(engine::unregister_all(array.id));
        array
    }

    /// Close a resource when this scope closes (after its arrays are freed). If the
    /// scope is closed already, the resource is closed at once.
    pub fn attach_resource(&self, resource: impl Resource + 'static) {
        let r = engine::scope_add_resource(self.id, Box::new(resource));
        if let Err(mut r) = r {
            r.close();
        }
    }

    /// The arrays registered in this scope now.
    pub fn arrays(&self) -> Vec<NDArray> {
        engine::scope_arrays(self.id)
            .into_iter()
            .map(|id| NDArray { id })
            .collect()
    }

    /// Counters for the arrays registered in this scope (`peak_bytes` is their current
    /// bytes; buffers shared by several of them count once).
    pub fn memory(&self) -> MemoryStats {
        MemoryStats::from_stats(engine::scope_stats(self.id))
    }

    /// Whether the scope is still open.
    pub fn is_open(&self) -> bool {
        engine::scope_opened_at(self.id).is_some()
    }

    /// Where the scope was opened.
    pub fn opened_at(&self) -> Option<&'static Location<'static>> {
        engine::scope_opened_at(self.id)
    }

    /// Close the scope now (and any scope opened inside it that is still open): frees
    /// its arrays, then closes its resources.
    #[track_caller]
    pub fn close(self) {
        self.close_at(Some(Location::caller()));
        std::mem::forget(self);
    }

    fn close_at(&self, at: Option<&'static Location<'static>>) {
        let resources = engine::close_scope(self.id, at);
        match resources {
            Ok(r) => engine::close_resources(r),
            // Unreachable for a !Send guard on its own thread; never panic in drop.
            Err(e) => log::error!("ndscope: {e}"),
        }
    }
}

impl Drop for NDScope {
    fn drop(&mut self) {
        self.close_at(None);
    }
}

impl std::fmt::Debug for NDScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.opened_at() {
            Some(at) => write!(f, "NDScope(opened at {at})"),
            None => write!(f, "NDScope(closed)"),
        }
    }
}

/// Run `f` in a new scope. Arrays created inside are freed when it returns, except
/// those reachable from its return value, which move to the enclosing scope (one
/// level). The return value can be any [`Escape`] type: arrays, tuples, `Vec`s,
/// `Option`s, `Result`s, maps, plain values, your own types. A panic inside `f` still
/// frees the scope's arrays.
#[track_caller]
pub fn scope<R: Escape>(f: impl FnOnce() -> R) -> R {
    let at = Location::caller();
    let s = NDScope::new();
    let r = f();
    // Collect first: `visit_arrays` is user code, which must not run under the engine
    // lock (it may use ndscope, or panic before every array was visited).
    let mut arrays = smallvec::SmallVec::<[NDArray; 4]>::new();
    r.visit_arrays(&mut |a| arrays.push(a));
    for a in arrays {
        let _ = engine::escape(s.id, a.id);
    }
    s.close_at(Some(at));
    std::mem::forget(s);
    r
}

impl NDArray {
    /// Remove this array from every scope: it lives until its manager closes (or an
    /// explicit close/release). Same as [`NDScope::unregister`].
    #[track_caller]
    pub fn keep(self) -> NDArray {
        NDScope::unregister(self)
    }
}

/// Types whose values may hold arrays: lets [`scope`] find the arrays in its return
/// value and move them to the enclosing scope.
///
/// Implement it for your own types by visiting every array field, or with
/// [`impl_escape!`](crate::impl_escape):
///
/// ```
/// use ndscope::{DType, Escape, NDArray, NDManager};
/// struct Params { w: NDArray, b: NDArray, lr: f32 }
/// ndscope::impl_escape!(Params { w, b });
///
/// let m = NDManager::new();
/// let p = ndscope::scope(|| Params {
///     w: m.zeros([2], DType::F32),
///     b: m.zeros([1], DType::F32),
///     lr: 0.1,
/// });
/// assert!(!p.w.is_closed() && !p.b.is_closed());
/// ```
pub trait Escape {
    /// Call `f` on every array this value holds.
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray));
}

/// Implement [`Escape`] for a struct by listing its fields that hold arrays (each field
/// must itself implement `Escape`).
#[macro_export]
macro_rules! impl_escape {
    ($ty:ident { $($field:ident),* $(,)? }) => {
        impl $crate::Escape for $ty {
            fn visit_arrays(&self, f: &mut dyn FnMut($crate::NDArray)) {
                $( $crate::Escape::visit_arrays(&self.$field, f); )*
            }
        }
    };
}

impl Escape for NDArray {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        f(*self)
    }
}

macro_rules! plain {
    ($($t:ty),*) => {
        $(impl Escape for $t {
            fn visit_arrays(&self, _: &mut dyn FnMut(NDArray)) {}
        })*
    };
}
plain!(
    (),
    bool,
    char,
    u8,
    u16,
    u32,
    u64,
    u128,
    usize,
    i8,
    i16,
    i32,
    i64,
    i128,
    isize,
    f32,
    f64,
    String,
    &str,
    NdError,
    NDManager,
    crate::Shape,
    crate::DType,
    MemoryStats
);

impl<T: Escape + ?Sized> Escape for Box<T> {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        (**self).visit_arrays(f)
    }
}

impl<T: Escape> Escape for Vec<T> {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        self.iter().for_each(|x| x.visit_arrays(f))
    }
}

impl<T: Escape> Escape for [T] {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        self.iter().for_each(|x| x.visit_arrays(f))
    }
}

impl<T: Escape, const N: usize> Escape for [T; N] {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        self.iter().for_each(|x| x.visit_arrays(f))
    }
}

impl<T: Escape> Escape for Option<T> {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        if let Some(x) = self {
            x.visit_arrays(f)
        }
    }
}

impl<T: Escape, E: Escape> Escape for std::result::Result<T, E> {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        match self {
            Ok(x) => x.visit_arrays(f),
            Err(e) => e.visit_arrays(f),
        }
    }
}

impl<K, V: Escape, S> Escape for HashMap<K, V, S> {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        self.values().for_each(|x| x.visit_arrays(f))
    }
}

impl<K, V: Escape> Escape for BTreeMap<K, V> {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        self.values().for_each(|x| x.visit_arrays(f))
    }
}

macro_rules! tuple {
    ($($name:ident),+) => {
        impl<$($name: Escape),+> Escape for ($($name,)+) {
            #[allow(non_snake_case)]
            fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
                let ($($name,)+) = self;
                $($name.visit_arrays(f);)+
            }
        }
    };
}
tuple!(A);
tuple!(A, B);
tuple!(A, B, C);
tuple!(A, B, C, D);
tuple!(A, B, C, D, E);
tuple!(A, B, C, D, E, F);
tuple!(A, B, C, D, E, F, G);
tuple!(A, B, C, D, E, F, G, H);
tuple!(A, B, C, D, E, F, G, H, I);
tuple!(A, B, C, D, E, F, G, H, I, J);
tuple!(A, B, C, D, E, F, G, H, I, J, K);
tuple!(A, B, C, D, E, F, G, H, I, J, K, L);

/// A list of arrays that closes them all as one [`Resource`] (attach it to a manager
/// or scope), and escapes them all from a [`scope`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NDList(pub Vec<NDArray>);

impl NDList {
    /// An empty list.
    pub fn new() -> Self {
        NDList(Vec::new())
    }
}

impl std::ops::Deref for NDList {
    type Target = Vec<NDArray>;
    fn deref(&self) -> &Vec<NDArray> {
        &self.0
    }
}

impl std::ops::DerefMut for NDList {
    fn deref_mut(&mut self) -> &mut Vec<NDArray> {
        &mut self.0
    }
}

impl From<Vec<NDArray>> for NDList {
    fn from(v: Vec<NDArray>) -> Self {
        NDList(v)
    }
}

impl Resource for NDList {
    #[track_caller]
    fn close(&mut self) {
        self.0.iter().for_each(|a| a.close());
    }
}

impl Escape for NDList {
    fn visit_arrays(&self, f: &mut dyn FnMut(NDArray)) {
        self.0.visit_arrays(f)
    }
}

impl Resource for NDManager {
    #[track_caller]
    fn close(&mut self) {
        NDManager::close(self)
    }
}
