//! Which build of llama.cpp's CPU code this machine runs.
//!
//! llama.cpp's CPU backend is compiled once per x86-64 instruction level
//! (ggml's backend variants: `libggml-cpu-haswell.so` for AVX2,
//! `libggml-cpu-zen4.so` for AVX-512 with VNNI and BF16, …), so one release
//! of `duo-local-llm` uses the best instructions of whatever host it lands on.
//!
//! ggml can choose a variant itself, but it reads CPUID alone: a virtual
//! machine whose CPU reports AVX-512 or AMX while its kernel has not enabled
//! that register state would load a variant that dies with SIGILL at the
//! first matrix product. `is_x86_feature_detected!` also checks what the
//! operating system enabled (XCR0), so the choice is made here, and ggml's
//! loader is shown a private directory holding only the chosen file.
//! The AMX variant is never chosen: on Linux it also needs a per-process
//! permission (`arch_prctl`) that some hosts refuse.

use std::path::{Path, PathBuf};

/// An instruction-set extension a variant is compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Feature {
    Sse42,
    Avx,
    F16c,
    Fma,
    Avx2,
    Bmi2,
    /// AVX-512 F, CD, VL, DQ and BW together, as ggml compiles it.
    Avx512,
    Avx512Vbmi,
    Avx512Vnni,
    Avx512Bf16,
    AvxVnni,
    Amx,
}

impl Feature {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sse42 => "sse4.2",
            Self::Avx => "avx",
            Self::F16c => "f16c",
            Self::Fma => "fma",
            Self::Avx2 => "avx2",
            Self::Bmi2 => "bmi2",
            Self::Avx512 => "avx512",
            Self::Avx512Vbmi => "avx512vbmi",
            Self::Avx512Vnni => "avx512vnni",
            Self::Avx512Bf16 => "avx512bf16",
            Self::AvxVnni => "avxvnni",
            Self::Amx => "amx",
        }
    }
}

/// One CPU build of ggml and what it needs.
#[derive(Debug, PartialEq, Eq)]
pub struct Variant {
    pub name: &'static str,
    pub requires: &'static [Feature],
}

use Feature::*;

/// ggml's x86-64 variants (its `GGML_CPU_ALL_VARIANTS` list), lowest first.
pub const VARIANTS: &[Variant] = &[
    Variant {
        name: "x64",
        requires: &[],
    },
    Variant {
        name: "sse42",
        requires: &[Sse42],
    },
    Variant {
        name: "sandybridge",
        requires: &[Sse42, Avx],
    },
    Variant {
        name: "ivybridge",
        requires: &[Sse42, Avx, F16c],
    },
    Variant {
        name: "piledriver",
        requires: &[Sse42, Avx, F16c, Fma],
    },
    Variant {
        name: "haswell",
        requires: &[Sse42, Avx, F16c, Fma, Avx2, Bmi2],
    },
    Variant {
        name: "skylakex",
        requires: &[Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512],
    },
    Variant {
        name: "cannonlake",
        requires: &[Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vbmi],
    },
    Variant {
        name: "cascadelake",
        requires: &[Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vnni],
    },
    Variant {
        name: "icelake",
        requires: &[
            Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vbmi, Avx512Vnni,
        ],
    },
    Variant {
        name: "cooperlake",
        requires: &[
            Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vnni, Avx512Bf16,
        ],
    },
    Variant {
        name: "zen4",
        requires: &[
            Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vbmi, Avx512Vnni, Avx512Bf16,
        ],
    },
    Variant {
        name: "alderlake",
        requires: &[Sse42, Avx, F16c, Fma, Avx2, Bmi2, AvxVnni],
    },
    Variant {
        name: "sapphirerapids",
        requires: &[
            Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vbmi, Avx512Vnni, Avx512Bf16, Amx,
        ],
    },
];

/// Whether this CPU has `feature` and the kernel lets programs use it.
pub fn available_here(feature: Feature) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        match feature {
            Sse42 => std::arch::is_x86_feature_detected!("sse4.2"),
            Avx => std::arch::is_x86_feature_detected!("avx"),
            F16c => std::arch::is_x86_feature_detected!("f16c"),
            Fma => std::arch::is_x86_feature_detected!("fma"),
            Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            Bmi2 => std::arch::is_x86_feature_detected!("bmi2"),
            Avx512 => {
                std::arch::is_x86_feature_detected!("avx512f")
                    && std::arch::is_x86_feature_detected!("avx512cd")
                    && std::arch::is_x86_feature_detected!("avx512vl")
                    && std::arch::is_x86_feature_detected!("avx512dq")
                    && std::arch::is_x86_feature_detected!("avx512bw")
            }
            Avx512Vbmi => std::arch::is_x86_feature_detected!("avx512vbmi"),
            Avx512Vnni => std::arch::is_x86_feature_detected!("avx512vnni"),
            Avx512Bf16 => std::arch::is_x86_feature_detected!("avx512bf16"),
            AvxVnni => std::arch::is_x86_feature_detected!("avxvnni"),
            // Never chosen (see the module's comment).
            Amx => false,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = feature;
        false
    }
}

pub fn variant(name: &str) -> Option<&'static Variant> {
    VARIANTS.iter().find(|v| v.name == name)
}

/// What `variant` needs that `has` says is missing.
pub fn missing(variant: &Variant, has: impl Fn(Feature) -> bool) -> Vec<Feature> {
    variant
        .requires
        .iter()
        .copied()
        .filter(|f| !has(*f))
        .collect()
}

/// The installed variant with the most extensions that all run here.
pub fn choose(installed: &[&str], has: impl Fn(Feature) -> bool) -> Option<&'static Variant> {
    VARIANTS
        .iter()
        .filter(|v| installed.contains(&v.name))
        .filter(|v| v.requires.iter().all(|f| has(*f)))
        .max_by_key(|v| v.requires.len())
}

#[derive(Debug, thiserror::Error)]
pub enum CpuVariantError {
    #[error(
        "no llama.cpp CPU modules (libggml-cpu-*.so) in {dir}; install them beside duo-local-llm \
         in ggml-backends/ or name their directory in DUO_LOCAL_LLM_BACKENDS_DIR"
    )]
    NoModules { dir: PathBuf },
    #[error("DUO_LOCAL_LLM_CPU_VARIANT={name:?} is not a variant; installed: {installed}")]
    Unknown { name: String, installed: String },
    #[error("DUO_LOCAL_LLM_CPU_VARIANT={name}: this CPU or its kernel does not enable {missing}")]
    Unsupported { name: &'static str, missing: String },
    #[error("DUO_LOCAL_LLM_CPU_VARIANT={name}: not installed in {dir}")]
    NotInstalled { name: &'static str, dir: PathBuf },
    #[error("none of the llama.cpp CPU modules in {dir} runs on this CPU (installed: {installed})")]
    NoneRuns { dir: PathBuf, installed: String },
    #[error(
        "reading llama.cpp's CPU modules in {dir}: {source}; name their directory in \
         DUO_LOCAL_LLM_BACKENDS_DIR"
    )]
    Unreadable {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "staging the chosen llama.cpp CPU module in the temporary directory ({dir}): {source}; \
         point TMPDIR at a writable directory"
    )]
    Staging {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error("llama.cpp did not register a CPU device from {0}")]
    NotRegistered(PathBuf),
}

/// Where the variants are and whether one is forced, from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Settings {
    /// `DUO_LOCAL_LLM_BACKENDS_DIR`.
    pub dir: Option<PathBuf>,
    /// `DUO_LOCAL_LLM_CPU_VARIANT`: a variant's name instead of the best one.
    pub forced: Option<String>,
}

impl Settings {
    pub fn from_env() -> Self {
        let var = |name| std::env::var_os(name).filter(|v| !v.is_empty());
        Self {
            dir: var("DUO_LOCAL_LLM_BACKENDS_DIR").map(PathBuf::from),
            forced: var("DUO_LOCAL_LLM_CPU_VARIANT").map(|v| v.to_string_lossy().trim().to_owned()),
        }
    }
}

/// The variant loaded into this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loaded {
    pub name: &'static str,
    pub path: PathBuf,
}

/// The directory to read variants from: the setting, else the installed
/// layouts (`ggml-backends/` beside the executable, or
/// `../lib/duo-chat/ggml-backends/` from it), else the build's own output.
pub fn modules_dir(settings: &Settings) -> Option<PathBuf> {
    if let Some(dir) = &settings.dir {
        return Some(dir.clone());
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_owned));
    let installed = exe_dir.into_iter().flat_map(|dir| {
        [
            dir.join("ggml-backends"),
            dir.join("../lib/duo-chat/ggml-backends"),
        ]
    });
    installed
        .into_iter()
        .find(|dir| dir.is_dir())
        .or_else(|| llama_cpp_sys_2::BACKENDS_DIR.map(PathBuf::from))
}

/// Variant names of the `libggml-cpu-<name>.so` files in `dir`.
pub fn installed(dir: &Path) -> Result<Vec<String>, std::io::Error> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let file_name = entry?.file_name();
        let Some(name) = file_name.to_str() else {
            continue;
        };
        if let Some(variant) = name
            .strip_prefix("libggml-cpu-")
            .and_then(|n| n.strip_suffix(".so"))
        {
            names.push(variant.to_owned());
        }
    }
    names.sort();
    Ok(names)
}

/// Picks the variant for this machine (or the forced one, if it runs here).
pub fn pick(dir: &Path, settings: &Settings) -> Result<&'static Variant, CpuVariantError> {
    let names = installed(dir).map_err(|source| CpuVariantError::Unreadable {
        dir: dir.to_owned(),
        source,
    })?;
    if names.is_empty() {
        return Err(CpuVariantError::NoModules {
            dir: dir.to_owned(),
        });
    }
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    match &settings.forced {
        Some(name) => {
            let Some(v) = variant(name) else {
                return Err(CpuVariantError::Unknown {
                    name: name.clone(),
                    installed: names.join(", "),
                });
            };
            let lacking = missing(v, available_here);
            if !lacking.is_empty() {
                let missing = lacking
                    .iter()
                    .map(|f| f.name())
                    .collect::<Vec<_>>()
                    .join(", ");
                return Err(CpuVariantError::Unsupported {
                    name: v.name,
                    missing,
                });
            }
            if !refs.contains(&v.name) {
                return Err(CpuVariantError::NotInstalled {
                    name: v.name,
                    dir: dir.to_owned(),
                });
            }
            Ok(v)
        }
        None => choose(&refs, available_here).ok_or_else(|| CpuVariantError::NoneRuns {
            dir: dir.to_owned(),
            installed: names.join(", "),
        }),
    }
}

/// Loads the chosen variant into llama.cpp; call before the backend starts.
pub fn load(settings: &Settings) -> Result<Loaded, CpuVariantError> {
    let Some(dir) = modules_dir(settings) else {
        return Err(CpuVariantError::NoModules {
            dir: PathBuf::from("ggml-backends"),
        });
    };
    let chosen = pick(&dir, settings)?;
    let file = format!("libggml-cpu-{}.so", chosen.name);
    let path = dir.join(&file);
    let staging = |source| CpuVariantError::Staging {
        dir: std::env::temp_dir(),
        source,
    };
    let staged = StagedDir::create().map_err(staging)?;
    std::os::unix::fs::symlink(&path, staged.path.join(&file)).map_err(staging)?;
    let staged_path = staged.utf8_path().map_err(staging)?;
    let cpu_devices_before = cpu_devices();
    llama_cpp_2::llama_backend::load_backends_from_path(Path::new(staged_path));
    if cpu_devices() <= cpu_devices_before {
        return Err(CpuVariantError::NotRegistered(path));
    }
    Ok(Loaded {
        name: chosen.name,
        path,
    })
}

fn cpu_devices() -> usize {
    llama_cpp_2::list_llama_ggml_backend_devices()
        .iter()
        .filter(|d| d.backend.eq_ignore_ascii_case("cpu"))
        .count()
}

/// A directory only this process made (mode 0700, a fresh name: creation
/// fails rather than reuse anything already there), removed when dropped;
/// the loaded module stays mapped after its link is gone.
struct StagedDir {
    path: PathBuf,
}

impl StagedDir {
    fn create() -> Result<Self, std::io::Error> {
        use std::os::unix::fs::DirBuilderExt as _;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        let path = std::env::temp_dir().join(format!(
            "duo-local-llm-ggml-{}-{nanos:09}",
            std::process::id()
        ));
        std::fs::DirBuilder::new().mode(0o700).create(&path)?;
        Ok(Self { path })
    }

    fn utf8_path(&self) -> Result<&str, std::io::Error> {
        self.path
            .to_str()
            .filter(|p| !p.contains('\0'))
            .ok_or_else(|| std::io::Error::other("the temporary directory's path is not UTF-8"))
    }
}

impl Drop for StagedDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[&str] = &[
        "x64",
        "sse42",
        "sandybridge",
        "ivybridge",
        "piledriver",
        "haswell",
        "skylakex",
        "cannonlake",
        "cascadelake",
        "icelake",
        "cooperlake",
        "zen4",
        "alderlake",
        "sapphirerapids",
    ];

    fn machine(features: &'static [Feature]) -> impl Fn(Feature) -> bool {
        move |f| features.contains(&f)
    }

    #[test]
    fn an_avx2_machine_gets_haswell() {
        let has = machine(&[Sse42, Avx, F16c, Fma, Avx2, Bmi2]);
        assert_eq!(choose(ALL, has).map(|v| v.name), Some("haswell"));
    }

    #[test]
    fn a_zen4_machine_gets_zen4_and_never_amx() {
        let has = machine(&[
            Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512, Avx512Vbmi, Avx512Vnni, Avx512Bf16, AvxVnni,
        ]);
        assert_eq!(choose(ALL, &has).map(|v| v.name), Some("zen4"));
        // Even a CPU that reports AMX: `available_here` never says yes to it.
        assert!(!available_here(Amx));
        let with_amx = |f| has(f) || f == Amx;
        assert_eq!(
            choose(ALL, with_amx).map(|v| v.name),
            Some("sapphirerapids")
        );
    }

    #[test]
    fn avx512_the_kernel_did_not_enable_is_not_used() {
        // CPUID says AVX-512 but XCR0 does not: detection reports it missing.
        let has = machine(&[Sse42, Avx, F16c, Fma, Avx2, Bmi2, AvxVnni]);
        assert_eq!(choose(ALL, has).map(|v| v.name), Some("alderlake"));
    }

    #[test]
    fn only_installed_variants_are_chosen() {
        let has = machine(&[Sse42, Avx, F16c, Fma, Avx2, Bmi2, Avx512]);
        assert_eq!(
            choose(&["x64", "sse42"], &has).map(|v| v.name),
            Some("sse42")
        );
        assert_eq!(choose(&[], &has), None);
        assert_eq!(choose(&["zen4"], &has), None);
    }

    #[test]
    fn the_table_holds_ggml_names_and_says_what_is_missing() {
        for name in ALL {
            assert!(variant(name).is_some(), "{name}");
        }
        let zen4 = variant("zen4").unwrap();
        assert_eq!(missing(zen4, machine(&[Sse42, Avx])).len(), 8);
    }

    #[test]
    fn files_in_a_directory_are_read_as_variants() {
        let dir = std::env::temp_dir().join(format!("cpu-variant-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in [
            "libggml-cpu-haswell.so",
            "libggml-cpu-x64.so",
            "libggml-base.so",
            "notes.txt",
        ] {
            std::fs::write(dir.join(f), b"").unwrap();
        }
        assert_eq!(installed(&dir).unwrap(), vec!["haswell", "x64"]);
        let forced = Settings {
            dir: None,
            forced: Some("nehalem".into()),
        };
        let err = pick(&dir, &forced).unwrap_err().to_string();
        assert!(
            err.contains("\"nehalem\" is not a variant; installed: haswell, x64"),
            "{err}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
