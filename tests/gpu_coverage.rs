//! Every public op with its GPU status (feature `gpu`).
//!
//! [`OPS`] lists each op of `NDArray` and each constructor of `NDManager` with what it
//! does on a GPU: [`Gpu::Runs`] (it runs there, and its result matches the CPU's) or
//! [`Gpu::NoKernel`] (it has no device kernel yet and says `Unsupported`, naming the
//! device, with nothing allocated). [`NOT_OPS`] names the methods that compute nothing
//! (handles, ownership, metadata). The test fails when an op's status is wrong either
//! way, and when the sources name an op (a `try_` method of `src/array` or
//! `src/manager.rs`) that neither list has: a new op must state its GPU status here.
//!
//! Needs an adapter (Mesa's "llvmpipe" stands in); without one the test skips, unless
//! `NDSCOPE_REQUIRE_GPU=1`, which makes it fail (CI sets it).
#![cfg(feature = "gpu")]

use ndscope::{DType, Device, NDArray, NDManager, NdError, devices, memory_on};

/// What an op does on a GPU.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Gpu {
    /// Runs on the device; the result's values match the CPU's (1e-4 relative).
    Runs,
    /// Runs on the device; only the shape and dtype are compared (random draws).
    RunsShapeOnly,
    /// No device kernel yet: `Unsupported`, nothing allocated.
    NoKernel,
}
use Gpu::*;

/// The inputs every case draws from, made by one manager (CPU or GPU).
struct In {
    /// F32 [3, 4] in [-2, 2), and a second one.
    x: NDArray,
    y: NDArray,
    /// F32 [3, 4], positive.
    p: NDArray,
    /// Bool [3, 4].
    b: NDArray,
    /// I64 [3] in 0..3.
    ids: NDArray,
    /// F32 images [2, 2, 5, 5] and conv weights [3, 2, 3, 3].
    img: NDArray,
    w: NDArray,
    /// F32 [2]: running mean and variance for the images' channels.
    rm: NDArray,
    rv: NDArray,
}

fn vals(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15).wrapping_add(1);
    (0..n)
        .map(|_| {
            s = s
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((s >> 33) % 2001) as f32 / 500.0 - 2.0
        })
        .collect()
}

impl In {
    fn new(m: &NDManager) -> In {
        let p: Vec<f32> = vals(12, 3).iter().map(|v| v.abs() + 0.5).collect();
        let b: Vec<bool> = vals(12, 4).iter().map(|&v| v > 0.0).collect();
        In {
            x: m.create(&vals(12, 1), [3, 4]),
            y: m.create(&vals(12, 2), [3, 4]),
            p: m.create(&p, [3, 4]),
            b: m.create(&b, [3, 4]),
            ids: m.create(&[2i64, 0, 2], [3]),
            img: m.create(&vals(100, 5), [2, 2, 5, 5]),
            w: m.create(&vals(54, 6), [3, 2, 3, 3]),
            rm: m.create(&[0.1f32, -0.2], [2]),
            rv: m.create(&[1.5f32, 0.5], [2]),
        }
    }
}

type Case = fn(&In) -> Result<NDArray, NdError>;

/// In place: `f` applied to a copy of `x`, which is the result.
fn inplace(i: &In, f: impl FnOnce(NDArray) -> Result<(), NdError>) -> Result<NDArray, NdError> {
    let t = i.x.try_mul(1.0)?;
    f(t)?;
    Ok(t)
}

/// Every op, its GPU status, and a call of it.
const OPS: &[(&str, Gpu, Case)] = &[
    // Arithmetic, comparisons, in place.
    ("add", Runs, |i| i.x.try_add(i.y)),
    ("sub", Runs, |i| i.x.try_sub(i.y.get("0"))),
    ("mul", Runs, |i| i.x.try_mul(i.y)),
    ("div", Runs, |i| i.x.try_div(i.p)),
    ("pow", Runs, |i| i.p.try_pow(i.x)),
    ("maximum", Runs, |i| i.x.try_maximum(i.y)),
    ("minimum", Runs, |i| i.x.try_minimum(i.y)),
    ("neg", Runs, |i| i.x.try_neg()),
    ("addi", Runs, |i| inplace(i, |t| t.try_addi(i.y))),
    ("subi", Runs, |i| inplace(i, |t| t.try_subi(2.0))),
    ("muli", Runs, |i| inplace(i, |t| t.try_muli(i.y.get("1")))),
    ("divi", Runs, |i| inplace(i, |t| t.try_divi(i.p))),
    ("set", Runs, |i| inplace(i, |t| t.try_set("1, 1:3", 7.0))),
    ("eq", Runs, |i| i.x.try_eq(i.x.get("::-1"))),
    ("ne", Runs, |i| i.x.try_ne(0.5)),
    ("gt", Runs, |i| i.x.try_gt(i.y)),
    ("ge", Runs, |i| i.x.try_ge(i.y)),
    ("lt", Runs, |i| i.x.try_lt(0.0)),
    ("le", Runs, |i| i.x.try_le(i.y)),
    ("where_", Runs, |i| i.b.try_where_(i.x, i.y)),
    ("clip", Runs, |i| i.x.try_clip(-1.0, 0.5)),
    ("matmul", Runs, |i| i.x.try_matmul(i.y.try_transpose()?)),
    ("dot", Runs, |i| i.x.get("0").try_dot(i.y.get("1"))),
    // Elementwise math.
    ("abs", Runs, |i| i.x.try_abs()),
    ("square", Runs, |i| i.x.try_square()),
    ("relu", Runs, |i| i.x.try_relu()),
    ("exp", Runs, |i| i.x.try_exp()),
    ("log", Runs, |i| i.p.try_log()),
    ("sqrt", Runs, |i| i.p.try_sqrt()),
    ("sin", Runs, |i| i.x.try_sin()),
    ("cos", Runs, |i| i.x.try_cos()),
    ("tanh", Runs, |i| i.x.try_tanh()),
    ("sigmoid", Runs, |i| i.x.try_sigmoid()),
    ("erf", Runs, |i| i.x.try_erf()),
    ("gelu", Runs, |i| i.x.try_gelu()),
    ("silu", Runs, |i| i.x.try_silu()),
    ("softplus", Runs, |i| i.x.try_softplus()),
    ("reciprocal", Runs, |i| i.p.try_reciprocal()),
    ("rsqrt", Runs, |i| i.p.try_rsqrt()),
    ("log1p", Runs, |i| i.p.try_log1p()),
    ("expm1", Runs, |i| i.x.try_expm1()),
    ("floor", Runs, |i| i.x.try_floor()),
    ("ceil", Runs, |i| i.x.try_ceil()),
    ("round", Runs, |i| i.x.try_round()),
    ("sign", Runs, |i| i.x.try_sign()),
    ("leaky_relu", Runs, |i| i.x.try_leaky_relu(0.1)),
    ("to_dtype", Runs, |i| i.x.try_to_dtype(DType::I32)),
    ("stop_gradient", Runs, |i| i.x.try_stop_gradient()),
    // Reductions and statistics.
    ("sum", Runs, |i| i.x.try_sum()),
    ("sum_axes", Runs, |i| i.x.try_sum_axes(&[1], true)),
    ("mean", Runs, |i| i.x.try_mean()),
    ("mean_axes", Runs, |i| i.x.try_mean_axes(&[0], false)),
    ("max", Runs, |i| i.x.try_max()),
    ("max_axes", Runs, |i| i.x.try_max_axes(&[1], false)),
    ("min", Runs, |i| i.x.try_min()),
    ("min_axes", Runs, |i| i.x.try_min_axes(&[0], true)),
    ("prod", Runs, |i| i.x.try_prod()),
    ("prod_axes", Runs, |i| i.x.try_prod_axes(&[1], false)),
    ("argmax", Runs, |i| i.x.try_argmax()),
    ("argmax_axis", Runs, |i| i.x.try_argmax_axis(1, false)),
    ("argmin", Runs, |i| i.x.try_argmin()),
    ("argmin_axis", Runs, |i| i.x.try_argmin_axis(0, true)),
    ("var", Runs, |i| i.x.try_var()),
    ("var_axes", Runs, |i| i.x.try_var_axes(&[1], false)),
    ("std", Runs, |i| i.x.try_std()),
    ("std_axes", Runs, |i| i.x.try_std_axes(&[0], true)),
    ("logsumexp", Runs, |i| i.x.try_logsumexp()),
    ("logsumexp_axes", Runs, |i| {
        i.x.try_logsumexp_axes(&[1], false)
    }),
    ("norm", Runs, |i| i.x.try_norm()),
    ("cumsum", Runs, |i| i.x.try_cumsum(1)),
    ("any", Runs, |i| i.b.try_any()),
    ("any_axes", Runs, |i| i.x.try_any_axes(&[1], false)),
    ("all", Runs, |i| i.b.try_all()),
    ("all_axes", Runs, |i| i.b.try_all_axes(&[0], true)),
    // Logical.
    ("logical_and", Runs, |i| {
        i.b.try_logical_and(i.b.get("::-1"))
    }),
    ("logical_or", Runs, |i| i.b.try_logical_or(i.b.get("0"))),
    ("logical_xor", Runs, |i| {
        i.b.try_logical_xor(i.b.try_logical_not()?)
    }),
    ("logical_not", Runs, |i| i.b.try_logical_not()),
    // Shapes and copies.
    ("get", Runs, |i| i.x.try_get("1:, ::-2")),
    ("reshape", Runs, |i| i.x.try_reshape([4, 3])),
    ("reshape_infer", Runs, |i| i.x.try_reshape_infer(&[2, -1])),
    ("flatten", Runs, |i| i.x.try_flatten()),
    ("transpose", Runs, |i| i.x.try_transpose()),
    ("permute", Runs, |i| i.img.try_permute(&[3, 1, 0, 2])),
    ("swap_axes", Runs, |i| i.img.try_swap_axes(0, 2)),
    ("expand_dims", Runs, |i| i.x.try_expand_dims(1)),
    ("squeeze", Runs, |i| i.x.get("0:1").try_squeeze()),
    ("squeeze_axis", Runs, |i| {
        i.x.get(":, 1:2").try_squeeze_axis(1)
    }),
    ("broadcast_to", Runs, |i| {
        i.x.get("1").try_broadcast_to([2, 4])
    }),
    ("flip", Runs, |i| i.x.try_flip(&[0, 1])),
    ("split", Runs, |i| Ok(i.x.try_split(2, 1)?[1])),
    ("concat", Runs, |i| NDArray::try_concat(&[i.x, i.y], 1)),
    ("stack", Runs, |i| NDArray::try_stack(&[i.x, i.y], 0)),
    ("repeat", Runs, |i| i.x.try_repeat(2, 0)),
    ("tile", Runs, |i| i.x.try_tile(&[2, 1])),
    ("pad", Runs, |i| i.x.try_pad(&[(1, 0), (2, 1)], -1.0)),
    ("tril", Runs, |i| i.x.try_tril(0)),
    ("triu", Runs, |i| i.x.try_triu(1)),
    ("zeros_like", Runs, |i| i.x.try_zeros_like()),
    ("ones_like", Runs, |i| i.x.try_ones_like()),
    ("full_like", Runs, |i| i.x.try_full_like(2.5)),
    ("to_device", Runs, |i| i.x.try_to_device(i.x.device())),
    ("move_to_device", Runs, |i| {
        inplace(i, |t| t.try_move_to_device(i.x.device()))
    }),
    // Indexing.
    ("index_select", Runs, |i| i.x.try_index_select(0, i.ids)),
    ("gather", Runs, |i| {
        i.x.try_gather(1, i.ids.try_reshape([3, 1])?)
    }),
    ("scatter_add", Runs, |i| {
        i.x.try_scatter_add(1, i.ids.try_reshape([3, 1])?, i.y)
    }),
    ("take", Runs, |i| i.x.try_take(i.ids)),
    ("boolean_mask", Runs, |i| i.x.try_boolean_mask(i.b)),
    ("masked_fill", Runs, |i| i.x.try_masked_fill(i.b, 9.0)),
    ("one_hot", Runs, |i| i.ids.try_one_hot(4, DType::F32)),
    ("embedding", Runs, |i| i.x.try_embedding(i.ids)),
    // Layers and losses.
    ("softmax", Runs, |i| i.x.try_softmax(1)),
    ("log_softmax", Runs, |i| i.x.try_log_softmax(0)),
    ("cross_entropy", Runs, |i| i.x.try_cross_entropy(i.ids)),
    ("mse_loss", Runs, |i| i.x.try_mse_loss(i.y)),
    ("binary_cross_entropy_with_logits", Runs, |i| {
        i.x.try_binary_cross_entropy_with_logits(i.p.try_clip(0.0, 1.0)?)
    }),
    ("dropout", Runs, |i| i.x.try_dropout(0.5, false)),
    ("conv2d", Runs, |i| {
        i.img.try_conv2d(i.w, None, [1, 2], [1, 0], [1, 1], 1)
    }),
    ("max_pool2d", Runs, |i| {
        i.img.try_max_pool2d([2, 2], [2, 1], [1, 0])
    }),
    ("avg_pool2d", Runs, |i| {
        i.img.try_avg_pool2d([3, 3], [1, 1], [1, 1])
    }),
    ("layer_norm", Runs, |i| {
        i.x.try_layer_norm(&[1], None, None, 1e-5)
    }),
    ("batch_norm", Runs, |i| {
        i.img
            .try_batch_norm(i.rm, i.rv, None, None, false, 0.1, 1e-5)
    }),
    // Constructors of a manager on the device.
    ("create", Runs, |i| {
        i.x.try_manager()?.try_create(&[1.0f32, 2.0], [2])
    }),
    ("zeros", Runs, |i| {
        i.x.try_manager()?.try_zeros([2, 3], DType::I32)
    }),
    ("ones", Runs, |i| {
        i.x.try_manager()?.try_ones([3], DType::F32)
    }),
    ("full", Runs, |i| {
        i.x.try_manager()?.try_full([2], 4.0, DType::F32)
    }),
    ("arange", Runs, |i| {
        i.x.try_manager()?.try_arange(0.0, 5.0, 1.5, DType::F32)
    }),
    ("linspace", Runs, |i| {
        i.x.try_manager()?.try_linspace(0.0, 1.0, 5, DType::F32)
    }),
    ("eye", Runs, |i| i.x.try_manager()?.try_eye(3, DType::F32)),
    ("random_normal", RunsShapeOnly, |i| {
        i.x.try_manager()?
            .try_random_normal(0.0, 1.0, [5], DType::F32)
    }),
    ("random_uniform", RunsShapeOnly, |i| {
        i.x.try_manager()?
            .try_random_uniform(0.0, 1.0, [5], DType::F32)
    }),
    ("random_integer", RunsShapeOnly, |i| {
        i.x.try_manager()?.try_random_integer(0, 9, [5], DType::I64)
    }),
    ("random_permutation", RunsShapeOnly, |i| {
        i.x.try_manager()?.try_random_permutation(6)
    }),
    ("random_bernoulli", RunsShapeOnly, |i| {
        i.x.try_manager()?.try_random_bernoulli(0.5, [5])
    }),
];

/// `try_` methods that compute no array: handles, ownership, metadata, managers, and
/// helpers the sources call by these names.
const NOT_OPS: &[&str] = &[
    "attach",
    "temp_attach",
    "detach",
    "retain",
    "release",
    "ref_count",
    "escape",
    "manager",
    "device",
    "dtype",
    "shape",
    "name",
    "from",
    "axes_name",
    "flatten_at",
    "new_sub_manager",
    "new_on",
    "random_host",
];

fn gpu() -> Option<Device> {
    match devices().into_iter().find(|d| d.device != Device::Cpu) {
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

/// The names after `try_` in the Rust sources under `path`.
fn try_names(path: &std::path::Path, out: &mut std::collections::BTreeSet<String>) {
    if path.is_dir() {
        for e in std::fs::read_dir(path).unwrap() {
            try_names(&e.unwrap().path(), out);
        }
        return;
    }
    if path.extension().is_none_or(|e| e != "rs") {
        return;
    }
    let text = std::fs::read_to_string(path).unwrap();
    for (k, _) in text.match_indices("try_") {
        let before = text[..k].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let name: String = text[k + 4..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if !name.is_empty() {
            out.insert(name);
        }
    }
}

/// Values of `a` as f64 on the host.
fn host(a: NDArray) -> Vec<f64> {
    a.to_dtype(DType::F64)
        .to_device(Device::Cpu)
        .to_vec::<f64>()
        .unwrap()
}

#[test]
fn every_public_op_states_its_gpu_status() {
    // The lists cover every op the sources name.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names = std::collections::BTreeSet::new();
    try_names(&root.join("src/array"), &mut names);
    try_names(&root.join("src/manager.rs"), &mut names);
    let missing: Vec<&String> = names
        .iter()
        .filter(|n| !OPS.iter().any(|(o, ..)| o == n) && !NOT_OPS.contains(&n.as_str()))
        .collect();
    assert!(
        missing.is_empty(),
        "ops without a GPU status in tests/gpu_coverage.rs: {missing:?}"
    );
    let Some(d) = gpu() else { return };
    let (cm, gm) = (NDManager::new(), NDManager::new_on(d));
    let (ci, gi) = (In::new(&cm), In::new(&gm));
    let mut wrong = Vec::new();
    for &(name, status, f) in OPS {
        let before = memory_on(d).live_bytes;
        let (want, got) = (f(&ci), f(&gi));
        let want = want.unwrap_or_else(|e| panic!("{name} on the CPU: {e}"));
        match (status, got) {
            (Runs | RunsShapeOnly, Ok(g)) => {
                assert_eq!(g.device(), d, "{name}: result's device");
                assert_eq!(
                    (g.shape(), g.dtype()),
                    (want.shape(), want.dtype()),
                    "{name}"
                );
                if status == Runs {
                    let (g, w) = (host(g), host(want));
                    let ok = g.iter().zip(&w).all(|(g, w)| {
                        g == w
                            || (g.is_nan() && w.is_nan())
                            || (g - w).abs() <= 1e-4 * (1.0 + w.abs())
                    });
                    assert!(ok, "{name}: gpu {g:?}, cpu {w:?}");
                }
            }
            (NoKernel, Err(NdError::Unsupported { device, .. })) if device == d => {
                assert_eq!(memory_on(d).live_bytes, before, "{name}: left memory");
            }
            (_, got) => wrong.push(format!(
                "{name}: listed {status:?}, got {:?}",
                got.map(|g| g.shape())
            )),
        }
    }
    assert!(
        wrong.is_empty(),
        "GPU statuses to correct:\n{}",
        wrong.join("\n")
    );
    let runs = OPS.iter().filter(|o| o.1 != NoKernel).count();
    eprintln!("{runs} of {} ops run on {d}", OPS.len());
    cm.close();
    gm.close();
}
