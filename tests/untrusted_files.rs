//! Files from strangers (issue 28): forged and damaged `.npy`, `.npz`, safetensors and
//! checkpoint files.
//!
//! Every reader checks what a header claims against the bytes the file actually
//! holds before reserving memory. A claim the file cannot hold is a `Format` error
//! naming the claim and what the file holds; shapes that overflow and more than 64
//! dimensions are `Format` errors; a repeated `.npz` member name is a `Format` error.
//! After every failed load the counters (the process's and the manager's) are back at
//! their baseline, and the largest single allocation the load made (the
//! `CountingAllocator`'s per-thread figure) is at most what the file holds plus a
//! small constant, [`SMALL`].
//!
//! Also here: the fuzz seeds (`fuzz/seeds/<target>/`) are written from this file and
//! checked to load (`fuzz_seeds_are_valid_and_current`), and the regressions the fuzz
//! targets found.
#![cfg(feature = "io")]

mod common;

#[path = "../fuzz/src/shapes.rs"]
mod fuzz_shapes;

use common::{counters, counts, serial};
use ndscope::{CountingAllocator, DType, NDArray, NDManager, NdError, Result, io};
use std::fmt::Debug;
use std::io::Write;
use std::path::{Path, PathBuf};

#[global_allocator]
static ALLOC: CountingAllocator = CountingAllocator;

/// What a failed load may reserve at once beyond the file's length: buffered
/// readers (8 KiB), a decompressor's state (about 43 KiB), the first step of reading
/// data whose size is only claimed (64 KiB). Far below every forged claim here (the
/// smallest is 64 MiB).
const SMALL: usize = 128 << 10;

// ------------------------------------------------------------------ helpers

/// A fresh temporary directory for one test.
fn tmp(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ndscope-untrusted-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn write(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

/// A `.npy` image: format `version` (1, 2 or 3), header dict `dict` padded to 64
/// bytes as numpy does, then `data`.
fn npy_v(version: u8, dict: &str, data: &[u8]) -> Vec<u8> {
    let prefix = if version == 1 { 10 } else { 12 };
    let mut h = dict.to_string();
    while !(prefix + h.len() + 1).is_multiple_of(64) {
        h.push(' ');
    }
    h.push('\n');
    let mut v = b"\x93NUMPY".to_vec();
    v.extend_from_slice(&[version, 0]);
    if version == 1 {
        v.extend_from_slice(&(h.len() as u16).to_le_bytes());
    } else {
        v.extend_from_slice(&(h.len() as u32).to_le_bytes());
    }
    v.extend_from_slice(h.as_bytes());
    v.extend_from_slice(data);
    v
}

/// A version 1.0 `.npy` image of `descr` and `shape` (a Python tuple) over `data`.
fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
    npy_v(
        1,
        &format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}"),
        data,
    )
}

/// One member of a hand-made zip archive.
struct Member {
    name: String,
    data: Vec<u8>,
    deflate: bool,
    /// The uncompressed size the headers state (the true one when `None`).
    declared: Option<u32>,
}

fn member(name: &str, data: Vec<u8>, deflate: bool) -> Member {
    Member {
        name: name.into(),
        data,
        deflate,
        declared: None,
    }
}

/// A zip archive of `members` (stored or deflated), written by hand so that it may
/// repeat names and state sizes that lie (the zip crate's writer does neither).
fn zip(members: &[Member]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut cd = Vec::new();
    for m in members {
        let mut crc = flate2::Crc::new();
        crc.update(&m.data);
        let body = if m.deflate {
            let mut e = flate2::write::DeflateEncoder::new(Vec::new(), flate2::Compression::best());
            e.write_all(&m.data).unwrap();
            e.finish().unwrap()
        } else {
            m.data.clone()
        };
        let size = m.declared.unwrap_or(m.data.len() as u32);
        let csize = if m.deflate { body.len() as u32 } else { size };
        let method: u16 = if m.deflate { 8 } else { 0 };
        let offset = out.len() as u32;
        let common = |v: &mut Vec<u8>| {
            v.extend_from_slice(&0u16.to_le_bytes()); // flags
            v.extend_from_slice(&method.to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // time
            v.extend_from_slice(&0x21u16.to_le_bytes()); // date: 1980-01-01
            v.extend_from_slice(&crc.sum().to_le_bytes());
            v.extend_from_slice(&csize.to_le_bytes());
            v.extend_from_slice(&size.to_le_bytes());
            v.extend_from_slice(&(m.name.len() as u16).to_le_bytes());
            v.extend_from_slice(&0u16.to_le_bytes()); // extra field
        };
        out.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
        out.extend_from_slice(&20u16.to_le_bytes());
        common(&mut out);
        out.extend_from_slice(m.name.as_bytes());
        out.extend_from_slice(&body);
        cd.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        cd.extend_from_slice(&20u16.to_le_bytes()); // made by
        cd.extend_from_slice(&20u16.to_le_bytes()); // needed
        common(&mut cd);
        cd.extend_from_slice(&[0; 6]); // comment length, disk, internal attributes
        cd.extend_from_slice(&[0; 4]); // external attributes
        cd.extend_from_slice(&offset.to_le_bytes());
        cd.extend_from_slice(m.name.as_bytes());
    }
    let cd_start = out.len() as u32;
    out.extend_from_slice(&cd);
    out.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(members.len() as u16).to_le_bytes());
    out.extend_from_slice(&(cd.len() as u32).to_le_bytes());
    out.extend_from_slice(&cd_start.to_le_bytes());
    out.extend_from_slice(&0u16.to_le_bytes());
    out
}

/// A safetensors image: the JSON header `json` (padded with spaces to 8 bytes) and
/// `data`.
fn safetensors(json: &str, data: &[u8]) -> Vec<u8> {
    let mut h = json.to_string();
    while !h.len().is_multiple_of(8) {
        h.push(' ');
    }
    let mut v = (h.len() as u64).to_le_bytes().to_vec();
    v.extend_from_slice(h.as_bytes());
    v.extend_from_slice(data);
    v
}

/// Run `load` on the file at `path`: it must fail with `Format`, its message must
/// contain each of `want`, its largest single allocation must be at most the file's
/// length plus [`SMALL`], and the counters of the process and of `m` must be back at
/// their baseline. Returns the message.
#[track_caller]
fn refused<T: Debug>(
    m: &NDManager,
    path: &Path,
    want: &[&str],
    load: impl FnOnce() -> Result<T>,
) -> String {
    let len = std::fs::metadata(path).unwrap().len() as usize;
    let (process, manager) = (counters(), counts(m));
    CountingAllocator::reset_thread_largest();
    let r = load();
    let largest = CountingAllocator::thread_largest();
    let name = path.file_name().unwrap().to_string_lossy().into_owned();
    assert!(
        largest <= len + SMALL,
        "{name}: the load reserved {largest} bytes at once; the file holds {len} ({r:?})"
    );
    let e = match r {
        Err(e @ NdError::Format { .. }) => e,
        other => panic!("{name}: expected a Format error, got {other:?}"),
    };
    let msg = e.to_string();
    for w in want {
        assert!(msg.contains(w), "{name}: {msg}\n  does not contain: {w}");
    }
    assert_eq!(counters(), process, "{name}: process counters");
    assert_eq!(counts(m), manager, "{name}: manager counters");
    msg
}

// ------------------------------------------------------------------ .npy

/// Headers claiming 2^40 f32 elements (4 TiB), 8 GiB, 1 GiB and 64 MiB over 16 bytes
/// of data: each is a `Format` error naming the claim and the 16 bytes, after
/// reserving nothing near the claim (it was `OutOfMemory` for the first two, and a
/// real reservation of the last two, before issue 28).
#[test]
fn npy_claims_beyond_the_file_are_format_errors_that_reserve_nothing() {
    let _s = serial();
    let d = tmp("npy_claims");
    let m = NDManager::new();
    let _keep = m.ones([3], DType::F32); // counters are not trivially zero
    let data = [0u8; 16];
    for (descr, n, elem, dtype) in [
        ("<f4", 1u64 << 40, 4u64, "f32"),
        ("<f8", 1 << 30, 8, "f64"),
        ("|u1", 1 << 30, 1, "u8"),
        ("<i4", 1 << 24, 4, "i32"),
        ("<i8", 1 << 23, 8, "i64"),
        ("|b1", 1 << 26, 1, "bool"),
    ] {
        let bytes = npy(descr, &format!("({n},)"), &data);
        assert_eq!(bytes.len(), 144);
        let p = write(&d, &format!("claim_{dtype}_{n}.npy"), &bytes);
        let want = format!(
            "header claims {n} {dtype} elements ({} bytes) but the file holds 16 bytes of data",
            n * elem
        );
        refused(&m, &p, &[&want, &p.display().to_string()], || {
            io::try_load_npy(&m, &p)
        });
    }
    // A claim one byte over the data, and the same header with the right data.
    let p = write(&d, "one_over.npy", &npy("<f4", "(5,)", &data));
    refused(
        &m,
        &p,
        &["header claims 5 f32 elements (20 bytes) but the file holds 16 bytes"],
        || io::try_load_npy(&m, &p),
    );
    let p = write(&d, "exact.npy", &npy("<f4", "(4,)", &data));
    assert_eq!(
        io::try_load_npy(&m, &p).unwrap().to_vec::<f32>().unwrap(),
        [0.0; 4]
    );
    m.close();
    std::fs::remove_dir_all(&d).unwrap();
}

/// Shape products that overflow, byte sizes beyond the address space and more than
/// 64 dimensions are `Format` errors; 64 dimensions, and zero-size shapes with huge
/// other dimensions, load.
#[test]
fn npy_shapes_that_overflow_or_have_too_many_dimensions() {
    let _s = serial();
    let d = tmp("npy_shapes");
    let m = NDManager::new();
    let cases: Vec<(&str, String, &str)> = vec![
        (
            "product",
            "(4294967296, 4294967296, 2)".into(),
            "element count overflows",
        ),
        (
            "product3",
            "(3, 6148914691236517206)".into(),
            "element count overflows",
        ),
        (
            "bytes",
            "(4611686018427387904,)".into(),
            "overflows the address space",
        ),
        (
            "huge_dim",
            "(99999999999999999999999,)".into(),
            "bad dimension",
        ),
        (
            "dims65",
            format!("({})", ["1"; 65].join(", ")),
            "more than 64 dimensions",
        ),
        (
            "dims10000",
            format!("({})", ["1"; 10000].join(", ")),
            "more than 64 dimensions",
        ),
    ];
    for (name, shape, want) in cases {
        let p = write(&d, &format!("{name}.npy"), &npy("<f4", &shape, &[0; 4]));
        refused(&m, &p, &[want], || io::try_load_npy(&m, &p));
    }
    let p = write(
        &d,
        "dims64.npy",
        &npy(
            "<f4",
            &format!("({})", ["1"; 64].join(", ")),
            &[0, 0, 128, 63],
        ),
    );
    let a = io::try_load_npy(&m, &p).unwrap();
    assert_eq!(
        (a.shape().ndim(), a.to_vec::<f32>().unwrap()),
        (64, vec![1.0])
    );
    for shape in ["(0, 1099511627776)", "(1099511627776, 0, 1099511627776)"] {
        let p = write(&d, "zero.npy", &npy("<f8", shape, &[]));
        CountingAllocator::reset_thread_largest();
        let a = io::try_load_npy(&m, &p).unwrap();
        assert!(CountingAllocator::thread_largest() < SMALL);
        assert_eq!(a.size(), 0);
        assert!(a.to_vec::<f64>().unwrap().is_empty());
    }
    m.close();
    std::fs::remove_dir_all(&d).unwrap();
}

/// Truncated data, a bad magic, a header whose length runs past the file (versions
/// 1 and 2), a header length over the limit, bytes after the data.
#[test]
fn damaged_npy_files() {
    let _s = serial();
    let d = tmp("npy_damaged");
    let m = NDManager::new();
    let good = npy("<f8", "(3,)", &[0; 24]);
    let v2 = npy_v(
        2,
        "{'descr': '<f8', 'fortran_order': False, 'shape': (3,), }",
        &[0; 24],
    );
    let mut v2_long = v2[..40].to_vec();
    v2_long[8..12].copy_from_slice(&((1u32 << 20) - 1).to_le_bytes());
    let mut v2_huge = v2[..40].to_vec();
    v2_huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let mut v1_long = good[..30].to_vec();
    v1_long[8..10].copy_from_slice(&u16::MAX.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "cut_data",
            good[..good.len() - 1].to_vec(),
            "header claims 3 f64 elements (24 bytes) but the file holds 23 bytes of data",
        ),
        (
            "no_data",
            good[..128].to_vec(),
            "but the file holds 0 bytes of data",
        ),
        ("magic", [b"\x93NUMPX", &good[6..]].concat(), "magic"),
        ("zip_magic", [b"PK\x03\x04", &good[4..]].concat(), "magic"),
        ("empty", vec![], "truncated header"),
        ("nine_bytes", good[..9].to_vec(), "truncated header"),
        (
            "v1_long",
            v1_long,
            "truncated header: it claims 65535 bytes but the file holds 20 bytes",
        ),
        (
            "v2_long",
            v2_long,
            "truncated header: it claims 1048575 bytes but the file holds 28 bytes",
        ),
        (
            "v2_huge",
            v2_huge,
            "header of 4294967295 bytes is too large",
        ),
        ("extra", [&good[..], b"x"].concat(), "bytes after the data"),
        (
            "version",
            [&good[..6], &[9, 0], &good[8..]].concat(),
            "version 9",
        ),
    ];
    for (name, bytes, want) in cases {
        let p = write(&d, &format!("{name}.npy"), &bytes);
        refused(&m, &p, &[want], || io::try_load_npy(&m, &p));
    }
    m.close();
    std::fs::remove_dir_all(&d).unwrap();
}

/// Loading a real file reserves about what it holds (so the bound above has teeth:
/// the allocation figure does see the data).
#[test]
fn a_valid_load_reserves_what_the_file_holds() {
    let _s = serial();
    let d = tmp("valid");
    let m = NDManager::new();
    let n = 1usize << 20;
    let p = d.join("big.npy");
    io::save_npy(&p, m.zeros([n], DType::F32));
    CountingAllocator::reset_thread_largest();
    let a = io::load_npy(&m, &p);
    let largest = CountingAllocator::thread_largest();
    assert_eq!(a.size(), n);
    assert!(
        (4 * n..=2 * 4 * n).contains(&largest),
        "largest allocation {largest} for {} bytes of data",
        4 * n
    );
    m.close();
    std::fs::remove_dir_all(&d).unwrap();
}

// ------------------------------------------------------------------ .npz

/// The same claims in an `.npz` member, stored or deflated, are checked against the
/// member's size; a deflated member whose declared size is itself forged is read as
/// its data arrives; a stored member declaring more than the archive holds is
/// refused before it is read. A valid first member is not created when a later one
/// fails.
#[test]
fn npz_member_claims_are_checked_against_the_member() {
    let _s = serial();
    let d = tmp("npz_claims");
    let m = NDManager::new();
    let ok = npy("<f4", "(2,)", &[0; 8]);
    for deflate in [false, true] {
        for (n, dtype, descr, elem) in
            [(1u64 << 40, "f32", "<f4", 4u64), (1 << 24, "f32", "<f4", 4)]
        {
            let forged = npy(descr, &format!("({n},)"), &[0; 16]);
            let z = zip(&[
                member("ok.npy", ok.clone(), deflate),
                member("x.npy", forged, deflate),
            ]);
            let p = write(&d, &format!("claim_{n}_{deflate}.npz"), &z);
            let want = format!(
                "member 'x.npy': header claims {n} {dtype} elements ({} bytes) but the member \
                 holds 16 bytes of data",
                n * elem
            );
            refused(&m, &p, &[&want], || io::try_load_npz(&m, &p));
        }
    }
    // A deflated member declaring 4 GiB - 1 that holds 144 bytes, under a header
    // claiming 1 GiB: the claim passes the declared size, and the read stops where the
    // data does.
    let mut lying = member("x.npy", npy("|u1", "(1073741824,)", &[0; 16]), true);
    lying.declared = Some(u32::MAX);
    let p = write(&d, "lying_deflated.npz", &zip(&[lying]));
    refused(
        &m,
        &p,
        &["member 'x.npy'", "1073741824 u8 elements"],
        || io::try_load_npz(&m, &p),
    );
    // A stored member declaring more than the whole archive.
    let mut lying = member("x.npy", npy("|u1", "(1073741824,)", &[0; 16]), false);
    lying.declared = Some(u32::MAX);
    let p = write(&d, "lying_stored.npz", &zip(&[lying]));
    refused(&m, &p, &["member 'x.npy'"], || io::try_load_npz(&m, &p));
    // Overflowing shapes and too many dimensions inside a member.
    for (name, shape, want) in [
        (
            "overflow",
            "(4294967296, 4294967296, 2)".to_string(),
            "overflows",
        ),
        (
            "dims65",
            format!("({})", ["1"; 65].join(", ")),
            "more than 64 dimensions",
        ),
    ] {
        let z = zip(&[member("x.npy", npy("<f4", &shape, &[0; 4]), false)]);
        let p = write(&d, &format!("{name}.npz"), &z);
        refused(&m, &p, &["member 'x.npy'", want], || {
            io::try_load_npz(&m, &p)
        });
    }
    // The writer is sound: with honest members the archive loads.
    for deflate in [false, true] {
        let z = zip(&[
            member("ok.npy", ok.clone(), deflate),
            member("y.npy", ok.clone(), deflate),
        ]);
        let p = write(&d, "honest.npz", &z);
        let arrays = io::try_load_npz(&m, &p).unwrap();
        assert_eq!(arrays.len(), 2);
    }
    m.close();
    std::fs::remove_dir_all(&d).unwrap();
}

/// A repeated member name is a `Format` error (the docs promised it; the zip crate
/// keeps the last member of a name, so the archive loaded silently before issue 28).
#[test]
fn npz_repeated_member_names_are_format_errors() {
    let _s = serial();
    let d = tmp("npz_repeated");
    let m = NDManager::new();
    let a = npy("<f4", "(2,)", &[0; 8]);
    let b = npy("<i8", "()", &[7, 0, 0, 0, 0, 0, 0, 0]);
    for (name, members) in [
        (
            "twice",
            vec![
                member("x.npy", a.clone(), false),
                member("x.npy", b.clone(), false),
            ],
        ),
        (
            "apart",
            vec![
                member("x.npy", a.clone(), false),
                member("y.npy", a.clone(), true),
                member("x.npy", b.clone(), true),
            ],
        ),
        (
            "same_bytes",
            vec![
                member("x.npy", a.clone(), false),
                member("x.npy", a.clone(), false),
            ],
        ),
    ] {
        let p = write(&d, &format!("{name}.npz"), &zip(&members));
        refused(&m, &p, &["member 'x.npy' appears more than once"], || {
            io::try_load_npz(&m, &p)
        });
    }
    let p = write(
        &d,
        "distinct.npz",
        &zip(&[member("x.npy", a, false), member("X.npy", b, false)]),
    );
    let names: Vec<String> = io::try_load_npz(&m, &p)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    assert_eq!(names, ["x", "X"]);
    m.close();
    std::fs::remove_dir_all(&d).unwrap();
}

/// A central directory that is truncated, cut, or whose end record (zip64 too)
/// claims more than the file holds.
#[test]
fn npz_truncated_or_forged_central_directory() {
    let _s = serial();
    let d = tmp("npz_directory");
    let m = NDManager::new();
    let a = npy("<f4", "(2,)", &[0; 8]);
    let good = zip(&[
        member("x.npy", a.clone(), false),
        member("y.npy", a.clone(), false),
    ]);
    let eocd = good.len() - 22;
    let cd_size = u32::from_le_bytes(good[eocd + 12..eocd + 16].try_into().unwrap()) as usize;
    let cd_start = eocd - cd_size;
    let mut more = good.clone();
    more[eocd + 8] = 3;
    more[eocd + 10] = 3;
    let mut huge_count = good.clone();
    huge_count[eocd + 8..eocd + 12].copy_from_slice(&[0xfe, 0xff, 0xfe, 0xff]);
    let mut big_size = good.clone();
    big_size[eocd + 12..eocd + 16].copy_from_slice(&u32::MAX.to_le_bytes());
    // The second record cut out of the directory, the end record left as it was.
    let second = cd_start + cd_size / 2;
    let cut = [&good[..second], &good[eocd..]].concat();
    // A zip64 locator and end record claiming 2^64 - 1 entries and 2^63 bytes.
    let mut z64 = good[..eocd].to_vec();
    let rec = z64.len() as u64;
    z64.extend_from_slice(&0x0606_4b50u32.to_le_bytes());
    z64.extend_from_slice(&44u64.to_le_bytes());
    z64.extend_from_slice(&[45, 0, 45, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    z64.extend_from_slice(&u64::MAX.to_le_bytes());
    z64.extend_from_slice(&u64::MAX.to_le_bytes());
    z64.extend_from_slice(&(1u64 << 63).to_le_bytes());
    z64.extend_from_slice(&(cd_start as u64).to_le_bytes());
    z64.extend_from_slice(&0x0706_4b50u32.to_le_bytes());
    z64.extend_from_slice(&0u32.to_le_bytes());
    z64.extend_from_slice(&rec.to_le_bytes());
    z64.extend_from_slice(&1u32.to_le_bytes());
    z64.extend_from_slice(&good[eocd..]);
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("more", more, "claims 3 members but the directory holds 2"),
        ("huge_count", huge_count, "central directory"),
        ("big_size", big_size, "truncated central directory"),
        ("cut", cut, "central directory"),
        ("zip64", z64, "truncated central directory"),
        (
            "no_end",
            good[..eocd].to_vec(),
            "no end of central directory",
        ),
        ("tiny", good[..10].to_vec(), "cannot hold"),
    ];
    for (name, bytes, want) in cases {
        let p = write(&d, &format!("{name}.npz"), &bytes);
        refused(&m, &p, &[want], || io::try_load_npz(&m, &p));
    }
    let p = write(&d, "good.npz", &good);
    assert_eq!(io::try_load_npz(&m, &p).unwrap().len(), 2);
    m.close();
    std::fs::remove_dir_all(&d).unwrap();
}

// ------------------------------------------------------------------ safetensors, checkpoints

/// Forged safetensors files, loaded as new arrays and into existing ones
/// (checkpoints): `Format`, nothing reserved, and no target array changed.
#[test]
fn forged_safetensors_and_checkpoints() {
    let _s = serial();
    let d = tmp("safetensors");
    let m = NDManager::new();
    let targets = fuzz_shapes::checkpoint_targets(&m);
    let values = |t: &[(String, NDArray)]| -> Vec<Vec<f64>> {
        t.iter()
            .map(|(_, a)| a.to_dtype(DType::F64).to_vec::<f64>().unwrap())
            .collect()
    };
    let before = values(&targets);
    let mut header_claim = (1u64 << 40).to_le_bytes().to_vec();
    header_claim.extend_from_slice(b"{}      ");
    let dims65 = format!("[{}]", ["1"; 65].join(","));
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        ("header_claim", header_claim, "not a valid safetensors file"),
        (
            "tensor_claim",
            safetensors(
                r#"{"w":{"dtype":"F32","shape":[1099511627776],"data_offsets":[0,4398046511104]}}"#,
                &[0; 16],
            ),
            "not a valid safetensors file",
        ),
        (
            "offsets_past_the_data",
            safetensors(
                r#"{"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]}}"#,
                &[0; 16],
            ),
            "not a valid safetensors file",
        ),
        (
            "overflow",
            safetensors(
                r#"{"w":{"dtype":"F32","shape":[4294967296,4294967296,2],"data_offsets":[0,0]}}"#,
                &[],
            ),
            "not a valid safetensors file",
        ),
        (
            "dims65",
            safetensors(
                &format!(r#"{{"w":{{"dtype":"F32","shape":{dims65},"data_offsets":[0,4]}}}}"#),
                &[0; 4],
            ),
            "'w': header claims 65 dimensions",
        ),
        ("empty", vec![], "not a valid safetensors file"),
    ];
    for (name, bytes, want) in cases {
        let p = write(&d, &format!("{name}.safetensors"), &bytes);
        refused(&m, &p, &[want], || io::try_load_safetensors(&m, &p));
        refused(&m, &p, &[want], || io::try_load_into(&p, &targets));
        assert_eq!(
            values(&targets),
            before,
            "{name}: load_into changed a target"
        );
    }
    // A valid file of the right names whose last array has another shape: all or
    // nothing.
    let p = d.join("good.safetensors");
    let other = fuzz_shapes::checkpoint_targets(&m);
    io::save_checkpoint(&p, &other);
    io::load_into(&p, &targets);
    assert_eq!(values(&targets), before);
    let mut wrong = other.clone();
    wrong[0].1 = m.zeros([3, 2], DType::F32);
    io::save_checkpoint(&p, &wrong);
    refused(&m, &p, &["'w' is f32[3, 2] in the file"], || {
        io::try_load_into(&p, &targets)
    });
    m.close();
    std::fs::remove_dir_all(&d).unwrap();
}

// ------------------------------------------------------------------ fuzz seeds

/// `bytes` as little-endian elements.
fn le<T: Copy, const N: usize>(v: &[T], f: impl Fn(T) -> [u8; N]) -> Vec<u8> {
    v.iter().flat_map(|&x| f(x)).collect()
}

/// The seed corpus of every fuzz target: valid files of every dtype, 0-d,
/// zero-size, Fortran order, big-endian, every `.npy` version, stored and deflated
/// `.npz` members; index strings of every form.
fn seeds(d: &Path) -> Vec<(String, Vec<u8>)> {
    let m = NDManager::new();
    let every: Vec<(&str, NDArray)> = vec![
        (
            "f32",
            m.create(&[0.5f32, -1.0, f32::NAN, 3.5, -0.0, 1e30], [2, 3]),
        ),
        ("f64", m.create(&[1.0f64, -2.5, f64::INFINITY], [3])),
        ("i32", m.create(&[1i32, -2, 3, -4], [2, 2])),
        ("i64", m.create(&[i64::MIN, 0, i64::MAX], [3, 1])),
        ("u8", m.create(&[0u8, 1, 255, 7], [4])),
        ("bool", m.create(&[true, false, true, true], [2, 1, 2])),
        ("scalar_f64", m.scalar(-7.25f64)),
        ("scalar_bool", m.scalar(true)),
        ("empty_u8", m.zeros([0], DType::U8)),
        ("empty_f32", m.zeros([2, 0, 3], DType::F32)),
        (
            "view_i32",
            m.create(&[1i32, 2, 3, 4, 5, 6], [2, 3]).transpose(),
        ),
    ];
    let mut out: Vec<(String, Vec<u8>)> = Vec::new();
    let saved = |f: &dyn Fn(&Path)| {
        let p = d.join("seed.tmp");
        f(&p);
        std::fs::read(&p).unwrap()
    };
    for (name, a) in &every {
        out.push((format!("npy/{name}.npy"), saved(&|p| io::save_npy(p, *a))));
    }
    // Column-major data of [[0, 1, 2], [10, 11, 12]] and of a [2, 3, 2] f64 array.
    let fortran = "{'descr': '<i4', 'fortran_order': True, 'shape': (2, 3), }";
    let f_data = le(&[0i32, 10, 1, 11, 2, 12], i32::to_le_bytes);
    out.push(("npy/fortran_i32.npy".into(), npy_v(1, fortran, &f_data)));
    let f3 = "{'descr': '<f8', 'fortran_order': True, 'shape': (2, 3, 2), }";
    let f3_data = le(
        &(0..12).map(f64::from).collect::<Vec<_>>(),
        f64::to_le_bytes,
    );
    out.push(("npy/fortran_f64_3d.npy".into(), npy_v(1, f3, &f3_data)));
    let big = "{'descr': '>f8', 'fortran_order': False, 'shape': (2,), }";
    out.push((
        "npy/bigendian_f64.npy".into(),
        npy_v(1, big, &le(&[1.5f64, -2.0], f64::to_be_bytes)),
    ));
    let big_i = "{'descr': '>i8', 'fortran_order': True, 'shape': (1, 2), }";
    out.push((
        "npy/bigendian_fortran_i64.npy".into(),
        npy_v(1, big_i, &le(&[1i64, -2], i64::to_be_bytes)),
    ));
    let v2 = "{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }";
    out.push((
        "npy/v2_f32.npy".into(),
        npy_v(2, v2, &le(&[1f32, 2.0, 3.0], f32::to_le_bytes)),
    ));
    let v3 = "{'descr': '|b1', 'fortran_order': False, 'shape': (2,), }";
    out.push(("npy/v3_bool.npy".into(), npy_v(3, v3, &[1, 0])));
    let npz_all = saved(&|p| io::save_npz(p, &every));
    out.push(("npz/every.npz".into(), npz_all));
    let members = vec![
        member("f.npy", npy_v(1, fortran, &f_data), true),
        member(
            "s.npy",
            npy("<f8", "()", &le(&[2.5f64], f64::to_le_bytes)),
            true,
        ),
        member("e.npy", npy("|u1", "(0, 3)", &[]), false),
        member(
            "b.npy",
            npy_v(1, big, &le(&[1.5f64, -2.0], f64::to_be_bytes)),
            true,
        ),
    ];
    out.push(("npz/deflated.npz".into(), zip(&members)));
    let st_all = saved(&|p| io::save_safetensors(p, &every));
    out.push(("safetensors/every.safetensors".into(), st_all));
    let one = [("x", m.create(&[1.0f32, 2.0], [2]))];
    out.push((
        "safetensors/one.safetensors".into(),
        saved(&|p| io::save_safetensors(p, &one)),
    ));
    let targets = fuzz_shapes::checkpoint_targets(&m);
    out.push((
        "checkpoint/targets.safetensors".into(),
        saved(&|p| io::save_checkpoint(p, &targets)),
    ));
    let changed: Vec<(String, NDArray)> = targets
        .iter()
        .map(|(n, a)| {
            (
                n.clone(),
                (a.to_dtype(DType::F64) * -2.0 + 1.0).to_dtype(a.dtype()),
            )
        })
        .collect();
    out.push((
        "checkpoint/changed.safetensors".into(),
        saved(&|p| io::save_checkpoint(p, &changed)),
    ));
    for (i, s) in [
        "",
        "1",
        "-1",
        ":",
        "1:3",
        "::-1",
        "5::-2",
        "...",
        "..., 0",
        "0, ...",
        "1:, ::2, 0",
        "0,",
        " 2 , -1 ",
        ":, :, :, :",
        "-100:100:3",
        "0:0",
        "::0",
    ]
    .iter()
    .enumerate()
    {
        out.push((format!("index/{i:02}.txt"), s.as_bytes().to_vec()));
    }
    let _ = std::fs::remove_file(d.join("seed.tmp"));
    m.close();
    out
}

/// Load one seed with its target's reader.
fn load_seed(m: &NDManager, target: &str, p: &Path) -> Result<usize> {
    Ok(match target {
        "npy" => io::try_load_npy(m, p).map(|_| 1)?,
        "npz" => io::try_load_npz(m, p)?.len(),
        "safetensors" => io::try_load_safetensors(m, p)?.len(),
        "checkpoint" => {
            let t = fuzz_shapes::checkpoint_targets(m);
            io::try_load_into(p, &t)?;
            t.len()
        }
        _ => unreachable!("{target}"),
    })
}

/// The committed seeds (`fuzz/seeds/<target>/`) are exactly what [`seeds`] writes
/// (`NDSCOPE_WRITE_SEEDS=1` rewrites them), every file seed loads with its target's
/// reader, every index seed parses or is an `Index` error, and the corpus stays
/// small (under 100 KB).
#[test]
fn fuzz_seeds_are_valid_and_current() {
    let _s = serial();
    let d = tmp("seeds");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds");
    let want = seeds(&d);
    if std::env::var_os("NDSCOPE_WRITE_SEEDS").is_some() {
        let _ = std::fs::remove_dir_all(&root);
        for (name, bytes) in &want {
            let p = root.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(&p, bytes).unwrap();
        }
    }
    let mut committed = Vec::new();
    for t in std::fs::read_dir(&root).unwrap() {
        let t = t.unwrap();
        for f in std::fs::read_dir(t.path()).unwrap() {
            let f = f.unwrap().path();
            let name = format!(
                "{}/{}",
                t.file_name().to_string_lossy(),
                f.file_name().unwrap().to_string_lossy()
            );
            committed.push((name, std::fs::read(&f).unwrap()));
        }
    }
    committed.sort();
    let mut want = want;
    want.sort();
    let names = |v: &[(String, Vec<u8>)]| v.iter().map(|(n, _)| n.clone()).collect::<Vec<_>>();
    assert_eq!(
        names(&committed),
        names(&want),
        "seed files (NDSCOPE_WRITE_SEEDS=1 rewrites)"
    );
    for ((name, got), (_, want)) in committed.iter().zip(&want) {
        assert!(got == want, "{name} differs from what the test writes");
    }
    let total: usize = committed.iter().map(|(_, b)| b.len()).sum();
    assert!(total < 100_000, "{total} bytes of seeds");
    let m = NDManager::new();
    let a = m.arange(0.0, 24.0, 1.0, DType::F32).reshape([2, 3, 4]);
    for (name, _) in &committed {
        let (target, _) = name.split_once('/').unwrap();
        let p = root.join(name);
        if target == "index" {
            let s = std::fs::read_to_string(&p).unwrap();
            match a.try_get(&s) {
                Ok(v) => assert!(v.size() <= a.size()),
                Err(e) => assert!(matches!(e, NdError::Index { .. }), "{name}: {e:?}"),
            }
            continue;
        }
        let n = load_seed(&m, target, &p).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert!(n >= 1, "{name}");
    }
    // The Fortran-order seed reads back in row-major order.
    let f = io::load_npy(&m, root.join("npy/fortran_i32.npy"));
    assert_eq!(f.to_vec::<i32>().unwrap(), [0, 1, 2, 10, 11, 12]);
    m.close();
    std::fs::remove_dir_all(&d).unwrap();
}
