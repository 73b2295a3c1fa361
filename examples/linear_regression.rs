//! D2L "linear regression from scratch", as DJL's leak test ran it, twice: with an
//! `NDScope` around each epoch, and without any scope (the intermediates pile up in the
//! long-lived data manager, as in DJL before NDScope).
//!
//! ```text
//! cargo run --release --example linear_regression -- [--epochs N] [--quick]
//!     [--plot memory.png] [--csv] [--json] [--device cpu|gpu|gpu:N]
//! ```
//!
//! `--device gpu` (a build with `--features gpu`) puts the data and the parameters on
//! the first GPU: every step runs there, and the memory lines count that device's
//! live bytes.

use indicatif::{ProgressBar, ProgressStyle};
use ndscope::{DType, Device, GradientCollector, NDArray, NDManager, NDScope};
use std::time::Instant;

const N: usize = 1000;
const BATCH: usize = 10;
const LR: f64 = 0.03;

struct Args {
    epochs: usize,
    quick: bool,
    plot: Option<String>,
    csv: bool,
    json: bool,
    device: Device,
}

fn parse_args() -> Args {
    let mut a = Args {
        epochs: 100,
        quick: false,
        plot: None,
        csv: false,
        json: false,
        device: Device::Cpu,
    };
    let mut epochs_set = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--epochs" => {
                a.epochs = it.next().and_then(|v| v.parse().ok()).expect("--epochs N");
                epochs_set = true;
            }
            "--quick" => a.quick = true,
            "--plot" => a.plot = Some(it.next().expect("--plot FILE.png")),
            "--csv" => a.csv = true,
            "--json" => a.json = true,
            "--device" => {
                a.device = match it.next().as_deref() {
                    Some("cpu") => Device::Cpu,
                    Some("gpu") => Device::Gpu(0),
                    Some(d) if d.starts_with("gpu:") => {
                        Device::Gpu(d[4..].parse().expect("--device gpu:N"))
                    }
                    _ => panic!("--device cpu|gpu|gpu:N"),
                }
            }
            "-h" | "--help" => {
                println!(
                    "usage: linear_regression [--epochs N] [--quick] [--plot FILE.png] [--csv] [--json] [--device cpu|gpu|gpu:N]"
                );
                std::process::exit(0);
            }
            other => panic!("unknown argument {other}"),
        }
    }
    if a.quick && !epochs_set {
        a.epochs = 3;
    }
    a
}

struct Report {
    name: &'static str,
    epochs: usize,
    steps: usize,
    seconds: f64,
    w: Vec<f32>,
    b: f32,
    final_loss: f32,
    peak_rss_mb: f64,
    live_arrays: Vec<usize>,
    live_bytes: Vec<usize>,
}

/// Process peak resident set size (VmHWM) in MiB, 0 where unavailable.
fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}

fn full_loss(x: NDArray, y: NDArray, w: NDArray, b: NDArray) -> f32 {
    ((x.matmul(w) + b - y).square() / 2.0)
        .mean()
        .to_scalar::<f32>()
        .expect("a scalar")
}

fn train(scoped: bool, args: &Args) -> Report {
    ndscope::random::seed(42);
    let on = |d| NDManager::try_new_on(d).unwrap_or_else(|e| panic!("--device {d}: {e}"));
    let (data, params) = (on(args.device), on(args.device));
    let true_w = data.create(&[2.0f32, -3.4], [2, 1]);
    let x = data.random_normal(0.0, 1.0, [N, 2], DType::F32);
    let y = x.matmul(true_w) + 4.2 + data.random_normal(0.0, 0.01, [N, 1], DType::F32);
    let w = params.random_normal(0.0, 0.01, [2, 1], DType::F32);
    let b = params.zeros([1], DType::F32);
    w.set_requires_gradient(true);
    b.set_requires_gradient(true);
    let slices: Vec<String> = (0..N)
        .step_by(BATCH)
        .map(|i| format!("{i}:{}", i + BATCH))
        .collect();
    let name = if scoped { "ndscope" } else { "ndscope-noscope" };
    let bar = if args.quick {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new(args.epochs as u64);
        bar.set_style(
            ProgressStyle::with_template("{prefix:>16} [{bar:40}] {pos}/{len} epochs {msg}")
                .expect("template")
                .progress_chars("=> "),
        );
        bar.set_prefix(name);
        bar
    };
    let (mut live_arrays, mut live_bytes) = (Vec::new(), Vec::new());
    let mut loss = f32::NAN;
    let mut train_time = 0.0;
    for _epoch in 0..args.epochs {
        let scope = scoped.then(NDScope::new);
        let t0 = Instant::now();
        for s in &slices {
            let (xb, yb) = (x.get(s), y.get(s));
            {
                let gc = GradientCollector::new();
                let l = (xb.matmul(w) + b - yb).square() / 2.0;
                gc.backward(l).expect("backward");
            }
            // SGD, outside the collector: param -= lr * grad / batch.
            let mut w = w;
            let mut b = b;
            w -= w.gradient() * (LR / BATCH as f64);
            b -= b.gradient() * (LR / BATCH as f64);
        }
        train_time += t0.elapsed().as_secs_f64();
        loss = full_loss(x, y, w, b);
        drop(scope);
        // Arrays are counted per process; bytes on the device that trains.
        live_arrays.push(ndscope::memory().live_arrays);
        live_bytes.push(ndscope::memory_on(args.device).live_bytes);
        bar.set_message(format!("loss {loss:.3e}"));
        bar.inc(1);
    }
    bar.finish();
    let report = Report {
        name,
        epochs: args.epochs,
        steps: args.epochs * slices.len(),
        seconds: train_time,
        w: w.to_vec::<f32>().expect("w"),
        b: b.to_scalar::<f32>().expect("b"),
        final_loss: loss,
        peak_rss_mb: peak_rss_mb(),
        live_arrays,
        live_bytes,
    };
    data.close();
    params.close();
    report
}

fn plot(path: &str, reports: &[Report]) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    let root = BitMapBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let epochs = reports
        .iter()
        .map(|r| r.live_bytes.len())
        .max()
        .unwrap_or(1);
    let max = reports
        .iter()
        .flat_map(|r| r.live_bytes.iter().copied())
        .max()
        .unwrap_or(1) as f64
        / (1024.0 * 1024.0);
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    )
    .map_err(|_| "the bundled font could not be loaded")?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "live bytes after each epoch (linear regression, autograd)",
            ("sans-serif", 20),
        )
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..epochs.max(2) as f64, 0f64..max * 1.05 + 1e-6)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("live MiB")
        .label_style(("sans-serif", 14))
        .draw()?;
    for r in reports {
        let color = if r.name == "ndscope" { GREEN } else { RED };
        let label = if r.name == "ndscope" {
            "with NDScope per epoch"
        } else {
            "no scope (intermediates pile up)"
        };
        chart
            .draw_series(LineSeries::new(
                r.live_bytes
                    .iter()
                    .enumerate()
                    .map(|(i, &b)| ((i + 1) as f64, b as f64 / (1024.0 * 1024.0))),
                color.stroke_width(3),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(3)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()?;
    root.present()?;
    Ok(())
}

fn json_line(r: &Report) -> String {
    let list = |v: &[usize]| {
        v.iter()
            .map(|x| x.to_string())
            .collect::<Vec<_>>()
            .join(",")
    };
    let w =
        r.w.iter()
            .map(|x| format!("{x}"))
            .collect::<Vec<_>>()
            .join(",");
    format!(
        "{{\"impl\":\"{}\",\"epochs\":{},\"steps\":{},\"seconds\":{:.6},\"us_per_step\":{:.4},\"w\":[{}],\"b\":{},\"final_loss\":{:e},\"peak_rss_mb\":{:.2},\"live_bytes_per_epoch\":[{}]}}",
        r.name,
        r.epochs,
        r.steps,
        r.seconds,
        r.seconds * 1e6 / r.steps.max(1) as f64,
        w,
        r.b,
        r.final_loss,
        r.peak_rss_mb,
        list(&r.live_bytes)
    )
}

fn main() {
    let args = parse_args();
    let reports = [train(true, &args), train(false, &args)];
    if args.json {
        for r in &reports {
            println!("{}", json_line(r));
        }
    } else if args.csv {
        println!("impl,epoch,live_arrays,live_bytes");
        for r in &reports {
            for (i, (a, b)) in r.live_arrays.iter().zip(&r.live_bytes).enumerate() {
                println!("{},{},{a},{b}", r.name, i + 1);
            }
        }
    } else {
        println!("device: {}", args.device);
        for r in &reports {
            println!("== {}", r.name);
            println!(
                "  w = [{:.4}, {:.4}] (true [2, -3.4]), b = {:.4} (true 4.2), loss = {:.3e}",
                r.w[0], r.w[1], r.b, r.final_loss
            );
            println!(
                "  {} steps in {:.3} s: {:.3} us/step; peak RSS {:.1} MiB",
                r.steps,
                r.seconds,
                r.seconds * 1e6 / r.steps.max(1) as f64,
                r.peak_rss_mb
            );
            let n = r.live_bytes.len();
            let show: Vec<usize> = if n <= 6 {
                (0..n).collect()
            } else {
                vec![0, 1, 2, n / 2, n - 2, n - 1]
            };
            for i in show {
                println!(
                    "  after epoch {:>4}: {:>7} live arrays, {:>10} live bytes",
                    i + 1,
                    r.live_arrays[i],
                    r.live_bytes[i]
                );
            }
        }
    }
    if let Some(path) = &args.plot {
        plot(path, &reports).expect("plot");
        eprintln!("wrote {path}: live MiB per epoch, green = ndscope, red = ndscope-noscope");
    }
    let s = &reports[0];
    if args.epochs >= 100 {
        let ok = (s.w[0] - 2.0).abs() < 0.01
            && (s.w[1] + 3.4).abs() < 0.01
            && (s.b - 4.2).abs() < 0.01
            && s.final_loss < 1e-4
            && s.live_bytes[0] == s.live_bytes[s.live_bytes.len() - 1];
        assert!(ok, "the scoped run did not converge to a steady state");
    }
}
