//! Thread stress test (issue 7.2): eight threads for a bounded time. Seven run scoped
//! training-style loops on parameters owned by shared managers and pass arrays to each
//! other through channels (some kept, some retained); the eighth creates, fills, caps
//! and closes sub-managers. At the end no thread panicked and every counter is back at
//! its baseline.
//!
//! Alone in its file so that the process-wide counters are this test's. Duration:
//! `NDSCOPE_STRESS_SECS` (default 5).

mod common;

use common::counters;
use ndscope::{DType, NDArray, NDManager, NDScope};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

const TRAINERS: usize = 7;

/// A message between trainers: an array that outlives the sender's scope, either
/// unregistered (`keep`: the receiver closes it) or retained (the receiver releases it).
struct Msg {
    array: NDArray,
    retained: bool,
    value: f32,
}

/// Use and free a received array.
fn consume(msg: Msg) {
    let sum = ndscope::scope(|| (msg.array * 2.0).sum().to_scalar::<f32>().unwrap());
    assert_eq!(sum, msg.value * 2.0 * msg.array.size() as f32);
    if msg.retained {
        msg.array.release();
    } else {
        msg.array.close();
    }
}

/// Rules 5, 8 and 9 (docs/ownership.md): kept and retained arrays cross threads; capped and
/// closed sub-managers churn.
#[test]
fn eight_threads_train_share_and_churn_then_counters_return_to_baseline() {
    let secs: u64 = std::env::var("NDSCOPE_STRESS_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    // Every thread starts its clock once all are spawned (a barrier): under valgrind,
    // which runs one thread at a time, a clock started before spawning could run out
    // before a late thread ever got the CPU.
    let secs = Duration::from_secs(secs);
    let start = std::sync::Barrier::new(TRAINERS + 1);
    let start = &start;
    let base = counters();
    let root = NDManager::new();
    let shared = [root.new_sub_manager(), root.new_sub_manager()];
    let shared_w = [
        shared[0].ones([8, 8], DType::F32),
        shared[1].ones([8, 8], DType::F32),
    ];

    let (txs, rxs): (Vec<Sender<Msg>>, Vec<Receiver<Msg>>) =
        (0..TRAINERS).map(|_| channel()).unzip();
    let t0 = Instant::now();
    let (results, churned, rxs) = std::thread::scope(|s| {
        let mut handles = Vec::new();
        for (t, rx) in rxs.into_iter().enumerate() {
            let tx = txs[(t + 1) % TRAINERS].clone();
            let m = shared[t % 2].clone();
            let w_shared = shared_w[t % 2];
            handles.push(s.spawn(move || {
                // This thread's own parameter, owned by a shared manager.
                let w = m.zeros([8, 8], DType::F32);
                let (mut iters, mut sent, mut received) = (0u64, 0u64, 0u64);
                start.wait();
                let deadline = Instant::now() + secs;
                while Instant::now() < deadline {
                    let _step = NDScope::new();
                    let x = m.random_uniform(-1.0, 1.0, [4, 8], DType::F32);
                    let grad = ndscope::scope(|| {
                        let y = x.matmul(w + w_shared).tanh();
                        let loss = y.square().mean();
                        assert!(loss.to_scalar::<f32>().unwrap().is_finite());
                        x.transpose().matmul(y) * (1.0 / 4.0)
                    });
                    w.try_subi(grad * 0.01).unwrap();
                    if iters % 16 == 0 {
                        // Small concurrent in-place update of the shared parameter.
                        w_shared.try_muli(1.0).unwrap();
                    }
                    if iters % 4 == 0 {
                        let value = (iters % 7) as f32;
                        let retained = iters % 8 == 0;
                        let a = m.full([3], value as f64, DType::F32);
                        let a = if retained {
                            a.retain();
                            a // still registered in `_step`: freed by the last of the two
                        } else {
                            a.keep()
                        };
                        tx.send(Msg {
                            array: a,
                            retained,
                            value,
                        })
                        .unwrap();
                        sent += 1;
                    }
                    while let Ok(msg) = rx.try_recv() {
                        consume(msg);
                        received += 1;
                    }
                    iters += 1;
                }
                assert!(!w.to_vec::<f32>().unwrap().iter().any(|v| !v.is_finite()));
                w.close();
                (iters, sent, received, rx)
            }));
        }
        drop(txs);
        // The eighth thread: sub-manager churn.
        let churn = {
            let root = root.clone();
            s.spawn(move || {
                let mut n = 0u64;
                start.wait();
                let deadline = Instant::now() + secs;
                while Instant::now() < deadline {
                    let sub = root.new_sub_manager();
                    let a = sub.ones([16], DType::F64);
                    let inner = sub.new_sub_manager();
                    let b = inner.full([16], 2.0, DType::F64);
                    let c = ndscope::scope(|| (a + b).sum());
                    assert_eq!(c.to_scalar::<f64>().unwrap(), 48.0);
                    if n.is_multiple_of(2) {
                        sub.cap();
                        assert!(sub.try_zeros([1], DType::F64).is_err());
                    }
                    sub.close();
                    assert!(a.is_closed() && b.is_closed() && c.is_closed());
                    n += 1;
                }
                n
            })
        };
        let mut results = Vec::new();
        let mut rxs = Vec::new();
        for h in handles {
            let (iters, sent, received, rx) = h.join().expect("a trainer panicked");
            results.push((iters, sent, received));
            rxs.push(rx);
        }
        let churned = churn.join().expect("the churn thread panicked");
        (results, churned, rxs)
    });
    let elapsed = t0.elapsed();
    // Messages still in flight.
    let mut drained = 0u64;
    for rx in rxs {
        while let Ok(msg) = rx.try_recv() {
            consume(msg);
            drained += 1;
        }
    }
    let iters: u64 = results.iter().map(|r| r.0).sum();
    let sent: u64 = results.iter().map(|r| r.1).sum();
    let received: u64 = results.iter().map(|r| r.2).sum::<u64>() + drained;
    assert_eq!(sent, received);
    assert!(
        results.iter().all(|r| r.0 > 0),
        "every trainer ran: {results:?}"
    );
    assert!(churned > 0);
    // Only the two shared parameters are left.
    assert_eq!(root.memory().live_arrays, 2);
    assert_eq!(
        root.children(),
        shared.to_vec(),
        "churned managers are forgotten"
    );
    root.close();
    assert_eq!(counters(), base, "counters back at baseline");
    println!(
        "stress: {} threads for {elapsed:.1?}: {iters} training steps, {sent} arrays sent \
         through channels, {churned} sub-manager cycles",
        TRAINERS + 1
    );
}
