//! Devices in the API: `Device`, `devices()`, a manager's device, `to_device`, and the
//! typed errors for a device that is not there. (Arrays on a GPU come with the wgpu
//! backend; here every array is on the CPU.)

use ndscope::{
    DType, Device, GradientCollector, NDManager, NDScope, NdError, devices, driver_memory,
    memory_on,
};
use std::panic::{AssertUnwindSafe, catch_unwind};

fn gpus() -> usize {
    devices().iter().filter(|d| d.device != Device::Cpu).count()
}

fn panic_text(f: impl FnOnce()) -> String {
    let e = catch_unwind(AssertUnwindSafe(f)).expect_err("should panic");
    e.downcast_ref::<String>().cloned().unwrap_or_default()
}

#[test]
fn devices_list_the_cpu_first_then_numbered_gpus() {
    let d = devices();
    assert_eq!(d[0].device, Device::Cpu);
    assert_eq!((d[0].name.as_str(), d[0].backend.as_str()), ("cpu", "cpu"));
    for (n, info) in d[1..].iter().enumerate() {
        assert_eq!(info.device, Device::Gpu(n));
        assert!(!info.name.is_empty() && !info.backend.is_empty());
    }
    assert_eq!(Device::Cpu.to_string(), "cpu");
    assert_eq!(Device::Gpu(1).to_string(), "gpu:1");
    assert_eq!(Device::default(), Device::Cpu);
}

#[test]
fn managers_carry_a_device_and_sub_managers_inherit_it() {
    assert_eq!(NDManager::system().device(), Device::Cpu);
    assert_eq!(NDManager::new().device(), Device::Cpu);
    let m = NDManager::new_on(Device::Cpu);
    assert_eq!(m.device(), Device::Cpu);
    assert_eq!(m.parent(), Some(NDManager::system()));
    let sub = m.new_sub_manager();
    assert_eq!(sub.device(), Device::Cpu);
    for a in [
        m.zeros([2], DType::F32),
        m.create(&[1i32, 2], [2]),
        m.arange(0.0, 3.0, 1.0, DType::F64),
        sub.random_uniform(0.0, 1.0, [3], DType::F32),
    ] {
        assert_eq!(a.device(), Device::Cpu);
    }
    m.close();
}

#[test]
fn a_device_that_is_not_there_is_no_device_and_allocates_nothing() {
    let missing = Device::Gpu(gpus());
    let e = NDManager::try_new_on(missing).unwrap_err();
    assert_eq!(
        e,
        NdError::NoDevice {
            device: missing,
            gpus: gpus()
        }
    );
    assert!(
        e.to_string().contains(&format!("no device {missing}")),
        "{e}"
    );
    assert_eq!(
        panic_text(|| {
            NDManager::new_on(missing);
        }),
        e.to_string()
    );

    let m = NDManager::new();
    let a = m.create(&[1.0f32, 2.0], [2]);
    let before = m.memory();
    let e = a.try_to_device(missing).unwrap_err();
    assert!(matches!(e, NdError::NoDevice { .. }), "{e}");
    assert_eq!(
        panic_text(|| {
            a.to_device(missing);
        }),
        e.to_string()
    );
    assert_eq!(m.memory(), before);
    m.close();
}

#[test]
fn to_device_is_a_copy_owned_like_any_result() {
    let m = NDManager::new();
    let a = m.create(&[1.0f32, 2.0, 3.0, 4.0], [2, 2]);
    let kept;
    {
        let _s = NDScope::new();
        let t = a.transpose();
        let b = t.to_device(Device::Cpu);
        assert_ne!(b, t);
        assert_eq!(b.manager(), m);
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
        b.try_addi(10.0).unwrap();
        assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 3.0, 2.0, 4.0]);
        kept = b;
    }
    // Registered in the scope it was made in (rule 1): closed with it.
    assert!(kept.is_closed());
    assert!(matches!(kept.try_device(), Err(NdError::Closed(_))));
    assert_eq!(m.memory().live_arrays, 1);
    m.close();
}

#[test]
fn gradients_flow_through_to_device() {
    let m = NDManager::new();
    let w = m.create(&[1.0f32, 2.0], [2]);
    w.set_requires_gradient(true);
    {
        let gc = GradientCollector::new();
        let loss = (w.to_device(Device::Cpu) * 3.0).sum();
        gc.backward(loss).unwrap();
    }
    assert_eq!(w.gradient().to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
    m.close();
}

#[test]
fn memory_on_the_cpu_is_the_process_total_and_the_cpu_has_no_driver_report() {
    // Process-wide counters move with other tests' arrays: compare fields that a
    // concurrent test cannot make differ between two reads of the same snapshot.
    assert_eq!(memory_on(Device::Gpu(gpus() + 7)), Default::default());
    assert_eq!(driver_memory(Device::Cpu), None);
    assert_eq!(driver_memory(Device::Gpu(gpus() + 7)), None);
    let m = NDManager::new();
    let a = m.zeros([1000], DType::F64);
    assert!(memory_on(Device::Cpu).live_bytes >= 8000);
    a.close();
    m.close();
}
