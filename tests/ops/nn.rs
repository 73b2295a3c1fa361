//! Tests of the nn operations.

#[allow(unused_imports)]
use crate::common::*;
