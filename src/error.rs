//! [`NdError`]: every way an ndscope call can fail, with structured fields.
//!
//! Every fallible function has a `try_*` form returning [`Result`]; its panicking twin
//! panics with exactly the error's `Display` text.

use crate::{DType, Device, Shape};
use std::fmt;
use std::panic::Location;
use std::sync::Arc;

/// `Result` with [`NdError`].
pub type Result<T, E = NdError> = std::result::Result<T, E>;

/// A source location recorded by `#[track_caller]`.
pub type SourceLocation = &'static Location<'static>;

/// Identifies an array in error messages: uid, shape, dtype and creating line.
#[derive(Clone, Debug, PartialEq)]
pub struct ArrayDesc {
    /// The array's unique id ([`crate::NDArray::uid`]).
    pub uid: u64,
    /// Its shape.
    pub shape: Shape,
    /// Its dtype.
    pub dtype: DType,
    /// Where it was created.
    pub created_at: SourceLocation,
}

impl fmt::Display for ArrayDesc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "array #{} {}{} (created at {})",
            self.uid, self.dtype, self.shape, self.created_at
        )
    }
}

/// Why an array was freed.
#[derive(Clone, Debug, PartialEq)]
pub enum CloseReason {
    /// `close()` was called on it.
    Explicit,
    /// Its last reference was given up by `release()`.
    Release,
    /// The scope it was registered in closed.
    ScopeClose {
        /// Where that scope was opened.
        opened_at: SourceLocation,
    },
    /// Its owning manager closed.
    ManagerClose {
        /// The manager's name.
        manager: String,
    },
    /// The scope of an async task ([`crate::scope_async`]) it was registered in closed.
    TaskScopeClose {
        /// Where `scope_async` was called.
        opened_at: SourceLocation,
        /// How the task ended.
        end: TaskEnd,
    },
}

/// How an async task's scope ([`crate::scope_async`]) ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TaskEnd {
    /// The future completed; its output escaped one level.
    Completed,
    /// The future was dropped before completing (a timeout, an abort, a `select!`
    /// branch not taken, a runtime shutting down).
    Cancelled,
    /// A poll of the future panicked.
    Panicked,
}

impl fmt::Display for TaskEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TaskEnd::Completed => "completed",
            TaskEnd::Cancelled => "cancelled",
            TaskEnd::Panicked => "panicked",
        })
    }
}

impl fmt::Display for CloseReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CloseReason::Explicit => write!(f, "explicit close()"),
            CloseReason::Release => write!(f, "release() of its last reference"),
            CloseReason::ScopeClose { opened_at } => {
                write!(f, "close of the scope opened at {opened_at}")
            }
            CloseReason::ManagerClose { manager } => write!(f, "close of manager '{manager}'"),
            CloseReason::TaskScopeClose { opened_at, end } => {
                write!(
                    f,
                    "close of the async task scope opened at {opened_at} ({end})"
                )
            }
        }
    }
}

/// Everything known about a freed array, carried by [`NdError::Closed`].
#[derive(Clone, Debug, PartialEq)]
pub struct ClosedInfo {
    /// The array as it was.
    pub array: ArrayDesc,
    /// The device its data lived on.
    pub device: crate::Device,
    /// Where the freeing call was made; `None` when a scope guard was dropped (drop
    /// glue has no caller location: the reason then names the scope's opening line)
    /// and when an async task's scope closed (the reason names its `scope_async` line).
    pub closed_at: Option<SourceLocation>,
    /// Why it was freed.
    pub reason: CloseReason,
    /// Backtrace at creation (verbose mode only).
    pub created_backtrace: Option<Arc<str>>,
    /// Backtrace at close (verbose mode only).
    pub closed_backtrace: Option<Arc<str>>,
}

impl fmt::Display for ClosedInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.array)?;
        if self.device != crate::Device::Cpu {
            write!(f, " on {}", self.device)?;
        }
        match self.closed_at {
            Some(at) => write!(f, " was closed at {at} by {}", self.reason)?,
            // A task's scope closes when its future ends, not through a guard.
            None if matches!(self.reason, CloseReason::TaskScopeClose { .. }) => {
                write!(f, " was closed by {}", self.reason)?
            }
            None => write!(f, " was closed by {} (guard dropped)", self.reason)?,
        }
        match (&self.created_backtrace, &self.closed_backtrace) {
            (None, None) => write!(
                f,
                " (set NDSCOPE_VERBOSE=1 or ndscope::config::set_verbose(true) for backtraces)"
            ),
            (c, d) => {
                if let Some(c) = c {
                    write!(f, "\n--- created at ---\n{c}")?;
                }
                if let Some(d) = d {
                    write!(f, "\n--- closed at ---\n{d}")?;
                }
                Ok(())
            }
        }
    }
}

/// The error type of every fallible ndscope call.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum NdError {
    // ---- lifetime errors ----
    /// The array was freed; says which array, where it was created and where and why
    /// it was freed.
    #[error("use of a closed array: {0}")]
    Closed(Box<ClosedInfo>),
    /// A freed array whose record has since been recycled (only its id is known).
    #[error("use of a closed array #{uid} (its details are no longer retained)")]
    ClosedUnknown {
        /// The stale id.
        uid: u64,
    },
    /// The manager is closed.
    #[error("manager '{name}' is closed")]
    ManagerClosed {
        /// Its name when it closed.
        name: String,
    },
    /// The manager was capped and takes no new arrays.
    #[error("manager '{name}' is capped: it takes no new arrays")]
    ManagerCapped {
        /// Its name.
        name: String,
    },
    /// A scope was used from a thread other than the one that opened it, or closed out of
    /// its thread's order in a way that cannot be honoured.
    #[error("scope error: {msg}")]
    Scope {
        /// What went wrong.
        msg: String,
    },

    // ---- shape errors ----
    /// Two shapes cannot be broadcast together.
    #[error("{op}: shapes {} and {} cannot be broadcast ({lhs}; {rhs})", lhs.shape, rhs.shape)]
    ShapeMismatch {
        /// The operation.
        op: &'static str,
        /// Left operand.
        lhs: Box<ArrayDesc>,
        /// Right operand.
        rhs: Box<ArrayDesc>,
    },
    /// A shape is invalid for the operation (wrong element count, overflow, ...).
    #[error("{op}: invalid shape: {msg}")]
    InvalidShape {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// An axis is out of range.
    #[error("{op}: axis {axis} is out of range for {array}")]
    AxisOutOfRange {
        /// The operation.
        op: &'static str,
        /// The requested axis.
        axis: isize,
        /// The array.
        array: Box<ArrayDesc>,
    },
    /// An index or slice is invalid.
    #[error("{op}: {msg} for {array}")]
    Index {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        msg: String,
        /// The array.
        array: Box<ArrayDesc>,
    },

    // ---- dtype errors ----
    /// Operands have different dtypes.
    #[error("{op}: dtype mismatch {} vs {} ({lhs}; {rhs})", lhs.dtype, rhs.dtype)]
    DTypeMismatch {
        /// The operation.
        op: &'static str,
        /// Left operand.
        lhs: Box<ArrayDesc>,
        /// Right operand.
        rhs: Box<ArrayDesc>,
    },
    /// The operation is not defined for this dtype.
    #[error("{op} is not defined for dtype {dtype} ({array})")]
    UnsupportedDType {
        /// The operation.
        op: &'static str,
        /// The dtype.
        dtype: DType,
        /// The array.
        array: Box<ArrayDesc>,
    },
    /// A device cannot hold the dtype: a GPU whose adapter does not offer 64-bit
    /// integers or floats in its shaders (wgpu's `SHADER_INT64`, `SHADER_F64`) has no
    /// I64 or F64 arrays. Nothing was allocated. (`UnsupportedDType` names an array,
    /// and here there may be none yet: a manager creating on the device.)
    #[error(
        "{op}: {device} cannot hold {dtype} arrays (its adapter does not offer {dtype} in shaders)"
    )]
    UnsupportedDTypeOn {
        /// The operation.
        op: &'static str,
        /// The dtype.
        dtype: DType,
        /// The device.
        device: Device,
    },
    /// A Rust element type does not match the array's dtype.
    #[error("{op}: requested {requested} but the array holds {}: {array}", array.dtype)]
    ElementType {
        /// The operation.
        op: &'static str,
        /// The requested dtype.
        requested: DType,
        /// The array.
        array: Box<ArrayDesc>,
    },

    // ---- resource errors ----
    /// An allocation failed or is larger than the address space (on a GPU: after the
    /// device's cache was emptied and the allocation tried once more).
    #[error("out of memory on {device}: cannot allocate {bytes} bytes")]
    OutOfMemory {
        /// Requested bytes.
        bytes: usize,
        /// Where the memory was asked for.
        device: crate::Device,
    },
    /// Any other invalid argument.
    #[error("{op}: {msg}")]
    InvalidArgument {
        /// The operation.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },

    // ---- device errors ----
    /// An op's inputs are on different devices. Nothing was allocated: move one with
    /// [`NDArray::to_device`](crate::NDArray::to_device) (there is never a silent copy).
    #[error("{op}: {lhs} is on {lhs_device} but {rhs} is on {rhs_device}")]
    DeviceMismatch {
        /// The op.
        op: &'static str,
        /// The first input.
        lhs: Box<ArrayDesc>,
        /// Its device.
        lhs_device: Device,
        /// The input on another device.
        rhs: Box<ArrayDesc>,
        /// Its device.
        rhs_device: Device,
    },
    /// No such device here (see [`devices`](crate::devices)).
    #[error("no device {device}: this process found {gpus} GPU(s) (see ndscope::devices())")]
    NoDevice {
        /// The device asked for.
        device: Device,
        /// How many GPUs there are.
        gpus: usize,
    },
    /// The op has no kernel on that device yet.
    #[error("{op} has no kernel on {device} yet")]
    Unsupported {
        /// The op.
        op: &'static str,
        /// The device.
        device: Device,
    },

    // ---- file errors (`ndscope::io`, `ndscope::data`) ----
    /// The operating system could not read or write a file (not found, a directory,
    /// permission denied, disk full, ...).
    #[error("{op}: {}: {msg}", path.display())]
    Io {
        /// The operation (`load_npy`, `save_safetensors`, ...).
        op: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// The operating system's message.
        msg: String,
        /// The operating system's error kind.
        kind: std::io::ErrorKind,
    },
    /// A file was read but its contents are not what the operation needs: not the
    /// format (bad magic, a malformed header, truncated data), a dtype ndscope has
    /// no counterpart for, or (for `io::load_into`) a name, shape
    /// or dtype that does not match the arrays to fill.
    #[error("{op}: {}: {msg}", path.display())]
    Format {
        /// The operation.
        op: &'static str,
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        msg: String,
    },
}

impl NdError {
    /// The close reason, when this is a use-after-close error with details.
    pub fn close_reason(&self) -> Option<&CloseReason> {
        match self {
            NdError::Closed(info) => Some(&info.reason),
            _ => None,
        }
    }

    pub(crate) fn invalid(op: &'static str, msg: impl Into<String>) -> Self {
        NdError::InvalidArgument {
            op,
            msg: msg.into(),
        }
    }

    pub(crate) fn shape(op: &'static str, msg: impl Into<String>) -> Self {
        NdError::InvalidShape {
            op,
            msg: msg.into(),
        }
    }
}

/// Unwrap or panic with exactly the error's message, at the caller's location.
#[track_caller]
pub(crate) fn unwrap<T>(r: Result<T>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => panic!("{e}"),
    }
}

/// Define a fallible method `try_x` and its panicking twin `x` from one body: the twin
/// calls `try_x` and panics with exactly the error's message ([`unwrap`]), at the
/// caller's line (both are `#[track_caller]`, so `Location::caller()` inside the body
/// is the user's line whichever form was called).
///
/// ```ignore
/// twins! {
///     /// The panicking form's docs.
///     pub fn matmul,
///     /// The `try_` form's docs (its errors).
///     pub fn try_matmul(self, rhs: NDArray) -> NDArray {
///         matmul_impl(self, rhs, Location::caller())
///     }
/// }
/// ```
///
/// The body returns `Result<T>`; the twin returns `T`. The receiver is `self` or
/// `&self` (with at most one generic parameter, written `try_x<T: Bound>`), or none
/// for an associated function (the twin calls `Self::try_x`); each invocation may
/// hold several pairs.
macro_rules! twins {
    () => {};
    (
        $(#[$pm:meta])*
        $vis:vis fn $name:ident,
        $(#[$tm:meta])*
        $tvis:vis fn $try_name:ident($self:ident $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty $body:block
        $($rest:tt)*
    ) => {
        $(#[$pm])*
        #[track_caller]
        #[inline]
        $vis fn $name($self $(, $arg: $ty)*) -> $ret {
            $crate::error::unwrap($self.$try_name($($arg),*))
        }

        $(#[$tm])*
        #[track_caller]
        $tvis fn $try_name($self $(, $arg: $ty)*) -> $crate::error::Result<$ret> $body

        $crate::error::twins! { $($rest)* }
    };
    (
        $(#[$pm:meta])*
        $vis:vis fn $name:ident,
        $(#[$tm:meta])*
        $tvis:vis fn $try_name:ident(&$self:ident $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty $body:block
        $($rest:tt)*
    ) => {
        $(#[$pm])*
        #[track_caller]
        #[inline]
        $vis fn $name(&$self $(, $arg: $ty)*) -> $ret {
            $crate::error::unwrap($self.$try_name($($arg),*))
        }

        $(#[$tm])*
        #[track_caller]
        $tvis fn $try_name(&$self $(, $arg: $ty)*) -> $crate::error::Result<$ret> $body

        $crate::error::twins! { $($rest)* }
    };
    (
        $(#[$pm:meta])*
        $vis:vis fn $name:ident,
        $(#[$tm:meta])*
        $tvis:vis fn $try_name:ident<$gp:ident: $gb:path>(&$self:ident $(, $arg:ident: $ty:ty)* $(,)?) -> $ret:ty $body:block
        $($rest:tt)*
    ) => {
        $(#[$pm])*
        #[track_caller]
        #[inline]
        $vis fn $name<$gp: $gb>(&$self $(, $arg: $ty)*) -> $ret {
            $crate::error::unwrap($self.$try_name($($arg),*))
        }

        $(#[$tm])*
        #[track_caller]
        $tvis fn $try_name<$gp: $gb>(&$self $(, $arg: $ty)*) -> $crate::error::Result<$ret> $body

        $crate::error::twins! { $($rest)* }
    };
    (
        $(#[$pm:meta])*
        $vis:vis fn $name:ident,
        $(#[$tm:meta])*
        $tvis:vis fn $try_name:ident($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block
        $($rest:tt)*
    ) => {
        $(#[$pm])*
        #[track_caller]
        #[inline]
        $vis fn $name($($arg: $ty),*) -> $ret {
            $crate::error::unwrap(Self::$try_name($($arg),*))
        }

        $(#[$tm])*
        #[track_caller]
        $tvis fn $try_name($($arg: $ty),*) -> $crate::error::Result<$ret> $body

        $crate::error::twins! { $($rest)* }
    };
}
pub(crate) use twins;
