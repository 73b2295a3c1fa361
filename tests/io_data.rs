//! `ndscope::data` (batches, split, digits) and `ndscope::io` (safetensors, .npy,
//! .npz, checkpoints, ndarray interop): values, ownership and bad input.
//!
//! numpy fixtures live in tests/fixtures/io/, made by make_fixtures.py there (numpy
//! 2.4); their expected values are repeated here as literals. The `ndarray` interop
//! test needs `--features ndarray`.
#![cfg(feature = "io")]

mod common;

use common::counts;
use ndscope::data::{Batches, TestSize, train_test_split, try_train_test_split};
use ndscope::{DType, NDArray, NDManager, NDScope, NdError};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

// ------------------------------------------------------------------ helpers

/// A fresh temporary directory for one test.
fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ndscope-io-data-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/io")
        .join(name)
}

/// dtype, shape and the elements' bit patterns (so NaN and -0.0 compare exactly).
fn bits(a: NDArray) -> (DType, Vec<usize>, Vec<u64>) {
    let v: Vec<u64> = match a.dtype() {
        DType::F32 => a
            .to_vec::<f32>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits() as u64)
            .collect(),
        DType::F64 => a
            .to_vec::<f64>()
            .unwrap()
            .iter()
            .map(|x| x.to_bits())
            .collect(),
        DType::I32 => a
            .to_vec::<i32>()
            .unwrap()
            .iter()
            .map(|&x| x as u64)
            .collect(),
        DType::I64 => a
            .to_vec::<i64>()
            .unwrap()
            .iter()
            .map(|&x| x as u64)
            .collect(),
        DType::U8 => a
            .to_vec::<u8>()
            .unwrap()
            .iter()
            .map(|&x| x as u64)
            .collect(),
        DType::Bool => a
            .to_vec::<bool>()
            .unwrap()
            .iter()
            .map(|&x| x as u64)
            .collect(),
    };
    (a.dtype(), a.shape().dims().to_vec(), v)
}

/// One [2, 3] array per dtype with edge values.
fn samples(m: &NDManager) -> Vec<(String, NDArray)> {
    vec![
        (
            "f32".into(),
            m.create(
                &[0.0f32, -0.0, f32::NAN, f32::INFINITY, -1.5e-40, f32::MAX],
                [2, 3],
            ),
        ),
        (
            "f64".into(),
            m.create(
                &[1.0 / 3.0, -0.0, f64::NAN, f64::NEG_INFINITY, 5e-324, -1e300],
                [2, 3],
            ),
        ),
        (
            "i32".into(),
            m.create(&[i32::MIN, -1, 0, 1, 7, i32::MAX], [2, 3]),
        ),
        (
            "i64".into(),
            m.create(&[i64::MIN, -1, 0, 1, 1 << 53 | 1, i64::MAX], [2, 3]),
        ),
        ("u8".into(), m.create(&[0u8, 1, 127, 128, 254, 255], [2, 3])),
        (
            "bool".into(),
            m.create(&[true, false, false, true, true, false], [2, 3]),
        ),
    ]
}

/// Every sample plus views of them that are not contiguous (transposed, reversed,
/// strided), a 0-d array, a 0-d view and zero-size arrays.
fn cases(m: &NDManager) -> Vec<(String, NDArray)> {
    let mut v = samples(m);
    let base = v.clone();
    for (name, a) in &base {
        v.push((format!("{name}.T"), a.transpose()));
        v.push((format!("{name}.rev"), a.get("::-1, ::-2")));
        v.push((format!("{name}.0d"), a.get("1, 2")));
        v.push((format!("{name}.empty"), a.get("1:1")));
    }
    v.push(("scalar".into(), m.scalar(-2.5f64)));
    v.push(("empty_3d".into(), m.zeros([2, 0, 3], DType::I64)));
    v
}

fn assert_same(got: &[(String, NDArray)], want: &[(String, NDArray)]) {
    assert_eq!(got.len(), want.len());
    for ((gn, g), (wn, w)) in got.iter().zip(want) {
        assert_eq!(gn, wn);
        assert_eq!(bits(*g), bits(*w), "{gn}");
    }
}

fn sorted(mut v: Vec<(String, NDArray)>) -> Vec<(String, NDArray)> {
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The values of a batch's `y` (an i64 row index) as a Vec.
fn ids(b: &[NDArray]) -> Vec<i64> {
    b[1].to_vec::<i64>().unwrap()
}

// ------------------------------------------------------------------ batches

/// x[i] = [20 i, 20 i + 5] (f32 [n, 2]), y[i] = i (i64 [n]).
fn xy(m: &NDManager, n: usize) -> (NDArray, NDArray) {
    let rows: Vec<i64> = (0..n as i64).collect();
    let x = m.create(&xy_values(&rows), [n, 2]);
    let y = m.create(&rows, [n]);
    (x, y)
}

#[test]
fn batches_cover_every_row_once_per_epoch() {
    let m = NDManager::new();
    let (x, y) = xy(&m, 10);
    for (bs, shuffle) in [
        (3, None),
        (5, None),
        (1, None),
        (3, Some(9)),
        (10, Some(1)),
        (4, Some(2)),
    ] {
        let mut b = Batches::new(&[x, y], bs);
        if let Some(s) = shuffle {
            b = b.shuffle(s);
        }
        assert_eq!(b.len(), 10usize.div_ceil(bs));
        for epoch in 0..3 {
            let _s = NDScope::new();
            let it = b.iter();
            assert_eq!(it.len(), b.len());
            let mut seen = Vec::new();
            for (k, batch) in it.enumerate() {
                assert_eq!(batch.len(), 2);
                let rows = ids(&batch);
                assert_eq!(rows.len(), if k + 1 < b.len() { bs } else { 10 - bs * k });
                // x's rows travel with y's.
                let xs = batch[0].to_vec::<f32>().unwrap();
                let want: Vec<f32> = xy_values(&rows);
                assert_eq!(xs, want, "bs {bs} epoch {epoch}");
                seen.extend(rows);
            }
            let order: Vec<i64> = b.order(epoch).iter().map(|&i| i as i64).collect();
            assert_eq!(seen, order);
            let set: BTreeSet<i64> = seen.iter().copied().collect();
            assert_eq!(set, (0..10).collect(), "every row exactly once");
            assert_eq!(seen.len(), 10);
        }
    }
}

/// The x rows `xy` makes for row ids `rows`: x[i] = [20 i, 20 i + 5].
fn xy_values(rows: &[i64]) -> Vec<f32> {
    rows.iter()
        .flat_map(|&i| [20.0 * i as f32, 20.0 * i as f32 + 5.0])
        .collect()
}

#[test]
fn shuffle_is_reproducible_per_seed_and_new_each_epoch() {
    let m = NDManager::new();
    let y = m.arange(0.0, 64.0, 1.0, DType::I64);
    let x = y.to_dtype(DType::F64);
    let epochs = |seed: u64| -> Vec<Vec<i64>> {
        let b = Batches::new(&[x, y], 64).shuffle(seed);
        (0..4)
            .map(|_| b.iter().flat_map(|batch| ids(&batch)).collect())
            .collect()
    };
    let a = epochs(5);
    assert_eq!(a, epochs(5), "same seed, same batches");
    assert_ne!(a, epochs(6), "another seed, another order");
    for e in 1..4 {
        assert_ne!(a[0], a[e], "epoch {e} reshuffles");
    }
    assert_ne!(a[0], (0..64).collect::<Vec<_>>());
    // iter_epoch replays without moving the counter.
    let b = Batches::new(&[x, y], 7).shuffle(5);
    assert_eq!(b.epoch(), 0);
    let replay: Vec<i64> = b.iter_epoch(2).flat_map(|batch| ids(&batch)).collect();
    assert_eq!(replay, a[2]);
    assert_eq!(b.epoch(), 0);
    let first: Vec<i64> = (&b).into_iter().flat_map(|batch| ids(&batch)).collect();
    assert_eq!(first, a[0]);
    assert_eq!(b.epoch(), 1);
}

#[test]
fn drop_last() {
    let m = NDManager::new();
    let (x, y) = xy(&m, 10);
    let b = Batches::new(&[x, y], 3).drop_last(true);
    assert_eq!((b.len(), b.rows(), b.batch_size()), (3, 10, 3));
    let got: Vec<Vec<i64>> = b.iter().map(|batch| ids(&batch)).collect();
    assert_eq!(got, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6, 7, 8]]);
    let b = Batches::new(&[x, y], 3).shuffle(4).drop_last(true);
    let got: Vec<i64> = b.iter().flat_map(|batch| ids(&batch)).collect();
    let order: Vec<i64> = b.order(0).iter().map(|&i| i as i64).collect();
    assert_eq!(got, order[..9]);
    // Exact multiple: nothing dropped. Fewer rows than a batch: no batch at all.
    assert_eq!(Batches::new(&[x], 5).drop_last(true).len(), 2);
    let small = Batches::new(&[x], 11).drop_last(true);
    assert!(small.is_empty() && small.iter().next().is_none());
    assert_eq!(Batches::new(&[x], 11).len(), 1);
    // Zero rows: no batch either way.
    let empty = m.zeros([0, 4], DType::F32);
    assert!(Batches::new(&[empty], 2).iter().next().is_none());
}

#[test]
fn batches_belong_to_the_step_scope_and_memory_stays_flat() {
    let m = NDManager::new();
    let (x, y) = xy(&m, 100);
    let before = counts(&m);
    for shuffle in [None, Some(3)] {
        let mut b = Batches::new(&[x, y], 8);
        if let Some(s) = shuffle {
            b = b.shuffle(s);
        }
        for _epoch in 0..20 {
            let mut it = b.iter();
            loop {
                let step = NDScope::new();
                let Some(batch) = it.next() else { break };
                for &a in &batch {
                    assert_eq!(a.manager(), m, "owned by the sources' manager");
                    assert_eq!(a.ref_count(), 1, "registered in the step's scope");
                    assert!(step.arrays().contains(&a));
                }
                let _loss = (batch[0] * 2.0).sum() + batch[1].to_dtype(DType::F32).sum();
                drop(step);
                assert!(batch.iter().all(|a| a.is_closed()));
                assert_eq!(counts(&m), before, "flat after every step");
            }
        }
    }
    // Unshuffled batches are views (no new buffer); shuffled ones are gathered copies.
    let _s = NDScope::new();
    let buffers = m.memory().live_buffers;
    let view = Batches::new(&[x, y], 8).iter().next().unwrap();
    assert_eq!(m.memory().live_buffers, buffers);
    x.get("0, 0").set("", 123.0);
    assert_eq!(
        view[0].to_vec::<f32>().unwrap()[0],
        123.0,
        "a view sees writes"
    );
    let copy = Batches::new(&[x, y], 8).shuffle(1).iter().next().unwrap();
    assert_eq!(m.memory().live_buffers, buffers + 2);
    assert_eq!(copy[0].shape().dims(), &[8, 2]);
}

#[test]
fn batches_of_non_contiguous_arrays() {
    let m = NDManager::new();
    // xt[i] = [i, 10 + i, 20 + i] (a transposed view), yr[i] = 9 - i (reversed).
    let base = m.arange(0.0, 30.0, 1.0, DType::F64).reshape([3, 10]);
    let xt = base.transpose();
    let yr = m.arange(0.0, 10.0, 1.0, DType::I64).get("::-1");
    for shuffle in [None, Some(8)] {
        let mut b = Batches::new(&[xt, yr], 4);
        if let Some(s) = shuffle {
            b = b.shuffle(s);
        }
        let order = b.order(0);
        let mut k = 0;
        for batch in b.iter() {
            let rows = &order[k..k + batch[1].size()];
            k += rows.len();
            let want_x: Vec<f64> = rows
                .iter()
                .flat_map(|&i| [i as f64, 10.0 + i as f64, 20.0 + i as f64])
                .collect();
            let want_y: Vec<i64> = rows.iter().map(|&i| 9 - i as i64).collect();
            assert_eq!(batch[0].shape().dims(), &[rows.len(), 3]);
            assert_eq!(batch[0].to_vec::<f64>().unwrap(), want_x);
            assert_eq!(batch[1].to_vec::<i64>().unwrap(), want_y);
        }
        assert_eq!(k, 10);
    }
    // Every dtype, 3-d rows, gathered.
    for (_, a) in samples(&m) {
        let a3 = a.reshape([2, 3, 1]).get("::-1");
        let b = Batches::new(&[a3], 1).shuffle(0);
        let order = b.order(0);
        for (k, batch) in b.iter().enumerate() {
            let r = order[k];
            assert_eq!(bits(batch[0]), bits(a3.get(&format!("{r}:{}", r + 1))));
        }
    }
}

#[test]
fn batch_errors_are_typed_and_leave_nothing() {
    let m = NDManager::new();
    let (x, y) = xy(&m, 10);
    let short = m.zeros([9], DType::I64);
    fails!(
        m,
        Batches::try_new(&[x, short], 2),
        NdError::InvalidShape { .. }
    );
    fails!(
        m,
        Batches::try_new(&[x, y], 0),
        NdError::InvalidArgument { .. }
    );
    fails!(m, Batches::try_new(&[], 2), NdError::InvalidArgument { .. });
    let zero_d = m.scalar(1.0f32);
    fails!(
        m,
        Batches::try_new(&[zero_d], 2),
        NdError::InvalidShape { .. }
    );
    let msg = common::expect_panic(|| {
        Batches::new(&[x, short], 2);
    });
    assert!(msg.contains("same first dimension"), "{msg}");
    fails!(
        m,
        try_train_test_split(&[x, short], TestSize::Count(1), None),
        NdError::InvalidShape { .. }
    );
    fails!(
        m,
        try_train_test_split(&[x], TestSize::Fraction(1.5), None),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        try_train_test_split(&[x], TestSize::Fraction(f64::NAN), Some(1)),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        try_train_test_split(&[x], TestSize::Count(11), None),
        NdError::InvalidArgument { .. }
    );

    // A source closed mid-epoch: the error, and the batch's other arrays are freed.
    let x2 = x * 1.0;
    let b = Batches::new(&[x, y, x2], 3).shuffle(1);
    let mut it = b.iter();
    assert!(it.next().is_some());
    x2.close();
    let before = counts(&m);
    let r = it.try_next();
    assert!(
        matches!(
            r,
            Err(NdError::Closed(_)) | Err(NdError::ClosedUnknown { .. })
        ),
        "{r:?}"
    );
    assert_eq!(counts(&m), before);
    let closed_src = Batches::try_new(&[x2], 2);
    assert!(closed_src.is_err());
}

// ------------------------------------------------------------------ split

#[test]
fn train_test_split_semantics() {
    let m = NDManager::new();
    let (x, y) = xy(&m, 1797);
    for test in [TestSize::Count(360), TestSize::Fraction(0.2)] {
        let (train, test) = train_test_split(&[x, y], test, None);
        assert_eq!(train[0].shape().dims(), &[1437, 2]);
        assert_eq!(test[0].shape().dims(), &[360, 2]);
        assert_eq!(ids(&train), (0..1437).collect::<Vec<_>>());
        assert_eq!(ids(&test), (1437..1797).collect::<Vec<_>>());
        assert_eq!(test[0].to_vec::<f32>().unwrap(), xy_values(&ids(&test)));
    }
    // Unshuffled parts are views: no new buffer.
    let buffers = m.memory().live_buffers;
    let _ = train_test_split(&[x, y], TestSize::Count(10), None);
    assert_eq!(m.memory().live_buffers, buffers);
    // Rounding up, the extremes.
    let (tr, te) = train_test_split(&[y.get(":5")], TestSize::Fraction(0.5), None);
    assert_eq!((tr[0].size(), te[0].size()), (2, 3));
    let (tr, te) = train_test_split(&[y.get(":5")], TestSize::Fraction(0.0), None);
    assert_eq!((tr[0].size(), te[0].size()), (5, 0));
    let (tr, te) = train_test_split(&[y.get(":5")], TestSize::Count(5), Some(3));
    assert_eq!((tr[0].size(), te[0].size()), (0, 5));
    // Shuffled: a partition of the rows, reproducible, rows kept together.
    let split = |seed| {
        let (tr, te) = train_test_split(&[x, y], TestSize::Count(300), Some(seed));
        assert_eq!(tr[0].to_vec::<f32>().unwrap(), xy_values(&ids(&tr)));
        (ids(&tr), ids(&te))
    };
    let (tr, te) = split(7);
    assert_eq!((tr.len(), te.len()), (1497, 300));
    let all: BTreeSet<i64> = tr.iter().chain(&te).copied().collect();
    assert_eq!(all.len(), 1797);
    assert_eq!(split(7), (tr.clone(), te.clone()));
    assert_ne!(split(8).1, te);
    assert_ne!(tr, (0..1497).collect::<Vec<_>>());
}

// ------------------------------------------------------------------ digits

#[test]
fn digits_load() {
    let m = NDManager::new();
    let (x, y) = ndscope::data::load_digits(&m);
    assert_eq!(
        (x.dtype(), x.shape().dims()),
        (DType::F32, &[1797usize, 64][..])
    );
    assert_eq!(
        (y.dtype(), y.shape().dims()),
        (DType::I64, &[1797usize][..])
    );
    let xs = x.to_vec::<f32>().unwrap();
    assert!(xs.iter().all(|&v| (0.0..=1.0).contains(&v)));
    assert_eq!(xs.iter().cloned().fold(f32::MAX, f32::min), 0.0);
    assert_eq!(xs.iter().cloned().fold(f32::MIN, f32::max), 1.0);
    assert!(
        xs.iter().all(|&v| (v * 16.0).fract() == 0.0),
        "pixels are k / 16"
    );
    // The first line of the file: 0,0,5,13,9,1,0,0,0,0,13,15,10,15,5,0,... label 0.
    let first: Vec<f32> = [0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0]
        .iter()
        .map(|&v| v as f32 / 16.0)
        .collect();
    assert_eq!(&xs[..16], &first[..]);
    let ys = y.to_vec::<i64>().unwrap();
    assert_eq!(&ys[..10], &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let mut per_class = [0usize; 10];
    for &c in &ys {
        per_class[c as usize] += 1;
    }
    // sklearn's documented class counts (load_digits: ~180 per class).
    assert_eq!(
        per_class,
        [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]
    );
    assert_eq!(m.memory().live_arrays, 2);
    let closed = NDManager::new();
    closed.close();
    assert!(matches!(
        ndscope::data::try_load_digits(&closed),
        Err(NdError::ManagerClosed { .. })
    ));
}

// ------------------------------------------------------------------ round trips

#[test]
fn safetensors_round_trip_every_dtype_and_layout() {
    let d = tmp("st");
    let m = NDManager::new();
    let all = cases(&m);
    let path = d.join("all.safetensors");
    ndscope::io::save_safetensors(&path, &all);
    let before = counts(&m);
    let loaded = ndscope::io::load_safetensors(&m, &path);
    assert_same(&loaded, &sorted(all.clone()));
    assert_eq!(counts(&m).0, before.0 + all.len());
    for (_, a) in &loaded {
        assert_eq!(a.manager(), m);
    }
    // &str names work too, and an empty list is a valid file.
    ndscope::io::save_safetensors(d.join("one.safetensors"), &[("w", all[0].1)]);
    assert_eq!(
        ndscope::io::load_safetensors(&m, d.join("one.safetensors"))[0].0,
        "w"
    );
    let none: &[(&str, NDArray)] = &[];
    ndscope::io::save_safetensors(d.join("none.safetensors"), none);
    assert!(ndscope::io::load_safetensors(&m, d.join("none.safetensors")).is_empty());
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn npy_round_trip_every_dtype_and_layout() {
    let d = tmp("npy");
    let m = NDManager::new();
    for (name, a) in cases(&m) {
        let p = d.join(format!("{name}.npy"));
        ndscope::io::save_npy(&p, a);
        let b = ndscope::io::load_npy(&m, &p);
        assert_eq!(bits(b), bits(a), "{name}");
        assert_eq!(b.manager(), m);
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn npz_round_trip_every_dtype_and_layout() {
    let d = tmp("npz");
    let m = NDManager::new();
    let all = cases(&m);
    let p = d.join("all.npz");
    ndscope::io::save_npz(&p, &all);
    assert_same(&ndscope::io::load_npz(&m, &p), &all); // archive order = given order
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn checkpoint_round_trip_in_place() {
    let d = tmp("ckpt");
    let m = NDManager::new();
    let params = m.new_sub_manager();
    let named: Vec<(String, NDArray)> = cases(&params)
        .into_iter()
        .map(|(n, a)| (format!("model.{n}"), a))
        .collect();
    let saved: Vec<_> = named.iter().map(|(_, a)| bits(*a)).collect();
    let p = d.join("ckpt.safetensors");
    ndscope::io::save_checkpoint(&p, &named);
    // Scribble over every array (views included, through their bases).
    for (_, a) in &named {
        if a.size() > 0 {
            a.set("...", if a.dtype() == DType::Bool { 0.0 } else { 3.0 });
        }
    }
    assert_ne!(bits(named[0].1), saved[0]);
    let before = counts(&m);
    ndscope::io::load_into(&p, &named);
    assert_eq!(counts(&m), before, "in place: nothing allocated");
    for ((n, a), want) in named.iter().zip(&saved) {
        assert_eq!(&bits(*a), want, "{n}");
    }
    // The same file loads as new arrays too.
    let fresh = ndscope::io::load_safetensors(&m, &p);
    assert_same(&fresh, &sorted(named.clone()));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn load_into_is_all_or_nothing() {
    let d = tmp("ckpt_bad");
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let b = m.create(&[5i64, 6], [2]);
    let p = d.join("ckpt.safetensors");
    ndscope::io::save_checkpoint(&p, &[("w", w), ("b", b)]);
    w.set("", 0.0);
    b.set("", 0);
    let untouched = || (bits(w), bits(b));
    let state = untouched();
    let other_w = m.zeros([2, 2], DType::F32);
    let wrong_shape = m.zeros([4], DType::F32);
    let wrong_dtype = m.zeros([2, 2], DType::F64);
    let bad = |named: &[(&str, NDArray)], want: &str| {
        let before = counts(&m);
        let e = ndscope::io::try_load_into(&p, named).unwrap_err();
        assert!(e.to_string().contains(want), "{e}");
        assert_eq!(counts(&m), before);
        assert_eq!(untouched(), state, "no array changed");
        e
    };
    // The file holds 'b', which is not among the arrays (unknown name).
    let e = bad(&[("w", w)], "'b', which is not among");
    assert!(matches!(e, NdError::Format { .. }));
    // 'extra' is missing from the file.
    let e = bad(&[("w", w), ("b", b), ("extra", other_w)], "has no extra");
    assert!(matches!(e, NdError::Format { .. }));
    bad(
        &[("w", wrong_shape), ("b", b)],
        "'w' is f32[2, 2] in the file",
    );
    bad(
        &[("w", wrong_dtype), ("b", b)],
        "'w' is f32[2, 2] in the file",
    );
    let e = bad(&[("w", w), ("w", w)], "repeated");
    assert!(matches!(e, NdError::InvalidArgument { .. }));
    let gone = m.zeros([2], DType::I64);
    gone.close();
    let e = ndscope::io::try_load_into(&p, &[("w", w), ("b", gone)]).unwrap_err();
    assert!(matches!(
        e,
        NdError::Closed(_) | NdError::ClosedUnknown { .. }
    ));
    assert_eq!(untouched(), state);
    let e = ndscope::io::try_load_into(d.join("nope.safetensors"), &[("w", w)]).unwrap_err();
    assert!(
        matches!(
            e,
            NdError::Io {
                kind: std::io::ErrorKind::NotFound,
                ..
            }
        ),
        "{e}"
    );
    // And the good call works, after all that.
    ndscope::io::load_into(&p, &[("b", b), ("w", w)]);
    assert_eq!(w.to_vec::<f32>().unwrap(), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(b.to_vec::<i64>().unwrap(), vec![5, 6]);
    let msg = common::expect_panic(|| ndscope::io::load_into(&p, &[("w", w)]));
    assert!(
        msg.starts_with("load_into: ") && msg.contains("not among"),
        "{msg}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

// ------------------------------------------------------------------ numpy interop

#[test]
fn numpy_files_load() {
    let m = NDManager::new();
    let load = |n: &str| ndscope::io::load_npy(&m, fixture(n));
    let f32s = load("f32.npy");
    assert_eq!(f32s.shape().dims(), &[2, 3]);
    assert_eq!(
        bits(f32s).2,
        [0.0f32, -1.5, 3.25, 1e30, -0.0, f32::INFINITY]
            .iter()
            .map(|x| x.to_bits() as u64)
            .collect::<Vec<_>>()
    );
    assert_eq!(
        load("f64.npy").to_vec::<f64>().unwrap(),
        vec![1.0 / 3.0, -2.5e-300, 6.02214076e23]
    );
    let i32s = load("i32.npy");
    assert_eq!(i32s.shape().dims(), &[2, 2]);
    assert_eq!(
        i32s.to_vec::<i32>().unwrap(),
        vec![i32::MIN, -1, 0, i32::MAX]
    );
    assert_eq!(
        load("i64.npy").to_vec::<i64>().unwrap(),
        vec![-(1 << 62), -1, 0, (1 << 62) + 5]
    );
    assert_eq!(
        load("u8.npy").to_vec::<u8>().unwrap(),
        vec![0, 1, 127, 128, 254, 255]
    );
    let bools = load("bool.npy");
    assert_eq!(bools.dtype(), DType::Bool);
    assert_eq!(
        bools.to_vec::<bool>().unwrap(),
        vec![true, false, false, true, true]
    );
    let s = load("scalar_f64.npy");
    assert_eq!((s.ndim(), s.to_scalar::<f64>().unwrap()), (0, 2.5));
    let e = load("empty_f32.npy");
    assert_eq!(
        (e.dtype(), e.shape().dims()),
        (DType::F32, &[0usize, 3][..])
    );
    let f = load("fortran_i32.npy");
    assert_eq!(f.shape().dims(), &[2, 3]);
    assert_eq!(f.to_vec::<i32>().unwrap(), vec![0, 1, 2, 10, 11, 12]);
    assert_eq!(
        load("bigendian_f64.npy").to_vec::<f64>().unwrap(),
        vec![1.5, -2.0, 3.0, 1e-5]
    );
    assert_eq!(
        load("bigendian_i32.npy").to_vec::<i32>().unwrap(),
        vec![1, -2, 65536]
    );
    assert_eq!(
        load("v2_f32.npy").to_vec::<f32>().unwrap(),
        vec![1.0, 2.0, 3.0]
    );
    let v3 = load("v3_i64.npy");
    assert_eq!(
        (v3.shape().dims(), v3.to_vec::<i64>().unwrap()),
        (&[1usize, 2][..], vec![7, 8])
    );

    for archive in ["numpy.npz", "numpy_compressed.npz"] {
        let z = ndscope::io::load_npz(&m, fixture(archive));
        let names: Vec<&str> = z.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["weight", "labels", "mask"], "{archive}");
        assert_eq!(
            z[0].1.to_vec::<f32>().unwrap(),
            vec![0.0, 0.25, 0.5, 0.75, 1.0, 1.25]
        );
        assert_eq!(z[0].1.shape().dims(), &[2, 3]);
        assert_eq!(z[1].1.to_vec::<i64>().unwrap(), vec![3, 1, 4, 1, 5]);
        assert_eq!(z[2].1.shape().dims(), &[2, 1]);
        assert_eq!(z[2].1.to_vec::<bool>().unwrap(), vec![true, false]);
    }
}

#[test]
fn our_npy_files_are_byte_identical_to_numpys() {
    let d = tmp("same");
    let m = NDManager::new();
    let ours = [
        (
            "same_f32.npy",
            m.arange(0.0, 6.0, 1.0, DType::F32).reshape([2, 3]),
        ),
        ("same_bool.npy", m.create(&[true, false], [2])),
        ("same_scalar_i64.npy", m.scalar(-7i64)),
        ("same_empty_u8.npy", m.zeros([0], DType::U8)),
    ];
    for (name, a) in ours {
        let p = d.join(name);
        ndscope::io::save_npy(&p, a);
        assert_eq!(
            std::fs::read(&p).unwrap(),
            std::fs::read(fixture(name)).unwrap(),
            "{name}"
        );
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// numpy reads what we write (npy of every dtype, non-contiguous, 0-d, zero-size;
/// npz). Runs `check_ours.py` when python3 with numpy is available; otherwise says
/// it skipped (the byte-identity test above covers `.npy` without Python).
#[test]
fn numpy_reads_our_files() {
    let has_numpy = std::process::Command::new("python3")
        .args(["-c", "import numpy"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !has_numpy {
        eprintln!("numpy_reads_our_files: skipped (no python3 with numpy)");
        return;
    }
    let d = tmp("numpy_reads");
    let m = NDManager::new();
    let base = m.arange(0.0, 6.0, 1.0, DType::F32).reshape([2, 3]);
    ndscope::io::save_npy(d.join("ours_f32.npy"), base.transpose());
    ndscope::io::save_npy(
        d.join("ours_f64.npy"),
        m.create(&[-1.5, f64::NAN, 1e300], [3]),
    );
    let i = m.create(&[0i32, 1, 2, 3, 4, 5], [2, 3]);
    ndscope::io::save_npy(d.join("ours_i32.npy"), i.get("::-1, ::-2"));
    ndscope::io::save_npy(d.join("ours_i64.npy"), m.scalar(-(1i64 << 62)));
    ndscope::io::save_npy(d.join("ours_u8.npy"), m.zeros([2, 0], DType::U8));
    ndscope::io::save_npy(d.join("ours_bool.npy"), m.create(&[true, false, true], [3]));
    let w = m.arange(0.0, 2.0, 0.5, DType::F32).reshape([2, 2]);
    ndscope::io::save_npz(
        d.join("ours.npz"),
        &[
            ("w", w),
            ("b", m.create(&[1i64, 2, 3], [3])),
            ("flags", m.scalar(true)),
        ],
    );
    let out = std::process::Command::new("python3")
        .arg(fixture("check_ours.py"))
        .arg(&d)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "numpy could not read our files:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
    std::fs::remove_dir_all(&d).unwrap();
}

// ------------------------------------------------------------------ bad files

/// A version 1.0 `.npy` image with header `dict` and `data`.
fn npy(dict: &str, data: &[u8]) -> Vec<u8> {
    let mut h = dict.to_string();
    while !(10 + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut v = b"\x93NUMPY\x01\x00".to_vec();
    v.extend_from_slice(&(h.len() as u16).to_le_bytes());
    v.extend_from_slice(h.as_bytes());
    v.extend_from_slice(data);
    v
}

#[test]
fn bad_npy_files_are_typed_errors_and_allocate_nothing() {
    use ndscope::io::try_load_npy;
    let d = tmp("bad_npy");
    let m = NDManager::new();
    let _keep = m.ones([3], DType::F32); // counters are not trivially zero
    fails!(
        m,
        try_load_npy(&m, d.join("missing.npy")),
        NdError::Io {
            kind: std::io::ErrorKind::NotFound,
            ..
        }
    );
    fails!(m, try_load_npy(&m, &d), NdError::Io { .. });
    for unsupported in ["f16.npy", "i8.npy", "structured.npy"] {
        fails!(
            m,
            try_load_npy(&m, fixture(unsupported)),
            NdError::Format { .. }
        );
    }
    let good = std::fs::read(fixture("f64.npy")).unwrap();
    let write = |name: &str, bytes: &[u8]| {
        let p = d.join(name);
        std::fs::write(&p, bytes).unwrap();
        p
    };
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("empty", vec![], "truncated header"),
        ("text", b"just some text, not an array".to_vec(), "magic"),
        ("cut_header", good[..40].to_vec(), "truncated header"),
        (
            "cut_data",
            good[..good.len() - 1].to_vec(),
            "header claims 3 f64 elements (24 bytes) but the file holds 23 bytes of data",
        ),
        ("extra", [&good[..], b"x"].concat(), "bytes after the data"),
        (
            "version",
            [&good[..6], &[7u8, 0], &good[8..]].concat(),
            "version 7",
        ),
    ];
    for (name, bytes, want) in cases {
        let p = write(name, &bytes);
        let before = counts(&m);
        let e = try_load_npy(&m, &p).unwrap_err();
        assert!(matches!(e, NdError::Format { .. }), "{name}: {e:?}");
        assert!(e.to_string().contains(want), "{name}: {e}");
        assert!(
            e.to_string().contains(&p.display().to_string()),
            "names the file: {e}"
        );
        assert_eq!(counts(&m), before, "{name}");
    }
    // A header claiming a huge shape over a tiny file: a Format error, not an
    // allocation (tests/untrusted_files.rs has more).
    let huge = npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (1000000000000,), }",
        &good[128..],
    );
    fails!(
        m,
        try_load_npy(&m, write("huge", &huge)),
        NdError::Format { .. }
    );
    let overflow = npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (99999999999999999, 99999), }",
        &[],
    );
    fails!(
        m,
        try_load_npy(&m, write("overflow", &overflow)),
        NdError::Format { .. }
    );
    // The hand-made header itself is fine: with the right shape it loads.
    let ok = npy(
        "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
        &good[128..],
    );
    assert_eq!(try_load_npy(&m, write("ok", &ok)).unwrap().size(), 3);
    // A closed or capped manager fails before the file is read.
    let closed = m.new_sub_manager();
    closed.close();
    fails!(
        m,
        try_load_npy(&closed, fixture("f64.npy")),
        NdError::ManagerClosed { .. }
    );
    let capped = m.new_sub_manager();
    capped.cap();
    fails!(
        m,
        try_load_npy(&capped, fixture("f64.npy")),
        NdError::ManagerCapped { .. }
    );
    let msg = common::expect_panic(|| {
        ndscope::io::load_npy(&m, fixture("i8.npy"));
    });
    assert!(
        msg.starts_with("load_npy: ") && msg.contains("'|i1'"),
        "{msg}"
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_npz_files_are_typed_errors_and_allocate_nothing() {
    use ndscope::io::try_load_npz;
    let d = tmp("bad_npz");
    let m = NDManager::new();
    fails!(
        m,
        try_load_npz(&m, d.join("missing.npz")),
        NdError::Io { .. }
    );
    fails!(m, try_load_npz(&m, &d), NdError::Io { .. });
    fails!(
        m,
        try_load_npz(&m, fixture("f64.npy")),
        NdError::Format { .. }
    );
    // The first member is fine, the second is not a .npy: nothing is created.
    fails!(
        m,
        try_load_npz(&m, fixture("bad_member.npz")),
        NdError::Format { .. }
    );
    fails!(
        m,
        try_load_npz(&m, fixture("truncated_member.npz")),
        NdError::Format { .. }
    );
    let good = std::fs::read(fixture("numpy_compressed.npz")).unwrap();
    for cut in [10, good.len() / 2, good.len() - 10] {
        let p = d.join(format!("cut{cut}.npz"));
        std::fs::write(&p, &good[..cut]).unwrap();
        fails!(m, try_load_npz(&m, &p), NdError::Format { .. });
    }
    let e = try_load_npz(&m, fixture("bad_member.npz")).unwrap_err();
    assert!(
        e.to_string().contains("'notes.txt' is not a .npy file"),
        "{e}"
    );
    let e = try_load_npz(&m, fixture("truncated_member.npz")).unwrap_err();
    assert!(e.to_string().contains("'cut.npy'"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_safetensors_files_are_typed_errors_and_allocate_nothing() {
    use ndscope::io::try_load_safetensors;
    let d = tmp("bad_st");
    let m = NDManager::new();
    fails!(
        m,
        try_load_safetensors(&m, d.join("missing.safetensors")),
        NdError::Io { .. }
    );
    fails!(m, try_load_safetensors(&m, &d), NdError::Io { .. });
    // F16 beside a valid F32: refused whole.
    let e = try_load_safetensors(&m, fixture("f16.safetensors")).unwrap_err();
    assert!(e.to_string().contains("'half' has dtype F16"), "{e}");
    fails!(
        m,
        try_load_safetensors(&m, fixture("f16.safetensors")),
        NdError::Format { .. }
    );
    let p = d.join("good.safetensors");
    let all = cases(&m);
    ndscope::io::save_safetensors(&p, &all);
    let good = std::fs::read(&p).unwrap();
    for cut in [0, 4, 8, 20, good.len() / 2, good.len() - 1] {
        let q = d.join(format!("cut{cut}.safetensors"));
        std::fs::write(&q, &good[..cut]).unwrap();
        fails!(m, try_load_safetensors(&m, &q), NdError::Format { .. });
    }
    let q = d.join("extra.safetensors");
    std::fs::write(&q, [&good[..], b"!"].concat()).unwrap();
    fails!(m, try_load_safetensors(&m, &q), NdError::Format { .. });
    let q = d.join("npy.safetensors");
    std::fs::copy(fixture("f32.npy"), &q).unwrap();
    fails!(m, try_load_safetensors(&m, &q), NdError::Format { .. });
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn bad_saves_are_typed_errors_and_write_nothing() {
    use ndscope::io::{try_save_npy, try_save_npz, try_save_safetensors};
    let d = tmp("bad_save");
    let m = NDManager::new();
    let a = m.ones([2], DType::F32);
    let gone = m.ones([2], DType::F32);
    gone.close();
    let p = d.join("out");
    let nothing = || assert!(!p.exists(), "nothing written");
    assert!(matches!(
        try_save_safetensors(&p, &[("a", a), ("a", a)]),
        Err(NdError::InvalidArgument { .. })
    ));
    nothing();
    assert!(matches!(
        try_save_safetensors(&p, &[("", a)]),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        try_save_npz(&p, &[("x", a), ("x", a)]),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        try_save_safetensors(&p, &[("a", a), ("g", gone)]),
        Err(NdError::Closed(_) | NdError::ClosedUnknown { .. })
    ));
    assert!(matches!(
        try_save_npz(&p, &[("a", a), ("g", gone)]),
        Err(NdError::Closed(_) | NdError::ClosedUnknown { .. })
    ));
    assert!(matches!(
        try_save_npy(&p, gone),
        Err(NdError::Closed(_) | NdError::ClosedUnknown { .. })
    ));
    nothing();
    let no_dir = d.join("no/such/dir/file");
    assert!(matches!(try_save_npy(&no_dir, a), Err(NdError::Io { .. })));
    assert!(matches!(
        try_save_npz(&no_dir, &[("a", a)]),
        Err(NdError::Io { .. })
    ));
    assert!(matches!(
        try_save_safetensors(&no_dir, &[("a", a)]),
        Err(NdError::Io { .. })
    ));
    assert!(matches!(
        try_save_safetensors(&d, &[("a", a)]),
        Err(NdError::Io { .. })
    ));
    assert!(matches!(try_save_npy(&d, a), Err(NdError::Io { .. })));
    let msg = common::expect_panic(|| ndscope::io::save_npz(&p, &[("x", a), ("x", a)]));
    assert_eq!(msg, "save_npz: the name 'x' is repeated");
    std::fs::remove_dir_all(&d).unwrap();
}

// ------------------------------------------------------------------ ndarray

#[cfg(feature = "ndarray")]
#[test]
fn ndarray_round_trip() {
    use ndarray::{ArrayD, IxDyn, arr2, s};
    let m = NDManager::new();
    let a = arr2(&[[1.0f64, 2.0, 3.0], [4.0, 5.0, 6.0]]);
    for view in [a.view(), a.t(), a.slice(s![.., ..;-2])] {
        let x = NDArray::from_ndarray(&m, &view);
        assert_eq!(x.shape().dims(), view.shape());
        assert_eq!(
            x.to_vec::<f64>().unwrap(),
            view.iter().copied().collect::<Vec<_>>()
        );
        assert_eq!(x.to_ndarray::<f64>().unwrap(), view.into_dyn());
    }
    for (_, x) in cases(&m) {
        match x.dtype() {
            DType::I32 => {
                let back = x.to_ndarray::<i32>().unwrap();
                assert_eq!(bits(NDArray::from_ndarray(&m, &back)), bits(x));
            }
            DType::Bool => {
                let back = x.to_ndarray::<bool>().unwrap();
                assert_eq!(bits(NDArray::from_ndarray(&m, &back)), bits(x));
            }
            DType::U8 => {
                let back = x.to_ndarray::<u8>().unwrap();
                assert_eq!(bits(NDArray::from_ndarray(&m, &back)), bits(x));
            }
            _ => {}
        }
    }
    let z = ArrayD::<i64>::zeros(IxDyn(&[0, 2]));
    assert_eq!(NDArray::from_ndarray(&m, &z).shape().dims(), &[0, 2]);
    let x = m.ones([2], DType::F32);
    assert!(matches!(
        x.to_ndarray::<f64>(),
        Err(NdError::ElementType { .. })
    ));
    let closed = NDManager::new();
    closed.close();
    fails!(
        m,
        NDArray::try_from_ndarray(&closed, &a),
        NdError::ManagerClosed { .. }
    );
}

/// `for_each_step` frees each step's arrays, the batch included, before the next step:
/// counters are the same before every step and after the epoch; an error from a step
/// ends the epoch after freeing that step's arrays.
#[test]
fn for_each_step_keeps_memory_flat_within_an_epoch() {
    let m = NDManager::new();
    let (x, y) = xy(&m, 10);
    let batches = Batches::new(&[x, y], 3).shuffle(5);
    let before = counts(&m);
    let mut seen = Vec::new();
    let mut steps = 0;
    batches.for_each_step(|b| {
        assert_eq!(counts(&m).0, before.0 + 2, "only this step's batch is live");
        seen.extend(ids(b));
        let _tmp = b[0] * 2.0;
        steps += 1;
    });
    assert_eq!(steps, 4);
    seen.sort();
    assert_eq!(seen, (0..10).collect::<Vec<i64>>());
    assert_eq!(counts(&m), before);

    let mut calls = 0;
    let r = batches.try_for_each_step(|b| {
        calls += 1;
        let _tmp = b[0] + 1.0;
        if calls == 2 {
            b[0].try_add(b[1])?; // f32 + i64: a dtype mismatch
        }
        Ok(())
    });
    assert!(matches!(r, Err(NdError::DTypeMismatch { .. })), "{r:?}");
    assert_eq!(calls, 2);
    assert_eq!(counts(&m), before);
    m.close();
}
