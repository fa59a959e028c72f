//! `scripts/device_check.sh OUT --cpu-only --quick`: the GPU machine's one
//! command, rehearsed on the CPU (CI runs this): every part written, the
//! table built, the PyTorch side skipped with a reason when torch is absent.

mod common;

use std::process::Command;

#[test]
fn device_check_cpu_only_quick_writes_the_json_and_the_table() {
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("check");
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/device_check.sh"
        ))
        .arg(&out_dir)
        .args([
            "--binary",
            env!("CARGO_BIN_EXE_ncclean"),
            "--cpu-only",
            "--quick",
        ])
        .args(["--assets", common::p(&tmp.path().join("no-assets"))])
        .output()
        .expect("bash runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "device_check.sh failed: {stderr}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out_dir.join("device_check.json")).unwrap())
            .unwrap();
    assert_eq!(r["ncclean"]["parity_pass"], true, "{r:#}");
    assert_eq!(r["ncclean"]["quick"], true);
    assert!(r["libraries"]["libraries"]["loaded"].is_boolean(), "{r:#}");
    assert!(r["system"]["binary_mib"].as_f64().unwrap() > 0.0);
    let torch = &r["torch"];
    if let Some(why) = torch["skipped"].as_str() {
        assert!(why.contains("torch is not importable"), "{why}");
        assert!(stderr.contains("PyTorch comparison skipped"), "{stderr}");
    } else {
        assert!(
            torch["clip_vit_b32_img_per_s"]["f32"].as_f64().unwrap() > 0.0,
            "{torch}"
        );
        assert!(r["ratios"]["clip_vit_b32_img_per_s.f32"].as_f64().unwrap() > 0.0);
    }

    let md = std::fs::read_to_string(out_dir.join("device_check.md")).unwrap();
    assert!(
        md.contains("| measure | ncclean | PyTorch | ncclean / PyTorch |"),
        "{md}"
    );
    assert!(
        md.contains("| CLIP-B/32 image tower img/s, f16, batch 4 |"),
        "{md}"
    );
    assert!(
        md.contains("| vanilla s/epoch, 600 pairs, dim 32 |"),
        "{md}"
    );
    assert!(md.contains("| decode JPEG img/s"), "{md}");
    assert!(
        md.contains("parity clip_vit_b32 image f16 vs CPU f32"),
        "{md}"
    );
    assert!(md.starts_with("device: cpu (--device cpu)"), "{md}");
}

#[test]
fn device_check_without_a_cuda_device_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/device_check.sh"
        ))
        .arg(tmp.path().join("check"))
        .args(["--binary", env!("CARGO_BIN_EXE_ncclean"), "--quick"])
        .env("NCCLEAN_CUDA_LIBS", "/nonexistent")
        .output()
        .expect("bash runs");
    if cfg!(feature = "cuda") && out.status.success() {
        eprintln!("skipped: this CUDA build found a device");
        return;
    }
    assert_eq!(
        out.status.code(),
        Some(2),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("ncclean gpu-check failed (exit 2)"),
        "{stderr}"
    );
}
