use ndscope::*;
#[test]
fn smoke() {
    let base = memory();
    let m = NDManager::new();
    let a = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let z = m.zeros([2, 2], DType::F32);
    let c = a + z * 2.0 + 1;
    assert_eq!(c.to_vec::<f32>().unwrap(), vec![2.0, 3.0, 4.0, 5.0]);
    let d = 2.0 * a - 1;
    assert_eq!(d.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 5.0, 7.0]);
    let r = m.create(&[10.0f32, 20.0], [2]);
    assert_eq!(
        (a + r).to_vec::<f32>().unwrap(),
        vec![11.0, 22.0, 13.0, 24.0]
    );
    let y = scope(|| {
        let t = a * 3.0;
        t + 1.0
    });
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![4.0, 7.0, 10.0, 13.0]);
    let before = m.memory().live_arrays;
    {
        let _s = NDScope::new();
        let _t = a * 2.0;
        assert_eq!(m.memory().live_arrays, before + 1);
    }
    assert_eq!(m.memory().live_arrays, before);
    let x = {
        let _s = NDScope::new();
        let t = a * 2.0;
        t
    };
    let e = x.try_add(1.0).unwrap_err();
    println!("{e}");
    assert!(matches!(
        e.close_reason(),
        Some(CloseReason::ScopeClose { .. })
    ));
    let mut w = m.ones([2], DType::F64);
    w += 2.0;
    w -= m.ones([2], DType::F64);
    assert_eq!(w.to_vec::<f64>().unwrap(), vec![2.0, 2.0]);
    let big = m.ones([100000], DType::F32);
    let s2 = big + big;
    assert_eq!(s2.to_vec::<f32>().unwrap()[99999], 2.0);
    println!("{}", m.debug_dump());
    m.close();
    assert_eq!(memory().live_arrays, base.live_arrays);
    println!("{}", memory());
}
