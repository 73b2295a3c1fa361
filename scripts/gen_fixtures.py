#!/usr/bin/env python3
"""Generate the numpy reference fixtures in tests/fixtures/ops/*.json.

Run from anywhere: `python3 scripts/gen_fixtures.py` (needs numpy; written against
numpy 2.4). The output is deterministic (every family has its own seeded generator),
so regenerating without changing this script reproduces the committed files byte for
byte. `tests/ops/fixtures.rs` (part of `cargo test --test ops`) reads the committed
files; CI needs no Python.

Where the reference values come from
------------------------------------
* Outputs: numpy. Float ops are computed in float64 from the (f32 or f64) inputs and
  rounded once to the output dtype, so an f32 expectation is the correctly rounded
  true value and the runner allows f32 rounding (rtol/atol 1e-5; f64: 1e-12). Integer
  ops are computed in the array's own dtype with wrapping, exactly.
* Gradients: PyTorch could not be installed here (PyPI's Linux wheel pulls ~3 GB of
  CUDA packages, and the CPU-only index is unreachable from this machine), so the
  expected gradient of `sum(out * r)` (r random, of the output's shape) with respect to
  each float input is computed with numpy by *complex-step differentiation* in float64:
  d/dx_j sum(f(x) * r) = Im(sum(f(x + i*h*e_j) * r)) / h with h = 1e-30. Unlike finite
  differences this has no cancellation error, so it is exact to float64 rounding; each
  op's numpy function is written to be complex-safe for that (comparisons and
  selections use the real part, see `cmax`, `cabs`, `crelu`). Every gradient is also
  cross-checked against central differences (eps 1e-6) before it is written, and
  generation stops on a disagreement; cases with a kink on purpose (e.g. clip at a
  bound) say `fd_check=False`. Gradients at kinks follow PyTorch's conventions
  (relu'(0) = 0, abs'(0) = 0, clip's gradient is 1 at the bounds, max/min reductions
  share the gradient among ties), which ndscope documents.

Where the fixtures follow ndscope's documented semantics instead of numpy's
----------------------------------------------------------------------------
* Integer `div` truncates toward zero and gives 0 on division by zero (Rust's
  `wrapping_div`; PyTorch's `div(rounding_mode='trunc')`); numpy's `/` gives floats.
* Integer `pow` with a negative exponent gives 1 / x^n truncated toward zero (1 for
  a base of 1, +-1 for a base of -1, 0 otherwise; PyTorch's integer semantics); numpy
  raises.
* A scalar right-hand side takes the array's dtype (`int_array * 2.5` multiplies by
  2; floats to integers truncate and saturate as Rust's `as`; integers wrap).
  Comparisons of integer and Bool arrays with a scalar compare as numbers (as numpy).
* `maximum`/`minimum` give the gradient of a tie to the left operand (PyTorch
  splits it); the generated gradient cases contain no ties.
* `max`/`min`/`argmax`/`argmin` over a zero-length axis are an error only when the
  result is not empty (numpy raises even for an empty result, e.g. `zeros((0, 0))`
  reduced over axis 0).
* `mean` of an integer array gives f64 (as numpy); `sum`/`prod` of integer arrays
  keep the dtype and wrap (numpy promotes to int64).
* `clip` on an integer array rounds the bounds inward; `to_dtype` from a float to an
  integer truncates toward zero (only in-range values are generated: numpy's
  out-of-range float casts are undefined).
* `broadcast_to` copies (numpy gives a read-only view); values are the same.
* `dot` of N-D operands follows `matmul` (batched), not numpy's tensor `dot`.

The ops of issue 11 (files gather, logical, stats, unary_fn, shape_ops, conv, nn_ops)
follow PyTorch where numpy has no such op (gather, scatter_add, conv2d, the pools,
layer_norm, batch_norm, embedding, the losses; their numpy references are written out
below, e.g. `conv2d_fwd`, `pool_windows`, `batch_norm_after`), and differ from numpy or
PyTorch where ndscope documents it:
* Index arrays (index_select, gather, scatter_add, take, embedding, cross_entropy's
  labels, one_hot's input) may be I32, I64 or U8; a negative index is an `Index` error,
  not counted from the end; float or Bool indices are `UnsupportedDType`.
* `index_select` takes an index of any shape (numpy's `take(x, i, axis)`: a 0-d index
  removes the axis); PyTorch's takes only 1-D indices.
* `boolean_mask` takes a mask of the whole shape or of a leading part (whole rows); a
  0-d mask is an error (numpy's `x[True]` adds an axis).
* `masked_fill`, `pad` and `full_like` store their float value in the array's dtype:
  floats round, integers truncate toward zero and saturate (Rust's `as`), Bool stores
  `value != 0` (so NaN is true); NaN or an infinity into an integer array is
  `InvalidArgument` (numpy's casts are undefined there).
* `scatter_add` and `cumsum` on integer arrays keep the dtype and wrap (numpy's
  `cumsum` widens I32 and U8 to 64 bits); `cumsum` of Bool is `UnsupportedDType`.
* `var`/`std` are the population statistics (numpy's default `ddof=0`; PyTorch's
  default is unbiased). `var`, `std`, `logsumexp` and `norm` take float arrays only
  (integers are `UnsupportedDType`; numpy converts). `std`'s gradient where the result
  is 0 is 0 (PyTorch: NaN); `norm`'s gradient at 0 is 0; `norm` rescales, so
  `[1e200, 1e200]` gives 1.414e200 (numpy: inf). An empty `var`/`std` is NaN, an
  empty `logsumexp` -inf, an empty `norm` 0. `var_axes(&[])` (and std) reduces nothing
  and gives zeros; `any_axes`/`all_axes(&[])` reduce nothing (numpy's `axis=()`).
* `gelu(-inf)` and `silu(-inf)` are 0, the limits (the formulas give NaN); gelu is
  the exact erf form; `softplus` is exact everywhere (PyTorch returns x above 20).
  `leaky_relu`'s gradient at 0 is alpha (as PyTorch); a non-finite alpha is
  `InvalidArgument`. `reciprocal` of integers is `UnsupportedDType` (numpy's integer
  reciprocal truncates). `round` is half to even (numpy's and PyTorch's).
  `floor`/`ceil`/`round` of integers return them unchanged, `sign` gives -1/0/1 in the
  dtype; these four are not differentiable (not recorded), so they get no gradient
  cases; neither do `zeros_like`/`ones_like`/`full_like` or the logical ops.
* `split(sections, axis)` makes equal parts only (an indivisible axis is
  `InvalidArgument`; numpy's `array_split` makes unequal ones). The runner compares
  the parts stacked along a new axis 0.
* `flip(&[])` flips nothing (numpy's `flip(x, axis=None)` flips every axis).
* `tril`/`triu` of fewer than 2 dims is `InvalidShape` (numpy treats 1-D as a row).
* `max_pool2d`: padding acts as -inf, at most half the kernel (PyTorch's rule), NaN
  propagates, and the gradient goes to each window's first maximum (PyTorch's too).
  `avg_pool2d` counts the padding (PyTorch's default `count_include_pad=True`).
* `layer_norm(axes, gamma, beta, eps)` normalises over any axes, and gamma/beta
  broadcast to the input (PyTorch's `normalized_shape` is the trailing axes).
* `batch_norm` in training updates its running statistics in place (PyTorch's rule:
  momentum-weighted, unbiased variance for `running_var`); the case records their
  expected values after the op (`after`, below), and a failing call must leave them
  unchanged. An empty batch gives an empty result and leaves them unchanged; one value
  per channel in training is `InvalidArgument` (PyTorch raises too).
* `cross_entropy` (mean over the batch; an empty batch gives NaN) has no
  `ignore_index`; `mse_loss` and `binary_cross_entropy_with_logits` need equal shapes
  (PyTorch broadcasts with a warning; here it is `ShapeMismatch`); an empty input
  gives NaN.
* `one_hot(depth, dtype)` returns the dtype asked for (PyTorch: always int64).
* A zero-size input that is a view at a non-zero offset (`zero_view`) is tried on
  every family: the old map kernels panicked there.

The random ops (`dropout`, `NDManager::random_permutation`, `random_bernoulli`) have no
fixtures: their values depend on ndscope's generator, not on numpy's; they are tested
by their statistical properties and seeding in tests/ops/index.rs (and the dropout
kernel by unit tests in src/array/dropout.rs).

The case format (one JSON file per op family)
---------------------------------------------
    {"family": "binary", "cases": [case, ...]}
    case = {
      "id": "binary/add/f32/007",      # unique; KNOWN_FAILURES in the runner names it
      "op": "add",                     # the runner's match arm
      "params": {"scalar": 2.5, ...},  # op parameters (axes, index strings, ...)
      "inputs": [array, ...],          # an array may add "view"/"perm" (below)
      "expected": array | {"error": "ShapeMismatch"},   # NdError variant name
      "grad": null | {"r": array, "inputs": [array | null, ...]},
      "after": [array | null, ...]     # optional: inputs written in place (below)
    }
    array = {"shape": [2, 3], "dtype": "f32", "data": [flat row-major values]}
Float data (and float params, e.g. a fill value or eps) may hold the strings "nan",
"inf", "-inf"; Bool data is true/false. `after[i]`, where present, is what input i's
base must hold after the op (batch_norm's running statistics), checked also when the
case expects an error (then: unchanged).
An input with "view": "1:, ::-1" is `base.get(view)` and with "perm": [1, 0] then
`.permute(perm)`: a non-contiguous (or offset zero-size) input. Gradients are with
respect to the base array (the leaf the runner creates), so they have its shape.

How to add an op
----------------
1. Here, one entry in `OPS` (below the op helpers), e.g. (as the ops of issue 11 were)
       OPS["var"] = Op(lambda xs, p, d: cvar(xs[0], p))
       OPS["gather"] = Op(lambda xs, p, d: np.take_along_axis(xs[0], xs[1], p["axis"]))
       OPS["erf"] = Op(lambda xs, p, d: np.vectorize(math.erf)(xs[0]), complex_safe=False)
   `fwd(xs, p, dtypes)` gets the effective inputs (float inputs as float64, or as
   complex128 while gradients are computed; integer and Bool inputs in their own
   dtype), the params dict and the input dtype names, and returns the result. For a
   differentiable op it should be complex-safe: compare and select on `.real`
   (`cmaximum`, `cabs`, `crelu`, `cextreme` show how), never np.abs/np.maximum/np.max
   of a complex array; if it cannot be (math.erf), say `complex_safe=False`. Give
   `out=fixed("i64")` or `out=same_as(1)` when the output dtype is not the first
   input's; `grad=False` for a non-differentiable op; `nograd=(1, 2)` for float inputs
   that get no gradient, and `after=` for an op that writes into inputs (batch_norm). An op returning several arrays
   (`split`) is compared stacked: numpy `np.stack(np.split(...))`, runner
   `NDArray::try_stack(&parts, 0)`. Random ops (dropout) do not belong here.
   Then the cases, in an existing `gen_<family>()` or a new one added to `FAMILIES`
   (its own JSON file and seed, so the other files do not change):
       f.add("var", [f.input((3, 4), "f64")], {"axes": [-1], "keep_dims": True})
       f.add("gather", [f.input((3, 4), "f32"), arr([[0], [3], [1]], "i64")], {"axis": 1})
       f.error("gather", [...], {"axis": 1}, "Index")      # the NdError variant
   `f.input` makes random values, sometimes as a non-contiguous view (`fill=` gives
   other values, e.g. `index_fill` for valid indices); `arr` exact values; `zero_view`
   a zero-size view at a non-zero offset. A float output gets a gradient case unless `grad=False`; `tol=(rtol, atol)`
   loosens the comparison; `fd_check=False` skips the central-difference cross-check
   where a case sits on a kink on purpose.
2. In tests/ops/fixtures.rs, one match arm in `apply`, e.g.
       "var" => match axes(p) {
           None => x[0].try_var(),
           Some(a) => x[0].try_var_axes(&a, keep_dims(p)),
       },
       "gather" => x[0].try_gather(int(p, "axis") as isize, x[1]),
   (helpers for params: `int`, `float`, `string`, `usizes`, `isizes`, `axes`,
   `keep_dims`, `rhs`).
3. `python3 scripts/gen_fixtures.py && cargo test --test ops fixtures`, and commit the
   JSON. Keep the files under ~3 MB in all (small shapes; this script prints sizes).
   `python3 scripts/gen_fixtures.py stats conv` writes only those families.
   A case that finds an ndscope bug stays; list its id in `KNOWN_FAILURES` in the
   runner with the reason until the bug is fixed.
"""

import json
import math
import os
import sys

import numpy as np

OUT_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "fixtures", "ops")

NP = {
    "f32": np.float32,
    "f64": np.float64,
    "i32": np.int32,
    "i64": np.int64,
    "u8": np.uint8,
    "bool": np.bool_,
}
FLOATS = ["f32", "f64"]
INTS = ["i32", "i64", "u8"]
ALL = FLOATS + INTS + ["bool"]
NUMERIC = FLOATS + INTS
H = 1e-30  # complex step


# --------------------------------------------------------------------------------------
# Arrays and their JSON encoding


class Arr:
    """An input: a base array (what the runner creates) and an optional view of it."""

    def __init__(self, base, dtype, view=None, perm=None):
        self.dtype = dtype
        self.base = base
        self.view = view
        self.perm = perm

    @property
    def base(self):
        return self._base

    @base.setter
    def base(self, values):
        self._base = np.array(values).astype(NP[self.dtype])  # always an ndarray

    def effective(self, base=None):
        b = self.base if base is None else base
        if self.view is not None:
            b = b[np_index(self.view)]
        b = np.asarray(b)
        if self.perm is not None:
            b = np.transpose(b, self.perm)
        return b


def arr(values, dtype, view=None, perm=None):
    return Arr(values, dtype, view, perm)


def enc_value(v, dtype):
    if dtype == "bool":
        return bool(v)
    if dtype in INTS:
        return int(v)
    f = float(v)
    if math.isnan(f):
        return "nan"
    if math.isinf(f):
        return "inf" if f > 0 else "-inf"
    if dtype == "f32":
        s = str(np.float32(v))
        # The runner parses an f64 and rounds it to f32: make sure that gives v back.
        assert np.float32(float(s)) == np.float32(v), (s, v)
        out = json.loads(s)
        return out
    return f  # json writes the shortest repr that round-trips


def enc_array(a, dtype):
    a = np.asarray(a)
    return {
        "shape": list(a.shape),
        "dtype": dtype,
        "data": [enc_value(v, dtype) for v in a.reshape(-1)],
    }


def enc_params(p):
    """Params for JSON: non-finite floats (a NaN fill value, an infinite eps) as the
    strings "nan", "inf", "-inf", which the runner's `float` reads back."""
    if isinstance(p, dict):
        return {k: enc_params(v) for k, v in p.items()}
    if isinstance(p, (list, tuple)):
        return [enc_params(v) for v in p]
    if isinstance(p, float) and not math.isfinite(p):
        return "nan" if math.isnan(p) else ("inf" if p > 0 else "-inf")
    return p


def enc_input(x):
    d = enc_array(x.base, x.dtype)
    if x.view is not None:
        d["view"] = x.view
    if x.perm is not None:
        d["perm"] = list(x.perm)
    return d


# --------------------------------------------------------------------------------------
# Index strings (src/array/index.rs grammar) to numpy basic indexing


def np_index(s):
    s = s.strip()
    if not s:
        return ()
    parts = [p.strip() for p in s.split(",")]
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()
    items = []
    for p in parts:
        if p == "...":
            items.append(Ellipsis)
        elif ":" in p:
            b = [q.strip() for q in p.split(":")]
            conv = [int(q) if q else None for q in b] + [None] * (3 - len(b))
            items.append(slice(*conv))
        else:
            items.append(int(p))
    return tuple(items)


# --------------------------------------------------------------------------------------
# Complex-safe numpy helpers (differentiable by complex step)


def cmaximum(a, b):
    if np.iscomplexobj(a) or np.iscomplexobj(b):
        return np.where(np.real(a) >= np.real(b), a, b)
    return np.maximum(a, b)


def cminimum(a, b):
    if np.iscomplexobj(a) or np.iscomplexobj(b):
        return np.where(np.real(a) <= np.real(b), a, b)
    return np.minimum(a, b)


def cabs(x):
    if np.iscomplexobj(x):
        return np.where(x.real > 0, x, np.where(x.real < 0, -x, 0 * x))
    return np.abs(x)


def crelu(x):
    if np.iscomplexobj(x):
        return np.where(x.real > 0, x, 0 * x)
    return np.maximum(x, np.zeros((), x.dtype))  # NaN propagates


def csigmoid(x):
    if np.iscomplexobj(x):
        return 0.5 * (1.0 + np.tanh(x / 2))  # no overflow to inf * 0 in the imaginary part
    return 1.0 / (1.0 + np.exp(-x))


def ax_tuple(p, nd):
    if p.get("axes") is None:
        return tuple(range(nd))
    return tuple(a % nd for a in p["axes"])


def cextreme(x, p, is_max):
    """max/min over p["axes"]; ties share the gradient (as PyTorch's amax)."""
    axes = ax_tuple(p, x.ndim)
    keep = p.get("keep_dims", False)
    re = np.real(x)
    if re.size == 0:
        shape = [1 if i in axes else n for i, n in enumerate(x.shape)] if keep else [
            n for i, n in enumerate(x.shape) if i not in axes
        ]
        return np.zeros(shape, dtype=x.dtype)
    m = (np.max if is_max else np.min)(re, axis=axes, keepdims=True)
    if not np.iscomplexobj(x):
        return np.squeeze(m, axis=axes) if not keep else m
    mask = re == m
    count = np.sum(mask, axis=axes, keepdims=True)
    out = m + np.sum(np.where(mask, x - m, 0), axis=axes, keepdims=True) / count
    return out if keep else np.squeeze(out, axis=axes)


def softmax(x, axis, log):
    if x.size == 0:
        return x.copy()
    m = np.max(np.real(x), axis=axis, keepdims=True)
    z = x - m
    s = np.sum(np.exp(z), axis=axis, keepdims=True)
    return z - np.log(s) if log else np.exp(z) / s


# --------------------------------------------------------------------------------------
# Integer semantics (Rust wrapping arithmetic)

BITS = {"i32": 32, "i64": 64, "u8": 8, "bool": 8}


def wrap(v, dtype):
    bits = BITS[dtype]
    v &= (1 << bits) - 1
    if dtype in ("i32", "i64") and v >= 1 << (bits - 1):
        v -= 1 << bits
    return v


def int_div(a, b, dtype):
    if b == 0:
        return 0
    q = abs(a) // abs(b)
    if (a < 0) != (b < 0):
        q = -q
    return wrap(q, dtype)


def int_pow(a, e, dtype):
    if e < 0:
        if a == 1:
            return 1
        if a == -1:
            return 1 if e % 2 == 0 else -1
        return 0
    return wrap(pow(a, e, 1 << BITS[dtype]), dtype)


def elementwise_int(f, a, b, dtype):
    a, b = np.broadcast_arrays(a, b)
    out = np.empty(a.shape, dtype=object)
    for i in np.ndindex(a.shape):
        out[i] = f(int(a[i]), int(b[i]), dtype)
    return out


def rust_as_int(v, dtype):
    """Rust's `f64 as iN/u8`: truncate, saturate, NaN to 0."""
    if math.isnan(v):
        return 0
    lo, hi = {"i32": (-(2**31), 2**31 - 1), "i64": (-(2**63), 2**63 - 1), "u8": (0, 255)}[dtype]
    if math.isinf(v):
        return hi if v > 0 else lo
    return max(lo, min(hi, int(v)))


def scalar_as(s, dtype):
    """A scalar right-hand side converted to the array's dtype (ScalarValue::cast)."""
    if dtype in FLOATS:
        return np.float64(NP[dtype](s))
    if isinstance(s, float):
        return NP[dtype](rust_as_int(s, dtype))
    return NP[dtype](wrap(s, dtype))


# --------------------------------------------------------------------------------------
# Ops: the numpy forward of every op ndscope has, by the runner's names


class Op:
    """An op's numpy reference: `fwd(xs, p, dtypes)` gives its result, `out(dtypes, p)`
    its dtype name; `grad`: differentiable (gradient cases for float outputs);
    `complex_safe=False` when `fwd` cannot run on complex inputs (e.g. it needs
    `math.erf`): gradients then come from a 5-point central difference (h = 1e-3,
    error about 1e-12 on smooth functions) and its cases carry `tol` 1e-8 (the
    runner's floor for rtol and atol). `nograd`: indices of float inputs that get no
    gradient (batch_norm's running statistics; the runner does not track them).
    `after(xs, p, dtypes)`: for an op that writes into some inputs in place, a dict
    {input index: the new values of that (effective) input}; the case then records
    each such input's base after the op, and the runner compares it."""

    def __init__(self, fwd, out=None, grad=True, complex_safe=True, nograd=(), after=None):
        self.fwd = fwd
        self.out = out or same
        self.grad = grad
        self.complex_safe = complex_safe
        self.nograd = tuple(nograd)
        self.after = after


def same(dtypes, p):
    return dtypes[0]


def same_as(i):
    return lambda dtypes, p: dtypes[i]


def fixed(d):
    return lambda dtypes, p: d


def binary_fwd(name):
    def f(xs, p, dtypes):
        d = dtypes[0]
        a = xs[0]
        if "scalar" in p:
            b = scalar_as(p["scalar"], d)
            if p.get("scalar_left"):
                a, b = b, a
        else:
            b = xs[1]
        if d in INTS:
            if name == "div":
                return elementwise_int(int_div, a, b, d)
            if name == "pow":
                return elementwise_int(int_pow, a, b, d)
            a64, b64 = np.asarray(a).astype(object), np.asarray(b).astype(object)
            r = {
                "add": lambda: a64 + b64,
                "sub": lambda: a64 - b64,
                "mul": lambda: a64 * b64,
                "maximum": lambda: np.maximum(a64, b64),
                "minimum": lambda: np.minimum(a64, b64),
            }[name]()
            return np.vectorize(lambda v: wrap(int(v), d), otypes=[object])(r)
        return {
            "add": lambda: a + b,
            "sub": lambda: a - b,
            "mul": lambda: a * b,
            "div": lambda: a / b,
            "pow": lambda: np.power(a, b),
            "maximum": lambda: cmaximum(a, b),
            "minimum": lambda: cminimum(a, b),
        }[name]()

    return f


def compare_fwd(name):
    fn = {
        "eq": lambda a, b: a == b,
        "ne": lambda a, b: a != b,
        "gt": lambda a, b: a > b,
        "ge": lambda a, b: a >= b,
        "lt": lambda a, b: a < b,
        "le": lambda a, b: a <= b,
    }[name]

    def f(xs, p, dtypes):
        d = dtypes[0]
        a = xs[0]
        if "scalar" not in p:
            return fn(a, xs[1])
        s = p["scalar"]
        if d in FLOATS:
            return fn(a, scalar_as(s, d))
        # Integer and Bool arrays compare as numbers: an int scalar exactly, a float
        # scalar against the element converted to f64.
        if isinstance(s, int):
            return np.vectorize(lambda v: fn(int(v), s), otypes=[bool])(a)
        return np.vectorize(lambda v: fn(float(int(v)), s), otypes=[bool])(a)

    return f


def unary_fwd(name):
    def f(xs, p, dtypes):
        x = xs[0]
        if dtypes[0] in INTS:
            o = np.asarray(x).astype(object)
            r = {
                "abs": lambda: np.abs(o),
                "neg": lambda: -o,
                "square": lambda: o * o,
                "relu": lambda: np.maximum(o, 0),
            }[name]()
            return np.vectorize(lambda v: wrap(int(v), dtypes[0]), otypes=[object])(r)
        return {
            "abs": lambda: cabs(x),
            "neg": lambda: -x,
            "square": lambda: x * x,
            "relu": lambda: crelu(x),
            "exp": lambda: np.exp(x),
            "log": lambda: np.log(x),
            "sqrt": lambda: np.sqrt(x),
            "sin": lambda: np.sin(x),
            "cos": lambda: np.cos(x),
            "tanh": lambda: np.tanh(x),
            "sigmoid": lambda: csigmoid(x),
        }[name]()

    return f


def reduce_fwd(name):
    def f(xs, p, dtypes):
        x, d = xs[0], dtypes[0]
        axes = ax_tuple(p, x.ndim)
        keep = p.get("keep_dims", False)
        if name in ("max", "min"):
            return cextreme(x, p, name == "max")
        if d in INTS:
            if name == "mean":
                n = int(np.prod([x.shape[a] for a in axes]))
                s = np.sum(x.astype(np.float64), axis=axes, keepdims=keep)
                return s / n if n else s * np.nan
            o = x.astype(object)
            r = (np.sum if name == "sum" else np.prod)(o, axis=axes, keepdims=keep)
            # (an empty sum is 0 and an empty product 1, as in ndscope)
            r = np.asarray(r, dtype=object)
            if r.size == 0:
                return r
            return np.vectorize(lambda v: wrap(int(v), d), otypes=[object])(r)
        if name == "sum":
            return np.sum(x, axis=axes, keepdims=keep)
        if name == "prod":
            return np.prod(x, axis=axes, keepdims=keep)
        n = int(np.prod([x.shape[a] for a in axes]))
        s = np.sum(x, axis=axes, keepdims=keep)
        return s / n if n else s * np.nan

    return f


def arg_fwd(is_max):
    def f(xs, p, dtypes):
        x = xs[0]
        fn = np.argmax if is_max else np.argmin
        if x.dtype == np.bool_:
            x = x.astype(np.int64)
        if "axis" in p:
            return fn(x, axis=p["axis"], keepdims=p.get("keep_dims", False))
        return np.asarray(fn(x))

    return f


def matmul_fwd(dot):
    def f(xs, p, dtypes):
        a, b = xs
        if dtypes[0] in INTS:
            # Accumulating in int64 and wrapping at the end equals wrapping at each
            # step (modular arithmetic); the generated values cannot overflow int64.
            a, b = a.astype(np.int64), b.astype(np.int64)
        r = a * b if dot and (a.ndim == 0 or b.ndim == 0) else np.matmul(a, b)
        if dtypes[0] in INTS:
            return np.vectorize(lambda v: wrap(int(v), dtypes[0]), otypes=[object])(np.asarray(r))
        return r

    return f


def clip_fwd(xs, p, dtypes):
    x, d = xs[0], dtypes[0]
    lo, hi = p["min"], p["max"]
    if d in INTS:
        lo, hi = rust_as_int(math.ceil(lo), d), rust_as_int(math.floor(hi), d)
        return np.clip(x, NP[d](lo), NP[d](hi))
    lo, hi = float(NP[d](lo)), float(NP[d](hi))
    if np.iscomplexobj(x):
        inside = (x.real >= lo) & (x.real <= hi)
        return np.where(inside, x, np.clip(x.real, lo, hi))
    return np.clip(x, lo, hi)


def cast_fwd(xs, p, dtypes):
    x, src, dst = xs[0], dtypes[0], p["dtype"]
    if dst == "bool":
        return x != 0
    if dst in FLOATS:
        if src in INTS:
            return np.vectorize(lambda v: float(NP[dst](int(v))), otypes=[np.float64])(x) if x.size else x.astype(np.float64)
        return x if np.iscomplexobj(x) else x.astype(np.float64)
    if src in FLOATS:
        return np.vectorize(lambda v: rust_as_int(float(v), dst), otypes=[object])(x) if x.size else x.astype(object)
    return np.vectorize(lambda v: wrap(int(v), dst), otypes=[object])(x) if x.size else x.astype(object)


def stack_like(fn):
    return lambda xs, p, dtypes: fn(list(xs), axis=p["axis"])


OPS = {}
for _n in ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]:
    OPS[_n] = Op(lambda xs, p, d, _f=binary_fwd(_n): _f(xs, p, d))
for _n in ["eq", "ne", "gt", "ge", "lt", "le"]:
    OPS[_n] = Op(lambda xs, p, d, _f=compare_fwd(_n): _f(xs, p, d), out=fixed("bool"), grad=False)
for _n in ["abs", "neg", "square", "relu", "exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid"]:
    OPS[_n] = Op(lambda xs, p, d, _f=unary_fwd(_n): _f(xs, p, d))
for _n in ["sum", "mean", "max", "min", "prod"]:
    OPS[_n] = Op(lambda xs, p, d, _f=reduce_fwd(_n): _f(xs, p, d))
OPS["mean"].out = lambda dtypes, p: dtypes[0] if dtypes[0] in FLOATS else "f64"
OPS["argmax"] = Op(lambda xs, p, d: arg_fwd(True)(xs, p, d), out=fixed("i64"), grad=False)
OPS["argmin"] = Op(lambda xs, p, d: arg_fwd(False)(xs, p, d), out=fixed("i64"), grad=False)
OPS["matmul"] = Op(lambda xs, p, d: matmul_fwd(False)(xs, p, d))
OPS["dot"] = Op(lambda xs, p, d: matmul_fwd(True)(xs, p, d))
OPS["reshape"] = Op(lambda xs, p, d: np.reshape(xs[0], p["shape"]))
OPS["reshape_infer"] = Op(lambda xs, p, d: np.reshape(xs[0], p["dims"]))
OPS["flatten"] = Op(lambda xs, p, d: np.reshape(xs[0], -1))
OPS["transpose"] = Op(lambda xs, p, d: np.transpose(xs[0]))
OPS["permute"] = Op(lambda xs, p, d: np.transpose(xs[0], p["perm"]))
OPS["squeeze"] = Op(lambda xs, p, d: np.squeeze(xs[0], axis=p.get("axis")))
OPS["expand_dims"] = Op(lambda xs, p, d: np.expand_dims(xs[0], p["axis"]))
OPS["broadcast_to"] = Op(lambda xs, p, d: np.broadcast_to(xs[0], p["shape"]))
OPS["concat"] = Op(stack_like(np.concatenate))
OPS["stack"] = Op(stack_like(np.stack))
OPS["get"] = Op(lambda xs, p, d: np.asarray(xs[0][np_index(p["index"])]))
OPS["softmax"] = Op(lambda xs, p, d: softmax(xs[0], p["axis"], False))
OPS["log_softmax"] = Op(lambda xs, p, d: softmax(xs[0], p["axis"], True))
OPS["clip"] = Op(clip_fwd)
OPS["where"] = Op(lambda xs, p, d: np.where(xs[0], xs[1], xs[2]), out=same_as(1))
OPS["to_dtype"] = Op(cast_fwd, out=lambda dtypes, p: p["dtype"])


# --------------------------------------------------------------------------------------
# Ops of issue 11: indexing, logical, statistics, more unary math, shape, nn


def cast_scalar(v, dtype):
    """A float parameter stored in `dtype` as ndscope does (`fill_value`: floats round,
    integers truncate and saturate as Rust's `as`, Bool is `v != 0`, NaN included)."""
    if dtype == "bool":
        return np.bool_(v != 0)
    if dtype in FLOATS:
        return np.float64(NP[dtype](v))
    return NP[dtype](rust_as_int(v, dtype))


def wrap_array(r, dtype):
    r = np.asarray(r, dtype=object)
    if r.size == 0:
        return r
    return np.vectorize(lambda v: wrap(int(v), dtype), otypes=[object])(r)


def index_grid(idx, ax):
    """numpy fancy indices that read `x[.., idx[i], ..]` at every position i of idx
    (PyTorch's gather/scatter addressing)."""
    grid = list(np.indices(idx.shape, sparse=True))
    grid[ax] = np.asarray(idx).astype(np.int64)
    return tuple(grid)


def gather_fwd(xs, p, d):
    x, idx = xs
    return x[index_grid(idx, p["axis"] % x.ndim)]


def scatter_add_fwd(xs, p, d):
    x, idx, src = xs
    ax = p["axis"] % x.ndim
    out = np.array(x, dtype=np.result_type(x, src), copy=True)
    part = src[tuple(slice(0, n) for n in idx.shape)]
    np.add.at(out, index_grid(idx, ax), part)  # integer dtypes wrap, as in ndscope
    return out


def reduced(x, p, fn, empty_value):
    """`fn(x, axes, keepdims=True)` over `p["axes"]` (all when absent), squeezed unless
    keep_dims; `empty_value` fills the result of an empty reduction."""
    axes = ax_tuple(p, x.ndim)
    keep = p.get("keep_dims", False)
    n = int(np.prod([x.shape[a] for a in axes]))
    kshape = tuple(1 if i in axes else s for i, s in enumerate(x.shape))
    if n == 0:
        r = np.full(kshape, empty_value, dtype=np.float64)
    else:
        r = fn(x, axes, n)
    return r if keep else np.reshape(r, tuple(s for i, s in enumerate(x.shape) if i not in axes))


def var_of(x, axes, n):
    mean = np.sum(x, axis=axes, keepdims=True) / n
    dev = x - mean
    return np.sum(dev * dev, axis=axes, keepdims=True) / n  # complex-safe (no conj)


def csqrt0(v):
    """sqrt with the gradient 0 where the value is 0 (ndscope's std). "0" is below
    1e-40: float64 rounding leaves ~1e-34 for a constant f32 lane, and the complex step
    adds -O(h^2) = -1e-60 to the real part."""
    zero = np.abs(np.real(v)) <= 1e-40
    return np.where(zero, 0 * v, np.sqrt(np.where(zero, 1, v)))


def logsumexp_of(x, axes, n):
    m = np.max(np.real(x), axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0.0)  # all -inf: -inf; +inf: +inf; NaN: NaN
    return np.log(np.sum(np.exp(x - m), axis=axes, keepdims=True)) + m


def cumsum_fwd(xs, p, d):
    x = xs[0]
    if d[0] in INTS:
        if x.size == 0:
            return x
        return wrap_array(np.cumsum(x.astype(object), axis=p["axis"]), d[0])
    return np.cumsum(x, axis=p["axis"])


def norm_fwd(xs, p, d):
    x = xs[0]
    if x.size == 0:
        return np.zeros(())
    re = np.real(x)
    if np.any(np.isnan(re)):
        return np.asarray(np.nan)
    s = float(np.max(np.abs(re)))
    if s == 0:
        return 0 * np.sum(x)  # the gradient at 0 is 0 (a subgradient)
    if math.isinf(s):
        return np.asarray(np.inf)
    y = x / s  # rescaled: no overflow for 1e200 (numpy's norm gives inf)
    return s * np.sqrt(np.sum(y * y))


def gelu1(v):
    if v == -math.inf:
        return 0.0
    return 0.5 * v * math.erfc(-v / math.sqrt(2.0))


def silu_fwd(xs, p, d):
    x = xs[0]
    if np.iscomplexobj(x):
        return x * csigmoid(x)
    return np.where(x == -np.inf, 0.0, x / (1.0 + np.exp(-x)))


def softplus_fwd(xs, p, d):
    x = xs[0]
    if np.iscomplexobj(x):
        return np.where(x.real > 0, x + np.log1p(np.exp(-x)), np.log1p(np.exp(x)))
    return np.maximum(x, 0.0) + np.log1p(np.exp(-np.abs(x)))


def leaky_relu_fwd(xs, p, d):
    x = xs[0]
    a = cast_scalar(p["alpha"], d[0])
    return np.where(np.real(x) > 0, x, a * x)


def rounding_fwd(fn):
    def f(xs, p, d):
        x = xs[0]
        if d[0] in INTS:
            return np.sign(x) if fn is np.sign else x.copy()
        return fn(x)

    return f


def flip_fwd(xs, p, d):
    x = xs[0]
    return np.flip(x, axis=tuple(p["axes"])) if p["axes"] else x.copy()


def pad_fwd(xs, p, d):
    x = xs[0]
    if x.ndim == 0:
        return x.copy()
    return np.pad(x, [tuple(w) for w in p["widths"]], mode="constant", constant_values=cast_scalar(p["value"], d[0]))


def conv2d_fwd(xs, p, d):
    """Cross-correlation with zero padding, stride, dilation and groups (PyTorch's
    conv2d), one einsum per kernel position and group."""
    x, w = xs[0], xs[1]
    b = xs[2] if len(xs) > 2 else None
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    (sh, sw), (ph, pw), (dh, dw), g = p["stride"], p["padding"], p["dilation"], p["groups"]
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    dt = np.result_type(x, w, *([] if b is None else [b]))
    xp = np.zeros((n, c, h + 2 * ph, wd + 2 * pw), dtype=dt)
    xp[:, :, ph : ph + h, pw : pw + wd] = x
    out = np.zeros((n, o, oh, ow), dtype=dt)
    og = o // g
    for i in range(kh):
        for j in range(kw):
            patch = xp[:, :, i * dh : i * dh + sh * (oh - 1) + 1 : sh, j * dw : j * dw + sw * (ow - 1) + 1 : sw]
            for gi in range(g):
                out[:, gi * og : (gi + 1) * og] += np.einsum(
                    "nchw,oc->nohw", patch[:, gi * cg : (gi + 1) * cg], w[gi * og : (gi + 1) * og, :, i, j]
                )
    if b is not None:
        out = out + b[None, :, None, None]
    return out


def pool_windows(x, p, fill):
    """[..., oh, ow, kh*kw]: every window of the padded input, kernel rows first."""
    kh, kw = p["kernel"]
    sh, sw = p["stride"]
    ph, pw = p["padding"]
    h, w = x.shape[-2:]
    oh, ow = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    xp = np.full(x.shape[:-2] + (h + 2 * ph, w + 2 * pw), fill, dtype=x.dtype)
    xp[..., ph : ph + h, pw : pw + w] = x
    wins = [xp[..., i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw] for i in range(kh) for j in range(kw)]
    return np.stack(wins, axis=-1)


def max_pool_fwd(xs, p, d):
    wins = pool_windows(xs[0], p, -np.inf)
    # The first maximum of each window (np.argmax: the first NaN wins, so NaN
    # propagates); selecting on the real part keeps it complex-safe.
    k = np.argmax(np.real(wins), axis=-1) if wins.shape[-1] and wins.size else np.zeros(wins.shape[:-1], dtype=np.int64)
    return np.take_along_axis(wins, k[..., None], axis=-1)[..., 0]


def avg_pool_fwd(xs, p, d):
    wins = pool_windows(xs[0], p, 0.0)
    kh, kw = p["kernel"]
    return np.sum(wins, axis=-1) / (kh * kw)


def layer_norm_fwd(xs, p, d):
    x = xs[0]
    rest = list(xs[1:])
    gamma = rest.pop(0) if p["gamma"] else None
    beta = rest.pop(0) if p["beta"] else None
    axes = tuple(a % x.ndim for a in p["axes"])
    n = int(np.prod([x.shape[a] for a in axes]))
    if n == 0:
        y = x.copy()
    else:
        mean = np.sum(x, axis=axes, keepdims=True) / n
        y = (x - mean) / np.sqrt(var_of(x, axes, n) + p["eps"])
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def bn_stats(x):
    """Per-channel batch mean and biased variance of [N, C, ...] (axis 1), shaped [C]."""
    axes = tuple(a for a in range(x.ndim) if a != 1)
    n = int(np.prod([x.shape[a] for a in axes]))
    if n == 0:
        z = np.zeros(x.shape[1])
        return z, z, 0
    mean = np.sum(x, axis=axes) / n
    return mean, var_of(x, axes, n).reshape(-1), n


def batch_norm_fwd(xs, p, d):
    x, rm, rv = xs[:3]
    rest = list(xs[3:])
    gamma = rest.pop(0) if p["gamma"] else None
    beta = rest.pop(0) if p["beta"] else None
    shape = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    if p["training"]:
        mean, var, n = bn_stats(x)
    else:
        mean, var = rm, rv
    y = (x - mean.reshape(shape)) / np.sqrt(var.reshape(shape) + p["eps"])
    if gamma is not None:
        y = y * gamma.reshape(shape)
    if beta is not None:
        y = y + beta.reshape(shape)
    return y


def batch_norm_after(xs, p, d):
    """Training updates the running statistics in place (PyTorch's rule, unbiased
    variance); inference and a batch with no elements leave them unchanged."""
    x, rm, rv = xs[:3]
    if not p["training"]:
        return {}
    mean, var, n = bn_stats(x)
    if n <= 1:
        return {}
    mom = p["momentum"]
    return {1: (1 - mom) * rm + mom * mean, 2: (1 - mom) * rv + mom * var * n / (n - 1)}


def cross_entropy_fwd(xs, p, d):
    x, y = xs
    n = x.shape[0]
    if n == 0:
        return np.asarray(np.nan)
    lse = logsumexp_of(x, (1,), x.shape[1]).reshape(-1)
    return np.sum(lse - x[np.arange(n), y.astype(np.int64)]) / n


def mse_fwd(xs, p, d):
    x, t = xs
    if x.size == 0:
        return np.asarray(np.nan)
    return np.sum((x - t) * (x - t)) / x.size


def bce_fwd(xs, p, d):
    x, t = xs
    if x.size == 0:
        return np.asarray(np.nan)
    if np.iscomplexobj(x):
        e = np.where(x.real > 0, x - x * t + np.log1p(np.exp(-x)), -x * t + np.log1p(np.exp(x)))
    else:
        e = np.maximum(x, 0.0) - x * t + np.log1p(np.exp(-np.abs(x)))
    return np.sum(e) / x.size


def one_hot_fwd(xs, p, d):
    idx = np.asarray(xs[0]).astype(np.int64)
    out = np.zeros(idx.shape + (p["depth"],), dtype=np.int64)
    if idx.size:
        np.put_along_axis(out, idx[..., None], 1, axis=-1)
    return out


OPS["index_select"] = Op(lambda xs, p, d: np.take(xs[0], xs[1].astype(np.int64), axis=p["axis"] % xs[0].ndim))
OPS["gather"] = Op(gather_fwd)
OPS["scatter_add"] = Op(scatter_add_fwd)
OPS["take"] = Op(lambda xs, p, d: np.take(xs[0].reshape(-1), xs[1].astype(np.int64)))
OPS["boolean_mask"] = Op(lambda xs, p, d: xs[0][xs[1]])
OPS["masked_fill"] = Op(lambda xs, p, d: np.where(xs[1], cast_scalar(p["value"], d[0]), xs[0]))
OPS["logical_and"] = Op(lambda xs, p, d: np.logical_and(xs[0], xs[1]), grad=False)
OPS["logical_or"] = Op(lambda xs, p, d: np.logical_or(xs[0], xs[1]), grad=False)
OPS["logical_xor"] = Op(lambda xs, p, d: np.logical_xor(xs[0], xs[1]), grad=False)
OPS["logical_not"] = Op(lambda xs, p, d: np.logical_not(xs[0]), grad=False)
OPS["any"] = Op(lambda xs, p, d: np.any(xs[0], axis=ax_tuple(p, xs[0].ndim), keepdims=p.get("keep_dims", False)), out=fixed("bool"), grad=False)
OPS["all"] = Op(lambda xs, p, d: np.all(xs[0], axis=ax_tuple(p, xs[0].ndim), keepdims=p.get("keep_dims", False)), out=fixed("bool"), grad=False)
OPS["var"] = Op(lambda xs, p, d: reduced(xs[0], p, var_of, np.nan))
OPS["std"] = Op(lambda xs, p, d: csqrt0(reduced(xs[0], p, var_of, np.nan)))
OPS["logsumexp"] = Op(lambda xs, p, d: reduced(xs[0], p, logsumexp_of, -np.inf))
OPS["cumsum"] = Op(cumsum_fwd)
OPS["norm"] = Op(norm_fwd)
OPS["erf"] = Op(lambda xs, p, d: np.vectorize(math.erf, otypes=[np.float64])(xs[0]), complex_safe=False)
OPS["gelu"] = Op(lambda xs, p, d: np.vectorize(gelu1, otypes=[np.float64])(xs[0]), complex_safe=False)
OPS["silu"] = Op(silu_fwd)
OPS["softplus"] = Op(softplus_fwd)
OPS["leaky_relu"] = Op(leaky_relu_fwd)
OPS["floor"] = Op(rounding_fwd(np.floor), grad=False)
OPS["ceil"] = Op(rounding_fwd(np.ceil), grad=False)
OPS["round"] = Op(rounding_fwd(np.round), grad=False)  # half to even
OPS["sign"] = Op(rounding_fwd(np.sign), grad=False)
OPS["reciprocal"] = Op(lambda xs, p, d: 1.0 / xs[0])
OPS["rsqrt"] = Op(lambda xs, p, d: 1.0 / np.sqrt(xs[0]))
OPS["log1p"] = Op(lambda xs, p, d: np.log1p(xs[0]))
OPS["expm1"] = Op(lambda xs, p, d: np.expm1(xs[0]))
OPS["split"] = Op(lambda xs, p, d: np.stack(np.split(xs[0], p["sections"], axis=p["axis"])))
OPS["repeat"] = Op(lambda xs, p, d: np.repeat(xs[0], p["repeats"], axis=p["axis"]))
OPS["tile"] = Op(lambda xs, p, d: np.tile(xs[0], p["reps"]))
OPS["pad"] = Op(pad_fwd)
OPS["swap_axes"] = Op(lambda xs, p, d: np.swapaxes(xs[0], p["a"], p["b"]))
OPS["flip"] = Op(flip_fwd)
def tri_fwd(fn):
    def f(xs, p, d):
        x = xs[0]
        lim = x.shape[-2] + x.shape[-1] + 1  # clamped: numpy overflows for k near i64::MIN
        return fn(x, max(-lim, min(lim, p["k"])))

    return f


OPS["tril"] = Op(tri_fwd(np.tril))
OPS["triu"] = Op(tri_fwd(np.triu))
OPS["zeros_like"] = Op(lambda xs, p, d: np.zeros_like(xs[0]), grad=False)
OPS["ones_like"] = Op(lambda xs, p, d: np.ones_like(xs[0]), grad=False)
OPS["full_like"] = Op(lambda xs, p, d: np.full(xs[0].shape, cast_scalar(p["value"], d[0])), grad=False)
OPS["conv2d"] = Op(conv2d_fwd)
OPS["max_pool2d"] = Op(max_pool_fwd)
OPS["avg_pool2d"] = Op(avg_pool_fwd)
OPS["layer_norm"] = Op(layer_norm_fwd)
OPS["batch_norm"] = Op(batch_norm_fwd, nograd=(1, 2), after=batch_norm_after)
OPS["embedding"] = Op(lambda xs, p, d: xs[0][xs[1].astype(np.int64)])
OPS["cross_entropy"] = Op(cross_entropy_fwd)
OPS["mse_loss"] = Op(mse_fwd)
OPS["binary_cross_entropy_with_logits"] = Op(bce_fwd)
OPS["one_hot"] = Op(one_hot_fwd, out=lambda dtypes, p: p["dtype"], grad=False)


# --------------------------------------------------------------------------------------
# Case construction: expected output and complex-step gradients


def to_out(v, dtype):
    v = np.asarray(v)
    if dtype in FLOATS:
        with np.errstate(all="ignore"):
            return np.asarray(np.real(v) if np.iscomplexobj(v) else v).astype(np.float64).astype(NP[dtype])
    if dtype == "bool":
        return v.astype(np.bool_)
    return np.vectorize(lambda t: int(t), otypes=[object])(v) if v.size else v.astype(object)


def run_fwd(op, inputs, params, bases=None):
    """Apply op to the effective inputs (float inputs as float64 or complex128)."""
    xs = []
    for k, x in enumerate(inputs):
        b = x.base if bases is None else bases[k]
        if x.dtype in FLOATS and not np.iscomplexobj(b):
            b = b.astype(np.float64)
        xs.append(x.effective(b))
    dtypes = [x.dtype for x in inputs]
    with np.errstate(all="ignore"):
        return OPS[op].fwd(xs, params, dtypes)


def sum_out_r(op, inputs, params, bases, r):
    out = np.asarray(run_fwd(op, inputs, params, bases))
    assert out.shape == r.shape, (out.shape, r.shape)
    return np.sum(out * r)


def gradients(op, inputs, params, r, fd_check):
    complex_safe = OPS[op].complex_safe
    grads = []
    for k, x in enumerate(inputs):
        if x.dtype not in FLOATS or k in OPS[op].nograd:
            grads.append(None)
            continue
        base = x.base.astype(np.float64)
        g = np.zeros(base.shape)
        for j in np.ndindex(base.shape):
            bases = [y.base.astype(np.float64) if y.dtype in FLOATS else y.base for y in inputs]
            if complex_safe:
                bc = base.astype(np.complex128)
                bc[j] += 1j * H
                bases[k] = bc
                g[j] = np.imag(sum_out_r(op, inputs, params, bases, r)) / H
            else:
                h, acc = 1e-3, 0.0
                for step, weight in ((2, -1), (1, 8), (-1, -8), (-2, 1)):
                    bp = base.copy()
                    bp[j] += step * h
                    bases[k] = bp
                    acc += weight * float(sum_out_r(op, inputs, params, bases, r))
                g[j] = acc / (12 * h)
            if fd_check:
                eps = 1e-6
                vals = []
                for sgn in (1, -1):
                    bp = base.copy()
                    bp[j] += sgn * eps
                    bases[k] = bp
                    vals.append(float(sum_out_r(op, inputs, params, bases, r)))
                fd = (vals[0] - vals[1]) / (2 * eps)
                assert abs(fd - g[j]) <= 1e-5 * (1 + abs(fd)), (
                    f"{op} {params}: complex step {g[j]} vs central difference {fd} "
                    f"at input {k} element {j}"
                )
        grads.append(g)
    return grads


class Family:
    def __init__(self, name, seed):
        self.name = name
        self.rng = np.random.default_rng(seed)
        self.cases = []
        self.counts = {}

    def _id(self, op, dtypes):
        dtype = next((d for d in dtypes if d != "bool"), "bool") if dtypes else "-"
        key = (op, dtype)
        self.counts[key] = self.counts.get(key, 0) + 1
        return f"{self.name}/{op}/{dtype}/{self.counts[key]:03d}"

    def add(self, op, inputs, params=None, grad=True, fd_check=True, tol=None):
        """A case whose expected output (and gradient, for float outputs) numpy
        computes; `tol=(rtol, atol)` loosens the runner's tolerances for it."""
        params = params or {}
        spec = OPS[op]
        dtypes = [x.dtype for x in inputs]
        out_dtype = spec.out(dtypes, params)
        out = to_out(run_fwd(op, inputs, params), out_dtype)
        case = {
            "id": self._id(op, dtypes),
            "op": op,
            "params": enc_params(params),
            "inputs": [enc_input(x) for x in inputs],
            "expected": enc_array(out, out_dtype),
            "grad": None,
        }
        if tol is not None:
            case["tol"] = list(tol)
        if spec.after is not None:
            case["after"] = self._after(op, inputs, params)
        finite = all(
            np.all(np.isfinite(x.base)) for x in inputs if x.dtype in FLOATS
        ) and (out_dtype not in FLOATS or np.all(np.isfinite(out.astype(np.float64))))
        if grad and spec.grad and out_dtype in FLOATS and finite and any(d in FLOATS for d in dtypes):
            r = np.round(self.rng.uniform(-1, 1, out.shape), 2).astype(NP[out_dtype])
            r64 = r.astype(np.float64)
            gs = gradients(op, inputs, params, r64, fd_check)
            if not spec.complex_safe:
                case["tol"] = [max(a, 1e-8) for a in case.get("tol", [0.0, 0.0])]
            case["grad"] = {
                "r": enc_array(r, out_dtype),
                "inputs": [
                    None if g is None else enc_array(g.astype(NP[x.dtype]) if x.dtype == "f32" else g, x.dtype)
                    for g, x in zip(gs, inputs)
                ],
            }
        self.cases.append(case)

    def _after(self, op, inputs, params):
        """The bases of the inputs an op writes into, after the op (None for the rest)."""
        xs = []
        for x in inputs:
            b = x.base.astype(np.float64) if x.dtype in FLOATS else x.base
            xs.append(x.effective(b))
        with np.errstate(all="ignore"):
            new = OPS[op].after(xs, params, [x.dtype for x in inputs])
        out = [None] * len(inputs)
        for k, values in new.items():
            x = inputs[k]
            b = x.base.astype(np.float64) if x.dtype in FLOATS else x.base.copy()
            view = x.effective(b)
            assert np.shares_memory(view, b) or view.size == 0, "an in-place input must be a view"
            view[...] = values
            out[k] = enc_array(b.astype(NP[x.dtype]), x.dtype)
        return out

    def error(self, op, inputs, params, variant, unchanged=()):
        """A case that must fail with the NdError `variant`; the inputs listed in
        `unchanged` must keep their values (an in-place op that fails writes nothing)."""
        dtypes = [x.dtype for x in inputs]
        case = {
            "id": self._id(op, dtypes),
            "op": op,
            "params": enc_params(params or {}),
            "inputs": [enc_input(x) for x in inputs],
            "expected": {"error": variant},
            "grad": None,
        }
        if unchanged:
            case["after"] = [enc_array(x.base, x.dtype) if k in unchanged else None for k, x in enumerate(inputs)]
        self.cases.append(case)

    # ---- random data

    def values(self, shape, dtype, lo=-3.0, hi=3.0, special=False):
        shape = tuple(shape)
        rng = self.rng
        if dtype in FLOATS:
            v = np.round(rng.uniform(lo, hi, shape), 2)
            if special and v.size:
                flat = v.reshape(-1)
                for _ in range(max(1, v.size // 4)):
                    flat[rng.integers(v.size)] = rng.choice([np.nan, np.inf, -np.inf, 0.0, -0.0])
            return v.astype(NP[dtype])
        if dtype == "bool":
            return rng.integers(0, 2, shape).astype(np.bool_)
        if dtype == "u8":
            return rng.integers(0, 256 if special else 10, shape).astype(np.uint8)
        info = np.iinfo(NP[dtype])
        if special:
            v = rng.integers(-1000, 1000, shape).astype(NP[dtype])
            flat = v.reshape(-1)
            for _ in range(max(1, v.size // 4)) if v.size else []:
                flat[rng.integers(v.size)] = rng.choice([info.min, info.max, -1, 0, 1])
            return v
        return rng.integers(-9, 10, shape).astype(NP[dtype])

    def shape(self, max_nd=3, max_dim=4, zero=0.1):
        nd = int(self.rng.integers(0, max_nd + 1))
        return tuple(
            0 if self.rng.random() < zero else int(self.rng.integers(1, max_dim + 1)) for _ in range(nd)
        )

    def input(self, shape, dtype, noncontig=0.3, fill=None, **kw):
        """An input of `shape`, sometimes as a non-contiguous view of a larger base.
        `fill(shape)` gives the base's values (default: `values(shape, dtype, **kw)`),
        e.g. valid indices for an index array."""
        shape = tuple(shape)
        rng = self.rng
        values = fill or (lambda s: self.values(s, dtype, **kw))
        if len(shape) and rng.random() < noncontig:
            trick = rng.integers(3)
            if 0 in shape:
                base = values((2,) + shape)
                return arr(base, dtype, view=str(int(rng.choice([1, -1]))))
            if trick == 0 and len(shape) >= 2:
                perm = list(rng.permutation(len(shape)))
                inv = list(np.argsort(perm))
                base = values(tuple(shape[i] for i in inv))
                return arr(base, dtype, perm=[int(i) for i in perm])
            if trick == 1:
                base = values((2 * shape[0],) + shape[1:])
                return arr(base, dtype, view="::-2" if rng.random() < 0.5 else "1::2")
            base = values(shape[:-1] + (shape[-1] + 2,))
            return arr(base, dtype, view="..., 1:-1")
        return arr(values(shape), dtype)


def broadcast_pair(f, max_nd=3):
    """Two shapes that broadcast (numpy rules), sometimes with 0-d or zero-size dims."""
    rng = f.rng
    out = f.shape(max_nd=max_nd, zero=0.08)
    a, b = [], []
    for n in out:
        r = rng.random()
        if r < 0.2:
            a.append(1), b.append(n)
        elif r < 0.4:
            a.append(n), b.append(1)
        else:
            a.append(n), b.append(n)
    a = a[int(rng.integers(0, len(a) + 1)) :] if rng.random() < 0.3 else a
    b = b[int(rng.integers(0, len(b) + 1)) :] if rng.random() < 0.3 else b
    return tuple(a), tuple(b)


# --------------------------------------------------------------------------------------
# Families


def gen_binary():
    f = Family("binary", 1)
    ops = ["add", "sub", "mul", "div", "pow", "maximum", "minimum"]
    for op in ops:
        for d in NUMERIC:
            # Float `pow` gradients need a positive base, `div` a divisor away from 0.
            ka = {"lo": 0.2, "hi": 2.5} if op == "pow" and d in FLOATS else {}
            kb = {"lo": 0.5, "hi": 3.0} if op == "div" and d in FLOATS else {}
            for k in range(6):
                sa, sb = broadcast_pair(f)
                a = f.input(sa, d, **ka)
                b = f.input(sb, d, **kb)
                if op == "pow" and d in INTS:
                    b.base = (b.base.astype(np.int64) % 4).astype(NP[d])  # small exponents
                if op == "div" and d in FLOATS and k % 2:
                    b.base = np.negative(b.base)
                if op in ("maximum", "minimum") and d in FLOATS:
                    b.base = b.base + 0.005  # no ties (a tie's gradient goes to x, see above)
                f.add(op, [a, b])
            # Special values: NaN/inf/0 for floats, extremes (wrapping) for integers.
            for k in range(2):
                s = (int(f.rng.integers(1, 6)),)
                f.add(op, [f.input(s, d, special=True), f.input(s, d, special=True)], grad=False)
            # A scalar right-hand side (int and float scalars), and scalar-left forms.
            for sc in [2, -1, 0.5, 2.75] if d in FLOATS else [3, -2, 2.7, -1.5]:
                kx = {"lo": 0.2, "hi": 2.5} if op in ("pow", "div") and d in FLOATS else {}
                f.add(op, [f.input(f.shape(max_nd=2, zero=0.1), d, **kx)], {"scalar": sc})
                if op in ("add", "sub", "mul", "div"):
                    kx = {"lo": 0.5, "hi": 3.0} if op == "div" and d in FLOATS else {}
                    x = f.input(f.shape(max_nd=2, zero=0.1), d, **kx)
                    f.add(op, [x], {"scalar": sc, "scalar_left": True})
    # Integer scalars that do not fit the dtype wrap; float scalars truncate/saturate.
    for d in INTS:
        f.add("add", [arr([0, 1, 2, 250], d)], {"scalar": 300})
        f.add("mul", [arr([1, 2, 3], d)], {"scalar": -2.9})
        f.add("add", [arr([1, 2, 3], d)], {"scalar": 1e20})
    f.add("div", [arr([7, -7, 7, -7, 5, -(2**31)], "i32"), arr([2, 2, -2, -2, 0, -1], "i32")])
    f.add("div", [arr([7, -7, 0, -(2**63)], "i64"), arr([-3, 3, 0, -1], "i64")])
    f.add("pow", [arr([2, -2, 3, 10, 1, -1, -1, 0, 5], "i32"), arr([31, 31, 21, 10, -5, -3, -4, -1, -1], "i32")])
    f.add("pow", [arr([2, 3, 7], "i64"), arr([63, 40, 3], "i64")])
    f.add("pow", [arr([2, 3, 255], "u8"), arr([8, 5, 2], "u8")])
    f.add("pow", [arr([-8.0, -2.0, 0.0, 0.0, np.nan, 1.0, -1.5], "f64"), arr([1 / 3, 3.0, -1.0, 0.0, 0.0, np.nan, 2.0], "f64")])
    # Errors: Bool arithmetic, mixed dtypes, shapes that do not broadcast.
    for op in ops:
        f.error(op, [arr([True, False], "bool"), arr([True, True], "bool")], {}, "UnsupportedDType")
    f.error("add", [arr([1.0, 2.0], "f32"), arr([1.0, 2.0], "f64")], {}, "DTypeMismatch")
    f.error("mul", [arr(np.zeros((2, 3)), "f64"), arr(np.zeros((4,)), "f64")], {}, "ShapeMismatch")
    f.error("maximum", [arr(np.zeros((2, 0)), "i32"), arr(np.zeros((3,)), "i32")], {}, "ShapeMismatch")
    return f


def gen_compare():
    f = Family("compare", 2)
    for op in ["eq", "ne", "gt", "ge", "lt", "le"]:
        for d in ALL:
            for k in range(3):
                sa, sb = broadcast_pair(f)
                a = f.input(sa, d, lo=-2, hi=2)
                b = f.input(sb, d, lo=-2, hi=2)
                if d in FLOATS:  # round to halves so that ties happen
                    a.base = np.round(a.base * 2) / 2
                    b.base = np.round(b.base * 2) / 2
                elif d != "bool":
                    a.base = (a.base % 4).astype(NP[d])
                    b.base = (b.base % 4).astype(NP[d])
                f.add(op, [a, b])
            s = (5,)
            f.add(op, [f.input(s, d, special=True), f.input(s, d, special=True)])
            for sc in [0, 1, -3, 0.5, 1.5, -0.5, 2, 300, 0.1]:
                if d == "bool" and sc in (2, 300):
                    continue
                vals = {
                    "bool": [False, True],
                    "u8": [0, 1, 2, 255],
                    "i32": [-4, -3, 0, 1, 2, 3],
                    "i64": [-4, -3, 0, 1, 2, 3, 2**62],
                    "f32": [-3.0, -0.5, 0.0, 0.1, 0.5, 1.0, 1.5, np.nan],
                    "f64": [-3.0, -0.5, 0.0, 0.1, 0.5, 1.0, 1.5, np.nan],
                }[d]
                f.add(op, [arr(vals, d)], {"scalar": sc})
    f.error("lt", [arr([1, 2], "i32"), arr([1, 2], "i64")], {}, "DTypeMismatch")
    f.error("eq", [arr(np.zeros((2, 3)), "f32"), arr(np.zeros((2,)), "f32")], {}, "ShapeMismatch")
    return f


def gen_unary():
    f = Family("unary", 3)
    domain = {
        "log": (0.1, 4.0),
        "sqrt": (0.1, 4.0),
    }
    for op in ["exp", "log", "sqrt", "sin", "cos", "tanh", "sigmoid", "abs", "neg", "square", "relu"]:
        for d in ALL:
            if d == "bool" or (d in INTS and op not in ("abs", "neg", "square", "relu")):
                f.error(op, [arr([1, 0, 1], d)], {}, "UnsupportedDType")
                continue
            lo, hi = domain.get(op, (-3.0, 3.0))
            for k in range(6):
                shp = f.shape(max_nd=3, zero=0.1)
                x = f.input(shp, d, lo=lo, hi=hi)
                if op in ("abs", "relu") and d in FLOATS:
                    x.base = np.where(x.base == 0, 0.5, x.base).astype(NP[d])  # away from the kink
                f.add(op, [x])
            f.add(op, [f.input((7,), d, special=True)], grad=False)
        # Kinks: the gradient at 0 is 0 (PyTorch's convention, ndscope's rule).
        if op in ("abs", "relu"):
            f.add(op, [arr([0.0, -1.5, 2.0], "f64")], fd_check=False)
    f.add("exp", [arr([-1000.0, 700.0, 80.0, -80.0], "f32")], grad=False)
    f.add("sigmoid", [arr([-800.0, 800.0, -30.0, 30.0], "f64")])
    f.add("sigmoid", [arr([-100.0, 100.0, -20.0, 20.0], "f32")], grad=False)
    f.add("log", [arr([0.0, -1.0, 1.0, np.inf], "f64")], grad=False)
    f.add("sqrt", [arr([0.0, -1.0, 4.0, np.inf], "f32")], grad=False)
    f.add("tanh", [arr([-50.0, 50.0, 1e-8], "f64")])
    f.add("abs", [arr([-(2**31), 2**31 - 1, -1, 0], "i32")])
    f.add("neg", [arr([-(2**63), 2**63 - 1, 0], "i64")])
    f.add("neg", [arr([0, 1, 255], "u8")])
    f.add("square", [arr([46341, -46341, 3], "i32")])
    f.add("relu", [arr([np.nan, -np.inf, np.inf, -0.0], "f64")], grad=False)
    return f


def gen_reduce():
    f = Family("reduce", 4)
    for op in ["sum", "mean", "max", "min", "prod"]:
        for d in ALL:
            if d == "bool" and op in ("sum", "mean", "prod"):
                f.error(op, [arr([True, False], d)], {}, "UnsupportedDType")
                continue
            for k in range(10):
                shp = f.shape(max_nd=3, max_dim=4, zero=0.12)
                kw = {"lo": 0.5, "hi": 1.6} if op == "prod" and d in FLOATS else {}
                x = f.input(shp, d, **kw)
                if op == "prod" and d in INTS:
                    x.base = (x.base % 3 + (1 if d == "u8" else -1)).astype(NP[d])
                nd = len(shp)
                params = {}
                if k % 5 != 0 and nd:
                    n_ax = int(f.rng.integers(0, nd + 1))
                    axes = sorted(f.rng.choice(nd, n_ax, replace=False).tolist())
                    axes = [a - nd if f.rng.random() < 0.5 else a for a in axes]
                    params = {"axes": [int(a) for a in axes], "keep_dims": bool(f.rng.random() < 0.5)}
                if op in ("max", "min"):
                    xe = x.effective()
                    axes_n = ax_tuple(params, xe.ndim)
                    count = int(np.prod([xe.shape[a] for a in axes_n]))
                    out_size = int(np.prod([n for i, n in enumerate(xe.shape) if i not in axes_n]))
                    if count == 0 and out_size > 0:
                        f.error(op, [x], params, "InvalidArgument")
                        continue
                f.add(op, [x], params)
            if d != "bool":
                f.add(op, [f.input((2, 3), d, special=True)], {"axes": [-1], "keep_dims": False}, grad=False)
    # Ties share the gradient of max/min (as PyTorch's amax/amin).
    f.add("max", [arr([[1.0, 3.0, 3.0], [2.0, 2.0, 2.0]], "f64")], {"axes": [1], "keep_dims": True}, fd_check=False)
    f.add("min", [arr([1.0, 1.0, 3.0, 1.0], "f32")], {}, fd_check=False)
    # prod's gradient with one and with two zeros in a group.
    f.add("prod", [arr([[0.0, 2.0, 3.0], [0.0, 0.0, 4.0], [1.5, 2.0, -1.0]], "f64")], {"axes": [-1], "keep_dims": False})
    f.add("prod", [arr([0.0, 2.0, 3.0, 0.5], "f32")], {})
    # Integer sums and products wrap in the dtype; integer mean gives f64.
    f.add("sum", [arr([200, 100, 7], "u8")], {})
    f.add("sum", [arr([2**31 - 1, 1, 5], "i32")], {})
    f.add("prod", [arr([2**20, 2**20, 3], "i64")], {})
    f.add("prod", [arr([2**16, 2**16, 3], "i32")], {})
    f.add("mean", [arr([[1, 2], [4, 8]], "i32")], {"axes": [0], "keep_dims": False})
    f.add("mean", [arr(np.zeros((0, 3)), "f64")], {"axes": [0], "keep_dims": False})
    f.add("sum", [arr(np.zeros((0, 3)), "i64")], {"axes": [-2], "keep_dims": True})
    f.add("prod", [arr(np.zeros((2, 0)), "f32")], {"axes": [1], "keep_dims": False})
    # An empty reduction with an empty result is fine (numpy raises); a non-empty one errs.
    f.add("max", [arr(np.zeros((0, 0)), "f64")], {"axes": [0], "keep_dims": False})
    f.error("min", [arr(np.zeros((0,)), "f64")], {}, "InvalidArgument")
    f.error("sum", [arr(np.zeros((2, 3)), "f64")], {"axes": [2], "keep_dims": False}, "AxisOutOfRange")
    f.error("sum", [arr(np.zeros((2, 3)), "f64")], {"axes": [1, -1], "keep_dims": False}, "InvalidArgument")
    # argmax/argmin: flattened and along an axis (negative too), NaN wins, first tie.
    for op in ["argmax", "argmin"]:
        for d in ALL:
            for k in range(6):
                shp = f.shape(max_nd=3, zero=0.0)
                shp = shp if shp else (3,)
                x = f.input(shp, d, lo=-2, hi=2)
                if d in FLOATS:
                    x.base = np.round(x.base).astype(NP[d])  # ties
                params = {}
                if k % 3:
                    nd = len(shp)
                    ax = int(f.rng.integers(-nd, nd))
                    params = {"axis": ax, "keep_dims": bool(k % 2)}
                f.add(op, [x], params)
        f.add(op, [arr([1.0, np.nan, 5.0, np.nan, -1.0], "f64")], {})
        f.add(op, [arr([[1.0, 2.0], [np.nan, 0.0]], "f32")], {"axis": 1, "keep_dims": False})
        f.add(op, [arr(np.zeros((0, 3)), "f64")], {"axis": 1, "keep_dims": True})
        f.error(op, [arr(np.zeros((0, 3)), "i32")], {"axis": 0, "keep_dims": False}, "InvalidArgument")
        f.error(op, [arr(np.zeros((0,)), "f64")], {}, "InvalidArgument")
    # Longer rows: the 8-lane contiguous kernels (and their remainders), and a long
    # strided reduction (axis 0 of a row-major matrix).
    for op in ["sum", "mean", "max", "min", "prod", "argmax", "argmin"]:
        for d in ["f32", "f64", "i32"]:
            lo, hi = (0.9, 1.1) if op == "prod" else (0.0, 1.0)  # no cancellation in f32
            x = f.input((37,), d, noncontig=0.0, lo=lo, hi=hi)
            if op == "prod" and d == "i32":
                x.base = x.base % 3 + 1  # wraps
            f.add(op, [x], {} if op.startswith("arg") else {"axes": [0], "keep_dims": False})
            x = f.input((5, 23), d, noncontig=0.5, lo=lo, hi=hi)
            if op == "prod" and d == "i32":
                x.base = x.base % 2 + 1
            ax = {"axis": 0, "keep_dims": True} if op.startswith("arg") else {"axes": [0], "keep_dims": True}
            f.add(op, [x], ax)
            f.add(op, [x], {"axis": -1, "keep_dims": False} if op.startswith("arg") else {})
    return f


def gen_matmul():
    f = Family("matmul", 5)
    for op in ["matmul", "dot"]:
        for d in NUMERIC:
            for k in range(10):
                rng = f.rng
                m, kk, n = (int(v) for v in rng.integers(0, 5, 3))
                kind = k % 5
                if kind == 0:
                    sa, sb = (kk,), (kk,)
                elif kind == 1:
                    sa, sb = (m, kk), (kk,)
                elif kind == 2:
                    sa, sb = (kk,), (kk, n)
                elif kind == 3:
                    sa, sb = (m, kk), (kk, n)
                else:
                    b1, b2 = int(rng.integers(1, 4)), int(rng.integers(1, 3))
                    pa = [(b1,), (b2, b1), (1,), (), (b2, 1)][int(rng.integers(5))]
                    pb = [(b1,), (1, b1), (), (b2, 1), (1,)][int(rng.integers(5))]
                    sa, sb = pa + (m, kk), pb + (kk, n)
                    try:
                        np.broadcast_shapes(pa, pb)
                    except ValueError:
                        sb = (kk, n)
                f.add(op, [f.input(sa, d), f.input(sb, d)])
        f.error(op, [arr(np.zeros((2, 3)), "f64"), arr(np.zeros((4, 2)), "f64")], {}, "ShapeMismatch")
        f.error(op, [arr([[True]], "bool"), arr([[True]], "bool")], {}, "UnsupportedDType")
    f.error("matmul", [arr(np.zeros((2, 2, 3)), "f32"), arr(np.zeros((3, 3, 2)), "f32")], {}, "ShapeMismatch")
    f.error("matmul", [arr(2.0, "f64"), arr([1.0, 2.0], "f64")], {}, "InvalidArgument")
    f.add("dot", [arr(2.5, "f64"), arr([[1.0, 2.0], [3.0, 4.0]], "f64")])
    f.add("dot", [arr([1.5, -2.0], "f32"), arr(-3.0, "f32")])
    f.add("matmul", [arr([[100, 100], [3, 4]], "u8"), arr([[2, 1], [3, 0]], "u8")])
    f.add("matmul", [arr([[2**30, 2**30]], "i32"), arr([[2], [2]], "i32")])
    return f


def gen_shape():
    f = Family("shape", 6)
    rng = f.rng
    for d in ALL:
        for k in range(4):
            shp = f.shape(max_nd=3, zero=0.1)
            size = int(np.prod(shp))
            x = f.input(shp, d)
            # reshape to a random factorisation of the size
            if size == 0:
                new = [0, int(rng.integers(1, 4))]
            else:
                new, rest = [], size
                for p in (2, 3, 5, 7):
                    while rest % p == 0 and rng.random() < 0.7:
                        new.append(p)
                        rest //= p
                new = [rest] + new
                rng.shuffle(new)
            f.add("reshape", [x], {"shape": [int(v) for v in new]})
            if size:
                dims = [int(v) for v in new]
                dims[int(rng.integers(len(dims)))] = -1
                f.add("reshape_infer", [f.input(shp, d)], {"dims": dims})
            f.add("flatten", [f.input(shp, d)])
            f.add("transpose", [f.input(shp, d)])
            perm = [int(v) for v in rng.permutation(len(shp))]
            f.add("permute", [f.input(shp, d)], {"perm": perm})
            # squeeze: insert size-1 axes
            s1 = list(shp)
            for _ in range(int(rng.integers(1, 3))):
                s1.insert(int(rng.integers(0, len(s1) + 1)), 1)
            f.add("squeeze", [f.input(s1, d)])
            ones = [i for i, n in enumerate(s1) if n == 1]
            ax = ones[int(rng.integers(len(ones)))]
            f.add("squeeze", [f.input(s1, d)], {"axis": ax - len(s1) if k % 2 else ax})
            ax = int(rng.integers(-len(shp) - 1, len(shp) + 1))
            f.add("expand_dims", [f.input(shp, d)], {"axis": ax})
            # broadcast_to: some axes of size 1 grow, and new leading axes appear
            src = [1 if rng.random() < 0.4 else n for n in shp]
            lead = [int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, 3)))]
            target = lead + [int(rng.integers(1, 4)) if n == 1 else n for n in src]
            f.add("broadcast_to", [f.input(src, d)], {"shape": target})
            # concat / stack of 1..3 arrays
            if shp:
                nd = len(shp)
                ax = int(rng.integers(-nd, nd))
                parts = []
                for _ in range(int(rng.integers(1, 4))):
                    s = list(shp)
                    s[ax] = int(rng.integers(0, 4))
                    parts.append(f.input(s, d))
                f.add("concat", parts, {"axis": ax})
            ax = int(rng.integers(-len(shp) - 1, len(shp) + 1))
            f.add("stack", [f.input(shp, d) for _ in range(int(rng.integers(1, 4)))], {"axis": ax})
    f.error("reshape", [arr(np.zeros((2, 3)), "f64")], {"shape": [4]}, "InvalidShape")
    f.error("reshape_infer", [arr(np.zeros((2, 3)), "f64")], {"dims": [-1, 4]}, "InvalidShape")
    f.error("squeeze", [arr(np.zeros((2, 3)), "f64")], {"axis": 1}, "InvalidShape")
    f.error("expand_dims", [arr(np.zeros((2, 3)), "f64")], {"axis": 3}, "AxisOutOfRange")
    f.error("broadcast_to", [arr(np.zeros((2, 3)), "f64")], {"shape": [3, 3]}, "InvalidShape")
    f.error("permute", [arr(np.zeros((2, 3)), "f64")], {"perm": [0, 0]}, "InvalidArgument")
    f.error("concat", [arr(1.0, "f64"), arr(2.0, "f64")], {"axis": 0}, "InvalidShape")
    f.error("concat", [arr(np.zeros((2, 3)), "f64"), arr(np.zeros((2, 2)), "f64")], {"axis": 0}, "InvalidShape")
    f.error("concat", [arr(np.zeros((2,)), "f64"), arr(np.zeros((2,)), "f32")], {"axis": 0}, "DTypeMismatch")
    f.error("stack", [arr(np.zeros((2,)), "i32"), arr(np.zeros((3,)), "i32")], {"axis": 0}, "InvalidShape")
    f.error("stack", [arr(np.zeros((2,)), "i32")], {"axis": 2}, "AxisOutOfRange")
    return f


def random_index(rng, shape):
    """A random index string for `shape` in ndscope's grammar (numpy basic indexing)."""
    nd = len(shape)
    items = []
    n_items = int(rng.integers(1, nd + 1)) if nd else 0
    for axis in range(n_items):
        n = shape[axis]
        r = rng.random()
        if r < 0.25 and n > 0:
            i = int(rng.integers(-n, n))
            items.append(str(i))
        else:
            def bound():
                if rng.random() < 0.35:
                    return ""
                return str(int(rng.integers(-n - 2, n + 3)))

            step = ["", "", "1", "2", "-1", "-1", "-2", "3", "-3"][int(rng.integers(9))]
            s = f"{bound()}:{bound()}"
            if step or rng.random() < 0.2:
                s += f":{step}"
            items.append(s)
    if nd and rng.random() < 0.25:
        pos = int(rng.integers(0, len(items) + 1))
        items.insert(pos, "...")
        # `...` covers the axes not named: drop items so that they still fit.
    sep = ", " if rng.random() < 0.5 else ","
    return sep.join(items)


def gen_index():
    f = Family("index", 7)
    rng = f.rng
    for d in ALL:
        for k in range(40):
            shp = f.shape(max_nd=3, max_dim=5, zero=0.06) or (int(rng.integers(1, 6)),)
            index = random_index(rng, shp)
            x = f.input(shp, d, noncontig=0.2)
            try:
                x.effective()[np_index(index)]
            except IndexError:  # an integer out of range after `...` moved it
                f.error("get", [x], {"index": index}, "Index")
                continue
            f.add("get", [x], {"index": index})
    # Fixed strings with negative steps, clamping and the ellipsis.
    base = np.arange(24, dtype=np.float64).reshape(2, 3, 4) / 4
    for index in ["", "...", "1", "-1, ::-1", "..., ::-2", ":, 2:0:-1, -1", "::-1, ::-1, ::-1",
                  "0, 10:-10:-1", "-2:100, 1, 3::-3", "1:1", "..., 1:3, 0", "1,", " 0 , : , 1 "]:
        f.add("get", [arr(base, "f64")], {"index": index})
        f.add("get", [arr(base, "i64")], {"index": index})
    f.add("get", [arr(2.5, "f32")], {"index": ""})
    f.add("get", [arr(2.5, "f32")], {"index": "..."})
    # get of a get: a view of a reversed view (the input is a view with a negative stride)
    f.add("get", [arr(base, "f32", view="::-1, 1:")], {"index": "..., ::-1"})
    for bad in ["2", "0, 3", "0, 0, 0, 0", "::0", "a", "..., ...", "1,,2"]:
        f.error("get", [arr(base, "f64")], {"index": bad}, "Index")
    return f


def gen_nn():
    f = Family("nn", 8)
    rng = f.rng
    for op in ["softmax", "log_softmax"]:
        for d in FLOATS:
            for k in range(8):
                shp = f.shape(max_nd=3, zero=0.08)
                shp = shp if shp else (int(rng.integers(1, 5)),)
                nd = len(shp)
                f.add(op, [f.input(shp, d)], {"axis": int(rng.integers(-nd, nd))})
            f.add(op, [arr([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]], d)], {"axis": -1})
            f.add(op, [arr([0.5, np.inf, 1.0], d)], {"axis": 0}, grad=False)
        for d in INTS + ["bool"]:
            f.error(op, [arr([1, 2], d)], {"axis": 0}, "UnsupportedDType")
        f.error(op, [arr([1.0, 2.0], "f64")], {"axis": 1}, "AxisOutOfRange")
    for d in NUMERIC:
        for k in range(8):
            shp = f.shape(max_nd=3, zero=0.08)
            x = f.input(shp, d, lo=-3, hi=3)
            lo = float(np.round(rng.uniform(-2, 0.5), 1))
            hi = float(np.round(lo + rng.uniform(0, 2.5), 1))
            if d in FLOATS:
                x.base = np.where(np.isin(np.round(x.base.astype(np.float64), 2), [lo, hi]), 2.9, x.base).astype(NP[d])
            elif math.ceil(lo) > math.floor(hi):  # no integer in [lo, hi]
                f.error("clip", [x], {"min": lo, "max": hi}, "InvalidArgument")
                continue
            f.add("clip", [x], {"min": lo, "max": hi})
        f.add("clip", [f.input((6,), d, special=True)], {"min": -1.5, "max": 2.5}, grad=False)
    # Bounds are inclusive for the gradient (PyTorch's clamp: 1 at min and at max).
    f.add("clip", [arr([-1.0, 0.5, 2.0, 3.0, -2.0], "f64")], {"min": -1.0, "max": 2.0}, fd_check=False)
    f.add("clip", [arr([0, 1, 2, 3, 4, 5], "i32")], {"min": 0.5, "max": 3.5})
    f.add("clip", [arr([-5, 0, 200, 255], "u8")], {"min": -10.0, "max": 300.0})
    f.add("clip", [arr([1.0, 2.0], "f64")], {"min": 1.5, "max": 1.5})
    f.error("clip", [arr([1.0, 2.0], "f64")], {"min": 2.0, "max": 1.0}, "InvalidArgument")
    f.error("clip", [arr([1, 2], "i64")], {"min": 1.2, "max": 1.8}, "InvalidArgument")
    f.error("clip", [arr([True], "bool")], {"min": 0.0, "max": 1.0}, "UnsupportedDType")
    for d in ALL:
        for k in range(6):
            sc, sx = broadcast_pair(f)
            sy = sx[int(rng.integers(0, len(sx) + 1)) :] if rng.random() < 0.5 else sx
            f.add("where", [f.input(sc, "bool"), f.input(sx, d), f.input(sy, d)])
    f.error("where", [arr([1, 0], "i32"), arr([1.0, 2.0], "f64"), arr([1.0, 2.0], "f64")], {}, "UnsupportedDType")
    f.error("where", [arr([True, False], "bool"), arr([1.0, 2.0], "f64"), arr([1.0, 2.0], "f32")], {}, "DTypeMismatch")
    f.error("where", [arr([True, False, True], "bool"), arr([1.0, 2.0], "f64"), arr([1.0, 2.0], "f64")], {}, "ShapeMismatch")
    return f


def gen_cast():
    f = Family("cast", 9)
    samples = {
        "f64": [0.0, -0.0, 1.5, -2.75, 3.9999, 100.25, 1e-3, 254.9],
        "f32": [0.0, -0.0, 1.5, -2.75, 3.9999, 100.25, 1e-3, 254.9],
        "i32": [0, 1, -1, 127, 255, 256, -129, 2**31 - 1, -(2**31), 16777217],
        "i64": [0, 1, -1, 255, 256, 2**31, -(2**31) - 1, 2**53, -(2**40) + 3, 33554433],
        "u8": [0, 1, 127, 128, 255],
        "bool": [True, False, True],
    }
    for src in ALL:
        for dst in ALL:
            vals = list(samples[src])
            if src in FLOATS and dst == "u8":
                vals = [abs(v) for v in vals]
            f.add("to_dtype", [arr(vals, src)], {"dtype": dst})
            shp = f.shape(max_nd=3, zero=0.1)
            x = f.input(shp, src, lo=0.0 if dst == "u8" else -100.0, hi=100.0)
            f.add("to_dtype", [x], {"dtype": dst})
        if src in FLOATS:
            sp = [np.nan, np.inf, -np.inf, 1e300 if src == "f64" else 3e38, -1e-320 if src == "f64" else -1e-40, 0.0]
            for dst in FLOATS + ["bool"]:
                f.add("to_dtype", [arr(sp, src)], {"dtype": dst}, grad=False)
    f.add("to_dtype", [arr([1 / 3, 1e-50, 3.4028235677973366e38, 1 + 2**-24, 1 + 3 * 2**-24], "f64")], {"dtype": "f32"})
    return f


# --------------------------------------------------------------------------------------
# Families of the issue-11 ops (each its own file and seed)


def axes_params(f, nd, allow_empty=True):
    """Random `axes`/`keep_dims` params: a subset of the axes (some negative), or none
    (absent: reduce everything)."""
    rng = f.rng
    if not nd or rng.random() < 0.2:
        return {}
    n_ax = int(rng.integers(0 if allow_empty else 1, nd + 1))
    axes = sorted(rng.choice(nd, n_ax, replace=False).tolist())
    axes = [a - nd if rng.random() < 0.5 else a for a in axes]
    rng.shuffle(axes)
    return {"axes": [int(a) for a in axes], "keep_dims": bool(rng.random() < 0.5)}


def index_fill(f, bound, dtype):
    """Values for an index array: random valid indices in 0..bound (repeats allowed)."""
    return lambda s: f.rng.integers(0, max(bound, 1), s).astype(NP[dtype])


def distinct_fill(f, dtype, scale=0.01):
    """Values that are all different (no ties for max_pool2d's gradient)."""
    def fill(s):
        n = int(np.prod(s))
        v = (f.rng.permutation(n).astype(np.float64) - n / 2) * scale + 0.003
        return v.reshape(s).astype(NP[dtype])

    return fill


def zero_view(f, d, kind=0):
    """A zero-size view with a non-zero offset (the map kernels' old bug class):
    kind 0: [1, 0] at offset 5 of a [2, 3] base; kind 1: [0, 3] at offset 6."""
    base = f.values((2, 3), d)
    return arr(base, d, view=["1:, 2:2", "2:"][kind])


def gen_gather():
    f = Family("gather", 10)
    rng = f.rng
    pick = lambda xs: xs[int(rng.integers(len(xs)))]
    # index_select: any index shape (0-d removes the axis), every dtype, any int index
    for d in ALL:
        for k in range(5):
            shp = f.shape(max_nd=3, zero=0.1) or (3,)
            nd = len(shp)
            ax = int(rng.integers(-nd, nd))
            n = shp[ax]
            ishape = f.shape(max_nd=2, max_dim=4, zero=0.1)
            if n == 0 and int(np.prod(ishape)) > 0:
                ishape = (0,)
            it = pick(INTS)
            f.add("index_select", [f.input(shp, d), f.input(ishape, it, fill=index_fill(f, n, it))], {"axis": ax})
    x = arr(np.arange(6.0).reshape(2, 3), "f64")
    f.add("index_select", [x, arr(2, "i64")], {"axis": -1})
    f.add("index_select", [x, arr([[1, 1], [0, 1]], "u8")], {"axis": 0})
    f.error("index_select", [x, arr([0, -1], "i64")], {"axis": 1}, "Index")  # not wrapped
    f.error("index_select", [x, arr([3], "i32")], {"axis": 1}, "Index")
    f.error("index_select", [x, arr([0.0], "f64")], {"axis": 0}, "UnsupportedDType")
    f.error("index_select", [x, arr([True], "bool")], {"axis": 0}, "UnsupportedDType")
    f.error("index_select", [x, arr([0], "i64")], {"axis": 2}, "AxisOutOfRange")
    f.error("index_select", [x, arr([0], "i64")], {"axis": -3}, "AxisOutOfRange")
    f.error("index_select", [arr(1.0, "f32"), arr([0], "i64")], {"axis": 0}, "AxisOutOfRange")
    f.error("index_select", [arr(np.zeros((2, 0)), "f32"), arr([0], "i64")], {"axis": 1}, "Index")
    # gather: index no larger than the input off the axis, any extent along it
    for d in ALL:
        for k in range(5):
            shp = f.shape(max_nd=3, zero=0.1) or (2,)
            nd = len(shp)
            ax = int(rng.integers(-nd, nd))
            ishape = [int(rng.integers(0, n + 1)) if i != ax % nd else int(rng.integers(0, 4)) for i, n in enumerate(shp)]
            if shp[ax] == 0:
                ishape[ax % nd] = 0
            it = pick(INTS)
            f.add("gather", [f.input(shp, d), f.input(ishape, it, fill=index_fill(f, shp[ax], it))], {"axis": ax})
    x = arr(np.arange(12.0).reshape(3, 4), "f32")
    f.add("gather", [x, arr([[3, 0, 0, 1, 2]], "i64")], {"axis": -1})
    f.error("gather", [x, arr([[0, -1]], "i64")], {"axis": 1}, "Index")
    f.error("gather", [x, arr([[0, 4]], "i32")], {"axis": 1}, "Index")
    f.error("gather", [x, arr([0, 1], "i64")], {"axis": 1}, "InvalidShape")  # fewer dims
    f.error("gather", [x, arr(np.zeros((4, 1)), "i64")], {"axis": 1}, "InvalidShape")  # larger off axis
    f.error("gather", [x, arr([[0.0]], "f32")], {"axis": 1}, "UnsupportedDType")
    f.error("gather", [x, arr([[0]], "i64")], {"axis": 2}, "AxisOutOfRange")
    # scatter_add: repeated indices accumulate; src at least the index's extent
    for d in NUMERIC:
        for k in range(5):
            shp = f.shape(max_nd=3, zero=0.1) or (3,)
            nd = len(shp)
            ax = int(rng.integers(-nd, nd))
            ishape = [int(rng.integers(0, n + 1)) if i != ax % nd else int(rng.integers(0, 5)) for i, n in enumerate(shp)]
            if shp[ax] == 0:
                ishape[ax % nd] = 0
            sshape = [n + int(rng.integers(0, 2)) for n in ishape]
            it = pick(INTS)
            idx = f.input(ishape, it, fill=index_fill(f, shp[ax], it))
            f.add("scatter_add", [f.input(shp, d), idx, f.input(sshape, d)], {"axis": ax})
    f.add("scatter_add", [arr([250, 0], "u8"), arr([0, 0, 1], "i64"), arr([3, 4, 5], "u8")], {"axis": 0})  # wraps
    f.add("scatter_add", [arr([2**31 - 1, 0], "i32"), arr([0], "i32"), arr([1], "i32")], {"axis": 0})
    x, s = arr(np.zeros((2, 3)), "f64"), arr(np.ones((2, 3)), "f64")
    f.error("scatter_add", [x, arr([[0, -1, 0]], "i64"), s], {"axis": 1}, "Index")
    f.error("scatter_add", [x, arr([[2, 0, 0]], "i64"), s], {"axis": 0}, "Index")
    f.error("scatter_add", [x, arr(np.zeros((3, 3)), "i64"), s], {"axis": 0}, "InvalidShape")  # larger than src
    f.error("scatter_add", [x, arr(np.zeros((2, 4)), "i64"), arr(np.ones((2, 4)), "f64")], {"axis": 0}, "InvalidShape")
    f.error("scatter_add", [x, arr([0, 1], "i64"), s], {"axis": 0}, "InvalidShape")
    f.error("scatter_add", [x, arr([[0]], "i64"), arr(np.ones((2, 3)), "f32")], {"axis": 0}, "DTypeMismatch")
    f.error("scatter_add", [arr([True], "bool"), arr([0], "i64"), arr([True], "bool")], {"axis": 0}, "UnsupportedDType")
    f.error("scatter_add", [x, arr([[0.0]], "f64"), s], {"axis": 0}, "UnsupportedDType")
    f.error("scatter_add", [x, arr([[0]], "i64"), s], {"axis": -3}, "AxisOutOfRange")
    # take: flat indices of any shape
    for d in ALL:
        for k in range(4):
            shp = f.shape(max_nd=3, zero=0.1)
            size = int(np.prod(shp))
            ishape = f.shape(max_nd=2, zero=0.1) if size else (0,)
            it = pick(INTS)
            f.add("take", [f.input(shp, d), f.input(ishape, it, fill=index_fill(f, size, it))])
    f.add("take", [arr(7.5, "f64"), arr([0, 0], "i32")])
    f.error("take", [arr(np.zeros((2, 2)), "f64"), arr([4], "i64")], {}, "Index")
    f.error("take", [arr(np.zeros((2, 2)), "f64"), arr([-1], "i64")], {}, "Index")
    f.error("take", [arr(np.zeros((2, 2)), "f64"), arr([1.0], "f32")], {}, "UnsupportedDType")
    # boolean_mask: a mask of the whole shape or of a leading part (whole rows)
    for d in ALL:
        for k in range(5):
            shp = f.shape(max_nd=3, zero=0.1) or (4,)
            lead = int(rng.integers(1, len(shp) + 1))
            f.add("boolean_mask", [f.input(shp, d), f.input(shp[:lead], "bool")])
    f.add("boolean_mask", [arr([1.0, 2.0], "f32"), arr([False, False], "bool")])
    f.error("boolean_mask", [arr([1.0, 2.0], "f32"), arr([1, 0], "u8")], {}, "UnsupportedDType")
    f.error("boolean_mask", [arr(np.zeros((2, 3)), "f32"), arr([True, False, True], "bool")], {}, "InvalidShape")
    f.error("boolean_mask", [arr(np.zeros((2, 3)), "f32"), arr(True, "bool")], {}, "InvalidShape")
    f.error("boolean_mask", [arr([1.0, 2.0], "f64"), arr([[True, False]], "bool")], {}, "InvalidShape")
    # masked_fill: the mask broadcasts to the input's shape; the value takes its dtype
    for d in ALL:
        values = [-1.5, 0.0, 2.7, 1e10] + ([np.nan, -np.inf] if d in FLOATS else [-7.9])
        for k in range(5):
            shp = f.shape(max_nd=3, zero=0.1)
            ms = [1 if rng.random() < 0.3 else n for n in shp]
            ms = ms[int(rng.integers(0, len(ms) + 1)) :] if rng.random() < 0.4 else ms
            f.add("masked_fill", [f.input(shp, d), f.input(ms, "bool")], {"value": pick(values)})
    f.add("masked_fill", [arr([1, 2, 3], "u8"), arr([True, False, True], "bool")], {"value": 300.0})  # saturates
    f.add("masked_fill", [arr([False, False], "bool"), arr([True, False], "bool")], {"value": 0.5})
    f.error("masked_fill", [arr([1.0, 2.0], "f64"), arr([1, 0], "i32")], {"value": 0.0}, "UnsupportedDType")
    f.error("masked_fill", [arr([1.0, 2.0], "f64"), arr([[True, False]], "bool")], {"value": 0.0}, "ShapeMismatch")
    f.error("masked_fill", [arr([[1.0, 2.0]], "f64"), arr([True, False, True], "bool")], {"value": 0.0}, "ShapeMismatch")
    f.error("masked_fill", [arr([1, 2], "i32"), arr([True, False], "bool")], {"value": np.nan}, "InvalidArgument")
    f.error("masked_fill", [arr([1, 2], "i64"), arr([True, False], "bool")], {"value": np.inf}, "InvalidArgument")
    # Zero-size inputs that are views with a non-zero offset.
    for d in ["f64", "i32", "bool"]:
        f.add("index_select", [zero_view(f, d), arr([0, 0], "i64")], {"axis": 0})
        f.add("index_select", [zero_view(f, d, 1), arr(np.zeros((0,)), "i32", view="::-1")], {"axis": 0})
        f.add("gather", [zero_view(f, d), arr(np.zeros((1, 0)), "i64")], {"axis": 0})
        f.add("take", [zero_view(f, d), arr(np.zeros((0, 2)), "u8")])
        f.add("boolean_mask", [zero_view(f, d), arr([True], "bool")])
        f.add("masked_fill", [zero_view(f, d, 1), arr([True, False, True], "bool")], {"value": 1.0})
        if d != "bool":
            f.add("scatter_add", [zero_view(f, d), arr(np.zeros((1, 0)), "i64"), zero_view(f, d)], {"axis": 1})
    # U8 indices above 127 (read as unsigned) into a long axis.
    f.add("index_select", [arr(np.arange(256), "i32"), arr([255, 128, 0, 200], "u8")], {"axis": 0})
    f.add("take", [arr(np.arange(512).reshape(2, 256), "i64"), arr([[255, 129], [7, 254]], "u8")])
    f.add("gather", [arr(np.arange(300.0).reshape(1, 300) / 8, "f64"), arr([[255, 130, 3]], "u8")], {"axis": -1})
    return f


def gen_logical():
    f = Family("logical", 11)
    rng = f.rng
    for op in ["logical_and", "logical_or", "logical_xor"]:
        for k in range(6):
            sa, sb = broadcast_pair(f)
            f.add(op, [f.input(sa, "bool"), f.input(sb, "bool")])
        for d in NUMERIC:
            f.error(op, [arr([1, 0], d), arr([True, False], "bool")], {}, "UnsupportedDType")
        f.error(op, [arr([True, False], "bool"), arr([1, 0], "u8")], {}, "UnsupportedDType")
        f.error(op, [arr([True, False], "bool"), arr([True, False, True], "bool")], {}, "ShapeMismatch")
    for k in range(5):
        f.add("logical_not", [f.input(f.shape(max_nd=3, zero=0.1), "bool")])
    for d in NUMERIC:
        f.error("logical_not", [arr([1, 0], d)], {}, "UnsupportedDType")
    for op in ["any", "all"]:
        for d in ALL:
            for k in range(6):
                shp = f.shape(max_nd=3, zero=0.12)
                x = f.input(shp, d)
                # mostly zeros (any) or mostly non-zeros (all), so both answers occur
                keep = rng.random(x.base.shape) < (0.15 if op == "any" else 0.85)
                fill = np.ones((), NP[d]) if op == "any" and d == "bool" else np.zeros((), NP[d])
                x.base = np.where(keep, x.base, fill if op == "all" else np.zeros((), NP[d]))
                f.add(op, [x], axes_params(f, len(shp)))
        f.add(op, [arr([0.0, np.nan, 0.0], "f64")], {})  # NaN is true
        f.add(op, [arr([[0.0, -0.0], [np.nan, 1.0]], "f32")], {"axes": [-1], "keep_dims": True})
        f.add(op, [arr(np.zeros((0,)), "f64")], {})  # any: false, all: true
        f.add(op, [arr(np.zeros((2, 0)), "i32")], {"axes": [1], "keep_dims": False})
        f.add(op, [arr([[0, 3], [0, 0]], "u8")], {"axes": [], "keep_dims": False})  # reduces nothing
        f.error(op, [arr(np.zeros((2, 3)), "f64")], {"axes": [2], "keep_dims": False}, "AxisOutOfRange")
        f.error(op, [arr(np.zeros((2, 3)), "bool")], {"axes": [0, -2], "keep_dims": False}, "InvalidArgument")
    for op in ["logical_and", "logical_or", "logical_xor"]:
        f.add(op, [zero_view(f, "bool"), arr([True], "bool")])
        f.add(op, [arr(np.zeros((0,)), "bool"), arr(np.zeros((3, 1)), "bool")])
    f.add("logical_not", [zero_view(f, "bool", 1)])
    for op in ["any", "all"]:
        f.add(op, [zero_view(f, "f32")], {})
        f.add(op, [zero_view(f, "u8")], {"axes": [1], "keep_dims": True})
        f.add(op, [zero_view(f, "bool", 1)], {"axes": [-2], "keep_dims": False})
    return f


def gen_stats():
    f = Family("stats", 12)
    rng = f.rng
    for op in ["var", "std", "logsumexp"]:
        for d in FLOATS:
            for k in range(10):
                shp = f.shape(max_nd=3, zero=0.1)
                f.add(op, [f.input(shp, d)], axes_params(f, len(shp)))
            f.add(op, [f.input((37,), d, noncontig=0.0)], {"axes": [0], "keep_dims": False})
            f.add(op, [f.input((5, 9), d, noncontig=1.0)], {"axes": [-2], "keep_dims": True})
            f.add(op, [arr(np.zeros((0, 3)), d)], {"axes": [0], "keep_dims": False})  # var/std NaN; logsumexp -inf
            f.add(op, [arr(np.zeros((0,)), d)], {})
            f.add(op, [arr(np.zeros((2, 0)), d)], {"axes": [0], "keep_dims": True})
            f.add(op, [arr([[1.5, -2.0], [0.5, 3.0]], d)], {"axes": [], "keep_dims": False})  # reduces nothing
            f.add(op, [arr(2.5, d)], {})
        for d in INTS + ["bool"]:
            f.error(op, [arr([1, 0], d)], {}, "UnsupportedDType")
            f.error(op, [arr([1, 0], d)], {"axes": [0], "keep_dims": False}, "UnsupportedDType")
        f.error(op, [arr(np.zeros((2, 3)), "f64")], {"axes": [-3], "keep_dims": False}, "AxisOutOfRange")
        f.error(op, [arr(np.zeros((2, 3)), "f32")], {"axes": [1, 1], "keep_dims": False}, "InvalidArgument")
    # A constant lane: var exactly 0; std's gradient there is 0 (PyTorch: NaN).
    for op in ["var", "std"]:
        f.add(op, [arr([[2.0, 2.0, 2.0], [1.0, 2.0, 4.0]], "f64")], {"axes": [1], "keep_dims": False}, fd_check=False)
        f.add(op, [arr([0.1, 0.1, 0.1, 0.1, 0.1], "f32")], {}, fd_check=False)
        # no cancellation (Welford); central differences cancel here, the complex step does not
        f.add(op, [arr([1e8 + 1, 1e8 + 2, 1e8 + 3], "f64")], {}, fd_check=False)
        f.add(op, [arr([1.0, np.nan, 2.0], "f64")], {})
        f.add(op, [arr([1.0, np.inf], "f32")], {"axes": [0], "keep_dims": False})
    # logsumexp: stable for large values, -inf lanes give -inf, +inf gives +inf.
    for d in FLOATS:
        f.add("logsumexp", [arr([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]], d)], {"axes": [-1], "keep_dims": False})
        f.add("logsumexp", [arr([[0.0, 0.0], [-np.inf, -np.inf], [-np.inf, 1.0], [np.inf, 1.0], [np.nan, 1.0]], d)], {"axes": [1], "keep_dims": True})
        f.add("logsumexp", [arr([-np.inf, -np.inf], d)], {})
    # cumsum: integers keep their dtype and wrap (numpy widens)
    for d in NUMERIC:
        for k in range(6):
            shp = f.shape(max_nd=3, zero=0.1) or (4,)
            nd = len(shp)
            f.add("cumsum", [f.input(shp, d)], {"axis": int(rng.integers(-nd, nd))})
        f.add("cumsum", [f.input((37,), d, noncontig=0.0)], {"axis": 0})
    f.add("cumsum", [arr([2**31 - 1, 1, 5], "i32")], {"axis": 0})
    f.add("cumsum", [arr([200, 100, 7], "u8")], {"axis": -1})
    f.add("cumsum", [arr([2**63 - 1, 1], "i64")], {"axis": 0})
    f.add("cumsum", [arr([1.0, np.nan, 2.0, np.inf, -np.inf], "f64")], {"axis": 0})
    f.error("cumsum", [arr([True, False], "bool")], {"axis": 0}, "UnsupportedDType")
    f.error("cumsum", [arr(1.0, "f64")], {"axis": 0}, "AxisOutOfRange")
    f.error("cumsum", [arr(np.zeros((2, 3)), "i32")], {"axis": 2}, "AxisOutOfRange")
    f.error("cumsum", [arr(np.zeros((2, 3)), "i32")], {"axis": -3}, "AxisOutOfRange")
    # norm: rescaled (no overflow/underflow), 0 for empty, gradient 0 at 0
    for d in FLOATS:
        for k in range(6):
            f.add("norm", [f.input(f.shape(max_nd=3, zero=0.1), d)])
        f.add("norm", [arr(np.zeros((2, 2)), d)], fd_check=False)
        f.add("norm", [arr([np.nan, 1.0], d)])
        f.add("norm", [arr([np.inf, -1.0], d)])
        f.add("norm", [arr([-np.inf, np.nan], d)])
    # (central differences with a step of 1e-6 mean nothing at these scales)
    f.add("norm", [arr([1e200, -1e200, 3e199], "f64")], fd_check=False)
    f.add("norm", [arr([3e30, 4e30], "f32")], fd_check=False)
    # (no gradient: the complex step h = 1e-30 is not small against these values)
    f.add("norm", [arr([1e-200, 1e-200], "f64")], grad=False)
    f.add("norm", [arr([3e-30, -4e-30], "f32")], grad=False)
    for d in INTS + ["bool"]:
        f.error("norm", [arr([1, 0], d)], {}, "UnsupportedDType")
    for d in FLOATS:
        for op in ["var", "std", "logsumexp"]:
            f.add(op, [zero_view(f, d)], {"axes": [0], "keep_dims": False})
            f.add(op, [zero_view(f, d)], {"axes": [-1], "keep_dims": True})
        f.add("cumsum", [zero_view(f, d, 1)], {"axis": 1})
        f.add("norm", [zero_view(f, d)])
        f.add("norm", [arr(np.zeros((0, 3)), d)])
    f.add("cumsum", [zero_view(f, "i64")], {"axis": -1})
    return f


def gen_unary_fn():
    f = Family("unary_fn", 13)
    domain = {"rsqrt": (0.1, 4.0), "log1p": (-0.9, 4.0), "reciprocal": (0.2, 3.0)}
    for op in ["erf", "gelu", "silu", "softplus", "leaky_relu", "reciprocal", "rsqrt", "log1p", "expm1"]:
        p = {"alpha": 0.1} if op == "leaky_relu" else {}
        for d in FLOATS:
            lo, hi = domain.get(op, (-3.0, 3.0))
            for k in range(6):
                x = f.input(f.shape(max_nd=3, zero=0.1), d, lo=lo, hi=hi)
                if op == "reciprocal" and k % 2:
                    x.base = np.negative(x.base)
                if op == "leaky_relu":
                    x.base = np.where(x.base == 0, 0.5, x.base).astype(NP[d])
                    p = {"alpha": [0.1, 0.01, -0.5, 1.5, 0.0, 0.3][k]}
                f.add(op, [x], p)
            f.add(op, [f.input((7,), d, special=True)], p, grad=False)
            f.add(op, [arr([np.nan, np.inf, -np.inf, 0.0, -0.0], d)], p, grad=False)
        for d in INTS + ["bool"]:
            f.error(op, [arr([1, 0], d)], p, "UnsupportedDType")
    # Tails and exact limits (ndscope's documented values).
    for d in FLOATS:
        f.add("gelu", [arr([-10.0, -5.0, 5.0, 10.0, 1e-8], d)])
        f.add("gelu", [arr([-30.0, -np.inf], d)], grad=False)  # -inf: 0 (the limit)
        f.add("erf", [arr([-6.0, 6.0, 1e-10, -0.5], d)])
        f.add("silu", [arr([-40.0, 40.0, 1e-8], d)])
        f.add("softplus", [arr([-30.0, 30.0, 20.0, 0.0], d)])
        f.add("softplus", [arr([-1000.0, 1000.0], d)], grad=False)
        f.add("log1p", [arr([1e-20, -1e-20, 1e-7], d)])
        f.add("expm1", [arr([1e-20, -1e-20, 1e-7, -20.0], d)])
        f.add("reciprocal", [arr([1e-3, -1e3, 7.0], d)])
        f.add("rsqrt", [arr([1e-3, 1e6, 2.0], d)])
        f.add("rsqrt", [arr([-1.0, 0.0, -0.0], d)], grad=False)
    # leaky_relu: the gradient at 0 is alpha (as PyTorch); alpha must be finite.
    f.add("leaky_relu", [arr([0.0, -2.0, 3.0], "f64")], {"alpha": 0.25}, fd_check=False)
    f.error("leaky_relu", [arr([1.0], "f64")], {"alpha": np.nan}, "InvalidArgument")
    f.error("leaky_relu", [arr([1.0], "f32")], {"alpha": np.inf}, "InvalidArgument")
    # floor/ceil/round/sign: numeric dtypes, not differentiable; integers unchanged
    for op in ["floor", "ceil", "round", "sign"]:
        for d in NUMERIC:
            for k in range(4):
                x = f.input(f.shape(max_nd=3, zero=0.1), d)
                if d in FLOATS and k % 2:
                    x.base = (np.round(x.base * 2) / 2).astype(NP[d])  # halves: ties for round
                f.add(op, [x])
            f.add(op, [f.input((7,), d, special=True)])
        f.add(op, [arr([0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 0.49999999999999994, 4503599627370497.0, -0.0], "f64")])
        f.add(op, [arr([0.5, 1.5, 2.5, -0.5, -2.5, 8388609.0, 1e30, np.nan, np.inf, -np.inf], "f32")])
        f.error(op, [arr([True, False], "bool")], {}, "UnsupportedDType")
    for op in ["erf", "gelu", "silu", "softplus", "reciprocal", "rsqrt", "log1p", "expm1", "floor", "ceil", "round", "sign"]:
        f.add(op, [zero_view(f, "f32")])
    f.add("leaky_relu", [zero_view(f, "f64", 1)], {"alpha": 0.2})
    f.add("sign", [zero_view(f, "i32")])
    f.add("round", [zero_view(f, "u8", 1)])
    return f


def gen_shape_ops():
    f = Family("shape_ops", 14)
    rng = f.rng
    for d in ALL:
        for k in range(3):
            shp = f.shape(max_nd=3, zero=0.1) or (4,)
            nd = len(shp)
            ax = int(rng.integers(-nd, nd))
            n = shp[ax]
            divisors = [s for s in range(1, 5) if n % s == 0] if n else [1, 2, 3]
            f.add("split", [f.input(shp, d)], {"sections": int(divisors[int(rng.integers(len(divisors)))]), "axis": ax})
            f.add("repeat", [f.input(shp, d)], {"repeats": int(rng.integers(0, 4)), "axis": int(rng.integers(-nd, nd))})
            shp2 = f.shape(max_nd=3, zero=0.1)
            reps = [int(rng.integers(0, 4)) if rng.random() < 0.2 else int(rng.integers(1, 4)) for _ in range(int(rng.integers(0, len(shp2) + 2)))]
            f.add("tile", [f.input(shp2, d)], {"reps": reps})
            widths = [[int(rng.integers(0, 3)), int(rng.integers(0, 3))] for _ in shp2]
            values = [2.7, -1.0, 0.0, 300.0] + ([np.nan, -np.inf] if d in FLOATS else [-5.9])
            f.add("pad", [f.input(shp2, d)], {"widths": widths, "value": values[int(rng.integers(len(values)))]})
            f.add("swap_axes", [f.input(shp, d)], {"a": int(rng.integers(-nd, nd)), "b": int(rng.integers(-nd, nd))})
            fl = sorted(rng.choice(len(shp2), int(rng.integers(0, len(shp2) + 1)), replace=False).tolist()) if shp2 else []
            fl = [int(a - len(shp2)) if rng.random() < 0.5 else int(a) for a in fl]
            f.add("flip", [f.input(shp2, d)], {"axes": fl})
            s3 = tuple(int(v) for v in rng.integers(0, 4, int(rng.integers(2, 4))))
            for op in ["tril", "triu"]:
                f.add(op, [f.input(s3, d)], {"k": int(rng.integers(-3, 4))})
            for op in ["zeros_like", "ones_like"]:
                f.add(op, [f.input(shp2, d)])
            f.add("full_like", [f.input(shp2, d)], {"value": values[int(rng.integers(len(values)))]})
    x = arr(np.arange(6.0).reshape(2, 3), "f64")
    f.add("split", [x], {"sections": 1, "axis": 0})
    f.add("split", [arr(np.zeros((0, 2)), "i32")], {"sections": 3, "axis": 0})
    f.error("split", [x], {"sections": 0, "axis": 0}, "InvalidArgument")
    f.error("split", [x], {"sections": 2, "axis": 1}, "InvalidArgument")  # 3 is not divisible
    f.error("split", [x], {"sections": 1, "axis": 2}, "AxisOutOfRange")
    f.error("split", [arr(1.0, "f64")], {"sections": 1, "axis": 0}, "AxisOutOfRange")
    f.add("repeat", [x], {"repeats": 0, "axis": -1})
    f.error("repeat", [x], {"repeats": 2, "axis": -3}, "AxisOutOfRange")
    f.error("repeat", [arr(1, "u8")], {"repeats": 2, "axis": 0}, "AxisOutOfRange")
    f.add("tile", [arr(3.5, "f64")], {"reps": [2, 3]})
    f.add("tile", [x], {"reps": []})
    f.add("pad", [arr(4.0, "f32")], {"widths": [], "value": 1.0})
    f.add("pad", [arr([1, 2], "u8")], {"widths": [[1, 1]], "value": -3.0})  # saturates to 0
    f.add("pad", [arr([True], "bool")], {"widths": [[1, 0]], "value": np.nan})  # NaN != 0: true
    f.error("pad", [x], {"widths": [[1, 1]], "value": 0.0}, "InvalidArgument")
    f.error("pad", [x], {"widths": [[1, 1], [0, 0], [0, 0]], "value": 0.0}, "InvalidArgument")
    f.error("pad", [arr([1, 2], "i32")], {"widths": [[1, 1]], "value": np.nan}, "InvalidArgument")
    f.error("swap_axes", [x], {"a": 0, "b": 2}, "AxisOutOfRange")
    f.error("swap_axes", [arr(1.0, "f64")], {"a": 0, "b": 0}, "AxisOutOfRange")
    f.add("flip", [x], {"axes": []})  # flips nothing (numpy's axis=None flips all)
    f.error("flip", [x], {"axes": [2]}, "AxisOutOfRange")
    f.error("flip", [x], {"axes": [1, -1]}, "InvalidArgument")
    for op in ["tril", "triu"]:
        f.add(op, [arr(np.arange(1.0, 13.0).reshape(3, 4), "f64")], {"k": 10})
        f.add(op, [arr(np.arange(1.0, 13.0).reshape(3, 4), "f64")], {"k": -10})
        f.add(op, [arr(np.arange(1, 13).reshape(3, 4), "i64", view="::-1, 1:")], {"k": 1})
        f.error(op, [arr([1.0, 2.0], "f64")], {"k": 0}, "InvalidShape")
        f.error(op, [arr(1, "i32")], {"k": 0}, "InvalidShape")
    f.add("full_like", [arr([1, 2], "i32")], {"value": -2.9})  # truncates
    f.add("full_like", [arr([1, 2], "u8")], {"value": 1e10})  # saturates
    f.add("full_like", [arr(np.zeros((0, 2)), "f64")], {"value": 1.0})
    f.add("full_like", [arr([False], "bool")], {"value": -0.5})
    f.error("full_like", [arr([1, 2], "i64")], {"value": np.inf}, "InvalidArgument")
    f.error("full_like", [arr([1, 2], "u8")], {"value": np.nan}, "InvalidArgument")
    for d in ["f64", "i64", "bool"]:
        f.add("split", [zero_view(f, d)], {"sections": 1, "axis": 1})
        f.add("repeat", [zero_view(f, d)], {"repeats": 3, "axis": 0})
        f.add("tile", [zero_view(f, d)], {"reps": [2, 2]})
        f.add("pad", [zero_view(f, d)], {"widths": [[1, 0], [1, 2]], "value": 1.0})
        f.add("swap_axes", [zero_view(f, d)], {"a": 0, "b": -1})
        f.add("flip", [zero_view(f, d)], {"axes": [0, 1]})
        f.add("tril", [zero_view(f, d, 1)], {"k": 0})
        f.add("triu", [zero_view(f, d)], {"k": -1})
        for op in ["zeros_like", "ones_like"]:
            f.add(op, [zero_view(f, d)])
        f.add("full_like", [zero_view(f, d)], {"value": 2.0})
    # Too large a result is an error, not an overflow.
    f.error("repeat", [arr(np.zeros((4, 2)), "f32")], {"repeats": 2**62, "axis": 0}, "InvalidShape")
    f.error("tile", [arr(np.zeros((2, 2)), "f32")], {"reps": [2**62, 8]}, "InvalidShape")
    f.error("pad", [arr([1.0], "f64")], {"widths": [[2**63, 2**63]], "value": 0.0}, "InvalidShape")
    f.add("split", [arr(np.arange(12.0).reshape(3, 4), "f32", perm=[1, 0])], {"sections": 4, "axis": 0})
    f.add("swap_axes", [arr(np.arange(6).reshape(1, 2, 3), "i32")], {"a": -2, "b": 1})
    f.add("full_like", [arr([False], "bool")], {"value": np.nan})  # NaN != 0: true
    # Extreme diagonals and counts that only fit because an axis is empty.
    for op in ["tril", "triu"]:
        f.add(op, [arr(np.arange(1, 7).reshape(2, 3), "i32")], {"k": 2**63 - 1})
        f.add(op, [arr(np.arange(1, 7).reshape(2, 3), "i32")], {"k": -(2**63)})
    f.add("repeat", [arr(np.zeros((0, 2)), "f32")], {"repeats": 2**62, "axis": 0})
    f.add("tile", [arr(np.zeros((0,)), "u8")], {"reps": [2**62]})
    f.error("flip", [arr(1.0, "f64")], {"axes": [0]}, "AxisOutOfRange")
    f.add("flip", [arr(1.0, "f64")], {"axes": []})
    return f


def conv_case(f, d, rng):
    """Random valid conv2d geometry (the window always fits)."""
    g = int([1, 1, 2, 3][int(rng.integers(4))])
    cg, og = int(rng.integers(1, 3)), int(rng.integers(1, 3))
    kh, kw = (int(v) for v in rng.integers(1, 4, 2))
    sh, sw = (int(v) for v in rng.integers(1, 3, 2))
    ph, pw = (int(v) for v in rng.integers(0, 3, 2))
    dh, dw = (int(v) for v in rng.integers(1, 3, 2))
    h = max(1, dh * (kh - 1) + 1 - 2 * ph) + int(rng.integers(0, 3))
    w = max(1, dw * (kw - 1) + 1 - 2 * pw) + int(rng.integers(0, 3))
    n = int(rng.integers(0, 3)) if rng.random() < 0.2 else int(rng.integers(1, 3))
    x = f.input((n, g * cg, h, w), d, lo=-1, hi=1)
    wt = f.input((g * og, cg, kh, kw), d, lo=-1, hi=1)
    ins = [x, wt] + ([f.input((g * og,), d, lo=-1, hi=1)] if rng.random() < 0.6 else [])
    return ins, {"stride": [sh, sw], "padding": [ph, pw], "dilation": [dh, dw], "groups": g}


def gen_conv():
    f = Family("conv", 15)
    rng = f.rng
    for d in FLOATS:
        for k in range(14):
            ins, p = conv_case(f, d, rng)
            f.add("conv2d", ins, p)
    p1 = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}
    x = arr(np.arange(16.0).reshape(1, 1, 4, 4) / 8, "f64")
    f.add("conv2d", [x, arr(np.ones((2, 1, 3, 3)), "f64"), arr([0.0, 100.0], "f64")], p1)
    f.add("conv2d", [x, arr(np.zeros((0, 1, 2, 2)), "f64"), arr(np.zeros((0,)), "f64")], p1)  # no filters
    f.add("conv2d", [x, arr(np.ones((1, 1, 4, 4)), "f64")], p1)  # the window is the whole input
    f.add("conv2d", [x, arr(np.ones((1, 1, 2, 2)), "f64")], dict(p1, padding=[1, 0], stride=[3, 2]))
    w = arr(np.ones((2, 1, 3, 3)), "f64")
    f.error("conv2d", [arr(np.zeros((1, 4, 4)), "f64"), w], p1, "InvalidArgument")  # not 4-D
    f.error("conv2d", [x, arr(np.ones((2, 3, 3)), "f64")], p1, "InvalidArgument")
    f.error("conv2d", [x, arr(np.ones((2, 2, 3, 3)), "f64")], p1, "InvalidArgument")  # channels
    f.error("conv2d", [arr(np.zeros((1, 4, 4, 4)), "f64"), arr(np.ones((3, 2, 3, 3)), "f64")], dict(p1, groups=2), "InvalidArgument")  # O % groups
    f.error("conv2d", [x, w, arr([0.0, 1.0, 2.0], "f64")], p1, "InvalidArgument")  # bias not [O]
    f.error("conv2d", [x, w], dict(p1, stride=[0, 1]), "InvalidArgument")
    f.error("conv2d", [x, w], dict(p1, dilation=[1, 0]), "InvalidArgument")
    f.error("conv2d", [x, w], dict(p1, groups=0), "InvalidArgument")
    f.error("conv2d", [x, arr(np.ones((1, 1, 5, 3)), "f64")], p1, "InvalidArgument")  # window too large
    f.error("conv2d", [x, w], dict(p1, dilation=[2, 2]), "InvalidArgument")  # dilated: 5 > 4
    f.error("conv2d", [arr(np.zeros((1, 1, 4, 4)), "i32"), arr(np.ones((2, 1, 3, 3)), "i32")], p1, "UnsupportedDType")
    f.error("conv2d", [x, arr(np.ones((2, 1, 3, 3)), "f32")], p1, "DTypeMismatch")
    f.error("conv2d", [x, w, arr([0.0, 1.0], "f32")], p1, "DTypeMismatch")
    # pools: [N, C, H, W] or [C, H, W]; padding at most half the kernel
    for op in ["max_pool2d", "avg_pool2d"]:
        for d in FLOATS:
            for k in range(10):
                kh, kw = (int(v) for v in rng.integers(1, 4, 2))
                p = {
                    "kernel": [kh, kw],
                    "stride": [int(v) for v in rng.integers(1, 4, 2)],
                    "padding": [int(rng.integers(0, kh // 2 + 1)), int(rng.integers(0, kw // 2 + 1))],
                }
                h = max(1, kh - 2 * p["padding"][0]) + int(rng.integers(0, 4))
                w = max(1, kw - 2 * p["padding"][1]) + int(rng.integers(0, 4))
                lead = [(int(rng.integers(1, 3)),), (int(rng.integers(0, 3)), int(rng.integers(1, 3)))][int(rng.integers(2))]
                f.add(op, [f.input(lead + (h, w), d, fill=distinct_fill(f, d))], p)
        p = {"kernel": [2, 2], "stride": [1, 1], "padding": [0, 0]}
        f.add(op, [arr([[[[1.0, np.nan, 2.0], [0.5, 3.0, np.inf]]]], "f64")], p)
        f.add(op, [arr(np.zeros((0, 3, 2, 2)), "f32")], p)
        f.add(op, [arr(np.zeros((2, 0, 2, 2)), "f64")], p)
        f.add(op, [arr(np.arange(25.0).reshape(1, 5, 5) / 4, "f64")], {"kernel": [3, 3], "stride": [2, 2], "padding": [1, 1]})
        f.error(op, [arr(np.zeros((4, 4)), "f64")], p, "InvalidArgument")
        f.error(op, [arr(np.zeros((1, 1, 1, 4, 4)), "f64")], p, "InvalidArgument")
        f.error(op, [arr(np.zeros((1, 1, 4, 4)), "f64")], dict(p, kernel=[0, 2]), "InvalidArgument")
        f.error(op, [arr(np.zeros((1, 1, 4, 4)), "f64")], dict(p, stride=[1, 0]), "InvalidArgument")
        f.error(op, [arr(np.zeros((1, 1, 4, 4)), "f64")], dict(p, padding=[2, 0]), "InvalidArgument")
        f.error(op, [arr(np.zeros((1, 1, 1, 4)), "f64")], p, "InvalidArgument")  # window larger
        f.error(op, [arr(np.zeros((1, 1, 4, 4)), "i64")], p, "UnsupportedDType")
    # Ties: the gradient goes to each window's first maximum (as PyTorch).
    f.add("max_pool2d", [arr([[[[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]]]], "f64")], {"kernel": [2, 2], "stride": [1, 1], "padding": [0, 0]}, fd_check=False)
    # Zero-size inputs that are views with a non-zero offset (at the end of the base).
    p1 = {"stride": [1, 1], "padding": [0, 0], "dilation": [1, 1], "groups": 1}
    for d in FLOATS:
        x = arr(f.values((2, 1, 2, 2), d), d, view="1:, 1:")  # [1, 0, 2, 2]
        f.add("conv2d", [x, arr(np.ones((2, 0, 1, 1)), d), arr([1.0, -1.0], d)], p1)
        x = arr(f.values((2, 2, 2, 2), d), d, view="2:")  # [0, 2, 2, 2]
        f.add("conv2d", [x, arr(f.values((3, 2, 2, 1), d), d)], p1)
        for op in ["max_pool2d", "avg_pool2d"]:
            f.add(op, [arr(f.values((2, 1, 2, 2), d), d, view="1:, 1:")], {"kernel": [1, 2], "stride": [1, 1], "padding": [0, 1]})
    # A window mostly of padding: max over the one real element, avg counts the padding.
    for op in ["max_pool2d", "avg_pool2d"]:
        f.add(op, [arr([[[[-2.5]]]], "f64")], {"kernel": [3, 3], "stride": [1, 1], "padding": [1, 1]})
        f.add(op, [arr([[[-2.5, 1.0]]], "f32")], {"kernel": [3, 2], "stride": [2, 1], "padding": [1, 1]})
    # Large enough for the multi-threaded paths (im2col, col2im and the pools switch at
    # 2^15 elements of work): one case each, strided input.
    x = f.input((1, 16, 16, 16), "f64", noncontig=1.0, lo=-1, hi=1)
    f.add("conv2d", [x, f.input((2, 16, 3, 3), "f64", noncontig=0.0, lo=-1, hi=1)], dict(p1, padding=[1, 1]))
    p = {"kernel": [3, 3], "stride": [1, 1], "padding": [0, 0]}
    f.add("max_pool2d", [f.input((1, 1, 64, 64), "f32", noncontig=1.0, fill=distinct_fill(f, "f32"))], p)
    p = {"kernel": [2, 4], "stride": [1, 1], "padding": [0, 0]}
    f.add("avg_pool2d", [arr(f.values((1, 65, 70), "f32"), "f32", view="..., 1:-1")], p)
    return f


def gen_nn_ops():
    f = Family("nn_ops", 16)
    rng = f.rng
    # layer_norm over any axes; gamma/beta broadcast to x
    for d in FLOATS:
        for k in range(10):
            shp = f.shape(max_nd=3, zero=0.08) or (3,)
            nd = len(shp)
            n_ax = int(rng.integers(1, nd + 1))
            axes = sorted(rng.choice(nd, n_ax, replace=False).tolist())
            axes = [int(a - nd) if rng.random() < 0.5 else int(a) for a in axes]
            ins = [f.input(shp, d)]
            p = {"axes": axes, "eps": [1e-5, 0.1, 0.0][k % 3], "gamma": bool(k % 2), "beta": bool(k % 4 < 2)}
            for key in ("gamma", "beta"):
                if p[key]:
                    s = [n if rng.random() < 0.6 else 1 for n in shp]
                    s = s[int(rng.integers(0, len(s) + 1)) :] if rng.random() < 0.5 else s
                    ins.append(f.input(s, d, lo=0.5 if key == "gamma" else -1, hi=2.0 if key == "gamma" else 1))
            if p["eps"] == 0.0 and any(shp[a] == 1 for a in axes):
                p["eps"] = 1e-5  # a lane of one element has variance 0
            f.add("layer_norm", ins, p)
        f.add("layer_norm", [arr([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]], d)], {"axes": [-1], "eps": 1e-5, "gamma": False, "beta": False})
        f.add("layer_norm", [arr(np.zeros((0, 3)), d), arr([1.0, 2.0, 3.0], d), arr([0.0, 1.0, 0.0], d)], {"axes": [-1], "eps": 1e-5, "gamma": True, "beta": True})
        f.add("layer_norm", [arr([[1e4, 1e4 + 1.0, 1e4 + 2.0]], d)], {"axes": [1], "eps": 0.0, "gamma": False, "beta": False})
    x = arr(np.arange(6.0).reshape(2, 3), "f64")
    ln = {"axes": [-1], "eps": 1e-5, "gamma": False, "beta": False}
    f.error("layer_norm", [arr([[1, 2]], "i32")], ln, "UnsupportedDType")
    f.error("layer_norm", [x, arr([1.0, 1.0, 1.0], "f32")], dict(ln, gamma=True), "DTypeMismatch")
    f.error("layer_norm", [x], dict(ln, axes=[]), "InvalidArgument")
    f.error("layer_norm", [x], dict(ln, axes=[1, -1]), "InvalidArgument")
    f.error("layer_norm", [x], dict(ln, eps=-1e-5), "InvalidArgument")
    f.error("layer_norm", [x], dict(ln, eps=np.nan), "InvalidArgument")
    f.error("layer_norm", [x], dict(ln, axes=[2]), "AxisOutOfRange")
    f.error("layer_norm", [x, arr([1.0, 1.0], "f64")], dict(ln, gamma=True), "ShapeMismatch")
    f.error("layer_norm", [x, arr(np.ones((3, 2, 3)), "f64")], dict(ln, beta=True), "ShapeMismatch")  # enlarges x
    # batch_norm: training (batch statistics; running statistics updated in place,
    # compared after the op) and inference (running statistics, unchanged)
    for d in FLOATS:
        for k in range(12):
            c = int(rng.integers(1, 4))
            n = int(rng.integers(1, 4))
            shp = [(n + 1, c), (n, c, int(rng.integers(1, 4))), (n, c, int(rng.integers(1, 3)), int(rng.integers(1, 4)))][k % 3]
            training = k % 2 == 0
            if not training and rng.random() < 0.3:
                shp = (1, c)  # one value per channel is fine in inference
            if training and int(np.prod(shp)) == c:
                shp = (2,) + tuple(shp[1:])  # training needs more than one per channel
            ins = [
                f.input(shp, d),
                f.input((c,), d, lo=-1, hi=1),
                f.input((c,), d, lo=0.5, hi=2.0),
            ]
            p = {"training": training, "momentum": [0.1, 0.3, 0.0, 1.0][k % 4], "eps": [1e-5, 1e-3][k % 2], "gamma": k % 3 != 2, "beta": k % 4 != 3}
            if p["gamma"]:
                ins.append(f.input((c,), d, lo=0.5, hi=2.0))
            if p["beta"]:
                ins.append(f.input((c,), d, lo=-1, hi=1))
            f.add("batch_norm", ins, p)
        bn = {"training": True, "momentum": 0.1, "eps": 1e-5, "gamma": False, "beta": False}
        stats = lambda c: [arr(np.linspace(-1, 1, c), d), arr(np.linspace(0.5, 2, c), d)]
        f.add("batch_norm", [arr(np.zeros((0, 3)), d)] + stats(3), bn)  # an empty batch: no update
        f.add("batch_norm", [arr(np.zeros((2, 0, 2)), d)] + stats(0), bn)
        f.add("batch_norm", [arr([[1.0, 10.0], [3.0, 30.0]], d)] + stats(2), dict(bn, training=False))
        f.add("batch_norm", [arr([[5.0, 5.0], [5.0, 5.0]], d)] + stats(2), bn)  # constant channel
    x = arr(np.arange(6.0).reshape(3, 2), "f64")
    rm, rv = arr([0.0, 0.5], "f64"), arr([1.0, 2.0], "f64")
    bn = {"training": True, "momentum": 0.1, "eps": 1e-5, "gamma": False, "beta": False}
    keep = (1, 2)
    f.error("batch_norm", [arr([[1.0, 2.0]], "f64"), rm, rv], bn, "InvalidArgument", keep)  # 1 value per channel
    f.error("batch_norm", [arr([1.0, 2.0], "f64"), rm, rv], bn, "InvalidArgument", keep)  # 1-D
    f.error("batch_norm", [x, arr([0.0, 0.0, 0.0], "f64"), rv], bn, "InvalidArgument", keep)
    f.error("batch_norm", [x, rm, rv, arr([1.0], "f64")], dict(bn, gamma=True), "InvalidArgument", keep)
    f.error("batch_norm", [x, arr([0.0, 0.5], "f32"), rv], bn, "DTypeMismatch", keep)
    f.error("batch_norm", [arr([[1, 2], [3, 4]], "i32"), arr([0, 0], "i32"), arr([1, 1], "i32")], bn, "UnsupportedDType", keep)
    f.error("batch_norm", [x, rm, rv], dict(bn, eps=-1.0), "InvalidArgument", keep)
    f.error("batch_norm", [x, rm, rv], dict(bn, momentum=np.nan), "InvalidArgument", keep)
    f.error("batch_norm", [x, rm, rv], dict(bn, momentum=np.inf), "InvalidArgument", keep)
    # embedding: rows of a [V, D] table at ids of any shape and integer dtype
    for d in FLOATS:
        for k in range(8):
            v, dd = int(rng.integers(1, 5)), int(rng.integers(0, 4) if k % 4 == 0 else rng.integers(1, 4))
            ishape = f.shape(max_nd=2, max_dim=4, zero=0.1)
            it = INTS[k % 3]
            f.add("embedding", [f.input((v, dd), d), f.input(ishape, it, fill=index_fill(f, v, it))])
        f.add("embedding", [arr(np.zeros((0, 3)), d), arr(np.zeros((0,)), "i64")])
        f.add("embedding", [arr([[1.0, 2.0], [3.0, 4.0]], d), arr([[1, 1], [1, 0]], "i64")])
    t = arr(np.ones((3, 2)), "f64")
    f.error("embedding", [arr(np.ones((3, 2)), "i32"), arr([0], "i64")], {}, "UnsupportedDType")
    f.error("embedding", [t, arr([0.0], "f64")], {}, "UnsupportedDType")
    f.error("embedding", [t, arr([True], "bool")], {}, "UnsupportedDType")
    f.error("embedding", [arr(np.ones((3,)), "f64"), arr([0], "i64")], {}, "InvalidArgument")
    f.error("embedding", [arr(np.ones((3, 2, 1)), "f64"), arr([0], "i64")], {}, "InvalidArgument")
    f.error("embedding", [t, arr([3], "i64")], {}, "Index")
    f.error("embedding", [t, arr([[0, -1]], "i32")], {}, "Index")
    # cross_entropy: logits [N, C], integer labels [N]; mean over the batch
    for d in FLOATS:
        for k in range(8):
            n, c = int(rng.integers(1, 5)), int(rng.integers(1, 6))
            it = INTS[k % 3]
            f.add("cross_entropy", [f.input((n, c), d, lo=-4, hi=4), f.input((n,), it, fill=index_fill(f, c, it))])
        f.add("cross_entropy", [arr([[0.0, 0.0], [1e4, 0.0], [-1e4, 1e4]], d), arr([1, 0, 0], "i64")])
        f.add("cross_entropy", [arr([[1000.0, 1001.0, 999.0], [-1000.0, -1002.0, -1001.0]], d), arr([2, 1], "u8")])
        f.add("cross_entropy", [arr(np.zeros((0, 3)), d), arr(np.zeros((0,)), "i64")])  # NaN
    lg = arr(np.zeros((2, 3)), "f64")
    f.error("cross_entropy", [arr(np.zeros((2, 3)), "i64"), arr([0, 1], "i64")], {}, "UnsupportedDType")
    f.error("cross_entropy", [lg, arr([0.0, 1.0], "f64")], {}, "UnsupportedDType")
    f.error("cross_entropy", [lg, arr([True, False], "bool")], {}, "UnsupportedDType")
    f.error("cross_entropy", [arr(np.zeros((3,)), "f64"), arr([0], "i64")], {}, "InvalidArgument")
    f.error("cross_entropy", [lg, arr([0, 1, 2], "i64")], {}, "InvalidArgument")
    f.error("cross_entropy", [lg, arr([[0], [1]], "i64")], {}, "InvalidArgument")
    f.error("cross_entropy", [lg, arr([0, 3], "i64")], {}, "Index")
    f.error("cross_entropy", [lg, arr([-1, 0], "i32")], {}, "Index")  # no ignore_index
    f.error("cross_entropy", [arr(np.zeros((2, 0)), "f64"), arr([0, 0], "i64")], {}, "Index")
    # mse_loss and binary_cross_entropy_with_logits: same shapes and dtypes, mean
    for op in ["mse_loss", "binary_cross_entropy_with_logits"]:
        for d in FLOATS:
            for k in range(6):
                shp = f.shape(max_nd=3, zero=0.08)
                lo, hi = (0.0, 1.0) if op != "mse_loss" else (-3.0, 3.0)
                f.add(op, [f.input(shp, d), f.input(shp, d, lo=lo, hi=hi)])
            f.add(op, [arr(np.zeros((0, 2)), d), arr(np.zeros((0, 2)), d)])  # NaN
        f.error(op, [arr([1.0, 2.0], "f64"), arr([[1.0, 2.0]], "f64")], {}, "ShapeMismatch")  # no broadcasting
        f.error(op, [arr([1.0, 2.0], "f64"), arr([1.0, 2.0], "f32")], {}, "DTypeMismatch")
        f.error(op, [arr([1, 2], "i32"), arr([1, 2], "i32")], {}, "UnsupportedDType")
    for d in FLOATS:
        f.add("binary_cross_entropy_with_logits", [arr([0.0, 1000.0, -1000.0, 30.0, -30.0], d), arr([1.0, 1.0, 0.0, 0.25, 0.5], d)])
        f.add("mse_loss", [arr([1e10, -1e10], d), arr([0.0, 1.0], d)], fd_check=False)  # fd cancels
    # one_hot(depth, dtype): integer input, any output dtype
    for it in INTS:
        for k in range(4):
            depth = int(rng.integers(1, 5))
            shp = f.shape(max_nd=2, zero=0.1)
            f.add("one_hot", [f.input(shp, it, fill=index_fill(f, depth, it))], {"depth": depth, "dtype": ALL[(k + INTS.index(it)) % 6]})
    f.add("one_hot", [arr(np.zeros((0,)), "i64")], {"depth": 0, "dtype": "f32"})
    f.add("one_hot", [arr(2, "i32")], {"depth": 3, "dtype": "bool"})
    f.error("one_hot", [arr([0.0, 1.0], "f32")], {"depth": 2, "dtype": "f32"}, "UnsupportedDType")
    f.error("one_hot", [arr([True], "bool")], {"depth": 2, "dtype": "f32"}, "UnsupportedDType")
    f.error("one_hot", [arr([0, 2], "i64")], {"depth": 2, "dtype": "f32"}, "Index")
    f.error("one_hot", [arr([-1], "i32")], {"depth": 2, "dtype": "i64"}, "Index")
    f.error("one_hot", [arr([0], "u8")], {"depth": 0, "dtype": "u8"}, "Index")
    # Zero-size inputs that are views with a non-zero offset.
    for d in FLOATS:
        f.add("layer_norm", [zero_view(f, d, 1)], {"axes": [-1], "eps": 1e-5, "gamma": False, "beta": False})
        f.add("layer_norm", [zero_view(f, d)], {"axes": [0, 1], "eps": 1e-5, "gamma": False, "beta": False})
        bn = {"training": True, "momentum": 0.1, "eps": 1e-5, "gamma": True, "beta": True}
        x = arr(f.values((3, 2), d), d, view="1:, 2:")  # [2, 0]: no channels
        z = lambda: arr(f.values((2,), d), d, view="2:")
        f.add("batch_norm", [x, z(), z(), z(), z()], bn)
        f.add("batch_norm", [zero_view(f, d, 1), arr([0.0, 1.0, 2.0], d), arr([1.0, 1.0, 1.0], d)], dict(bn, gamma=False, beta=False))
        f.add("embedding", [arr(f.values((3, 2), d), d, view="::-1"), arr(np.zeros((2, 3)), "i64", view="1:, 3:")])
        f.add("cross_entropy", [zero_view(f, d, 1), arr([1, 2], "i64", view="2:")])
        for op in ["mse_loss", "binary_cross_entropy_with_logits"]:
            f.add(op, [zero_view(f, d), zero_view(f, d)])
    f.add("one_hot", [zero_view(f, "i32")], {"depth": 4, "dtype": "f64"})
    f.add("one_hot", [arr([255, 0, 7], "u8")], {"depth": 256, "dtype": "u8"})
    # layer_norm with eps = 0 on a constant lane: 0 / 0 = NaN (as PyTorch).
    f.add("layer_norm", [arr([[3.0, 3.0], [1.0, 2.0]], "f64")], {"axes": [-1], "eps": 0.0, "gamma": False, "beta": False})
    f.add("batch_norm", [arr([[1.0, 2.0], [3.0, 5.0], [0.0, 1.0]], "f64"), arr([0.5, -0.5], "f64"), arr([1.0, 2.0], "f64")],
          {"training": True, "momentum": -0.5, "eps": 0.0, "gamma": False, "beta": False})
    f.add("cross_entropy", [arr([[3.0], [-2.0]], "f64"), arr([0, 0], "i64")])  # one class: loss 0
    return f


FAMILIES = [
    gen_binary, gen_compare, gen_unary, gen_reduce, gen_matmul, gen_shape, gen_index, gen_nn, gen_cast,
    gen_gather, gen_logical, gen_stats, gen_unary_fn, gen_shape_ops, gen_conv, gen_nn_ops,
]


def main():
    os.makedirs(OUT_DIR, exist_ok=True)
    only = set(sys.argv[1:])
    total_cases, total_bytes = 0, 0
    for gen in FAMILIES:
        fam = gen()
        if only and fam.name not in only:
            continue
        path = os.path.join(OUT_DIR, f"{fam.name}.json")
        ids = [c["id"] for c in fam.cases]
        assert len(ids) == len(set(ids)), "duplicate case ids"
        lines = [json.dumps(c, separators=(",", ":"), allow_nan=False) for c in fam.cases]
        text = '{"family":' + json.dumps(fam.name) + ',"cases":[\n' + ",\n".join(lines) + "\n]}\n"
        with open(path, "w") as fh:
            fh.write(text)
        total_cases += len(fam.cases)
        total_bytes += len(text)
        n_grad = sum(1 for c in fam.cases if c["grad"])
        print(f"{fam.name:8} {len(fam.cases):5} cases ({n_grad} with gradients) {len(text) / 1024:7.1f} KiB")
    print(f"total    {total_cases:5} cases {total_bytes / 1024:7.1f} KiB")


if __name__ == "__main__":
    main()
