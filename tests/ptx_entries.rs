//! Every tensor-core configuration the host may launch has its kernel in the embedded PTX.

use attention_kernels::flash_tc::{self, VARIANTS};
use flash_attn::DType;
use flash_attn::tensor_core::kernel_name;

#[test]
fn every_variant_and_dtype_has_an_entry_point() {
    for cfg in VARIANTS {
        for dtype in [DType::F16, DType::Bf16] {
            let name = kernel_name(dtype, &cfg);
            assert!(
                flash_attn::PTX.contains(&format!(".entry {name}(")),
                "{name} missing from the PTX"
            );
        }
    }
    for d in [64, 128] {
        assert!(
            VARIANTS.contains(&flash_tc::config(d).unwrap()),
            "default for d={d} not compiled"
        );
    }
}
