//! `--device` parsing: one place decides what a device string means.

use candle_core::Device;

use crate::error::{Error, Result};

/// Open the device named by `spec`: `cpu`, `cuda` or `cuda:N`.
pub fn open(spec: &str) -> Result<Device> {
    let spec = spec.trim().to_ascii_lowercase();
    if spec == "cpu" {
        return Ok(Device::Cpu);
    }
    let ordinal = match spec.strip_prefix("cuda") {
        Some("") => 0,
        Some(rest) => rest
            .strip_prefix(':')
            .and_then(|n| n.parse::<usize>().ok())
            .ok_or_else(|| {
                Error::Usage(format!(
                    "invalid --device {spec:?}: expected cpu, cuda or cuda:N"
                ))
            })?,
        None => {
            return Err(Error::Usage(format!(
                "invalid --device {spec:?}: expected cpu, cuda or cuda:N"
            )))
        }
    };
    open_cuda(ordinal)
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> Result<Device> {
    Device::new_cuda(ordinal)
        .map_err(|e| Error::Usage(format!("cannot open CUDA device {ordinal}: {e}")))
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> Result<Device> {
    Err(Error::Usage(
        "this ncclean was built without CUDA support; use --device cpu, or rebuild with \
         `cargo build --release --features cuda` (needs nvcc and CUDA_COMPUTE_CAP)"
            .to_string(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_opens_and_bad_specs_are_usage_errors() {
        assert!(matches!(open("cpu"), Ok(Device::Cpu)));
        assert!(matches!(open(" CPU "), Ok(Device::Cpu)));
        let e = open("tpu").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let e = open("cuda:x").unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_says_how_to_get_it() {
        let e = open("cuda:0").unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("--features cuda"), "{e}");
    }
}
