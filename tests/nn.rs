//! `ndscope::nn` (layers, initialisation) and `ndscope::optim` (optimizers, schedules,
//! gradient clipping): shapes, values against hand computations and the published
//! update rules, gradients, ownership and memory.

mod common;

use common::{counts, gradcheck};
use ndscope::nn::init::{FanMode, Init, Nonlinearity, calculate_gain, fan_in_and_fan_out};
use ndscope::nn::{Flatten, Linear, Module, Relu, Sequential, Sigmoid, Tanh};
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
