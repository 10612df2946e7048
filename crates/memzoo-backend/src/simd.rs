//! Which x86 vector extensions memzoo's CPU code may use.
//!
//! memzoo's own kernels (the fused attention's loops, the GELU, the dropout masks, the int8
//! kNN scan) ask the CPU at run time what it has and use the widest. The environment variable
//! [`SIMD_ENV`] (`MEMZOO_SIMD`) caps that, so that one machine runs the code a CPU without
//! AVX-512, or without AVX2, would run:
//!
//! | `MEMZOO_SIMD` | memzoo's kernels use |
//! |---|---|
//! | unset, empty or `avx512` | whatever the CPU has (the default) |
//! | `avx2` | AVX2, FMA and BMI2 at most: no AVX-512, no AVX-VNNI |
//! | `portable` | no explicit SIMD (the compiler's own, for the build's target) |
//!
//! The matrix products are `gemm`'s, whose AVX-512 kernels are a build choice instead: the
//! top crates' `flex` feature compiles them in (picked where the CPU has AVX-512), their
//! `flex-avx2` feature leaves them out ([`GEMM_AVX512`]). So the code of an AVX2-only CPU is
//! `cargo run -p xtask --no-default-features --features flex-avx2` with `MEMZOO_SIMD=avx2`
//! (`cargo xtask bench --simd avx2` checks both, and caps the PyTorch peers the same way).
//!
//! The binaries check the variable when they start ([`simd_level_from_env`]) and stop on a
//! value they do not know; a library caller that never checks gets no cap from one.

use std::str::FromStr;
use std::sync::OnceLock;

/// The environment variable that caps memzoo's CPU kernels (see the module docs).
pub const SIMD_ENV: &str = "MEMZOO_SIMD";

/// Whether this build's matrix products may use `gemm`'s AVX-512 kernels (the `gemm-avx512`
/// feature, which the top crates' `flex` turns on and their `flex-avx2` does not).
pub const GEMM_AVX512: bool = cfg!(feature = "gemm-avx512");

/// The widest vector extensions memzoo's CPU kernels may use, narrowest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SimdLevel {
    /// No explicit SIMD: the portable loops.
    Portable,
    /// AVX2, FMA and BMI2 (x86-64-v3).
    Avx2,
    /// AVX-512 too (F, BW, VNNI where a kernel needs them), and every other extension a
    /// kernel asks the CPU for (AVX-VNNI): no cap.
    Avx512,
}

/// A value of [`SIMD_ENV`] that names no [`SimdLevel`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{SIMD_ENV}={value:?} is not a SIMD level: use avx512 (the default), avx2 or portable")]
pub struct SimdLevelError {
    /// The value given.
    pub value: String,
}

impl SimdLevel {
    /// The name `MEMZOO_SIMD` takes.
    pub fn name(self) -> &'static str {
        match self {
            SimdLevel::Portable => "portable",
            SimdLevel::Avx2 => "avx2",
            SimdLevel::Avx512 => "avx512",
        }
    }
}

impl std::fmt::Display for SimdLevel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for SimdLevel {
    type Err = SimdLevelError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value.trim().to_ascii_lowercase().as_str() {
            "" | "avx512" => Ok(SimdLevel::Avx512),
            "avx2" => Ok(SimdLevel::Avx2),
            "portable" => Ok(SimdLevel::Portable),
            _ => Err(SimdLevelError {
                value: value.to_string(),
            }),
        }
    }
}

/// The cap [`SIMD_ENV`] sets now: [`SimdLevel::Avx512`] (none) when it is unset.
pub fn simd_level_from_env() -> Result<SimdLevel, SimdLevelError> {
    match std::env::var(SIMD_ENV) {
        Ok(value) => value.parse(),
        Err(std::env::VarError::NotPresent) => Ok(SimdLevel::Avx512),
        Err(std::env::VarError::NotUnicode(value)) => Err(SimdLevelError {
            value: value.to_string_lossy().into_owned(),
        }),
    }
}

/// The cap in force, read from [`SIMD_ENV`] once per process; a value it does not know caps
/// nothing (the binaries refuse it before any kernel runs).
#[inline]
pub fn simd_cap() -> SimdLevel {
    static CAP: OnceLock<SimdLevel> = OnceLock::new();
    *CAP.get_or_init(|| simd_level_from_env().unwrap_or(SimdLevel::Avx512))
}

/// Whether memzoo's kernels may use `level`'s extensions (the CPU must still have them: each
/// kernel asks it too).
#[inline]
pub fn simd_allows(level: SimdLevel) -> bool {
    simd_cap() >= level
}

/// Whether memzoo's kernels may use AVX2, FMA and BMI2 here: the cap allows them and the CPU
/// has all three (every x86-64-v3 CPU does). A kernel compiled with `target_feature`s among
/// these may run where this is true.
#[inline]
pub fn avx2() -> bool {
    // The cap and the CPU do not change within a process: one load on the kernels' paths.
    static AVX2: OnceLock<bool> = OnceLock::new();
    *AVX2.get_or_init(detect_avx2)
}

fn detect_avx2() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd_allows(SimdLevel::Avx2)
            && std::arch::is_x86_feature_detected!("avx2")
            && std::arch::is_x86_feature_detected!("fma")
            && std::arch::is_x86_feature_detected!("bmi2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Whether memzoo's kernels may use AVX-512 F, BW and VL here (with [`avx2`]'s extensions): the
/// cap allows them and the CPU has them. A kernel that needs more (VNNI) asks the CPU for it too.
#[inline]
pub fn avx512() -> bool {
    static AVX512: OnceLock<bool> = OnceLock::new();
    *AVX512.get_or_init(detect_avx512)
}

fn detect_avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        simd_allows(SimdLevel::Avx512)
            && avx2()
            && std::arch::is_x86_feature_detected!("avx512f")
            && std::arch::is_x86_feature_detected!("avx512bw")
            && std::arch::is_x86_feature_detected!("avx512vl")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_parse_order_and_name_themselves() {
        for level in [SimdLevel::Portable, SimdLevel::Avx2, SimdLevel::Avx512] {
            assert_eq!(level.name().parse::<SimdLevel>(), Ok(level));
            assert_eq!(
                level.to_string().to_uppercase().parse::<SimdLevel>(),
                Ok(level)
            );
        }
        assert_eq!("".parse::<SimdLevel>(), Ok(SimdLevel::Avx512));
        assert!(SimdLevel::Portable < SimdLevel::Avx2 && SimdLevel::Avx2 < SimdLevel::Avx512);
        let err = "sse9".parse::<SimdLevel>().unwrap_err();
        assert_eq!(err.value, "sse9");
        assert!(err.to_string().contains("MEMZOO_SIMD=\"sse9\""), "{err}");
    }

    /// The cap comes from the environment once per process, and the extension checks obey it:
    /// the test runs itself again under each cap (the child asserts; the parent checks it ran).
    #[test]
    fn the_environment_caps_the_extension_checks() {
        const CHILD: &str = "MEMZOO_SIMD_TEST_CHILD";
        if let Ok(expected) = std::env::var(CHILD) {
            assert_eq!(simd_cap().name(), expected);
            assert!(simd_allows(SimdLevel::Portable));
            if simd_cap() < SimdLevel::Avx512 {
                assert!(!avx512(), "AVX-512 under {expected}");
            }
            if simd_cap() < SimdLevel::Avx2 {
                assert!(!avx2(), "AVX2 under {expected}");
            }
            return;
        }
        let exe = std::env::current_exe().unwrap();
        for level in ["portable", "avx2", "avx512"] {
            let out = std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "simd::tests::the_environment_caps_the_extension_checks",
                ])
                .env(SIMD_ENV, level)
                .env(CHILD, level)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{level}: {stdout}");
            assert!(
                stdout.contains("1 passed"),
                "{level}: the child ran no test: {stdout}"
            );
        }
        // Without a cap, the checks are the CPU's.
        #[cfg(target_arch = "x86_64")]
        if std::env::var_os(SIMD_ENV).is_none() {
            assert_eq!(
                avx2(),
                std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                    && std::arch::is_x86_feature_detected!("bmi2")
            );
        }
    }
}
