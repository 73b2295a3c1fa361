//! Elementwise arithmetic, comparisons, unary math and in-place ops against
//! hand-computed values, for every dtype where the op is defined.

use ndscope::{DType, NDManager, NdError};

#[test]
fn operators_with_literals_infer() {
    let m = NDManager::new();
    let a = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let z = m.zeros([2, 2], DType::F32);
    let c = a + z * 2.0 + 1;
    assert_eq!(c.shape().dims(), &[2, 2]);
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
    let d = 2.0 * a - 1;
    assert_eq!(d.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 5.0, 7.0]);
    let e = 10 - a;
    assert_eq!(e.to_vec::<f32>().unwrap(), vec![9.0, 8.0, 7.0, 6.0]);
    let f = 1.0 / a;
    assert_eq!(f.to_vec::<f32>().unwrap(), vec![1.0, 0.5, 1.0 / 3.0, 0.25]);
    let g = -a / 2.0f32;
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![-0.5, -1.0, -1.5, -2.0]);
    m.close();
}

/// Elementwise ops on layouts whose rows are short (a transposed [2,n] view, a
/// column plus a broadcast scalar) give the values of the same ops on plain data:
/// the kernels walk such layouts along their long dimension (every element once).
#[test]
fn elementwise_on_transposed_views_and_columns_is_exact() {
    let m = NDManager::new();
    let n = 300;
    let vals: Vec<f32> = (0..2 * n).map(|i| (i % 17) as f32 - 8.0).collect();
    let base = m.create(vals.as_slice(), [2, n]);
    let t = base.transpose(); // [n,2], strides [1,n]
    // t[i][j] = vals[j*n + i]
    let at = |i: usize, j: usize| vals[j * n + i];
    let want = |f: &dyn Fn(f32, usize, usize) -> f32| -> Vec<f32> {
        (0..n)
            .flat_map(|i| (0..2).map(move |j| (i, j)))
            .map(|(i, j)| f(at(i, j), i, j))
            .collect()
    };
    assert_eq!((t * 2.0).to_vec::<f32>().unwrap(), want(&|x, _, _| x * 2.0));
    assert_eq!((-t).to_vec::<f32>().unwrap(), want(&|x, _, _| -x));
    let row = m.create(&[100.0f32, 200.0], [2]);
    assert_eq!(
        (t + row).to_vec::<f32>().unwrap(),
        want(&|x, _, j| x + [100.0, 200.0][j])
    );
    assert_eq!((t - t).to_vec::<f32>().unwrap(), vec![0.0; 2 * n]);
    // In place through the transposed view: base sees the writes where they belong.
    let mut tv = t;
    tv += row;
    let back = base.to_vec::<f32>().unwrap();
    for (k, (&b, &v)) in back.iter().zip(&vals).enumerate() {
        assert_eq!(b, v + [100.0, 200.0][k / n], "element {k}");
    }
    // A column plus a broadcast scalar.
    let col = m.create(vals.as_slice(), [2 * n, 1]);
    let b = m.create(&[0.5f32], [1]);
    let sum = (col + b).to_vec::<f32>().unwrap();
    assert_eq!(sum, vals.iter().map(|x| x + 0.5).collect::<Vec<_>>());
    m.close();
}

#[test]
fn broadcasting_follows_numpy() {
    let m = NDManager::new();
    let col = m.create(&[1i32, 2, 3], [3, 1]);
    let row = m.create(&[10i32, 20], [2]);
    let s = col + row;
    assert_eq!(s.shape().dims(), &[3, 2]);
    assert_eq!(s.to_vec::<i32>().unwrap(), vec![11, 21, 12, 22, 13, 23]);
    let scalar = m.scalar(5i32);
    assert_eq!((row * scalar).to_vec::<i32>().unwrap(), vec![50, 100]);
    let bad = m.create(&[1i32, 2, 3], [3]);
    let e = row.try_add(bad).unwrap_err();
    assert!(matches!(e, NdError::ShapeMismatch { op: "add", .. }), "{e}");
    assert!(
        e.to_string().contains("[2] and [3] cannot be broadcast"),
        "{e}"
    );
    m.close();
}

#[test]
fn integer_semantics() {
    let m = NDManager::new();
    let a = m.create(&[7i64, -7, 5, i64::MAX], [4]);
    let b = m.create(&[2i64, 2, 0, 1], [4]);
    assert_eq!((a / b).to_vec::<i64>().unwrap(), vec![3, -3, 0, i64::MAX]);
    assert_eq!(
        (a + 1).to_vec::<i64>().unwrap()[3],
        i64::MIN,
        "wraps like numpy"
    );
    let p = m.create(&[2u8, 3, 4], [3]).pow(2);
    assert_eq!(p.to_vec::<u8>().unwrap(), vec![4, 9, 16]);
    assert_eq!(
        m.create(&[-3i32, 4], [2]).abs().to_vec::<i32>().unwrap(),
        vec![3, 4]
    );
    assert_eq!(
        m.create(&[-3i32, 4], [2]).relu().to_vec::<i32>().unwrap(),
        vec![0, 4]
    );
    // Scalars take the array's dtype.
    assert_eq!(
        (m.create(&[3i32], [1]) * 2.5).to_vec::<i32>().unwrap(),
        vec![6]
    );
    m.close();
}

#[test]
fn unary_float_math() {
    let m = NDManager::new();
    let x = m.create(&[0.0f64, 1.0, 4.0], [3]);
    let close = |a: Vec<f64>, b: &[f64]| a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-12);
    assert!(close(
        x.exp().to_vec().unwrap(),
        &[1.0, 1f64.exp(), 4f64.exp()]
    ));
    assert!(close(x.sqrt().to_vec().unwrap(), &[0.0, 1.0, 2.0]));
    assert!(close(x.square().to_vec().unwrap(), &[0.0, 1.0, 16.0]));
    assert!(close(
        x.sin().to_vec().unwrap(),
        &[0.0, 1f64.sin(), 4f64.sin()]
    ));
    assert!(close(
        x.cos().to_vec().unwrap(),
        &[1.0, 1f64.cos(), 4f64.cos()]
    ));
    assert!(close(
        x.tanh().to_vec().unwrap(),
        &[0.0, 1f64.tanh(), 4f64.tanh()]
    ));
    assert!(close(
        x.sigmoid().to_vec().unwrap(),
        &[
            0.5,
            1.0 / (1.0 + (-1f64).exp()),
            1.0 / (1.0 + (-4f64).exp())
        ]
    ));
    let l = x.log().to_vec::<f64>().unwrap();
    assert_eq!(l[0], f64::NEG_INFINITY);
    assert!((l[2] - 4f64.ln()).abs() < 1e-12);
    let i = m.create(&[1i32], [1]);
    let e = i.try_exp().unwrap_err();
    assert!(matches!(
        e,
        NdError::UnsupportedDType {
            op: "exp",
            dtype: DType::I32,
            ..
        }
    ));
    m.close();
}

#[test]
fn comparisons_give_bool() {
    let m = NDManager::new();
    let a = m.create(&[1.0f32, 2.0, 3.0], [3]);
    let b = m.create(&[3.0f32, 2.0, 1.0], [3]);
    let gt = a.gt(b);
    assert_eq!(gt.dtype(), DType::Bool);
    assert_eq!(gt.to_vec::<bool>().unwrap(), vec![false, false, true]);
    assert_eq!(a.eq(b).to_vec::<bool>().unwrap(), vec![false, true, false]);
    assert_eq!(a.ne(b).to_vec::<bool>().unwrap(), vec![true, false, true]);
    assert_eq!(a.ge(2.0).to_vec::<bool>().unwrap(), vec![false, true, true]);
    assert_eq!(a.lt(2).to_vec::<bool>().unwrap(), vec![true, false, false]);
    assert_eq!(a.le(b).to_vec::<bool>().unwrap(), vec![true, true, false]);
    // Arithmetic on Bool is refused, comparisons work.
    assert!(matches!(
        gt.try_add(gt),
        Err(NdError::UnsupportedDType { .. })
    ));
    assert_eq!(gt.eq(gt).to_vec::<bool>().unwrap(), vec![true; 3]);
    // NaN compares unequal and propagates through maximum.
    let n = m.create(&[f32::NAN, 1.0], [2]);
    assert_eq!(n.eq(n).to_vec::<bool>().unwrap(), vec![false, true]);
    assert!(n.maximum(0.0).to_vec::<f32>().unwrap()[0].is_nan());
    assert_eq!(n.minimum(0.5).to_vec::<f32>().unwrap()[1], 0.5);
    m.close();
}

#[test]
fn in_place_ops_write_through_and_keep_identity() {
    let m = NDManager::new();
    let mut w = m.create(&[1.0f64, 2.0, 3.0, 4.0], [2, 2]);
    let id = w.uid();
    let before = m.memory().live_arrays;
    w += 1.0;
    w *= m.create(&[2.0f64, 3.0], [2]); // broadcast rhs
    w -= w; // aliasing input
    w /= 2;
    assert_eq!(w.uid(), id);
    assert_eq!(w.to_vec::<f64>().unwrap(), vec![0.0; 4]);
    assert_eq!(
        m.memory().live_arrays,
        before + 1,
        "only the [2] operand was created"
    );
    let small = m.zeros([2], DType::F64);
    let e = small.try_addi(w).unwrap_err();
    assert!(matches!(e, NdError::ShapeMismatch { .. }), "{e}");
    let e = w.try_addi(m.zeros([2, 2], DType::F32)).unwrap_err();
    assert!(matches!(e, NdError::DTypeMismatch { .. }), "{e}");
    m.close();
}

#[test]
fn dtype_mismatch_is_typed_and_names_both_arrays() {
    let m = NDManager::new();
    let a = m.zeros([2], DType::F32);
    let b = m.zeros([2], DType::F64);
    let e = a.try_mul(b).unwrap_err();
    let msg = e.to_string();
    assert!(msg.starts_with("mul: dtype mismatch f32 vs f64"), "{msg}");
    assert!(msg.contains(&format!("#{}", a.uid())) && msg.contains(&format!("#{}", b.uid())));
    assert!(msg.contains(file!()), "{msg}");
    let before = m.memory();
    let r = std::panic::catch_unwind(|| a * b);
    assert_eq!(*r.unwrap_err().downcast::<String>().unwrap(), msg);
    assert_eq!(
        m.memory(),
        before,
        "no temporaries left behind by the error"
    );
    m.close();
}

#[test]
fn creation_functions() {
    let m = NDManager::new();
    assert_eq!(
        m.arange(0.0, 5.0, 2.0, DType::I32).to_vec::<i32>().unwrap(),
        vec![0, 2, 4]
    );
    assert_eq!(
        m.linspace(0.0, 1.0, 5, DType::F64).to_vec::<f64>().unwrap(),
        vec![0.0, 0.25, 0.5, 0.75, 1.0]
    );
    assert_eq!(
        m.eye(2, DType::U8).to_vec::<u8>().unwrap(),
        vec![1, 0, 0, 1]
    );
    assert_eq!(
        m.full([2], 2.5, DType::F32).to_vec::<f32>().unwrap(),
        vec![2.5, 2.5]
    );
    assert_eq!(
        m.ones([2], DType::Bool).to_vec::<bool>().unwrap(),
        vec![true, true]
    );
    assert_eq!(m.scalar(3i64).shape().ndim(), 0);
    assert_eq!(m.scalar(3i64).to_scalar::<i64>().unwrap(), 3);
    ndscope::random::seed(1);
    let u = m
        .random_uniform(2.0, 3.0, [1000], DType::F64)
        .to_vec::<f64>()
        .unwrap();
    assert!(u.iter().all(|&x| (2.0..3.0).contains(&x)));
    let n = m
        .random_normal(1.0, 0.1, [10_000], DType::F64)
        .to_vec::<f64>()
        .unwrap();
    let mean = n.iter().sum::<f64>() / n.len() as f64;
    assert!((mean - 1.0).abs() < 0.01, "{mean}");
    let r = m
        .random_integer(-2, 3, [1000], DType::I64)
        .to_vec::<i64>()
        .unwrap();
    assert!(r.iter().all(|&x| (-2..3).contains(&x)));
    assert!(r.contains(&-2) && r.contains(&2));
    assert!(matches!(
        m.try_create(&[1.0f32, 2.0], [3]),
        Err(NdError::InvalidShape { .. })
    ));
    assert!(matches!(
        m.try_arange(0.0, 1.0, 0.0, DType::F32),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        m.try_random_integer(3, 3, [1], DType::I32),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        m.try_random_normal(0.0, -1.0, [1], DType::F32),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        m.try_zeros([usize::MAX, 2], DType::F32),
        Err(NdError::InvalidShape { .. })
    ));
    assert!(matches!(
        m.try_zeros([1 << 62], DType::F32),
        Err(NdError::InvalidShape { .. })
    ));
    assert!(matches!(
        m.try_zeros([1 << 60], DType::U8),
        Err(NdError::OutOfMemory { .. })
    ));
    assert!(matches!(
        m.create(&[1.0f32], [1]).to_vec::<f64>(),
        Err(NdError::ElementType { .. })
    ));
    m.close();
}

#[test]
fn seeded_runs_repeat() {
    let m = NDManager::new();
    ndscope::random::seed(42);
    let a = m
        .random_normal(0.0, 1.0, [5], DType::F32)
        .to_vec::<f32>()
        .unwrap();
    ndscope::random::seed(42);
    let b = m
        .random_normal(0.0, 1.0, [5], DType::F32)
        .to_vec::<f32>()
        .unwrap();
    assert_eq!(a, b);
    m.close();
}

#[test]
fn large_arrays_take_the_unlocked_path_correctly() {
    let m = NDManager::new();
    let n = 1 << 20;
    let a = m.arange(0.0, n as f64, 1.0, DType::F32);
    let b = m.ones([n], DType::F32);
    let c = (a + b).to_vec::<f32>().unwrap();
    assert_eq!(c[0], 1.0);
    assert_eq!(c[n - 1], n as f32);
    let col = m.ones([n / 4, 1], DType::F32);
    let row = m.create(&[1.0f32, 2.0, 3.0, 4.0], [4]);
    let s = (col * row).to_vec::<f32>().unwrap();
    assert_eq!(&s[..8], &[1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0]);
    let mut w = m.zeros([n], DType::F32);
    w += a;
    assert_eq!(w.to_vec::<f32>().unwrap()[n - 1], (n - 1) as f32);
    m.close();
}

/// Issue 11: elementwise ops on a zero-size view whose offset is not 0 (row 1 of a
/// [2, 0] array) give an empty array of the right shape instead of panicking.
#[test]
fn zero_size_views_with_an_offset() {
    let m = NDManager::new();
    for dtype in [DType::F64, DType::F32, DType::I64, DType::U8] {
        let z = m.zeros([3, 0], dtype).get("1");
        assert_eq!(z.shape().dims(), &[0]);
        if dtype.is_float() {
            assert_eq!(z.try_sin().unwrap().shape().dims(), &[0]);
        }
        let checks = [
            z.try_abs().unwrap(),
            z.try_neg().unwrap(),
            z.try_relu().unwrap(),
            z.try_add(z).unwrap(),
            z.try_add(1).unwrap(),
            z.try_mul(z).unwrap(),
            z.try_maximum(z).unwrap(),
            z.try_maximum(0).unwrap(),
            z.try_minimum(z).unwrap(),
            z.try_pow(2).unwrap(),
            z.try_eq(z).unwrap(),
            z.try_lt(z).unwrap(),
            z.try_ge(0).unwrap(),
            z.try_to_dtype(DType::F32).unwrap(),
            z.try_to_dtype(DType::Bool).unwrap(),
        ];
        for r in checks {
            assert_eq!(r.shape().dims(), &[0], "{dtype:?}");
            assert_eq!(r.size(), 0);
        }
        // Broadcasting against another zero-size view, and a zero-size view of a
        // zero-size view.
        let w = m.zeros([2, 3, 0], dtype).get("1");
        assert_eq!(w.try_add(z).unwrap().shape().dims(), &[3, 0]);
        assert_eq!(w.get("2").try_sub(z).unwrap().shape().dims(), &[0]);
    }
    let f = m.zeros([2, 0], DType::F64).get("1");
    assert_eq!(f.sin().to_vec::<f64>().unwrap(), Vec::<f64>::new());
    assert_eq!(f.ge(f).to_vec::<bool>().unwrap(), Vec::<bool>::new());
    assert_eq!(f.sum().to_scalar::<f64>().unwrap(), 0.0);
    assert_eq!(f.prod().to_scalar::<f64>().unwrap(), 1.0);
    assert!(f.mean().to_scalar::<f64>().unwrap().is_nan());
    assert_eq!(f.softmax(-1).shape().dims(), &[0]);
    m.close();
}

/// Issue 11: a Bool array compares with a scalar as numbers (false = 0, true = 1), as
/// numpy does; the scalar is not converted to a Bool or a wrapped `u8` first.
#[test]
fn bool_array_compares_with_scalars_numerically() {
    let m = NDManager::new();
    let b = m.create(&[false, true], [2]);
    let v = |a: ndscope::NDArray| a.to_vec::<bool>().unwrap();
    assert_eq!(v(b.ge(0.5)), vec![false, true]);
    assert_eq!(v(b.gt(0.5)), vec![false, true]);
    assert_eq!(v(b.le(0.5)), vec![true, false]);
    assert_eq!(v(b.lt(0.5)), vec![true, false]);
    assert_eq!(v(b.eq(0.5)), vec![false, false]);
    assert_eq!(v(b.ne(0.5)), vec![true, true]);
    assert_eq!(v(b.lt(-3)), vec![false, false]);
    assert_eq!(v(b.gt(-3)), vec![true, true]);
    assert_eq!(v(b.eq(1)), vec![false, true]);
    assert_eq!(v(b.eq(2)), vec![false, false]);
    assert_eq!(v(b.eq(0)), vec![true, false]);
    assert_eq!(v(b.ge(256)), vec![false, false]);
    assert_eq!(v(b.lt(f64::NAN)), vec![false, false]);
    assert_eq!(v(b.ne(f64::NAN)), vec![true, true]);
    m.close();
}

/// Issue 11: integer `pow` with a negative exponent: 1 and -1 are exact, other bases
/// truncate to 0, and 0 to a negative power is 0 (numpy raises; documented on `pow`).
#[test]
fn integer_pow_with_negative_exponents() {
    let m = NDManager::new();
    let base = m.create(&[1i64, -1, -1, 2, -2, 0, 5], [7]);
    assert_eq!(
        base.pow(-1).to_vec::<i64>().unwrap(),
        vec![1, -1, -1, 0, 0, 0, 0]
    );
    assert_eq!(
        base.pow(-2).to_vec::<i64>().unwrap(),
        vec![1, 1, 1, 0, 0, 0, 0]
    );
    let exps = m.create(&[-3i64, -3, -4, -1, -1, -2, i64::MIN], [7]);
    assert_eq!(
        base.pow(exps).to_vec::<i64>().unwrap(),
        vec![1, -1, 1, 0, 0, 0, 0]
    );
    let e = m.create(&[i64::MIN, i64::MIN + 1], [2]);
    assert_eq!(
        m.create(&[-1i64, -1], [2]).pow(e).to_vec::<i64>().unwrap(),
        vec![1, -1]
    );
    // Exponents past u32 are not truncated (2^(2^33+1) wraps to 0, not 2).
    let big = m.create(&[-1i64, 2, 1, 3], [4]).pow((1i64 << 33) | 1);
    assert_eq!(
        big.to_vec::<i64>().unwrap(),
        vec![
            -1,
            0,
            1,
            3i64.wrapping_pow(1 << 31).wrapping_pow(4).wrapping_mul(3)
        ]
    );
    let b32 = m.create(&[1i32, -1, 3], [3]);
    assert_eq!(b32.pow(-5).to_vec::<i32>().unwrap(), vec![1, -1, 0]);
    m.close();
}

/// Issue 11: relu propagates NaN, like numpy's `maximum(x, 0)` and PyTorch's `relu`.
#[test]
fn relu_propagates_nan() {
    let m = NDManager::new();
    let x = m.create(&[f64::NAN, -1.0, 0.0, 2.0, -0.0], [5]);
    let r = x.relu().to_vec::<f64>().unwrap();
    assert!(r[0].is_nan());
    assert_eq!(&r[1..], &[0.0, 0.0, 2.0, 0.0]);
    let x32 = m.create(&[f32::NAN, 3.0], [2]);
    let r = x32.relu().to_vec::<f32>().unwrap();
    assert!(r[0].is_nan());
    assert_eq!(r[1], 3.0);
    m.close();
}
