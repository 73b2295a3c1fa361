//! Train a classifier on scikit-learn's 8×8 digits (issue 12): an MLP (64-128-10,
//! ReLU) or a small CNN, Adam (lr 1e-3), batches of 32 shuffled each epoch, a scope
//! per step, cross-entropy; test accuracy on the last 360 samples, time per step, and
//! live bytes after each epoch, which must stay flat.
//!
//! ```text
//! cargo run --release --example digits -- [--model mlp|cnn] [--epochs N] [--seed S]
//!     [--json] [--plot FILE.png] [--save FILE] [--load FILE] [--quick] [--device cpu|gpu]
//! ```
//!
//! `--device gpu` (built with `--features gpu`) trains on the first GPU: the model and
//! the optimizer's state live there, each batch goes up in its step's scope, and the
//! checkpoint round trip loads into a fresh model there. A seeded model starts from the
//! same values on every device (initialisation draws on the host), and a checkpoint
//! saved from a GPU model loads into a CPU one (`--load` evaluates on the CPU).
//!
//! `bench/digits_torch.py` is the same program in PyTorch (same models, optimizer,
//! batches and split) and `bench/digits_numpy.py` the MLP in numpy; BENCHMARKS.md
//! ("Digits") has the figures.

use indicatif::{ProgressBar, ProgressStyle};
use ndscope::data::{Batches, TestSize, load_digits, train_test_split};
use ndscope::nn::{self, Conv2d, Flatten, Linear, MaxPool2d, Module, Relu, Sequential};
use ndscope::optim::{Adam, AdamConfig, Optimizer};
use ndscope::{Device, GradientCollector, NDArray, NDManager, NDScope};
use std::time::Instant;

const TEST: usize = 360;
const BATCH: usize = 32;
const LR: f64 = 1e-3;
/// Steps per epoch in `--quick` mode (CI runs every example that way, in debug).
const QUICK_STEPS: usize = 4;

struct Args {
    model: String,
    epochs: usize,
    seed: u64,
    json: bool,
    quick: bool,
    plot: Option<String>,
    save: Option<String>,
    load: Option<String>,
    device: Device,
}

fn usage() -> ! {
    println!(
        "usage: digits [--model mlp|cnn] [--epochs N] [--seed S] [--json] [--plot FILE.png] \
         [--save FILE] [--load FILE] [--quick] [--device cpu|gpu]"
    );
    std::process::exit(0)
}

fn parse_args() -> Args {
    let mut a = Args {
        model: "mlp".to_string(),
        epochs: 30,
        seed: 0,
        json: false,
        quick: false,
        plot: None,
        save: None,
        load: None,
        device: Device::Cpu,
    };
    let mut epochs_set = false;
    let mut it = std::env::args().skip(1);
    while let Some(arg) = it.next() {
        let mut value = |what: &str| it.next().unwrap_or_else(|| panic!("{arg} needs {what}"));
        match arg.as_str() {
            "--model" => a.model = value("mlp or cnn"),
            "--epochs" => {
                a.epochs = value("N").parse().expect("--epochs N");
                epochs_set = true;
            }
            "--seed" => a.seed = value("S").parse().expect("--seed S"),
            "--json" => a.json = true,
            "--quick" => a.quick = true,
            "--plot" => a.plot = Some(value("FILE.png")),
            "--save" => a.save = Some(value("FILE")),
            "--load" => a.load = Some(value("FILE")),
            "--device" => {
                a.device = match value("cpu or gpu").as_str() {
                    "cpu" => Device::Cpu,
                    "gpu" => ndscope::devices()
                        .into_iter()
                        .map(|d| d.device)
                        .find(|&d| d != Device::Cpu)
                        .unwrap_or_else(|| {
                            eprintln!(
                                "--device gpu: no GPU adapter (build with --features gpu; \
                                 Mesa's mesa-vulkan-drivers stands in for one)"
                            );
                            std::process::exit(1)
                        }),
                    other => panic!("--device is cpu or gpu, got {other}"),
                }
            }
            "-h" | "--help" => usage(),
            other => panic!("unknown argument {other} (--help lists them)"),
        }
    }
    assert!(
        a.model == "mlp" || a.model == "cnn",
        "--model is mlp or cnn, got {}",
        a.model
    );
    if a.quick && !epochs_set {
        a.epochs = 1;
    }
    a
}

/// The issue's models, with PyTorch's default initialisation, in a sub-manager of `m`.
fn build(m: &NDManager, kind: &str) -> Sequential {
    match kind {
        // 64-128-10 with ReLU.
        "mlp" => Sequential::new(m)
            .add_with(|mm| Linear::new(mm, 64, 128))
            .add(Relu::new())
            .add_with(|mm| Linear::new(mm, 128, 10)),
        // conv 3×3 1→16 pad 1, ReLU, max-pool 2, conv 3×3 16→32 pad 1, ReLU,
        // max-pool 2, flatten, linear 128→10.
        _ => Sequential::new(m)
            .add_with(|mm| Conv2d::builder(1, 16, 3).padding(1).build(mm))
            .add(Relu::new())
            .add(MaxPool2d::new(2))
            .add_with(|mm| Conv2d::builder(16, 32, 3).padding(1).build(mm))
            .add(Relu::new())
            .add(MaxPool2d::new(2))
            .add(Flatten::new())
            .add_with(|mm| Linear::new(mm, 32 * 2 * 2, 10)),
    }
}

/// Predicted classes of `x` (in evaluation mode; the model goes back to training).
fn predict(model: &mut Sequential, x: NDArray) -> Vec<i64> {
    model.eval();
    let p = ndscope::scope(|| {
        model
            .forward(x)
            .argmax_axis(-1, false)
            .to_vec::<i64>()
            .expect("i64 predictions")
    });
    model.train();
    p
}

fn accuracy(pred: &[i64], labels: &[i64]) -> f64 {
    let hits = pred.iter().zip(labels).filter(|(p, l)| p == l).count();
    hits as f64 / labels.len() as f64
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

struct Epoch {
    loss: f64,
    accuracy: f64,
    live_bytes: usize,
    model_bytes: usize,
    optimizer_bytes: usize,
}

struct Report {
    model: String,
    device: Device,
    epochs: Vec<Epoch>,
    steps: usize,
    train_seconds: f64,
    accuracy: f64,
    peak_rss_mb: f64,
    round_trip: Option<bool>,
}

impl Report {
    fn us_per_step(&self) -> f64 {
        self.train_seconds * 1e6 / self.steps.max(1) as f64
    }

    fn json(&self) -> String {
        let list =
            |f: &dyn Fn(&Epoch) -> String| self.epochs.iter().map(f).collect::<Vec<_>>().join(",");
        format!(
            "{{\"impl\":\"ndscope\",\"model\":\"{}\",\"device\":\"{}\",\"epochs\":{},\"steps\":{},\"us_per_step\":{:.3},\
             \"test_accuracy\":{:.4},\"live_bytes_per_epoch\":[{}],\"train_seconds\":{:.4},\
             \"loss_per_epoch\":[{}],\"test_accuracy_per_epoch\":[{}],\"model_bytes\":{},\
             \"optimizer_bytes\":{},\"peak_rss_mb\":{:.2}{}}}",
            self.model,
            self.device,
            self.epochs.len(),
            self.steps,
            self.us_per_step(),
            self.accuracy,
            list(&|e| e.live_bytes.to_string()),
            self.train_seconds,
            list(&|e| format!("{:.5}", e.loss)),
            list(&|e| format!("{:.4}", e.accuracy)),
            self.epochs.last().map_or(0, |e| e.model_bytes),
            self.epochs.last().map_or(0, |e| e.optimizer_bytes),
            self.peak_rss_mb,
            match self.round_trip {
                Some(ok) => format!(",\"checkpoint_round_trip_identical\":{ok}"),
                None => String::new(),
            }
        )
    }
}

/// The pixels as the model takes them: `[N, 64]` for the MLP, `[N, 1, 8, 8]` for the
/// CNN (a view).
fn inputs(x: NDArray, kind: &str) -> NDArray {
    match kind {
        "mlp" => x,
        _ => x.reshape([x.shape().dims()[0], 1, 8, 8]),
    }
}

/// Load a checkpoint written by `--save` into a fresh model (and optimizer, whose
/// state it also holds) and return them; on an error the fresh ones are closed.
fn load_checkpoint(
    m: &NDManager,
    kind: &str,
    path: &std::path::Path,
) -> ndscope::Result<(Sequential, Adam)> {
    let model = build(m, kind);
    let mut opt = Adam::new(m, &model.parameters(), adam_config());
    match nn::try_load_with_optimizer(path, &model, &mut opt) {
        Ok(()) => Ok((model, opt)),
        Err(e) => {
            model.manager().close();
            opt.manager().close();
            Err(e)
        }
    }
}

fn adam_config() -> AdamConfig {
    AdamConfig {
        lr: LR,
        ..AdamConfig::default()
    }
}

fn train(args: &Args, train: &[NDArray], test: &[NDArray]) -> Report {
    let kind = args.model.as_str();
    ndscope::random::seed(args.seed);
    let dev = args.device;
    let m = NDManager::new_on(dev);
    m.set_name("digits");
    // On a GPU the test set goes up once; each training batch in its step.
    let up = |a: NDArray| {
        if dev == Device::Cpu {
            a
        } else {
            a.to_device(dev)
        }
    };
    let test_x = up(test[0]);
    let mut model = build(&m, kind);
    let mut opt = Adam::new(&m, &model.parameters(), adam_config());
    let batches = Batches::new(train, BATCH).shuffle(args.seed);
    let steps_per_epoch = if args.quick {
        QUICK_STEPS
    } else {
        batches.len()
    };
    let labels = test[1].to_vec::<i64>().expect("labels");
    let bar = if args.json || args.quick {
        ProgressBar::hidden()
    } else {
        let bar = ProgressBar::new((args.epochs * steps_per_epoch) as u64);
        bar.set_style(
            ProgressStyle::with_template("{prefix} [{bar:40}] {pos}/{len} steps {msg}")
                .expect("template")
                .progress_chars("=> "),
        );
        bar.set_prefix(format!("digits {kind}"));
        bar
    };
    let mut epochs = Vec::with_capacity(args.epochs);
    let (mut steps, mut train_seconds) = (0usize, 0.0f64);
    for epoch in 0..args.epochs {
        let mut it = batches.iter();
        let (mut loss_sum, mut n) = (0.0f64, 0usize);
        let t0 = Instant::now();
        while n < steps_per_epoch {
            let _step = NDScope::new(); // frees the step's arrays, the batch included
            let Some(batch) = it.next() else { break };
            let (xb, yb) = (up(inputs(batch[0], kind)), up(batch[1]));
            let gc = GradientCollector::new();
            let loss = model.forward(xb).cross_entropy(yb);
            gc.backward(loss).expect("backward");
            drop(gc);
            opt.step();
            loss_sum += loss.to_scalar::<f32>().expect("a scalar") as f64;
            n += 1;
            bar.inc(1);
        }
        train_seconds += t0.elapsed().as_secs_f64();
        steps += n;
        let acc = accuracy(&predict(&mut model, test_x), &labels);
        let e = Epoch {
            loss: loss_sum / n.max(1) as f64,
            accuracy: acc,
            live_bytes: ndscope::memory().live_bytes,
            model_bytes: model.manager().memory().live_bytes,
            optimizer_bytes: opt.manager().memory().live_bytes,
        };
        bar.set_message(format!(
            "epoch {} loss {:.4} test accuracy {:.4}",
            epoch + 1,
            e.loss,
            e.accuracy
        ));
        epochs.push(e);
    }
    bar.finish_and_clear();
    let pred = predict(&mut model, test_x);
    let acc = accuracy(&pred, &labels);

    // A checkpoint: --save FILE, or a temporary file in --quick mode (so CI runs the
    // round trip). It is loaded into a fresh model, whose predictions must be the same.
    let temp =
        std::env::temp_dir().join(format!("ndscope-digits-{}.safetensors", std::process::id()));
    let path = match (&args.save, args.quick) {
        (Some(p), _) => Some(std::path::PathBuf::from(p)),
        (None, true) => Some(temp),
        (None, false) => None,
    };
    let round_trip = path.map(|path| {
        nn::save_with_optimizer(&path, &model, &opt);
        let (mut loaded, loaded_opt) =
            load_checkpoint(&m, kind, &path).expect("load the checkpoint just saved");
        let same =
            predict(&mut loaded, test_x) == pred && loaded_opt.step_count() == opt.step_count();
        loaded.manager().close();
        loaded_opt.manager().close();
        if args.save.is_none() {
            let _ = std::fs::remove_file(&path);
        }
        same
    });
    let report = Report {
        model: args.model.clone(),
        device: dev,
        epochs,
        steps,
        train_seconds,
        accuracy: acc,
        peak_rss_mb: peak_rss_mb(),
        round_trip,
    };
    m.close();
    report
}

fn plot(path: &str, r: &Report) -> Result<(), Box<dyn std::error::Error>> {
    use plotters::prelude::*;
    plotters::style::register_font(
        "sans-serif",
        FontStyle::Normal,
        epaint_default_fonts::HACK_REGULAR,
    )
    .map_err(|_| "the bundled font could not be loaded")?;
    let root = BitMapBackend::new(path, (800, 700)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(350);
    let n = r.epochs.len().max(2) as f64;
    let series = |f: &dyn Fn(&Epoch) -> f64| -> Vec<(f64, f64)> {
        r.epochs
            .iter()
            .enumerate()
            .map(|(i, e)| ((i + 1) as f64, f(e)))
            .collect()
    };
    let loss = series(&|e| e.loss);
    let max_loss = loss.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3);
    let mut chart = ChartBuilder::on(&top)
        .caption(
            format!("digits {}: mean training loss per epoch", r.model),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..n, 0f64..max_loss * 1.05)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("cross-entropy")
        .label_style(("sans-serif", 14))
        .draw()?;
    chart.draw_series(LineSeries::new(loss, BLUE.stroke_width(3)))?;
    let acc = series(&|e| e.accuracy);
    let min_acc = acc.iter().map(|p| p.1).fold(1.0, f64::min);
    let mut chart = ChartBuilder::on(&bottom)
        .caption(
            format!(
                "test accuracy per epoch (last 360 samples; final {:.4})",
                r.accuracy
            ),
            ("sans-serif", 20),
        )
        .margin(15)
        .x_label_area_size(35)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..n, (min_acc - 0.02).max(0.0)..1.0)?;
    chart
        .configure_mesh()
        .x_desc("epoch")
        .y_desc("accuracy")
        .label_style(("sans-serif", 14))
        .draw()?;
    chart.draw_series(LineSeries::new(acc, GREEN.stroke_width(3)))?;
    root.present()?;
    Ok(())
}

fn main() {
    let args = parse_args();
    let data = NDManager::new();
    data.set_name("data");
    // The first 1437 samples train, the last 360 test (as the issue's split).
    let (x, y) = load_digits(&data);
    let (train_set, test_set) = train_test_split(&[x, y], TestSize::Count(TEST), None);
    let kind = args.model.as_str();
    let test = [inputs(test_set[0], kind), test_set[1]];

    if let Some(path) = &args.load {
        // Evaluate a checkpoint written by --save.
        let m = NDManager::new();
        let (mut model, opt) = match load_checkpoint(&m, kind, path.as_ref()) {
            Ok(loaded) => loaded,
            Err(e) => {
                eprintln!("{path} is not a checkpoint of --model {kind} written by --save: {e}");
                std::process::exit(1);
            }
        };
        let labels = test[1].to_vec::<i64>().expect("labels");
        let acc = accuracy(&predict(&mut model, test[0]), &labels);
        if args.json {
            println!(
                "{{\"impl\":\"ndscope\",\"model\":\"{kind}\",\"loaded\":\"{path}\",\"steps\":{},\"test_accuracy\":{acc:.4}}}",
                opt.step_count()
            );
        } else {
            println!(
                "{path}: a {kind} trained for {} steps; test accuracy {acc:.4} on the last {TEST} samples",
                opt.step_count()
            );
        }
        m.close();
        data.close();
        return;
    }

    let r = train(&args, &train_set, &test);
    if args.json {
        println!("{}", r.json());
    } else {
        println!(
            "digits {} (ndscope, {}): {} epochs, {} steps of {BATCH}, Adam lr {LR}",
            r.model,
            r.device,
            r.epochs.len(),
            r.steps
        );
        println!(
            "  test accuracy {:.4} on the last {TEST} samples; {:.2} us per step; peak RSS {:.1} MiB",
            r.accuracy,
            r.us_per_step(),
            r.peak_rss_mb
        );
        println!("  epoch   loss     test acc   live bytes (process, model, optimizer)");
        for (i, e) in r.epochs.iter().enumerate() {
            println!(
                "  {:>5}   {:.4}   {:.4}     {} ({}, {})",
                i + 1,
                e.loss,
                e.accuracy,
                e.live_bytes,
                e.model_bytes,
                e.optimizer_bytes
            );
        }
    }
    match r.round_trip {
        Some(true) => eprintln!(
            "checkpoint round trip ({}): identical predictions on the {TEST} test samples",
            args.save.as_deref().unwrap_or("a temporary file")
        ),
        Some(false) => panic!("the checkpoint round trip changed the predictions"),
        None => {}
    }
    if let Some(path) = &args.plot {
        plot(path, &r).expect("plot");
        eprintln!("wrote {path}: loss and test accuracy per epoch");
    }
    if let (Some(first), Some(last)) = (r.epochs.first(), r.epochs.last()) {
        assert_eq!(
            first.live_bytes, last.live_bytes,
            "live bytes after the last epoch differ from those after epoch 1"
        );
        if !args.json && r.epochs.len() > 1 {
            eprintln!(
                "live bytes flat: {} after epoch 1 and after epoch {}",
                first.live_bytes,
                r.epochs.len()
            );
        }
    }
    data.close();
}
