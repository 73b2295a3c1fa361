//! The operations of issue 11, one module per family, in one test binary (each test
//! binary links gemm and rayon, so families share one).

#[path = "../common/mod.rs"]
mod common;

mod coverage;
mod elementwise;
mod fixtures;
mod index;
mod nn;
