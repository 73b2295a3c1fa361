//! Tests of the elementwise operations.

#[allow(unused_imports)]
use crate::common::*;
