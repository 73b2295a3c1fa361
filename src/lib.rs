//! # ndscope
//!
//! N-dimensional arrays whose memory is released deterministically.
//!
//! * **Arrays are `Copy` handles** ([`NDArray`]): `a + b * c` just works, no `&`, no
//!   `.clone()`, no `?` on every op (each op also has a `try_*` form returning
//!   [`NdError`]).
//! * **Every array has one owner**, an [`NDManager`] in a tree rooted at
//!   [`NDManager::system()`]. An op's result belongs to its first input's manager.
//!   Closing a manager frees its arrays and closes its sub-managers.
//! * **Scopes free what a block created** ([`NDScope`], [`scope()`]): every array created
//!   on a thread while a scope is open is registered in it and freed when it closes,
//!   whatever its manager, so a training loop's intermediates (`grad * lr`) cannot pile
//!   up in a long-lived manager. Returned arrays escape to the enclosing scope.
//!   [`scope_async`] gives an async task a scope that follows it across `.await`s and
//!   worker threads, freed when the task completes, is cancelled or panics.
//! * **Reference counts keep what must survive** ([`NDArray::retain`] /
//!   [`NDArray::release`]), JavaCPP-style.
//! * **Diagnostics say what went wrong**: use of a freed array is an error naming the
//!   array, the line that created it, and where and why it was freed; [`memory()`] and
//!   [`NDManager::memory`] say where live memory sits.
//!
//! ```
//! use ndscope::{DType, NDManager, NDScope, NdError};
//! let m = NDManager::new();
//! let w = m.ones([2, 2], DType::F32);
//! for _step in 0..3 {
//!     let _s = NDScope::new();               // frees this iteration's temporaries
//!     let grad = w * 0.5 + 1;
//!     w.try_subi(grad * 0.1)?;               // in-place update of a long-lived array
//! }
//! assert_eq!(m.memory().live_arrays, 1);      // only w is left
//!
//! let t = ndscope::scope(|| w * 2.0);        // escapes: the caller owns it
//! t.close();
//! let err = t.try_add(1.0).unwrap_err();     // `t + 1.0` would panic with this message
//! assert!(err.to_string().contains("was closed at"));
//! # Ok::<(), NdError>(())
//! ```
//!
//! ## Tour
//!
//! ### Managers own arrays
//!
//! ```
//! use ndscope::{DType, NDManager};
//! let model = NDManager::new();                 // child of the system manager
//! let layer = model.new_sub_manager();
//! let w = layer.random_normal(0.0, 0.01, [3, 2], DType::F32);
//! let x = model.ones([4, 3], DType::F32);
//! let y = x.matmul(w);                          // owned by x's manager: `model`
//! assert_eq!(y.manager(), model);
//! assert_eq!(model.memory().live_arrays, 3);    // counts include sub-managers
//! model.close();                                // frees x, y and (via layer) w
//! assert!(w.is_closed());
//! ```
//!
//! ### Scopes free intermediates; returned arrays escape one level
//!
//! ```
//! use ndscope::{DType, NDManager, NDScope};
//! let m = NDManager::new();
//! let x = m.arange(0.0, 4.0, 1.0, DType::F64);
//! let (total, squares) = ndscope::scope(|| {
//!     let sq = x.square();                      // escapes (returned)
//!     let t = sq.sum();                         // escapes (returned)
//!     let _tmp = sq * 2.0;                      // freed when the scope closes
//!     (t, sq)
//! });
//! assert_eq!(total.to_scalar::<f64>()?, 14.0);
//! assert_eq!(m.memory().live_arrays, 3);        // x, squares, total
//!
//! let outer = NDScope::new();
//! let kept = {
//!     let inner = NDScope::new();
//!     let k = x + 1.0;
//!     inner.escape(k)                           // moves to `outer`
//! };
//! assert!(!kept.is_closed());
//! drop(outer);                                  // now it is freed
//! assert!(kept.is_closed());
//! # let _ = squares;
//! # Ok::<(), ndscope::NdError>(())
//! ```
//!
//! ### Reference counts and `keep`
//!
//! ```
//! use ndscope::{DType, NDManager, NDScope};
//! let m = NDManager::new();
//! let (a, b) = {
//!     let _s = NDScope::new();
//!     let a = m.zeros([2], DType::F32);
//!     a.retain();                               // count 2: registration + retain
//!     let b = m.ones([2], DType::F32).keep();   // leaves every scope
//!     (a, b)
//! };
//! assert!(!a.is_closed() && !b.is_closed());    // both survived the scope
//! assert!(a.release());                         // last reference: freed
//! m.close();                                    // b dies with its manager
//! assert!(b.is_closed());
//! ```
//!
//! ### Where is my memory? Why was this closed?
//!
//! ```
//! use ndscope::{DType, NDManager, NDScope};
//! let m = NDManager::new();
//! let w = m.ones([8], DType::F32);
//! for _ in 0..5 {
//!     let _grad_times_lr = w * 0.01;            // no scope: piles up in `m`
//! }
//! let report = m.leak_report();                 // grouped by creating line
//! assert_eq!(report.sites[0].count, 5);
//! println!("{report}\n{}", m.debug_dump());
//!
//! let t = { let _s = NDScope::new(); w * 2.0 };
//! let err = t.try_exp().unwrap_err();
//! // "use of a closed array: array #.. f32[8] (created at src/lib.rs:..) was closed
//! //  by close of the scope opened at src/lib.rs:.. (guard dropped)"
//! assert!(err.to_string().contains("close of the scope opened at"));
//!
//! let (_y, profile) = ndscope::profile(|| (w * 2.0).sum());
//! assert_eq!(profile.ops.len(), 2);
//! ```
//!
//! ### Autograd
//!
//! ```
//! use ndscope::{DType, GradientCollector, NDManager, NDScope};
//! let params = NDManager::new();
//! let w = params.create(&[1.0f32, -2.0], [2, 1]).set_requires_gradient(true);
//! let x = params.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
//! for _step in 0..3 {
//!     let _s = NDScope::new();                  // frees the step's intermediates
//!     {
//!         let gc = GradientCollector::new();    // zeroes the gradients, records ops
//!         let loss = x.matmul(w).square().sum();
//!         gc.backward(loss)?;
//!     }
//!     let mut w = w;
//!     w -= w.gradient() * 0.01;                 // `gradient()` is the same handle every time
//! }
//! assert_eq!(params.memory().live_arrays, 3);   // w, its gradient, x
//! # Ok::<(), ndscope::NdError>(())
//! ```
//!
//! ### Training a model: `nn`, `optim`, `data`, `io`
//!
//! A model's parameters live in a sub-manager of their own ([`nn`]), an optimizer's
//! state in another ([`optim`]); each step's intermediates, the batch included
//! ([`data::Batches`]), live in the step's scope, so memory stays flat however long
//! training runs. [`io`] saves and loads named arrays (safetensors, npy, npz) and
//! checkpoints; [`no_grad`] runs code unrecorded (evaluation).
//!
//! ```
//! use ndscope::nn::{Linear, Module, Relu, Sequential};
//! use ndscope::optim::{Adam, AdamConfig, Optimizer};
//! use ndscope::{DType, GradientCollector, NDManager, NDScope, data::Batches};
//! ndscope::random::seed(0);
//! let m = NDManager::new();
//! let x = m.random_normal(0.0, 1.0, [64, 4], DType::F32);
//! let y = x.sum_axes(&[1], false).gt(0.0).to_dtype(DType::I64); // class 0 or 1
//! let model = Sequential::new(&m)
//!     .add_with(|mm| Linear::new(mm, 4, 16))
//!     .add(Relu::new())
//!     .add_with(|mm| Linear::new(mm, 16, 2));
//! let mut opt = Adam::new(&m, &model.parameters(), AdamConfig { lr: 0.05, ..AdamConfig::default() });
//! let batches = Batches::new(&[x, y], 16).shuffle(1);
//! let live = m.memory().live_bytes;
//! for _epoch in 0..20 {
//!     let mut it = batches.iter();
//!     loop {
//!         let _step = NDScope::new();                // frees this step's arrays
//!         let Some(b) = it.next() else { break };
//!         {
//!             let gc = GradientCollector::new();
//!             gc.backward(model.forward(b[0]).cross_entropy(b[1]))?;
//!         }
//!         opt.step();                                // in place, no allocation
//!     }
//!     assert_eq!(m.memory().live_bytes, live);       // flat
//! }
//! let accuracy = ndscope::no_grad(|| {
//!     let pred = model.forward(x).argmax_axis(1, false);
//!     pred.eq(y).to_dtype(DType::F32).mean().to_scalar::<f32>()
//! })?;
//! assert!(accuracy > 0.9, "{accuracy}");
//! # Ok::<(), ndscope::NdError>(())
//! ```
//!
//! ### Errors and panics
//!
//! Every op has a `try_*` form returning [`Result`]`<NDArray, NdError>`; the operator
//! or plain method panics with exactly the error's message. [`NdError`] variants carry
//! structured fields (the arrays involved, with their creating lines).
//!
//! ## Layers
//!
//! ```text
//! handle   NDArray, NDManager, NDScope: Copy ids; ops check their inputs
//!   │      (nn, optim, io and data are built on this public API)
//! engine   ids, records, shards, managers, scopes, tasks: the ownership model
//!   │      and the op path (resolve the inputs, run a kernel, register the result)
//! backend  buffers, layouts, dtypes: device memory and the kernels on it
//!   │      (the CPU today); knows nothing of records, managers or scopes
//! kernel   loops over plain slices and a layout
//! ```
//!
//! Each layer calls only the one below it. Every ownership rule is kept by the engine,
//! so a backend inherits the whole contract (docs/ownership.md, "Layers").
//!
//! ## The ownership model
//!
//! The full contract (eleven numbered rules, which the tests cite, plus accounting and
//! threads) is the [`ownership`] module, `docs/ownership.md` in the repository.
#![warn(missing_docs)]

mod adapters;
mod array;
mod autograd;
mod backend;
pub mod config;
pub mod data;
mod device;
mod diag;
mod dtype;
mod engine;
mod error;
pub(crate) mod ext;
pub mod io;
mod layout;
mod manager;
pub mod nn;
mod opkind;
pub mod optim;
#[doc = include_str!("../docs/ownership.md")]
pub mod ownership {}
pub mod random;
mod scope;
mod shape;
pub mod task;

pub use adapters::{devices, synchronize};
pub use array::{NDArray, Rhs};
pub use autograd::{GradientCollector, no_grad};
pub use device::{Device, DeviceInfo};
pub use diag::{
    CacheStats, LeakReport, LeakSite, LeakWarning, LeakWatch, MemoryStats, OpRecord, Profile,
    assert_no_leaks, cache_stats, check_leaks, driver_memory, empty_cache, leak_report, memory,
    memory_on, profile, reset_peak, set_cache_limit,
};
pub use dtype::{DType, Element, Scalar, ScalarValue};
pub use engine::{CountingAllocator, Resource};
pub use error::{ArrayDesc, CloseReason, ClosedInfo, NdError, Result, SourceLocation, TaskEnd};
pub use manager::NDManager;
pub use scope::{Escape, NDList, NDScope, scope};
pub use shape::Shape;
pub use task::{TaskScope, scope_async, task_memory};

/// The README's examples, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
