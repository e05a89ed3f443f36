//! The CUDA runtime the kernels run on: one context, one module loaded from PTX text, one stream.

use std::ffi::c_void;

use cust::context::Context;
use cust::device::{Device, DeviceAttribute};
use cust::error::CudaError;
use cust::function::{BlockSize, Function, GridSize};
use cust::module::Module;
use cust::stream::{Stream, StreamFlags};

use crate::error::{AttentionError, CudaContext, Result};

/// A CUDA context on device 0 with the attention module loaded.
pub struct Gpu {
    // Field order is drop order: the stream and module go before the context that owns them.
    stream: Stream,
    module: Module,
    device: Device,
    wgmma: bool,
    _context: Context,
}

/// What a launch needs besides its parameters.
#[derive(Clone, Copy, Debug)]
pub struct LaunchConfig {
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub shared_bytes: u32,
}

impl Gpu {
    /// Creates a context on device 0 and loads `ptx`. A machine without a driver or without a
    /// device gives `AttentionError::NoDevice`; a module that does not load gives `Module`.
    pub fn new(ptx: &str) -> Result<Gpu> {
        Gpu::with_hopper_module(ptx, None)
    }

    /// As [`Gpu::new`], but on a compute capability 9.0 device loads `hopper` instead when given:
    /// the `sm_90a` module, which holds every kernel of `ptx` plus the `wgmma` ones
    /// ([`Gpu::has_wgmma`]). `sm_90a` code runs on no other architecture.
    pub fn with_hopper_module(ptx: &str, hopper: Option<&str>) -> Result<Gpu> {
        let context = cust::quick_init().map_err(|e| match e {
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
        })?;
        let device = Device::get_device(0).cuda("getting device 0")?;
        let capability = |what| {
            device
                .get_attribute(what)
                .cuda("reading the compute capability")
        };
        let is_hopper = capability(DeviceAttribute::ComputeCapabilityMajor)? == 9
            && capability(DeviceAttribute::ComputeCapabilityMinor)? == 0;
        let (ptx, wgmma) = match hopper {
            Some(h) if is_hopper => (h, true),
            _ => (ptx, false),
        };
        let module = Module::from_ptx(ptx, &[]).map_err(|e| {
            AttentionError::Module(format!("loading PTX ({} bytes): {e}", ptx.len()))
        })?;
        // A blocking stream: it orders after the legacy default stream, where cust's uploads and
        // downloads run, so a launch never reads an input before its copy has landed.
        let stream = Stream::new(StreamFlags::DEFAULT, None).cuda("creating a stream")?;
        Ok(Gpu {
            stream,
            module,
            device,
            wgmma,
            _context: context,
        })
    }

    /// Whether the loaded module has the `wgmma` kernels (an `sm_90a` module on a 9.0 device).
    pub fn has_wgmma(&self) -> bool {
        self.wgmma
    }

    /// `(major, minor)` compute capability of the device.
    pub fn compute_capability(&self) -> Result<(u32, u32)> {
        let get = |what| {
            self.device
                .get_attribute(what)
                .cuda("reading the compute capability")
                .map(|v| v as u32)
        };
        Ok((
            get(DeviceAttribute::ComputeCapabilityMajor)?,
            get(DeviceAttribute::ComputeCapabilityMinor)?,
        ))
    }

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
        // cust has no variant for the opt-in limit; ask the driver directly.
        let mut v = 0i32;
        // SAFETY: a valid device handle and an out-pointer to an i32.
        let status = unsafe {
            cust::sys::cuDeviceGetAttribute(
                &mut v,
                cust::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN,
                self.device.as_raw(),
            )
        };
        if status != cust::sys::cudaError_enum::CUDA_SUCCESS {
            return Err(AttentionError::Module(format!(
                "reading the shared-memory limit: {status:?}"
            )));
        }
        Ok(v as u32)
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
        cust::memory::mem_get_info().cuda("reading device memory")
    }

    pub fn function(&self, name: &str) -> Result<Function<'_>> {
        self.module
            .get_function(name)
            .map_err(|e| AttentionError::Module(format!("kernel {name} not in the module: {e}")))
    }

    /// Launches `name` with one by-value parameter struct `P` (the kernels' `#[repr(C)]` params).
    /// Raises the kernel's dynamic shared-memory limit when it asks for more than 48 KiB, and
    /// checks the launch itself; completion errors surface at `synchronize`.
    pub fn launch<P: Copy>(&self, name: &str, cfg: LaunchConfig, params: &P) -> Result<()> {
        let function = self.function(name)?;
        let launch_err = |source| AttentionError::Launch {
            kernel: name.to_owned(),
            source,
        };
        if cfg.shared_bytes > 48 * 1024 {
            let limit = self.max_shared_per_block()?;
            if cfg.shared_bytes > limit {
                return Err(crate::error::invalid!(
                    "kernel {name} needs {} bytes of shared memory, the device allows {limit}",
                    cfg.shared_bytes
                ));
            }
            // SAFETY: a valid function handle and a documented attribute.
            let status = unsafe {
                cust::sys::cuFuncSetAttribute(
                    function.to_raw(),
                    cust::sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                    cfg.shared_bytes as i32,
                )
            };
            if status != cust::sys::cudaError_enum::CUDA_SUCCESS {
                return Err(AttentionError::Module(format!(
                    "raising the shared-memory limit of {name} to {} bytes: {status:?}",
                    cfg.shared_bytes
                )));
            }
        }
        let args = [params as *const P as *mut c_void];
        let (g, b) = (cfg.grid, cfg.block);
        // SAFETY: `P` is the kernel's by-value parameter struct; callers validated every buffer the
        // parameters point to against the shape they carry.
        unsafe {
            self.stream
                .launch(
                    &function,
                    GridSize::xyz(g.0, g.1, g.2),
                    BlockSize::xyz(b.0, b.1, b.2),
                    cfg.shared_bytes,
                    &args,
                )
                .map_err(launch_err)
        }
    }

    /// Waits for all launched work; reports any asynchronous kernel failure.
    pub fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|source| AttentionError::Launch {
                kernel: "(completion of queued work)".to_owned(),
                source,
            })
    }
}
