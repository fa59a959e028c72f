//! `--device` parsing and selection: one place decides which device runs.
//!
//! `auto` (the default) takes CUDA device 0 when this binary was built with
//! `--features cuda` and a device answers, otherwise the CPU; `cpu`, `cuda`
//! and `cuda:N` insist. Whatever is chosen is said once on stderr
//! (`device: cpu (this build has no CUDA)`, `device: cuda:0 (NVIDIA H100 …)`).
//!
//! A CUDA build loads the driver (`libcuda.so.1`) and cuBLAS, cuRAND and
//! NVRTC at run time (`scripts/build_cuda.sh` builds it that way), so the
//! same binary starts on a machine without a driver. Before any CUDA call
//! the driver is probed with `dlopen` and the libraries are found and
//! loaded by [`crate::runtime::cuda_libs`] (`cuda-libs/` beside the binary,
//! `$NCCLEAN_CUDA_LIBS`, the Python environment on PATH): cudarc panics
//! when one is missing, and a panic is not a message a user can act on.
//! Where they came from is part of the `device:` line.

use candle_core::Device;

use crate::error::{Error, Result};

/// What `--device` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceSpec {
    /// CUDA device 0 when built with CUDA and one answers, else the CPU.
    Auto,
    /// The CPU.
    Cpu,
    /// CUDA device N, or an error.
    Cuda(usize),
}

/// Parse a `--device` value: `auto`, `cpu`, `cuda` or `cuda:N`
/// (case and surrounding blanks ignored). Errors are usage errors (exit 2).
pub fn parse(spec: &str) -> Result<DeviceSpec> {
    let s = spec.trim().to_ascii_lowercase();
    let bad = || {
        Error::Usage(format!(
            "invalid --device {s:?}: expected auto, cpu, cuda or cuda:N"
        ))
    };
    match s.as_str() {
        "auto" => Ok(DeviceSpec::Auto),
        "cpu" => Ok(DeviceSpec::Cpu),
        _ => match s.strip_prefix("cuda") {
            Some("") => Ok(DeviceSpec::Cuda(0)),
            Some(rest) => rest
                .strip_prefix(':')
                .and_then(|n| n.parse::<usize>().ok())
                .map(DeviceSpec::Cuda)
                .ok_or_else(bad),
            None => Err(bad()),
        },
    }
}

/// The CUDA facts a device choice depends on. The real one asks the
/// machine ([`SystemProbe`]); tests inject answers, so every branch of
/// [`select`] is exercised without a GPU.
pub trait CudaProbe {
    /// Whether this binary was built with `--features cuda`.
    fn built(&self) -> bool;
    /// Where the CUDA libraries were loaded from, once the driver and they
    /// load; else what is missing.
    fn libraries(&self) -> std::result::Result<String, String>;
    /// Open CUDA device `ordinal`: the device and a name for the log line.
    fn open(&self, ordinal: usize) -> std::result::Result<(Device, String), String>;
}

/// The device chosen and the stderr line that says so.
#[derive(Debug)]
pub struct Selected {
    /// The device to run on.
    pub device: Device,
    /// `device: …`, for stderr.
    pub line: String,
}

/// How to rebuild with CUDA, for messages.
const REBUILD: &str = "rebuild with `bash scripts/build_cuda.sh` (see docs/gpu.md)";

/// Decide the device for `spec` from what `probe` reports.
///
/// `auto` never fails: without CUDA in the build, without a driver or
/// without a device that opens, it falls back to the CPU and says why.
/// An explicit `cuda`/`cuda:N` that cannot be honoured is a usage error
/// (exit 2) naming what is missing.
pub fn select(spec: DeviceSpec, probe: &dyn CudaProbe) -> Result<Selected> {
    let cpu = |why: String| Selected {
        device: Device::Cpu,
        line: format!("device: cpu ({why})"),
    };
    match spec {
        DeviceSpec::Cpu => Ok(cpu("--device cpu".into())),
        DeviceSpec::Auto => {
            if !probe.built() {
                return Ok(cpu("this build has no CUDA".into()));
            }
            let libs = match probe.libraries() {
                Ok(libs) => libs,
                Err(e) => return Ok(cpu(format!("CUDA build, but {e}"))),
            };
            match probe.open(0) {
                Ok((device, name)) => Ok(Selected {
                    device,
                    line: format!("device: cuda:0 ({name}; CUDA libraries from {libs})"),
                }),
                Err(e) => Ok(cpu(format!("CUDA build, but cuda:0 did not open: {e}"))),
            }
        }
        DeviceSpec::Cuda(n) => {
            if !probe.built() {
                return Err(Error::Usage(format!(
                    "this ncclean was built without CUDA support; use --device cpu (or auto), \
                     or {REBUILD}"
                )));
            }
            let libs = match probe.libraries() {
                Ok(libs) => libs,
                Err(e) => {
                    // The library search's message already says where to
                    // put the libraries; only the driver needs a fix here.
                    let fix = if e.starts_with(DRIVER.what) {
                        "install the NVIDIA driver, or "
                    } else {
                        "or "
                    };
                    return Err(Error::Usage(format!(
                        "--device cuda:{n}: this is a CUDA build, but {e}; {fix}use --device cpu \
                         (or auto)"
                    )));
                }
            };
            match probe.open(n) {
                Ok((device, name)) => Ok(Selected {
                    device,
                    line: format!("device: cuda:{n} ({name}; CUDA libraries from {libs})"),
                }),
                Err(e) => Err(Error::Usage(format!(
                    "cannot open CUDA device {n}: {e}; use --device cpu (or auto)"
                ))),
            }
        }
    }
}

/// The machine as it is.
pub struct SystemProbe;

impl CudaProbe for SystemProbe {
    fn built(&self) -> bool {
        cfg!(feature = "cuda")
    }

    fn libraries(&self) -> std::result::Result<String, String> {
        load_any(&DRIVER)?;
        crate::runtime::cuda_libs::locate_and_load(
            &crate::runtime::cuda_libs::Inputs::current(),
            &dlopen,
        )
    }

    fn open(&self, ordinal: usize) -> std::result::Result<(Device, String), String> {
        open_cuda(ordinal)
    }
}

/// A shared library the CUDA build loads at run time by name, and the file
/// names tried for it.
pub struct RuntimeLibrary {
    /// What it is, for messages.
    pub what: &'static str,
    /// File names, first found wins.
    pub names: &'static [&'static str],
}

/// The driver: not shipped, it comes with the machine (found by name).
/// cuBLAS, cuRAND and NVRTC are found by [`crate::runtime::cuda_libs`].
pub const DRIVER: RuntimeLibrary = RuntimeLibrary {
    what: "no driver found",
    names: &["libcuda.so.1", "libcuda.so"],
};

/// `dlopen` the first of `lib.names` that loads (the handle is kept: the
/// CUDA code loads the same file again and gets it for free), or say what
/// is missing: `no driver found: libcuda.so.1 could not be loaded (…)`.
pub fn load_any(lib: &RuntimeLibrary) -> std::result::Result<(), String> {
    let mut first_error = None;
    for name in lib.names {
        match dlopen(name) {
            Ok(()) => return Ok(()),
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    Err(format!(
        "{}: {} could not be loaded ({})",
        lib.what,
        lib.names[0],
        first_error.unwrap_or_default()
    ))
}

/// `dlopen` one library by name or path, keeping it loaded.
#[cfg(unix)]
pub(crate) fn dlopen(name: &str) -> std::result::Result<(), String> {
    let c = std::ffi::CString::new(name).map_err(|e| e.to_string())?;
    // SAFETY: a valid C string; RTLD_LAZY|RTLD_LOCAL only maps the library
    // (and runs its initialisers, which for these libraries touch no GPU).
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
    if handle.is_null() {
        // SAFETY: dlerror returns null or a valid C string owned by libc.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown error".to_string()
        } else {
            unsafe { std::ffi::CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(msg);
    }
    Ok(())
}

#[cfg(not(unix))]
pub(crate) fn dlopen(_name: &str) -> std::result::Result<(), String> {
    Err("run-time loading of CUDA libraries is only supported on Linux".into())
}

#[cfg(feature = "cuda")]
fn open_cuda(ordinal: usize) -> std::result::Result<(Device, String), String> {
    // cudarc panics on a missing symbol or library; the probe above makes
    // that unlikely, and catching it here keeps it a message either way.
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let opened = std::panic::catch_unwind(|| {
        let device = Device::new_cuda(ordinal).map_err(|e| e.to_string())?;
        let name = device
            .as_cuda_device()
            .ok()
            .and_then(|d| d.cuda_stream().context().name().ok())
            .unwrap_or_else(|| "unnamed device".into());
        Ok::<_, String>((device, name))
    });
    std::panic::set_hook(hook);
    match opened {
        Ok(r) => r,
        Err(panic) => Err(panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "the CUDA library panicked".into())),
    }
}

#[cfg(not(feature = "cuda"))]
fn open_cuda(_ordinal: usize) -> std::result::Result<(Device, String), String> {
    Err("this build has no CUDA".into())
}

/// Choose the device named by `spec` (`auto`, `cpu`, `cuda`, `cuda:N`) on
/// this machine. The caller prints [`Selected::line`] once the work that
/// uses the device starts, so argument errors are not preceded by it.
pub fn choose(spec: &str) -> Result<Selected> {
    select(parse(spec)?, &SystemProbe)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Injected answers: built or not, libraries present or not, device
    /// opening or not.
    struct Fake {
        built: bool,
        libs: std::result::Result<String, String>,
        opens: bool,
    }

    impl CudaProbe for Fake {
        fn built(&self) -> bool {
            self.built
        }
        fn libraries(&self) -> std::result::Result<String, String> {
            self.libs.clone()
        }
        fn open(&self, ordinal: usize) -> std::result::Result<(Device, String), String> {
            if self.opens {
                // A CPU stands in for the GPU: only the line is checked.
                Ok((Device::Cpu, format!("Fake GPU {ordinal}")))
            } else {
                Err("CUDA_ERROR_NO_DEVICE".into())
            }
        }
    }

    const NO_DRIVER: &str =
        "no driver found: libcuda.so.1 could not be loaded (libcuda.so.1: cannot open shared object file)";

    fn fake(built: bool, libs: bool, opens: bool) -> Fake {
        Fake {
            built,
            libs: if libs {
                Ok("cuda-libs/ beside the binary (/opt/x/cuda-libs)".into())
            } else {
                Err(NO_DRIVER.into())
            },
            opens,
        }
    }

    #[test]
    fn parses_every_spelling_and_rejects_the_rest() {
        assert_eq!(parse("auto").unwrap(), DeviceSpec::Auto);
        assert_eq!(parse(" CPU ").unwrap(), DeviceSpec::Cpu);
        assert_eq!(parse("cuda").unwrap(), DeviceSpec::Cuda(0));
        assert_eq!(parse("cuda:3").unwrap(), DeviceSpec::Cuda(3));
        for bad in ["tpu", "cuda:x", "cuda3", "cuda:", ""] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.exit_code(), 2, "{bad}");
            assert!(e.to_string().contains("auto, cpu, cuda or cuda:N"), "{e}");
        }
    }

    #[test]
    fn auto_falls_back_to_the_cpu_and_says_why() {
        let line = |p: Fake| select(DeviceSpec::Auto, &p).unwrap().line;
        assert_eq!(
            line(fake(false, false, false)),
            "device: cpu (this build has no CUDA)"
        );
        assert_eq!(
            line(fake(true, false, false)),
            format!("device: cpu (CUDA build, but {NO_DRIVER})")
        );
        assert_eq!(
            line(fake(true, true, false)),
            "device: cpu (CUDA build, but cuda:0 did not open: CUDA_ERROR_NO_DEVICE)"
        );
        assert_eq!(
            line(fake(true, true, true)),
            "device: cuda:0 (Fake GPU 0; CUDA libraries from cuda-libs/ beside the binary (/opt/x/cuda-libs))"
        );
        for p in [fake(false, false, false), fake(true, false, false)] {
            assert!(select(DeviceSpec::Auto, &p).unwrap().device.is_cpu());
        }
    }

    #[test]
    fn explicit_cuda_fails_with_a_usage_error_naming_what_is_missing() {
        let e = select(DeviceSpec::Cuda(0), &fake(false, false, false)).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e.to_string().contains("built without CUDA"), "{e}");
        assert!(e.to_string().contains("scripts/build_cuda.sh"), "{e}");

        let e = select(DeviceSpec::Cuda(1), &fake(true, false, false)).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        let msg = e.to_string();
        assert!(msg.starts_with("--device cuda:1: this is a CUDA build, but no driver found: libcuda.so.1 could not be loaded"), "{msg}");
        assert!(msg.contains("--device cpu"), "{msg}");

        assert!(msg.contains("install the NVIDIA driver"), "{msg}");
        let no_cublas = Fake {
            built: true,
            libs: Err("cuBLAS not found (looked in: ...); put cuda-libs/ ...".into()),
            opens: true,
        };
        let msg = select(DeviceSpec::Cuda(0), &no_cublas)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains(
                "but cuBLAS not found (looked in: ...); put cuda-libs/ ...; or use --device cpu"
            ),
            "{msg}"
        );
        assert!(!msg.contains("driver"), "{msg}");

        let e = select(DeviceSpec::Cuda(2), &fake(true, true, false)).unwrap_err();
        assert_eq!(e.exit_code(), 2);
        assert!(e
            .to_string()
            .contains("cannot open CUDA device 2: CUDA_ERROR_NO_DEVICE"));

        let ok = select(DeviceSpec::Cuda(1), &fake(true, true, true)).unwrap();
        assert_eq!(
            ok.line,
            "device: cuda:1 (Fake GPU 1; CUDA libraries from cuda-libs/ beside the binary (/opt/x/cuda-libs))"
        );
    }

    #[test]
    fn cpu_is_always_the_cpu() {
        let s = select(DeviceSpec::Cpu, &fake(true, true, true)).unwrap();
        assert!(s.device.is_cpu());
        assert_eq!(s.line, "device: cpu (--device cpu)");
    }

    #[cfg(unix)]
    #[test]
    fn the_dlopen_probe_reports_a_missing_library_by_name() {
        // libc is always there; a made-up name never is.
        assert!(load_any(&RuntimeLibrary {
            what: "libc",
            names: &["libc.so.6"],
        })
        .is_ok());
        let e = load_any(&RuntimeLibrary {
            what: "no driver found",
            names: &["libncclean-does-not-exist.so.1", "libnope.so"],
        })
        .unwrap_err();
        assert!(
            e.starts_with("no driver found: libncclean-does-not-exist.so.1 could not be loaded ("),
            "{e}"
        );
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn this_cpu_build_runs_auto_on_the_cpu() {
        let s = select(DeviceSpec::Auto, &SystemProbe).unwrap();
        assert!(s.device.is_cpu());
        assert_eq!(s.line, "device: cpu (this build has no CUDA)");
        let e = choose("cuda:0").unwrap_err();
        assert_eq!(e.exit_code(), 2);
    }
}
