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
//! * **Scopes free what a block created** ([`NDScope`], [`scope`]): every array created
//!   on a thread while a scope is open is registered in it and freed when it closes,
//!   whatever its manager, so a training loop's intermediates (`grad * lr`) cannot pile
//!   up in a long-lived manager. Returned arrays escape to the enclosing scope.
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
//! See `DESIGN.md` in the repository for the full ownership model.
#![warn(missing_docs)]

mod array;
mod diag;
mod dtype;
mod engine;
mod error;
mod manager;
pub mod random;
mod scope;
mod shape;

pub use array::{NDArray, Rhs};
pub use diag::{
    CacheStats, LeakReport, LeakSite, LeakWarning, LeakWatch, MemoryStats, OpRecord, Profile,
    assert_no_leaks, cache_stats, check_leaks, config, empty_cache, leak_report, memory, profile,
    reset_peak, set_cache_limit,
};
pub use dtype::{DType, Element, Scalar, ScalarValue};
pub use engine::{CountingAllocator, Resource};
pub use error::{ArrayDesc, CloseReason, ClosedInfo, NdError, Result, SourceLocation};
pub use manager::NDManager;
pub use scope::{Escape, NDList, NDScope, scope};
pub use shape::Shape;

/// The README's examples, compiled and run as doctests so they stay true.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
