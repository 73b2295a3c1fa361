//! A short tour of ndscope: handles, managers, scopes, reference counts and the
//! diagnostics that explain a use-after-close.
//!
//! Run: `cargo run --release --example tour` (add `-- --quick` for CI; the tour is
//! already quick, the flag is accepted for uniformity with the other examples).

use ndscope::{DType, NDManager, NDScope, memory};

fn main() -> Result<(), ndscope::NdError> {
    let _quick = std::env::args().any(|a| a == "--quick");
    println!("== ndscope tour ==\n");

    // 1. Arrays are Copy handles owned by a manager.
    let m = NDManager::new();
    m.set_name("tour");
    let a = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let b = m.ones([2, 2], DType::F32);
    let c = a * 2.0 + b - 1; // no &, no ?, no clone
    println!("a * 2 + b - 1 = {:?} -> {:?}", c, c.to_vec::<f32>()?);
    println!("after creating a, b, c and one temporary: {}", m.memory());

    // 2. A scope frees everything created inside it, whatever its manager.
    let before = m.memory().live_arrays;
    {
        let _scope = NDScope::new();
        for _ in 0..1000 {
            let _t = (a * b + 1.0) * 0.5;
        }
        println!(
            "inside a scope after 1000 iterations: {} arrays",
            m.memory().live_arrays
        );
    }
    println!(
        "after the scope closed: {} arrays (was {before})",
        m.memory().live_arrays
    );

    // 3. scope(|| ...) returns values: returned arrays escape, temporaries are freed.
    let y = ndscope::scope(|| {
        let t = a * 3.0;
        t + 1.0
    });
    println!("scope(|| a * 3 + 1) = {:?}", y.to_vec::<f32>()?);

    // 4. Reference counts keep what must survive a scope.
    let kept = {
        let _s = NDScope::new();
        let k = a + 100.0;
        k.retain(); // count 2: the scope's registration + our retain
        k
    };
    println!(
        "retained array survived its scope: closed = {}",
        kept.is_closed()
    );
    println!("release() frees it: {}", kept.release());

    // 5. Use after close names the array, its creating line and why it was freed.
    let gone = {
        let _s = NDScope::new();
        a - 1.0
    };
    match gone.try_add(1.0) {
        Err(e) => println!("\nuse after close:\n  {e}\n"),
        Ok(_) => unreachable!(),
    }

    // 6. Managers form a tree; closing one frees its subtree.
    let sub = m.new_sub_manager();
    sub.set_name("tour/sub");
    let _s1 = sub.zeros([256, 256], DType::F64);
    print!("manager tree:\n{}", m.debug_dump());
    m.close();
    println!("after m.close(): process-wide {}", memory());
    Ok(())
}
