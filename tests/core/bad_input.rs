//! Bad-input matrix (issue 7.4): public fallible functions called with a closed array,
//! a closed manager, a capped manager, mismatched shapes and dtypes, invalid axes and
//! indices, zero-size and 0-d arrays, NaN and infinity, shapes whose byte size
//! overflows and allocations too large for the machine. Each returns the documented
//! `NdError` (or a correct result for the legal edge cases), and the counters of the
//! test's manager are unchanged after each error: temporaries made before an error are
//! freed.
//!
//! Tests run in parallel threads of one process, so counters are taken from a manager
//! each test created (`m.memory()`; `fails!` and `counts` in `tests/common`).

use crate::common::counts;
use crate::fails;
use ndscope::{DType, NDArray, NDManager, NDScope, NdError};

/// Every fallible array function, as closures over (the array under test, a good array
/// of the same shape and dtype). Each returns `Err` for a closed array under test.
type ArrayFn = (&'static str, fn(NDArray, NDArray) -> Result<(), NdError>);

thread_local! {
    /// Helper arrays made from the good array before the counters are read, so that a
    /// closure makes no temporaries of its own: (cond = good > 0, good transposed).
    static HELPERS: std::cell::Cell<Option<(NDArray, NDArray)>> = const { std::cell::Cell::new(None) };
}

fn h_cond(_good: NDArray) -> NDArray {
    HELPERS.with(|h| h.get().expect("helpers").0)
}

fn h_t(_good: NDArray) -> NDArray {
    HELPERS.with(|h| h.get().expect("helpers").1)
}

fn array_fns() -> Vec<ArrayFn> {
    fn ok<T>(r: ndscope::Result<T>) -> Result<(), NdError> {
        r.map(|_| ())
    }
    vec![
        ("shape", |a, _| ok(a.try_shape())),
        ("dtype", |a, _| ok(a.try_dtype())),
        ("manager", |a, _| ok(a.try_manager())),
        ("to_vec", |a, _| ok(a.to_vec::<f32>())),
        ("to_scalar", |a, _| ok(a.to_scalar::<f32>())),
        ("retain", |a, _| ok(a.try_retain())),
        ("release", |a, _| ok(a.try_release())),
        ("ref_count", |a, _| ok(a.try_ref_count())),
        ("detach", |a, _| ok(a.try_detach())),
        ("attach", |a, b| ok(a.try_attach(&b.manager()))),
        ("temp_attach", |a, b| ok(a.try_temp_attach(&b.manager()))),
        ("add", |a, b| ok(a.try_add(b))),
        ("add (rhs)", |a, b| ok(b.try_add(a))),
        ("sub", |a, b| ok(a.try_sub(b))),
        ("mul", |a, _| ok(a.try_mul(2.0))),
        ("div", |a, b| ok(b.try_div(a))),
        ("pow", |a, b| ok(a.try_pow(b))),
        ("maximum", |a, b| ok(a.try_maximum(b))),
        ("minimum", |a, b| ok(b.try_minimum(a))),
        ("addi", |a, b| a.try_addi(b)),
        ("addi (rhs)", |a, b| b.try_addi(a)),
        ("subi", |a, _| a.try_subi(1.0)),
        ("muli", |a, _| a.try_muli(1.0)),
        ("divi", |a, _| a.try_divi(1.0)),
        ("neg", |a, _| ok(a.try_neg())),
        ("abs", |a, _| ok(a.try_abs())),
        ("square", |a, _| ok(a.try_square())),
        ("relu", |a, _| ok(a.try_relu())),
        ("exp", |a, _| ok(a.try_exp())),
        ("log", |a, _| ok(a.try_log())),
        ("sqrt", |a, _| ok(a.try_sqrt())),
        ("sin", |a, _| ok(a.try_sin())),
        ("cos", |a, _| ok(a.try_cos())),
        ("tanh", |a, _| ok(a.try_tanh())),
        ("sigmoid", |a, _| ok(a.try_sigmoid())),
        ("eq", |a, b| ok(a.try_eq(b))),
        ("ne", |a, b| ok(b.try_ne(a))),
        ("gt", |a, b| ok(a.try_gt(b))),
        ("ge", |a, _| ok(a.try_ge(0.0))),
        ("lt", |a, b| ok(a.try_lt(b))),
        ("le", |a, b| ok(a.try_le(b))),
        ("sum", |a, _| ok(a.try_sum())),
        ("mean", |a, _| ok(a.try_mean())),
        ("max", |a, _| ok(a.try_max())),
        ("min", |a, _| ok(a.try_min())),
        ("prod", |a, _| ok(a.try_prod())),
        ("sum_axes", |a, _| ok(a.try_sum_axes(&[0], false))),
        ("mean_axes", |a, _| ok(a.try_mean_axes(&[1], true))),
        ("max_axes", |a, _| ok(a.try_max_axes(&[0], false))),
        ("min_axes", |a, _| ok(a.try_min_axes(&[-1], false))),
        ("prod_axes", |a, _| ok(a.try_prod_axes(&[0, 1], false))),
        ("argmax", |a, _| ok(a.try_argmax())),
        ("argmin", |a, _| ok(a.try_argmin())),
        ("argmax_axis", |a, _| ok(a.try_argmax_axis(0, false))),
        ("argmin_axis", |a, _| ok(a.try_argmin_axis(1, true))),
        ("get", |a, _| ok(a.try_get("0"))),
        ("set", |a, _| a.try_set("0", 1.0)),
        ("set (value)", |a, b| b.try_set("..", a)),
        ("reshape", |a, _| ok(a.try_reshape([6]))),
        ("reshape_infer", |a, _| ok(a.try_reshape_infer(&[-1]))),
        ("flatten", |a, _| ok(a.try_flatten())),
        ("transpose", |a, _| ok(a.try_transpose())),
        ("permute", |a, _| ok(a.try_permute(&[1, 0]))),
        ("expand_dims", |a, _| ok(a.try_expand_dims(0))),
        ("squeeze", |a, _| ok(a.try_squeeze())),
        ("squeeze_axis", |a, _| ok(a.try_squeeze_axis(0))),
        ("broadcast_to", |a, _| ok(a.try_broadcast_to([4, 2, 3]))),
        ("concat", |a, b| ok(NDArray::try_concat(&[b, a], 0))),
        ("stack", |a, b| ok(NDArray::try_stack(&[b, a], 0))),
        ("to_dtype", |a, _| ok(a.try_to_dtype(DType::F64))),
        ("softmax", |a, _| ok(a.try_softmax(-1))),
        ("log_softmax", |a, _| ok(a.try_log_softmax(0))),
        ("clip", |a, _| ok(a.try_clip(0.0, 1.0))),
        ("where (x)", |a, b| ok(h_cond(b).try_where_(a, b))),
        ("where (cond)", |a, b| ok(a.try_gt(0.0)?.try_where_(b, b))),
        ("matmul", |a, b| ok(a.try_matmul(h_t(b)))),
        ("matmul (rhs)", |a, b| ok(b.try_matmul(a))),
        ("dot", |a, b| ok(a.try_dot(h_t(b)))),
        ("escape", |a, _| ok(NDScope::new().try_escape(a))),
        ("scope register", |a, _| ok(NDScope::new().try_register(a))),
    ]
}

/// Rule 7 (docs/ownership.md).
/// Every function on a closed array: `Closed` naming it, with the reason; nothing left.
#[test]
fn closed_array_everywhere() {
    let m = NDManager::new();
    let good = m.create(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    HELPERS.with(|h| h.set(Some((good.gt(0.0), good.transpose()))));
    let sub = m.new_sub_manager();
    let reasons = ["explicit", "release", "scope", "manager"];
    for (name, f) in array_fns() {
        for why in reasons {
            let a = match why {
                "explicit" => {
                    let a = m.create(&[0.5f32; 6], [2, 3]);
                    a.close();
                    a
                }
                "release" => {
                    let a = m.create(&[0.5f32; 6], [2, 3]);
                    assert!(a.release());
                    a
                }
                "scope" => {
                    let _s = NDScope::new();
                    m.create(&[0.5f32; 6], [2, 3])
                }
                _ => {
                    let s = sub.new_sub_manager();
                    let a = s.create(&[0.5f32; 6], [2, 3]);
                    s.close();
                    a
                }
            };
            let before = counts(&m);
            let e = f(a, good).expect_err(name);
            assert_eq!(
                counts(&m),
                before,
                "{name} on a closed array changed counters"
            );
            match &e {
                NdError::Closed(info) => {
                    assert_eq!(info.array.uid, a.uid(), "{name}: {e}");
                    let r = info.reason.to_string();
                    let expected = match why {
                        "explicit" => "explicit close()",
                        "release" => "release()",
                        "scope" => "close of the scope",
                        _ => "close of manager",
                    };
                    assert!(r.contains(expected), "{name} ({why}): {e}");
                }
                other => panic!("{name} ({why}): expected Closed, got {other:?}"),
            }
        }
    }
    assert_eq!(counts(&m), (3, 2, 30));
    m.close();
}

/// Rule 1 (docs/ownership.md).
/// Every creating function on a closed manager: `ManagerClosed`.
#[test]
fn closed_manager_everywhere() {
    let parent = NDManager::new();
    let m = parent.new_sub_manager();
    let other = parent.new_sub_manager();
    let a = other.ones([2], DType::F32);
    m.close();
    let p = &parent;
    use NdError::ManagerClosed as C;
    fails!(p, m.try_zeros([2], DType::F32), C { .. });
    fails!(p, m.try_ones([2], DType::F32), C { .. });
    fails!(p, m.try_full([2], 1.0, DType::F32), C { .. });
    fails!(p, m.try_create(&[1.0f32], [1]), C { .. });
    fails!(p, m.try_arange(0.0, 3.0, 1.0, DType::F32), C { .. });
    fails!(p, m.try_linspace(0.0, 1.0, 3, DType::F32), C { .. });
    fails!(p, m.try_eye(2, DType::F32), C { .. });
    fails!(p, m.try_random_normal(0.0, 1.0, [2], DType::F32), C { .. });
    fails!(p, m.try_random_uniform(0.0, 1.0, [2], DType::F32), C { .. });
    fails!(p, m.try_random_integer(0, 5, [2], DType::I64), C { .. });
    fails!(p, m.try_new_sub_manager(), C { .. });
    fails!(p, a.try_attach(&m), C { .. });
    fails!(p, a.try_temp_attach(&m), C { .. });
    assert!(m.attach_resource(ndscope::NDList::new()).is_err());
    assert_eq!(m.memory(), Default::default());
    assert!(!m.is_capped() && m.arrays().is_empty() && m.children().is_empty());
    m.close(); // idempotent
    m.cap(); // no effect, no panic
    assert_eq!(a.manager(), other);
    parent.close();
}

/// Rule 8 (docs/ownership.md).
/// A capped manager takes no new arrays (creation, op results whose first input it
/// owns, attach); its sub-managers and arrays elsewhere keep working.
#[test]
fn capped_manager_everywhere() {
    let parent = NDManager::new();
    let m = parent.new_sub_manager();
    let x = m.ones([2, 2], DType::F32);
    let other = parent.new_sub_manager();
    let y = other.ones([2, 2], DType::F32);
    m.cap();
    let p = &parent;
    use NdError::ManagerCapped as C;
    fails!(p, m.try_zeros([2], DType::F32), C { .. });
    fails!(p, m.try_create(&[1.0f32], [1]), C { .. });
    fails!(p, m.try_arange(0.0, 3.0, 1.0, DType::F32), C { .. });
    fails!(p, m.try_random_normal(0.0, 1.0, [2], DType::F32), C { .. });
    fails!(p, m.try_random_integer(0, 5, [2], DType::I64), C { .. });
    fails!(p, x.try_add(y), C { .. });
    fails!(p, x.try_mul(2.0), C { .. });
    fails!(p, x.try_sum(), C { .. });
    fails!(p, x.try_reshape([4]), C { .. });
    fails!(p, x.try_transpose(), C { .. });
    fails!(p, x.try_get("0"), C { .. });
    fails!(p, x.try_matmul(y), C { .. });
    fails!(p, NDArray::try_concat(&[x, y], 0), C { .. });
    fails!(p, y.try_attach(&m), C { .. });
    fails!(p, y.try_temp_attach(&m), C { .. });
    // In-place updates of arrays it owns still work (no new array).
    x.try_addi(1.0).unwrap();
    // The capped array as a second input: the result belongs to the first's manager.
    let z = y.try_add(x).unwrap();
    assert_eq!(z.manager(), other);
    // Sub-managers of a capped manager work.
    let sub = m.try_new_sub_manager().unwrap();
    let s = sub.zeros([3], DType::F32);
    assert_eq!(s.manager(), sub);
    // Moving an array out of a capped manager works.
    x.try_attach(&other).unwrap();
    parent.close();
}

#[test]
fn mismatched_shapes_and_dtypes() {
    let m = NDManager::new();
    let a = m.ones([2, 3], DType::F32);
    let b = m.ones([4], DType::F32);
    let d = m.ones([2, 3], DType::F64);
    let i = m.ones([2, 3], DType::I32);
    let t = m.ones([2, 3], DType::Bool);
    use NdError::*;
    fails!(m, a.try_add(b), ShapeMismatch { .. });
    fails!(m, a.try_maximum(b), ShapeMismatch { .. });
    fails!(m, a.try_eq(b), ShapeMismatch { .. });
    fails!(m, a.try_addi(b), ShapeMismatch { .. });
    let b22 = b.try_reshape([2, 2]).unwrap();
    fails!(m, b22.try_addi(a), ShapeMismatch { .. });
    fails!(m, a.try_matmul(a), ShapeMismatch { .. });
    fails!(m, a.try_dot(b), ShapeMismatch { .. });
    fails!(m, a.try_set("0", b), ShapeMismatch { .. });
    let cond = a.try_gt(0.0).unwrap();
    fails!(m, cond.try_where_(a, b), ShapeMismatch { .. });
    fails!(m, a.try_reshape([4]), InvalidShape { .. });
    fails!(m, a.try_reshape_infer(&[-1, 4]), InvalidShape { .. });
    fails!(m, a.try_broadcast_to([3, 2]), InvalidShape { .. });
    fails!(
        m,
        NDArray::try_concat(&[a, b], 0),
        InvalidShape { .. } | ShapeMismatch { .. }
    );
    fails!(
        m,
        NDArray::try_stack(&[a, b], 0),
        InvalidShape { .. } | ShapeMismatch { .. }
    );
    fails!(m, NDArray::try_concat(&[], 0), InvalidArgument { .. });
    fails!(m, m.try_create(&[1.0f32, 2.0], [3]), InvalidShape { .. });

    fails!(m, a.try_add(d), DTypeMismatch { .. });
    fails!(m, a.try_addi(d), DTypeMismatch { .. });
    fails!(m, a.try_lt(i), DTypeMismatch { .. });
    let (dt, d0) = (d.try_transpose().unwrap(), d.try_get("0").unwrap());
    fails!(m, a.try_matmul(dt), DTypeMismatch { .. });
    fails!(m, a.try_set("0", d0), DTypeMismatch { .. });
    fails!(m, NDArray::try_concat(&[a, d], 0), DTypeMismatch { .. });
    fails!(m, t.try_add(t), UnsupportedDType { .. });
    fails!(m, t.try_addi(1.0), UnsupportedDType { .. });
    fails!(m, t.try_sum(), UnsupportedDType { .. });
    fails!(m, t.try_neg(), UnsupportedDType { .. });
    fails!(m, i.try_exp(), UnsupportedDType { .. });
    fails!(m, i.try_softmax(0), UnsupportedDType { .. });
    fails!(m, a.try_one_hot(3, DType::F32), UnsupportedDType { .. });
    fails!(m, a.try_where_(a, a), UnsupportedDType { .. });
    fails!(m, a.to_vec::<f64>(), ElementType { .. });
    fails!(m, a.to_vec::<bool>(), ElementType { .. });
    m.close();
}

#[test]
fn invalid_axes_and_indices() {
    let m = NDManager::new();
    let a = m.arange(0.0, 6.0, 1.0, DType::F32).reshape([2, 3]);
    let labels = m.create(&[0i64, 5], [2]);
    use NdError::*;
    fails!(m, a.try_sum_axes(&[2], false), AxisOutOfRange { .. });
    fails!(m, a.try_mean_axes(&[-3], false), AxisOutOfRange { .. });
    fails!(m, a.try_sum_axes(&[0, 0], false), InvalidArgument { .. });
    fails!(m, a.try_sum_axes(&[1, -1], false), InvalidArgument { .. });
    fails!(m, a.try_argmax_axis(2, false), AxisOutOfRange { .. });
    fails!(m, a.try_softmax(2), AxisOutOfRange { .. });
    fails!(m, a.try_log_softmax(-3), AxisOutOfRange { .. });
    fails!(m, a.try_expand_dims(4), AxisOutOfRange { .. });
    fails!(m, a.try_squeeze_axis(5), AxisOutOfRange { .. });
    fails!(
        m,
        a.try_squeeze_axis(0),
        InvalidArgument { .. } | InvalidShape { .. }
    );
    fails!(m, a.try_permute(&[0, 0]), InvalidArgument { .. });
    fails!(m, a.try_permute(&[0]), InvalidArgument { .. });
    fails!(
        m,
        a.try_permute(&[0, 2]),
        InvalidArgument { .. } | AxisOutOfRange { .. }
    );
    fails!(m, NDArray::try_concat(&[a, a], 2), AxisOutOfRange { .. });
    fails!(m, NDArray::try_stack(&[a, a], 4), AxisOutOfRange { .. });
    fails!(
        m,
        a.try_reshape_infer(&[-1, -1]),
        InvalidShape { .. } | InvalidArgument { .. }
    );
    fails!(m, a.try_get("2"), Index { .. });
    fails!(m, a.try_get("-3"), Index { .. });
    fails!(m, a.try_get("0, 0, 0"), Index { .. });
    fails!(m, a.try_get("x"), Index { .. });
    fails!(m, a.try_get("0:1:0"), Index { .. });
    fails!(m, a.try_set("5", 1.0), Index { .. });
    fails!(m, a.to_scalar::<f32>(), Index { .. });
    fails!(m, labels.try_one_hot(3, DType::F32), Index { .. });
    let negative = labels - 1;
    fails!(m, negative.try_one_hot(6, DType::F32), Index { .. });
    m.close();
}

/// Zero-size and 0-d arrays: the legal cases give correct results; the rest errors.
#[test]
fn zero_size_and_zero_d_arrays() {
    let m = NDManager::new();
    let e = m.zeros([0], DType::F32);
    let e2 = m.zeros([0, 3], DType::F32);
    let s = m.scalar(3.0f32);
    assert_eq!(e.sum().to_scalar::<f32>().unwrap(), 0.0);
    assert_eq!(e.prod().to_scalar::<f32>().unwrap(), 1.0);
    assert!(e.mean().to_scalar::<f32>().unwrap().is_nan());
    assert_eq!(
        e2.sum_axes(&[0], false).to_vec::<f32>().unwrap(),
        vec![0.0; 3]
    );
    assert_eq!(e2.sum_axes(&[1], false).shape().dims(), &[0]);
    assert_eq!((e + 1.0).shape().dims(), &[0]);
    assert_eq!((e2 + m.ones([3], DType::F32)).shape().dims(), &[0, 3]);
    assert_eq!(e2.reshape([3, 0]).shape().dims(), &[3, 0]);
    assert_eq!(e2.transpose().shape().dims(), &[3, 0]);
    assert_eq!(
        e2.matmul(m.ones([3, 2], DType::F32)).shape().dims(),
        &[0, 2]
    );
    let z = e2.transpose().matmul(e2);
    assert_eq!(
        z.to_vec::<f32>().unwrap(),
        vec![0.0; 9],
        "empty inner dimension"
    );
    assert_eq!(e.to_vec::<f32>().unwrap(), Vec::<f32>::new());
    assert_eq!(m.arange(0.0, 0.0, 1.0, DType::F32).size(), 0);
    assert_eq!(m.linspace(0.0, 1.0, 0, DType::F32).size(), 0);
    assert_eq!(m.eye(0, DType::F32).shape().dims(), &[0, 0]);
    assert_eq!(NDArray::concat(&[e, e], 0).size(), 0);
    assert_eq!(e2.softmax(1).shape().dims(), &[0, 3]);

    assert_eq!(s.ndim(), 0);
    assert_eq!((s * s).to_scalar::<f32>().unwrap(), 9.0);
    assert_eq!(s.sum().to_scalar::<f32>().unwrap(), 3.0);
    assert_eq!(s.transpose().ndim(), 0);
    assert_eq!(s.reshape([1, 1]).shape().dims(), &[1, 1]);
    assert_eq!(s.expand_dims(0).shape().dims(), &[1]);
    assert_eq!(s.flatten().shape().dims(), &[1]);
    assert_eq!(
        s.dot(m.ones([2], DType::F32)).to_vec::<f32>().unwrap(),
        [3.0; 2]
    );
    assert_eq!((s + m.ones([2], DType::F32)).shape().dims(), &[2]);
    use NdError::*;
    fails!(m, e.try_max(), InvalidArgument { .. });
    fails!(m, e.try_min(), InvalidArgument { .. });
    fails!(m, e.try_argmax(), InvalidArgument { .. });
    fails!(m, e2.try_max_axes(&[0], false), InvalidArgument { .. });
    fails!(m, e.to_scalar::<f32>(), Index { .. });
    fails!(m, e.try_get("0"), Index { .. });
    fails!(m, s.try_matmul(s), InvalidArgument { .. });
    fails!(m, s.try_sum_axes(&[0], false), AxisOutOfRange { .. });
    fails!(m, s.try_softmax(0), AxisOutOfRange { .. });
    fails!(m, s.try_get("0"), Index { .. });
    fails!(m, s.try_reshape([2]), InvalidShape { .. });
    m.close();
}

#[test]
fn nan_and_infinity() {
    let m = NDManager::new();
    use NdError::*;
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    fails!(
        m,
        m.try_arange(0.0, 1.0, nan, DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_arange(0.0, inf, 1.0, DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_arange(nan, 1.0, 1.0, DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_arange(0.0, 1.0, 0.0, DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_random_normal(0.0, nan, [2], DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_random_normal(inf, 1.0, [2], DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_random_normal(0.0, -1.0, [2], DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_random_uniform(nan, 1.0, [2], DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_random_uniform(0.0, inf, [2], DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_random_uniform(1.0, 0.0, [2], DType::F32),
        InvalidArgument { .. }
    );
    fails!(
        m,
        m.try_random_integer(5, 5, [2], DType::I32),
        InvalidArgument { .. }
    );
    let a = m.create(&[1.0f32, f32::NAN, f32::INFINITY, -1.0], [4]);
    fails!(m, a.try_clip(nan, 1.0), InvalidArgument { .. });
    fails!(m, a.try_clip(1.0, 0.0), InvalidArgument { .. });
    // Legal: NaN and infinity as data.
    assert!(
        a.max().to_scalar::<f32>().unwrap().is_nan(),
        "NaN propagates"
    );
    assert!(a.sum().to_scalar::<f32>().unwrap().is_nan());
    assert_eq!(a.argmax().to_scalar::<i64>().unwrap(), 1, "a NaN wins");
    let f = m.full([2], inf, DType::F32).to_vec::<f32>().unwrap();
    assert_eq!(f, vec![f32::INFINITY; 2]);
    assert!(
        m.full([1], nan, DType::F64)
            .to_scalar::<f64>()
            .unwrap()
            .is_nan()
    );
    assert_eq!(
        m.full([1], nan, DType::I32).to_scalar::<i32>().unwrap(),
        0,
        "NaN casts to 0"
    );
    assert_eq!(
        m.full([1], inf, DType::I32).to_scalar::<i32>().unwrap(),
        i32::MAX,
        "casts saturate"
    );
    let c = a.clip(-inf, inf).to_vec::<f32>().unwrap();
    assert_eq!((c[0], c[2], c[3]), (1.0, f32::INFINITY, -1.0));
    let sm = m.create(&[f32::INFINITY, 0.0], [2]).softmax(0);
    assert!(sm.to_vec::<f32>().is_ok());
    m.close();
}

/// Shapes whose element count or byte size overflows: `InvalidShape`; allocations
/// larger than any address space: `OutOfMemory`. Never an abort, never a panic.
#[test]
fn overflowing_and_huge_shapes() {
    let m = NDManager::new();
    use NdError::*;
    let huge = usize::MAX / 2;
    fails!(m, m.try_zeros([huge, 4], DType::F32), InvalidShape { .. });
    fails!(m, m.try_zeros([1 << 62], DType::F64), InvalidShape { .. });
    fails!(
        m,
        m.try_full([1usize << 61, 2], 1.0, DType::F32),
        InvalidShape { .. }
    );
    fails!(m, m.try_eye(1 << 32, DType::F32), InvalidShape { .. });
    fails!(m, m.try_create(&[1.0f32], [huge, 4]), InvalidShape { .. });
    fails!(
        m,
        m.try_random_uniform(0.0, 1.0, [huge, 4], DType::F32),
        InvalidShape { .. }
    );
    fails!(
        m,
        m.try_linspace(0.0, 1.0, usize::MAX, DType::F32),
        InvalidShape { .. }
    );
    let a = m.ones([2], DType::F32);
    fails!(m, a.try_reshape([huge, 4]), InvalidShape { .. });
    fails!(m, a.try_broadcast_to([huge, 4, 2]), InvalidShape { .. });
    fails!(
        m,
        a.try_one_hot(usize::MAX, DType::F32),
        UnsupportedDType { .. }
    );
    // 2^61 bytes: fits in isize but in no machine's address space.
    let too_big = 1usize << 59;
    fails!(m, m.try_zeros([too_big], DType::F32), OutOfMemory { .. });
    fails!(
        m,
        m.try_ones([too_big / 2, 2], DType::F32),
        OutOfMemory { .. }
    );
    fails!(
        m,
        m.try_arange(0.0, too_big as f64, 1.0, DType::F32),
        OutOfMemory { .. }
    );
    fails!(m, m.try_eye(1 << 29, DType::F64), OutOfMemory { .. });
    fails!(m, a.try_broadcast_to([too_big, 2]), OutOfMemory { .. });
    let labels = m.create(&[0i64], [1]);
    fails!(
        m,
        labels.try_one_hot(too_big, DType::F32),
        OutOfMemory { .. }
    );
    m.close();
}

/// The random creators sample into a temporary `Vec` before allocating the array: a
/// size too large for the machine must be `OutOfMemory`, not an allocation abort.
#[test]
fn huge_random_arrays_are_out_of_memory() {
    let m = NDManager::new();
    use NdError::*;
    let too_big = 1usize << 59;
    fails!(
        m,
        m.try_random_normal(0.0, 1.0, [too_big], DType::F32),
        OutOfMemory { .. }
    );
    fails!(
        m,
        m.try_random_uniform(0.0, 1.0, [too_big], DType::F32),
        OutOfMemory { .. }
    );
    fails!(
        m,
        m.try_random_integer(0, 9, [too_big], DType::I32),
        OutOfMemory { .. }
    );
    m.close();
}
