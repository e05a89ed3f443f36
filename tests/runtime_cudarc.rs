//! The runtime sits on cudarc and device 0's primary context: a program's own cudarc context on
//! device 0 is the library's, work of both orders on the library's stream, and dropping the
//! program's handle leaves the library's buffers and `Gpu` working (each retains the context).
//! Skips visibly where no CUDA device answers.

use flash_attn::cudarc::driver::CudaContext;
use flash_attn::cudarc::driver::sys::CUevent_flags;
use flash_attn::{DType, DeviceTensor};
use flash_attn_testkit::inputs::uniform;
use flash_attn_testkit::testing::{fresh_seed, gpu_or_skip};

#[test]
fn the_programs_cudarc_context_is_the_librarys() {
    let Some(gpu) = gpu_or_skip("the_programs_cudarc_context_is_the_librarys") else {
        return;
    };
    let values = uniform(fresh_seed("cudarc interop"), 4096);
    let tensor = DeviceTensor::from_f32(DType::F32, &values).unwrap();
    {
        let own = CudaContext::new(0).unwrap();
        assert!(own.is_primary() && gpu.context().is_primary());
        assert_eq!(own.cu_ctx(), gpu.context().cu_ctx());
        // An event of the program's handle records on the library's stream.
        let event = own
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
            .unwrap();
        let stream = gpu.stream();
        assert_eq!(stream.context().cu_ctx(), own.cu_ctx());
        // SAFETY: the library's stream belongs to this (the same) context and outlives the wrapper.
        let wrapped = unsafe { own.wrap_borrowed_stream(stream.cu_stream()) };
        event.record(&wrapped).unwrap();
        event.synchronize().unwrap();
    }
    // The program's handle is gone; the library's retain keeps the context alive.
    assert_eq!(tensor.to_f32().unwrap(), values);
    let samples = flash_attn::timing::time_calls(&gpu, 1, 3, || {
        DeviceTensor::poisoned(DType::Bf16, 1 << 16).map(drop)
    })
    .unwrap();
    assert!(samples.len() == 3 && samples.iter().all(|t| t.is_finite() && *t >= 0.0));
}
