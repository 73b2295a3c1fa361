//! The wgpu backend (feature `gpu`): device memory from a caching pool, and WGSL
//! kernels that read strided views directly.
//!
//! # Design
//!
//! * **Adapters** are enumerated once per process ([`adapters`]), in a stable order:
//!   `Device::Gpu(n)` is the n-th. A device and its queue are opened on first use
//!   ([`ctx`]). Without a driver the list is empty and nothing panics.
//! * **Memory** ([`GpuBuffer`]) comes from a per-device caching pool of power-of-two
//!   size classes (as the CPU pool and PyTorch's CUDA caching allocator): a dropped
//!   buffer goes back to the pool at once. Reuse needs no fence: every command of a
//!   device is recorded into one encoder and submitted, in order, on its one queue,
//!   and wgpu orders the accesses of successive dispatches to the same buffer; host
//!   writes (`Queue::write_buffer`, which runs at the start of the *next* submission)
//!   first submit what is queued, so they never overtake a queued read of a reused
//!   buffer. [`empty_cache`] returns the cached buffers to the driver.
//! * **Work is queued**: kernels record into the device's pending encoder, submitted
//!   on a read ([`download`]), before a host write, and past [`MAX_PENDING`] commands.
//! * **A launch creates nothing** in the steady state ([`Ctx::launch`]), since a small
//!   op's host cost is what it costs: its parameter words go into the batch's slice of
//!   one arena buffer (bound at a dynamic offset, written once per batch just before
//!   it is submitted), its bind group comes from a cache keyed by the pool serials of
//!   its buffers (a training loop gets the same pooled buffers back, so the same
//!   groups), and its dispatch goes into the batch's one open compute pass.
//! * **Dtypes**: F32 and I32 as themselves; U8 and Bool as one `u32` per element
//!   (WGSL has no 8-bit storage type), so they take 4 bytes an element on the device;
//!   I64 and F64 as themselves where the adapter offers them in shaders (wgpu's
//!   `SHADER_INT64`; F64 needs `SHADER_F64` and `SHADER_INT64`, whose 64-bit words
//!   carry an F64 kernel's scalar), else a buffer of them is refused
//!   (`UnsupportedDTypeOn`) before anything is allocated ([`Ctx::check_dtype`]).
//!   `NDSCOPE_GPU_NO_64BIT=1` opens devices without them (to try what users of such
//!   adapters see).
//! * **Kernels** ([`kernels`]) take their inputs as (buffer, layout) pairs: broadcast
//!   (stride 0), stepped, reversed and transposed views are read in place, through a
//!   small parameter block of offsets, shape and strides. Pipelines are cached.
//!
//! This module knows nothing of records, managers or scopes: the engine calls it.

pub(crate) mod conv;
pub(crate) mod gather;
pub(crate) mod inplace;
pub(crate) mod kernels;
pub(crate) mod math;
pub(crate) mod norm;
pub(crate) mod random;
pub(crate) mod reduce;
pub(crate) mod rows;
pub(crate) mod stats;

use crate::DType;
use crate::device::Device;
use crate::error::{NdError, Result};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::OnceLock;

/// Commands queued on a device before they are submitted without waiting for a read.
pub(crate) const MAX_PENDING: usize = 128;

/// The most parameter bytes one launch binds from the arena (larger blocks get a
/// buffer of their own).
const PARAM_BINDING: usize = 4096;

/// Bytes of a device's parameter arena: a batch's launches, at most [`MAX_PENDING`],
/// each up to [`PARAM_BINDING`] bytes; a batch that would overflow it is submitted
/// first.
const ARENA_BYTES: usize = 256 * 1024;

/// Cached bind groups per device before the cache starts over.
const MAX_BIND_GROUPS: usize = 4096;

/// What [`adapters`] lists of one GPU.
pub(crate) struct AdapterInfo {
    /// The adapter's name ("llvmpipe (LLVM 15.0.6, 256 bits)", "NVIDIA H200", ...).
    pub name: String,
    /// Its API: "vulkan", "metal", "dx12" or "gl".
    pub backend: &'static str,
    /// The 64-bit shader features a device of it is opened with: `SHADER_INT64`, and
    /// `SHADER_F64` with it, where offered (none under `NDSCOPE_GPU_NO_64BIT=1`).
    pub wide: wgpu::Features,
}

impl AdapterInfo {
    /// The dtypes its arrays may have.
    pub(crate) fn dtypes(&self) -> Vec<DType> {
        [
            DType::F32,
            DType::I32,
            DType::U8,
            DType::Bool,
            DType::I64,
            DType::F64,
        ]
        .into_iter()
        .filter(|&d| holds(self.wide, d))
        .collect()
    }
}

/// Whether a device opened with the 64-bit shader features `wide` holds `dtype`
/// arrays: I64 needs `SHADER_INT64`, F64 `SHADER_F64` (granted only with it).
fn holds(wide: wgpu::Features, dtype: DType) -> bool {
    match dtype {
        DType::I64 => wide.contains(wgpu::Features::SHADER_INT64),
        DType::F64 => wide.contains(wgpu::Features::SHADER_F64),
        _ => true,
    }
}

struct Gpus {
    adapters: Vec<wgpu::Adapter>,
    infos: Vec<AdapterInfo>,
    ctxs: Vec<OnceLock<std::result::Result<Ctx, String>>>,
}

fn gpus() -> &'static Gpus {
    static GPUS: OnceLock<Gpus> = OnceLock::new();
    GPUS.get_or_init(|| {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle());
        let mut adapters = pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()));
        // Stable order: discrete GPUs first, then the rest, each by name.
        adapters.sort_by_key(|a| {
            let i = a.get_info();
            (i.device_type != wgpu::DeviceType::DiscreteGpu, i.name)
        });
        let infos = adapters
            .iter()
            .map(|a| {
                let i = a.get_info();
                let int64 = wgpu::Features::SHADER_INT64;
                let wide = if std::env::var("NDSCOPE_GPU_NO_64BIT").as_deref() == Ok("1")
                    || !a.features().contains(int64)
                {
                    wgpu::Features::empty()
                } else {
                    a.features() & (int64 | wgpu::Features::SHADER_F64)
                };
                AdapterInfo {
                    wide,
                    name: i.name,
                    backend: match i.backend {
                        wgpu::Backend::Vulkan => "vulkan",
                        wgpu::Backend::Metal => "metal",
                        wgpu::Backend::Dx12 => "dx12",
                        wgpu::Backend::Gl => "gl",
                        _ => "other",
                    },
                }
            })
            .collect();
        let ctxs = adapters.iter().map(|_| OnceLock::new()).collect();
        Gpus {
            adapters,
            infos,
            ctxs,
        }
    })
}

/// The GPUs of this process, in `Device::Gpu(n)` order.
pub(crate) fn adapters() -> &'static [AdapterInfo] {
    &gpus().infos
}

/// An open device: its queue, pending commands, pipelines and memory pool.
pub(crate) struct Ctx {
    pub(crate) index: usize,
    pub(crate) device: wgpu::Device,
    queue: wgpu::Queue,
    /// The largest buffer a kernel may bind.
    pub(crate) max_binding: u64,
    /// The 64-bit shader features it was opened with ([`AdapterInfo::wide`]).
    wide: wgpu::Features,
    pending: Mutex<Pending>,
    pipelines: Mutex<HashMap<String, &'static Kernel>>,
    layouts: Mutex<HashMap<(usize, usize), &'static Layouts>>,
    /// Bind groups of recent launches, by the buffers they bind; cleared when the
    /// cache is emptied (its buffers are destroyed) and when it grows past
    /// [`MAX_BIND_GROUPS`].
    bind_groups: Mutex<HashMap<BindKey, wgpu::BindGroup>>,
    /// The parameter words of a batch's launches, each at its own aligned offset
    /// (bound with a dynamic offset, so one bind group serves every offset).
    arena: wgpu::Buffer,
    /// `min_storage_buffer_offset_alignment`.
    param_align: usize,
    pool: Mutex<Pool>,
}

/// What is recorded and not yet submitted: one encoder, the compute pass open on it
/// (every dispatch of a batch goes into one pass), and the batch's parameter words,
/// written into [`Ctx::arena`] just before the batch is submitted.
#[derive(Default)]
struct Pending {
    encoder: Option<wgpu::CommandEncoder>,
    pass: Option<wgpu::ComputePass<'static>>,
    commands: usize,
    params: Vec<u8>,
}

/// A compiled kernel: its pipeline and the shape of its bind group (binding 0 the
/// parameter words, then `reads` read-only buffers, then `writes` read-write ones).
pub(crate) struct Kernel {
    pipeline: wgpu::ComputePipeline,
    reads: usize,
    writes: usize,
}

/// The bind group layouts of one shape (reads, writes) and their pipeline layout.
struct Layouts {
    group: wgpu::BindGroupLayout,
    pipeline: wgpu::PipelineLayout,
}

/// A cached bind group's key: the layout's shape and the pool serials of its buffers
/// (serials are never reused, so a key never names a different buffer).
type BindKey = (usize, usize, smallvec::SmallVec<[u64; 4]>);

/// Cached and live device buffers of one device.
#[derive(Default)]
struct Pool {
    /// Cached buffers by size class, each with its serial.
    free: HashMap<u64, Vec<(wgpu::Buffer, u64)>>,
    /// The serial of the next buffer created.
    next_serial: u64,
    cached_bytes: u64,
    live_buffers: usize,
    live_bytes: u64,
    peak_bytes: u64,
    /// Buffers handed out so far, from the cache or new (monotonic).
    allocations: u64,
}

/// The memory counters of one device's pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PoolStats {
    pub live_buffers: usize,
    /// Bytes of live buffers as asked for (what the arrays account; the pool's size
    /// classes round each up to a power of two).
    pub live_bytes: usize,
    pub peak_bytes: usize,
    pub cached_bytes: usize,
    /// Buffers handed out so far (monotonic).
    pub allocations: u64,
}

/// The open device `Device::Gpu(index)`, opening it on first use.
pub(crate) fn ctx(index: usize) -> Result<&'static Ctx> {
    let g = gpus();
    let Some(cell) = g.ctxs.get(index) else {
        return Err(NdError::NoDevice {
            device: Device::Gpu(index),
            gpus: g.infos.len(),
        });
    };
    cell.get_or_init(|| open(index, &g.adapters[index], g.infos[index].wide))
        .as_ref()
        .map_err(|e| NdError::invalid("new_on", format!("gpu:{index} could not be opened: {e}")))
}

fn open(
    index: usize,
    adapter: &wgpu::Adapter,
    wide: wgpu::Features,
) -> std::result::Result<Ctx, String> {
    let limits = adapter.limits();
    let desc = wgpu::DeviceDescriptor {
        label: Some("ndscope"),
        required_features: wide,
        required_limits: limits.clone(),
        experimental_features: wgpu::ExperimentalFeatures::disabled(),
        memory_hints: wgpu::MemoryHints::Performance,
        trace: wgpu::Trace::Off,
    };
    let (device, queue) =
        pollster::block_on(adapter.request_device(&desc)).map_err(|e| e.to_string())?;
    let arena = device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("ndscope parameters"),
        size: ARENA_BYTES as u64,
        usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    Ok(Ctx {
        index,
        device,
        queue,
        max_binding: limits
            .max_storage_buffer_binding_size
            .min(limits.max_buffer_size),
        wide,
        pending: Mutex::default(),
        pipelines: Mutex::default(),
        layouts: Mutex::default(),
        bind_groups: Mutex::default(),
        arena,
        param_align: limits.min_storage_buffer_offset_alignment.max(4) as usize,
        pool: Mutex::default(),
    })
}

/// The pool's size class of `bytes` (at least 4: wgpu copies whole words).
fn class_of(bytes: u64) -> u64 {
    bytes.max(4).next_power_of_two()
}

impl Ctx {
    /// The device this context serves.
    pub(crate) fn device_id(&self) -> Device {
        Device::Gpu(self.index)
    }

    /// `Ok` when this device holds arrays of `dtype`, else `UnsupportedDTypeOn` naming
    /// `op` (every buffer of a dtype is made after this check: [`upload`] and the
    /// kernels' output buffers).
    pub(crate) fn check_dtype(&self, op: &'static str, dtype: DType) -> Result<()> {
        if holds(self.wide, dtype) {
            Ok(())
        } else {
            Err(NdError::UnsupportedDTypeOn {
                op,
                dtype,
                device: self.device_id(),
            })
        }
    }

    /// A buffer of at least `bytes` bytes (contents undefined), from the pool when one
    /// of its size class is cached.
    pub(crate) fn alloc(&'static self, bytes: u64) -> Result<GpuBuffer> {
        if bytes > self.max_binding {
            return Err(NdError::invalid(
                "alloc",
                format!(
                    "{bytes} bytes on {} exceed the largest buffer a kernel can bind ({} bytes)",
                    self.device_id(),
                    self.max_binding
                ),
            ));
        }
        let class = class_of(bytes);
        let cached = {
            let mut p = self.pool.lock();
            let b = p.free.get_mut(&class).and_then(Vec::pop);
            if b.is_some() {
                p.cached_bytes -= class;
            }
            b
        };
        let (buf, serial) = match cached {
            Some(b) => b,
            None => {
                let b = self.create(class)?;
                let mut p = self.pool.lock();
                p.next_serial += 1;
                (b, p.next_serial)
            }
        };
        let mut p = self.pool.lock();
        p.live_buffers += 1;
        p.allocations += 1;
        p.live_bytes += bytes;
        p.peak_bytes = p.peak_bytes.max(p.live_bytes);
        Ok(GpuBuffer {
            ctx: self,
            buf: Some(buf),
            serial,
            bytes: bytes as usize,
        })
    }

    /// A new driver buffer of `class` bytes; on failure the cache is emptied and the
    /// allocation tried once more.
    fn create(&self, class: u64) -> Result<wgpu::Buffer> {
        let make = || {
            let scope = self.device.push_error_scope(wgpu::ErrorFilter::OutOfMemory);
            let b = self.device.create_buffer(&wgpu::BufferDescriptor {
                label: None,
                size: class,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            });
            match pollster::block_on(scope.pop()) {
                None => Some(b),
                Some(_) => None,
            }
        };
        if let Some(b) = make() {
            return Ok(b);
        }
        self.empty_cache();
        make().ok_or(NdError::OutOfMemory {
            bytes: class as usize,
            device: self.device_id(),
        })
    }

    fn give_back(&self, buf: wgpu::Buffer, serial: u64, bytes: usize) {
        let class = buf.size();
        let mut p = self.pool.lock();
        p.live_buffers -= 1;
        p.live_bytes -= bytes as u64;
        p.cached_bytes += class;
        p.free.entry(class).or_default().push((buf, serial));
    }

    /// Return every cached buffer to the driver (after the queued work, which may
    /// still use them, is done).
    pub(crate) fn empty_cache(&self) {
        let free = {
            let mut p = self.pool.lock();
            p.cached_bytes = 0;
            std::mem::take(&mut p.free)
        };
        // Cached bind groups may name these buffers.
        self.bind_groups.lock().clear();
        self.flush();
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
        for (b, _) in free.into_values().flatten() {
            b.destroy();
        }
        let _ = self.device.poll(wgpu::PollType::wait_indefinitely());
    }

    pub(crate) fn stats(&self) -> PoolStats {
        let p = self.pool.lock();
        PoolStats {
            live_buffers: p.live_buffers,
            live_bytes: p.live_bytes as usize,
            peak_bytes: p.peak_bytes as usize,
            cached_bytes: p.cached_bytes as usize,
            allocations: p.allocations,
        }
    }

    pub(crate) fn reset_peak(&self) {
        let mut p = self.pool.lock();
        p.peak_bytes = p.live_bytes;
    }

    /// Bytes the driver's allocator reports as allocated, where it reports.
    pub(crate) fn driver_bytes(&self) -> Option<usize> {
        self.device
            .generate_allocator_report()
            .map(|r| r.total_allocated_bytes as usize)
    }

    /// Record a command other than a dispatch (a copy) into the pending encoder, after
    /// ending the open compute pass; submitted past [`MAX_PENDING`] commands.
    pub(crate) fn record(&self, f: impl FnOnce(&mut wgpu::CommandEncoder)) {
        let mut p = self.pending.lock();
        p.pass = None; // ends the pass, so the encoder can record again
        let enc = p.encoder.get_or_insert_with(|| {
            self.device
                .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
        });
        f(enc);
        p.commands += 1;
        if p.commands >= MAX_PENDING {
            self.submit(&mut p);
        }
    }

    /// Submit the queued commands.
    pub(crate) fn flush(&self) {
        self.submit(&mut self.pending.lock());
    }

    /// End the open pass, write the batch's parameter words into the arena (a queued
    /// write runs before the commands of the submission that follows it, and after
    /// every earlier submission, which read the arena's previous contents) and submit.
    fn submit(&self, p: &mut Pending) {
        p.pass = None;
        p.commands = 0;
        if let Some(enc) = p.encoder.take() {
            if !p.params.is_empty() {
                self.queue.write_buffer(&self.arena, 0, &p.params);
                p.params.clear();
            }
            self.queue.submit([enc.finish()]);
        }
    }

    /// The bind group layouts of kernels with `reads` inputs and `writes` outputs.
    fn layouts(&self, reads: usize, writes: usize) -> &'static Layouts {
        if let Some(l) = self.layouts.lock().get(&(reads, writes)) {
            return l;
        }
        let entry = |binding: usize, read_only: bool, has_dynamic_offset: bool| {
            wgpu::BindGroupLayoutEntry {
                binding: binding as u32,
                visibility: wgpu::ShaderStages::COMPUTE,
                ty: wgpu::BindingType::Buffer {
                    ty: wgpu::BufferBindingType::Storage { read_only },
                    has_dynamic_offset,
                    min_binding_size: None,
                },
                count: None,
            }
        };
        let entries: Vec<_> = std::iter::once(entry(0, true, true))
            .chain((1..=reads).map(|b| entry(b, true, false)))
            .chain((reads + 1..=reads + writes).map(|b| entry(b, false, false)))
            .collect();
        let group = self
            .device
            .create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
                label: None,
                entries: &entries,
            });
        let pipeline = self
            .device
            .create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
                label: None,
                bind_group_layouts: &[Some(&group)],
                immediate_size: 0,
            });
        let l: &'static Layouts = Box::leak(Box::new(Layouts { group, pipeline }));
        self.layouts.lock().insert((reads, writes), l);
        l
    }

    /// The cached kernel of `key`, built from `source` (WGSL, entry point `main`, its
    /// bindings as [`Kernel`] describes) on first use. Kernels live as long as the
    /// process (a bounded set: one per op and dtype).
    pub(crate) fn pipeline(
        &self,
        key: &str,
        (reads, writes): (usize, usize),
        source: impl FnOnce() -> String,
    ) -> &'static Kernel {
        if let Some(p) = self.pipelines.lock().get(key) {
            return p;
        }
        let module = self
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(key),
                source: wgpu::ShaderSource::Wgsl(source().into()),
            });
        let pipeline = self
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(key),
                layout: Some(&self.layouts(reads, writes).pipeline),
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        let k: &'static Kernel = Box::leak(Box::new(Kernel {
            pipeline,
            reads,
            writes,
        }));
        self.pipelines.lock().insert(key.to_string(), k);
        k
    }

    /// Record one launch of `kernel` over `grid` workgroups: binding 0 the parameter
    /// words `prm`, bindings `1..` the buffers `reads` and then `writes`, in order
    /// (every kernel's bind group has that shape, so this is the one place that binds
    /// and dispatches).
    ///
    /// A small op's host cost is what this costs, so nothing here is created per
    /// launch in the steady state: the words go into the batch's arena at an aligned
    /// offset (a dynamic offset of binding 0), the bind group comes from a cache keyed
    /// by the buffers' serials, and the dispatch goes into the batch's one open pass.
    pub(crate) fn launch(
        &self,
        kernel: &Kernel,
        prm: &[u32],
        reads: &[&GpuBuffer],
        writes: &[&GpuBuffer],
        (x, y, z): (u32, u32, u32),
    ) {
        debug_assert_eq!((reads.len(), writes.len()), (kernel.reads, kernel.writes));
        let bytes: &[u8] = bytemuck::cast_slice(prm);
        let mut p = self.pending.lock();
        let (group, offset) = if bytes.len() <= PARAM_BINDING {
            let mut at = p.params.len().next_multiple_of(self.param_align);
            if at + PARAM_BINDING > ARENA_BYTES {
                self.submit(&mut p);
                at = 0;
            }
            p.params.resize(at, 0);
            p.params.extend_from_slice(bytes);
            let key: BindKey = (
                reads.len(),
                writes.len(),
                reads.iter().chain(writes).map(|b| b.serial).collect(),
            );
            let mut cache = self.bind_groups.lock();
            if cache.len() >= MAX_BIND_GROUPS && !cache.contains_key(&key) {
                cache.clear();
            }
            let g = cache
                .entry(key)
                .or_insert_with(|| {
                    self.bind_group(kernel, &self.arena, PARAM_BINDING, reads, writes)
                })
                .clone();
            (g, at as u32)
        } else {
            // A block too large for the arena: a buffer and bind group of its own.
            let own = self.params(bytes);
            (self.bind_group(kernel, &own, bytes.len(), reads, writes), 0)
        };
        if p.pass.is_none() {
            let enc = p.encoder.get_or_insert_with(|| {
                self.device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: None })
            });
            p.pass = Some(
                enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default())
                    .forget_lifetime(),
            );
        }
        let pass = p.pass.as_mut().expect("opened above");
        pass.set_pipeline(&kernel.pipeline);
        pass.set_bind_group(0, &group, &[offset]);
        pass.dispatch_workgroups(x, y, z);
        p.commands += 1;
        if p.commands >= MAX_PENDING {
            self.submit(&mut p);
        }
    }

    /// A bind group of `kernel`'s shape: `params` (its first `size` bytes, at a dynamic
    /// offset) and the buffers.
    fn bind_group(
        &self,
        kernel: &Kernel,
        params: &wgpu::Buffer,
        size: usize,
        reads: &[&GpuBuffer],
        writes: &[&GpuBuffer],
    ) -> wgpu::BindGroup {
        let mut entries = Vec::with_capacity(1 + reads.len() + writes.len());
        entries.push(wgpu::BindGroupEntry {
            binding: 0,
            resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                buffer: params,
                offset: 0,
                size: std::num::NonZeroU64::new(size as u64),
            }),
        });
        for (k, b) in reads.iter().chain(writes).enumerate() {
            entries.push(wgpu::BindGroupEntry {
                binding: k as u32 + 1,
                resource: b.raw().as_entire_binding(),
            });
        }
        self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: None,
            layout: &self.layouts(kernel.reads, kernel.writes).group,
            entries: &entries,
        })
    }

    /// A small read-only buffer holding `bytes` (a parameter block too large for the
    /// arena); a queued command keeps it alive.
    fn params(&self, bytes: &[u8]) -> wgpu::Buffer {
        let b = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: None,
            size: bytes.len() as u64, // whole words, past PARAM_BINDING
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: true,
        });
        b.slice(..)
            .get_mapped_range_mut()
            .expect("mapped at creation")
            .copy_from_slice(bytes);
        b.unmap();
        b
    }
}

/// A block of device memory, returned to its device's pool when dropped.
pub(crate) struct GpuBuffer {
    ctx: &'static Ctx,
    buf: Option<wgpu::Buffer>,
    /// The pool's serial of `buf` (a cached bind group's key).
    serial: u64,
    /// The bytes asked for (the buffer itself is of the pool's size class).
    bytes: usize,
}

impl GpuBuffer {
    pub(crate) fn device(&self) -> Device {
        self.ctx.device_id()
    }

    pub(crate) fn ctx(&self) -> &'static Ctx {
        self.ctx
    }

    /// Bytes asked for (what an array of this buffer accounts).
    pub(crate) fn bytes(&self) -> usize {
        self.bytes
    }

    /// Identity of the block while it lives (aliasing checks), like a host address.
    pub(crate) fn addr(&self) -> usize {
        self.raw() as *const wgpu::Buffer as usize
    }

    pub(crate) fn raw(&self) -> &wgpu::Buffer {
        self.buf.as_ref().expect("live until dropped")
    }
}

impl Drop for GpuBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.buf.take() {
            self.ctx.give_back(b, self.serial, self.bytes);
        }
    }
}

/// Bytes per element of `dtype` on a device (U8 and Bool take a word each).
pub(crate) fn elem_bytes(dtype: DType) -> usize {
    match dtype {
        DType::F32 | DType::I32 | DType::U8 | DType::Bool => 4,
        DType::F64 | DType::I64 => 8,
    }
}

/// A new device buffer holding `n` elements of `dtype` from host bytes `data`
/// (`n * dtype.size_in_bytes()` of them); `op` names the caller in errors.
pub(crate) fn upload(
    op: &'static str,
    ctx: &'static Ctx,
    data: &[u8],
    dtype: DType,
) -> Result<GpuBuffer> {
    ctx.check_dtype(op, dtype)?;
    let words: std::borrow::Cow<'_, [u8]> = match dtype {
        DType::U8 | DType::Bool => data
            .iter()
            .flat_map(|&b| u32::from(b).to_le_bytes())
            .collect(),
        _ => data.into(),
    };
    let buf = ctx.alloc(words.len() as u64)?;
    if !words.is_empty() {
        // Queued reads of this (possibly reused) buffer go first: a host write runs at
        // the start of the next submission.
        ctx.flush();
        ctx.queue.write_buffer(buf.raw(), 0, &words);
    }
    Ok(buf)
}

/// The first `n` elements of `dtype` of `buf`, as host bytes (`n *
/// dtype.size_in_bytes()`): submits the queued work and waits for it.
pub(crate) fn download(buf: &GpuBuffer, n: usize, dtype: DType) -> Result<Vec<u8>> {
    let ctx = buf.ctx;
    let bytes = (n * elem_bytes(dtype)) as u64;
    if bytes == 0 {
        return Ok(Vec::new());
    }
    let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: None,
        size: bytes,
        usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    ctx.record(|enc| enc.copy_buffer_to_buffer(buf.raw(), 0, &staging, 0, bytes));
    ctx.flush();
    let (tx, rx) = std::sync::mpsc::channel();
    staging.map_async(wgpu::MapMode::Read, .., move |r| {
        let _ = tx.send(r);
    });
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| NdError::invalid("read", format!("{}: {e}", ctx.device_id())))?;
    rx.recv()
        .expect("map_async calls back during poll")
        .map_err(|e| NdError::invalid("read", format!("{}: {e}", ctx.device_id())))?;
    let out = {
        let view = staging.get_mapped_range(..).expect("mapped above");
        match dtype {
            DType::U8 | DType::Bool => view.chunks_exact(4).map(|w| w[0]).collect(),
            _ => view.to_vec(),
        }
    };
    staging.unmap();
    Ok(out)
}

/// Submit `Device::Gpu(index)`'s queued work and wait until it is done (a no-op for a
/// device not opened yet).
pub(crate) fn synchronize(index: usize) -> Result<()> {
    if let Some(Some(Ok(c))) = gpus().ctxs.get(index).map(OnceLock::get) {
        c.flush();
        c.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| NdError::invalid("synchronize", format!("gpu:{index}: {e}")))?;
    }
    Ok(())
}

/// Return every device's cached buffers to its driver (devices not yet opened have
/// none).
pub(crate) fn empty_cache() {
    for cell in &gpus().ctxs {
        if let Some(Ok(c)) = cell.get() {
            c.empty_cache();
        }
    }
}

/// The pool counters of every open GPU, added up.
pub(crate) fn totals() -> PoolStats {
    let mut t = PoolStats::default();
    for cell in &gpus().ctxs {
        if let Some(Ok(c)) = cell.get() {
            let s = c.stats();
            t.live_buffers += s.live_buffers;
            t.live_bytes += s.live_bytes;
            t.peak_bytes += s.peak_bytes;
            t.cached_bytes += s.cached_bytes;
            t.allocations += s.allocations;
        }
    }
    t
}

/// The pool counters of `Device::Gpu(index)`; zeros when it is not open (or absent).
pub(crate) fn stats(index: usize) -> PoolStats {
    match gpus().ctxs.get(index).and_then(OnceLock::get) {
        Some(Ok(c)) => c.stats(),
        _ => PoolStats::default(),
    }
}

/// Reset the peak of every open device.
pub(crate) fn reset_peak() {
    for cell in &gpus().ctxs {
        if let Some(Ok(c)) = cell.get() {
            c.reset_peak();
        }
    }
}

/// What the driver of `Device::Gpu(index)` reports as allocated.
pub(crate) fn driver_bytes(index: usize) -> Option<usize> {
    match gpus().ctxs.get(index).and_then(OnceLock::get) {
        Some(Ok(c)) => c.driver_bytes(),
        _ => None,
    }
}
