//! Process-wide settings.
//!
//! Verbose mode (off by default) records a full backtrace when each array is
//! created and when it is freed, so that a use-after-close error shows both. Turn it
//! on with [`set_verbose`] or by running with the environment variable
//! `NDSCOPE_VERBOSE=1`. Source lines are recorded always, verbose or not.

use std::sync::atomic::{AtomicU8, Ordering};

const UNSET: u8 = 0;
const OFF: u8 = 1;
const ON: u8 = 2;
static VERBOSE: AtomicU8 = AtomicU8::new(UNSET);

/// Turn verbose mode on or off for the whole process.
pub fn set_verbose(on: bool) {
    VERBOSE.store(if on { ON } else { OFF }, Ordering::Relaxed);
}

/// Whether verbose mode is on (first call reads `NDSCOPE_VERBOSE`).
#[inline]
pub fn verbose() -> bool {
    match VERBOSE.load(Ordering::Relaxed) {
        ON => true,
        OFF => false,
        _ => verbose_from_env(),
    }
}

/// [`verbose`]'s first call: out of line, so every later one is a load and a compare
/// where it is inlined (twice on each op and close).
#[cold]
#[inline(never)]
fn verbose_from_env() -> bool {
    let on =
        std::env::var("NDSCOPE_VERBOSE").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false");
    set_verbose(on);
    on
}
