//! The CUDA runtime the kernels run on: a context (device 0's primary one by default, any device's
//! or the caller's with [`Gpu::on_device`] / [`Gpu::for_context`]), one module loaded from PTX
//! text, one stream of its own (a caller's stream takes the launches of
//! [`crate::stream_api`]), and the module's kernel functions looked up once each.
//!
//! The driver is reached through `cudarc`'s driver API, which opens `libcuda` when the first call
//! needs it: building needs nothing of CUDA, and a machine without the library, the driver or a
//! device gets [`AttentionError::NoDevice`] from [`Gpu::new`].
//!
//! Threads: a [`Gpu`] is `Send + Sync`. Every method that calls the driver first makes the
//! context current on the calling thread, so one `Gpu` may be shared by threads or moved to
//! another. The context (device 0's primary context unless chosen: the one cudarc, candle and cust
//! share) is retained by the `Gpu` and by every buffer of this library ([`buffer`]), so it lives
//! as long as the last of them: a buffer may outlive the `Gpu` it was used with.
//!
//! Several devices: one `Gpu` per device ([`Gpu::on_device`]); [`peer`] copies buffers between
//! them.

pub mod buffer;
pub mod memory;
pub mod peer;
pub mod timing;

use std::collections::HashMap;
use std::ffi::CString;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use cudarc::driver::sys::{self, CUdevice_attribute, CUresult};
use cudarc::driver::{CudaContext, CudaStream, DriverError, result};

use crate::error::{AttentionError, CudaContext as _, Result, invalid};

/// Device 0's primary context while anything of this library holds it (empty otherwise, so the
/// driver may destroy the context once the last holder is gone), and the memory pool made with it.
static PRIMARY: Mutex<(Weak<CudaContext>, usize)> = Mutex::new((Weak::new(), 0));

/// Device 0's primary context, retained (shared with every other holder in this process) and
/// made current on the calling thread. A machine without a driver or a device gives `NoDevice`.
pub(crate) fn primary_context() -> Result<Arc<CudaContext>> {
    Ok(primary()?.0)
}

/// The library's stream-ordered memory pool on device 0 (made with the primary context), which
/// keeps freed memory for reuse instead of returning it to the driver at each synchronisation.
pub(crate) fn memory_pool() -> Result<sys::CUmemoryPool> {
    Ok(primary()?.1 as sys::CUmemoryPool)
}

/// Pools of the devices other than 0, made on first use and kept for the process (a pool is the
/// device's, not a context's).
static POOLS: Mutex<Vec<(sys::CUdevice, usize)>> = Mutex::new(Vec::new());

/// The library's memory pool for allocations in `context`, which is left current: device 0's
/// ([`memory_pool`]), or one made for the context's device.
pub(crate) fn memory_pool_for(context: &CudaContext) -> Result<sys::CUmemoryPool> {
    let device = context.cu_device();
    let pool = if context.ordinal() == 0 {
        memory_pool()?
    } else {
        let mut pools = POOLS.lock().unwrap_or_else(PoisonError::into_inner);
        match pools.iter().find(|(d, _)| *d == device) {
            Some(&(_, pool)) => pool as sys::CUmemoryPool,
            None => {
                make_current(context)?;
                let pool = create_pool(device)?;
                pools.push((device, pool as usize));
                pool
            }
        }
    };
    make_current(context)?;
    Ok(pool)
}

/// Whether libcuda can be used: cudarc opens it on its first call and panics where there is
/// none, so ask first. Linked against it (feature `cuda-dynamic-linking`, the way candle links
/// cudarc) the program would not have started without it.
#[cfg(not(feature = "cuda-dynamic-linking"))]
fn driver_present() -> bool {
    // SAFETY: only tries to open the library under its usual names.
    unsafe { sys::is_culib_present() }
}

#[cfg(feature = "cuda-dynamic-linking")]
fn driver_present() -> bool {
    true
}

fn primary() -> Result<(Arc<CudaContext>, usize)> {
    let mut slot = PRIMARY.lock().unwrap_or_else(PoisonError::into_inner);
    let (context, pool) = match slot.0.upgrade() {
        Some(context) => (context, slot.1),
        None => {
            if !driver_present() {
                return Err(AttentionError::NoDevice(
                    "the CUDA driver library (libcuda.so) could not be loaded".to_owned(),
                ));
            }
            // Retains the primary context (and makes it current on this thread).
            let context = CudaContext::new(0).map_err(starting)?;
            let pool = create_pool(context.cu_device())?;
            *slot = (Arc::downgrade(&context), pool as usize);
            (context, pool as usize)
        }
    };
    drop(slot);
    make_current(&context)?;
    Ok((context, pool))
}

/// A pool of device memory on `device` that never releases what it holds (the release threshold
/// is the largest value), so a call's allocations after the first come from the pool.
fn create_pool(device: sys::CUdevice) -> Result<sys::CUmemoryPool> {
    // SAFETY: all-zero is a valid `CUmemPoolProps` (no handle types, no security attributes);
    // the fields that matter are set below.
    let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
    props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
    props.handleTypes = sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE;
    props.location = sys::CUmemLocation {
        type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
        id: device,
    };
    // SAFETY: properties of a device allocation pool on a valid device.
    let pool = unsafe { result::mem_pool::create(&props) }.cuda("creating a memory pool")?;
    let mut threshold = u64::MAX;
    // SAFETY: the release threshold attribute takes a u64.
    let status = unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    };
    crate::error::driver(status, "setting the memory pool's release threshold")?;
    Ok(pool)
}

/// Makes `context` the calling thread's current context (the driver keeps one per thread).
pub(crate) fn make_current(context: &CudaContext) -> Result<()> {
    context
        .bind_to_thread()
        .cuda("making the context current on this thread")
}

/// A driver error while starting: the ones that mean "no usable GPU here" become `NoDevice`.
fn starting(e: DriverError) -> AttentionError {
    use CUresult::*;
    match e.0 {
        CUDA_ERROR_NO_DEVICE
        | CUDA_ERROR_NOT_INITIALIZED
        | CUDA_ERROR_INVALID_DEVICE
        | CUDA_ERROR_STUB_LIBRARY
        | CUDA_ERROR_SYSTEM_DRIVER_MISMATCH
        | CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE => AttentionError::NoDevice(format!("{e}")),
        CUDA_ERROR_UNKNOWN | CUDA_ERROR_OPERATING_SYSTEM => {
            AttentionError::NoDevice(format!("{e} (driver present but no usable GPU)"))
        }
        _ => AttentionError::Cuda {
            what: "initialising the driver",
            source: e,
        },
    }
}

mod sealed {
    pub trait Sealed {}
}

/// A kernel's by-value parameter struct: `#[repr(C)]`, shared byte for byte with the device code
/// in `attention_kernels`. Sealed: only those structs can be launched, so a launch never passes
/// the device a parameter block of some other layout.
pub trait KernelParams: sealed::Sealed + Copy {}

macro_rules! kernel_params {
    ($($t:ty),* $(,)?) => {$(
        impl sealed::Sealed for $t {}
        impl KernelParams for $t {}
    )*};
}

kernel_params!(
    attention_kernels::abi::params::FlashForwardParams,
    attention_kernels::abi::params::FlashBackwardParams,
    attention_kernels::abi::params::MaterializedScoresParams,
    attention_kernels::abi::params::MaterializedSoftmaxParams,
    attention_kernels::abi::params::MaterializedOutputParams,
    attention_kernels::abi::params::TensorCoreForwardParams,
    attention_kernels::abi::params::TmaForwardParams,
    attention_kernels::abi::params::Fp8ForwardParams,
    attention_kernels::abi::params::TensorCoreBackwardParams,
    attention_kernels::abi::params::TmaBackwardParams,
    attention_kernels::abi::params::MergeParams,
    attention_kernels::abi::params::DecodeParams,
    attention_kernels::abi::params::CacheAppendParams,
);

/// Dynamic shared memory every kernel may use without raising its limit.
const DEFAULT_DYNAMIC_SHARED: u32 = 48 * 1024;

/// The attention module, unloaded (in its context) when dropped.
struct Module {
    raw: sys::CUmodule,
    context: Arc<CudaContext>,
}

/// A stream this `Gpu` created (cudarc's view of it, which does not own it), destroyed when
/// dropped.
struct OwnedStream(Arc<CudaStream>);

/// A kernel function of the module, looked up once.
struct Kernel {
    /// Valid as long as the `Gpu`'s module: the cache is private to the `Gpu`, dropped before it.
    function: sys::CUfunction,
    /// The function's `MAX_DYNAMIC_SHARED_SIZE_BYTES` as this `Gpu` set it: only ever raised,
    /// always under the cache's lock, so a launch that fits it can never be failed by another
    /// thread's launch of the same kernel with a different size.
    dynamic_shared_limit: u32,
}

// Driver handles are plain values, usable from any thread where their context is current (every
// use here makes it current first).
unsafe impl Send for Module {}
unsafe impl Sync for Module {}
unsafe impl Send for Kernel {}

/// A context (device 0's primary one, or any the caller hands over) with the attention module
/// loaded in it.
pub struct Gpu {
    // Field order is drop order: the stream and module go before the context that owns them
    // (their drops make it current first, so they are released from any thread).
    stream: OwnedStream,
    kernels: Mutex<HashMap<String, Kernel>>,
    module: Module,
    compute_capability: (u32, u32),
    wgmma: bool,
    shared_optin: u32,
    /// The decode family's split counters for launches on `stream` (`Gpu::own_split_counters`).
    split_counters: Mutex<Option<buffer::DeviceF32>>,
    context: Arc<CudaContext>,
}

// A `Gpu` is shared between threads and moved to others (tests `runtime_threads` show it works).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Gpu>();
};

/// Where one call's work goes: the kernels of `gpu`'s module launched on `stream`, and the
/// call's temporaries (uploaded option arrays, staging copies) allocated and freed in stream order
/// on `temporaries` (null: the legacy default stream, which the library's own blocking stream
/// orders after).
pub(crate) struct Queue<'a> {
    pub gpu: &'a Gpu,
    pub stream: &'a CudaStream,
    pub temporaries: sys::CUstream,
}

impl<'a> Queue<'a> {
    /// The `Gpu`'s own stream, with temporaries on the legacy default stream.
    pub fn own(gpu: &'a Gpu) -> Queue<'a> {
        Queue {
            gpu,
            stream: gpu.stream(),
            temporaries: std::ptr::null_mut(),
        }
    }

    /// A caller's `stream` of `gpu`'s context, which also takes the temporaries.
    pub fn caller(gpu: &'a Gpu, stream: &'a CudaStream) -> Queue<'a> {
        Queue {
            gpu,
            stream,
            temporaries: stream.cu_stream(),
        }
    }

    pub fn stream(&self) -> &CudaStream {
        self.stream
    }

    pub fn context(&self) -> &Arc<CudaContext> {
        self.gpu.context()
    }

    pub fn launch<P: KernelParams>(&self, name: &str, cfg: LaunchConfig, params: &P) -> Result<()> {
        self.gpu.launch_on(self.stream, name, cfg, params)
    }
}

/// What a launch needs besides its parameters.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

impl Gpu {
    /// Retains device 0's primary context and loads `ptx`. A machine without a driver or without
    /// a device gives `AttentionError::NoDevice`; a module that does not load gives `Module`.
    pub fn new(ptx: &str) -> Result<Gpu> {
        Gpu::with_hopper_module(ptx, None)
    }

    /// As [`Gpu::new`], but on a compute capability 9.0 device loads `hopper` instead when given:
    /// the `sm_90a` module, which holds every kernel of `ptx` plus the `wgmma` ones
    /// ([`Gpu::has_wgmma`]). `sm_90a` code runs on no other architecture.
    pub fn with_hopper_module(ptx: &str, hopper: Option<&str>) -> Result<Gpu> {
        Gpu::for_context(primary_context()?, ptx, hopper)
    }

    /// As [`Gpu::with_hopper_module`] on device `ordinal`'s primary context (the one cudarc's
    /// `CudaContext::new(ordinal)`, candle and cust use). An ordinal with no device gives
    /// `NoDevice`.
    pub fn on_device(ordinal: usize, ptx: &str, hopper: Option<&str>) -> Result<Gpu> {
        if !driver_present() {
            return Err(AttentionError::NoDevice(
                "the CUDA driver library (libcuda.so) could not be loaded".to_owned(),
            ));
        }
        Gpu::for_context(CudaContext::new(ordinal).map_err(starting)?, ptx, hopper)
    }

    /// As [`Gpu::with_hopper_module`] in `context`, which the caller already holds (a candle or
    /// cudarc device's): the module is loaded there, so the entry points taking a caller's
    /// stream ([`crate::stream_api`]) run on that context's streams and memory.
    pub fn for_context(context: Arc<CudaContext>, ptx: &str, hopper: Option<&str>) -> Result<Gpu> {
        make_current(&context)?;
        let (major, minor) = context
            .compute_capability()
            .cuda("reading the compute capability")?;
        let compute_capability = (major as u32, minor as u32);
        let (ptx, wgmma) = match hopper {
            Some(h) if compute_capability == (9, 0) => (h, true),
            _ => (ptx, false),
        };
        let shared_optin = attribute(
            &context,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            "reading the shared-memory limit",
        )?;
        let module = Module::load(&context, ptx)?;
        Ok(Gpu {
            stream: OwnedStream::new(&context)?,
            kernels: Mutex::new(HashMap::new()),
            module,
            compute_capability,
            wgmma,
            shared_optin,
            split_counters: Mutex::new(None),
            context,
        })
    }

    /// The decode family's split counters for launches on this `Gpu`'s own stream: at least
    /// `words` u32, zeroed when allocated and left zero by every launch, so that a call needs no
    /// fill of its own. One buffer serves every call: the stream runs them one after another.
    /// A larger one replaces it in stream order (freed on the legacy default stream, after the
    /// launches queued before).
    pub(crate) fn own_split_counters(&self, words: usize) -> Result<u64> {
        let mut held = self
            .split_counters
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        if held.as_ref().is_none_or(|b| b.len() < words) {
            let len = words.next_power_of_two().max(256);
            let buffer =
                buffer::DeviceF32::uninitialized_on(len, &self.context, std::ptr::null_mut())?;
            buffer.zero_words(0, len)?;
            *held = Some(buffer);
        }
        Ok(held.as_ref().map_or(0, |b| b.device_ptr()))
    }

    /// Makes this GPU's context current on the calling thread. The library's own calls do this
    /// themselves; it is for code that calls the driver directly beside them.
    pub fn make_current(&self) -> Result<()> {
        make_current(&self.context)
    }

    /// The context the module is loaded in (device 0's primary context unless the `Gpu` came from
    /// [`Gpu::on_device`] or [`Gpu::for_context`]), as cudarc holds it: for memory and streams of
    /// your own in the same context as the library's.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.context
    }

    /// Whether the loaded module has the `wgmma` kernels (an `sm_90a` module on a 9.0 device).
    pub fn has_wgmma(&self) -> bool {
        self.wgmma
    }

    /// `(major, minor)` compute capability of the device.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
    }

    /// The stream every launch goes to: a blocking stream, so it orders after the legacy default
    /// stream, where the library's uploads and downloads run. It lives as long as this `Gpu`.
    pub fn stream(&self) -> &CudaStream {
        &self.stream.0
    }

    pub fn device_name(&self) -> String {
        self.context
            .name()
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }

    /// The CUDA version the driver supports, e.g. "13.0".
    pub fn cuda_version(&self) -> Result<String> {
        let mut v = 0;
        // SAFETY: an out-pointer to an int.
        let status = unsafe { sys::cuDriverGetVersion(&mut v) };
        crate::error::driver(status, "reading the driver's CUDA version")?;
        Ok(format!("{}.{}", v / 1000, v % 1000 / 10))
    }

    /// Shared memory a block may opt in to, in bytes (227 KiB on the H100/H200).
    pub fn max_shared_per_block(&self) -> Result<u32> {
        Ok(self.shared_optin)
    }

    pub fn multiprocessors(&self) -> Result<u32> {
        attribute(
            &self.context,
            CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            "reading the multiprocessor count",
        )
    }

    /// `(free, total)` device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.context.mem_get_info().cuda("reading device memory")
    }

    /// The cached function `name` with its dynamic shared-memory limit at least `shared_bytes`.
    /// Lookup and any raise of the limit happen under the cache's lock; the limit never drops.
    fn kernel(&self, name: &str, shared_bytes: u32) -> Result<sys::CUfunction> {
        let mut kernels = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        if !kernels.contains_key(name) {
            let kernel = Kernel {
                function: self.module.function(name)?,
                dynamic_shared_limit: DEFAULT_DYNAMIC_SHARED,
            };
            kernels.insert(name.to_owned(), kernel);
        }
        let kernel = kernels.get_mut(name).expect("inserted above");
        if shared_bytes > kernel.dynamic_shared_limit {
            // SAFETY: a valid function handle (its module is loaded) and a documented attribute.
            unsafe {
                result::function::set_function_attribute(
                    kernel.function,
                    sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared_bytes as i32,
                )
            }
            .map_err(|e| {
                AttentionError::Module(format!(
                    "raising the shared-memory limit of {name} to {shared_bytes} bytes: {e}"
                ))
            })?;
            kernel.dynamic_shared_limit = shared_bytes;
        }
        Ok(kernel.function)
    }

    /// Launches `name` with its by-value parameter struct `P` on the GPU's stream. Raises the
    /// kernel's dynamic shared-memory limit when it asks for more than 48 KiB (never lowering
    /// it), and checks the launch itself; completion errors surface at `synchronize`. Callers
    /// have validated every buffer the parameters point to against the shape they carry.
    pub(crate) fn launch<P: KernelParams>(
        &self,
        name: &str,
        cfg: LaunchConfig,
        params: &P,
    ) -> Result<()> {
        self.launch_on(self.stream(), name, cfg, params)
    }

    /// As [`Gpu::launch`] on `stream`, a stream of this `Gpu`'s context (the entry points check).
    pub(crate) fn launch_on<P: KernelParams>(
        &self,
        stream: &CudaStream,
        name: &str,
        cfg: LaunchConfig,
        params: &P,
    ) -> Result<()> {
        if cfg.shared_bytes > self.shared_optin {
            return Err(invalid!(
                "kernel {name} needs {} bytes of shared memory, the device allows {}",
                cfg.shared_bytes,
                self.shared_optin
            ));
        }
        self.make_current()?;
        let function = self.kernel(name, cfg.shared_bytes)?;
        let mut args = [params as *const P as *mut std::ffi::c_void];
        // SAFETY: `P` is one of the kernels' `#[repr(C)]` parameter structs (`KernelParams`),
        // passed by value as the kernel's single parameter; the function's module is loaded and
        // the stream is of this `Gpu`'s context, the current one.
        unsafe {
            result::launch_kernel(
                function,
                cfg.grid,
                cfg.block,
                cfg.shared_bytes,
                stream.cu_stream(),
                &mut args,
            )
        }
        .map_err(|source| AttentionError::Launch {
            kernel: name.to_owned(),
            source,
        })
    }

    /// Whether `stream` belongs to this `Gpu`'s context (where its module and memory live).
    pub fn owns_stream(&self, stream: &CudaStream) -> bool {
        stream.context().cu_ctx() == self.context.cu_ctx()
    }

    /// Waits for all launched work; reports any asynchronous kernel failure.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .0
            .synchronize()
            .map_err(|source| AttentionError::Launch {
                kernel: "(completion of queued work)".to_owned(),
                source,
            })
    }
}

impl Module {
    fn load(context: &Arc<CudaContext>, ptx: &str) -> Result<Module> {
        let module_error =
            |e: String| AttentionError::Module(format!("loading PTX ({} bytes): {e}", ptx.len()));
        let text = CString::new(ptx).map_err(|e| module_error(e.to_string()))?;
        make_current(context)?;
        // SAFETY: a NUL-terminated PTX image, read during the call only.
        let raw = unsafe { result::module::load_data(text.as_ptr().cast()) }
            .map_err(|e| module_error(e.to_string()))?;
        Ok(Module {
            raw,
            context: context.clone(),
        })
    }

    fn function(&self, name: &str) -> Result<sys::CUfunction> {
        let missing =
            |e: String| AttentionError::Module(format!("kernel {name} not in the module: {e}"));
        let c_name = CString::new(name).map_err(|e| missing(e.to_string()))?;
        make_current(&self.context)?;
        // SAFETY: a loaded module and a NUL-terminated name.
        unsafe { result::module::get_function(self.raw, c_name) }
            .map_err(|e| missing(e.to_string()))
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if make_current(&self.context).is_ok() {
            // SAFETY: loaded once by `Module::load`, unloaded once here; nothing of it is used
            // after (the `Gpu`'s kernel cache is dropped first).
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

impl OwnedStream {
    /// A blocking stream (`CU_STREAM_DEFAULT`), unlike cudarc's own new streams: it orders after
    /// the legacy default stream, where uploads, downloads and allocations run, so a launch never
    /// reads an input before its copy has landed.
    fn new(context: &Arc<CudaContext>) -> Result<OwnedStream> {
        make_current(context)?;
        let raw = result::stream::create(result::stream::StreamKind::Default)
            .cuda("creating a stream")?;
        // SAFETY: a stream of this context, destroyed only by this wrapper's drop.
        Ok(OwnedStream(unsafe { context.wrap_borrowed_stream(raw) }))
    }
}

impl Drop for OwnedStream {
    fn drop(&mut self) {
        if make_current(self.0.context()).is_ok() {
            // SAFETY: created by `OwnedStream::new` and destroyed once; the `Gpu` hands out only
            // borrows of the wrapper, which end before this drop.
            let _ = unsafe { result::stream::destroy(self.0.cu_stream()) };
        }
    }
}

/// An integer attribute of the context's device.
fn attribute(context: &CudaContext, which: CUdevice_attribute, what: &'static str) -> Result<u32> {
    let v = context.attribute(which).cuda(what)?;
    Ok(v.max(0) as u32)
}
