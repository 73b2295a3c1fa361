//! Property test: broadcasting arithmetic against a naive reference, every dtype.

use crate::common::broadcast;
use ndscope::{DType, NDManager};
use proptest::prelude::*;

/// A random pair of broadcast-compatible shapes.
fn shapes() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec((1usize..4, 0u8..3), 0..4).prop_map(|dims| {
        let mut a = vec![];
        let mut b = vec![];
        for (d, kind) in dims {
            match kind {
                0 => {
                    a.push(d);
                    b.push(d)
                }
                1 => {
                    a.push(1);
                    b.push(d)
                }
                _ => {
                    a.push(d);
                    b.push(1)
                }
            }
        }
        // Drop some leading dims of b (numpy aligns from the right).
        let cut = b.len() / 2;
        (a, b[cut..].to_vec())
    })
}

/// Naive reference: index each operand by the broadcast multi-index.
fn reference(
    a: &[f64],
    sa: &[usize],
    b: &[f64],
    sb: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> Vec<f64> {
    let out = broadcast(sa, sb).expect("the shapes broadcast");
    let n: usize = out.iter().product();
    let at = |v: &[f64], s: &[usize], idx: &[usize]| {
        let off = out.len() - s.len();
        let mut flat = 0;
        for (k, &d) in s.iter().enumerate() {
            flat = flat * d + if d == 1 { 0 } else { idx[off + k] };
        }
        v[flat]
    };
    (0..n)
        .map(|mut i| {
            let mut idx = vec![0; out.len()];
            for k in (0..out.len()).rev() {
                idx[k] = i % out[k];
                i /= out[k];
            }
            f(at(a, sa, &idx), at(b, sb, &idx))
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn broadcasting_matches_reference((sa, sb) in shapes(), seed in 0u64..1000) {
        let m = NDManager::new();
        let na: usize = sa.iter().product();
        let nb: usize = sb.iter().product();
        let va: Vec<f64> = (0..na).map(|i| ((i as u64 * 7 + seed) % 11) as f64 - 5.0).collect();
        let vb: Vec<f64> = (0..nb).map(|i| ((i as u64 * 3 + seed) % 7) as f64 + 1.0).collect();
        for dtype in [DType::F32, DType::F64, DType::I32, DType::I64, DType::U8] {
            let to = |v: &[f64], s: &[usize]| match dtype {
                DType::F32 => m.create(&v.iter().map(|&x| x as f32).collect::<Vec<_>>(), s),
                DType::F64 => m.create(v, s),
                DType::I32 => m.create(&v.iter().map(|&x| x as i32).collect::<Vec<_>>(), s),
                DType::I64 => m.create(&v.iter().map(|&x| x as i64).collect::<Vec<_>>(), s),
                _ => m.create(&v.iter().map(|&x| x.abs() as u8).collect::<Vec<_>>(), s),
            };
            let (va, vb): (Vec<f64>, Vec<f64>) = if dtype == DType::U8 {
                (va.iter().map(|x| x.abs()).collect(), vb.clone())
            } else {
                (va.clone(), vb.clone())
            };
            let (a, b) = (to(&va, &sa), to(&vb, &sb));
            let got = |x: ndscope::NDArray| -> Vec<f64> {
                match dtype {
                    DType::F32 => x.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect(),
                    DType::F64 => x.to_vec::<f64>().unwrap(),
                    DType::I32 => x.to_vec::<i32>().unwrap().into_iter().map(f64::from).collect(),
                    DType::I64 => x.to_vec::<i64>().unwrap().into_iter().map(|v| v as f64).collect(),
                    _ => x.to_vec::<u8>().unwrap().into_iter().map(f64::from).collect(),
                }
            };
            prop_assert_eq!(got(a + b), reference(&va, &sa, &vb, &sb, |x, y| x + y));
            prop_assert_eq!(got(a * b), reference(&va, &sa, &vb, &sb, |x, y| x * y));
            prop_assert_eq!(got(a.maximum(b)), reference(&va, &sa, &vb, &sb, f64::max));
            if dtype != DType::U8 {
                prop_assert_eq!(got(a - b), reference(&va, &sa, &vb, &sb, |x, y| x - y));
            }
            if dtype.is_float() {
                let d = got(a / b);
                let r = reference(&va, &sa, &vb, &sb, |x, y| x / y);
                for (x, y) in d.iter().zip(&r) {
                    prop_assert!((x - y).abs() <= 1e-6 * y.abs().max(1.0));
                }
            }
            let gt = (a.gt(b)).to_vec::<bool>().unwrap();
            let rg = reference(&va, &sa, &vb, &sb, |x, y| (x > y) as u8 as f64);
            prop_assert_eq!(gt.iter().map(|&x| x as u8 as f64).collect::<Vec<_>>(), rg);
        }
        m.close();
        prop_assert_eq!(m.memory().live_arrays, 0);
    }
}
