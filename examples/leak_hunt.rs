//! Hunting a leak with ndscope's diagnostics, told as a story.
//!
//! A small training loop scopes its forward and backward pass but not its SGD update,
//! so `grad * lr` piles up in the long-lived parameter manager. `LeakWatch` notices,
//! `leak_report()` names the line, `debug_dump()` shows where the memory sits, an
//! `NDScope` per step fixes it, and the counters prove it. Then: a use-after-close and
//! what its error says, plainly and in verbose mode, and `profile()` of one step.
//!
//! Run: `cargo run --release --example leak_hunt` (`-- --quick` for CI: fewer steps).

use ndscope::{DType, GradientCollector, LeakWatch, NDArray, NDManager, NDScope, NdError};

const LR: f64 = 0.05;
const FEATURES: usize = 16;

/// A trainer manager with two children: the data (steady) and the parameters (where
/// the leak lands). LeakWatch and the leak report look at `params` alone, so the
/// data's bytes do not crowd the leak out of their top sites.
struct Model {
    trainer: NDManager,
    params: NDManager,
    x: NDArray,
    y: NDArray,
    w: NDArray,
}

fn setup() -> Model {
    ndscope::random::seed(7);
    let trainer = NDManager::new();
    trainer.set_name("trainer");
    let data = trainer.new_sub_manager();
    data.set_name("trainer/data");
    let params = trainer.new_sub_manager();
    params.set_name("trainer/params");
    let x = data.random_normal(0.0, 1.0, [256, FEATURES], DType::F32);
    let true_w = data.random_uniform(-1.0, 1.0, [FEATURES, 1], DType::F32);
    let y = x.matmul(true_w);
    true_w.close(); // only x and y are data; closing now keeps the counts simple
    let w = params.zeros([FEATURES, 1], DType::F32);
    w.set_requires_gradient(true);
    Model {
        trainer,
        params,
        x,
        y,
        w,
    }
}

/// One SGD step. The forward and backward pass run in `ndscope::scope`, so the loss
/// graph's intermediates are freed; the update below runs outside any scope.
fn train_step(m: &Model) -> Result<f32, NdError> {
    let loss = ndscope::scope(|| {
        let gc = GradientCollector::new();
        let loss = (m.x.matmul(m.w) - m.y).square().mean();
        gc.backward(loss)?;
        loss.to_scalar::<f32>()
    })?;
    let mut w = m.w;
    let update = w.try_gradient()? * LR; // THE LEAK: owned by w's manager, never freed
    w -= update;
    Ok(loss)
}

fn main() -> Result<(), NdError> {
    let quick = std::env::args().any(|a| a == "--quick");
    let steps = if quick { 20 } else { 200 };
    let baseline = ndscope::memory();
    println!("== 1. a training loop whose memory grows ({steps} steps)\n");

    let model = setup();
    // LeakWatch warns when the watched manager's live count rises at 3 consecutive
    // checks. It also logs through the `log` crate; without a logger installed we
    // print the returned warning ourselves.
    let mut watch = LeakWatch::new(&model.params);
    let mut warnings = 0;
    for step in 0..steps {
        let loss = train_step(&model)?;
        if let Some(warning) = watch.check() {
            warnings += 1;
            if warnings == 1 {
                let n = step + 1;
                println!("LeakWatch after step {n} (loss {loss:.4}):\n{warning}\n");
            }
        }
    }
    println!("({warnings} warnings in all: it warns again each time the streak doubles)");
    println!("params now: {}\n", model.params.memory());

    // The leak report groups live arrays by the line that created them: the site with
    // one array per step is the culprit; the others are w and its gradient.
    println!(
        "== 2. which line? params.leak_report()\n\n{}",
        model.params.leak_report()
    );
    // The dump shows where in the manager tree the memory sits: the data is steady,
    // the parameter manager holds the pile.
    println!(
        "== 3. where? trainer.debug_dump()\n\n{}",
        model.trainer.debug_dump()
    );
    model.trainer.close(); // frees everything, leaked updates included

    println!("== 4. the fix: an NDScope per step\n");
    let model = setup();
    let mut watch = LeakWatch::new(&model.params);
    let mut after_first = None;
    for step in 0..steps {
        let step_scope = NDScope::new(); // frees `grad * lr` and anything else of this step
        train_step(&model)?;
        drop(step_scope); // closed before the check, so the check sees the steady state
        assert!(watch.check().is_none(), "LeakWatch warned at step {step}");
        after_first.get_or_insert_with(|| model.params.leak_report());
    }
    let report = model.params.leak_report();
    assert_eq!(
        Some(&report),
        after_first.as_ref(),
        "the report must not change"
    );
    println!("LeakWatch stayed silent; the report after step 1 and after step {steps}:");
    println!("\n{report}");
    model.trainer.close();
    let now = ndscope::memory();
    println!("process-wide at start: {baseline}\nprocess-wide now:      {now}");
    // Live arrays and bytes are back at the baseline (peak, cached bytes and the
    // allocation count are history, not leaks); assert_no_leaks panics with the
    // process's leak report otherwise.
    ndscope::assert_no_leaks(&baseline);
    println!("assert_no_leaks(&baseline): ok\n");

    println!("== 5. use after close: what the error says\n");
    let model = setup();
    ndscope::scope(|| train_step(&model))?; // so that w has a gradient
    let logged_update = {
        let _step = NDScope::new();
        model.w.gradient() * LR // kept "for logging", but the scope frees it at the `}`
    };
    let err = logged_update.try_sum().unwrap_err(); // `.sum()` would panic with it
    println!("{err}\n");

    // Verbose mode adds a backtrace of the creation and of the close. It is recorded
    // when an array is created or freed, so it must be on before both.
    ndscope::config::set_verbose(true);
    let logged_update = {
        let _step = NDScope::new();
        model.w.gradient() * LR
    };
    let err = logged_update.try_sum().unwrap_err();
    ndscope::config::set_verbose(false); // backtraces cost time on every creation
    print_shortened(&err.to_string());

    println!("\n== 6. profile(|| ...) of one scoped step\n");
    let (loss, profile) = ndscope::profile(|| {
        let _step = NDScope::new();
        train_step(&model)
    });
    println!("loss {:.4}\n{profile}", loss?);
    model.trainer.close();
    ndscope::assert_no_leaks(&baseline);
    Ok(())
}

/// Print a verbose error with its backtraces cut down to this program's own frames
/// (where the array was created, and the `}` where its scope closed); the frames
/// inside ndscope, the standard library and the runtime are counted, not printed.
fn print_shortened(message: &str) {
    let ours = concat!(module_path!(), "::");
    let (mut keep, mut omitted) = (false, 0);
    for line in message.lines() {
        let trimmed = line.trim_start();
        if let Some((n, symbol)) = trimmed.split_once(": ")
            && n.bytes().all(|b| b.is_ascii_digit())
        {
            // A numbered frame; its `at file:line` line (if any) follows.
            keep = symbol.starts_with(ours);
            if keep {
                println!("{line}");
            } else {
                omitted += 1;
            }
        } else if !trimmed.is_empty() && (keep || !trimmed.starts_with("at ")) {
            if line.starts_with("--- closed") {
                println!("      ({omitted} frames in ndscope, std and the runtime omitted)");
                omitted = 0;
            }
            println!("{line}");
        }
    }
    println!("      ({omitted} frames in ndscope, std and the runtime omitted)");
}
