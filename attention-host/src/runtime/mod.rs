//! The CUDA runtime the kernels run on: device 0's primary context, one module loaded from PTX
//! text, one stream, and the module's kernel functions looked up once each.
//!
//! Threads: a [`Gpu`] is `Send + Sync`. Every method that calls the driver first makes the
//! context current on the calling thread, so one `Gpu` may be shared by threads or moved to
//! another. The context is device 0's primary context (the one cust, cudarc and candle share),
//! retained by the `Gpu` and by every buffer of this library ([`buffer`]), so it lives as
//! long as the last of them: a buffer may outlive the `Gpu` it was used with.

pub mod buffer;
pub mod memory;
pub mod timing;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use cust::CudaFlags;
use cust::context::{Context, CurrentContext};
use cust::device::{Device, DeviceAttribute};
use cust::error::CudaError;
use cust::function::{BlockSize, Function, GridSize};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags};

use crate::error::{AttentionError, CudaContext, Result, driver, invalid};

/// Device 0's primary context while anything of this library holds it (empty otherwise, so the
/// driver may destroy the context once the last holder is gone), and the memory pool made with it.
static PRIMARY: Mutex<(Weak<Context>, usize)> = Mutex::new((Weak::new(), 0));

/// Device 0's primary context, retained (shared with every other holder in this process) and
/// made current on the calling thread. A machine without a driver or a device gives `NoDevice`.
pub(crate) fn primary_context() -> Result<Arc<Context>> {
    Ok(primary()?.0)
}

/// The library's stream-ordered memory pool on device 0 (made with the primary context), which
/// keeps freed memory for reuse instead of returning it to the driver at each synchronisation.
pub(crate) fn memory_pool() -> Result<cust::sys::CUmemoryPool> {
    Ok(primary()?.1 as cust::sys::CUmemoryPool)
}

fn primary() -> Result<(Arc<Context>, usize)> {
    let mut slot = PRIMARY.lock().unwrap_or_else(PoisonError::into_inner);
    let (context, pool) = match slot.0.upgrade() {
        Some(context) => (context, slot.1),
        None => {
            cust::init(CudaFlags::empty()).map_err(starting)?;
            let device = Device::get_device(0).map_err(starting)?;
            // Retains the primary context (and makes it current on this thread).
            let context = Arc::new(Context::new(device).map_err(starting)?);
            let pool = create_pool(device.as_raw())?;
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
fn create_pool(device: cust::sys::CUdevice) -> Result<cust::sys::CUmemoryPool> {
    use cust::sys::*;
    let props = CUmemPoolProps {
        allocType: CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED,
        handleTypes: CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_NONE,
        location: CUmemLocation {
            type_: CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32SecurityAttributes: std::ptr::null_mut(),
        reserved: [0; 64],
    };
    let mut pool: CUmemoryPool = std::ptr::null_mut();
    // SAFETY: an out-pointer and properties of a device allocation pool on a valid device.
    driver(
        unsafe { cuMemPoolCreate(&mut pool, &props) },
        "creating a memory pool",
    )?;
    let mut threshold = u64::MAX;
    // SAFETY: the release threshold attribute takes a u64.
    let status = unsafe {
        cuMemPoolSetAttribute(
            pool,
            CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    };
    driver(status, "setting the memory pool's release threshold")?;
    Ok(pool)
}

/// Makes `context` the calling thread's current context (the driver keeps one per thread).
pub(crate) fn make_current(context: &Context) -> Result<()> {
    CurrentContext::set_current(context).cuda("making the context current on this thread")
}

/// A driver error while starting: the ones that mean "no usable GPU here" become `NoDevice`.
fn starting(e: CudaError) -> AttentionError {
    match e {
        CudaError::NoDevice | CudaError::NotInitialized | CudaError::InvalidDevice => {
            AttentionError::NoDevice(e.to_string())
        }
        CudaError::UnknownError | CudaError::OperatingSystemError => {
            AttentionError::NoDevice(format!("{e} (driver present but no usable GPU)"))
        }
        other => AttentionError::Cuda {
            what: "initialising the driver",
            source: other,
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
    attention_kernels::abi::params::TensorCoreBackwardParams,
    attention_kernels::abi::params::MergeParams,
    attention_kernels::abi::params::DecodeParams,
    attention_kernels::abi::params::CacheAppendParams,
);

/// Dynamic shared memory every kernel may use without raising its limit.
const DEFAULT_DYNAMIC_SHARED: u32 = 48 * 1024;

/// A kernel function of the module, looked up once.
struct Kernel {
    /// `'static` stands for "as long as the `Gpu`'s module": the cache is private to the `Gpu`,
    /// and each launch uses a handle only while it borrows that `Gpu`.
    function: Arc<Function<'static>>,
    /// The function's `MAX_DYNAMIC_SHARED_SIZE_BYTES` as this `Gpu` set it: only ever raised,
    /// always under the cache's lock, so a launch that fits it can never be failed by another
    /// thread's launch of the same kernel with a different size.
    dynamic_shared_limit: u32,
}

/// Device 0's primary context with the attention module loaded.
pub struct Gpu {
    // Field order is drop order: the stream and module go before the context that owns them
    // (`Drop` makes it current first, so they are released from any thread).
    stream: Stream,
    kernels: Mutex<HashMap<String, Kernel>>,
    module: Module,
    device: Device,
    compute_capability: (u32, u32),
    wgmma: bool,
    shared_optin: u32,
    context: Arc<Context>,
}

// A `Gpu` is shared between threads and moved to others (tests `runtime_threads` show it works).
const _: () = {
    const fn send_sync<T: Send + Sync>() {}
    send_sync::<Gpu>();
};

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
        let context = primary_context()?;
        let device = Device::get_device(0).cuda("getting device 0")?;
        let capability = |what| {
            device
                .get_attribute(what)
                .cuda("reading the compute capability")
                .map(|v| v as u32)
        };
        let compute_capability = (
            capability(DeviceAttribute::ComputeCapabilityMajor)?,
            capability(DeviceAttribute::ComputeCapabilityMinor)?,
        );
        let is_hopper = compute_capability == (9, 0);
        let (ptx, wgmma) = match hopper {
            Some(h) if is_hopper => (h, true),
            _ => (ptx, false),
        };
        let shared_optin = shared_optin(device)?;
        let module = Module::from_ptx(ptx, &[]).map_err(|e| {
            AttentionError::Module(format!("loading PTX ({} bytes): {e}", ptx.len()))
        })?;
        // A blocking stream: it orders after the legacy default stream, where cust's uploads and
        // downloads run, so a launch never reads an input before its copy has landed.
        let stream = Stream::new(StreamFlags::DEFAULT, None).cuda("creating a stream")?;
        Ok(Gpu {
            stream,
            kernels: Mutex::new(HashMap::new()),
            module,
            device,
            compute_capability,
            wgmma,
            shared_optin,
            context,
        })
    }

    /// Makes this GPU's context current on the calling thread. The library's own calls do this
    /// themselves; it is for code that calls cust or the driver directly beside them.
    pub fn make_current(&self) -> Result<()> {
        make_current(&self.context)
    }

    /// Whether the loaded module has the `wgmma` kernels (an `sm_90a` module on a 9.0 device).
    pub fn has_wgmma(&self) -> bool {
        self.wgmma
    }

    /// `(major, minor)` compute capability of the device.
    pub fn compute_capability(&self) -> (u32, u32) {
        self.compute_capability
    }

    /// The stream every launch goes to. Driver calls on it from another thread need
    /// [`Gpu::make_current`] there first.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    pub fn device_name(&self) -> String {
        self.device
            .name()
            .unwrap_or_else(|e| format!("unknown ({e})"))
    }

    /// The CUDA version the driver supports, e.g. "13.0".
    pub fn cuda_version(&self) -> Result<String> {
        let v = cust::CudaApiVersion::get().cuda("reading the driver's CUDA version")?;
        Ok(format!("{}.{}", v.major(), v.minor()))
    }

    /// Shared memory a block may opt in to, in bytes (227 KiB on the H100/H200).
    pub fn max_shared_per_block(&self) -> Result<u32> {
        Ok(self.shared_optin)
    }

    pub fn multiprocessors(&self) -> Result<u32> {
        let v = self
            .device
            .get_attribute(DeviceAttribute::MultiprocessorCount)
            .cuda("reading the multiprocessor count")?;
        Ok(v as u32)
    }

    /// `(free, total)` device memory in bytes.
    pub fn memory_info(&self) -> Result<(usize, usize)> {
        self.make_current()?;
        cust::memory::mem_get_info().cuda("reading device memory")
    }

    /// Looks `name` up in the module (a fresh handle each call; launches use the cache).
    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        self.make_current()?;
        self.module
            .get_function(name)
            .map_err(|e| AttentionError::Module(format!("kernel {name} not in the module: {e}")))
    }

    /// The cached function `name` with its dynamic shared-memory limit at least `shared_bytes`.
    /// Lookup and any raise of the limit happen under the cache's lock; the limit never drops.
    fn kernel(&self, name: &str, shared_bytes: u32) -> Result<Arc<Function<'static>>> {
        let mut kernels = self.kernels.lock().unwrap_or_else(PoisonError::into_inner);
        if !kernels.contains_key(name) {
            let function = self.function(name)?;
            // SAFETY: only the lifetime changes. The handle stays in this `Gpu`'s cache, which
            // goes with the module, and `launch` uses its clone only while borrowing the `Gpu`.
            let function =
                unsafe { std::mem::transmute::<Function<'_>, Function<'static>>(function) };
            let kernel = Kernel {
                function: Arc::new(function),
                dynamic_shared_limit: DEFAULT_DYNAMIC_SHARED,
            };
            kernels.insert(name.to_owned(), kernel);
        }
        let kernel = kernels.get_mut(name).expect("inserted above");
        if shared_bytes > kernel.dynamic_shared_limit {
            // SAFETY: a valid function handle (its module is loaded) and a documented attribute.
            let status = unsafe {
                cust::sys::cuFuncSetAttribute(
                    kernel.function.to_raw(),
                    cust::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    shared_bytes as i32,
                )
            };
            if status != cust::sys::cudaError_enum::CUDA_SUCCESS {
                return Err(AttentionError::Module(format!(
                    "raising the shared-memory limit of {name} to {shared_bytes} bytes: {status:?}"
                )));
            }
            kernel.dynamic_shared_limit = shared_bytes;
        }
        Ok(kernel.function.clone())
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
        if cfg.shared_bytes > self.shared_optin {
            return Err(invalid!(
                "kernel {name} needs {} bytes of shared memory, the device allows {}",
                cfg.shared_bytes,
                self.shared_optin
            ));
        }
        self.make_current()?;
        let function = self.kernel(name, cfg.shared_bytes)?;
        let args = [params as *const P as *mut std::ffi::c_void];
        let (g, b) = (cfg.grid, cfg.block);
        // SAFETY: `P` is one of the kernels' `#[repr(C)]` parameter structs (`KernelParams`),
        // passed by value as the kernel's single parameter; the function's module is loaded.
        unsafe {
            self.stream.launch(
                &function,
                GridSize::xyz(g.0, g.1, g.2),
                BlockSize::xyz(b.0, b.1, b.2),
                cfg.shared_bytes,
                &args,
            )
        }
        .map_err(|source| AttentionError::Launch {
            kernel: name.to_owned(),
            source,
        })
    }

    /// Waits for all launched work; reports any asynchronous kernel failure.
    pub fn synchronize(&self) -> Result<()> {
        self.make_current()?;
        self.stream
            .synchronize()
            .map_err(|source| AttentionError::Launch {
                kernel: "(completion of queued work)".to_owned(),
                source,
            })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // The stream and module are released by the fields' drops, on this thread's context.
        let _ = self.make_current();
    }
}

/// Shared memory a block may opt in to on `device` (cust has no variant for it).
fn shared_optin(device: Device) -> Result<u32> {
    let mut v = 0i32;
    // SAFETY: a valid device handle and an out-pointer to an i32.
    let status = unsafe {
        cust::sys::cuDeviceGetAttribute(
            &mut v,
            cust::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
            device.as_raw(),
        )
    };
    if status != cust::sys::cudaError_enum::CUDA_SUCCESS {
        return Err(AttentionError::Module(format!(
            "reading the shared-memory limit: {status:?}"
        )));
    }
    Ok(v.max(0) as u32)
}
