//! Fuzz target `index`: see `ndscope_fuzz::index` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndscope_fuzz::index(data));
