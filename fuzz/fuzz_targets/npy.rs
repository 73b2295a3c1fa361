//! Fuzz target `npy`: see `ndscope_fuzz::npy` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndscope_fuzz::npy(data));
