//! `ncclean cuda-libs`: the CUDA library search run by the real binary
//! (any build runs it): `$NCCLEAN_CUDA_LIBS`, the Python environment on
//! PATH, and what is said when nothing is found. With
//! `NCCLEAN_TEST_CUDA_VENV` naming a virtual environment holding the
//! nvidia-cublas, nvidia-curand and nvidia-cuda-nvrtc wheels, the real
//! libraries are found there and loaded.

mod common;

use std::path::Path;
use std::process::{Command, Output};

const CU13: &[&str] = &[
    "libcublas.so.13",
    "libcublasLt.so.13",
    "libcurand.so.10",
    "libnvrtc.so.13",
];

/// `ncclean cuda-libs --json` with exactly these environment variables.
fn cuda_libs(env: &[(&str, &std::ffi::OsStr)]) -> (Output, serde_json::Value) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ncclean"));
    cmd.args(["cuda-libs", "--json"])
        .env_remove("NCCLEAN_CUDA_LIBS");
    cmd.env("PATH", "/nonexistent");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("ncclean starts");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_slice(&out.stdout).expect("one JSON object");
    (out, v)
}

fn touch(dir: &Path, names: &[&str]) {
    std::fs::create_dir_all(dir).unwrap();
    for n in names {
        std::fs::write(dir.join(n), b"not a library").unwrap();
    }
}

#[test]
fn the_environment_variable_folder_is_found_and_loaded_by_path() {
    let t = tempfile::tempdir().unwrap();
    let libs = t.path().join("libs");
    touch(&libs, CU13);
    let (_, v) = cuda_libs(&[("NCCLEAN_CUDA_LIBS", libs.as_os_str())]);
    let err = v["libraries"]["error"].as_str().unwrap();
    // Found there (the dynamic loader then refuses the fake file by path).
    assert!(
        err.starts_with(&format!(
            "{} was found but did not load (",
            libs.join("libcublasLt.so.13").display()
        )),
        "{v}"
    );
    assert_eq!(v["libraries"]["loaded"], false);
}

#[test]
fn the_python_environment_on_path_is_searched() {
    let t = tempfile::tempdir().unwrap();
    let venv = t.path().join("venv");
    touch(&venv.join("bin"), &["python3"]);
    let lib = venv.join("lib/python3.12/site-packages/nvidia/cu13/lib");
    touch(&lib, CU13);
    let (_, v) = cuda_libs(&[("PATH", venv.join("bin").as_os_str())]);
    let err = v["libraries"]["error"].as_str().unwrap();
    assert!(
        err.starts_with(&format!("{}", lib.join("libcublasLt.so.13").display())),
        "{v}"
    );
    assert_eq!(v["looked"][1], "$NCCLEAN_CUDA_LIBS: not set", "{v}");
}

#[test]
fn nothing_found_says_where_it_looked_and_what_to_do() {
    let out = Command::new(env!("CARGO_BIN_EXE_ncclean"))
        .arg("cuda-libs")
        .env_remove("NCCLEAN_CUDA_LIBS")
        .env("PATH", "/nonexistent")
        .env("LD_LIBRARY_PATH", "/nonexistent")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    if text.contains("libraries: loaded") {
        eprintln!("skipped: this machine has CUDA libraries on its system path");
        return;
    }
    assert!(out.status.success());
    assert!(text.contains("libraries: cuBLASLt, cuBLAS, cuRAND, NVRTC not found (looked in: cuda-libs/ beside the binary ("), "{text}");
    assert!(
        text.contains("Python's nvidia packages: no python3 on PATH"),
        "{text}"
    );
    assert!(text.contains("set $NCCLEAN_CUDA_LIBS"), "{text}");
}

#[test]
fn the_real_wheels_in_a_virtual_environment_load() {
    let Some(venv) = std::env::var_os("NCCLEAN_TEST_CUDA_VENV") else {
        eprintln!(
            "skipped: set NCCLEAN_TEST_CUDA_VENV to a venv with nvidia-cublas, nvidia-curand and \
             nvidia-cuda-nvrtc installed"
        );
        return;
    };
    let bin = Path::new(&venv).join("bin");
    let (_, v) = cuda_libs(&[("PATH", bin.as_os_str())]);
    assert_eq!(v["libraries"]["loaded"], true, "{v}");
    let from = v["libraries"]["from"].as_str().unwrap();
    assert!(
        from.starts_with(&format!(
            "the Python environment of {}",
            bin.join("python3").display()
        )),
        "{v}"
    );
    assert_eq!(v["libraries"]["files"].as_array().unwrap().len(), 5, "{v}");
}
