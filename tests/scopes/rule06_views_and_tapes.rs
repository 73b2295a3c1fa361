//! Rule 6 (docs/ownership.md): views share storage and keep it alive; a gradient tape
//! holds what backward reads, a hold is not a user reference, and holds end with
//! `backward` or the collector. (More in `core/views.rs` and `core/autograd.rs`; these
//! are the adversarial cases: long chains of views freed in every order, views moved
//! to other managers, tape-held views of freed bases, holds against explicit closes
//! and manager closes.)

use crate::common::{counts, serial};
use ndscope::{CloseReason, DType, GradientCollector, NDArray, NDManager, NDScope, NdError};

fn f32s(a: NDArray) -> Vec<f32> {
    a.to_vec::<f32>().unwrap()
}

/// A chain of six views of one base (reshape, transpose, get, expand_dims, squeeze).
fn chain(m: &NDManager) -> Vec<NDArray> {
    let a = m.arange(0.0, 12.0, 1.0, DType::F32);
    let r = a.reshape([3, 4]);
    let t = r.transpose();
    let g = t.get("1:, ::-1");
    let e = g.expand_dims(0);
    let s = e.squeeze();
    vec![a, r, t, g, e, s]
}

/// Rule 6 (docs/ownership.md): a chain of views is one buffer, charged once, freed by
/// whichever array of the chain is freed last, in any order; until then the last
/// view reads the data.
#[test]
fn a_chain_of_views_is_one_buffer_freed_by_the_last_in_any_order() {
    let m = NDManager::new();
    let orders: [[usize; 6]; 4] = [
        [0, 1, 2, 3, 4, 5],
        [5, 4, 3, 2, 1, 0],
        [2, 0, 5, 1, 4, 3],
        [3, 5, 0, 4, 2, 1],
    ];
    for order in orders {
        let views = chain(&m);
        // [[0..4], [4..8], [8..12]] transposed, rows 1.., columns reversed.
        let expect = vec![9.0, 5.0, 1.0, 10.0, 6.0, 2.0, 11.0, 7.0, 3.0];
        assert_eq!(counts(&m), (6, 1, 48));
        for (k, &i) in order.iter().enumerate() {
            views[i].close();
            let left = 5 - k;
            if left == 0 {
                assert_eq!(counts(&m), (0, 0, 0), "order {order:?}");
            } else {
                assert_eq!(counts(&m), (left, 1, 48), "order {order:?} after {k}");
                // Any survivor still reads the shared data.
                let alive = *views.iter().find(|v| !v.is_closed()).unwrap();
                assert_eq!(f32s(alive).len(), alive.size());
                if !views[3].is_closed() {
                    assert_eq!(f32s(views[3]), expect);
                }
            }
        }
    }
    m.close();
}

/// Rule 6 (docs/ownership.md): a write through the deepest view of a chain is seen
/// through the base and every other view, and the other way round.
#[test]
fn writes_through_any_view_of_a_chain_are_seen_by_all() {
    let m = NDManager::new();
    let v = chain(&m);
    let (a, s) = (v[0], v[5]);
    // s[k, l] = a[4 (2 - l) + k + 1]: s[0, 0] is a[9], s[2, 1] is a[7].
    s.set("0, 0", -1.0);
    assert_eq!(f32s(a)[9], -1.0);
    assert_eq!(v[1].get("2, 1").to_scalar::<f32>().unwrap(), -1.0);
    assert_eq!(v[2].get("1, 2").to_scalar::<f32>().unwrap(), -1.0);
    a.set("7", 100.0);
    assert_eq!(s.get("2, 1").to_scalar::<f32>().unwrap(), 100.0);
    v[4].get("0").try_muli(0.0).unwrap(); // zeroes the whole view region
    assert_eq!(f32s(s), vec![0.0; 9]);
    // Column 0 of the [3, 4] reshape is not in it.
    assert_eq!(f32s(a.get("::4")), vec![0.0, 4.0, 8.0]);
    m.close();
}

/// Rules 5 and 6 (docs/ownership.md): a view is an array of its own, with its own
/// registration, count and manager: freed with its scope while its base lives,
/// surviving the base, moved to another manager with the buffer's charge passing to
/// it when the base dies.
#[test]
fn views_have_their_own_registration_count_and_manager() {
    let m = NDManager::new();
    let other = NDManager::new();
    let base = m.ones([8], DType::F64);
    assert_eq!(base.ref_count(), 0);
    let (gone, kept) = {
        let _s = NDScope::new();
        let gone = base.get("::2");
        let kept = base.reshape([2, 4]);
        assert_eq!((gone.ref_count(), kept.ref_count()), (1, 1));
        assert_eq!(kept.retain(), 2);
        (gone, kept)
    };
    assert!(gone.is_closed() && !kept.is_closed() && !base.is_closed());
    assert_eq!(kept.ref_count(), 1);
    assert_eq!(counts(&m), (2, 1, 64));
    // Move the view; the base still carries the buffer's charge.
    kept.attach(&other);
    assert_eq!((counts(&m), counts(&other)), ((1, 1, 64), (1, 0, 0)));
    // The base dies: the charge passes to the view, in the other manager.
    base.close();
    assert_eq!((counts(&m), counts(&other)), ((0, 0, 0), (1, 1, 64)));
    m.close();
    assert!(
        !kept.is_closed(),
        "m's close does not free a view it no longer owns"
    );
    assert_eq!(kept.to_vec::<f64>().unwrap(), vec![1.0; 8]);
    assert!(kept.release());
    assert_eq!(counts(&other), (0, 0, 0));
    other.close();
}

/// Rule 6 (docs/ownership.md): `reshape` of a non-contiguous array and `broadcast_to`
/// copy: a new buffer, and writes are not shared.
#[test]
fn copies_are_not_views() {
    let m = NDManager::new();
    let a = m.arange(0.0, 6.0, 1.0, DType::F32).reshape([2, 3]);
    let t = a.transpose(); // a view
    let c = t.reshape([6]); // not contiguous: a copy
    let b = m.create(&[1.0f32, 2.0], [2, 1]).broadcast_to([2, 3]);
    assert_eq!(
        counts(&m).1,
        4,
        "a's buffer, the reshape's copy, the [2, 1] source and the broadcast's copy"
    );
    c.set("0", 50.0);
    b.set("0, 0", 60.0);
    assert_eq!(f32s(a)[0], 0.0);
    assert_eq!(f32s(b), vec![60.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    t.set("0, 0", 7.0);
    assert_eq!((f32s(a)[0], f32s(c)[0]), (7.0, 50.0));
    m.close();
}

/// Rule 6 (docs/ownership.md): a tape holds a view it reads past its scope's close and
/// past the explicit close of the view's base; the hold keeps the shared buffer and
/// its bytes; `backward` lets go and the buffer goes with the view.
#[test]
fn a_tape_holds_a_view_and_its_buffer_past_the_scope_and_the_base() {
    let _serial = serial();
    let m = NDManager::new();
    let w = m
        .create(&[1.0f32, 2.0, 3.0], [3])
        .set_requires_gradient(true);
    let baseline = counts(&m);
    let x = m.create(&[10.0f32, 20.0, 30.0], [3]);
    let gc = GradientCollector::new();
    let (v, loss) = {
        let _s = NDScope::new();
        let v = x.get("::-1"); // a view; mul's rule reads it
        let loss = (v * w).sum();
        loss.retain();
        (v, loss)
    };
    assert!(!v.is_closed(), "held by the tape");
    assert_eq!(v.ref_count(), 0, "a hold is not a reference");
    x.close(); // the base dies; the held view keeps the buffer
    assert!(!v.is_closed());
    assert_eq!(f32s(v), vec![30.0, 20.0, 10.0]);
    let held = counts(&m);
    assert_eq!(
        held.1,
        baseline.1 + 2,
        "x's buffer (through v) and the loss's"
    );
    gc.backward(loss).unwrap();
    assert!(v.is_closed(), "backward let go of the view");
    assert_eq!(f32s(w.gradient()), vec![30.0, 20.0, 10.0]);
    assert!(loss.release());
    assert_eq!(counts(&m), baseline, "the buffer went with the last view");
    drop(gc);
    m.close();
}

/// Rule 6 (docs/ownership.md): explicit `close()`, `release()` of the last reference
/// and a manager's close ignore holds: the array is freed at once, and `backward` then
/// fails with `Closed` naming it; the tape still lets go of everything else.
#[test]
fn close_release_and_manager_close_ignore_holds() {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[0.5f32, -1.0], [2]).set_requires_gradient(true);
    let baseline = counts(&m);
    for how in ["close", "release", "manager"] {
        let sub = m.new_sub_manager();
        let x = sub.create(&[2.0f32, 3.0], [2]);
        let gc = GradientCollector::new();
        let (h, loss) = {
            let _s = NDScope::new();
            let h = (w * x).exp(); // w's manager owns it; mul holds x, exp its output
            let loss = h.sum();
            loss.retain();
            (h, loss)
        };
        assert!(!h.is_closed());
        match how {
            "close" => h.close(),
            "release" => assert!(h.release(), "count 0: the hold does not count"),
            _ => sub.close(), // frees x, the input mul's rule reads
        }
        let freed = if how == "manager" { x } else { h };
        assert!(freed.is_closed());
        let e = gc.backward(loss).unwrap_err();
        let NdError::Closed(info) = &e else {
            panic!("{how}: {e:?}")
        };
        assert_eq!(info.array.uid, freed.uid(), "{how}: {e}");
        let reason_ok = match how {
            "close" => matches!(info.reason, CloseReason::Explicit),
            "release" => matches!(info.reason, CloseReason::Release),
            _ => matches!(info.reason, CloseReason::ManagerClose { .. }),
        };
        assert!(reason_ok, "{how}: {:?}", info.reason);
        assert!(loss.release());
        drop(gc);
        sub.close();
        assert_eq!(counts(&m), baseline, "{how}");
    }
    m.close();
}

/// Rules 5 and 6 (docs/ownership.md): a held array retained after its scope closed
/// survives `backward` with the retain as its only reference; one `release` frees it.
/// Data and parameters the tape read, created outside every scope, are never freed
/// by it.
#[test]
fn a_retain_taken_while_held_outlives_the_tape_and_the_tape_never_frees_unscoped_arrays() {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2]).set_requires_gradient(true);
    let x = m.create(&[3.0f32, 4.0], [2]);
    let baseline = counts(&m);
    let gc = GradientCollector::new();
    let (h, loss) = {
        let _s = NDScope::new();
        let h = (x * w).tanh();
        let loss = h.sum();
        loss.retain();
        (h, loss)
    };
    assert_eq!(h.ref_count(), 0);
    assert_eq!(h.retain(), 1);
    gc.backward(loss).unwrap();
    assert!(!h.is_closed());
    assert_eq!(h.ref_count(), 1);
    assert!(!w.is_closed() && !x.is_closed());
    assert_eq!((w.ref_count(), x.ref_count()), (0, 0));
    assert!(h.release());
    assert!(loss.release());
    drop(gc);
    assert_eq!(counts(&m), baseline);
    // A collector dropped without backward lets go too; a new one starts empty.
    {
        let gc = GradientCollector::new();
        let _s = NDScope::new();
        let _ = (x * w).exp().sum();
        drop(_s);
        assert!(gc.tape_len() >= 2);
    }
    assert_eq!(counts(&m), baseline);
    assert_eq!(GradientCollector::new().tape_len(), 0);
    m.close();
}
