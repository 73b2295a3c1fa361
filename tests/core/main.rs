//! The array library itself, one module per subject, in one test binary (each test binary
//! links gemm and rayon, so subjects share one): elementwise arithmetic, reductions,
//! indexing views, shape ops, matmul, the first neural-network ops, broadcasting
//! against a reference, gradients against finite differences, the gradient collector,
//! and the bad-input matrix.
//!
//! Tests run in parallel threads of one process: counts come from a manager each test
//! created (`m.memory()`), never the process-wide counters.

#[path = "../common/mod.rs"]
mod common;

mod arithmetic;
mod autograd;
mod bad_input;
mod conv_geometry;
mod devices;
mod gradcheck;
mod matmul;
mod nn_ops;
mod prop_broadcast;
mod reductions;
mod shape_ops;
mod views;
