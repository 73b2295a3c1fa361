//! Tests of the index operations.

#[allow(unused_imports)]
use crate::common::*;
