//! `scripts/gpu_check.sh BINARY --cpu-only --quick`: the GPU machine's
//! check, run on the CPU so its logic (parity, decode, throughput, training
//! timing, the JSON it writes) is exercised without a GPU.

mod common;

use std::process::Command;

#[test]
fn gpu_check_cpu_only_quick_writes_every_measurement() {
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("check.json");
    let out = Command::new("bash")
        .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/gpu_check.sh"))
        .args([
            env!("CARGO_BIN_EXE_ncclean"),
            "--cpu-only",
            "--quick",
            "--out",
        ])
        .arg(&json)
        .output()
        .expect("bash runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "gpu_check.sh failed: {stderr}");
    assert!(stderr.contains("device: cpu"), "{stderr}");
    let r: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(r["cuda"], false);
    assert_eq!(r["quick"], true);
    assert_eq!(r["parity_pass"], true, "{r:#}");

    // Parity: the CLIP-shaped tower always runs (random weights); the real
    // towers run when present and say so when not.
    let clip = &r["parity"]["clip_vit_b32"];
    for side in ["image", "patches", "text"] {
        for dtype in ["f32", "f16"] {
            let c = &clip[dtype][side];
            assert_eq!(c["pass"], true, "{dtype} {side}: {c}");
            assert!(c["min_cosine"].as_f64().unwrap() >= 0.999, "{c}");
        }
    }
    assert!(clip["bf16"]
        .as_str()
        .unwrap()
        .contains("no bf16 convolution"));
    for tower in ["mobilenet_v2", "minilm"] {
        let t = &r["parity"][tower];
        let status = t["status"].as_str().unwrap();
        assert!(
            status == "ok" || status == "skipped: not found",
            "{tower}: {t}"
        );
        if status == "ok" {
            let f32 = if tower == "minilm" {
                &t["f32"]
            } else {
                &t["f32"]["pooled"]
            };
            assert_eq!(f32["pass"], true, "{tower}: {t}");
        }
    }
    let mobilenet = &r["parity"]["mobilenet_v2"];
    if mobilenet["status"] == "ok" {
        for part in ["pooled", "grid"] {
            assert_eq!(mobilenet["f16"][part]["pass"], true, "{mobilenet}");
        }
    }

    // Decode, tower and training rates are positive numbers.
    let positive = |v: &serde_json::Value, what: &str| {
        assert!(v.as_f64().is_some_and(|x| x > 0.0), "{what}: {v}");
    };
    positive(&r["decode"]["jpeg_img_per_s"], "jpeg");
    positive(&r["decode"]["png_img_per_s"], "png");
    let t = &r["throughput"];
    for key in [
        "mobilenet_v2_img_per_s",
        "clip_vit_b32_img_per_s",
        "clip_vit_b32_captions_per_s",
    ] {
        for dtype in ["f32", "f16"] {
            positive(&t[key][dtype], &format!("{key} {dtype}"));
        }
    }
    for method in ["vanilla", "gsc"] {
        let m = &r["training"][method];
        positive(&m["seconds_per_epoch"], method);
        assert_eq!(m["epochs"].as_array().unwrap().len(), 2, "{m}");
        for e in m["epochs"].as_array().unwrap() {
            assert!(e["loss"].as_f64().unwrap().is_finite(), "{e}");
        }
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn gpu_check_without_cpu_only_needs_a_cuda_device() {
    use common::{ncclean, p};
    let tmp = tempfile::tempdir().unwrap();
    let json = tmp.path().join("x.json");
    let out = ncclean(&["gpu-check", "--json", p(&json)]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("built without CUDA"), "{err}");
    assert!(!json.exists());
}
