//! Helpers shared by the test binaries (`#[path = "../common/mod.rs"] mod common;` from
//! a test directory's `main.rs`, or `mod common;` from a top-level test file). Not every
//! binary uses every helper.
#![allow(dead_code)]

use ndscope::{DType, GradientCollector, NDArray, NDManager, NDScope, SourceLocation};
use std::cell::Cell;
use std::io::Write;
use std::panic::{AssertUnwindSafe, Location, catch_unwind};
use std::sync::{Mutex, MutexGuard, Once};
use std::time::{Duration, Instant};

/// Live (arrays, buffers, bytes) of manager `m`.
pub fn counts(m: &NDManager) -> (usize, usize, usize) {
    let s = m.memory();
    (s.live_arrays, s.live_buffers, s.live_bytes)
}

/// Live (arrays, bytes) of manager `m`.
pub fn arrays_bytes(m: &NDManager) -> (usize, usize) {
    let s = m.memory();
    (s.live_arrays, s.live_bytes)
}

/// Live (arrays, buffers, bytes) of the whole process. Only meaningful where no other
/// test runs at the same time: in a binary of its own, or under [`serial`].
pub fn counters() -> (usize, usize, usize) {
    let s = ndscope::memory();
    (s.live_arrays, s.live_buffers, s.live_bytes)
}

static SERIAL: Mutex<()> = Mutex::new(());

/// When the current holder of [`serial`] took it, and its test's name.
static HELD: Mutex<Option<(Instant, String)>> = Mutex::new(None);

/// The hold on [`serial`]: while it lives, the other serial tests of the binary wait.
pub struct Serial {
    _guard: MutexGuard<'static, ()>,
}

impl Drop for Serial {
    fn drop(&mut self) {
        *HELD.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }
}

/// One lock per test binary: the tests that hold it run one at a time (tests of a binary
/// otherwise run in parallel threads). A test that panicked while holding it does not
/// poison it for the others.
///
/// A watchdog aborts the test process when one test holds the lock for more than 600
/// seconds (`NDSCOPE_TEST_WATCHDOG_SECS` overrides; the slowest serial test takes a few
/// seconds, a minute under valgrind): an engine bug that leaves a thread spinning then
/// fails the run with the test's name instead of running into CI's time limit.
pub fn serial() -> Serial {
    start_watchdog();
    let guard = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let name = std::thread::current().name().unwrap_or("?").to_string();
    *HELD.lock().unwrap_or_else(|e| e.into_inner()) = Some((Instant::now(), name));
    Serial { _guard: guard }
}

fn start_watchdog() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let limit = std::env::var("NDSCOPE_TEST_WATCHDOG_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(600u64);
        let limit = Duration::from_secs(limit);
        std::thread::spawn(move || {
            loop {
                std::thread::sleep(Duration::from_millis(500));
                let held = HELD.lock().unwrap_or_else(|e| e.into_inner());
                if let Some((since, name)) = &*held
                    && since.elapsed() > limit
                {
                    // Straight to the stream: `eprintln!` in a thread spawned by a
                    // test is captured with that test's output, lost by the abort.
                    let _ = writeln!(
                        std::io::stderr(),
                        "test watchdog: '{name}' has held common::serial() for over {} s; \
                         aborting the test process (a hang?)",
                        limit.as_secs()
                    );
                    std::process::abort();
                }
            }
        });
    });
}

thread_local! {
    /// This thread expects a panic: the hook stays quiet.
    static EXPECTING_PANIC: Cell<bool> = const { Cell::new(false) };
}

/// Installs (once per process) a panic hook that is silent for panics provoked on purpose
/// by [`expect_panic`] on the panicking thread, and prints every other one. Setting and
/// restoring the hook around each call instead would race between parallel tests and
/// could leave the process silenced.
pub fn install_quiet_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let default = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !EXPECTING_PANIC.with(Cell::get) {
                default(info);
            }
        }));
    });
}

/// Run `f`, which must panic on this thread (quietly), and return the panic message.
pub fn expect_panic(f: impl FnOnce()) -> String {
    install_quiet_hook();
    let was = EXPECTING_PANIC.with(|c| c.replace(true));
    let r = catch_unwind(AssertUnwindSafe(f));
    EXPECTING_PANIC.with(|c| c.set(was));
    let payload = r.expect_err("expected a panic");
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default()
}

/// `$e` fails with an error matching `$p`, and `$m`'s counters do not change (nothing
/// leaks on an error path).
#[macro_export]
macro_rules! fails {
    ($m:expr, $e:expr, $p:pat) => {{
        let before = $crate::common::counts(&$m);
        let r = $e;
        assert!(
            matches!(r, Err($p)),
            "{}: expected {}, got {:?}",
            stringify!($e),
            stringify!($p),
            r
        );
        assert_eq!(
            $crate::common::counts(&$m),
            before,
            "{} changed the counters",
            stringify!($e)
        );
    }};
}

/// Deterministic values in `[lo, hi)`.
pub fn values(n: usize, seed: u64, lo: f64, hi: f64) -> Vec<f64> {
    let mut s = seed
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            lo + (hi - lo) * ((s >> 11) as f64 / (1u64 << 53) as f64)
        })
        .collect()
}

/// Check the gradient of `sum(f(inputs) * r)` (r random) for f64 inputs of `shapes`
/// with values in `[lo, hi)` against central finite differences.
pub fn gradcheck(shapes: &[&[usize]], lo: f64, hi: f64, f: impl Fn(&[NDArray]) -> NDArray) {
    let data: Vec<Vec<f64>> = shapes
        .iter()
        .enumerate()
        .map(|(i, s)| values(s.iter().product(), 7 + i as u64, lo, hi))
        .collect();
    gradcheck_at(shapes, data, f);
}

/// [`gradcheck`] at given input values (e.g. with zeros where a rule has a special
/// case, or away from a kink).
pub fn gradcheck_at(shapes: &[&[usize]], data: Vec<Vec<f64>>, f: impl Fn(&[NDArray]) -> NDArray) {
    let m = NDManager::new();
    let make = |d: &[Vec<f64>]| -> Vec<NDArray> {
        d.iter()
            .zip(shapes)
            .map(|(v, s)| m.create(v, s.to_vec()))
            .collect()
    };
    let inputs = make(&data);
    for a in &inputs {
        a.set_requires_gradient(true);
    }
    let out_shape = f(&inputs).shape();
    let r = m.create(&values(out_shape.size(), 99, -1.0, 1.0), out_shape);
    {
        let gc = GradientCollector::new();
        let loss = (f(&inputs) * r).sum();
        gc.backward(loss).unwrap();
    }
    let eps = 1e-6;
    for (i, a) in inputs.iter().enumerate() {
        let analytic = a.gradient().to_vec::<f64>().unwrap();
        assert_eq!(analytic.len(), data[i].len());
        for j in 0..data[i].len() {
            let eval = |delta: f64| {
                let mut d = data.clone();
                d[i][j] += delta;
                let xs = make(&d);
                (f(&xs) * r).sum().to_scalar::<f64>().unwrap()
            };
            let numeric = (eval(eps) - eval(-eps)) / (2.0 * eps);
            let tol = 1e-5 * (1.0 + numeric.abs());
            assert!(
                (analytic[j] - numeric).abs() < tol,
                "input {i} {:?} element {j}: analytic {} numeric {numeric}",
                shapes[i],
                analytic[j]
            );
        }
    }
    m.close();
}

/// `a`'s elements as f32 (panics on an error).
pub fn f32s(a: NDArray) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

/// 0..n as f32 in `shape`.
pub fn iota(m: &NDManager, shape: &[usize]) -> NDArray {
    let n: usize = shape.iter().product();
    m.arange(0.0, n as f64, 1.0, DType::F32).reshape(shape)
}

/// The environment variable `name` as a number, else `default`.
pub fn env_or(name: &str, default: u32) -> u32 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The broadcast shape of `a` and `b` (numpy's rules), or `None` if they do not broadcast.
pub fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let get = |s: &[usize], i: usize| {
        if i < n - s.len() {
            1
        } else {
            s[i - (n - s.len())]
        }
    };
    (0..n)
        .map(|i| match (get(a, i), get(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// The flat index into an array of shape `s` broadcast to `out` at flat output index `o`.
pub fn bindex(out: &[usize], s: &[usize], mut o: usize) -> usize {
    let (mut idx, mut stride) = (0, 1);
    for k in (0..out.len()).rev() {
        let c = o % out[k];
        o /= out[k];
        let Some(j) = (k + s.len()).checked_sub(out.len()) else {
            continue;
        };
        if s[j] != 1 {
            idx += c * stride;
        }
        stride *= s[j];
    }
    idx
}

/// Open a scope at one of three source lines, so that close reasons tell them apart
/// (the model-based tests).
pub fn open_scope(site: u8) -> NDScope {
    match site % 3 {
        0 => NDScope::new(),
        1 => NDScope::new(),
        _ => NDScope::new(),
    }
}

/// `scope(|| (a * 2) + 1)`: the product is freed, the sum escapes. Returns the scope's
/// location (the caller's, as `scope` records it), the product and the result.
#[track_caller]
pub fn tidy(a: NDArray) -> (SourceLocation, Option<NDArray>, ndscope::Result<NDArray>) {
    let at = Location::caller();
    let mut t_out = None;
    let r = ndscope::scope(|| {
        let t = a.try_mul(2.0)?;
        t_out = Some(t);
        t.try_add(1.0)
    });
    (at, t_out, r)
}
