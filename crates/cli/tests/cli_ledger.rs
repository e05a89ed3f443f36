//! The `flash-attn ledger` binary end to end.

use std::process::Command;

fn ledger(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_flash-attn"))
        .arg("ledger")
        .args(args)
        .output()
        .expect("run flash-attn")
}

#[test]
fn json_reports_the_article_ledgers() {
    let out = ledger(&["-n", "4096", "-d", "64", "-m", "65536", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["forward"]["total"], 13_639_680);
    assert_eq!(report["backward"]["total"], 22_937_600);
}

#[test]
fn text_reports_tails_and_bad_arguments_fail() {
    let out = ledger(&[
        "--n-q",
        "7",
        "--n-k",
        "10",
        "-d",
        "4",
        "--block-rows",
        "3",
        "--block-cols",
        "4",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains("T_r = 3, T_c = 3") && text.contains("458"),
        "{text}"
    );
    let out = ledger(&["-n", "16", "-d", "4"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--sram-words"));
}
