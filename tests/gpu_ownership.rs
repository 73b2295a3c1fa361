//! The ownership rules on device arrays (feature `gpu`): scopes, escape, ref counts,
//! arrays shared across threads, and async task scopes free device memory exactly as
//! they free host memory. (The model test runs the full rule set on a GPU with
//! `NDSCOPE_MODEL_DEVICE=gpu`.)
//!
//! Needs an adapter (Mesa's "llvmpipe" stands in); without one the tests skip, unless
//! `NDSCOPE_REQUIRE_GPU=1`, which makes them fail (CI sets it).
#![cfg(feature = "gpu")]

use ndscope::{DType, Device, NDArray, NDManager, NDScope, devices, memory_on};
use std::sync::Mutex;

/// GPU tests share one device's counters: they run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

fn gpu() -> Option<Device> {
    let found = devices().into_iter().find(|d| d.device != Device::Cpu);
    match found {
        Some(d) => Some(d.device),
        None if std::env::var("NDSCOPE_REQUIRE_GPU").as_deref() == Ok("1") => {
            panic!("NDSCOPE_REQUIRE_GPU=1 but no GPU adapter was found")
        }
        None => {
            eprintln!("no GPU adapter: skipped");
            None
        }
    }
}

/// (live arrays, live buffers, live bytes) on `d`.
fn on(d: Device) -> (usize, usize, usize) {
    let s = memory_on(d);
    (s.live_arrays, s.live_buffers, s.live_bytes)
}

#[test]
fn scopes_escape_and_ref_counts_free_device_arrays_on_time() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new_on(d);
    let base = on(d);
    let a = m.ones([256], DType::F32); // 1 KiB
    assert_eq!(on(d), (base.0 + 1, base.1 + 1, base.2 + 1024));
    let (kept, retained) = {
        let s = NDScope::new();
        let t = (a + 1.0).exp(); // two arrays in the scope
        let v = t.get("0:128"); // a view: an array, no buffer
        assert_eq!(on(d), (base.0 + 4, base.1 + 3, base.2 + 3 * 1024));
        let kept = s.escape(v * 2.0); // escapes to no scope
        let retained = t * 3.0;
        retained.retain(); // a count the scope's close does not take
        (kept, retained)
    };
    // The scope freed (a + 1), its exp and the view; what escaped or is retained lives.
    assert!(kept.to_vec::<f32>().is_ok() && retained.to_vec::<f32>().is_ok());
    assert_eq!(on(d), (base.0 + 3, base.1 + 3, base.2 + 1024 + 512 + 1024));
    retained.release(); // the last count: freed now
    assert!(retained.try_sum().is_err());
    assert_eq!(on(d), (base.0 + 2, base.1 + 2, base.2 + 1024 + 512));
    m.close();
    assert_eq!(on(d), base);
}

#[test]
fn threads_share_device_arrays_and_counters_stay_exact() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new_on(d);
    let base = on(d);
    let w = m.create(&(0..64).map(|i| i as f32).collect::<Vec<_>>(), [8, 8]);
    let results: Vec<NDArray> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    // Each thread computes with the shared array, frees its own
                    // intermediates with a scope, and returns one result.
                    let acc = w.zeros_like();
                    for i in 0..20 {
                        let _s = NDScope::new();
                        let step = w.matmul(w) * ((t * 20 + i) as f64 * 1e-3);
                        // Through a view that reverses the rows twice (the same values).
                        acc.try_addi(step.get("::-1, :").get("::-1, :")).unwrap();
                    }
                    acc
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    // One closes another thread's array.
    results[3].close();
    let want = w.matmul(w).to_vec::<f32>().unwrap();
    for (t, r) in results.iter().take(3).enumerate() {
        let scale: f64 = (0..20).map(|i| (t * 20 + i) as f64 * 1e-3).sum();
        let got = r.to_vec::<f32>().unwrap();
        for (g, x) in got.iter().zip(&want) {
            let e = *x as f64 * scale;
            assert!(
                (*g as f64 - e).abs() <= 1e-3 * (1.0 + e.abs()),
                "{g} vs {e}"
            );
        }
    }
    // Live: w, the three results, and the matmul just read (8x8 f32 each).
    let wm = 8 * 8 * 4;
    assert_eq!(on(d), (base.0 + 5, base.1 + 5, base.2 + 5 * wm));
    m.close();
    assert_eq!(on(d), base);
}

#[test]
fn async_task_scopes_free_device_arrays_when_tasks_end() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new_on(d);
    let base = on(d);
    let w = m.ones([16], DType::F32);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let handles: Vec<_> = (0..6)
        .map(|t| {
            let m = m.clone();
            rt.spawn(ndscope::scope_async(async move {
                let mut acc = m.zeros([16], DType::F32);
                for i in 0..30 {
                    acc = w * (i as f32) + acc; // a new array each step
                    let _tmp = acc.exp();
                    if i % 7 == t {
                        tokio::time::sleep(std::time::Duration::from_micros(100)).await;
                    } else {
                        tokio::task::yield_now().await;
                    }
                }
                acc.sum()
            }))
        })
        .collect();
    let outs: Vec<NDArray> = rt.block_on(async {
        let mut v = Vec::new();
        for h in handles {
            v.push(h.await.unwrap());
        }
        v
    });
    // Every task's intermediates went with its scope: `w` and the six sums are left.
    assert_eq!(on(d), (base.0 + 7, base.1 + 7, base.2 + 64 + 6 * 4));
    let want = 16.0 * (0..30).sum::<i32>() as f32;
    for o in &outs {
        assert_eq!(o.device(), d);
        assert_eq!(o.to_scalar::<f32>().unwrap(), want);
    }
    drop(rt);
    m.close();
    assert_eq!(on(d), base);
}

#[test]
fn an_array_past_the_largest_binding_is_refused_with_nothing_left_allocated() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let name = devices()
        .into_iter()
        .find(|i| i.device == d)
        .map(|i| i.name)
        .unwrap_or_default();
    if !name.contains("llvmpipe") {
        eprintln!("{name}: its largest binding is not known here: skipped");
        return;
    }
    // llvmpipe binds at most 128 MiB; 160 MB of f32 is refused.
    let m = NDManager::new_on(d);
    let (base_gpu, base_cpu) = (on(d), on(Device::Cpu));
    let e = m.try_zeros([40_000_000], DType::F32).unwrap_err();
    assert!(matches!(e, ndscope::NdError::InvalidArgument { .. }), "{e}");
    assert!(e.to_string().contains("largest buffer"), "{e}");
    assert!(e.to_string().contains(&d.to_string()), "{e}");
    assert_eq!((on(d), on(Device::Cpu)), (base_gpu, base_cpu));
    m.close();
}

/// `move_to_device` keeps the handle and its ownership: a moved array is still freed
/// by its scope (on the device now, and its tombstone says so), a retained one comes
/// back to the CPU with the same values, every counter returns to its baseline, and a
/// tape being recorded that depends on the array refuses the move.
#[test]
fn an_array_moved_in_place_keeps_its_handle_and_its_owners() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = gpu() else { return };
    let m = NDManager::new();
    let (base, host) = (on(d), ndscope::memory());
    let kept = {
        let _scope = NDScope::new();
        let a = m.create(&[1.0f32, 2.0, 3.0], [3]);
        let b = m.create(&[4i32, 5, 6, 7], [2, 2]);
        a.move_to_device(d);
        b.move_to_device(d);
        assert_eq!((a.device(), b.device()), (d, d));
        assert_eq!(on(d).0, base.0 + 2, "two arrays on the device");
        assert_eq!(m.memory().live_arrays, 2, "still in their manager");
        assert_eq!((a * 2.0).to_vec::<f32>().unwrap(), vec![2.0, 4.0, 6.0]);
        b.retain();
        (a, b)
    };
    let (a, b) = kept;
    assert!(a.is_closed(), "the scope freed the moved array");
    let e = a.to_vec::<f32>().unwrap_err().to_string();
    assert!(
        e.contains(&d.to_string()),
        "the tombstone names the device: {e}"
    );
    b.move_to_device(Device::Cpu);
    assert_eq!(b.device(), Device::Cpu);
    assert_eq!(b.to_vec::<i32>().unwrap(), vec![4, 5, 6, 7]);
    assert_eq!(on(d), base, "nothing left on the device");
    b.release();
    assert!(b.is_closed());
    assert_eq!(ndscope::memory().live_arrays, host.live_arrays);
    assert_eq!(ndscope::memory().live_bytes, host.live_bytes);

    // A recorded tape that reads the array: refused, nothing moved.
    let w = m.create(&[1.0f32, 2.0], [2]);
    w.set_requires_gradient(true);
    let gc = ndscope::GradientCollector::new();
    let _y = (w * w).sum();
    let e = w.try_move_to_device(d).unwrap_err();
    assert!(matches!(e, ndscope::NdError::InvalidArgument { .. }), "{e}");
    assert_eq!(w.device(), Device::Cpu);
    drop(gc);
    m.close();
    assert_eq!(on(d), base);
}
