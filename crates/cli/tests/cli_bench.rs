//! `flash-attn bench`'s options, checked before any device is looked for (so on any machine).

use std::process::Command;

fn bench(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flash-attn"))
        .arg("bench")
        .args(args)
        .output()
        .expect("run flash-attn")
}

#[test]
fn bad_options_are_refused_before_a_device_is_looked_for() {
    for (args, why) in [
        (&["--dropout", "1.5"][..], "dropout"),
        (&["--softcap", "-2"][..], "softcap"),
        (&["--dropout", "-0.1"][..], "dropout"),
        (
            &["--shapes", "headdims", "--head-dim", "100"][..],
            "no Headdims case",
        ),
        (
            &["--kernel", "materialized", "--alibi"][..],
            "materialized baseline",
        ),
    ] {
        let out = bench(args);
        assert!(!out.status.success(), "{args:?} ran");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(why), "{args:?}: {err}");
        assert!(!err.contains("no CUDA device answered"), "{args:?}: {err}");
    }
}

#[test]
fn good_options_reach_the_device_lookup() {
    let dir = std::env::temp_dir().join(format!("cli-bench-{}", std::process::id()));
    let out = bench(&[
        "--key-lengths",
        "--dropout",
        "0.1",
        "--softcap",
        "30",
        "--alibi",
        "--sinks",
        "--pass",
        "forward",
        "--causal",
        "true",
        "--samples",
        "20",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    // Without a device the run stops at the lookup, past the options' validation; with one it
    // times the fixture on the general and modifier instances.
    assert!(
        out.status.success() || err.contains("no CUDA device answered"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}
