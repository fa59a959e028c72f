//! Where a CUDA build finds cuBLAS, cuBLASLt, cuRAND and NVRTC (issue #36).
//!
//! The libraries are 0.8 GB, so they cannot always travel with the binary.
//! They are looked for, first complete place wins, in:
//!
//! 1. `cuda-libs/` beside the binary (what `scripts/build_cuda.sh` makes);
//! 2. the folder named by `$NCCLEAN_CUDA_LIBS`;
//! 3. the `nvidia/*/lib` folders of the Python environment whose `python3`
//!    is first on PATH (PyTorch's CUDA wheels: `nvidia-cublas`,
//!    `nvidia-curand`, `nvidia-cuda-nvrtc`), found by globbing its
//!    site-packages, else by asking that `python3` where `nvidia` lives;
//! 4. the system's library path (`LD_LIBRARY_PATH`, ldconfig), by name.
//!
//! Loading a file by its full path first means that the CUDA code's later
//! `dlopen("libcublas.so.13")` gets the same, already loaded library (the
//! dynamic loader matches loaded objects by soname). This module is plain
//! Rust with no CUDA dependency, so every build compiles and tests it.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The environment variable naming a folder that holds the libraries.
pub const ENV_VAR: &str = "NCCLEAN_CUDA_LIBS";

/// One library the CUDA code needs, and the file names it may have (the
/// ones cudarc tries, CUDA 13 first, then CUDA 12).
#[derive(Debug, Clone, Copy)]
pub struct Needed {
    /// What it is, for messages.
    pub what: &'static str,
    /// File names; the first found wins.
    pub names: &'static [&'static str],
}

/// In load order: cuBLASLt before cuBLAS, which needs it, so that cuBLAS's
/// dependency resolves to the file this search chose.
pub const NEEDED: &[Needed] = &[
    Needed {
        what: "cuBLASLt",
        names: &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
    },
    Needed {
        what: "cuBLAS",
        names: &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
    },
    Needed {
        what: "cuRAND",
        names: &["libcurand.so.10", "libcurand.so"],
    },
    Needed {
        what: "NVRTC",
        names: &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
    },
];

/// NVRTC loads its builtins by name at run time; loaded from the folder
/// NVRTC came from when that folder has them.
const NVRTC_BUILTINS_PREFIX: &str = "libnvrtc-builtins.so";

/// How long asking `python3` may take before it counts as not answering.
const PYTHON_TIMEOUT: Duration = Duration::from_secs(20);

/// What the search reads from the process: injected in tests.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    /// The folder of the running binary.
    pub exe_dir: Option<PathBuf>,
    /// `$NCCLEAN_CUDA_LIBS`, if set and non-empty.
    pub env: Option<PathBuf>,
    /// `$PATH`, to find `python3`.
    pub path: Option<std::ffi::OsString>,
}

impl Inputs {
    /// This process's binary and environment.
    pub fn current() -> Inputs {
        Inputs {
            exe_dir: std::env::current_exe()
                .ok()
                .and_then(|p| p.parent().map(Path::to_path_buf)),
            env: std::env::var_os(ENV_VAR)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from),
            path: std::env::var_os("PATH"),
        }
    }
}

/// A place that holds every library: where, and the files in load order.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// Where they are, as said on stderr (`cuda-libs/ beside the binary
    /// (/opt/x/cuda-libs)`).
    pub origin: String,
    /// Full paths, in load order (NVRTC's builtins before NVRTC).
    pub files: Vec<PathBuf>,
}

/// The outcome of a search: the first complete place, and what every
/// place looked at held (for the message when none is complete).
#[derive(Debug, Clone, PartialEq)]
pub struct Search {
    /// The first place holding every library, if any.
    pub found: Option<Found>,
    /// One line per place looked at, in order: `cuda-libs/ beside the
    /// binary (/x/cuda-libs): absent`.
    pub looked: Vec<String>,
}

/// Search the places in order; the Python environment is only examined
/// (and `python3` only run) when the first two places are not complete.
pub fn search(inputs: &Inputs) -> Search {
    let mut looked = Vec::new();
    let try_place =
        |looked: &mut Vec<String>, origin: String, dirs: &[PathBuf]| match complete(dirs) {
            Ok(files) => Some(Found { origin, files }),
            Err(why) => {
                looked.push(format!("{origin}: {why}"));
                None
            }
        };
    if let Some(exe_dir) = &inputs.exe_dir {
        let dir = exe_dir.join("cuda-libs");
        let origin = format!("cuda-libs/ beside the binary ({})", dir.display());
        if let Some(found) = try_place(&mut looked, origin, std::slice::from_ref(&dir)) {
            return Search {
                found: Some(found),
                looked,
            };
        }
    }
    match &inputs.env {
        Some(dir) => {
            let origin = format!("${ENV_VAR} ({})", dir.display());
            if let Some(found) = try_place(&mut looked, origin, std::slice::from_ref(dir)) {
                return Search {
                    found: Some(found),
                    looked,
                };
            }
        }
        None => looked.push(format!("${ENV_VAR}: not set")),
    }
    match python_nvidia_libs(inputs.path.as_deref()) {
        Ok((python, dirs)) => {
            let origin = format!(
                "the Python environment of {} ({})",
                python.display(),
                common_root(&dirs).display()
            );
            if let Some(found) = try_place(&mut looked, origin, &dirs) {
                return Search {
                    found: Some(found),
                    looked,
                };
            }
        }
        Err(why) => looked.push(format!("Python's nvidia packages: {why}")),
    }
    Search {
        found: None,
        looked,
    }
}

/// Every [`NEEDED`] library's file in `dirs` (names outer, folders inner,
/// so a CUDA 13 file anywhere beats a CUDA 12 one), in load order; or
/// which are missing.
fn complete(dirs: &[PathBuf]) -> std::result::Result<Vec<PathBuf>, String> {
    if !dirs.iter().any(|d| d.is_dir()) {
        return Err("absent".into());
    }
    let mut files = Vec::new();
    let mut missing = Vec::new();
    for lib in NEEDED {
        let hit = lib
            .names
            .iter()
            .flat_map(|name| dirs.iter().map(move |d| d.join(name)))
            .find(|p| p.is_file());
        match hit {
            Some(file) => {
                if lib.what == "NVRTC" {
                    files.extend(nvrtc_builtins(file.parent()));
                }
                files.push(file);
            }
            None => missing.push(lib.what),
        }
    }
    if missing.is_empty() {
        Ok(files)
    } else {
        Err(format!("no {}", missing.join(", ")))
    }
}

/// NVRTC's builtins beside NVRTC (at most one, the versioned one first).
fn nvrtc_builtins(dir: Option<&Path>) -> Option<PathBuf> {
    let mut names: Vec<PathBuf> = std::fs::read_dir(dir?)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(OsStr::to_str)
                .is_some_and(|n| n.starts_with(NVRTC_BUILTINS_PREFIX))
                && p.is_file()
        })
        .collect();
    // `libnvrtc-builtins.so.13.0` sorts after `libnvrtc-builtins.so`.
    names.sort();
    names.pop()
}

/// The deepest folder the `dirs` share (for a one-line origin).
fn common_root(dirs: &[PathBuf]) -> PathBuf {
    let mut root = match dirs.first() {
        Some(d) => d.clone(),
        None => return PathBuf::new(),
    };
    while !dirs.iter().all(|d| d.starts_with(&root)) {
        if !root.pop() {
            break;
        }
    }
    root
}

/// The first `python3` on `path`, and the `lib` folders of its `nvidia`
/// packages: globbed from its `lib/python3*/site-packages/nvidia`, else
/// asked of `python3` itself (a system Python with user site-packages, or
/// a layout the glob does not know).
fn python_nvidia_libs(
    path: Option<&OsStr>,
) -> std::result::Result<(PathBuf, Vec<PathBuf>), String> {
    let python = path
        .into_iter()
        .flat_map(std::env::split_paths)
        .map(|d| d.join("python3"))
        .find(|p| p.is_file())
        .ok_or("no python3 on PATH")?;
    let mut nvidia = Vec::new();
    // A venv's bin/python3 is a link to the base interpreter: its own
    // folder, not the link's target, holds the environment.
    if let Some(prefix) = python.parent().and_then(Path::parent) {
        for lib in [prefix.join("lib"), prefix.join("lib64")] {
            for entry in sorted_entries(&lib) {
                let is_python = entry
                    .file_name()
                    .and_then(OsStr::to_str)
                    .is_some_and(|n| n.starts_with("python3"));
                let packages = entry.join("site-packages").join("nvidia");
                // A venv's lib64 is often a link to its lib: one copy.
                let same = |p: &PathBuf| {
                    p.canonicalize()
                        .ok()
                        .is_some_and(|c| packages.canonicalize().ok() == Some(c))
                };
                if is_python && packages.is_dir() && !nvidia.iter().any(same) {
                    nvidia.push(packages);
                }
            }
        }
    }
    if nvidia.is_empty() {
        nvidia = ask_python(&python)?;
    }
    let dirs: Vec<PathBuf> = nvidia
        .iter()
        .flat_map(|n| sorted_entries(n))
        .map(|p| p.join("lib"))
        .filter(|p| p.is_dir())
        .collect();
    if dirs.is_empty() {
        return Err(format!(
            "{} has no nvidia/*/lib folders (pip install nvidia-cublas nvidia-curand nvidia-cuda-nvrtc)",
            python.display()
        ));
    }
    Ok((python, dirs))
}

/// A folder's entries, sorted (empty when it cannot be read).
fn sorted_entries(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .map(|rd| rd.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    v.sort();
    v
}

/// `python3 -c 'import nvidia; print(*nvidia.__path__)'`, one folder a
/// line, bounded by [`PYTHON_TIMEOUT`] and 64 KiB of output.
fn ask_python(python: &Path) -> std::result::Result<Vec<PathBuf>, String> {
    const SCRIPT: &str = "import nvidia, os\nfor p in nvidia.__path__: print(os.path.abspath(p))";
    let mut child = Command::new(python)
        .args(["-c", SCRIPT])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run {}: {e}", python.display()))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if start.elapsed() < PYTHON_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            Ok(None) | Err(_) => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "{} did not answer within {} s",
                    python.display(),
                    PYTHON_TIMEOUT.as_secs()
                ));
            }
        }
    };
    if !status.success() {
        return Err(format!(
            "{} has no nvidia package (pip install nvidia-cublas nvidia-curand nvidia-cuda-nvrtc)",
            python.display()
        ));
    }
    let mut out = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        use std::io::Read;
        let _ = stdout.take(64 * 1024).read_to_end(&mut out);
    }
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(PathBuf::from)
        .collect())
}

/// Where the libraries were loaded from, for the `device:` line.
pub type Loaded = String;

/// Find the libraries and load them (each by full path, with `dlopen`);
/// without a complete place, by name from the system's library path.
/// `load` is `dlopen` (injected in tests). The error names every place
/// looked at and says how to supply the libraries.
pub fn locate_and_load(
    inputs: &Inputs,
    load: &dyn Fn(&str) -> std::result::Result<(), String>,
) -> std::result::Result<Loaded, String> {
    load_search(&search(inputs), load)
}

/// [`locate_and_load`] for a search already made.
pub fn load_search(
    s: &Search,
    load: &dyn Fn(&str) -> std::result::Result<(), String>,
) -> std::result::Result<Loaded, String> {
    if let Some(found) = &s.found {
        for file in &found.files {
            let name = file.to_string_lossy();
            load(&name).map_err(|e| format!("{name} was found but did not load ({e})"))?;
        }
        return Ok(found.origin.clone());
    }
    let mut missing = Vec::new();
    for lib in NEEDED {
        if !lib.names.iter().any(|n| load(n).is_ok()) {
            missing.push(lib.what);
        }
    }
    if missing.is_empty() {
        return Ok("the system library path (LD_LIBRARY_PATH, ldconfig)".into());
    }
    Err(format!(
        "{} not found (looked in: {}; and the system library path); put cuda-libs/ from \
         scripts/build_cuda.sh beside the binary, set ${ENV_VAR} to a folder holding them, or put \
         a python3 whose environment has the nvidia-cublas, nvidia-curand and nvidia-cuda-nvrtc \
         wheels (PyTorch's) first on PATH",
        missing.join(", "),
        s.looked.join("; ")
    ))
}

/// What `ncclean cuda-libs` found: whether the driver loads, where the
/// libraries are and whether they load.
#[derive(Debug, Clone)]
pub struct Report {
    /// The driver loaded, or why not.
    pub driver: std::result::Result<(), String>,
    /// The search for the libraries.
    pub search: Search,
    /// Where the libraries loaded from, or why they did not.
    pub loaded: std::result::Result<Loaded, String>,
}

/// Search for the driver and the libraries here, and load them.
pub fn report() -> Report {
    use crate::runtime::device;
    let driver = device::load_any(&device::DRIVER);
    let search = search(&Inputs::current());
    let loaded = load_search(&search, &device::dlopen);
    Report {
        driver,
        search,
        loaded,
    }
}

/// What `cuda-libs --json` prints on stdout ([`Report::printed`]).
#[derive(Debug, serde::Serialize)]
pub struct ReportPrinted<'a> {
    built_with_cuda: bool,
    driver: Load,
    libraries: Load,
    looked: &'a [String],
}

/// Whether a library loaded, and from where or why not.
#[derive(Debug, serde::Serialize)]
struct Load {
    loaded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    files: Option<Vec<String>>,
}

impl Report {
    /// The files of the complete place found, in load order.
    fn files(&self) -> Vec<String> {
        self.search
            .found
            .iter()
            .flat_map(|f| f.files.iter().map(|p| p.display().to_string()))
            .collect()
    }

    /// The report as `cuda-libs --json` prints it.
    pub fn printed(&self) -> ReportPrinted<'_> {
        let outcome = |r: std::result::Result<(), &String>| Load {
            loaded: r.is_ok(),
            error: r.err().cloned(),
            from: None,
            files: None,
        };
        ReportPrinted {
            built_with_cuda: cfg!(feature = "cuda"),
            driver: outcome(self.driver.as_ref().map(|_| ())),
            libraries: match &self.loaded {
                Ok(from) => Load {
                    from: Some(from.clone()),
                    files: Some(self.files()),
                    ..outcome(Ok(()))
                },
                Err(e) => outcome(Err(e)),
            },
            looked: &self.search.looked,
        }
    }

    /// The report as lines of text.
    pub fn text(&self) -> String {
        let mut out = String::new();
        out.push_str(&format!(
            "build: {}\n",
            if cfg!(feature = "cuda") {
                "CUDA"
            } else {
                "CPU only (the search below is what a CUDA build would do)"
            }
        ));
        out.push_str(&match &self.driver {
            Ok(()) => "driver: loaded\n".to_string(),
            Err(e) => format!("driver: {e}\n"),
        });
        match &self.loaded {
            Ok(from) => {
                out.push_str(&format!("libraries: loaded from {from}\n"));
                for f in &self.files() {
                    out.push_str(&format!("  {f}\n"));
                }
            }
            Err(e) => out.push_str(&format!("libraries: {e}\n")),
        }
        for l in &self.search.looked {
            out.push_str(&format!("passed over: {l}\n"));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    /// Empty files with these names in `dir` (the search only looks at names).
    fn touch(dir: &Path, names: &[&str]) {
        fs::create_dir_all(dir).unwrap();
        for n in names {
            fs::write(dir.join(n), b"").unwrap();
        }
    }

    const CU13: &[&str] = &[
        "libcublas.so.13",
        "libcublasLt.so.13",
        "libcurand.so.10",
        "libnvrtc.so.13",
        "libnvrtc-builtins.so.13.0",
    ];

    fn names(files: &[PathBuf]) -> Vec<String> {
        files
            .iter()
            .map(|f| f.file_name().unwrap().to_string_lossy().into_owned())
            .collect()
    }

    /// A fake Python environment under `root`: `bin/python3` (a script
    /// that fails, so only the glob can find anything) and `nvidia/*/lib`.
    fn venv(root: &Path, libs: &[(&str, &[&str])]) -> PathBuf {
        let bin = root.join("bin");
        fs::create_dir_all(&bin).unwrap();
        fs::write(bin.join("python3"), "#!/bin/sh\nexit 1\n").unwrap();
        let nvidia = root.join("lib/python3.11/site-packages/nvidia");
        for (pkg, files) in libs {
            touch(&nvidia.join(pkg).join("lib"), files);
        }
        bin
    }

    #[test]
    fn beside_the_binary_wins_and_loads_cublaslt_before_cublas() {
        let t = tempfile::tempdir().unwrap();
        touch(&t.path().join("cuda-libs"), CU13);
        let env = t.path().join("env");
        touch(&env, CU13);
        let s = search(&Inputs {
            exe_dir: Some(t.path().into()),
            env: Some(env),
            path: None,
        });
        let found = s.found.unwrap();
        assert!(found.origin.starts_with("cuda-libs/ beside the binary ("));
        assert_eq!(
            names(&found.files),
            [
                "libcublasLt.so.13",
                "libcublas.so.13",
                "libcurand.so.10",
                "libnvrtc-builtins.so.13.0",
                "libnvrtc.so.13"
            ]
        );
        assert!(s.looked.is_empty());
    }

    #[test]
    fn an_incomplete_cuda_libs_gives_way_to_the_environment_variable() {
        let t = tempfile::tempdir().unwrap();
        touch(&t.path().join("cuda-libs"), &["libcublas.so.13"]);
        let env = t.path().join("env");
        touch(&env, CU13);
        let s = search(&Inputs {
            exe_dir: Some(t.path().into()),
            env: Some(env.clone()),
            path: None,
        });
        let found = s.found.unwrap();
        assert_eq!(
            found.origin,
            format!("$NCCLEAN_CUDA_LIBS ({})", env.display())
        );
        assert!(found.files.iter().all(|f| f.starts_with(&env)));
        assert_eq!(s.looked.len(), 1);
        assert!(
            s.looked[0].ends_with(": no cuBLASLt, cuRAND, NVRTC"),
            "{:?}",
            s.looked
        );
    }

    #[test]
    fn the_python_environment_on_path_is_globbed_across_packages() {
        let t = tempfile::tempdir().unwrap();
        // CUDA 12's layout: one package per library.
        let bin = venv(
            &t.path().join("venv"),
            &[
                ("cublas", &["libcublas.so.12", "libcublasLt.so.12"]),
                ("curand", &["libcurand.so.10"]),
                (
                    "cuda_nvrtc",
                    &["libnvrtc.so.12", "libnvrtc-builtins.so.12.4"],
                ),
            ],
        );
        let path = std::env::join_paths([t.path().join("nothing"), bin.clone()]).unwrap();
        let s = search(&Inputs {
            exe_dir: Some(t.path().join("bin-without-libs")),
            env: None,
            path: Some(path),
        });
        let found = s.found.expect("found in the venv");
        assert!(
            found.origin.starts_with(&format!(
                "the Python environment of {}",
                bin.join("python3").display()
            )),
            "{}",
            found.origin
        );
        assert!(
            found.origin.ends_with("site-packages/nvidia)"),
            "{}",
            found.origin
        );
        assert_eq!(
            names(&found.files),
            [
                "libcublasLt.so.12",
                "libcublas.so.12",
                "libcurand.so.10",
                "libnvrtc-builtins.so.12.4",
                "libnvrtc.so.12"
            ]
        );
        assert_eq!(
            s.looked,
            [
                format!(
                    "cuda-libs/ beside the binary ({}): absent",
                    t.path().join("bin-without-libs/cuda-libs").display()
                ),
                "$NCCLEAN_CUDA_LIBS: not set".to_string()
            ]
        );
    }

    #[test]
    fn cuda_13_files_win_over_cuda_12_ones_in_the_same_environment() {
        let t = tempfile::tempdir().unwrap();
        let bin = venv(
            &t.path().join("venv"),
            &[("cu13", CU13), ("cublas", &["libcublas.so.12"])],
        );
        let s = search(&Inputs {
            path: Some(bin.into_os_string()),
            ..Inputs::default()
        });
        let files = s.found.unwrap().files;
        assert!(files
            .iter()
            .all(|f| f.to_string_lossy().contains("/cu13/lib/")));
    }

    #[cfg(unix)]
    #[test]
    fn python3_is_asked_when_its_site_packages_cannot_be_globbed() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let nvidia = t.path().join("user-site/nvidia");
        touch(&nvidia.join("cu13/lib"), CU13);
        let bin = t.path().join("bin");
        fs::create_dir_all(&bin).unwrap();
        let python = bin.join("python3");
        fs::write(&python, format!("#!/bin/sh\necho {}\n", nvidia.display())).unwrap();
        fs::set_permissions(&python, fs::Permissions::from_mode(0o755)).unwrap();
        let s = search(&Inputs {
            path: Some(bin.into_os_string()),
            ..Inputs::default()
        });
        let found = s.found.expect("found through python3");
        assert!(found.files.iter().all(|f| f.starts_with(&nvidia)));
    }

    #[test]
    fn nothing_found_names_every_place_and_what_to_do() {
        let t = tempfile::tempdir().unwrap();
        let bin = venv(&t.path().join("venv"), &[]);
        let inputs = Inputs {
            exe_dir: Some(t.path().into()),
            env: Some(t.path().join("missing")),
            path: Some(bin.into_os_string()),
        };
        assert_eq!(search(&inputs).found, None);
        let e = locate_and_load(&inputs, &|_| Err("not here".into())).unwrap_err();
        assert!(e.starts_with("cuBLASLt, cuBLAS, cuRAND, NVRTC not found (looked in: cuda-libs/ beside the binary"), "{e}");
        assert!(e.contains("$NCCLEAN_CUDA_LIBS ("), "{e}");
        assert!(e.contains("missing): absent"), "{e}");
        assert!(e.contains("Python's nvidia packages: "), "{e}");
        assert!(e.contains("set $NCCLEAN_CUDA_LIBS"), "{e}");

        let no_python = Inputs {
            path: Some(t.path().join("empty").into_os_string()),
            ..Inputs::default()
        };
        let e = locate_and_load(&no_python, &|_| Err("not here".into())).unwrap_err();
        assert!(
            e.contains("Python's nvidia packages: no python3 on PATH"),
            "{e}"
        );
    }

    #[test]
    fn found_files_are_loaded_by_full_path_in_order() {
        let t = tempfile::tempdir().unwrap();
        let env = t.path().join("env");
        touch(&env, CU13);
        let inputs = Inputs {
            env: Some(env.clone()),
            ..Inputs::default()
        };
        let order = std::cell::RefCell::new(Vec::new());
        let loaded = locate_and_load(&inputs, &|name| {
            order.borrow_mut().push(name.to_string());
            Ok(())
        })
        .unwrap();
        assert_eq!(loaded, format!("$NCCLEAN_CUDA_LIBS ({})", env.display()));
        let order = order.into_inner();
        assert_eq!(order.len(), 5);
        assert!(order[0].ends_with("/env/libcublasLt.so.13"), "{order:?}");

        // A found file that does not load is named with the loader's words.
        let e = locate_and_load(&inputs, &|_| Err("invalid ELF header".into())).unwrap_err();
        assert!(
            e.ends_with("libcublasLt.so.13 was found but did not load (invalid ELF header)"),
            "{e}"
        );
    }

    #[test]
    fn without_a_place_the_system_path_is_tried_by_name() {
        let inputs = Inputs::default();
        let loaded = locate_and_load(&inputs, &|name| {
            if name.starts_with('/') {
                Err("unexpected path".into())
            } else {
                Ok(())
            }
        })
        .unwrap();
        assert_eq!(
            loaded,
            "the system library path (LD_LIBRARY_PATH, ldconfig)"
        );
    }
}
