//! The arrays the `checkpoint` fuzz target loads into. Shared with
//! tests/untrusted_files.rs (`#[path]`), which writes the `checkpoint` seeds from them,
//! so the seeds always match the target.

use ndscope::{DType, NDArray, NDManager};

/// Named arrays of every dtype, a 0-d one, a zero-size one and a transposed view
/// (a checkpoint writes through the view's layout), owned by `m`.
pub fn checkpoint_targets(m: &NDManager) -> Vec<(String, NDArray)> {
    vec![
        (
            "w".into(),
            m.create(&[0.5f32, -1.0, 2.0, 3.5, 0.0, -0.0], [2, 3]),
        ),
        ("b".into(), m.create(&[1.0f64, 2.0], [2])),
        ("i".into(), m.create(&[7i32, -7], [2])),
        ("n".into(), m.scalar(-3i64)),
        ("u".into(), m.zeros([0], DType::U8)),
        ("flag".into(), m.create(&[true, false, true], [3])),
        (
            "wt".into(),
            m.arange(0.0, 6.0, 1.0, DType::F32)
                .reshape([3, 2])
                .transpose(),
        ),
    ]
}
