//! Helpers shared by the test binaries (`#[path = "../common/mod.rs"] mod common;` or
//! `mod common;` from a top-level test file). Not every binary uses every helper.
#![allow(dead_code)]

use ndscope::{GradientCollector, NDArray, NDManager};
use std::panic::{AssertUnwindSafe, catch_unwind};

/// Live (arrays, buffers, bytes) of manager `m`.
pub fn counts(m: &NDManager) -> (usize, usize, usize) {
    let s = m.memory();
    (s.live_arrays, s.live_buffers, s.live_bytes)
}

/// Live (arrays, buffers, bytes) of the whole process.
pub fn counters() -> (usize, usize, usize) {
    let s = ndscope::memory();
    (s.live_arrays, s.live_buffers, s.live_bytes)
}

/// Run `f`, which must panic (quietly), and return the panic message.
pub fn expect_panic(f: impl FnOnce()) -> String {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let r = catch_unwind(AssertUnwindSafe(f));
    std::panic::set_hook(hook);
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
