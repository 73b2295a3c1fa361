//! Fuzz target `checkpoint`: see `ndscope_fuzz::checkpoint` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndscope_fuzz::checkpoint(data));
