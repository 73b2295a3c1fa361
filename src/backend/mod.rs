//! Backends: where array data lives and how it is computed on.
//!
//! # The layers
//!
//! ```text
//! handle   NDArray, NDManager, NDScope        (src/array, manager.rs, scope.rs)
//!   │      Copy ids; every call goes to the engine
//! engine   ids, records, shards, managers,    (src/engine)
//!   │      scopes, tasks, the op path: resolves inputs, runs a kernel, registers
//!   │      the result
//! backend  buffers, layouts, dtypes            (src/backend)
//!   │      device memory and the kernels that read and write it
//! kernel   loops over plain slices             (src/backend/cpu/*.rs)
//! ```
//!
//! A backend sees only [`Buffer`](cpu::Buffer)s, [`Layout`](crate::layout::Layout)s
//! and [`DType`](crate::DType)s. It knows nothing of records, managers, scopes or
//! tapes, and it imports nothing from the engine: the engine calls it, never the
//! reverse. That is what lets a second device stand beside the CPU: the engine
//! dispatches on the device of the inputs' buffers, and each backend brings its own
//! memory and kernels.
//!
//! Two backends: [`cpu`], always, and `wgpu` (feature `gpu`): GPU memory and WGSL
//! kernels through wgpu (Vulkan, Metal, DX12).

pub(crate) mod cpu;
#[cfg(feature = "gpu")]
pub(crate) mod wgpu;
pub(crate) mod window;
