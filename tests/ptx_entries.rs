//! Every tensor-core configuration the host may launch has its kernel in the embedded PTX.

use attention_kernels::flash_tc::{self, VARIANTS};
use attention_kernels::flash_wgmma;
use flash_attn::DType;
use flash_attn::tensor_core::{kernel_name, wgmma_kernel_name};

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

/// The default build (sm_90) also compiles the sm_90a module: every kernel of the base module plus
/// the `wgmma` ones, which the base module must not contain (no other architecture accepts them).
#[test]
fn sm90a_module_adds_the_wgmma_kernels() {
    if flash_attn::PTX_ARCH != "sm_90" {
        assert!(flash_attn::PTX_SM90A.is_none());
        return;
    }
    let hopper = flash_attn::PTX_SM90A.expect("an sm_90 build embeds the sm_90a module");
    assert!(hopper.contains(".target sm_90a"));
    assert!(!flash_attn::PTX.contains("wgmma"));
    for cfg in flash_wgmma::VARIANTS {
        for dtype in [DType::F16, DType::Bf16] {
            let general = Some(cfg) == flash_wgmma::config(cfg.head_dim);
            let names = [
                Some(wgmma_kernel_name(dtype, &cfg, false)),
                general.then(|| wgmma_kernel_name(dtype, &cfg, true)),
            ];
            for name in names.into_iter().flatten() {
                assert!(
                    hopper.contains(&format!(".entry {name}(")),
                    "{name} missing"
                );
            }
        }
    }
    for cfg in VARIANTS {
        let name = kernel_name(DType::Bf16, &cfg);
        assert!(
            hopper.contains(&format!(".entry {name}(")),
            "{name} missing"
        );
    }
    for d in [64, 128] {
        assert!(flash_wgmma::VARIANTS.contains(&flash_wgmma::config(d).unwrap()));
    }
}
