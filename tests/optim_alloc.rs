//! An optimizer step makes no heap allocation in steady state: every update is a fused
//! in-place pass through the engine (its own binary: `CountingAllocator` is the global
//! allocator here).

use ndscope::nn::{Linear, Module, Sequential, Tanh};
use ndscope::optim::{
    Adam, AdamConfig, AdamW, CosineAnnealing, LrScheduler, Optimizer, Sgd, SgdConfig,
    clip_grad_norm,
};
use ndscope::{CountingAllocator, DType, GradientCollector, NDManager, NDScope};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// The tests run one at a time: another test's arrays could drain the process's shared
/// block cache meanwhile, and this thread's refill from the system would be counted.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Train `model` with `opt` for `warmup` steps, then count the heap allocations of
/// `steps` more optimizer steps (with gradient clipping, `zero_grad` and a schedule
/// update; the forward and backward passes are not counted).
fn step_allocations(
    m: &NDManager,
    model: &Sequential,
    opt: &mut dyn Optimizer,
    warmup: usize,
    steps: usize,
) -> (u64, f32, f32) {
    let x = m.random_uniform(-1.0, 1.0, [32, 3], DType::F32);
    let y = ndscope::scope(|| (x.get(":, 0:1") * x.get(":, 1:2") + x.get(":, 2:3")).keep());
    let mut sched = CosineAnnealing::new(opt.learning_rate(), 10_000, 0.0);
    let mut counted = 0;
    let mut first = f32::NAN;
    let mut last = f32::NAN;
    for i in 0..warmup + steps {
        let loss = {
            let s = NDScope::new();
            let gc = GradientCollector::new();
            let loss = (model.forward(x) - y).square().mean();
            gc.backward(loss).unwrap();
            drop(gc);
            s.escape(loss)
        };
        let v = loss.to_scalar::<f32>().unwrap();
        loss.close();
        if i == 0 {
            first = v;
        }
        last = v;
        let before = CountingAllocator::thread_allocations();
        clip_grad_norm(opt.parameters(), 10.0);
        opt.step();
        sched.step(opt);
        opt.zero_grad();
        let n = CountingAllocator::thread_allocations() - before;
        if i >= warmup {
            counted += n;
        }
    }
    (counted, first, last)
}

fn model(m: &NDManager) -> Sequential {
    Sequential::new(m)
        .add_with(|mm| Linear::new(mm, 3, 16))
        .add(Tanh::new())
        .add_with(|mm| Linear::new(mm, 16, 1))
}

type MakeOptimizer = fn(&Sequential) -> Box<dyn Optimizer>;

fn sgd_nesterov(model: &Sequential) -> Box<dyn Optimizer> {
    let cfg = SgdConfig {
        lr: 0.05,
        momentum: 0.9,
        nesterov: true,
        weight_decay: 1e-4,
        ..Default::default()
    };
    Box::new(Sgd::new(&NDManager::new(), &model.parameters(), cfg))
}

fn sgd_plain(model: &Sequential) -> Box<dyn Optimizer> {
    let cfg = SgdConfig {
        lr: 0.05,
        ..Default::default()
    };
    Box::new(Sgd::new(&NDManager::new(), &model.parameters(), cfg))
}

fn adam(model: &Sequential) -> Box<dyn Optimizer> {
    let cfg = AdamConfig {
        lr: 0.01,
        weight_decay: 1e-4,
        ..Default::default()
    };
    Box::new(Adam::new(&NDManager::new(), &model.parameters(), cfg))
}

fn adamw(model: &Sequential) -> Box<dyn Optimizer> {
    let cfg = AdamConfig {
        lr: 0.01,
        ..AdamConfig::adamw()
    };
    Box::new(AdamW::new(&NDManager::new(), &model.parameters(), cfg))
}

#[test]
fn optimizer_steps_do_not_allocate() {
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    ndscope::random::seed(11);
    let m = NDManager::new();
    let opts: [(&str, MakeOptimizer); 4] = [
        ("sgd (momentum, nesterov, weight decay)", sgd_nesterov),
        ("sgd (plain)", sgd_plain),
        ("adam", adam),
        ("adamw", adamw),
    ];
    for (name, make) in opts {
        let model = model(&m);
        let mut opt = make(&model);
        let (allocs, first, last) = step_allocations(&m, &model, opt.as_mut(), 300, 200);
        assert_eq!(
            allocs, 0,
            "{name}: heap allocations in 200 steady optimizer steps"
        );
        assert!(
            last < first / 2.0,
            "{name}: the loss went from {first} to {last}"
        );
        opt.manager().close();
        model.manager().close();
    }
    // The counter works in this binary (the forward and backward passes allocate).
    assert!(CountingAllocator::thread_allocations() > 0);
    m.close();
}

/// On a GPU (feature `gpu`): a steady optimizer step of a model on the device (its
/// state follows the parameters there) takes no device buffer, and ndscope itself
/// allocates nothing on the host for it: each update's WGSL rule and pipeline key are
/// written into reused strings, its parameter words into an inline block. What is
/// left is wgpu's: recording a dispatch grows the open compute pass's command lists
/// (a few allocations a step, amortized over a batch of 128 commands), and submitting
/// a batch allocates a few hundred times. So the host bound is on the median step: at
/// most 1 allocation (measured: 0 for Sgd, 1 for Adam and AdamW; 8 updates a step
/// here, and two `format!`s an update would make it 16 or more). Counted: `step` alone
/// (the forward and backward passes, and `clip_grad_norm`, which reads the norm back,
/// are not).
#[cfg(feature = "gpu")]
#[test]
fn optimizer_steps_on_a_gpu_take_no_buffer_and_allocate_little() {
    use ndscope::{Device, memory_on};
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = ndscope::devices()
        .into_iter()
        .map(|d| d.device)
        .find(|&d| d != Device::Cpu)
    else {
        assert!(
            std::env::var("NDSCOPE_REQUIRE_GPU").as_deref() != Ok("1"),
            "NDSCOPE_REQUIRE_GPU=1 but no GPU adapter was found"
        );
        return;
    };
    ndscope::random::seed(12);
    let opts: [(&str, MakeOptimizer); 4] = [
        ("sgd (momentum, nesterov, weight decay)", sgd_nesterov),
        ("sgd (plain)", sgd_plain),
        ("adam", adam),
        ("adamw", adamw),
    ];
    for (name, make) in opts {
        let m = NDManager::new_on(d);
        let model = model(&m);
        let mut opt = make(&model);
        for (_, s) in opt.named_state() {
            assert_eq!(
                s.device(),
                d,
                "{name}: the state is made on the parameters' device"
            );
        }
        let x = m.random_uniform(-1.0, 1.0, [32, 3], DType::F32);
        let y = ndscope::scope(|| (x.get(":, 0:1") * x.get(":, 1:2")).keep());
        let (mut host, mut device, mut buffers) = (Vec::new(), 0, 0);
        for i in 0..45 {
            {
                let _s = NDScope::new();
                let gc = GradientCollector::new();
                gc.backward((model.forward(x) - y).square().mean()).unwrap();
            }
            let (h0, dev0) = (CountingAllocator::thread_allocations(), memory_on(d));
            opt.step();
            let dev1 = memory_on(d);
            if i >= 5 {
                host.push(CountingAllocator::thread_allocations() - h0);
                device += dev1.allocations - dev0.allocations;
                buffers += dev1.live_buffers.abs_diff(dev0.live_buffers);
            }
        }
        assert_eq!(device, 0, "{name}: device buffers taken in 40 steady steps");
        assert_eq!(buffers, 0, "{name}: device buffers taken or freed");
        host.sort_unstable();
        let median = host[host.len() / 2];
        assert!(
            median <= 1,
            "{name}: host allocations per steady step, sorted: {host:?}"
        );
        opt.manager().close();
        m.close();
    }
}

/// Queueing a small elementwise op on a GPU allocates little on the host: its kernel's
/// key and expression are not formatted per launch, its parameter words are inline. The
/// engine's record of the new array and wgpu's recording of the dispatch are what is
/// left, so the bound is on the median op.
#[cfg(feature = "gpu")]
#[test]
fn a_queued_elementwise_op_on_a_gpu_allocates_little() {
    use ndscope::Device;
    let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let Some(d) = ndscope::devices()
        .into_iter()
        .map(|d| d.device)
        .find(|&d| d != Device::Cpu)
    else {
        assert!(
            std::env::var("NDSCOPE_REQUIRE_GPU").as_deref() != Ok("1"),
            "NDSCOPE_REQUIRE_GPU=1 but no GPU adapter was found"
        );
        return;
    };
    let m = NDManager::new_on(d);
    let (a, b) = (m.ones([10], DType::F32), m.ones([10], DType::F32));
    let mut host = Vec::new();
    for i in 0..300 {
        let h0 = CountingAllocator::thread_allocations();
        let c = a + b;
        let d = c * 2.0;
        c.close();
        d.close();
        if i >= 20 {
            host.push(CountingAllocator::thread_allocations() - h0);
        }
    }
    host.sort_unstable();
    let median = host[host.len() / 2];
    eprintln!("host allocations per two queued ops and their closes: median {median}");
    assert_eq!(median, 0, "sorted: {host:?}");
    m.close();
}
