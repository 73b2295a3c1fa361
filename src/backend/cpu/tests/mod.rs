//! The CPU backend driven with plain vectors: no registry, no manager, nothing of the
//! engine. Every kernel here reads a slice plus a layout and writes a buffer or a slice.

use super::fork::PARALLEL_ELEMS;
use super::fork::{fork_if, fork_threads};
use super::*;
use crate::dtype::Native;
use crate::layout::Layout;
use crate::shape::Shape;

mod norm;

fn layout(shape: &[usize], strides: &[isize], offset: usize) -> Layout {
    Layout {
        shape: Shape::from(shape.to_vec()),
        strides: strides.iter().copied().collect(),
        offset,
    }
}

fn read<T: Native>(b: &Buffer) -> Vec<T> {
    // SAFETY: a fresh buffer no one else holds.
    unsafe { b.slice::<T>() }.to_vec()
}

/// The contiguous maps run in groups of eight plus a remainder: every length across
/// two groups, from an offset, with an op whose operands cannot be swapped unseen.
#[test]
fn contiguous_maps_cover_every_length_in_groups_and_remainder() {
    let data: Vec<i32> = (0..40).map(|v| v * v - 3 * v).collect();
    for n in 0..=19usize {
        let (a, b, one) = (
            layout(&[n], &[1], 3),
            layout(&[n], &[1], 17),
            layout(&[1], &[1], 5),
        );
        let at = |l: &Layout, i: usize| data[l.offset + i];
        let s = |l| Strided {
            data: &data,
            layout: l,
        };
        let shape = Shape::from([n]);
        let g = |x: i32, y: i32| x - 2 * y;
        let want: Vec<i32> = (0..n).map(|i| g(at(&a, i), at(&b, i))).collect();
        let got = read::<i32>(&map_binary::<i32, i32>(s(&a), s(&b), &shape, g).unwrap());
        assert_eq!(got[..n], want[..], "a - 2b, n = {n}");
        let want: Vec<i32> = (0..n).map(|i| g(at(&a, i), at(&one, 0))).collect();
        let got = read::<i32>(&map_binary::<i32, i32>(s(&a), s(&one), &shape, g).unwrap());
        assert_eq!(got[..n], want[..], "a - 2s, n = {n}");
        let want: Vec<i32> = (0..n).map(|i| g(at(&one, 0), at(&b, i))).collect();
        let got = read::<i32>(&map_binary::<i32, i32>(s(&one), s(&b), &shape, g).unwrap());
        assert_eq!(got[..n], want[..], "s - 2b, n = {n}");
        let want: Vec<i64> = (0..n).map(|i| at(&a, i) as i64 * 3 + 1).collect();
        let got = read::<i64>(&map_unary::<i32, i64>(s(&a), |x| x as i64 * 3 + 1).unwrap());
        assert_eq!(got[..n], want[..], "3a + 1, n = {n}");
    }
}

#[test]
fn unary_over_a_reversed_strided_view() {
    // [[0 1 2] [3 4 5]] transposed and the columns reversed: [[2 5] [1 4] [0 3]].
    let data: Vec<f32> = (0..6).map(|v| v as f32).collect();
    let l = layout(&[3, 2], &[-1, 3], 2);
    let x = Strided {
        data: &data,
        layout: &l,
    };
    assert_eq!(to_vec(x), vec![2.0, 5.0, 1.0, 4.0, 0.0, 3.0]);
    let b = map_unary::<f32, f32>(x, |v| v * 10.0).unwrap();
    assert_eq!(read::<f32>(&b), vec![20.0, 50.0, 10.0, 40.0, 0.0, 30.0]);
}

#[test]
fn binary_broadcasts_a_row_and_a_column() {
    let (a, b) = (vec![1i64, 2, 3], vec![10i64, 20]);
    let (la, lb) = (layout(&[1, 3], &[3, 1], 0), layout(&[2, 1], &[1, 1], 0));
    let shape = Shape::from(vec![2, 3]);
    let out = map_binary::<i64, i64>(
        Strided {
            data: &a,
            layout: &la,
        },
        Strided {
            data: &b,
            layout: &lb,
        },
        &shape,
        |x, y| x + y,
    )
    .unwrap();
    assert_eq!(read::<i64>(&out), vec![11, 12, 13, 21, 22, 23]);
}

#[test]
fn in_place_writes_only_the_view() {
    let mut t = vec![0.0f64; 6];
    let lt = layout(&[3], &[2], 1); // elements 1, 3, 5
    let src = vec![1.0, 2.0, 3.0];
    let ls = layout(&[3], &[1], 0);
    assign_binary::<f64>(
        StridedMut {
            data: &mut t,
            layout: &lt,
        },
        Strided {
            data: &src,
            layout: &ls,
        },
        |a, b| a + b,
    );
    assign_unary::<f64>(
        StridedMut {
            data: &mut t,
            layout: &lt,
        },
        |a| a * 2.0,
    );
    assert_eq!(t, vec![0.0, 2.0, 0.0, 4.0, 0.0, 6.0]);
}

#[test]
fn reduce_over_a_non_last_axis() {
    // [[1 2 3] [4 5 6]] summed over axis 0.
    let data = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let l = layout(&[2, 3], &[3, 1], 0);
    let sums = reduce::<f32, f32>(
        Strided {
            data: &data,
            layout: &l,
        },
        &[0],
        0.0,
        |acc, d, s, n, st| acc + sum_row(d, s, n, st),
    );
    assert_eq!(sums.to_vec(), vec![5.0, 7.0, 9.0]);
}

#[test]
fn outer_reduction_matches_lane_reduction() {
    // [2, 3, 4] reduced over every non-empty set of axes, contiguous and transposed.
    let data: Vec<f64> = (0..24).map(|v| (v * 7 % 11) as f64).collect();
    let layouts = [
        layout(&[2, 3, 4], &[12, 4, 1], 0),
        layout(&[4, 3, 2], &[1, 4, 12], 0),
        layout(&[2, 3, 4], &[12, 4, -1], 3),
    ];
    for l in &layouts {
        for axes in [
            &[0usize][..],
            &[1],
            &[2],
            &[0, 1],
            &[0, 2],
            &[1, 2],
            &[0, 1, 2],
        ] {
            let x = Strided {
                data: &data,
                layout: l,
            };
            let lanes =
                reduce::<f64, f64>(x, axes, 0.0, |acc, d, s, n, st| acc + sum_row(d, s, n, st));
            let outer = reduce_outer::<f64, f64>(x, axes, 0.0, |acc, v| acc + v);
            assert_eq!(
                lanes.to_vec(),
                outer,
                "axes {axes:?} strides {:?}",
                l.strides
            );
            let maxes = reduce::<f64, f64>(x, axes, f64::MIN, |acc, d, s, n, st| {
                (0..n as isize).fold(acc, |a, i| a.max(d[(s + i * st) as usize]))
            });
            assert_eq!(
                maxes.to_vec(),
                reduce_outer::<f64, f64>(x, axes, f64::MIN, f64::max)
            );
        }
    }
    let rows = layout(&[2, 3, 4], &[12, 4, 1], 0);
    assert!(prefers_outer(&rows, &[0]));
    assert!(!prefers_outer(&rows, &[2]));
    assert!(!prefers_outer(&layouts[1], &[0]));
}

/// Reductions big enough to split across threads (by output) give exactly what a
/// plain loop over every element gives, for every set of axes, on contiguous,
/// reversed and transposed layouts; and the same bits on one thread as on all of
/// rayon's.
#[test]
fn reductions_split_across_threads_match_a_plain_loop() {
    let dims = [64usize, 72, 80];
    let n: usize = dims.iter().product();
    assert!(n >= PARALLEL_ELEMS);
    // Integer values: sums are exact whatever the order.
    let ints: Vec<f64> = (0..n).map(|v| (v * 7 % 11) as f64).collect();
    let layouts = [
        layout(&[64, 72, 80], &[72 * 80, 80, 1], 0),
        layout(&[80, 72, 64], &[1, 80, 72 * 80], 0),
        layout(&[64, 72, 80], &[72 * 80, 80, -1], 79),
    ];
    for l in &layouts {
        for axes in [&[0usize][..], &[1], &[2], &[0, 1], &[0, 2], &[1, 2]] {
            // The reference: every element added to its output by index.
            let kept: Vec<usize> = (0..3).filter(|d| !axes.contains(d)).collect();
            let d = l.shape.dims();
            let mut want = vec![0.0; kept.iter().map(|&k| d[k]).product()];
            for i in 0..d[0] {
                for j in 0..d[1] {
                    for k in 0..d[2] {
                        let idx = [i, j, k];
                        let o = kept.iter().fold(0, |o, &q| o * d[q] + idx[q]);
                        let at = l.offset as isize
                            + (0..3)
                                .map(|q| idx[q] as isize * l.strides[q])
                                .sum::<isize>();
                        want[o] += ints[at as usize];
                    }
                }
            }
            let x = Strided {
                data: &ints,
                layout: l,
            };
            let lanes =
                reduce::<f64, f64>(x, axes, 0.0, |acc, d, s, n, st| acc + sum_row(d, s, n, st));
            assert_eq!(
                lanes.to_vec(),
                want,
                "lanes, axes {axes:?} strides {:?}",
                l.strides
            );
            let outer = reduce_outer::<f64, f64>(x, axes, 0.0, |acc, v| acc + v);
            assert_eq!(outer, want, "outer, axes {axes:?} strides {:?}", l.strides);
        }
    }
    // Fractions: the split keeps each output's order, so the bits do not depend on
    // the number of threads.
    let fracs: Vec<f32> = (0..n)
        .map(|v| ((v * 37 % 101) as f32).sqrt() / 7.0)
        .collect();
    let run = || {
        let x = Strided {
            data: &fracs,
            layout: &layouts[0],
        };
        let outer = reduce_outer::<f32, f32>(x, &[0], 0.0, |acc, v| acc + v);
        let lanes = reduce::<f32, f32>(x, &[2], 0.0, |acc, d, s, n, st| acc + sum_row(d, s, n, st));
        (outer, lanes.to_vec())
    };
    // On a rayon worker kernels do not fork; from this thread they use the pool.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    let (one, many) = (pool.install(run), run());
    assert_eq!(one, many);
    // ... and an output's elements are added in row order, as a plain loop does.
    let cols = 72 * 80;
    let mut plain = vec![0.0f32; cols];
    for r in 0..64 {
        for (p, &v) in plain.iter_mut().zip(&fracs[r * cols..(r + 1) * cols]) {
            *p += v;
        }
    }
    assert_eq!(one.0, plain);
}

/// Under [`NoFork`] (what the engine holds while it computes under a shard lock) a
/// reduction big enough to split runs entirely on the calling thread; without it,
/// the kernel pool's threads (and only those) take part, unless the caller is itself
/// a rayon task. Guards may nest. `fork_if(false, ..)` holds one; a fork on a
/// kernel-pool thread runs in place.
#[test]
fn kernels_do_not_fork_under_a_shard_lock() {
    use std::collections::HashSet;
    use std::sync::Mutex;
    let n = 64 * 4096;
    assert!(n >= PARALLEL_ELEMS);
    let data: Vec<f32> = (0..n).map(|v| (v % 3) as f32).collect();
    let l = layout(&[64, 4096], &[4096, 1], 0);
    let threads_used = || {
        let seen = Mutex::new(HashSet::new());
        let x = Strided {
            data: &data,
            layout: &l,
        };
        reduce_outer::<f32, f32>(x, &[0], 0.0, |acc, v| {
            seen.lock().unwrap().insert(std::thread::current().id());
            acc + v
        });
        reduce::<f32, f32>(x, &[1], 0.0, |acc, d, s, n, st| {
            seen.lock().unwrap().insert(std::thread::current().id());
            acc + sum_row(d, s, n, st)
        });
        seen.into_inner().unwrap()
    };
    let me = std::thread::current().id();
    {
        let _outer = NoFork::new();
        let _inner = NoFork::new();
        assert!(!may_fork());
        assert_eq!(threads_used(), HashSet::from([me]));
    }
    assert_eq!(may_fork(), fork_threads() > 1);
    // A kernel kept inline by `fork_if` keeps its steps inline: they see `NoFork`.
    assert!(!fork_if(false, may_fork));
    assert_eq!(fork_if(false, threads_used), HashSet::from([me]));
    if fork_threads() > 1 {
        // Inside a fork (on a kernel-pool thread), kernels may split on the pool they
        // run on, and a nested fork runs its closure right there.
        assert!(fork(may_fork));
        let (outer, inner) = fork(|| {
            let t = std::thread::current();
            (t.id(), fork(|| std::thread::current().id()))
        });
        assert_eq!(outer, inner);
        assert_ne!(outer, me);
        assert!(!fork(|| fork_if(false, may_fork)));
    }
    // A split kernel runs on the kernel pool alone: never on rayon's global pool,
    // whose workers may be running user tasks. (With a one-thread pool nothing splits:
    // the kernel runs on the calling thread.)
    if fork_threads() == 1 {
        assert_eq!(threads_used(), HashSet::from([me]));
    } else {
        let names = Mutex::new(HashSet::new());
        let x = Strided {
            data: &data,
            layout: &l,
        };
        reduce_outer::<f32, f32>(x, &[0], 0.0, |acc, v| {
            let t = std::thread::current();
            names.lock().unwrap().insert(t.name().map(str::to_owned));
            acc + v
        });
        let names = names.into_inner().unwrap();
        assert!(
            names.iter().all(|n| n
                .as_deref()
                .is_some_and(|n| n.starts_with("ndscope-kernel-"))),
            "{names:?}"
        );
        assert!(threads_used().iter().any(|&t| t != me));
    }
    // Called from inside a rayon task, a kernel runs on that task's thread alone.
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    pool.install(|| {
        assert!(!may_fork());
        assert_eq!(threads_used(), HashSet::from([std::thread::current().id()]));
    });
}

/// Products below and above `matmul::TINY_MATMUL_FLOPS` (the plain loop and gemm) agree
/// with an f64 reference, on a transposed left operand read with negative and
/// positive strides.
#[test]
fn tiny_and_gemm_products_agree_with_a_reference() {
    for (m, k, n) in [(2, 64, 1), (4, 16, 4), (3, 7, 5), (4, 64, 2), (8, 40, 8)] {
        // `a` is stored as [k, m] and read transposed, rows reversed.
        let da: Vec<f32> = (0..k * m)
            .map(|v| ((v * 37 % 17) as f32 - 8.0) / 4.0)
            .collect();
        let db: Vec<f32> = (0..k * n)
            .map(|v| ((v * 11 % 13) as f32 - 6.0) / 3.0)
            .collect();
        let a = Mat {
            data: &da,
            off: (m - 1) as isize,
            rs: -1,
            cs: m as isize,
        };
        let b = Mat {
            data: &db,
            off: 0,
            rs: n as isize,
            cs: 1,
        };
        let mut out = vec![0f32; m * n];
        matmul_2d(m, n, k, a, b, &mut out);
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k)
                    .map(|p| da[p * m + (m - 1 - i)] as f64 * db[p * n + j] as f64)
                    .sum();
                let got = out[i * n + j] as f64;
                assert!(
                    (got - want).abs() <= 1e-4 * (1.0 + want.abs()),
                    "({m},{k},{n}) [{i},{j}]: {got} vs {want}"
                );
            }
        }
    }
}

/// A contiguous row's sum is exactly the documented order, whatever vector unit ran
/// it: blocks of at most 4,096 split in halves at multiples of 32, each block summed in
/// 32 lanes (element `i` into lane `i % 32`), the lanes combined pairwise (lane `k`
/// plus lane `k + w`, halving `w`), then the block's remainder added in order. Checked
/// bit for bit against that order written as scalar code, on floats whose sum rounds
/// (so another order would show), f32 and f64, on lengths around every boundary.
#[test]
fn contiguous_sums_follow_the_documented_pairwise_order() {
    fn block<T: Native>(x: &[T]) -> T {
        let mut lanes = [T::ZERO; 32];
        let whole = x.len() - x.len() % 32;
        for (i, &v) in x[..whole].iter().enumerate() {
            lanes[i % 32] = lanes[i % 32].add(v);
        }
        let mut w = 32;
        while w > 1 {
            w /= 2;
            for k in 0..w {
                lanes[k] = lanes[k].add(lanes[k + w]);
            }
        }
        let rest = x[whole..].iter().fold(T::ZERO, |s, &v| s.add(v));
        lanes[0].add(rest)
    }
    fn reference<T: Native>(x: &[T]) -> T {
        if x.len() <= 4096 {
            return block(x);
        }
        let mid = (x.len() / 2).next_multiple_of(32);
        reference(&x[..mid]).add(reference(&x[mid..]))
    }
    // Magnitudes spread over 12 decades: every add rounds.
    let vals: Vec<f64> = (0..300_007u64)
        .map(|i| {
            let h = i.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 11;
            let u = h as f64 / (1u64 << 53) as f64;
            (u - 0.3) * 10f64.powi((i % 12) as i32 - 6)
        })
        .collect();
    let f32s: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
    for n in [
        0, 1, 31, 32, 33, 95, 4095, 4096, 4097, 8193, 12_345, 100_003, 300_007,
    ] {
        let (a, b) = (sum_row(&vals[..n], 0, n, 1), reference(&vals[..n]));
        assert_eq!(a.to_bits(), b.to_bits(), "f64, n = {n}: {a} != {b}");
        let (a, b) = (sum_row(&f32s[..n], 0, n, 1), reference(&f32s[..n]));
        assert_eq!(a.to_bits(), b.to_bits(), "f32, n = {n}: {a} != {b}");
    }
}

/// The large in-place passes (`t = f(t, b)`, `t = f(t)`, zeroing a block) go to the
/// kernel pool where they may split, and write what a plain loop writes, every element
/// and no other.
#[test]
fn large_in_place_passes_split_and_match_a_plain_loop() {
    use std::collections::HashSet;
    use std::sync::Mutex;
    let n = 4 * PARALLEL_ELEMS + 3; // not a multiple of a split's length
    let b: Vec<f32> = (0..n).map(|i| (i % 97) as f32 * 0.5).collect();
    let start: Vec<f32> = (0..n).map(|i| (i % 89) as f32 - 40.0).collect();
    // One element past the view on either side, which no pass may touch.
    let mut t = vec![7.0f32; n + 2];
    t[1..=n].copy_from_slice(&start);
    let l = Layout::contiguous(Shape::from(vec![n]));
    let lt = layout(&[n], &[1], 1);
    // Each pass ran on the kernel pool alone where it has two threads or more (`fork`
    // hands the whole pass to the pool: the caller runs none of it), else on the
    // caller alone.
    let me = std::thread::current().id();
    let split = |seen: Mutex<HashSet<std::thread::ThreadId>>| {
        let seen = seen.into_inner().unwrap();
        if fork_threads() > 1 {
            assert!(!seen.contains(&me), "the caller ran part of a large pass");
        } else {
            assert_eq!(seen, HashSet::from([me]));
        }
    };
    let seen = Mutex::new(HashSet::new());
    let note = |s: &Mutex<HashSet<std::thread::ThreadId>>| {
        s.lock().unwrap().insert(std::thread::current().id());
    };
    assign_binary::<f32>(
        StridedMut {
            data: &mut t,
            layout: &lt,
        },
        Strided {
            data: &b,
            layout: &l,
        },
        |p, q| {
            note(&seen);
            p + 2.0 * q
        },
    );
    split(seen);
    let seen = Mutex::new(HashSet::new());
    assign_unary::<f32>(
        StridedMut {
            data: &mut t,
            layout: &lt,
        },
        |p| {
            note(&seen);
            p - 1.0
        },
    );
    split(seen);
    let want: Vec<f32> = start
        .iter()
        .zip(&b)
        .map(|(p, q)| p + 2.0 * q - 1.0)
        .collect();
    assert_eq!(&t[1..=n], &want[..]);
    assert_eq!((t[0], t[n + 1]), (7.0, 7.0));
    // Zeroing a block: every byte, split or not.
    let buf = new_filled::<f32>(n, |s| s.fill(1.5)).unwrap();
    // SAFETY: `buf` is fresh and no slice of it is alive.
    unsafe { buf.fill_zero() };
    assert!(read::<f32>(&buf).iter().all(|v| v.to_bits() == 0));
}

/// conv2d's kernels split a batch into one range of samples per kernel thread only
/// when the product is worth splitting, the batch has a sample per thread and the
/// caller may fork; the ranges cover every sample once, as even as can be.
#[test]
fn conv2d_splits_a_batch_into_one_part_per_kernel_thread() {
    use super::conv::{part_samples, sample_parts};
    // 8 channels of 16x16, 3x3 kernels, padding 1: 256 positions, k = 72.
    let geom = |n| crate::backend::window::Geom {
        n,
        c: 8,
        h: 16,
        w: 16,
        kh: 3,
        kw: 3,
        sh: 1,
        sw: 1,
        ph: 1,
        pw: 1,
        dh: 1,
        dw: 1,
        oh: 16,
        ow: 16,
    };
    let t = fork_threads();
    assert_eq!(may_fork(), t > 1);
    // 16 samples x 16 filters x 256 x 72 = 4.7M multiply-adds: split when it can be.
    assert_eq!(sample_parts(&geom(16), 16, 72), t);
    // 16 x 1 x 256 x 72 = 295K: too small to split.
    assert_eq!(sample_parts(&geom(16), 1, 72), 1);
    // Fewer samples than threads: one part (split step by step, if big).
    assert_eq!(sample_parts(&geom(t - 1), 1024, 72), 1);
    {
        let _locked = NoFork::new();
        assert_eq!(sample_parts(&geom(16), 16, 72), 1);
    }
    for n in 0..12 {
        for parts in 1..5 {
            let ranges: Vec<_> = (0..parts).map(|i| part_samples(n, parts, i)).collect();
            let all: Vec<usize> = ranges.iter().flat_map(|r| r.clone()).collect();
            assert_eq!(
                all,
                (0..n).collect::<Vec<_>>(),
                "{n} samples in {parts} parts"
            );
            let lens = ranges.iter().map(|r| r.len());
            assert!(lens.clone().max().unwrap() - lens.min().unwrap() <= 1);
        }
    }
}

/// A transposed operand (unit stride down the rows, `Transposed`'s 4×4 blocks) maps to
/// the same values as the row walk reads, alone and zipped with a contiguous operand on
/// either side: ragged tile edges, batches of planes, a reversed column axis, every
/// element size (the 4-byte ones through SSE shuffles), a result of another type, and
/// large planes split across the kernel pool by planes and by slabs of rows.
#[test]
fn transposed_operands_map_in_blocks_to_the_row_walks_values() {
    /// A [rows, cols] transpose of a row-major [cols, rows] buffer under `batch` planes,
    /// its columns reversed when `flip`.
    fn transposed(batch: usize, rows: usize, cols: usize, flip: bool) -> Layout {
        let mut shape = vec![rows, cols];
        let mut strides = vec![1, rows as isize];
        let mut offset = 0;
        if flip {
            strides[1] = -(rows as isize);
            offset = (cols - 1) * rows;
        }
        if batch > 1 {
            shape.insert(0, batch);
            strides.insert(0, (rows * cols) as isize);
        }
        layout(&shape, &strides, offset)
    }
    fn check<T: Native, U: Native + std::fmt::Debug>(
        l: &Layout,
        make: impl Fn(usize) -> T,
        f: impl Fn(T) -> U + Sync + Send + Copy,
    ) {
        let len = l.shape.dims().iter().product::<usize>();
        // Batch planes follow one another; each plane's buffer is its transpose's.
        let data: Vec<T> = (0..len + l.offset).map(&make).collect();
        let x = Strided {
            data: &data,
            layout: l,
        };
        assert!(
            super::elementwise::Transposed::of(l).is_some(),
            "{:?}",
            l.shape
        );
        let want: Vec<U> = to_vec(x).into_iter().map(f).collect();
        let got = read::<U>(&map_unary::<T, U>(x, f).unwrap());
        assert_eq!(got, want, "{:?} {:?}", l.shape, l.strides);
        // Zipped with a contiguous operand of the same shape, on the left and the right
        // (subtraction tells the sides apart).
        let other: Vec<T> = (0..len).map(|i| make(3 * i + 1)).collect();
        let flat = Layout::contiguous(l.shape.clone());
        let y = Strided {
            data: &other,
            layout: &flat,
        };
        let g = move |a: T, b: T| f(a.sub(b.add(b)));
        let pairs = || to_vec(x).into_iter().zip(other.iter().copied());
        let want: Vec<U> = pairs().map(|(a, b)| g(a, b)).collect();
        let got = read::<U>(&map_binary::<T, U>(x, y, &l.shape, g).unwrap());
        assert_eq!(got, want, "left {:?} {:?}", l.shape, l.strides);
        let want: Vec<U> = pairs().map(|(a, b)| g(b, a)).collect();
        let got = read::<U>(&map_binary::<T, U>(y, x, &l.shape, g).unwrap());
        assert_eq!(got, want, "right {:?} {:?}", l.shape, l.strides);
    }
    let f32s = |i: usize| (i % 1009) as f32 * 0.5 - 7.0;
    for (batch, rows, cols) in [(1, 4, 4), (1, 5, 7), (1, 33, 70), (2, 37, 41), (3, 64, 36)] {
        for flip in [false, true] {
            let l = transposed(batch, rows, cols, flip);
            check(&l, f32s, |v| v * 3.0);
            check(&l, |i| i as i32 - 50, |v| v * 2 + 1);
            check(&l, |i| i as f64 * 0.25, |v| v - 1.0);
            check(&l, f32s, |v| u8::from(v > 0.0));
        }
    }
    // Large enough to split: one plane by slabs of rows, and several planes by plane.
    const { assert!(600 * 500 >= PARALLEL_ELEMS && 3 * 300 * 300 >= PARALLEL_ELEMS) };
    check(&transposed(1, 600, 500, false), f32s, |v| v * 3.0);
    check(&transposed(1, 600, 500, true), |i| i as f64, |v| v + 0.5);
    check(&transposed(3, 300, 300, false), f32s, |v| v * 3.0);
}
