//! GradientCollector: the tape's lifetime inside and around scopes, gradient handles,
//! zeroing and accumulation.
//!
//! The tests take `common::serial()`, one at a time: they were written when a collector
//! zeroed the gradients of every parameter in the process (as DJL does). A collector now
//! zeroes and records only its own thread's parameters; the lock is kept as cheap
//! insurance (the tests are fast).

use crate::common::{counts, f32s, serial};
use ndscope::{DType, GradientCollector, NDManager, NDScope, NdError};

#[test]
fn simple_gradient() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2, 1]).set_requires_gradient(true);
    let x = m.create(&[3.0f32, 4.0], [1, 2]);
    {
        let gc = GradientCollector::new();
        gc.backward(x.matmul(w).square().sum())?;
    }
    assert_eq!(f32s(w.gradient()), vec![66.0, 88.0]);
    assert!(w.requires_gradient());
    assert!(!x.requires_gradient());
    assert!(x.try_gradient().is_err());
    m.close();
    Ok(())
}

/// Rule 10 (docs/ownership.md): `gradient()` is one handle and creates nothing.
#[test]
fn gradient_is_one_handle_and_creates_nothing() {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.zeros([3], DType::F32).set_requires_gradient(true);
    let g = w.gradient();
    assert_eq!(g.manager(), m);
    let before = m.memory();
    for _ in 0..100_000 {
        assert_eq!(w.gradient(), g);
    }
    assert_eq!(m.memory(), before);
    assert_eq!(m.memory().live_arrays, 2); // w and its gradient
    m.close();
    assert!(g.is_closed());
}

#[test]
fn non_scalar_loss_is_summed() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m
        .create(&[1.0f32, 2.0, 3.0], [3])
        .set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        gc.backward(w * w)?; // d sum(w^2) = 2w
    }
    assert_eq!(f32s(w.gradient()), vec![2.0, 4.0, 6.0]);
    m.close();
    Ok(())
}

#[test]
fn zeroed_by_new_collector_accumulated_by_accumulating() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2]).set_requires_gradient(true);
    for _ in 0..3 {
        let gc = GradientCollector::new();
        gc.backward((w * 3.0).sum())?;
    }
    assert_eq!(f32s(w.gradient()), vec![3.0, 3.0]);
    {
        let _gc = GradientCollector::new(); // zeroes at start, even without backward
        assert_eq!(f32s(w.gradient()), vec![0.0, 0.0]);
    }
    for _ in 0..3 {
        let gc = GradientCollector::accumulating();
        gc.backward((w * 3.0).sum())?;
    }
    assert_eq!(f32s(w.gradient()), vec![9.0, 9.0]);
    m.close();
    Ok(())
}

/// A new collector zeroes every gradient of this thread's parameters: the ones that own
/// their buffer (zeroed inside the engine) and one whose gradient is viewed (its buffer
/// is shared, zeroed by an in-place op); the view sees the zeros.
#[test]
fn zeroing_covers_owned_and_viewed_gradients() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let a = m.create(&[1.0f32, 2.0], [2]).set_requires_gradient(true);
    let b = m
        .create(&[3.0f32, 4.0, 5.0], [3])
        .set_requires_gradient(true);
    let gc = GradientCollector::new();
    gc.backward((a * 2.0).sum() + (b * 3.0).sum())?;
    drop(gc);
    let view = b.gradient().get("1:");
    assert_eq!(f32s(view), vec![3.0, 3.0]);
    {
        let _gc = GradientCollector::new();
        assert_eq!(f32s(a.gradient()), vec![0.0, 0.0]);
        assert_eq!(f32s(b.gradient()), vec![0.0, 0.0, 0.0]);
        assert_eq!(f32s(view), vec![0.0, 0.0]);
    }
    m.close();
    Ok(())
}

/// Rule 9 (docs/ownership.md): one collector per thread.
#[test]
fn one_collector_per_thread() {
    let _serial = serial();
    let _gc = GradientCollector::new();
    assert!(GradientCollector::try_new().is_err());
    assert!(GradientCollector::try_accumulating().is_err());
}

/// Rule 6 (docs/ownership.md): the tape holds intermediates past their scope until
/// `backward` returns.
#[test]
fn scope_closed_between_forward_and_backward() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[0.5f32, -1.0], [2]).set_requires_gradient(true);
    let x = m.create(&[2.0f32, 3.0], [2]);
    let baseline = counts(&m);
    {
        let gc = GradientCollector::new();
        let loss = {
            let _s = NDScope::new();
            let h = (x * w).exp(); // exp's output and mul's inputs are held by the tape
            let l = h.sum();
            l.retain(); // the user keeps the loss past the scope
            l
        };
        // The scope closed: its intermediates are still live, held by the tape.
        assert!(m.memory().live_arrays > baseline.0 + 1);
        gc.backward(loss)?;
        // backward released the tape: only the loss (retained) is left.
        assert_eq!(m.memory().live_arrays, baseline.0 + 1);
        assert!(loss.release());
    }
    assert_eq!(counts(&m), baseline);
    // d/dw sum(exp(x w)) = x exp(x w)
    let g = f32s(w.gradient());
    let expect = [2.0 * (1.0f32).exp(), 3.0 * (-3.0f32).exp()];
    for (a, b) in g.iter().zip(expect) {
        assert!((a - b).abs() < 1e-5, "{a} vs {b}");
    }
    m.close();
    Ok(())
}

/// Rules 4 and 6 (docs/ownership.md): `keep()` of an intermediate that its scope's
/// close left alive only for the tape makes it an array of its manager: the tape
/// letting go no longer frees it.
#[test]
fn keep_of_a_tape_held_array_after_its_scope_closed_keeps_it() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[0.5f32, -1.0], [2]).set_requires_gradient(true);
    let x = m.create(&[2.0f32, 3.0], [2]);
    let baseline = counts(&m);
    let (h, dropped) = {
        let gc = GradientCollector::new();
        let (h, dropped, loss) = {
            let _s = NDScope::new();
            let h = (x * w).exp(); // exp's output is held by the tape
            let dropped = (x * w).exp(); // held too, but not kept
            let l = (h + dropped).sum();
            l.retain();
            (h, dropped, l)
        };
        // The scope closed; the tape holds both. The user keeps one.
        let h = h.keep();
        gc.backward(loss)?;
        assert!(loss.release());
        (h, dropped)
    };
    assert!(
        dropped.is_closed(),
        "an orphan not kept is freed with the tape"
    );
    assert!(!h.is_closed(), "keep() outlasts the tape");
    assert_eq!(h.ref_count(), 0);
    assert_eq!(m.memory().live_arrays, baseline.0 + 1);
    let expect = [(1.0f32).exp(), (-3.0f32).exp()];
    for (a, b) in f32s(h).iter().zip(expect) {
        assert!((a - b).abs() < 1e-6, "{a} vs {b}");
    }
    h.close();
    assert_eq!(counts(&m), baseline);
    m.close();
    Ok(())
}

/// Rule 6 (docs/ownership.md): dropping the collector lets go of what the tape held.
#[test]
fn collector_dropped_without_backward() {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[0.5f32, -1.0], [2]).set_requires_gradient(true);
    let baseline = counts(&m);
    {
        let gc = GradientCollector::new();
        {
            let _s = NDScope::new();
            let _ = (w * 2.0).tanh().sigmoid().sum();
        }
        assert!(gc.tape_len() >= 3);
        assert!(m.memory().live_arrays > baseline.0);
    }
    assert_eq!(counts(&m), baseline);
    m.close();
}

/// Rule 6 (docs/ownership.md): tape holds do not outlive the step and never free an escaped
/// loss.
#[test]
fn collector_inside_scope_and_scope_inside_collector() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2]).set_requires_gradient(true);
    let baseline = counts(&m);
    for _ in 0..10 {
        let _s = NDScope::new();
        let gc = GradientCollector::new();
        let l = ndscope::scope(|| (w * w * 0.5).sum()); // escapes into _s
        gc.backward(l)?;
    }
    assert_eq!(counts(&m), baseline);
    assert_eq!(f32s(w.gradient()), vec![1.0, 2.0]);
    // The loss escaped out of every scope is not freed by the tape.
    let l = {
        let gc = GradientCollector::new();
        let l = ndscope::scope(|| (w.square()).sum());
        gc.backward(l)?;
        l
    };
    assert!(!l.is_closed());
    l.close();
    assert_eq!(counts(&m), baseline);
    m.close();
    Ok(())
}

/// Rule 6 (docs/ownership.md): holds are not references: unscoped parameters and data
/// survive the tape.
#[test]
fn unscoped_params_and_data_survive_the_tape() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2]).set_requires_gradient(true);
    let x = m.create(&[1.0f32, 1.0], [2]);
    {
        let gc = GradientCollector::new();
        gc.backward((x * w).sum())?;
    }
    assert!(!w.is_closed() && !x.is_closed());
    assert_eq!(w.ref_count(), 0);
    m.close();
    Ok(())
}

#[test]
fn inplace_on_recorded_param_is_an_error() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2]).set_requires_gradient(true);
    let gc = GradientCollector::new();
    let l = (w * 2.0).sum();
    assert!(w.try_subi(1.0).is_err());
    gc.backward(l)?;
    w.try_subi(w.gradient())?; // the tape is empty again: allowed
    drop(gc);
    assert_eq!(f32s(w), vec![-1.0, 0.0]);
    m.close();
    Ok(())
}

#[test]
fn backward_of_untracked_loss_is_an_error() {
    let _serial = serial();
    let m = NDManager::new();
    let x = m.create(&[1.0f32, 2.0], [2]);
    let gc = GradientCollector::new();
    let err = gc.backward(x.sum()).unwrap_err();
    assert!(err.to_string().contains("requires a gradient"), "{err}");
    m.close();
}

/// Rule 10 (docs/ownership.md): the gradient is freed with its parameter, however it dies.
#[test]
fn gradient_dies_with_its_parameter() {
    let _serial = serial();
    let m = NDManager::new();
    let baseline = counts(&m);
    let g = {
        let _s = NDScope::new();
        let w = m.zeros([4], DType::F32).set_requires_gradient(true);
        w.gradient()
    };
    assert!(g.is_closed());
    assert_eq!(counts(&m), baseline);
    let w = m.zeros([4], DType::F32).set_requires_gradient(true);
    let g = w.gradient();
    w.set_requires_gradient(false);
    assert!(g.is_closed() && !w.requires_gradient());
    m.close();
}

/// Issue 11: writing a value that needs a gradient into an unrecorded array in place
/// would drop the gradient silently; it is an error instead (set and the in-place ops).
#[test]
fn inplace_write_of_a_tracked_value_is_an_error() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2]).set_requires_gradient(true);
    let z = m.zeros([3], DType::F32);
    let gc = GradientCollector::new();
    let v = w * 2.0;
    let err = z.try_set("0:2", v).unwrap_err();
    assert!(
        matches!(err, NdError::InvalidArgument { op: "set", .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("gradient would be lost"), "{err}");
    // A parameter itself as the value, and the in-place arithmetic ops.
    assert!(matches!(
        z.try_set("1:3", w),
        Err(NdError::InvalidArgument { op: "set", .. })
    ));
    assert!(matches!(
        z.get("0:2").try_addi(v),
        Err(NdError::InvalidArgument { op: "add", .. })
    ));
    assert!(matches!(
        z.get("0:2").try_muli(w),
        Err(NdError::InvalidArgument { op: "mul", .. })
    ));
    assert_eq!(f32s(z), vec![0.0; 3], "nothing was written");
    // The panicking form panics with the error's message.
    let msg = std::panic::catch_unwind(|| z.set("0:2", v))
        .unwrap_err()
        .downcast::<String>()
        .map(|s| *s)
        .unwrap_or_default();
    assert_eq!(msg, z.try_set("0:2", v).unwrap_err().to_string());
    // Untracked values are fine, and so is writing a tracked value into a
    // parameter (an optimizer-style update, left to the parameter's own check).
    let c = m.create(&[5.0f32, 6.0], [2]);
    z.set("0:2", c);
    z.set("2", 7.0);
    let p = m.zeros([2], DType::F32).set_requires_gradient(true);
    drop(gc);
    let gc = GradientCollector::new();
    p.try_set(":", w)?;
    let loss = (w * z.get("0:2")).sum();
    gc.backward(loss)?;
    assert_eq!(f32s(w.gradient()), vec![5.0, 6.0]);
    drop(gc);
    // Without a collector nothing is recorded and the write is allowed.
    z.set("0:2", w * 2.0);
    assert_eq!(f32s(z), vec![2.0, 4.0, 7.0]);
    assert_eq!(f32s(p), vec![1.0, 2.0]);
    m.close();
    Ok(())
}

/// A parameter broadcast in a sum gets its gradient summed over the broadcast axes
/// (backward sums it in the kernel that adds it in when it is the parameter's only
/// contribution): exact values, added to what an accumulating collector found, and
/// the same when the parameter is used twice or read in a view of its gradient.
#[test]
fn broadcast_parameter_gradient_is_summed_exactly() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let x = m.create(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], [4, 2]);
    let c = m.create(&[1.0f32, -2.0, 3.0, 0.5, -1.0, 4.0, 2.0, 8.0], [4, 2]);
    let b = m.create(&[0.5f32, -0.5], [2]).set_requires_gradient(true);
    let b2 = m.create(&[0.25f32], [1, 1]).set_requires_gradient(true);
    // d/db sum((x + b) * c) = sum of c over rows; d/db2 = sum of c.
    let step = |twice: bool| -> Result<(), NdError> {
        let _s = NDScope::new();
        let gc = GradientCollector::accumulating();
        let y = if twice { x + b + b } else { x + b };
        gc.backward(((y + b2) * c).sum())
    };
    {
        let gc = GradientCollector::new();
        gc.backward(((x + b + b2) * c).sum())?;
    }
    assert_eq!(f32s(b.gradient()), vec![5.0, 10.5]);
    assert_eq!(f32s(b2.gradient()), vec![15.5]);
    step(false)?;
    assert_eq!(f32s(b.gradient()), vec![10.0, 21.0]);
    assert_eq!(f32s(b2.gradient()), vec![31.0]);
    step(true)?;
    assert_eq!(f32s(b.gradient()), vec![20.0, 42.0]);
    assert_eq!(f32s(b2.gradient()), vec![46.5]);
    // A view of the gradient makes it share its buffer: the general path, same values.
    let view = b.gradient().reshape([1, 2]);
    step(false)?;
    assert_eq!(f32s(view), vec![25.0, 52.5]);
    m.close();
    Ok(())
}

/// The first gradient after a collector zeroed it is taken, not added: backward hands
/// the zeroed gradient the buffer of the value it computed (PyTorch's "the first
/// gradient is assigned"). What a user sees must not change: the same handle, the
/// right values, later gradients added in, and every counter back to its baseline.
#[test]
fn the_first_gradient_is_taken_and_later_ones_are_added() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let xs: Vec<f32> = (0..1000).map(|i| i as f32 * 0.01).collect();
    let cos: Vec<f32> = xs.iter().map(|x| x.cos()).collect();
    let w = m.create(&xs, [1000]).set_requires_gradient(true);
    let g = w.gradient();
    let before = counts(&m);
    let all = ndscope::memory();
    for _ in 0..3 {
        let _step = NDScope::new(); // frees the forward's arrays
        let gc = GradientCollector::new();
        gc.backward(w.sin().sum())?; // sin's rule computes g * cos(w): a new array
    }
    assert_eq!(w.gradient(), g, "one handle");
    assert_eq!(f32s(g), cos);
    {
        let _step = NDScope::new();
        let gc = GradientCollector::accumulating();
        gc.backward(w.sin().sum())?; // the gradient holds cos now: added into
    }
    let twice: Vec<f32> = cos.iter().map(|c| c + c).collect();
    assert_eq!(f32s(g), twice);
    assert_eq!(counts(&m), before);
    assert_eq!(ndscope::memory().live_arrays, all.live_arrays);
    m.close();
    Ok(())
}

/// A gradient written in place after the collector zeroed it is no longer zero, so
/// backward adds into it; and the write saw the zeros (a collector writes them only
/// when the gradient is first read or written), not the last step's gradient.
#[test]
fn a_gradient_written_after_zeroing_is_added_into() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m
        .create(&[0.0f32, 1.0, 2.0], [3])
        .set_requires_gradient(true);
    {
        let _step = NDScope::new();
        let gc = GradientCollector::new();
        gc.backward((w * 100.0).sum())?; // the gradient holds 100s
    }
    let _step = NDScope::new();
    let gc = GradientCollector::new();
    let mut g = w.gradient();
    g += 1.0;
    gc.backward(w.sin().sum())?;
    let want: Vec<f32> = [0.0f32, 1.0, 2.0].iter().map(|x| 1.0 + x.cos()).collect();
    assert_eq!(f32s(w.gradient()), want);
    m.close();
    Ok(())
}

/// Two parameters whose gradients are one computed array (`a + b` passes its gradient
/// to both) both receive it: at most one of them may take its buffer.
#[test]
fn two_parameters_reading_one_value_both_get_it() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let a = m
        .create(&[0.0f32, 1.0, 2.0], [3])
        .set_requires_gradient(true);
    let b = m
        .create(&[0.5f32, 0.5, 0.5], [3])
        .set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        gc.backward((a + b).sin().sum())?;
    }
    let want: Vec<f32> = [0.5f32, 1.5, 2.5].iter().map(|x| x.cos()).collect();
    assert_eq!(f32s(a.gradient()), want);
    assert_eq!(f32s(b.gradient()), want);
    m.close();
    Ok(())
}

/// A collector's zeros are written when the gradient is first read: readers on
/// several threads at once all see zeros, never the last step's values.
#[test]
fn a_zeroed_gradient_read_from_several_threads_reads_zeros() -> Result<(), NdError> {
    let _serial = serial();
    let m = NDManager::new();
    let w = m.zeros([1 << 16], DType::F32).set_requires_gradient(true);
    for _ in 0..20 {
        {
            let _step = NDScope::new();
            let gc = GradientCollector::new();
            gc.backward((w * 3.0).sum())?; // the gradient holds 3s
        }
        drop(GradientCollector::new());
        let g = w.gradient();
        let barrier = std::sync::Barrier::new(4);
        std::thread::scope(|s| {
            for _ in 0..4 {
                s.spawn(|| {
                    barrier.wait();
                    let v = g.to_vec::<f32>().unwrap();
                    assert!(v.iter().all(|&e| e == 0.0), "read the old gradient");
                });
            }
        });
    }
    m.close();
    Ok(())
}
