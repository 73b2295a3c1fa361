//! The forward (F), input-gradient (I) and weight-gradient (W) products of a small
//! convolution, each timed in the operand layouts a kernel could hand gemm: `out` row-
//! or column-major, the column matrix stored [k, N·L] or transposed ([N·L, k]), G stored
//! [O, N·L] or transposed. Prints the median of 7 loops of 50 calls per layout, µs.

use std::time::Instant;

/// `C[m×n] = A[m×k]·B[k×n]`, each matrix given by its row and column strides.
#[allow(clippy::too_many_arguments)]
fn mm(
    (m, n, k): (usize, usize, usize),
    c: &mut [f32],
    (crs, ccs): (isize, isize),
    a: &[f32],
    (ars, acs): (isize, isize),
    b: &[f32],
    (brs, bcs): (isize, isize),
) {
    let reach = |rows: usize, cols: usize, rs: isize, cs: isize| {
        (rows as isize - 1) * rs + (cols as isize - 1) * cs
    };
    assert!(reach(m, n, crs, ccs) < c.len() as isize);
    assert!(reach(m, k, ars, acs) < a.len() as isize);
    assert!(reach(k, n, brs, bcs) < b.len() as isize);
    // SAFETY: the asserts keep every index gemm forms (non-negative strides, so the
    // highest is the far corner) inside the three slices; `c` is written only.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            ccs,
            crs,
            false,
            a.as_ptr(),
            acs,
            ars,
            b.as_ptr(),
            bcs,
            brs,
            0.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

fn time(name: &str, f: &mut dyn FnMut()) {
    for _ in 0..20 {
        f();
    }
    let mut v: Vec<f64> = (0..7)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..50 {
                f();
            }
            t.elapsed().as_secs_f64() / 50.0 * 1e6
        })
        .collect();
    v.sort_by(f64::total_cmp);
    println!("{name:44} {:8.1} us", v[3]);
}

fn main() {
    let (o, k, nc) = (32usize, 144usize, 2048usize);
    let (oi, ki, nci) = (o as isize, k as isize, nc as isize);
    let w: Vec<f32> = (0..o * k).map(|i| (i % 7) as f32).collect();
    let col: Vec<f32> = (0..k * nc).map(|i| (i % 5) as f32).collect();
    let g: Vec<f32> = (0..o * nc).map(|i| (i % 3) as f32).collect();
    let mut c = vec![0f32; k * nc];
    let (row, wr) = ((nci, 1), (ki, 1)); // out [o, nc] row-major; W [o, k] row-major
    // Forward: out[o×nc] = W[o×k] · col[k×nc].
    let f = (o, nc, k);
    time("F  col [k,N·L], out row-major", &mut || {
        mm(f, &mut c, row, &w, wr, &col, (nci, 1))
    });
    time("F  col [k,N·L], out column-major", &mut || {
        mm(f, &mut c, (1, oi), &w, wr, &col, (nci, 1))
    });
    time("F  col [N·L,k], out row-major", &mut || {
        mm(f, &mut c, row, &w, wr, &col, (1, ki))
    });
    time("F  col [N·L,k], out column-major", &mut || {
        mm(f, &mut c, (1, oi), &w, wr, &col, (1, ki))
    });
    // Input gradient: dcol[k×nc] = Wᵀ[k×o] · G[o×nc].
    let i = (k, nc, o);
    time("I  G [O,N·L], dcol row-major", &mut || {
        mm(i, &mut c, (nci, 1), &w, (1, ki), &g, (nci, 1))
    });
    time("I  G [O,N·L], dcol column-major", &mut || {
        mm(i, &mut c, (1, ki), &w, (1, ki), &g, (nci, 1))
    });
    time("I  G [N·L,O], dcol row-major", &mut || {
        mm(i, &mut c, (nci, 1), &w, (1, ki), &g, (1, oi))
    });
    time("I  G [N·L,O], dcol column-major", &mut || {
        mm(i, &mut c, (1, ki), &w, (1, ki), &g, (1, oi))
    });
    // Weight gradient: dW[o×k] = G[o×nc] · colᵀ[nc×k].
    let wg = (o, k, nc);
    let layouts = [
        ("G [O,N·L], col [k,N·L]", (nci, 1), (1, nci)),
        ("G [N·L,O], col [k,N·L]", (1, oi), (1, nci)),
        ("G [O,N·L], col [N·L,k]", (nci, 1), (ki, 1)),
        ("G [N·L,O], col [N·L,k]", (1, oi), (ki, 1)),
    ];
    for (name, gs, cs) in layouts {
        time(&format!("W  {name}, dW row-major"), &mut || {
            mm(wg, &mut c, (ki, 1), &g, gs, &col, cs)
        });
        time(&format!("W  {name}, dW column-major"), &mut || {
            mm(wg, &mut c, (1, oi), &g, gs, &col, cs)
        });
    }
}
