//! Fuzz target `safetensors`: see `ndscope_fuzz::safetensors` for what is checked.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| ndscope_fuzz::safetensors(data));
