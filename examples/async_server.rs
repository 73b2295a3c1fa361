//! An inference server on a tokio multi-threaded runtime: each request's arrays are
//! freed when it completes, times out or panics, on whichever worker thread it ran.
//!
//! Run: `cargo run --release --example async_server` (`--quick` for CI: fewer and
//! smaller waves; `--waves N`, `--requests N` to change the load; `--device gpu`,
//! built with `--features gpu`, keeps the model on the first GPU and makes every
//! request's arrays there).
//!
//! A small two-layer model (parameters in a long-lived manager) serves waves of
//! concurrent requests. Each request is a `tokio::spawn`ed task wrapped in
//! `ndscope::scope_async`: it makes its input batch, runs layer 1, awaits (a
//! `yield_now`, or a timer: a slow backend), runs layer 2 and the softmax, and returns
//! plain numbers (the predicted classes). Its every array registers in the task's scope
//! whichever worker polls it, and dies with the task. Every seventh request is slow and
//! runs into its deadline (`tokio::time::timeout`): the dropped task's scope frees what
//! it had made. One request per wave panics: its scope is freed too, and the server
//! goes on. After each wave the live memory is back at its baseline (the model's
//! parameters), in the process and on the model's device, which the example asserts.
//!
//! Without `scope_async` an `NDScope` could not help here: a guard held across an
//! `.await` would collect the arrays of whatever other task ran on the thread
//! meanwhile, and close on the wrong thread.

use ndscope::{DType, Device, NDArray, NDManager, memory_on};
use std::time::{Duration, Instant};

/// Input features, hidden units and classes of the model.
const IN: usize = 64;
const HIDDEN: usize = 128;
const CLASSES: usize = 10;

/// How a request ended.
enum Outcome {
    /// The predicted classes, and when the request finished (seconds into the wave).
    Served(Vec<i64>, f64),
    TimedOut,
    Failed,
}

/// One request: a batch of `rows` inputs through the model, with awaits between the
/// layers. Returns the predicted class of each row.
async fn handle(
    model: (NDArray, NDArray),
    rows: usize,
    slow: Option<Duration>,
    fail: bool,
) -> Vec<i64> {
    let (w1, w2) = model;
    let m = w1.manager();
    let x = m.random_normal(0.0, 1.0, [rows, IN], DType::F32); // the request's input
    let h = x.matmul(w1).relu();
    if let Some(delay) = slow {
        tokio::time::sleep(delay).await; // a slow backend: runs into the deadline
    } else {
        tokio::task::yield_now().await; // let other requests run
    }
    let logits = h.matmul(w2);
    tokio::time::sleep(Duration::from_micros(100)).await;
    let probs = logits.softmax(-1);
    assert!(!fail, "request failed on purpose (the server survives it)");
    probs
        .argmax_axis(-1, false)
        .to_vec::<i64>()
        .expect("i64 indices")
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let quick = args.iter().any(|a| a == "--quick");
    let arg = |name: &str, default: usize| {
        args.iter()
            .position(|a| a == name)
            .and_then(|i| args.get(i + 1)?.parse().ok())
            .unwrap_or(default)
    };
    let waves = arg("--waves", if quick { 2 } else { 5 });
    let requests = arg("--requests", if quick { 24 } else { 2000 });
    let rows = if quick { 4 } else { 32 };
    // Generous in quick mode, which also runs in debug builds and under valgrind.
    let deadline = Duration::from_millis(if quick { 2000 } else { 250 });

    // The failing requests' panics are expected: keep their messages short.
    let default_hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let msg = info.to_string();
        if !msg.contains("on purpose") {
            default_hook(info);
        }
    }));

    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let device = match args
        .iter()
        .position(|a| a == "--device")
        .map(|i| args.get(i + 1))
    {
        None => Device::Cpu,
        Some(Some(d)) if d == "cpu" => Device::Cpu,
        Some(Some(d)) if d == "gpu" => ndscope::devices()
            .into_iter()
            .map(|d| d.device)
            .find(|&d| d != Device::Cpu)
            .unwrap_or_else(|| {
                eprintln!("--device gpu: no GPU adapter (build with --features gpu)");
                std::process::exit(1)
            }),
        Some(other) => panic!("--device is cpu or gpu, got {other:?}"),
    };
    // The model's manager: its arrays, and every request's (made from it), on `device`.
    let params = NDManager::new_on(device);
    params.set_name("model");
    let w1 = params.random_normal(0.0, 0.1, [IN, HIDDEN], DType::F32);
    let w2 = params.random_normal(0.0, 0.1, [HIDDEN, CLASSES], DType::F32);
    let (baseline, on_device) = (ndscope::memory(), memory_on(device));
    println!(
        "model on {device}: {} arrays, {} bytes; {waves} waves of {requests} concurrent \
         requests ({rows} rows each) on 4 workers",
        baseline.live_arrays, baseline.live_bytes
    );

    for wave in 0..waves {
        let t0 = Instant::now();
        let outcomes: Vec<Outcome> = runtime.block_on(async {
            let handles: Vec<_> = (0..requests)
                .map(|i| {
                    let slow = (i % 7 == 3).then_some(deadline * 10);
                    let fail = i == requests / 2;
                    // The task's scope: every array the request makes, on any worker.
                    let request = ndscope::scope_async(async move {
                        let classes = handle((w1, w2), rows, slow, fail).await;
                        (classes, t0.elapsed().as_secs_f64())
                    });
                    tokio::spawn(tokio::time::timeout(deadline, request))
                })
                .collect();
            let mut outcomes = Vec::with_capacity(handles.len());
            for h in handles {
                outcomes.push(match h.await {
                    Ok(Ok(served)) => Outcome::Served(served.0, served.1),
                    Ok(Err(_elapsed)) => Outcome::TimedOut,
                    Err(join_error) if join_error.is_panic() => Outcome::Failed,
                    Err(e) => panic!("{e}"),
                });
            }
            outcomes
        });
        // Throughput of the served requests: until the last of them finished (the wave
        // itself lasts until the slow ones' deadline).
        let secs = outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Served(_, at) => Some(*at),
                _ => None,
            })
            .fold(0.0, f64::max);
        let served = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Served(c, _) if c.len() == rows))
            .count();
        let timed_out = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::TimedOut))
            .count();
        let failed = outcomes
            .iter()
            .filter(|o| matches!(o, Outcome::Failed))
            .count();
        let (now, now_on) = (ndscope::memory(), memory_on(device));
        println!(
            "wave {}: {served} served in {:.3} s ({:.0} requests/s), {timed_out} timed out, \
             {failed} failed; live after the wave: {} arrays, {} bytes",
            wave + 1,
            secs,
            served as f64 / secs,
            now.live_arrays,
            now.live_bytes
        );
        assert_eq!(served + timed_out + failed, requests);
        // (Under a heavy load the failing request may time out before it fails.)
        assert!(failed <= 1 && served > 0);
        let slow = (0..requests).filter(|i| i % 7 == 3).count();
        assert!(timed_out >= slow, "the slow requests time out");
        assert_eq!(
            (now.live_arrays, now.live_bytes),
            (baseline.live_arrays, baseline.live_bytes),
            "live memory back at its baseline after the wave"
        );
        assert_eq!(
            (now_on.live_arrays, now_on.live_buffers, now_on.live_bytes),
            (
                on_device.live_arrays,
                on_device.live_buffers,
                on_device.live_bytes
            ),
            "live memory on {device} back at its baseline after the wave"
        );
    }
    drop(runtime);
    params.close();
    println!("all waves back at baseline; final: {}", ndscope::memory());
}
