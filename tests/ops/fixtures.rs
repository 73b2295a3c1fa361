//! Ops and gradients against numpy reference fixtures.
//!
//! `scripts/gen_fixtures.py` writes `tests/fixtures/ops/*.json` (one file per op family;
//! its docstring documents the case format, where the expected values come from, where
//! ndscope's documented semantics differ from numpy's, and how to add an op). This test
//! needs no Python: it reads the committed files, runs every case through ndscope by op
//! name ([`apply`]), and compares
//! * the output: dtype, shape and values (exact for integers and Bool; floats within
//!   `atol + rtol * |expected|`, 1e-12 for f64 and 1e-5 for f32; NaN must be NaN and
//!   infinities must match);
//! * the gradient of `sum(out * r)` with respect to every float input (the arrays the
//!   runner creates, before any view), via [`GradientCollector`];
//! * or the `NdError` variant, for cases that must fail;
//! * for an op that writes into its inputs (batch_norm's running statistics), those
//!   inputs afterwards (`after`: the new values, or unchanged after an error).
//!
//! Every failing case is reported, by id, in one assertion message. Cases that fail
//! because of a known ndscope bug are listed in [`KNOWN_FAILURES`] with the reason; the
//! test also fails when one of them starts passing, so the list stays current.

use ndscope::{DType, GradientCollector, NDArray, NDManager, NdError, Rhs};
use serde_json::Value;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::Path;

/// Cases (ids, or an id prefix ending in `/`) that fail because of a known ndscope bug,
/// with the reason. Remove an entry when its bug is fixed (the test says when).
const KNOWN_FAILURES: &[(&str, &str)] = &[];

/// The fewest cases the fixtures must hold (guards against silently reading nothing).
const MIN_CASES: usize = 3800;

/// Relative and absolute tolerances per float dtype; a case's `"tol": [rtol, atol]`
/// raises them (e.g. gradients by finite differences, long sums).
fn tolerance(dtype: DType, case: &Value) -> (f64, f64) {
    let (rtol, atol): (f64, f64) = match dtype {
        DType::F32 => (1e-5, 1e-5),
        _ => (1e-12, 1e-12),
    };
    match case.get("tol").and_then(Value::as_array) {
        Some(t) => (
            rtol.max(t[0].as_f64().expect("tol holds numbers")),
            atol.max(t[1].as_f64().expect("tol holds numbers")),
        ),
        None => (rtol, atol),
    }
}

/// Run one op by its fixture name on the (already viewed) inputs `x`.
///
/// To add an op: one arm here, plus its entry in `scripts/gen_fixtures.py`.
fn apply(op: &str, p: &Value, x: &[NDArray]) -> Result<NDArray, NdError> {
    match op {
        "add" | "sub" | "mul" | "div" if p.get("scalar_left") == Some(&Value::Bool(true)) => {
            Ok(scalar_left(op, &p["scalar"], x[0]))
        }
        "add" => x[0].try_add(rhs(p, x)),
        "sub" => x[0].try_sub(rhs(p, x)),
        "mul" => x[0].try_mul(rhs(p, x)),
        "div" => x[0].try_div(rhs(p, x)),
        "pow" => x[0].try_pow(rhs(p, x)),
        "maximum" => x[0].try_maximum(rhs(p, x)),
        "minimum" => x[0].try_minimum(rhs(p, x)),
        "eq" => x[0].try_eq(rhs(p, x)),
        "ne" => x[0].try_ne(rhs(p, x)),
        "gt" => x[0].try_gt(rhs(p, x)),
        "ge" => x[0].try_ge(rhs(p, x)),
        "lt" => x[0].try_lt(rhs(p, x)),
        "le" => x[0].try_le(rhs(p, x)),
        "abs" => x[0].try_abs(),
        "neg" => x[0].try_neg(),
        "square" => x[0].try_square(),
        "relu" => x[0].try_relu(),
        "exp" => x[0].try_exp(),
        "log" => x[0].try_log(),
        "sqrt" => x[0].try_sqrt(),
        "sin" => x[0].try_sin(),
        "cos" => x[0].try_cos(),
        "tanh" => x[0].try_tanh(),
        "sigmoid" => x[0].try_sigmoid(),
        "sum" => match axes(p) {
            None => x[0].try_sum(),
            Some(a) => x[0].try_sum_axes(&a, keep_dims(p)),
        },
        "mean" => match axes(p) {
            None => x[0].try_mean(),
            Some(a) => x[0].try_mean_axes(&a, keep_dims(p)),
        },
        "max" => match axes(p) {
            None => x[0].try_max(),
            Some(a) => x[0].try_max_axes(&a, keep_dims(p)),
        },
        "min" => match axes(p) {
            None => x[0].try_min(),
            Some(a) => x[0].try_min_axes(&a, keep_dims(p)),
        },
        "prod" => match axes(p) {
            None => x[0].try_prod(),
            Some(a) => x[0].try_prod_axes(&a, keep_dims(p)),
        },
        "argmax" => match p.get("axis") {
            None => x[0].try_argmax(),
            Some(_) => x[0].try_argmax_axis(int(p, "axis") as isize, keep_dims(p)),
        },
        "argmin" => match p.get("axis") {
            None => x[0].try_argmin(),
            Some(_) => x[0].try_argmin_axis(int(p, "axis") as isize, keep_dims(p)),
        },
        "matmul" => x[0].try_matmul(x[1]),
        "dot" => x[0].try_dot(x[1]),
        "reshape" => x[0].try_reshape(usizes(p, "shape")),
        "reshape_infer" => x[0].try_reshape_infer(&isizes(p, "dims")),
        "flatten" => x[0].try_flatten(),
        "transpose" => x[0].try_transpose(),
        "permute" => x[0].try_permute(&usizes(p, "perm")),
        "squeeze" => match p.get("axis") {
            None => x[0].try_squeeze(),
            Some(_) => x[0].try_squeeze_axis(int(p, "axis") as isize),
        },
        "expand_dims" => x[0].try_expand_dims(int(p, "axis") as isize),
        "broadcast_to" => x[0].try_broadcast_to(usizes(p, "shape")),
        "concat" => NDArray::try_concat(x, int(p, "axis") as isize),
        "stack" => NDArray::try_stack(x, int(p, "axis") as isize),
        "get" => x[0].try_get(string(p, "index")),
        "softmax" => x[0].try_softmax(int(p, "axis") as isize),
        "log_softmax" => x[0].try_log_softmax(int(p, "axis") as isize),
        "clip" => x[0].try_clip(float(p, "min"), float(p, "max")),
        "where" => x[0].try_where_(x[1], x[2]),
        "to_dtype" => x[0].try_to_dtype(dtype(string(p, "dtype"))),
        // ---- issue 11: indexing
        "index_select" => x[0].try_index_select(axis(p, "axis"), x[1]),
        "gather" => x[0].try_gather(axis(p, "axis"), x[1]),
        "scatter_add" => x[0].try_scatter_add(axis(p, "axis"), x[1], x[2]),
        "take" => x[0].try_take(x[1]),
        "boolean_mask" => x[0].try_boolean_mask(x[1]),
        "masked_fill" => x[0].try_masked_fill(x[1], float(p, "value")),
        // ---- logical
        "logical_and" => x[0].try_logical_and(x[1]),
        "logical_or" => x[0].try_logical_or(x[1]),
        "logical_xor" => x[0].try_logical_xor(x[1]),
        "logical_not" => x[0].try_logical_not(),
        "any" => match axes(p) {
            None => x[0].try_any(),
            Some(a) => x[0].try_any_axes(&a, keep_dims(p)),
        },
        "all" => match axes(p) {
            None => x[0].try_all(),
            Some(a) => x[0].try_all_axes(&a, keep_dims(p)),
        },
        // ---- statistics
        "var" => match axes(p) {
            None => x[0].try_var(),
            Some(a) => x[0].try_var_axes(&a, keep_dims(p)),
        },
        "std" => match axes(p) {
            None => x[0].try_std(),
            Some(a) => x[0].try_std_axes(&a, keep_dims(p)),
        },
        "logsumexp" => match axes(p) {
            None => x[0].try_logsumexp(),
            Some(a) => x[0].try_logsumexp_axes(&a, keep_dims(p)),
        },
        "cumsum" => x[0].try_cumsum(axis(p, "axis")),
        "norm" => x[0].try_norm(),
        // ---- more unary math
        "erf" => x[0].try_erf(),
        "gelu" => x[0].try_gelu(),
        "silu" => x[0].try_silu(),
        "softplus" => x[0].try_softplus(),
        "leaky_relu" => x[0].try_leaky_relu(float(p, "alpha")),
        "floor" => x[0].try_floor(),
        "ceil" => x[0].try_ceil(),
        "round" => x[0].try_round(),
        "sign" => x[0].try_sign(),
        "reciprocal" => x[0].try_reciprocal(),
        "rsqrt" => x[0].try_rsqrt(),
        "log1p" => x[0].try_log1p(),
        "expm1" => x[0].try_expm1(),
        // ---- shape
        "split" => x[0]
            .try_split(int(p, "sections") as usize, axis(p, "axis"))
            .and_then(|parts| NDArray::try_stack(&parts, 0)),
        "repeat" => x[0].try_repeat(int(p, "repeats") as usize, axis(p, "axis")),
        "tile" => x[0].try_tile(&usizes(p, "reps")),
        "pad" => x[0].try_pad(&pairs(p, "widths"), float(p, "value")),
        "swap_axes" => x[0].try_swap_axes(axis(p, "a"), axis(p, "b")),
        "flip" => x[0].try_flip(&isizes(p, "axes")),
        "tril" => x[0].try_tril(int(p, "k")),
        "triu" => x[0].try_triu(int(p, "k")),
        "zeros_like" => x[0].try_zeros_like(),
        "ones_like" => x[0].try_ones_like(),
        "full_like" => x[0].try_full_like(float(p, "value")),
        // ---- nn
        "conv2d" => x[0].try_conv2d(
            x[1],
            x.get(2).copied(),
            pair(p, "stride"),
            pair(p, "padding"),
            pair(p, "dilation"),
            int(p, "groups") as usize,
        ),
        "max_pool2d" => {
            x[0].try_max_pool2d(pair(p, "kernel"), pair(p, "stride"), pair(p, "padding"))
        }
        "avg_pool2d" => {
            x[0].try_avg_pool2d(pair(p, "kernel"), pair(p, "stride"), pair(p, "padding"))
        }
        "layer_norm" => {
            let (gamma, beta) = affine(p, &x[1..]);
            x[0].try_layer_norm(&isizes(p, "axes"), gamma, beta, float(p, "eps"))
        }
        "batch_norm" => {
            let (gamma, beta) = affine(p, &x[3..]);
            x[0].try_batch_norm(
                x[1],
                x[2],
                gamma,
                beta,
                flag(p, "training"),
                float(p, "momentum"),
                float(p, "eps"),
            )
        }
        "embedding" => x[0].try_embedding(x[1]),
        "cross_entropy" => x[0].try_cross_entropy(x[1]),
        "mse_loss" => x[0].try_mse_loss(x[1]),
        "binary_cross_entropy_with_logits" => x[0].try_binary_cross_entropy_with_logits(x[1]),
        "one_hot" => x[0].try_one_hot(int(p, "depth") as usize, dtype(string(p, "dtype"))),
        _ => panic!("no runner arm for op '{op}' (add one to `apply` in tests/ops/fixtures.rs)"),
    }
}

// ---- parameters (a malformed fixture panics; the panic is reported as the case's failure)

fn int(p: &Value, key: &str) -> i64 {
    p[key]
        .as_i64()
        .unwrap_or_else(|| panic!("param '{key}' is not an integer: {}", p[key]))
}

/// A number, or one of the strings "nan", "inf", "-inf" (JSON has no such numbers).
fn float(p: &Value, key: &str) -> f64 {
    float_value(&p[key])
}

fn axis(p: &Value, key: &str) -> isize {
    int(p, key) as isize
}

fn flag(p: &Value, key: &str) -> bool {
    p[key]
        .as_bool()
        .unwrap_or_else(|| panic!("param '{key}' is not a bool: {}", p[key]))
}

/// `[a, b]` as `[usize; 2]` (conv2d's and the pools' stride, padding, ...).
fn pair(p: &Value, key: &str) -> [usize; 2] {
    match usizes(p, key)[..] {
        [a, b] => [a, b],
        _ => panic!("param '{key}' is not a pair: {}", p[key]),
    }
}

/// `[[before, after], ...]` (pad's widths).
fn pairs(p: &Value, key: &str) -> Vec<(usize, usize)> {
    p[key]
        .as_array()
        .unwrap_or_else(|| panic!("param '{key}' is not a list: {}", p[key]))
        .iter()
        .map(|w| {
            let w = w.as_array().expect("a [before, after] pair");
            (
                w[0].as_u64().expect("a width") as usize,
                w[1].as_u64().expect("a width") as usize,
            )
        })
        .collect()
}

/// The optional `gamma`, `beta` inputs (in that order) that `params.gamma` and
/// `params.beta` say are present.
fn affine(p: &Value, rest: &[NDArray]) -> (Option<NDArray>, Option<NDArray>) {
    let mut it = rest.iter().copied();
    let gamma = if flag(p, "gamma") { it.next() } else { None };
    let beta = if flag(p, "beta") { it.next() } else { None };
    (gamma, beta)
}

fn string<'a>(p: &'a Value, key: &str) -> &'a str {
    p[key]
        .as_str()
        .unwrap_or_else(|| panic!("param '{key}' is not a string: {}", p[key]))
}

fn list(p: &Value, key: &str) -> Vec<i64> {
    p[key]
        .as_array()
        .unwrap_or_else(|| panic!("param '{key}' is not a list: {}", p[key]))
        .iter()
        .map(|v| v.as_i64().expect("an integer list"))
        .collect()
}

fn usizes(p: &Value, key: &str) -> Vec<usize> {
    list(p, key).into_iter().map(|v| v as usize).collect()
}

fn isizes(p: &Value, key: &str) -> Vec<isize> {
    list(p, key).into_iter().map(|v| v as isize).collect()
}

/// `params.axes`: absent or null reduces over everything.
fn axes(p: &Value) -> Option<Vec<isize>> {
    match p.get("axes") {
        None | Some(Value::Null) => None,
        Some(_) => Some(isizes(p, "axes")),
    }
}

fn keep_dims(p: &Value) -> bool {
    p.get("keep_dims").and_then(Value::as_bool).unwrap_or(false)
}

/// The right-hand side: `params.scalar` (an integer or a float scalar: ndscope treats
/// them differently) or the second input.
fn rhs(p: &Value, x: &[NDArray]) -> Rhs {
    match p.get("scalar") {
        None => Rhs::from(x[1]),
        Some(s) => match s.as_i64() {
            Some(i) => Rhs::from(i),
            None => Rhs::from(s.as_f64().expect("a numeric scalar")),
        },
    }
}

/// `scalar op x` through the operators (the only scalar-left form ndscope has).
fn scalar_left(op: &str, s: &Value, x: NDArray) -> NDArray {
    match s.as_i64() {
        Some(i) => match op {
            "add" => i + x,
            "sub" => i - x,
            "mul" => i * x,
            _ => i / x,
        },
        None => {
            let f = s.as_f64().expect("a numeric scalar");
            match op {
                "add" => f + x,
                "sub" => f - x,
                "mul" => f * x,
                _ => f / x,
            }
        }
    }
}

// ---- arrays

fn dtype(name: &str) -> DType {
    match name {
        "f32" => DType::F32,
        "f64" => DType::F64,
        "i32" => DType::I32,
        "i64" => DType::I64,
        "u8" => DType::U8,
        "bool" => DType::Bool,
        _ => panic!("unknown dtype '{name}'"),
    }
}

/// Flat values, by kind.
#[derive(Debug)]
enum Data {
    Float(Vec<f64>),
    Int(Vec<i64>),
    Bool(Vec<bool>),
}

/// An array as the fixtures spell it.
#[derive(Debug)]
struct Spec {
    shape: Vec<usize>,
    dtype: DType,
    data: Data,
}

fn float_value(v: &Value) -> f64 {
    match v {
        Value::String(s) => match s.as_str() {
            "nan" => f64::NAN,
            "inf" => f64::INFINITY,
            "-inf" => f64::NEG_INFINITY,
            _ => panic!("bad float value '{s}'"),
        },
        _ => v.as_f64().unwrap_or_else(|| panic!("bad float value {v}")),
    }
}

fn spec(v: &Value) -> Spec {
    let shape = usizes(v, "shape");
    let dtype = dtype(string(v, "dtype"));
    let raw = v["data"].as_array().expect("data is a list");
    let data = match dtype {
        DType::F32 | DType::F64 => Data::Float(raw.iter().map(float_value).collect()),
        DType::Bool => Data::Bool(raw.iter().map(|b| b.as_bool().expect("a bool")).collect()),
        _ => Data::Int(
            raw.iter()
                .map(|i| i.as_i64().expect("an integer"))
                .collect(),
        ),
    };
    Spec { shape, dtype, data }
}

fn create(m: &NDManager, s: &Spec) -> NDArray {
    let shape = s.shape.clone();
    match (&s.data, s.dtype) {
        (Data::Float(v), DType::F32) => {
            m.create(&v.iter().map(|&x| x as f32).collect::<Vec<_>>(), shape)
        }
        (Data::Float(v), _) => m.create(v, shape),
        (Data::Int(v), DType::I32) => {
            m.create(&v.iter().map(|&x| x as i32).collect::<Vec<_>>(), shape)
        }
        (Data::Int(v), DType::U8) => {
            m.create(&v.iter().map(|&x| x as u8).collect::<Vec<_>>(), shape)
        }
        (Data::Int(v), _) => m.create(v, shape),
        (Data::Bool(v), _) => m.create(v, shape),
    }
}

fn read(a: NDArray) -> Result<Spec, NdError> {
    let dtype = a.try_dtype()?;
    let data = match dtype {
        DType::F32 => Data::Float(a.to_vec::<f32>()?.into_iter().map(f64::from).collect()),
        DType::F64 => Data::Float(a.to_vec::<f64>()?),
        DType::I32 => Data::Int(a.to_vec::<i32>()?.into_iter().map(i64::from).collect()),
        DType::I64 => Data::Int(a.to_vec::<i64>()?),
        DType::U8 => Data::Int(a.to_vec::<u8>()?.into_iter().map(i64::from).collect()),
        DType::Bool => Data::Bool(a.to_vec::<bool>()?),
    };
    Ok(Spec {
        shape: a.try_shape()?.dims().to_vec(),
        dtype,
        data,
    })
}

/// `Ok` when `got` matches `want` (see the module docs for the tolerances).
fn compare(what: &str, got: &Spec, want: &Spec, case: &Value) -> Result<(), String> {
    if got.dtype != want.dtype || got.shape != want.shape {
        return Err(format!(
            "{what}: got {}{:?}, expected {}{:?}",
            got.dtype, got.shape, want.dtype, want.shape
        ));
    }
    let bad = |i: usize, g: String, w: String| {
        Err(format!(
            "{what}: element {i} (row-major) is {g}, expected {w}\n      got      {:?}\n      expected {:?}",
            got.data, want.data
        ))
    };
    match (&got.data, &want.data) {
        (Data::Float(g), Data::Float(w)) => {
            let (rtol, atol) = tolerance(want.dtype, case);
            for (i, (&a, &b)) in g.iter().zip(w).enumerate() {
                let ok = if b.is_nan() {
                    a.is_nan()
                } else if b.is_infinite() {
                    a == b
                } else {
                    (a - b).abs() <= atol + rtol * b.abs()
                };
                if !ok {
                    return bad(i, format!("{a:e}"), format!("{b:e}"));
                }
            }
        }
        (Data::Int(g), Data::Int(w)) => {
            if let Some(i) = (0..w.len()).find(|&i| g[i] != w[i]) {
                return bad(i, g[i].to_string(), w[i].to_string());
            }
        }
        (Data::Bool(g), Data::Bool(w)) => {
            if let Some(i) = (0..w.len()).find(|&i| g[i] != w[i]) {
                return bad(i, g[i].to_string(), w[i].to_string());
            }
        }
        _ => return Err(format!("{what}: data kinds differ")),
    }
    Ok(())
}

/// The `NdError` variant's name (`ShapeMismatch`, ...).
fn variant(e: &NdError) -> String {
    format!("{e:?}")
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect()
}

/// Run one case; `Err` describes the mismatch.
fn run_case(case: &Value) -> Result<(), String> {
    let op = string(case, "op");
    let params = &case["params"];
    /// Closes the case's manager even when the case panics.
    struct Closing(NDManager);
    impl Drop for Closing {
        fn drop(&mut self) {
            self.0.close();
        }
    }
    let m = Closing(NDManager::new());
    let m = &m.0;
    (|| {
        let raw = case["inputs"].as_array().expect("inputs is a list");
        let leaves: Vec<NDArray> = raw.iter().map(|v| create(m, &spec(v))).collect();
        let grad = case.get("grad").filter(|g| !g.is_null());
        let mut tracked = Vec::new();
        if let Some(g) = grad {
            for (i, want) in g["inputs"]
                .as_array()
                .expect("grad inputs")
                .iter()
                .enumerate()
            {
                if !want.is_null() {
                    leaves[i].set_requires_gradient(true);
                    tracked.push((i, spec(want)));
                }
            }
        }
        let collector = grad.map(|_| GradientCollector::new());
        // Views (`get`, `permute`) come after the collector starts, so they are recorded
        // and the gradient reaches the leaf.
        let inputs: Vec<NDArray> = raw
            .iter()
            .zip(&leaves)
            .map(|(v, &leaf)| {
                let mut a = leaf;
                if let Some(view) = v.get("view") {
                    a = a.get(view.as_str().expect("view is a string"));
                }
                if v.get("perm").is_some() {
                    a = a.permute(&usizes(v, "perm"));
                }
                a
            })
            .collect();
        let expected = &case["expected"];
        let out = apply(op, params, &inputs);
        // Inputs an op writes into in place (batch_norm's running statistics), as
        // their leaves must read afterwards; also checked when the op fails.
        let check_after = || -> Result<(), String> {
            let Some(after) = case.get("after").and_then(Value::as_array) else {
                return Ok(());
            };
            for (i, want) in after.iter().enumerate() {
                if !want.is_null() {
                    let got = read(leaves[i]).map_err(|e| e.to_string())?;
                    compare(&format!("input {i} after the op"), &got, &spec(want), case)?;
                }
            }
            Ok(())
        };
        if let Some(want) = expected.get("error") {
            let want = want.as_str().expect("error is a string");
            return match out {
                Err(e) if variant(&e) == want => check_after(),
                Err(e) => Err(format!("expected error {want}, got {e:?}")),
                Ok(a) => Err(format!("expected error {want}, got {a:?}")),
            };
        }
        let out = out.map_err(|e| format!("unexpected error: {e}"))?;
        compare(
            "output",
            &read(out).map_err(|e| e.to_string())?,
            &spec(expected),
            case,
        )?;
        check_after()?;
        if let (Some(g), Some(collector)) = (grad, collector) {
            let r = create(m, &spec(&g["r"]));
            let loss = out
                .try_mul(r)
                .and_then(|p| p.try_sum())
                .map_err(|e| format!("loss: {e}"))?;
            collector
                .backward(loss)
                .map_err(|e| format!("backward: {e}"))?;
            for (i, want) in &tracked {
                let got = leaves[*i]
                    .try_gradient()
                    .and_then(read)
                    .map_err(|e| format!("gradient of input {i}: {e}"))?;
                compare(&format!("gradient of input {i}"), &got, want, case)?;
            }
        }
        Ok(())
    })()
}

#[test]
fn numpy_fixtures() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ops");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    files.sort();
    let known: BTreeMap<&str, &str> = KNOWN_FAILURES.iter().copied().collect();
    let is_known = |id: &str| {
        known
            .keys()
            .find(|k| **k == id || (k.ends_with('/') && id.starts_with(**k)))
            .copied()
    };
    let (mut total, mut failures, mut now_passing) = (0, Vec::new(), Vec::new());
    let mut known_seen = std::collections::BTreeSet::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let doc: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{}: not valid JSON: {e}", file.display()));
        for case in doc["cases"].as_array().expect("cases is a list") {
            total += 1;
            let id = string(case, "id");
            let outcome = match catch_unwind(AssertUnwindSafe(|| run_case(case))) {
                Ok(r) => r,
                Err(payload) => Err(format!(
                    "panicked: {}",
                    payload
                        .downcast_ref::<String>()
                        .cloned()
                        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                        .unwrap_or_default()
                )),
            };
            match (outcome, is_known(id)) {
                (Err(_), Some(k)) => {
                    known_seen.insert(k);
                }
                (Err(msg), None) => failures.push(format!("{id}: {msg}")),
                (Ok(()), Some(k)) => now_passing.push(format!("{id} (listed as {k})")),
                (Ok(()), None) => {}
            }
        }
    }
    let stale: Vec<_> = known
        .keys()
        .filter(|k| !known_seen.contains(*k))
        .map(|k| k.to_string())
        .collect();
    assert!(
        total >= MIN_CASES,
        "only {total} fixture cases in {}",
        dir.display()
    );
    assert!(
        failures.is_empty() && now_passing.is_empty() && stale.is_empty(),
        "{} of {total} fixture cases failed (fixtures: scripts/gen_fixtures.py; a known ndscope bug goes in KNOWN_FAILURES):\n{}\
         \nKNOWN_FAILURES entries that now pass (remove them): {:?}\
         \nKNOWN_FAILURES entries that match no failing case: {:?}",
        failures.len(),
        failures.join("\n"),
        now_passing,
        stale
    );
}
