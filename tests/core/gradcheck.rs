//! Gradients of every differentiable op against central finite differences, in f64
//! (`gradcheck`/`gradcheck_at` in `tests/common`). A collector zeroes and records only
//! its own thread's parameters, so these tests run in parallel.

use crate::common::{gradcheck, gradcheck_at};
use ndscope::{DType, GradientCollector, NDArray, NDManager};
use proptest::prelude::*;

#[test]
fn binary_ops_with_broadcasting() {
    let pairs: [(&[usize], &[usize]); 4] = [
        (&[2, 3], &[2, 3]),
        (&[2, 3], &[3]),
        (&[2, 1], &[1, 3]),
        (&[], &[2, 2]),
    ];
    for (a, b) in pairs {
        gradcheck(&[a, b], -2.0, 2.0, |x| x[0] + x[1]);
        gradcheck(&[a, b], -2.0, 2.0, |x| x[0] - x[1]);
        gradcheck(&[a, b], -2.0, 2.0, |x| x[0] * x[1]);
        gradcheck(&[a, b], 0.5, 2.0, |x| x[0] / x[1]);
        gradcheck(&[a, b], 0.5, 2.0, |x| x[0].pow(x[1]));
        gradcheck(&[a, b], -2.0, 2.0, |x| x[0].maximum(x[1]));
        gradcheck(&[a, b], -2.0, 2.0, |x| x[0].minimum(x[1]));
    }
}

#[test]
fn scalar_ops() {
    let s: &[&[usize]] = &[&[2, 3]];
    gradcheck(s, -2.0, 2.0, |x| x[0] + 1.5);
    gradcheck(s, -2.0, 2.0, |x| x[0] - 1.5);
    gradcheck(s, -2.0, 2.0, |x| 1.5 - x[0]);
    gradcheck(s, -2.0, 2.0, |x| x[0] * 1.5);
    gradcheck(s, -2.0, 2.0, |x| 1.5 * x[0]);
    gradcheck(s, -2.0, 2.0, |x| x[0] / 1.5);
    gradcheck(s, 0.5, 2.0, |x| 1.5 / x[0]);
    gradcheck(s, 0.5, 2.0, |x| x[0].pow(2.5));
    gradcheck(s, -2.0, 2.0, |x| x[0].pow(3));
    gradcheck(s, -2.0, 2.0, |x| x[0].maximum(0.3));
    gradcheck(s, -2.0, 2.0, |x| x[0].minimum(0.3));
    gradcheck(s, -2.0, 2.0, |x| -x[0]);
}

#[test]
fn scalar_left_pow() {
    // s ** x has no operator; `pow` on a 0-d array covers it through broadcasting.
    gradcheck(&[&[3]], -1.0, 1.0, |x| {
        let base = x[0].manager().full([], 1.7, DType::F64);
        base.pow(x[0])
    });
}

#[test]
fn unary_ops() {
    let s: &[&[usize]] = &[&[3, 2]];
    gradcheck(s, -2.0, 2.0, |x| x[0].abs());
    gradcheck(s, -2.0, 2.0, |x| x[0].square());
    gradcheck(s, -2.0, 2.0, |x| x[0].relu());
    gradcheck(s, -2.0, 2.0, |x| x[0].exp());
    gradcheck(s, 0.5, 3.0, |x| x[0].log());
    gradcheck(s, 0.5, 3.0, |x| x[0].sqrt());
    gradcheck(s, -2.0, 2.0, |x| x[0].sin());
    gradcheck(s, -2.0, 2.0, |x| x[0].cos());
    gradcheck(s, -2.0, 2.0, |x| x[0].tanh());
    gradcheck(s, -2.0, 2.0, |x| x[0].sigmoid());
}

#[test]
fn reductions() {
    let s: &[&[usize]] = &[&[2, 3, 4]];
    gradcheck(s, -2.0, 2.0, |x| x[0].sum());
    gradcheck(s, -2.0, 2.0, |x| x[0].sum_axes(&[1], false));
    gradcheck(s, -2.0, 2.0, |x| x[0].sum_axes(&[0, -1], true));
    gradcheck(s, -2.0, 2.0, |x| x[0].mean());
    gradcheck(s, -2.0, 2.0, |x| x[0].mean_axes(&[2], false));
    gradcheck(s, -2.0, 2.0, |x| x[0].max());
    gradcheck(s, -2.0, 2.0, |x| x[0].max_axes(&[1], false));
    gradcheck(s, -2.0, 2.0, |x| x[0].min_axes(&[0, 2], true));
    gradcheck(s, -2.0, 2.0, |x| x[0].min());
    gradcheck(s, 0.5, 1.5, |x| x[0].prod());
    gradcheck(s, -2.0, 2.0, |x| x[0].prod_axes(&[1], false));
    gradcheck(s, -2.0, 2.0, |x| x[0].prod_axes(&[0, -1], true));
}

/// `prod`'s gradient is the product of the other elements, also where some are 0
/// (prod is linear in each element, so central differences are exact there too).
#[test]
fn prod_with_zeros() {
    // Rows with no zero, one zero, two zeros and all zeros.
    let rows = vec![
        1.5, -2.0, 0.5, //
        3.0, 0.0, -1.5, //
        0.0, 2.0, 0.0, //
        0.0, 0.0, 0.0,
    ];
    gradcheck_at(&[&[4, 3]], vec![rows.clone()], |x| {
        x[0].prod_axes(&[1], false)
    });
    gradcheck_at(&[&[4, 3]], vec![rows.clone()], |x| {
        x[0].prod_axes(&[-1], true)
    });
    gradcheck_at(&[&[4, 3]], vec![rows.clone()], |x| {
        x[0].prod_axes(&[0], false)
    });
    gradcheck_at(&[&[3, 4]], vec![rows.clone()], |x| {
        x[0].prod_axes(&[0, 1], false)
    });
    gradcheck_at(&[&[12]], vec![rows], |x| x[0].prod());
    let one_zero = vec![2.0, 0.0, 3.0, -1.0];
    gradcheck_at(&[&[4]], vec![one_zero], |x| x[0].prod());
    gradcheck_at(&[&[2, 2]], vec![vec![0.0, 0.0, 1.0, 2.0]], |x| {
        x[0].prod() * 2.0
    });
}

/// The case: `prod` used to be unrecorded, so `w.prod() + w.sum()` gave [1, 1].
#[test]
fn prod_plus_sum_gradient() {
    let m = NDManager::new();
    let w = m.create(&[2.0f64, 3.0], [2]).set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        gc.backward(w.prod() + w.sum()).unwrap();
    }
    assert_eq!(w.gradient().to_vec::<f64>().unwrap(), vec![4.0, 3.0]);
    let z = m
        .create(&[0.0f32, 3.0, 0.5], [3])
        .set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        gc.backward(z.prod()).unwrap();
    }
    assert_eq!(z.gradient().to_vec::<f32>().unwrap(), vec![1.5, 0.0, 0.0]);
    m.close();
}

/// relu passes NaN through; its gradient at NaN is 0 (as PyTorch's), like
/// `maximum(x, 0.0)`'s.
#[test]
fn relu_gradient_at_nan() {
    let m = NDManager::new();
    let x = m
        .create(&[f64::NAN, -1.0, 2.0], [3])
        .set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        let y = x.relu();
        assert!(y.to_vec::<f64>().unwrap()[0].is_nan());
        gc.backward(y).unwrap();
    }
    assert_eq!(x.gradient().to_vec::<f64>().unwrap(), vec![0.0, 0.0, 1.0]);
    m.close();
}

#[test]
fn matmul_all_ranks() {
    let cases: [(&[usize], &[usize]); 7] = [
        (&[2, 3], &[3, 4]),
        (&[3], &[3, 4]),
        (&[2, 3], &[3]),
        (&[3], &[3]),
        (&[2, 2, 3], &[3, 4]),
        (&[2, 1, 2, 3], &[3, 3, 2]),
        (&[4], &[2, 4, 3]),
    ];
    for (a, b) in cases {
        gradcheck(&[a, b], -1.0, 1.0, |x| x[0].matmul(x[1]));
    }
    gradcheck(&[&[3, 2], &[3, 4]], -1.0, 1.0, |x| {
        x[0].transpose().matmul(x[1])
    });
    gradcheck(&[&[2], &[2]], -1.0, 1.0, |x| x[0].dot(x[1]));
}

#[test]
fn shape_ops() {
    let s: &[&[usize]] = &[&[2, 3, 4]];
    gradcheck(s, -1.0, 1.0, |x| x[0].reshape([6, 4]));
    gradcheck(s, -1.0, 1.0, |x| x[0].reshape_infer(&[4, -1]));
    gradcheck(s, -1.0, 1.0, |x| x[0].flatten());
    gradcheck(s, -1.0, 1.0, |x| x[0].transpose());
    gradcheck(s, -1.0, 1.0, |x| x[0].permute(&[1, 2, 0]));
    gradcheck(s, -1.0, 1.0, |x| x[0].transpose().reshape([24]));
    gradcheck(s, -1.0, 1.0, |x| x[0].expand_dims(1));
    gradcheck(&[&[2, 1, 3]], -1.0, 1.0, |x| x[0].squeeze());
    gradcheck(&[&[2, 1, 3]], -1.0, 1.0, |x| x[0].squeeze_axis(1));
    gradcheck(&[&[3, 1]], -1.0, 1.0, |x| x[0].broadcast_to([2, 3, 4]));
    gradcheck(s, -1.0, 1.0, |x| x[0].get("1, ::2, 1:3"));
    gradcheck(s, -1.0, 1.0, |x| x[0].get("..., ::-1"));
    gradcheck(&[&[2, 3], &[2, 2]], -1.0, 1.0, |x| {
        NDArray::concat(&[x[0], x[1]], 1)
    });
    gradcheck(&[&[2, 3], &[2, 3]], -1.0, 1.0, |x| {
        NDArray::stack(&[x[0], x[1]], 1)
    });
    gradcheck(&[&[2, 3]], -1.0, 1.0, |x| x[0].to_dtype(DType::F64));
}

#[test]
fn nn_ops() {
    let s: &[&[usize]] = &[&[3, 4]];
    gradcheck(s, -2.0, 2.0, |x| x[0].softmax(-1));
    gradcheck(s, -2.0, 2.0, |x| x[0].softmax(0));
    gradcheck(s, -2.0, 2.0, |x| x[0].log_softmax(1));
    gradcheck(s, -2.0, 2.0, |x| x[0].clip(-0.7, 0.9));
    gradcheck(&[&[2, 3], &[3]], -2.0, 2.0, |x| {
        x[0].gt(0.0).where_(x[0], x[1])
    });
    gradcheck(&[&[2, 3], &[1]], -2.0, 2.0, |x| {
        x[0].lt(0.0).where_(x[1], x[0] * 2.0)
    });
}

#[test]
fn composite_with_reuse() {
    // An input used by several ops accumulates their gradients.
    gradcheck(&[&[2, 3], &[3]], -1.0, 1.0, |x| {
        let h = (x[0] * x[1] + x[0]).tanh();
        (h * x[0]).sum_axes(&[1], true) + h.mean() * x[1]
    });
}

fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    prop::collection::vec((1usize..4, 0u8..3), 0..4).prop_map(|dims| {
        let mut a = Vec::new();
        let mut b = Vec::new();
        for (n, kind) in dims {
            match kind {
                0 => {
                    a.push(n);
                    b.push(n);
                }
                1 => {
                    a.push(1);
                    b.push(n);
                }
                _ => {
                    a.push(n);
                    b.push(1);
                }
            }
        }
        // Drop some leading dims of b (numpy's rank broadcasting).
        let k = b.len() / 2;
        (a, b[k..].to_vec())
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_broadcast_shapes((a, b) in broadcast_pair(), op in 0usize..5) {
        gradcheck(&[&a, &b], 0.5, 2.0, |x| match op {
            0 => x[0] + x[1],
            1 => x[0] - x[1] * x[0],
            2 => x[0] * x[1],
            3 => x[0] / x[1],
            _ => (x[0] * x[1]).exp().log() + x[1].square(),
        });
    }
}
