//! Arrays and managers are `Send + Sync` and usable from several threads at once
//! (docs/ownership.md rule 9).

use ndscope::{DType, NDArray, NDManager, NDScope};

fn assert_send_sync<T: Send + Sync>() {}

/// Rule 9 (docs/ownership.md): `NDArray` and `NDManager` are `Send + Sync`.
#[test]
fn handles_are_send_and_sync() {
    assert_send_sync::<NDArray>();
    assert_send_sync::<NDManager>();
}

/// Rules 1 and 9 (docs/ownership.md): threads share a manager, each with its own scopes,
/// and send arrays back.
#[test]
fn shared_manager_used_by_many_threads() {
    let m = NDManager::new();
    let w = m.ones([4, 4], DType::F32);
    std::thread::scope(|s| {
        for t in 0..4 {
            let m = m.clone();
            s.spawn(move || {
                let local = m.new_sub_manager();
                for i in 0..2000 {
                    let _scope = NDScope::new();
                    let x = local.full([4, 4], (t * i) as f64, DType::F32);
                    let y = (x * w + 1.0) / 2.0;
                    assert_eq!(y.manager(), local);
                }
                assert_eq!(local.memory().live_arrays, 0);
                // An array created here and sent back to the parent thread.
                local.full([2], t as f64, DType::F32).attach(&m)
            });
        }
    });
    // 1 (w) + 4 arrays sent back by the threads.
    assert_eq!(m.memory().live_arrays, 5);
    assert!(m.children().is_empty() || m.children().iter().all(|c| c.memory().live_arrays == 0));
    m.close();
    assert_eq!(m.memory().live_arrays, 0);
}

/// Threads (docs/ownership.md): a read concurrent with in-place writes sees one consistent
/// state.
#[test]
fn concurrent_large_reads_and_in_place_writes() {
    // Large ops read outside the engine lock; in-place writers must wait for them.
    let m = NDManager::new();
    let n = 1 << 18;
    let src = m.ones([n], DType::F32);
    std::thread::scope(|s| {
        let reader = s.spawn(|| {
            for _ in 0..20 {
                let _scope = NDScope::new();
                let v = (src + 0.0).to_vec::<f32>().unwrap();
                // Every element read in one op comes from one consistent state.
                assert!(v.iter().all(|&x| x == v[0]), "torn read");
            }
        });
        let writer = s.spawn(|| {
            let mut t = src;
            for _ in 0..20 {
                t += 1.0;
            }
        });
        reader.join().unwrap();
        writer.join().unwrap();
    });
    assert_eq!(src.to_vec::<f32>().unwrap()[n - 1], 21.0);
    m.close();
}
