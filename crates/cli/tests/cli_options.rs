//! Options whose values may be negative (sink logits, the scale) or that the library must refuse
//! with its own reason (a negative softcap or dropout) are read as values, not as flags:
//! `flash-attn plan --arch` needs no device, so this runs on any machine.

use std::process::Command;

fn plan(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flash-attn"))
        .args(["plan", "--arch", "sm_90", "--heads-q", "2", "--n-q", "256"])
        .args(args)
        .output()
        .expect("run flash-attn")
}

#[test]
fn negative_sinks_and_scale_are_values() {
    for args in [
        &["--sinks", "-1.5,0.25"][..],
        &["--sinks", "-2"][..],
        &["--scale", "-0.125", "--pass", "forward"][..],
    ] {
        let out = plan(args);
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert!(out.status.success(), "{args:?}: {stderr}");
        assert!(stdout.contains("sm90"), "{args:?}: {stdout}");
    }
}

#[test]
fn negative_softcap_and_dropout_get_the_library_reason() {
    for (args, why) in [
        (
            &["--softcap", "-1"][..],
            "softcap must be finite and positive, got -1",
        ),
        (
            &["--dropout", "-0.1"][..],
            "dropout probability must be in [0, 1), got -0.1",
        ),
        (&["--sinks", "-1,2,3"][..], "3 sinks for heads_q = 2"),
    ] {
        let out = plan(args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(stderr.contains(why), "{args:?}: {stderr}");
    }
}
