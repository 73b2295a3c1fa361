//! Indexing views: `get` values (steps, negatives, ellipsis), `set`, shared storage and
//! the lifetime of views against their base (docs/ownership.md rule 6).

use crate::common::{f32s, iota};
use ndscope::{DType, NDManager, NDScope, NdError};

#[test]
fn get_integers_and_slices() {
    let m = NDManager::new();
    let a = iota(&m, &[3, 4]);
    // [[0 1 2 3] [4 5 6 7] [8 9 10 11]]
    let r = a.get("1");
    assert_eq!(r.shape().dims(), &[4]);
    assert_eq!(f32s(r), vec![4.0, 5.0, 6.0, 7.0]);
    assert_eq!(f32s(a.get("-1")), vec![8.0, 9.0, 10.0, 11.0]);
    let e = a.get("2, 3");
    assert_eq!(e.shape().ndim(), 0);
    assert_eq!(e.to_scalar::<f32>().unwrap(), 11.0);
    assert_eq!(a.get("-1, -4").to_scalar::<f32>().unwrap(), 8.0);
    let s = a.get("1:3, :, ");
    assert_eq!(s.shape().dims(), &[2, 4]);
    let s = a.get("0:2, 1:3");
    assert_eq!(f32s(s), vec![1.0, 2.0, 5.0, 6.0]);
    assert_eq!(
        f32s(a.get(":, 1:")),
        vec![1., 2., 3., 5., 6., 7., 9., 10., 11.]
    );
    assert_eq!(f32s(a.get(":, 0")), vec![0.0, 4.0, 8.0]);
    assert_eq!(f32s(a.get("..., 0")), vec![0.0, 4.0, 8.0]);
    assert_eq!(f32s(a.get("1, ...")), vec![4.0, 5.0, 6.0, 7.0]);
    assert_eq!(a.get("...").shape().dims(), &[3, 4]);
    assert_eq!(a.get("").shape().dims(), &[3, 4]);
    // Slices clamp like Python; empty slices are fine.
    assert_eq!(f32s(a.get("1, 2:100")), vec![6.0, 7.0]);
    assert_eq!(f32s(a.get("1, -100:2")), vec![4.0, 5.0]);
    assert_eq!(a.get("3:, :").shape().dims(), &[0, 4]);
    assert_eq!(a.get("2:1").shape().dims(), &[0, 4]);
    assert!(f32s(a.get("2:1")).is_empty());
    m.close();
}

#[test]
fn get_steps_and_negative_steps() {
    let m = NDManager::new();
    let v = iota(&m, &[6]);
    assert_eq!(f32s(v.get("::2")), vec![0.0, 2.0, 4.0]);
    assert_eq!(f32s(v.get("1::2")), vec![1.0, 3.0, 5.0]);
    assert_eq!(f32s(v.get("::-1")), vec![5.0, 4.0, 3.0, 2.0, 1.0, 0.0]);
    assert_eq!(f32s(v.get("5::-1")), vec![5.0, 4.0, 3.0, 2.0, 1.0, 0.0]);
    assert_eq!(f32s(v.get("4:1:-1")), vec![4.0, 3.0, 2.0]);
    assert_eq!(f32s(v.get("::-2")), vec![5.0, 3.0, 1.0]);
    assert_eq!(f32s(v.get("-2::-3")), vec![4.0, 1.0]);
    assert_eq!(f32s(v.get("100:-100:-4")), vec![5.0, 1.0]);
    assert!(f32s(v.get("1:4:-1")).is_empty());

    let a = iota(&m, &[3, 4]);
    let r = a.get("::-1, ::-2");
    assert_eq!(r.shape().dims(), &[3, 2]);
    assert_eq!(f32s(r), vec![11.0, 9.0, 7.0, 5.0, 3.0, 1.0]);
    // Views of views compose.
    let rr = r.get("::-1");
    assert_eq!(f32s(rr), vec![3.0, 1.0, 7.0, 5.0, 11.0, 9.0]);
    assert_eq!(rr.get("1, 0").to_scalar::<f32>().unwrap(), 7.0);
    let t = a.transpose().get("1:3, ::-1");
    assert_eq!(f32s(t), vec![9.0, 5.0, 1.0, 10.0, 6.0, 2.0]);
    // A reversed view computes like any array.
    assert_eq!(f32s(v.get("::-1") + v), vec![5.0; 6]);
    assert_eq!(
        f32s(v.get("::-1").reshape([2, 3])),
        vec![5., 4., 3., 2., 1., 0.]
    );
    m.close();
}

#[test]
fn get_on_3d_with_ellipsis() {
    let m = NDManager::new();
    let a = iota(&m, &[2, 3, 4]);
    let x = a.get("..., 1");
    assert_eq!(x.shape().dims(), &[2, 3]);
    assert_eq!(f32s(x), vec![1.0, 5.0, 9.0, 13.0, 17.0, 21.0]);
    let y = a.get("1, ..., ::3");
    assert_eq!(y.shape().dims(), &[3, 2]);
    assert_eq!(f32s(y), vec![12.0, 15.0, 16.0, 19.0, 20.0, 23.0]);
    let z = a.get("-1, 1");
    assert_eq!(f32s(z), vec![16.0, 17.0, 18.0, 19.0]);
    m.close();
}

#[test]
fn get_errors() {
    let m = NDManager::new();
    let a = iota(&m, &[3, 4]);
    let bad = |idx: &str| match a.try_get(idx) {
        Err(NdError::Index {
            op: "get",
            msg,
            array,
        }) => {
            assert_eq!(array.shape.dims(), &[3, 4]);
            msg
        }
        other => panic!("{idx}: expected an Index error, got {other:?}"),
    };
    assert!(bad("3").contains("out of bounds"));
    assert!(bad("-4").contains("out of bounds"));
    assert!(bad("0, 4").contains("axis 1"));
    assert!(bad("0, 0, 0").contains("too many"));
    assert!(bad("x").contains("'x'"));
    assert!(bad("1:a").contains("'a'"));
    assert!(bad("::0").contains("zero"));
    assert!(bad("1:2:3:4").contains("':'"));
    assert!(bad("..., ...").contains("'...'"));
    assert!(bad("1,,2").contains("empty"));
    // The panicking form panics with the same text.
    let err = std::panic::catch_unwind(|| a.get("7")).unwrap_err();
    let msg = err.downcast_ref::<String>().unwrap();
    assert!(msg.contains("index 7 is out of bounds"), "{msg}");
    m.close();
}

#[test]
fn set_scalars_and_arrays() {
    let m = NDManager::new();
    let a = m.zeros([3, 4], DType::F32);
    a.set("1", 1.0);
    a.set(":, -1", 2);
    a.set("::2, 0:2", m.create(&[7.0f32, 8.0], [2]));
    assert_eq!(
        f32s(a),
        vec![7., 8., 0., 2., 1., 1., 1., 2., 7., 8., 0., 2.]
    );
    // A full array of the region's shape, written backwards.
    a.set("0, ::-1", m.create(&[1.0f32, 2.0, 3.0, 4.0], [4]));
    assert_eq!(f32s(a.get("0")), vec![4.0, 3.0, 2.0, 1.0]);
    // Everything.
    a.set("", 0.5);
    assert_eq!(f32s(a), vec![0.5; 12]);
    // Bool targets store 0/1.
    let b = m.zeros([3], DType::Bool);
    b.set("1", 5);
    assert_eq!(b.to_vec::<bool>().unwrap(), vec![false, true, false]);
    // Integer targets convert scalars.
    let i = m.zeros([2], DType::I64);
    i.set("-1", i64::MAX);
    assert_eq!(i.to_vec::<i64>().unwrap(), vec![0, i64::MAX]);
    m.close();
}

/// Rule 6 (docs/ownership.md): a view shares its base's storage, so `set` from an
/// overlapping view must read the old values.
#[test]
fn set_from_an_overlapping_view_reads_the_old_values() {
    let m = NDManager::new();
    let v = iota(&m, &[5]);
    v.set("1:", v.get(":4"));
    assert_eq!(f32s(v), vec![0.0, 0.0, 1.0, 2.0, 3.0]);
    let w = iota(&m, &[4]);
    w.set("", w.get("::-1"));
    assert_eq!(f32s(w), vec![3.0, 2.0, 1.0, 0.0]);
    m.close();
}

#[test]
fn set_errors() {
    let m = NDManager::new();
    let a = m.zeros([2, 3], DType::F32);
    assert!(matches!(
        a.try_set("2", 1.0),
        Err(NdError::Index { op: "set", .. })
    ));
    assert!(matches!(
        a.try_set("0:1:0", 1.0),
        Err(NdError::Index { op: "set", .. })
    ));
    assert!(matches!(
        a.try_set("0", m.create(&[1.0f64, 2.0, 3.0], [3])),
        Err(NdError::DTypeMismatch { op: "set", .. })
    ));
    match a.try_set("0", m.create(&[1.0f32, 2.0], [2])) {
        Err(NdError::ShapeMismatch { op: "set", lhs, .. }) => {
            assert_eq!(lhs.shape.dims(), &[3]);
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
    // Nothing was written by the failed calls.
    assert_eq!(f32s(a), vec![0.0; 6]);
    m.close();
}

/// Rule 6 (docs/ownership.md): views share one buffer; a write through any is seen by all.
#[test]
fn views_share_storage_both_ways() {
    let m = NDManager::new();
    let a = iota(&m, &[3, 4]);
    let base = m.memory();
    let row = a.get("1");
    let col = a.get(":, 2");
    let t = a.transpose();
    let r = a.reshape([12]);
    let e = a.expand_dims(0).squeeze();
    let s = m.memory();
    assert_eq!(s.live_buffers, base.live_buffers);
    assert_eq!(s.live_bytes, base.live_bytes);
    assert_eq!(s.live_arrays, base.live_arrays + 6); // expand_dims made one too

    // Writes through the base are seen by every view.
    a.set("1, 2", 100.0);
    assert_eq!(f32s(row)[2], 100.0);
    assert_eq!(f32s(col)[1], 100.0);
    assert_eq!(t.get("2, 1").to_scalar::<f32>().unwrap(), 100.0);
    assert_eq!(f32s(r)[6], 100.0);
    assert_eq!(e.get("1, 2").to_scalar::<f32>().unwrap(), 100.0);

    // Writes through a view are seen by the base and the other views.
    row.set("0", -1.0);
    col.set("::2", -2.0);
    t.set("3", 9.0);
    assert_eq!(
        f32s(a),
        vec![0., 1., -2., 9., -1., 5., 100., 9., 8., 9., -2., 9.]
    );
    assert_eq!(f32s(r), f32s(a));
    // In-place arithmetic through a strided view.
    col.try_addi(1.0).unwrap();
    assert_eq!(f32s(a.get(":, 2")), vec![-1.0, 101.0, -1.0]);
    m.close();
}

/// Rule 6 (docs/ownership.md): the data lives, and stays accounted, until the last view is
/// freed.
#[test]
fn a_view_outlives_its_closed_base() {
    let m = NDManager::new();
    let a = iota(&m, &[4, 4]);
    let baseline = m.memory();
    let b = m.create(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], [2, 3]);
    let with_b = m.memory();
    assert_eq!(with_b.live_bytes, baseline.live_bytes + 6 * 4);
    assert_eq!(with_b.live_buffers, baseline.live_buffers + 1);

    let v = b.get("::-1, 1:");
    b.close();
    assert!(b.is_closed());
    // The data stays readable and accounted until the last view goes.
    assert_eq!(f32s(v), vec![5.0, 6.0, 2.0, 3.0]);
    let after = m.memory();
    assert_eq!(after.live_bytes, with_b.live_bytes);
    assert_eq!(after.live_buffers, with_b.live_buffers);
    assert_eq!(after.live_arrays, with_b.live_arrays);
    // A view of the view shares it too.
    let w = v.transpose();
    assert_eq!(m.memory().live_bytes, with_b.live_bytes);
    v.close();
    assert_eq!(f32s(w), vec![5.0, 2.0, 6.0, 3.0]);
    assert_eq!(m.memory().live_bytes, with_b.live_bytes);
    w.close();
    let end = m.memory();
    assert_eq!(end.live_bytes, baseline.live_bytes);
    assert_eq!(end.live_buffers, baseline.live_buffers);
    assert_eq!(end.live_arrays, baseline.live_arrays);
    assert!(matches!(b.try_get("0"), Err(NdError::Closed(_))));
    assert!(matches!(b.try_set("0", 1.0), Err(NdError::Closed(_))));
    assert!(matches!(b.try_reshape([6]), Err(NdError::Closed(_))));
    let _ = a;
    m.close();
    assert_eq!(m.memory().live_bytes, 0);
}

/// Rule 6 (docs/ownership.md): a kept view keeps the data of its freed base.
#[test]
fn a_view_outliving_a_scope_keeps_the_data() {
    let m = NDManager::new();
    let keep = {
        let _s = NDScope::new();
        let tmp = m.arange(0.0, 6.0, 1.0, DType::F32);
        let v = tmp.get("::2");
        v.keep();
        v
    };
    assert_eq!(f32s(keep), vec![0.0, 2.0, 4.0]);
    let s = m.memory();
    assert_eq!((s.live_arrays, s.live_buffers, s.live_bytes), (1, 1, 24));
    keep.close();
    assert_eq!(m.memory().live_bytes, 0);
    m.close();
}

/// Rules 1 and 6 (docs/ownership.md): a view belongs to its base's manager and closes with
/// it.
#[test]
fn views_follow_manager_close() {
    let m = NDManager::new();
    let a = iota(&m, &[2, 2]);
    let v = a.get("0");
    m.close();
    assert!(v.is_closed());
    assert!(matches!(v.try_get("0"), Err(NdError::Closed(_))));
}

/// An array that owns its buffer alone moves it into a shared record when something
/// first shares it: a view, or a large op reading it outside the lock. Accounting is
/// the same either way: one buffer, charged once, moved with the array between managers,
/// and back to the baseline when everything is freed.
#[test]
fn sharing_an_owned_buffer_keeps_its_accounting() {
    let m = NDManager::new();
    let other = NDManager::new();
    let base = m.memory();
    let n = 1 << 16; // above the size that ops read with no lock held
    let a = m.ones([n], DType::F32);
    let bytes = n * 4;
    assert_eq!(m.memory().live_bytes, base.live_bytes + bytes);
    // A large op snapshots `a` (its buffer becomes shared); the result is new data.
    let s = a.sum();
    assert_eq!(f32s(s), vec![n as f32]);
    s.close();
    // An in-place write still sees no reader and writes.
    a.try_addi(1.0).unwrap();
    let first = a.get("0");
    assert_eq!(f32s(first), vec![2.0]);
    first.close();
    // Moving the (now shared) array moves its charge.
    a.attach(&other);
    assert_eq!(m.memory().live_bytes, base.live_bytes);
    assert_eq!(other.memory().live_bytes, bytes);
    assert_eq!(other.memory().live_buffers, 1);
    // A view of it adds an array, not bytes; freeing the base leaves the view charged.
    let v = a.get("10:20");
    assert_eq!(other.memory().live_bytes, bytes);
    a.close();
    assert_eq!(other.memory().live_bytes, bytes);
    assert_eq!(f32s(v), vec![2.0; 10]);
    v.close();
    assert_eq!(other.memory().live_bytes, 0);
    assert_eq!(other.memory().live_buffers, 0);
    // A small owned array viewed, then the view freed first, then the base.
    let b = m.create(&[1.0f32, 2.0, 3.0], [3]);
    let w = b.get("1:");
    assert_eq!(m.memory().live_buffers, base.live_buffers + 1);
    w.close();
    assert_eq!(m.memory().live_bytes, base.live_bytes + 12);
    b.close();
    assert_eq!(m.memory().live_bytes, base.live_bytes);
    assert_eq!(m.memory().live_arrays, base.live_arrays);
    other.close();
    m.close();
}

/// Elementwise ops walk a transposed operand in square tiles, split across threads when
/// large (the tiles and slabs have remainders here: no side is a multiple of 32).
#[test]
fn elementwise_ops_on_large_transposed_views_match_index_arithmetic() {
    let m = NDManager::new();
    let check = |got: Vec<f32>, want: Vec<f32>| {
        assert_eq!(got.len(), want.len());
        let bad = got.iter().zip(&want).position(|(g, w)| g != w);
        assert!(bad.is_none(), "element {bad:?}: {got:?} != {want:?}");
    };
    // [70,45] transposed: t[i,j] = a[j,i] = j*45 + i.
    let t = iota(&m, &[70, 45]).transpose();
    let want = |f: &dyn Fn(usize, usize) -> f32| {
        (0..45)
            .flat_map(|i| (0..70).map(move |j| (i, j)))
            .map(|(i, j)| f(i, j))
            .collect::<Vec<f32>>()
    };
    check(f32s(t * 2.0), want(&|i, j| 2.0 * (j * 45 + i) as f32));
    check(f32s(t.abs()), want(&|i, j| (j * 45 + i) as f32));
    check(f32s(t - t), vec![0.0; 45 * 70]);
    let mut acc = m.zeros([45, 70], DType::F32);
    acc += t;
    acc += t;
    check(f32s(acc), want(&|i, j| 2.0 * (j * 45 + i) as f32));
    // A permuted 3-D view minus a plain array: p[i,j,k] = a[j,k,i].
    let p = iota(&m, &[5, 40, 33]).permute(&[2, 0, 1]);
    let plain = iota(&m, &[33, 5, 40]);
    let mut w = vec![];
    for i in 0..33 {
        for j in 0..5 {
            for k in 0..40 {
                w.push((j * 40 * 33 + k * 33 + i) as f32 - (i * 200 + j * 40 + k) as f32);
            }
        }
    }
    check(f32s(p - plain), w);
    // Reversed, stepped and transposed: v[i,j] = a[89-j, 2i].
    let v = iota(&m, &[90, 80]).get("::-1, ::2").transpose();
    let mut w = vec![];
    for i in 0..40 {
        for j in 0..90 {
            w.push(((89 - j) * 80 + 2 * i) as f32 + 1.0);
        }
    }
    check(f32s(v + 1.0), w);
    // Large enough to split across threads, plus a broadcast row: t[i,j] + j.
    let big = iota(&m, &[700, 401]).transpose();
    let row = iota(&m, &[700]);
    let mut w = vec![];
    for i in 0..401 {
        for j in 0..700 {
            w.push((j * 401 + i + j) as f32);
        }
    }
    check(f32s(big + row), w);
    let mut w = vec![];
    for i in 0..401 {
        for j in 0..700 {
            w.push((j * 401 + i) as f32 * 0.5);
        }
    }
    check(f32s(big * 0.5), w);
    m.close();
}
