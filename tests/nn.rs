//! `ndscope::nn` (layers, initialisation) and `ndscope::optim` (optimizers, schedules,
//! gradient clipping): shapes, values against hand computations and the published
//! update rules, gradients, ownership and memory.

mod common;

use common::{counts, gradcheck};
use ndscope::nn::init::{FanMode, Init, Nonlinearity, calculate_gain, fan_in_and_fan_out};
use ndscope::nn::{
    BatchNorm2d, Conv2d, Dropout, Embedding, Flatten, Gelu, LayerNorm, Linear, MaxPool2d, Module,
    Relu, Sequential, Sigmoid, Tanh,
};
use ndscope::optim::{
    Adam, AdamConfig, AdamW, CosineAnnealing, LrScheduler, Optimizer, Sgd, SgdConfig, StepLr,
    clip_grad_norm, try_clip_grad_norm,
};
use ndscope::{DType, GradientCollector, NDArray, NDManager, NDScope, NdError};
use std::sync::{Mutex, MutexGuard};

/// The random generator is process-wide and tests run in parallel: every test that
/// draws random numbers holds this lock, so a seeded test sees only its own draws.
static RNG: Mutex<()> = Mutex::new(());

fn rng() -> MutexGuard<'static, ()> {
    RNG.lock().unwrap_or_else(|e| e.into_inner())
}

fn vals(a: NDArray) -> Vec<f64> {
    match a.dtype() {
        DType::F32 => a
            .to_vec::<f32>()
            .unwrap()
            .into_iter()
            .map(f64::from)
            .collect(),
        _ => a.to_vec::<f64>().unwrap(),
    }
}

fn assert_close(got: &[f64], want: &[f64], rel: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= rel * (1.0 + w.abs()),
            "{what}[{i}]: got {g}, want {w} (all: {got:?} vs {want:?})"
        );
    }
}

/// Mean and standard deviation (population).
fn stats(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    (mean, var.sqrt())
}

// ------------------------------------------------------------------ layers

/// `x Wᵀ + b` by hand: x [n, i], w [o, i], b [o].
fn linear_ref(x: &[f64], w: &[f64], b: Option<&[f64]>, n: usize, i: usize, o: usize) -> Vec<f64> {
    let mut y = vec![0.0; n * o];
    for r in 0..n {
        for c in 0..o {
            let mut s = b.map_or(0.0, |b| b[c]);
            for k in 0..i {
                s += x[r * i + k] * w[c * i + k];
            }
            y[r * o + c] = s;
        }
    }
    y
}

#[test]
fn linear_values_and_shapes() {
    let m = NDManager::new();
    let wv: Vec<f64> = (0..12).map(|k| (k as f64 - 5.5) / 4.0).collect();
    let bv = [0.5, -1.0, 0.25];
    let layer = Linear::from_parameters(&m, m.create(&wv, [3, 4]), Some(m.create(&bv, [3])));
    assert_eq!((layer.in_features(), layer.out_features()), (4, 3));
    let xv: Vec<f64> = (0..8).map(|k| (k as f64).sin()).collect();
    let y = layer.forward(m.create(&xv, [2, 4]));
    assert_eq!(y.shape().dims(), &[2, 3]);
    assert_close(
        &vals(y),
        &linear_ref(&xv, &wv, Some(&bv), 2, 4, 3),
        1e-14,
        "y",
    );
    // Leading dimensions: [2, 1, 4] -> [2, 1, 3], the same rows.
    let y3 = layer.forward(m.create(&xv, [2, 1, 4]));
    assert_eq!(y3.shape().dims(), &[2, 1, 3]);
    assert_close(&vals(y3), &vals(y), 1e-14, "y3");
    // A transposed input (non-contiguous) gives the same result.
    let xt = m.create(&xv, [2, 4]).transpose().to_dtype(DType::F64);
    let xt = ndscope::scope(|| m.create(&vals(xt), [4, 2]).transpose());
    assert_close(&vals(layer.forward(xt)), &vals(y), 1e-14, "transposed x");
    // No bias.
    let nb = Linear::from_parameters(&m, m.create(&wv, [3, 4]), None);
    assert!(nb.bias().is_none());
    assert_eq!(nb.named_parameters().len(), 1);
    assert_close(
        &vals(nb.forward(m.create(&xv, [2, 4]))),
        &linear_ref(&xv, &wv, None, 2, 4, 3),
        1e-14,
        "no bias",
    );
    // Zero rows in, zero rows out.
    assert_eq!(
        layer.forward(m.zeros([0, 4], DType::F64)).shape().dims(),
        &[0, 3]
    );
    m.close();
}

#[test]
fn linear_defaults_builder_and_errors() {
    let _g = rng();
    let m = NDManager::new();
    let l = Linear::new(&m, 5, 7);
    assert_eq!(l.weight().shape().dims(), &[7, 5]);
    assert_eq!(l.bias().unwrap().shape().dims(), &[7]);
    assert_eq!(l.weight().dtype(), DType::F32);
    assert!(l.weight().requires_gradient() && l.bias().unwrap().requires_gradient());
    let names: Vec<String> = l.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "bias"]);
    assert_eq!(l.parameters(), vec![l.weight(), l.bias().unwrap()]);
    assert_eq!(l.manager().parent(), Some(m.clone()));
    assert_eq!(Module::manager(&l), Some(l.manager()));

    let b = Linear::builder(3, 2)
        .dtype(DType::F64)
        .weight_init(Init::Constant(0.5))
        .bias_init(Init::Zeros)
        .build(&m);
    let y = b.forward(m.create(&[1.0f64, 2.0, 3.0], [1, 3]));
    assert_eq!(vals(y), vec![3.0, 3.0]);
    let w = Linear::with_init(&m, 2, 2, Init::Ones, Init::Constant(-1.0));
    assert_eq!(vals(w.forward(m.ones([1, 2], DType::F32))), vec![1.0, 1.0]);

    // Wrong input size or dtype: typed errors, nothing left behind anywhere.
    let x = m.ones([4, 6], DType::F32);
    let before = (counts(&m), counts(&l.manager()));
    fails!(m, l.try_forward(x), NdError::ShapeMismatch { .. });
    let x64 = m.ones([4, 5], DType::F64);
    fails!(m, l.try_forward(x64), NdError::DTypeMismatch { .. });
    assert_eq!(before.1, counts(&l.manager()));
    let msg = common::expect_panic(|| {
        l.forward(x);
    });
    assert!(
        msg.contains("cannot be broadcast") || msg.contains("matmul"),
        "{msg}"
    );

    // Builder errors leave nothing in `m`.
    fails!(
        m,
        Linear::builder(2, 2).dtype(DType::I32).try_build(&m),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        Linear::builder(2, 2)
            .weight_init(Init::Uniform {
                low: 1.0,
                high: -1.0
            })
            .try_build(&m),
        NdError::InvalidArgument { .. }
    );
    let children = m.children().len();
    assert!(
        Linear::builder(2, 2)
            .bias_init(Init::Normal {
                mean: 0.0,
                std: -1.0
            })
            .try_build(&m)
            .is_err()
    );
    assert_eq!(
        m.children().len(),
        children,
        "the failed layer's manager was closed"
    );
    // from_parameters errors: nothing moves.
    let w1 = m.ones([2, 3], DType::F64);
    let (b3, b2f, v6, i22) = (
        m.ones([3], DType::F64),
        m.ones([2], DType::F32),
        m.ones([6], DType::F64),
        m.ones([2, 2], DType::I64),
    );
    fails!(
        m,
        Linear::try_from_parameters(&m, w1, Some(b3)),
        NdError::InvalidShape { .. }
    );
    fails!(
        m,
        Linear::try_from_parameters(&m, w1, Some(b2f)),
        NdError::DTypeMismatch { .. }
    );
    fails!(
        m,
        Linear::try_from_parameters(&m, v6, None),
        NdError::InvalidShape { .. }
    );
    fails!(
        m,
        Linear::try_from_parameters(&m, i22, None),
        NdError::UnsupportedDType { .. }
    );
    assert_eq!(w1.manager(), m);
    assert!(!w1.requires_gradient());
    let closed = NDManager::new();
    closed.close();
    assert!(matches!(
        Linear::try_new(&closed, 2, 2),
        Err(NdError::ManagerClosed { .. })
    ));
    m.close();
}

#[test]
fn linear_default_init_is_pytorchs() {
    let _g = rng();
    let m = NDManager::new();
    ndscope::random::seed(5);
    let l = Linear::builder(100, 200).dtype(DType::F64).build(&m);
    let (w, b) = (vals(l.weight()), vals(l.bias().unwrap()));
    // U(-1/sqrt(100), 1/sqrt(100)) for both.
    let bound = 0.1;
    assert!(w.iter().chain(&b).all(|v| v.abs() <= bound));
    assert!(w.iter().any(|v| v.abs() > 0.099) && w.iter().any(|&v| v < 0.0));
    let (mean, std) = stats(&w);
    assert!(mean.abs() < 0.003, "mean {mean}");
    let want = bound / 3f64.sqrt();
    assert!((std - want).abs() < 0.03 * want, "std {std} want {want}");
    assert!(b.iter().any(|v| v.abs() > 0.08));
    // Seeded: the same seed gives the same model.
    ndscope::random::seed(5);
    let again = Linear::builder(100, 200).dtype(DType::F64).build(&m);
    assert_eq!(vals(again.weight()), w);
    assert_eq!(vals(again.bias().unwrap()), b);
    ndscope::random::seed(6);
    assert_ne!(
        vals(
            Linear::builder(100, 200)
                .dtype(DType::F64)
                .build(&m)
                .weight()
        ),
        w
    );
    m.close();
}

#[test]
fn init_schemes_follow_the_formulas() {
    let _g = rng();
    let m = NDManager::new();
    ndscope::random::seed(9);
    let shape = [300, 200]; // fan_in 200, fan_out 300
    assert_eq!(fan_in_and_fan_out(&shape.into()).unwrap(), (200, 300));
    assert_eq!(fan_in_and_fan_out(&[8, 3, 3, 3].into()).unwrap(), (27, 72));
    assert_eq!(fan_in_and_fan_out(&[4, 0].into()).unwrap(), (0, 4));
    assert!(matches!(
        fan_in_and_fan_out(&[4].into()),
        Err(NdError::InvalidArgument { .. })
    ));
    assert_eq!(calculate_gain(Nonlinearity::Linear), 1.0);
    assert_eq!(calculate_gain(Nonlinearity::Sigmoid), 1.0);
    assert_eq!(calculate_gain(Nonlinearity::Selu), 0.75);
    assert_eq!(calculate_gain(Nonlinearity::LeakyRelu(0.0)), 2f64.sqrt());
    assert!((calculate_gain(Nonlinearity::LeakyRelu(0.2)) - (2.0 / 1.04f64).sqrt()).abs() < 1e-15);

    let uniform = |init: Init, bound: f64| {
        let v = vals(init.create(&m, shape, DType::F64));
        assert!(
            v.iter().all(|x| x.abs() <= bound),
            "{init:?}: beyond {bound}"
        );
        assert!(
            v.iter().any(|x| x.abs() > 0.99 * bound),
            "{init:?}: never near {bound}"
        );
        let (mean, std) = stats(&v);
        assert!(mean.abs() < 0.02 * bound, "{init:?}: mean {mean}");
        let want = bound / 3f64.sqrt();
        assert!(
            (std - want).abs() < 0.02 * want,
            "{init:?}: std {std} want {want}"
        );
    };
    let normal = |init: Init, want: f64| {
        let v = vals(init.create(&m, shape, DType::F64));
        let (mean, std) = stats(&v);
        assert!(mean.abs() < 0.02 * want, "{init:?}: mean {mean}");
        assert!(
            (std - want).abs() < 0.02 * want,
            "{init:?}: std {std} want {want}"
        );
    };
    uniform(Init::xavier_uniform(), (6.0f64 / 500.0).sqrt());
    uniform(
        Init::XavierUniform { gain: 2.0 },
        2.0 * (6.0f64 / 500.0).sqrt(),
    );
    normal(Init::xavier_normal(), (2.0f64 / 500.0).sqrt());
    uniform(Init::kaiming_uniform(), (6.0f64 / 200.0).sqrt());
    uniform(
        Init::KaimingUniform {
            mode: FanMode::FanOut,
            nonlinearity: Nonlinearity::Relu,
        },
        (6.0f64 / 300.0).sqrt(),
    );
    normal(Init::kaiming_normal(), (2.0f64 / 200.0).sqrt());
    normal(
        Init::KaimingNormal {
            mode: FanMode::FanOut,
            nonlinearity: Nonlinearity::Tanh,
        },
        5.0 / 3.0 / 300f64.sqrt(),
    );
    uniform(Init::pytorch_default(), 1.0 / 200f64.sqrt());
    uniform(
        Init::Uniform {
            low: -0.3,
            high: 0.3,
        },
        0.3,
    );
    normal(
        Init::Normal {
            mean: 0.0,
            std: 0.5,
        },
        0.5,
    );
    assert_eq!(
        vals(Init::Constant(2.5).create(&m, [2], DType::F32)),
        vec![2.5, 2.5]
    );
    assert_eq!(vals(Init::Ones.create(&m, [2], DType::F64)), vec![1.0, 1.0]);
    assert_eq!(
        Init::bias_default(4),
        Init::Uniform {
            low: -0.5,
            high: 0.5
        }
    );
    assert_eq!(
        Init::bias_default(0),
        Init::Uniform {
            low: 0.0,
            high: 0.0
        }
    );
    // Zero-size arrays are fine (PyTorch: a no-op).
    assert_eq!(
        Init::kaiming_uniform()
            .create(&m, [0, 5], DType::F32)
            .size(),
        0
    );

    // Errors: a 1-D Xavier, a bad distribution, an integer dtype; nothing created.
    fails!(
        m,
        Init::xavier_uniform().try_create(&m, [5], DType::F32),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        Init::Normal {
            mean: 0.0,
            std: f64::NAN
        }
        .try_create(&m, [5], DType::F32),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        Init::Zeros.try_create(&m, [5], DType::I64),
        NdError::InvalidArgument { .. }
    );

    // In place, through a view: only the view's elements change.
    let a = m.zeros([4, 6], DType::F32);
    let col = a.get(":, 1");
    Init::Constant(7.0).fill(col);
    let v = vals(a);
    for (i, x) in v.iter().enumerate() {
        assert_eq!(*x, if i % 6 == 1 { 7.0 } else { 0.0 });
    }
    Init::xavier_uniform().fill(a.transpose());
    let bound = (6.0f64 / 10.0).sqrt();
    assert!(vals(a).iter().all(|x| x.abs() <= bound) && vals(a).iter().any(|&x| x != 0.0));
    let before = vals(a);
    assert!(matches!(
        Init::xavier_uniform().try_fill(a.get("0")),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        Init::Zeros.try_fill(m.zeros([2], DType::I32)),
        Err(NdError::UnsupportedDType { .. })
    ));
    assert_eq!(vals(a), before, "unchanged after errors");
    // Seeded in place too.
    ndscope::random::seed(3);
    Init::kaiming_normal().fill(a);
    let first = vals(a);
    ndscope::random::seed(3);
    Init::kaiming_normal().fill(a);
    assert_eq!(vals(a), first);
    m.close();
}

#[test]
fn activations_and_flatten() {
    let m = NDManager::new();
    let xv = [-2.0f64, -0.5, 0.0, 0.5, 3.0, f64::NAN];
    let x = m.create(&xv, [2, 3]);
    let relu = vals(Relu::new().forward(x));
    let tanh = vals(Tanh::new().forward(x));
    let sig = vals(Sigmoid::new().forward(x));
    for i in 0..5 {
        assert_eq!(relu[i], xv[i].max(0.0));
        assert!((tanh[i] - xv[i].tanh()).abs() < 1e-15);
        assert!((sig[i] - 1.0 / (1.0 + (-xv[i]).exp())).abs() < 1e-15);
    }
    assert!(relu[5].is_nan() && tanh[5].is_nan() && sig[5].is_nan());
    assert!(Relu::new().named_parameters().is_empty() && Relu::default().manager().is_none());
    assert!(matches!(
        Tanh::new().try_forward(m.zeros([2], DType::I32)),
        Err(NdError::UnsupportedDType { .. })
    ));

    let x = m.zeros([2, 3, 4, 5], DType::F32);
    assert_eq!(Flatten::new().forward(x).shape().dims(), &[2, 60]);
    assert_eq!(Flatten::with_dims(0, -1).forward(x).shape().dims(), &[120]);
    assert_eq!(
        Flatten::with_dims(-3, -2).forward(x).shape().dims(),
        &[2, 12, 5]
    );
    assert_eq!(
        Flatten::with_dims(2, 2).forward(x).shape().dims(),
        &[2, 3, 4, 5]
    );
    assert_eq!(
        Flatten::new()
            .forward(m.zeros([3, 0, 2], DType::F32))
            .shape()
            .dims(),
        &[3, 0]
    );
    // Values keep their row-major order, also from a transposed (non-contiguous) input.
    let a = m.arange(0.0, 6.0, 1.0, DType::F64).reshape([2, 3]);
    assert_eq!(
        vals(Flatten::with_dims(0, 1).forward(a.transpose())),
        vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0]
    );
    assert_eq!(
        Flatten::with_dims(0, 0)
            .forward(m.scalar(1.0f64))
            .shape()
            .dims(),
        &[1]
    );
    let v4 = m.zeros([4], DType::F32);
    fails!(
        m,
        Flatten::new().try_forward(v4),
        NdError::AxisOutOfRange { .. }
    );
    fails!(
        m,
        Flatten::with_dims(0, 7).try_forward(x),
        NdError::AxisOutOfRange { .. }
    );
    fails!(
        m,
        Flatten::with_dims(2, 1).try_forward(x),
        NdError::InvalidArgument { .. }
    );
    m.close();
}

// -------------------------------------------------------------- sequential

#[test]
fn sequential_names_modes_and_ownership_checks() {
    let _g = rng();
    let m = NDManager::new();
    let mut model = Sequential::new(&m)
        .add_with(|mm| Linear::new(mm, 4, 3))
        .add(Relu::new());
    // A nested Sequential, built in the outer one's manager.
    let inner = Sequential::new(&model.manager())
        .add_with(|mm| Linear::new(mm, 3, 2))
        .add(Sigmoid::new())
        .add_with(|mm| Linear::builder(2, 1).bias(false).build(mm));
    model.push(inner);
    model.push(Flatten::new());
    let names: Vec<String> = model
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        ["0.weight", "0.bias", "2.0.weight", "2.0.bias", "2.2.weight"]
    );
    assert_eq!(model.len(), 4);
    assert!(model.named_buffers().is_empty());
    let l0 = &model.layers()[0];
    assert_eq!(model.parameters()[..2], l0.parameters()[..]);
    assert_eq!(
        model.forward(m.ones([5, 4], DType::F32)).shape().dims(),
        &[5, 1]
    );

    // Modes propagate to every layer, nested ones included.
    assert!(model.is_training());
    model.eval();
    assert!(!model.is_training());
    let check = |model: &Sequential, mode: bool| {
        for l in model.layers() {
            assert_eq!(l.is_training(), mode);
        }
    };
    check(&model, false);
    model.train();
    check(&model, true);
    model.layers_mut()[1].eval();
    assert!(!model.layers()[1].is_training() && model.layers()[0].is_training());

    // A layer built elsewhere is refused and the model is unchanged.
    let stray = Linear::new(&m, 1, 1);
    let err = model.try_push(stray).unwrap_err();
    assert!(matches!(err, NdError::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("add_with"), "{err}");
    assert_eq!(model.len(), 4);
    let msg = common::expect_panic(|| {
        let _ = Sequential::new(&m).add(Linear::new(&m, 1, 1));
    });
    assert!(msg.contains("outside this model's manager"), "{msg}");

    // An empty model is the identity.
    let empty = Sequential::new(&m);
    assert!(empty.is_empty());
    let x = m.ones([2], DType::F32);
    assert_eq!(empty.forward(x), x);
    // Errors inside a layer surface and leave nothing behind.
    let x = m.ones([5, 3], DType::F32);
    fails!(m, model.try_forward(x), NdError::ShapeMismatch { .. });
    m.close();
}

/// The gradient of Sequential(Linear, Tanh, Linear) with respect to the input and
/// every parameter, by central finite differences.
#[test]
fn sequential_gradcheck() {
    gradcheck(&[&[3, 2], &[4, 2], &[4], &[2, 4], &[2]], -1.0, 1.0, |xs| {
        let model = Sequential::new(&xs[0].manager())
            .add_with(|mm| Linear::from_parameters(mm, xs[1], Some(xs[2])))
            .add(Tanh::new())
            .add_with(|mm| Linear::from_parameters(mm, xs[3], Some(xs[4])));
        model.forward(xs[0])
    });
    // And with a Sigmoid, a leading batch dimension and no bias.
    gradcheck(&[&[2, 3, 2], &[3, 2], &[1, 3]], -1.0, 1.0, |xs| {
        let model = Sequential::new(&xs[0].manager())
            .add_with(|mm| Linear::from_parameters(mm, xs[1], None))
            .add(Sigmoid::new())
            .add_with(|mm| Linear::from_parameters(mm, xs[2], None))
            .add(Flatten::new());
        model.forward(xs[0])
    });
}

#[test]
fn model_memory_is_its_parameters_and_gradients() {
    let _g = rng();
    // Seeded: unseeded, the generator's per-thread state varies, and some draws make
    // every pre-activation of the first layer negative, so relu's gradient (asserted
    // nonzero below) would be all zeros.
    ndscope::random::seed(7);
    let m = NDManager::new();
    let before = counts(&m);
    let (model, x) = {
        // Built inside a scope: parameters are in no scope, so they survive it.
        let _s = NDScope::new();
        let model = Sequential::new(&m)
            .add_with(|mm| Linear::new(mm, 3, 5))
            .add(Relu::new())
            .add_with(|mm| Linear::builder(5, 2).dtype(DType::F64).build(mm));
        (model, m.ones([7, 3], DType::F32).keep())
    };
    let bytes: usize = model
        .parameters()
        .iter()
        .map(|p| p.size() * p.dtype().size_in_bytes())
        .sum();
    assert_eq!(bytes, (15 + 5) * 4 + (10 + 2) * 8);
    let mem = model.manager().memory();
    assert_eq!(mem.live_arrays, 8, "4 parameters and 4 gradients");
    assert_eq!(mem.live_bytes, 2 * bytes);
    for (_, p) in model.named_parameters() {
        assert!(!p.is_closed() && p.requires_gradient());
        assert_eq!(p.ref_count(), 0, "parameters are in no scope");
    }

    // Forward passes leave nothing in the model's manager, with or without a scope
    // (the transposed weights and pre-activations are freed by the layers).
    let model_f64 =
        Sequential::new(&m).add_with(|mm| Linear::builder(3, 2).dtype(DType::F64).build(mm));
    let x64 = m.ones([7, 3], DType::F64);
    let y = model_f64.forward(x64);
    assert_eq!(
        y.manager(),
        m,
        "an op's result belongs to its first input's manager"
    );
    assert_eq!(model_f64.manager().memory().live_arrays, 4);
    {
        let _s = NDScope::new();
        let gc = GradientCollector::new();
        let h = model.layers()[0].forward(x);
        let loss = h.relu().sum();
        gc.backward(loss).unwrap();
    }
    assert_eq!(model.manager().memory(), mem_without_peak(&model, mem));
    assert!(
        vals(model.parameters()[0].gradient())
            .iter()
            .any(|&g| g != 0.0)
    );

    // Closing the model's manager frees the model, and only it.
    let params = model.parameters();
    model.manager().close();
    assert!(params.iter().all(|p| p.is_closed()));
    assert_eq!(model.manager().memory().live_bytes, 0);
    assert!(!x.is_closed() && !y.is_closed());
    assert!(matches!(model.try_forward(x), Err(NdError::Closed(_))));
    model_f64.manager().close();
    x.close();
    x64.close();
    y.close();
    assert_eq!(counts(&m), before);
    m.close();
}

/// The memory counters without their peak (which a forward pass may raise).
fn mem_without_peak(model: &Sequential, mut want: ndscope::MemoryStats) -> ndscope::MemoryStats {
    let now = model.manager().memory();
    want.peak_bytes = now.peak_bytes;
    want.allocations = now.allocations;
    want.cached_bytes = now.cached_bytes;
    want
}

// -------------------------------------------------------------- optimizers

/// Rosenbrock's function of two scalar parameters and its gradient.
fn rosenbrock(x: NDArray, y: NDArray) -> NDArray {
    (x - 1.0).square() + (y - x.square()).square() * 100.0
}

fn rosenbrock_grad(x: f64, y: f64) -> [f64; 2] {
    [
        -2.0 * (1.0 - x) - 400.0 * x * (y - x * x),
        200.0 * (y - x * x),
    ]
}

/// Run 3 steps of `opt` on Rosenbrock from (-1.5, 2) and return the parameters after
/// each step.
fn run3(make: impl FnOnce(&NDManager, &[NDArray]) -> Box<dyn Optimizer>) -> Vec<[f64; 2]> {
    let m = NDManager::new();
    let x = m.create(&[-1.5f64], [1]).set_requires_gradient(true);
    let y = m.create(&[2.0f64], [1]).set_requires_gradient(true);
    let mut opt = make(&m, &[x, y]);
    let mut out = vec![];
    for _ in 0..3 {
        {
            let _s = NDScope::new();
            let gc = GradientCollector::new();
            gc.backward(rosenbrock(x, y).sum()).unwrap();
        }
        opt.step();
        out.push([vals(x)[0], vals(y)[0]]);
    }
    assert_eq!(opt.step_count(), 3);
    m.close();
    out
}

/// PyTorch's SGD rule, in plain f64.
fn sgd_ref(c: SgdConfig) -> Vec<[f64; 2]> {
    let mut p = [-1.5, 2.0];
    let mut buf = [0.0; 2];
    let mut out = vec![];
    for t in 1..=3 {
        let mut g = rosenbrock_grad(p[0], p[1]);
        for i in 0..2 {
            g[i] += c.weight_decay * p[i];
            let mut d = g[i];
            if c.momentum != 0.0 {
                buf[i] = if t == 1 {
                    g[i]
                } else {
                    c.momentum * buf[i] + (1.0 - c.dampening) * g[i]
                };
                d = if c.nesterov {
                    g[i] + c.momentum * buf[i]
                } else {
                    buf[i]
                };
            }
            p[i] -= c.lr * d;
        }
        out.push(p);
    }
    out
}

/// Adam (Kingma & Ba, Algorithm 1, with eps outside the square root) with PyTorch's
/// L2 weight decay, or AdamW's decoupled decay, in plain f64.
fn adam_ref(c: AdamConfig, decoupled: bool) -> Vec<[f64; 2]> {
    let (b1, b2) = c.betas;
    let mut p: [f64; 2] = [-1.5, 2.0];
    let (mut m, mut v) = ([0.0; 2], [0.0; 2]);
    let mut out = vec![];
    for t in 1..=3 {
        let g0 = rosenbrock_grad(p[0], p[1]);
        for i in 0..2 {
            let mut g = g0[i];
            if decoupled {
                p[i] -= c.lr * c.weight_decay * p[i];
            } else {
                g += c.weight_decay * p[i];
            }
            m[i] = b1 * m[i] + (1.0 - b1) * g;
            v[i] = b2 * v[i] + (1.0 - b2) * g * g;
            let m_hat = m[i] / (1.0 - b1.powi(t));
            let v_hat = v[i] / (1.0 - b2.powi(t));
            p[i] -= c.lr * m_hat / (v_hat.sqrt() + c.eps);
        }
        out.push(p);
    }
    out
}

fn assert_steps(got: &[[f64; 2]], want: &[[f64; 2]], what: &str) {
    for (t, (g, w)) in got.iter().zip(want).enumerate() {
        assert_close(g, w, 1e-11, &format!("{what}, step {}", t + 1));
    }
}

#[test]
fn sgd_matches_the_reference_rule() {
    let configs = [
        SgdConfig {
            lr: 1e-3,
            ..Default::default()
        },
        SgdConfig {
            lr: 1e-3,
            weight_decay: 0.1,
            ..Default::default()
        },
        SgdConfig {
            lr: 1e-3,
            momentum: 0.9,
            ..Default::default()
        },
        SgdConfig {
            lr: 1e-3,
            momentum: 0.8,
            dampening: 0.3,
            weight_decay: 0.05,
            ..Default::default()
        },
        SgdConfig {
            lr: 1e-3,
            momentum: 0.9,
            nesterov: true,
            weight_decay: 0.01,
            ..Default::default()
        },
    ];
    for c in configs {
        let got = run3(|m, p| Box::new(Sgd::new(m, p, c)));
        assert_steps(&got, &sgd_ref(c), &format!("{c:?}"));
    }
    // The first step with momentum is not dampened (PyTorch's buffer = gradient).
    let c = configs[3];
    let g = rosenbrock_grad(-1.5, 2.0);
    let p0 = -1.5 - c.lr * (g[0] + c.weight_decay * -1.5);
    assert!((run3(|m, p| Box::new(Sgd::new(m, p, c)))[0][0] - p0).abs() < 1e-14);
}

#[test]
fn adam_and_adamw_match_the_reference_rule() {
    for c in [
        AdamConfig {
            lr: 0.01,
            ..Default::default()
        },
        // A large eps: its place (outside the square root) matters.
        AdamConfig {
            lr: 0.05,
            betas: (0.8, 0.9),
            eps: 10.0,
            weight_decay: 0.0,
        },
        AdamConfig {
            lr: 0.01,
            weight_decay: 0.5,
            ..Default::default()
        },
        // beta1 > 0.5: PyTorch's lerp takes its other branch.
        AdamConfig {
            lr: 0.01,
            betas: (0.3, 0.99),
            eps: 1e-3,
            weight_decay: 0.1,
        },
    ] {
        let got = run3(|m, p| Box::new(Adam::new(m, p, c)));
        assert_steps(&got, &adam_ref(c, false), &format!("Adam {c:?}"));
        let got = run3(|m, p| Box::new(AdamW::new(m, p, c)));
        assert_steps(&got, &adam_ref(c, true), &format!("AdamW {c:?}"));
    }
    // Adam and AdamW differ exactly by where the decay goes.
    let c = AdamConfig {
        lr: 0.01,
        weight_decay: 0.5,
        ..Default::default()
    };
    assert_ne!(adam_ref(c, false), adam_ref(c, true));
    assert_eq!(AdamConfig::adamw().weight_decay, 0.01);
    assert_eq!(AdamConfig::default().betas, (0.9, 0.999));
}

#[test]
fn optimizer_state_lives_in_its_own_manager() {
    let _g = rng();
    let m = NDManager::new();
    let model = Sequential::new(&m)
        .add_with(|mm| Linear::new(mm, 3, 4))
        .add(Tanh::new())
        .add_with(|mm| Linear::new(mm, 4, 1));
    let model_mem = model.manager().memory();
    let param_bytes = model_mem.live_bytes / 2;
    let adam = Adam::new(&m, &model.parameters(), AdamConfig::default());
    assert_eq!(adam.manager().parent(), Some(m.clone()));
    assert_eq!(adam.manager().memory().live_bytes, 2 * param_bytes);
    assert_eq!(adam.manager().memory().live_arrays, 8);
    assert_eq!(
        model.manager().memory(),
        model_mem,
        "the model's bytes are untouched"
    );
    let names: Vec<String> = adam.named_state().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "0.exp_avg",
            "0.exp_avg_sq",
            "1.exp_avg",
            "1.exp_avg_sq",
            "2.exp_avg",
            "2.exp_avg_sq",
            "3.exp_avg",
            "3.exp_avg_sq"
        ]
    );
    for ((_, s), p) in adam
        .named_state()
        .iter()
        .zip(model.parameters().iter().flat_map(|&p| [p, p]))
    {
        assert_eq!(s.shape(), p.shape());
        assert_eq!(s.ref_count(), 0, "state is in no scope");
    }
    let sgd = Sgd::new(
        &m,
        &model.parameters(),
        SgdConfig {
            momentum: 0.9,
            ..Default::default()
        },
    );
    assert_eq!(sgd.manager().memory().live_bytes, param_bytes);
    assert_eq!(sgd.named_state()[1].0, "1.momentum_buffer");
    let plain = Sgd::new(&m, &model.parameters(), SgdConfig::default());
    assert_eq!(
        plain.manager().memory().live_arrays,
        0,
        "plain SGD keeps no state"
    );
    assert!(plain.named_state().is_empty(), "and names none");
    plain.to_device(ndscope::Device::Cpu); // nothing to move
    assert_eq!(adam.parameters(), &model.parameters()[..]);

    // Built in a scope: the state survives it.
    let adamw = {
        let _s = NDScope::new();
        AdamW::new(&m, &model.parameters(), AdamConfig::adamw())
    };
    assert!(adamw.named_state().iter().all(|(_, s)| !s.is_closed()));

    // zero_grad, learning rate, step count.
    {
        let gc = GradientCollector::new();
        gc.backward(model.forward(m.ones([2, 3], DType::F32)).sum())
            .unwrap();
    }
    assert!(
        vals(model.parameters()[0].gradient())
            .iter()
            .any(|&g| g != 0.0)
    );
    let mut adam = adam;
    adam.zero_grad();
    for p in model.parameters() {
        assert!(vals(p.gradient()).iter().all(|&g| g == 0.0));
    }
    adam.set_learning_rate(0.5);
    assert_eq!(adam.learning_rate(), 0.5);
    assert_eq!(adam.config().lr, 0.5);
    adam.set_step_count(7);
    assert_eq!(adam.step_count(), 7);

    // Closing the optimizer's manager frees its state only; a step then fails and
    // changes no parameter.
    let before: Vec<Vec<f64>> = model.parameters().iter().map(|&p| vals(p)).collect();
    let state: Vec<NDArray> = adam.named_state().into_iter().map(|(_, s)| s).collect();
    adam.manager().close();
    assert!(state.iter().all(|s| s.is_closed()));
    assert!(matches!(adam.try_step(), Err(NdError::Closed(_))));
    let after: Vec<Vec<f64>> = model.parameters().iter().map(|&p| vals(p)).collect();
    assert_eq!(before, after);
    assert_eq!(
        model.manager().memory(),
        mem_without_peak(&model, model_mem)
    );
    m.close();
}

#[test]
fn optimizer_errors() {
    let m = NDManager::new();
    let w = m.ones([2], DType::F64).set_requires_gradient(true);
    let plain = m.ones([2], DType::F64);
    let sgd = |c: SgdConfig| Sgd::try_new(&m, &[w], c);
    fails!(
        m,
        Sgd::try_new(&m, &[], SgdConfig::default()),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        Sgd::try_new(&m, &[w, plain], SgdConfig::default()),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        Sgd::try_new(&m, &[w, w], SgdConfig::default()),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        sgd(SgdConfig {
            lr: -1.0,
            ..Default::default()
        }),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        sgd(SgdConfig {
            lr: f64::NAN,
            ..Default::default()
        }),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        sgd(SgdConfig {
            momentum: -0.1,
            ..Default::default()
        }),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        sgd(SgdConfig {
            weight_decay: -0.1,
            ..Default::default()
        }),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        sgd(SgdConfig {
            nesterov: true,
            ..Default::default()
        }),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        sgd(SgdConfig {
            nesterov: true,
            momentum: 0.9,
            dampening: 0.1,
            ..Default::default()
        }),
        NdError::InvalidArgument { .. }
    );
    let adam = |c: AdamConfig| Adam::try_new(&m, &[w], c);
    fails!(
        m,
        adam(AdamConfig {
            betas: (1.0, 0.999),
            ..Default::default()
        }),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        adam(AdamConfig {
            betas: (0.9, -0.1),
            ..Default::default()
        }),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        adam(AdamConfig {
            eps: -1.0,
            ..Default::default()
        }),
        NdError::InvalidArgument { .. }
    );
    fails!(
        m,
        AdamW::try_new(
            &m,
            &[w],
            AdamConfig {
                lr: f64::INFINITY,
                ..Default::default()
            }
        ),
        NdError::InvalidArgument { .. }
    );
    let closed = m.ones([2], DType::F64).set_requires_gradient(true);
    closed.close();
    fails!(
        m,
        Adam::try_new(&m, &[w, closed], AdamConfig::default()),
        NdError::Closed(_)
    );
    let gone = NDManager::new();
    gone.close();
    assert!(matches!(
        Adam::try_new(&gone, &[w], AdamConfig::default()),
        Err(NdError::ManagerClosed { .. })
    ));
    // A capped manager still takes sub-managers (rule 8), so the state fits there.
    let capped = NDManager::new();
    capped.cap();
    let opt = Adam::new(&capped, &[w], AdamConfig::default());
    assert_eq!(opt.manager().parent(), Some(capped.clone()));
    capped.close();
    let msg = common::expect_panic(|| {
        Sgd::new(&m, &[plain], SgdConfig::default());
    });
    assert!(msg.contains("does not require a gradient"), "{msg}");

    // A step while a collector records a tape that depends on the parameters: an
    // error, and nothing changes (the momentum buffer included).
    let mut opt = Sgd::new(
        &m,
        &[w],
        SgdConfig {
            lr: 0.1,
            momentum: 0.9,
            ..Default::default()
        },
    );
    {
        let gc = GradientCollector::new();
        let loss = (w * 3.0).sum();
        fails!(m, opt.try_step(), NdError::InvalidArgument { .. });
        gc.backward(loss).unwrap();
    }
    assert_eq!(vals(w), vec![1.0, 1.0]);
    assert_eq!(vals(opt.named_state()[0].1), vec![0.0, 0.0]);
    assert_eq!(opt.step_count(), 0);
    opt.step();
    assert_close(&vals(w), &[0.7, 0.7], 1e-15, "w");
    // A parameter that stopped requiring a gradient.
    w.set_requires_gradient(false);
    assert!(matches!(
        opt.try_step(),
        Err(NdError::InvalidArgument { .. })
    ));
    let msg = common::expect_panic(|| opt.step());
    assert!(msg.contains("does not require a gradient"), "{msg}");
    assert_close(&vals(w), &[0.7, 0.7], 1e-15, "w unchanged");
    m.close();
}

#[test]
fn schedules() {
    let s = StepLr::new(0.1, 3, 0.1);
    let want = [0.1, 0.1, 0.1, 0.01, 0.01, 0.01, 0.001];
    for (e, w) in want.iter().enumerate() {
        assert!((s.lr_at(e as u64) - w).abs() < 1e-15, "epoch {e}");
    }
    // CosineAnnealingLR(T_max=10, eta_min=0.001) from 0.1, PyTorch's closed form.
    let c = CosineAnnealing::new(0.1, 10, 0.001);
    for e in 0..=20u64 {
        let want = 0.001 + 0.099 * (1.0 + (std::f64::consts::PI * e as f64 / 10.0).cos()) / 2.0;
        assert!((c.lr_at(e) - want).abs() < 1e-15, "epoch {e}");
    }
    assert_eq!(c.lr_at(0), 0.1);
    assert!((c.lr_at(10) - 0.001).abs() < 1e-15);
    assert!((c.lr_at(5) - 0.0505).abs() < 1e-15);
    assert!(
        (c.lr_at(20) - 0.1).abs() < 1e-15,
        "the cosine goes on past t_max"
    );
    // The closed form computed with Python's math module (PyTorch is not installed
    // here; its recursive form agrees to rounding):
    // 0.001 + 0.099 * (1 + cos(pi * e / 10)) / 2 for e = 1, 2, 3.
    assert_close(
        &[c.lr_at(1), c.lr_at(2), c.lr_at(3)],
        &[0.09757729755661011, 0.0905463412215599, 0.07959536998847742],
        1e-14,
        "cosine",
    );

    // Stepping sets the optimizer's learning rate.
    let m = NDManager::new();
    let w = m.ones([1], DType::F32).set_requires_gradient(true);
    let mut opt = Sgd::new(
        &m,
        &[w],
        SgdConfig {
            lr: 0.1,
            ..Default::default()
        },
    );
    let mut sched = StepLr::new(opt.learning_rate(), 2, 0.5);
    let mut seen = vec![opt.learning_rate()];
    for _ in 0..4 {
        sched.step(&mut opt);
        seen.push(opt.learning_rate());
    }
    assert_eq!(seen, [0.1, 0.1, 0.05, 0.05, 0.025]);
    assert_eq!(sched.epoch(), 4);
    assert_eq!(sched.lr(), 0.025);
    sched.set_epoch(0);
    assert_eq!(sched.lr(), 0.1);

    assert!(matches!(
        StepLr::try_new(0.1, 0, 0.5),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        StepLr::try_new(-0.1, 1, 0.5),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        CosineAnnealing::try_new(0.1, 0, 0.0),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        CosineAnnealing::try_new(0.1, 5, f64::NAN),
        Err(NdError::InvalidArgument { .. })
    ));
    m.close();
}

#[test]
fn clip_grad_norm_scales_in_place() {
    let m = NDManager::new();
    let a = m.create(&[1.0f64, 2.0], [2]).set_requires_gradient(true);
    let b = m
        .create(&[2.0f32, 0.0, 4.0, 0.0], [2, 2])
        .set_requires_gradient(true);
    let frozen = m.create(&[100.0f64], [1]);
    let fill = || {
        let gc = GradientCollector::new();
        // Gradients: a -> a, b -> b (half the squares).
        let loss = a.square().sum() * 0.5 + (b.square().sum() * 0.5).to_dtype(DType::F64);
        gc.backward(loss).unwrap();
    };
    fill();
    // Total norm sqrt(1 + 4 + 4 + 16) = 5.
    let total = clip_grad_norm(&[a, b, frozen], 10.0);
    assert!((total - 5.0).abs() < 1e-12);
    assert_eq!(
        vals(a.gradient()),
        vec![1.0, 2.0],
        "below max_norm: unchanged"
    );
    let total = clip_grad_norm(&[a, b, frozen], 1.0);
    assert!((total - 5.0).abs() < 1e-12);
    let coef = 1.0 / (5.0 + 1e-6);
    assert_close(&vals(a.gradient()), &[coef, 2.0 * coef], 1e-15, "a");
    assert_close(
        &vals(b.gradient()),
        &[2.0 * coef, 0.0, 4.0 * coef, 0.0],
        1e-7,
        "b",
    );
    let after = clip_grad_norm(&[a, b], 100.0);
    assert!((after - 1.0).abs() < 1e-6, "now about max_norm: {after}");
    // max_norm 0 zeroes the gradients (the coefficient is 0).
    fill();
    assert!((clip_grad_norm(&[b], 0.0) - 20f64.sqrt()).abs() < 1e-6);
    assert!(vals(b.gradient()).iter().all(|&g| g == 0.0));
    // Errors leave the gradients alone.
    fill();
    let before = vals(a.gradient());
    assert!(matches!(
        try_clip_grad_norm(&[a], -1.0),
        Err(NdError::InvalidArgument { .. })
    ));
    assert!(matches!(
        try_clip_grad_norm(&[a], f64::NAN),
        Err(NdError::InvalidArgument { .. })
    ));
    let gone = m.ones([1], DType::F64).set_requires_gradient(true);
    gone.close();
    assert!(matches!(
        try_clip_grad_norm(&[a, gone], 0.1),
        Err(NdError::Closed(_))
    ));
    assert_eq!(vals(a.gradient()), before);
    assert_eq!(clip_grad_norm(&[], 1.0), 0.0);
    m.close();
}

// ------------------------------------------------------------------ training

/// A small MLP learns a smooth function with Adam and a cosine schedule; a scope per
/// step keeps the live bytes of every manager flat across epochs.
#[test]
fn a_tiny_model_trains_with_flat_memory() {
    let _g = rng();
    ndscope::random::seed(42);
    let m = NDManager::new();
    let data = m.new_sub_manager();
    let x = data.random_uniform(-1.0, 1.0, [128, 2], DType::F32);
    let y = ndscope::scope(|| (x.get(":, 0:1").sin() + x.get(":, 1:2").square()).keep());
    let model = Sequential::new(&m)
        .add_with(|mm| Linear::new(mm, 2, 32))
        .add(Tanh::new())
        .add_with(|mm| Linear::new(mm, 32, 1));
    let mut opt = Adam::new(
        &m,
        &model.parameters(),
        AdamConfig {
            lr: 0.02,
            ..Default::default()
        },
    );
    let epochs = 30;
    let mut sched = CosineAnnealing::new(opt.learning_rate(), epochs, 0.001);
    let mut epoch_loss = vec![];
    let mut live = vec![];
    for _epoch in 0..epochs {
        let mut total = 0.0;
        for batch in 0..4 {
            let _s = NDScope::new();
            let rows = format!("{}:{}", batch * 32, batch * 32 + 32);
            let (xb, yb) = (x.get(&rows), y.get(&rows));
            let gc = GradientCollector::new();
            let loss = (model.forward(xb) - yb).square().mean();
            gc.backward(loss).unwrap();
            drop(gc);
            clip_grad_norm(&model.parameters(), 5.0);
            opt.step();
            total += loss.to_scalar::<f32>().unwrap();
        }
        sched.step(&mut opt);
        epoch_loss.push(total / 4.0);
        live.push((m.memory().live_arrays, m.memory().live_bytes));
    }
    assert!(
        epoch_loss[epochs as usize - 1] < epoch_loss[0] / 10.0,
        "the loss did not go down enough: {epoch_loss:?}"
    );
    assert!(
        live.iter().all(|&l| l == live[0]),
        "live memory moved: {live:?}"
    );
    // Data (x, y), parameters and gradients (8), Adam's moments (8).
    assert_eq!(live[0].0, 2 + 8 + 8);
    assert!((opt.learning_rate() - 0.001).abs() < 1e-12);
    m.close();
}

// ------------------------------------------------ layers of issue 12: conv, norm, ...

/// Write `v` into the array `a` (any float dtype), in place.
fn put(a: NDArray, v: &[f64]) {
    let m = a.manager();
    ndscope::scope(|| a.set("", m.create(v, a.shape()).to_dtype(a.dtype())));
}

/// Check the gradient of `sum(layer(x) * r)` (r random) with respect to `x` (when
/// `x` requires a gradient) and to every parameter of `layer` (F64) against central
/// finite differences, perturbing each parameter in place.
fn layer_gradcheck(layer: &dyn Module, x: NDArray) {
    let m = NDManager::new();
    let out_shape = layer.forward(x).shape();
    let r = m.create(
        &common::values(out_shape.size(), 99, -1.0, 1.0),
        out_shape.clone(),
    );
    let loss_at = || -> f64 {
        ndscope::scope(|| {
            (layer.forward(x) * r)
                .sum()
                .to_scalar::<f64>()
                .expect("a scalar")
        })
    };
    {
        let _s = NDScope::new();
        let gc = GradientCollector::new();
        let loss = (layer.forward(x) * r).sum();
        gc.backward(loss).unwrap();
    }
    let mut targets: Vec<(String, NDArray)> = layer.named_parameters();
    if x.requires_gradient() {
        targets.push(("input".to_string(), x));
    }
    assert!(!targets.is_empty());
    let eps = 1e-6;
    for (name, p) in targets {
        let analytic = vals(p.gradient());
        let base = vals(p);
        assert_eq!(analytic.len(), base.len());
        for j in 0..base.len() {
            let mut v = base.clone();
            v[j] = base[j] + eps;
            put(p, &v);
            let plus = loss_at();
            v[j] = base[j] - eps;
            put(p, &v);
            let minus = loss_at();
            put(p, &base);
            let numeric = (plus - minus) / (2.0 * eps);
            assert!(
                (analytic[j] - numeric).abs() < 1e-5 * (1.0 + numeric.abs()),
                "{name}[{j}]: analytic {} numeric {numeric}",
                analytic[j]
            );
        }
    }
    m.close();
}

/// `x` values `sin(k)` for k = 0.. (the numpy reference scripts use the same).
fn sin_values(n: usize) -> Vec<f64> {
    (0..n).map(|k| (k as f64).sin()).collect()
}

#[test]
fn conv2d_layer_shapes_defaults_and_memory() {
    let _g = rng();
    let m = NDManager::new();
    let conv = Conv2d::new(&m, 1, 16, 3);
    assert_eq!(conv.weight().shape().dims(), &[16, 1, 3, 3]);
    assert_eq!(conv.bias().unwrap().shape().dims(), &[16]);
    assert_eq!(conv.weight().dtype(), DType::F32);
    assert_eq!(
        (
            conv.kernel_size(),
            conv.stride(),
            conv.padding(),
            conv.dilation()
        ),
        ([3, 3], [1, 1], [0, 0], [1, 1])
    );
    assert_eq!(
        (conv.in_channels(), conv.out_channels(), conv.groups()),
        (1, 16, 1)
    );
    let names: Vec<String> = conv
        .named_parameters()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["weight", "bias"]);
    assert!(
        conv.parameters()
            .iter()
            .all(|p| p.requires_gradient() && p.ref_count() == 0)
    );
    assert!(conv.named_buffers().is_empty());
    assert_eq!(conv.manager().parent(), Some(m.clone()));
    assert_eq!(Module::manager(&conv), Some(conv.manager()));
    // The layer's manager holds exactly the weight, the bias and their gradients.
    let mem = conv.manager().memory();
    assert_eq!(mem.live_arrays, 4);
    assert_eq!(mem.live_bytes, (144 + 16) * 2 * 4);

    // Output sizes: "same" padding, stride 2, dilation, unbatched input.
    let x = m.ones([2, 1, 8, 8], DType::F32);
    assert_eq!(conv.forward(x).shape().dims(), &[2, 16, 6, 6]);
    let same = Conv2d::builder(1, 4, 3).padding(1).build(&m);
    assert_eq!(same.forward(x).shape().dims(), &[2, 4, 8, 8]);
    let strided = Conv2d::builder(1, 4, [3, 2])
        .stride(2)
        .padding([1, 0])
        .build(&m);
    assert_eq!(strided.forward(x).shape().dims(), &[2, 4, 4, 4]);
    let dilated = Conv2d::builder(1, 4, 3).dilation(2).build(&m);
    assert_eq!(dilated.forward(x).shape().dims(), &[2, 4, 4, 4]);
    let unbatched = same.forward(m.ones([1, 8, 8], DType::F32));
    assert_eq!(unbatched.shape().dims(), &[4, 8, 8]);
    assert_eq!(vals(unbatched), vals(same.forward(x).get("0")));
    // Forward passes leave nothing in the layer's manager; the output is the input's.
    assert_eq!(conv.forward(x).manager(), m);
    assert_eq!(conv.manager().memory().live_arrays, 4);

    // PyTorch's default initialisation: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for both,
    // fan_in = in/groups * kh * kw = 144 here.
    ndscope::random::seed(9);
    let big = Conv2d::builder(32, 64, 3)
        .groups(2)
        .dtype(DType::F64)
        .build(&m);
    assert_eq!(big.weight().shape().dims(), &[64, 16, 3, 3]);
    let (w, b) = (vals(big.weight()), vals(big.bias().unwrap()));
    let bound = 1.0 / 12.0;
    assert!(w.iter().chain(&b).all(|v| v.abs() <= bound));
    let (mean, std) = stats(&w);
    assert!(mean.abs() < 0.003, "mean {mean}");
    let want = bound / 3f64.sqrt();
    assert!((std - want).abs() < 0.03 * want, "std {std} want {want}");
    assert!(b.iter().any(|v| v.abs() > 0.07));
    ndscope::random::seed(9);
    let again = Conv2d::builder(32, 64, 3)
        .groups(2)
        .dtype(DType::F64)
        .build(&m);
    assert_eq!(vals(again.weight()), w, "seeded");
    let nb = Conv2d::builder(2, 2, 1)
        .bias(false)
        .weight_init(Init::Ones)
        .build(&m);
    assert!(nb.bias().is_none() && nb.parameters().len() == 1);
    assert_eq!(vals(nb.weight()), vec![1.0; 4]);
    m.close();
}

#[test]
fn conv2d_layer_values_match_numpy() {
    let m = NDManager::new();
    // Groups 2, stride 2, padding 1: x = sin(0..32) [1, 2, 4, 4], w = cos(0..18) / 2
    // [2, 1, 3, 3], b = [0.25, -0.5]. Expected: a direct loop in numpy 2.4.
    let conv = Conv2d::builder(2, 2, 3)
        .stride(2)
        .padding(1)
        .groups(2)
        .dtype(DType::F64)
        .build(&m);
    put(
        conv.weight(),
        &(0..18).map(|k| (k as f64).cos() / 2.0).collect::<Vec<_>>(),
    );
    put(conv.bias().unwrap(), &[0.25, -0.5]);
    let y = conv.forward(m.create(&sin_values(32), [1, 2, 4, 4]));
    assert_eq!(y.shape().dims(), &[1, 2, 2, 2]);
    let want = [
        0.15383095281630138,
        -1.0571750778377882,
        -0.25264597846832615,
        -0.0818587870198027,
        -1.2486116946914712,
        -1.4332690255673346,
        -1.3395064720127194,
        0.2569880905962542,
    ];
    assert_close(&vals(y), &want, 1e-14, "grouped conv");
    // Dilation 2, no bias: x = sin(0..25) [1, 1, 5, 5], w = cos(0..4) / 2 [1, 1, 2, 2].
    let conv = Conv2d::builder(1, 1, 2)
        .dilation(2)
        .bias(false)
        .dtype(DType::F64)
        .build(&m);
    put(
        conv.weight(),
        &(0..4).map(|k| (k as f64).cos() / 2.0).collect::<Vec<_>>(),
    );
    let y = conv.forward(m.create(&sin_values(25), [1, 1, 5, 5]));
    let want = [
        0.624445661722396,
        0.45894949891187725,
        -0.1285027166441669,
        0.038604087616940175,
        0.5592094187947653,
        0.5656801892590475,
        -0.6025446219999258,
        -0.1416963671779899,
        0.4494268741611127,
    ];
    assert_close(&vals(y), &want, 1e-14, "dilated conv");
    // A transposed (non-contiguous) input gives the same result.
    let xv = sin_values(25);
    let tv: Vec<f64> = (0..25).map(|k| xv[(k % 5) * 5 + k / 5]).collect();
    let xt = m.create(&tv, [1, 1, 5, 5]).permute(&[0, 1, 3, 2]);
    assert_close(&vals(conv.forward(xt)), &want, 1e-14, "view input");
    m.close();
}

#[test]
fn conv2d_layer_errors_leave_nothing_behind() {
    let m = NDManager::new();
    let children = m.children().len();
    for b in [
        Conv2d::builder(3, 4, 3).groups(2),
        Conv2d::builder(4, 3, 3).groups(2),
        Conv2d::builder(4, 4, 3).groups(0),
        Conv2d::builder(0, 4, 3),
        Conv2d::builder(1, 4, 0),
        Conv2d::builder(1, 4, 3).stride(0),
        Conv2d::builder(1, 4, 3).dilation([1, 0]),
        Conv2d::builder(1, 4, 3).dtype(DType::I64),
        Conv2d::builder(1, 4, 3).weight_init(Init::Normal {
            mean: 0.0,
            std: -1.0,
        }),
        Conv2d::builder(1, 4, 3).bias_init(Init::Uniform {
            low: 1.0,
            high: 0.0,
        }),
    ] {
        fails!(m, b.try_build(&m), NdError::InvalidArgument { .. });
    }
    assert_eq!(
        m.children().len(),
        children,
        "failed layers closed their manager"
    );
    let closed = NDManager::new();
    closed.close();
    assert!(matches!(
        Conv2d::try_new(&closed, 1, 1, 1),
        Err(NdError::ManagerClosed { .. })
    ));

    let conv = Conv2d::new(&m, 2, 4, 3);
    let before = counts(&conv.manager());
    let (c3, small, f64x, flat) = (
        m.ones([1, 3, 5, 5], DType::F32),
        m.ones([1, 2, 2, 2], DType::F32),
        m.ones([1, 2, 5, 5], DType::F64),
        m.ones([2, 50], DType::F32),
    );
    fails!(m, conv.try_forward(c3), NdError::InvalidArgument { .. });
    fails!(m, conv.try_forward(small), NdError::InvalidArgument { .. });
    fails!(m, conv.try_forward(f64x), NdError::DTypeMismatch { .. });
    fails!(m, conv.try_forward(flat), NdError::InvalidArgument { .. });
    let c3u = m.ones([3, 5, 5], DType::F32); // unbatched, wrong channels
    fails!(m, conv.try_forward(c3u), NdError::InvalidArgument { .. });
    assert_eq!(counts(&conv.manager()), before);
    let msg = common::expect_panic(|| {
        conv.forward(c3);
    });
    assert!(msg.contains("conv2d"), "{msg}");
    m.close();
}

#[test]
fn conv2d_and_max_pool_gradcheck() {
    let m = NDManager::new();
    let _g = rng();
    ndscope::random::seed(2);
    let conv = Conv2d::builder(4, 2, [2, 3])
        .stride([1, 2])
        .padding(1)
        .groups(2)
        .dtype(DType::F64)
        .build(&m);
    let x = m
        .create(&common::values(2 * 4 * 4 * 5, 3, -1.0, 1.0), [2, 4, 4, 5])
        .set_requires_gradient(true);
    layer_gradcheck(&conv, x);
    let dil = Conv2d::builder(1, 2, 2)
        .dilation(2)
        .dtype(DType::F64)
        .build(&m);
    let x = m
        .create(&common::values(16, 4, -1.0, 1.0), [1, 4, 4])
        .set_requires_gradient(true);
    layer_gradcheck(&dil, x); // unbatched
    // Max pooling (random values: no ties), through a Sequential with a conv.
    gradcheck(&[&[2, 3, 5, 4]], -1.0, 1.0, |xs| {
        MaxPool2d::new(2).forward(xs[0])
    });
    gradcheck(&[&[1, 2, 4, 4]], -1.0, 1.0, |xs| {
        MaxPool2d::new(3).stride(1).padding(1).forward(xs[0])
    });
    let model = Sequential::new(&m)
        .add_with(|mm| {
            Conv2d::builder(1, 2, 3)
                .padding(1)
                .dtype(DType::F64)
                .build(mm)
        })
        .add(Relu::new())
        .add(MaxPool2d::new(2))
        .add(Flatten::new())
        .add_with(|mm| Linear::builder(8, 3).dtype(DType::F64).build(mm));
    let x = m
        .create(&common::values(2 * 16, 5, -1.0, 1.0), [2, 1, 4, 4])
        .set_requires_gradient(true);
    layer_gradcheck(&model, x);
    m.close();
}

#[test]
fn max_pool2d_layer() {
    let m = NDManager::new();
    let x = m.arange(0.0, 32.0, 1.0, DType::F32).reshape([2, 1, 4, 4]);
    let pool = MaxPool2d::new(2);
    assert_eq!(pool.kernel_size(), [2, 2]);
    assert!(pool.named_parameters().is_empty() && Module::manager(&pool).is_none());
    let y = pool.forward(x);
    assert_eq!(y.shape().dims(), &[2, 1, 2, 2]);
    assert_eq!(vals(y), vec![5.0, 7.0, 13.0, 15.0, 21.0, 23.0, 29.0, 31.0]);
    // Same as the op, for overlapping windows with padding; [C, H, W] inputs too.
    let p = MaxPool2d::new([3, 2]).stride([1, 2]).padding([1, 0]);
    assert_eq!(
        vals(p.forward(x)),
        vals(x.max_pool2d([3, 2], [1, 2], [1, 0]))
    );
    assert_eq!(p.forward(x).shape().dims(), &[2, 1, 4, 2]);
    assert_eq!(pool.forward(x.get("0")).shape().dims(), &[1, 2, 2]);
    // Errors: padding over half the kernel, a window larger than the input, 2-D input.
    let tiny = m.ones([1, 1, 1, 1], DType::F32);
    let flat = m.ones([4, 4], DType::F32);
    fails!(
        m,
        MaxPool2d::new(2).padding(2).try_forward(x),
        NdError::InvalidArgument { .. }
    );
    fails!(m, pool.try_forward(tiny), NdError::InvalidArgument { .. });
    fails!(m, pool.try_forward(flat), NdError::InvalidArgument { .. });
    m.close();
}

#[test]
fn embedding_layer() {
    let _g = rng();
    let m = NDManager::new();
    let emb = Embedding::new(&m, 10, 4);
    assert_eq!(emb.weight().shape().dims(), &[10, 4]);
    assert_eq!((emb.num_embeddings(), emb.embedding_dim()), (10, 4));
    let names: Vec<String> = emb.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight"]);
    assert_eq!(emb.manager().memory().live_bytes, 40 * 2 * 4);
    let data = m.new_sub_manager();
    let ids = data.create(&[1i64, 7, 7, 0, 3, 9], [2, 3]);
    let y = emb.forward(ids);
    assert_eq!(y.shape().dims(), &[2, 3, 4]);
    let w = vals(emb.weight());
    let got = vals(y);
    for (k, id) in [1usize, 7, 7, 0, 3, 9].into_iter().enumerate() {
        assert_eq!(got[k * 4..k * 4 + 4], w[id * 4..id * 4 + 4]);
    }
    // The output belongs to the ids' manager, not to the model's.
    assert_eq!(y.manager(), data);
    assert_eq!(emb.manager().memory().live_arrays, 2);
    let i32ids = m.create(&[2i32, 2], [2]);
    assert_eq!(emb.forward(i32ids).shape().dims(), &[2, 4]);

    // Gradient: each row receives the sum of its ids' gradients (repeats accumulate).
    {
        let _s = NDScope::new();
        let gc = GradientCollector::new();
        let loss = emb.forward(ids).sum();
        gc.backward(loss).unwrap();
    }
    let g = vals(emb.weight().gradient());
    let count = [1.0, 1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 1.0];
    for r in 0..10 {
        assert_eq!(g[r * 4..r * 4 + 4], [count[r]; 4], "row {r}");
    }
    let table = Embedding::builder(5, 3).dtype(DType::F64).build(&m);
    let ids = m.create(&[4i64, 0, 4, 2], [2, 2]);
    layer_gradcheck(&table, ids);

    // N(0, 1) by default.
    ndscope::random::seed(3);
    let big = Embedding::builder(200, 50).dtype(DType::F64).build(&m);
    let (mean, std) = stats(&vals(big.weight()));
    assert!(
        mean.abs() < 0.03 && (std - 1.0).abs() < 0.03,
        "{mean} {std}"
    );

    // Errors.
    let (bad, fl) = (m.create(&[10i64], [1]), m.create(&[1.0f32], [1]));
    fails!(m, emb.try_forward(bad), NdError::Index { .. });
    fails!(m, emb.try_forward(fl), NdError::UnsupportedDType { .. });
    fails!(
        m,
        Embedding::builder(2, 2).dtype(DType::I32).try_build(&m),
        NdError::InvalidArgument { .. }
    );
    m.close();
}

#[test]
fn layer_norm_layer() {
    let m = NDManager::new();
    let ln = LayerNorm::builder([3]).dtype(DType::F64).build(&m);
    assert_eq!(vals(ln.weight().unwrap()), vec![1.0; 3]);
    assert_eq!(vals(ln.bias().unwrap()), vec![0.0; 3]);
    assert_eq!(ln.eps(), 1e-5);
    assert_eq!(ln.normalized_shape().dims(), &[3]);
    let names: Vec<String> = ln.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "bias"]);
    assert_eq!(ln.manager().memory().live_bytes, 6 * 2 * 8);
    // x = 3 sin(0..6) [2, 3], weight [1, 2, -1], bias [0.5, 0, -0.5]; numpy 2.4.
    put(ln.weight().unwrap(), &[1.0, 2.0, -1.0]);
    put(ln.bias().unwrap(), &[0.5, 0.0, -0.5]);
    let xv: Vec<f64> = sin_values(6).iter().map(|v| v * 3.0).collect();
    let x = m.create(&xv, [2, 3]);
    let want = [
        -0.9110358825384692,
        1.2470412453790456,
        -1.2875152598489468,
        1.8929878201387067,
        -0.9702282746047369,
        0.4078736828363382,
    ];
    assert_close(&vals(ln.forward(x)), &want, 1e-12, "layer norm");
    // Leading dimensions and a transposed input.
    let x3 = m.create(&xv, [2, 1, 3]);
    assert_close(&vals(ln.forward(x3)), &want, 1e-12, "[2, 1, 3]");
    let tv: Vec<f64> = (0..6).map(|k| xv[(k % 2) * 3 + k / 2]).collect();
    let xt = m.create(&tv, [3, 2]).transpose();
    assert_close(&vals(ln.forward(xt)), &want, 1e-12, "view");
    layer_gradcheck(&ln, x.set_requires_gradient(true));

    // Over the last two dimensions; without affine parameters.
    let ln2 = LayerNorm::builder([2, 3])
        .dtype(DType::F64)
        .elementwise_affine(false)
        .build(&m);
    assert!(ln2.parameters().is_empty() && ln2.weight().is_none());
    let y = vals(ln2.forward(m.create(&xv, [1, 2, 3])));
    let (mean, std) = stats(&y);
    assert!(mean.abs() < 1e-12 && (std - 1.0).abs() < 1e-4);
    let nb = LayerNorm::builder([4]).bias(false).build(&m);
    assert_eq!(nb.named_parameters().len(), 1);
    let ln3 = LayerNorm::builder([2, 3]).dtype(DType::F64).build(&m);
    put(ln3.weight().unwrap(), &common::values(6, 1, 0.5, 1.5));
    put(ln3.bias().unwrap(), &common::values(6, 2, -1.0, 1.0));
    layer_gradcheck(
        &ln3,
        m.create(&common::values(12, 3, -2.0, 2.0), [2, 2, 3])
            .set_requires_gradient(true),
    );

    // Errors: trailing dims that differ, another dtype, bad options.
    let (x4, x32, short) = (
        m.ones([2, 4], DType::F64),
        m.ones([2, 3], DType::F32),
        m.ones([3, 2], DType::F64),
    );
    fails!(m, ln.try_forward(x4), NdError::InvalidShape { .. });
    fails!(m, ln2.try_forward(short), NdError::InvalidShape { .. });
    fails!(m, ln.try_forward(x32), NdError::DTypeMismatch { .. });
    for b in [
        LayerNorm::builder([0usize; 0]),
        LayerNorm::builder([3]).eps(-1.0),
        LayerNorm::builder([3]).eps(f64::NAN),
        LayerNorm::builder([3]).dtype(DType::U8),
    ] {
        fails!(m, b.try_build(&m), NdError::InvalidArgument { .. });
    }
    m.close();
}

#[test]
fn batch_norm2d_layer_train_and_eval() {
    let m = NDManager::new();
    let mut bn = BatchNorm2d::builder(2).dtype(DType::F64).build(&m);
    assert_eq!((bn.num_features(), bn.eps(), bn.momentum()), (2, 1e-5, 0.1));
    let names: Vec<String> = bn.named_parameters().into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["weight", "bias"]);
    let buffers: Vec<String> = bn.named_buffers().into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        buffers,
        ["running_mean", "running_var", "num_batches_tracked"]
    );
    for (_, b) in bn.named_buffers() {
        assert!(!b.requires_gradient() && b.ref_count() == 0);
        assert_eq!(b.manager(), bn.manager());
    }
    assert_eq!(bn.num_batches_tracked().dtype(), DType::I64);
    assert_eq!(vals(bn.running_mean()), vec![0.0; 2]);
    assert_eq!(vals(bn.running_var()), vec![1.0; 2]);
    // weight, bias, their gradients, two running statistics (f64 [2]) and the count.
    let mem = bn.manager().memory();
    assert_eq!(mem.live_arrays, 7);
    assert_eq!(mem.live_bytes, 6 * 2 * 8 + 8);

    // x = 2 sin(0..16) + (0..16) / 4 as [2, 2, 2, 2], weight [1.5, -0.5], bias
    // [0.1, 0.2]; expected values from numpy 2.4 (biased batch variance to normalise,
    // unbiased for the running estimate, momentum 0.1).
    put(bn.weight().unwrap(), &[1.5, -0.5]);
    put(bn.bias().unwrap(), &[0.1, 0.2]);
    let xv: Vec<f64> = (0..16)
        .map(|k| 2.0 * (k as f64).sin() + k as f64 / 4.0)
        .collect();
    let x = m.create(&xv, [2, 2, 2, 2]);
    let y = bn.forward(x);
    let want_train = [
        -2.144244302345244,
        0.24934503062830274,
        0.7269044421203649,
        -0.866006915765167,
        0.8557813684094557,
        0.8902425470967279,
        0.5307549816773891,
        0.056476929138451204,
        2.782656508367827,
        1.662626744613748,
        -0.39579704956444617,
        -1.2154844580553845,
        0.3105326740113372,
        -0.17283316879113653,
        -0.4835844675192112,
        -0.38737086402301407,
    ];
    assert_close(&vals(y), &want_train, 1e-12, "train");
    assert_close(
        &vals(bn.running_mean()),
        &[0.18123384585296276, 0.2421583411306747],
        1e-14,
        "running_mean",
    );
    assert_close(
        &vals(bn.running_var()),
        &[1.0676910390081114, 1.4723806013456944],
        1e-14,
        "running_var",
    );
    assert_eq!(bn.num_batches_tracked().to_scalar::<i64>().unwrap(), 1);

    // Eval: the running statistics normalise and are left alone.
    bn.eval();
    assert!(!bn.is_training());
    let want_eval = [
        -0.16309084318267317,
        2.6428934927783936,
        3.2027323129459297,
        1.3353759301162145,
        0.5114184243149544,
        0.5749757365006694,
        -0.0880330256075802,
        -0.9627517495838853,
        5.6126729059481155,
        4.299671577938415,
        1.886598941097168,
        0.9256863915109051,
        -0.4941926084125449,
        -1.3856720917377803,
        -1.9587957647441014,
        -1.7813474513995866,
    ];
    for _ in 0..2 {
        assert_close(&vals(bn.forward(x)), &want_eval, 1e-12, "eval");
    }
    assert_eq!(bn.num_batches_tracked().to_scalar::<i64>().unwrap(), 1);
    assert_close(
        &vals(bn.running_mean()),
        &[0.18123384585296276, 0.2421583411306747],
        1e-14,
        "running_mean after eval",
    );
    // Back to training: batch statistics again, and the count goes on.
    bn.train();
    assert_close(&vals(bn.forward(x)), &want_train, 1e-12, "train again");
    assert_eq!(bn.num_batches_tracked().to_scalar::<i64>().unwrap(), 2);
    // Memory: forward passes left nothing in the layer's manager.
    assert_eq!(bn.manager().memory().live_arrays, 7);

    // Gradients in training mode (batch statistics) and in eval mode.
    let xg = m
        .create(&common::values(2 * 2 * 3 * 2, 6, -1.0, 1.0), [2, 2, 3, 2])
        .set_requires_gradient(true);
    layer_gradcheck(&bn, xg);
    bn.eval();
    layer_gradcheck(&bn, xg);

    // Errors: not 4-D, another channel count, one value per channel in training;
    // nothing changes.
    bn.train();
    let stats_before = (vals(bn.running_mean()), vals(bn.running_var()));
    let count = bn.num_batches_tracked().to_scalar::<i64>().unwrap();
    let (x3, c3, one, x32) = (
        m.ones([2, 2, 4], DType::F64),
        m.ones([2, 3, 2, 2], DType::F64),
        m.ones([1, 2, 1, 1], DType::F64),
        m.ones([2, 2, 2, 2], DType::F32),
    );
    fails!(m, bn.try_forward(x3), NdError::InvalidArgument { .. });
    fails!(m, bn.try_forward(c3), NdError::InvalidArgument { .. });
    fails!(m, bn.try_forward(one), NdError::InvalidArgument { .. });
    fails!(m, bn.try_forward(x32), NdError::DTypeMismatch { .. });
    assert_eq!(
        (vals(bn.running_mean()), vals(bn.running_var())),
        stats_before
    );
    assert_eq!(bn.num_batches_tracked().to_scalar::<i64>().unwrap(), count);
    for b in [
        BatchNorm2d::builder(0),
        BatchNorm2d::builder(2).eps(-1.0),
        BatchNorm2d::builder(2).momentum(f64::NAN),
        BatchNorm2d::builder(2).dtype(DType::I32),
    ] {
        fails!(m, b.try_build(&m), NdError::InvalidArgument { .. });
    }
    let plain = BatchNorm2d::builder(3).affine(false).build(&m);
    assert!(plain.parameters().is_empty() && plain.weight().is_none());
    let y = plain.forward(m.random_normal(2.0, 3.0, [4, 3, 2, 2], DType::F32));
    assert!(vals(y).iter().sum::<f64>().abs() < 1e-3);
    m.close();
}

#[test]
fn dropout_layer_train_and_eval() {
    let _g = rng();
    let m = NDManager::new();
    let mut drop = Dropout::new(0.25);
    assert_eq!(drop.p(), 0.25);
    assert!(drop.named_parameters().is_empty() && Module::manager(&drop).is_none());
    let x = m.ones([4000], DType::F64);
    ndscope::random::seed(4);
    let y = vals(drop.forward(x));
    let kept = y.iter().filter(|&&v| v != 0.0).count();
    assert!(y.iter().all(|&v| v == 0.0 || (v - 4.0 / 3.0).abs() < 1e-15));
    assert!((kept as f64 / 4000.0 - 0.75).abs() < 0.03, "{kept}");
    // A fresh mask on every call.
    assert_ne!(vals(drop.forward(x)), y);
    // Eval: the input itself; nothing is created.
    drop.eval();
    let before = counts(&m);
    assert_eq!(drop.forward(x), x);
    assert_eq!(counts(&m), before);
    drop.train();
    assert_eq!(Dropout::new(0.0).forward(x), x);
    assert_eq!(vals(Dropout::new(1.0).forward(x)), vec![0.0; 4000]);
    // Through a model: eval() reaches it.
    let mut model = Sequential::new(&m)
        .add_with(|mm| Linear::builder(3, 3).dtype(DType::F64).build(mm))
        .add(Dropout::new(0.5));
    model.eval();
    let x3 = m.ones([2, 3], DType::F64);
    let lin = model.layers()[0].forward(x3);
    assert_eq!(vals(model.forward(x3)), vals(lin));
    // The gradient is the mask scaled by 1 / (1 - p): for x = ones it equals y.
    let xg = m.ones([50], DType::F64).set_requires_gradient(true);
    let d = Dropout::new(0.5);
    let yv = {
        let _s = NDScope::new();
        let gc = GradientCollector::new();
        let y = d.forward(xg);
        gc.backward(y.sum()).unwrap();
        vals(y)
    };
    assert_eq!(vals(xg.gradient()), yv);
    for p in [-0.1, 1.5, f64::NAN] {
        assert!(matches!(
            Dropout::try_new(p),
            Err(NdError::InvalidArgument { .. })
        ));
    }
    let xi = m.ones([2], DType::I32);
    fails!(
        m,
        Dropout::new(0.5).try_forward(xi),
        NdError::UnsupportedDType { .. }
    );
    m.close();
}

#[test]
fn gelu_layer() {
    let m = NDManager::new();
    let xv = [-3.0, -1.0, -0.1, 0.0, 0.5, 2.0];
    let x = m.create(&xv, [2, 3]);
    // numpy 2.4 / math.erf and math.tanh.
    let exact = [
        -0.00404969409489031,
        -0.15865525393145707,
        -0.0460172162722971,
        0.0,
        0.34573123063700656,
        1.9544997361036416,
    ];
    let approx = [
        -0.0036373920817729943,
        -0.15880800939172324,
        -0.04601724895456484,
        0.0,
        0.34571400982514394,
        1.954597694087775,
    ];
    assert!(!Gelu::new().is_approximate() && Gelu::tanh().is_approximate());
    assert_eq!(Gelu::default(), Gelu::new());
    assert_close(&vals(Gelu::new().forward(x)), &exact, 1e-14, "gelu");
    assert_close(&vals(Gelu::tanh().forward(x)), &approx, 1e-14, "gelu tanh");
    let x32 = m.create(&[2.0f32], [1]);
    assert!((vals(Gelu::tanh().forward(x32))[0] - approx[5]).abs() < 1e-6);
    gradcheck(&[&[3, 4]], -3.0, 3.0, |xs| Gelu::new().forward(xs[0]));
    gradcheck(&[&[3, 4]], -3.0, 3.0, |xs| Gelu::tanh().forward(xs[0]));
    let before = counts(&m);
    let _ = Gelu::tanh().forward(x);
    assert_eq!(counts(&m).0, before.0 + 1, "only the output is left");
    let xi = m.ones([2], DType::I64);
    fails!(
        m,
        Gelu::new().try_forward(xi),
        NdError::UnsupportedDType { .. }
    );
    fails!(
        m,
        Gelu::tanh().try_forward(xi),
        NdError::UnsupportedDType { .. }
    );
    m.close();
}

/// The digits CNN as a Sequential: names, modes, memory, and a training step that
/// leaves the model's manager as it was.
#[test]
fn cnn_model_names_modes_and_memory() {
    let _g = rng();
    let m = NDManager::new();
    let mut model = Sequential::new(&m)
        .add_with(|mm| Conv2d::builder(1, 16, 3).padding(1).build(mm))
        .add_with(|mm| BatchNorm2d::new(mm, 16))
        .add(Relu::new())
        .add(MaxPool2d::new(2))
        .add_with(|mm| Conv2d::builder(16, 32, 3).padding(1).build(mm))
        .add(Gelu::new())
        .add(MaxPool2d::new(2))
        .add(Flatten::new())
        .add(Dropout::new(0.1))
        .add_with(|mm| LayerNorm::new(mm, [128]))
        .add_with(|mm| Linear::new(mm, 128, 10));
    let names: Vec<String> = ndscope::nn::state_dict(&model)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(
        names,
        [
            "0.weight",
            "0.bias",
            "1.weight",
            "1.bias",
            "4.weight",
            "4.bias",
            "9.weight",
            "9.bias",
            "10.weight",
            "10.bias",
            "1.running_mean",
            "1.running_var",
            "1.num_batches_tracked",
        ]
    );
    let params: usize = model.parameters().iter().map(|p| p.size()).sum();
    assert_eq!(params, 144 + 16 + 32 + 4608 + 32 + 256 + 1280 + 10);
    let mem = model.manager().memory();
    assert_eq!(mem.live_bytes, params * 2 * 4 + 32 * 4 + 8);
    let x = m.random_uniform(0.0, 1.0, [8, 1, 8, 8], DType::F32);
    let labels = m.create(&[0i64, 1, 2, 3, 4, 5, 6, 7], [8]);
    for _ in 0..3 {
        let _s = NDScope::new();
        let gc = GradientCollector::new();
        let loss = model.forward(x).cross_entropy(labels);
        gc.backward(loss).unwrap();
    }
    assert_eq!(model.manager().memory(), mem_without_peak(&model, mem));
    assert!(
        model
            .parameters()
            .iter()
            .all(|p| vals(p.gradient()).iter().any(|&g| g != 0.0))
    );
    model.eval();
    assert!(model.layers().iter().all(|l| !l.is_training()));
    let a = vals(model.forward(x));
    assert_eq!(vals(model.forward(x)), a, "eval is deterministic");
    model.manager().close();
    assert!(model.parameters().iter().all(|p| p.is_closed()));
    m.close();
}

#[test]
fn checkpoints_round_trip_model_and_optimizer_exactly() {
    let _g = rng();
    let dir = std::env::temp_dir().join(format!("ndscope-nn-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (full, model_only) = (dir.join("full.safetensors"), dir.join("model.safetensors"));
    let m = NDManager::new();
    ndscope::random::seed(8);
    let build = |m: &NDManager| {
        Sequential::new(m)
            .add_with(|mm| Conv2d::builder(1, 4, 3).padding(1).build(mm))
            .add_with(|mm| BatchNorm2d::new(mm, 4))
            .add(Relu::new())
            .add(Flatten::new())
            .add_with(|mm| Linear::new(mm, 64, 3))
    };
    let model = build(&m);
    let mut opt = Adam::new(&m, &model.parameters(), AdamConfig::default());
    let x = m.random_uniform(0.0, 1.0, [6, 1, 4, 4], DType::F32);
    let labels = m.create(&[0i64, 1, 2, 0, 1, 2], [6]);
    let step = |model: &Sequential, opt: &mut Adam| {
        let _s = NDScope::new();
        let gc = GradientCollector::new();
        let loss = model.forward(x).cross_entropy(labels);
        gc.backward(loss).unwrap();
        drop(gc);
        opt.step();
    };
    let snapshot = |model: &Sequential, opt: &Adam| -> Vec<Vec<u64>> {
        let mut all: Vec<(String, NDArray)> = ndscope::nn::state_dict(model);
        all.extend(opt.named_state());
        all.iter()
            .map(|(_, a)| match a.dtype() {
                DType::I64 => a
                    .to_vec::<i64>()
                    .unwrap()
                    .iter()
                    .map(|&v| v as u64)
                    .collect(),
                _ => a
                    .to_vec::<f32>()
                    .unwrap()
                    .iter()
                    .map(|v| v.to_bits() as u64)
                    .collect(),
            })
            .collect()
    };
    for _ in 0..3 {
        step(&model, &mut opt);
    }
    ndscope::nn::save_with_optimizer(&full, &model, &opt);
    ndscope::nn::save(&model_only, &model);
    let saved = snapshot(&model, &opt);
    // Continue two steps: the reference trajectory.
    step(&model, &mut opt);
    step(&model, &mut opt);
    let reference = snapshot(&model, &opt);
    assert_ne!(reference, saved);
    // Roll back and replay: bit for bit the same state, step count included.
    let before = counts(&m);
    ndscope::nn::load_with_optimizer(&full, &model, &mut opt);
    assert_eq!(counts(&m), before, "loading allocates nothing that stays");
    assert_eq!(snapshot(&model, &opt), saved);
    assert_eq!(opt.step_count(), 3);
    step(&model, &mut opt);
    step(&model, &mut opt);
    assert_eq!(snapshot(&model, &opt), reference, "resumed exactly");

    // Into a fresh model and optimizer (other random values): identical predictions.
    let other = build(&m);
    let mut other_opt = Adam::new(&m, &other.parameters(), AdamConfig::default());
    ndscope::nn::load(&model_only, &other);
    ndscope::nn::load_with_optimizer(&full, &other, &mut other_opt);
    let mut model = model;
    let mut other = other;
    ndscope::nn::load_with_optimizer(&full, &model, &mut opt);
    model.eval();
    other.eval();
    assert_eq!(vals(other.forward(x)), vals(model.forward(x)));
    assert_eq!(snapshot(&other, &other_opt), saved);

    // Files that do not match: typed errors, nothing changes or leaks.
    let small = Sequential::new(&m).add_with(|mm| Linear::new(mm, 2, 2));
    let mut small_opt = Adam::new(&m, &small.parameters(), AdamConfig::default());
    let small_before = vals(small.parameters()[0]);
    fails!(
        m,
        ndscope::nn::try_load(&full, &small),
        NdError::Format { .. }
    );
    fails!(
        m,
        ndscope::nn::try_load(&full, &model),
        NdError::Format { .. }
    ); // extra optimizer entries
    fails!(
        m,
        ndscope::nn::try_load_with_optimizer(&model_only, &model, &mut opt),
        NdError::Format { .. }
    ); // no optimizer state
    fails!(
        m,
        ndscope::nn::try_load_with_optimizer(&full, &small, &mut small_opt),
        NdError::Format { .. }
    );
    fails!(
        m,
        ndscope::nn::try_load(dir.join("missing.safetensors"), &small),
        NdError::Io { .. }
    );
    assert_eq!(vals(small.parameters()[0]), small_before);
    assert_eq!(small_opt.step_count(), 0);
    assert_eq!(snapshot(&model, &opt), saved);
    std::fs::remove_dir_all(&dir).unwrap();
    m.close();
}

/// `sum`'s all-ones gradient reaches layer_norm's and batch_norm's backward kernels as a
/// stride-0 view of one element (no array of ones is filled), and gives the same bits
/// as the same gradient read from a filled array of ones.
#[test]
fn a_norm_reads_sums_ones_through_a_view_with_the_same_bits() {
    let m = NDManager::new();
    let (n, c, h, w) = (4, 8, 16, 16); // 8,192 elements: past the view's threshold
    let x = m.random_normal(0.0, 1.0, [n, c, h, w], DType::F32);
    let ones = m.ones([n, c, h, w], DType::F32);
    let (gl, bl) = (
        m.random_normal(1.0, 0.5, [c, h, w], DType::F32),
        m.random_normal(0.0, 0.5, [c, h, w], DType::F32),
    );
    let (gb, bb) = (
        m.random_normal(1.0, 0.5, [c], DType::F32),
        m.random_normal(0.0, 0.5, [c], DType::F32),
    );
    let (rm, rv) = (m.zeros([c], DType::F32), m.ones([c], DType::F32));
    let layer = |x: NDArray| x.layer_norm(&[1, 2, 3], Some(gl), Some(bl), 1e-5);
    let batch = |x: NDArray| x.batch_norm(rm, rv, Some(gb), Some(bb), true, 0.1, 1e-5);
    for (norm, params) in [
        (&layer as &dyn Fn(NDArray) -> NDArray, [gl, bl]),
        (&batch, [gb, bb]),
    ] {
        for p in [x, params[0], params[1]] {
            p.set_requires_gradient(true);
        }
        // The gradients with `g` a filled array of ones (`ones * 1` recorded: its
        // gradient, `1 * ones`, is an array), then with `sum`'s own ones.
        let grads = |explicit: bool| {
            let _s = NDScope::new();
            let gc = GradientCollector::new();
            let y = norm(x);
            let loss = if explicit { (y * ones).sum() } else { y.sum() };
            let ((), p) = ndscope::profile(|| gc.backward(loss).unwrap());
            let got: Vec<Vec<f32>> = [x, params[0], params[1]]
                .iter()
                .map(|p| p.gradient().to_vec::<f32>().unwrap())
                .collect();
            (got, p.ops)
        };
        let (want, _) = grads(true);
        let (got, ops) = grads(false);
        assert_eq!(got, want, "gradients through the view");
        let filled: Vec<_> = ops
            .iter()
            .filter(|o| o.output_shape == x.shape() && o.bytes_added > 0)
            .map(|o| o.name)
            .collect();
        // The one new array of x's shape the backward makes is the kernel's dx.
        assert_eq!(filled.len(), 1, "arrays of x's shape made: {filled:?}");
        assert!(ops.iter().any(|o| o.name == "broadcast_view"));
        for p in [x, params[0], params[1]] {
            p.set_requires_gradient(false);
        }
    }
    m.close();
}
