//! Fuzz target `npz`: see `ndscope_fuzz::npz` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndscope_fuzz::npz(data));
