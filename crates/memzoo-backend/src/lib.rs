//! Run-time backend selection for memzoo.
//!
//! In Burn 0.22 a tensor carries no backend type: the [`Device`] picks the backend when the
//! program runs, and cargo features decide which backends are compiled in. memzoo declares the
//! backend features once, here (`flex`, the default; `wgpu`; `tch`; `cuda`), every other crate
//! forwards to them, and users pick a backend with a device string:
//!
//! | string | backend | cargo feature |
//! |---|---|---|
//! | `flex` | Burn's pure-Rust CPU backend | `flex` (default) |
//! | `wgpu` | wgpu, graphics API chosen by the runtime | `wgpu` |
//! | `wgpu-gl` / `wgpu-vulkan` | wgpu pinned to OpenGL / Vulkan | `wgpu` |
//! | `wgpu:N` / `wgpu:cpu` (any of the three) | wgpu on discrete GPU `N` / on the CPU adapter (a software rasteriser) | `wgpu` |
//! | `cuda`, `cuda:N` | CubeCL CUDA, GPU `N` | `cuda` |
//! | `tch`, `tch-cuda`, `tch-cuda:N` | LibTorch on CPU / CUDA GPU `N` | `tch` |
//!
//! ```
//! let device = memzoo_backend::parse_device("flex").unwrap();
//! assert!(memzoo_backend::parse_device("tpu").is_err());
//! ```
//!
//! Training also takes a list of devices of one backend, `cuda:0,cuda:1` ([`parse_device_list`]):
//! each device trains its share of the batch's rows.

#![warn(missing_docs)]

mod allocator;
pub mod simd;

pub use allocator::tune_allocator;

use std::collections::HashMap;
use std::fmt;
use std::str::FromStr;
use std::sync::{Mutex, OnceLock};

pub use burn::tensor::Device;

/// Every device name memzoo understands, with the cargo feature it needs.
pub const DEVICE_NAMES: &[(&str, &str)] = &[
    ("flex", "flex"),
    ("wgpu", "wgpu"),
    ("wgpu-gl", "wgpu"),
    ("wgpu-vulkan", "wgpu"),
    ("cuda", "cuda"),
    ("tch", "tch"),
    ("tch-cuda", "tch"),
];

/// Why a device string could not be turned into a [`Device`].
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DeviceError {
    /// The name is not one memzoo knows.
    #[error(
        "unknown device `{name}`: expected one of flex, wgpu[:N|:cpu], wgpu-gl[...], wgpu-vulkan[...], cuda[:N], tch, tch-cuda[:N] (training: a comma-separated list of one backend)"
    )]
    Unknown {
        /// The device string as given.
        name: String,
    },
    /// The backend exists but this binary was built without its cargo feature.
    #[error(
        "device `{name}` needs the cargo feature `{feature}`, which this binary was built without; \
         rebuild with `--features {feature}` (compiled in: {compiled})"
    )]
    NotCompiled {
        /// The device string as given.
        name: String,
        /// The cargo feature that compiles the backend in.
        feature: &'static str,
        /// The backends this binary has.
        compiled: String,
    },
    /// A malformed index, e.g. `cuda:x`.
    #[error("bad device index in `{name}`: `{index}` is not a non-negative integer")]
    BadIndex {
        /// The device string as given.
        name: String,
        /// The index as given.
        index: String,
    },
    /// The backend is compiled in but could not start (no adapter, driver error, ...).
    #[error("device `{name}` could not be initialised: {message}")]
    Init {
        /// The device string as given.
        name: String,
        /// The backend's own error.
        message: String,
    },
    /// A device list (`cuda:0,cuda:1`) where one device is expected.
    #[error(
        "`{name}` is a list of devices, but this runs on one device (only training takes a list)"
    )]
    List {
        /// The device string as given.
        name: String,
    },
    /// An entry of a device list is not a device.
    #[error("device list `{list}`: entry {position} (`{entry}`): {source}")]
    ListEntry {
        /// The device list as given.
        list: String,
        /// 1-based position of the bad entry.
        position: usize,
        /// The offending entry.
        entry: String,
        /// Why the entry is not a device.
        #[source]
        source: Box<DeviceError>,
    },
    /// A device list with devices of two backends.
    #[error(
        "device list `{list}` mixes backends: `{first}` is {first_backend}, `{other}` is \
         {other_backend}; the devices of a list hold replicas of one model whose gradients are \
         summed, so they must run the same backend's kernels: list devices of one backend"
    )]
    MixedBackends {
        /// The device list as given.
        list: String,
        /// The first device of the list.
        first: String,
        /// The first device's backend.
        first_backend: &'static str,
        /// The device that differs from the first.
        other: String,
        /// That device's backend.
        other_backend: &'static str,
    },
    /// Two OpenGL devices in one list.
    #[error(
        "device list `{list}` holds two wgpu OpenGL devices (`{first}`, `{other}`): CubeCL keeps \
         one wgpu instance per graphics API and wgpu's OpenGL backend one EGL context per \
         instance, which two devices' threads cannot share (EGL BadAccess); list Vulkan or CUDA \
         devices"
    )]
    SharedGlContext {
        /// The device list as given.
        list: String,
        /// The first device of the list.
        first: String,
        /// The device that differs from the first.
        other: String,
    },
    /// A device listed twice.
    #[error(
        "device list `{list}` names `{entry}` twice: each device trains its own share of the \
         batch's rows (several replicas on one device: set train.replicas instead)"
    )]
    Duplicate {
        /// The device list as given.
        list: String,
        /// The offending entry.
        entry: String,
    },
}

/// A parsed device string; [`DeviceSpec::init`] turns it into a Burn [`Device`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DeviceSpec {
    /// Burn's pure-Rust CPU backend.
    Flex,
    /// wgpu with the given graphics API choice, on the adapter the runtime prefers.
    Wgpu(WgpuApi),
    /// wgpu with the given graphics API choice, on a chosen adapter (`wgpu:1`, `wgpu-gl:cpu`).
    WgpuAt(WgpuApi, WgpuAdapter),
    /// CubeCL CUDA on GPU `index`.
    Cuda(usize),
    /// LibTorch on the CPU.
    Tch,
    /// LibTorch on CUDA GPU `index`.
    TchCuda(usize),
}

/// Which adapter a wgpu device runs on (Burn's `DeviceKind`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WgpuAdapter {
    /// Discrete GPU `N` (`wgpu:N`: Burn's `DeviceKind::DiscreteGpu(N)`).
    Gpu(usize),
    /// The CPU adapter, a software rasteriser such as Mesa's llvmpipe (`wgpu-gl:cpu`: Burn's
    /// `DeviceKind::Cpu`). Beside `wgpu-gl` on a machine whose only adapter is llvmpipe it is a
    /// second device (its own wgpu device, queue and memory) on the same adapter.
    Cpu,
}

/// Which graphics API the wgpu backend uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WgpuApi {
    /// Let the runtime pick (Vulkan, then DX12, then GL on Linux).
    Auto,
    /// OpenGL: the path that works on Mesa's software rasteriser (llvmpipe).
    Gl,
    /// Vulkan (SPIR-V).
    Vulkan,
}

impl DeviceSpec {
    /// The cargo feature this device needs.
    pub fn feature(&self) -> &'static str {
        match self {
            DeviceSpec::Flex => "flex",
            DeviceSpec::Wgpu(_) | DeviceSpec::WgpuAt(..) => "wgpu",
            DeviceSpec::Cuda(_) => "cuda",
            DeviceSpec::Tch | DeviceSpec::TchCuda(_) => "tch",
        }
    }

    /// Whether this binary was built with the backend of this device.
    pub fn is_compiled(&self) -> bool {
        compiled_features().contains(&self.feature())
    }

    /// Creates (or reuses: a runtime can only be initialised once per process) the device.
    pub fn init(&self) -> Result<Device, DeviceError> {
        if !self.is_compiled() {
            return Err(DeviceError::NotCompiled {
                name: self.to_string(),
                feature: self.feature(),
                compiled: compiled_features().join(", "),
            });
        }
        static CACHE: OnceLock<Mutex<HashMap<DeviceSpec, Device>>> = OnceLock::new();
        let cache = CACHE.get_or_init(Default::default);
        let mut cache = cache.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(device) = cache.get(self) {
            return Ok(device.clone());
        }
        let device = self.create()?;
        cache.insert(*self, device.clone());
        Ok(device)
    }

    #[allow(unreachable_code, unused_variables, deprecated)]
    fn create(&self) -> Result<Device, DeviceError> {
        match *self {
            DeviceSpec::Flex => {
                #[cfg(feature = "flex")]
                return Ok(Device::flex());
            }
            DeviceSpec::Wgpu(api) => {
                #[cfg(feature = "wgpu-plain")]
                return self.wgpu(api, burn::tensor::DeviceKind::DefaultDevice);
            }
            DeviceSpec::WgpuAt(api, adapter) => {
                #[cfg(feature = "wgpu-plain")]
                return self.wgpu(
                    api,
                    match adapter {
                        WgpuAdapter::Gpu(i) => burn::tensor::DeviceKind::DiscreteGpu(i),
                        WgpuAdapter::Cpu => burn::tensor::DeviceKind::Cpu,
                    },
                );
            }
            DeviceSpec::Cuda(index) => {
                #[cfg(feature = "cuda")]
                return Ok(Device::cuda(index));
            }
            DeviceSpec::Tch => {
                #[cfg(feature = "tch")]
                return Ok(Device::libtorch());
            }
            DeviceSpec::TchCuda(index) => {
                #[cfg(feature = "tch")]
                return Ok(Device::libtorch_cuda(index));
            }
        }
        unreachable!("is_compiled() was checked before create()")
    }

    #[cfg(feature = "wgpu-plain")]
    fn wgpu(&self, api: WgpuApi, kind: burn::tensor::DeviceKind) -> Result<Device, DeviceError> {
        use burn::tensor::wgpu::WgpuBackend;
        let api = match api {
            WgpuApi::Auto => WgpuBackend::Auto,
            WgpuApi::Gl => WgpuBackend::Gl,
            WgpuApi::Vulkan => WgpuBackend::Vulkan,
        };
        Device::wgpu_options()
            .graphics_api(api)
            .device_kind(kind)
            .init()
            .map_err(|e| DeviceError::Init {
                name: self.to_string(),
                message: e.to_string(),
            })
    }
}

impl fmt::Display for DeviceSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceSpec::Flex => write!(f, "flex"),
            DeviceSpec::Wgpu(WgpuApi::Auto) => write!(f, "wgpu"),
            DeviceSpec::Wgpu(WgpuApi::Gl) => write!(f, "wgpu-gl"),
            DeviceSpec::Wgpu(WgpuApi::Vulkan) => write!(f, "wgpu-vulkan"),
            DeviceSpec::WgpuAt(api, adapter) => {
                write!(f, "{}:", DeviceSpec::Wgpu(*api))?;
                match adapter {
                    WgpuAdapter::Gpu(i) => write!(f, "{i}"),
                    WgpuAdapter::Cpu => write!(f, "cpu"),
                }
            }
            DeviceSpec::Cuda(i) => write!(f, "cuda:{i}"),
            DeviceSpec::Tch => write!(f, "tch"),
            DeviceSpec::TchCuda(i) => write!(f, "tch-cuda:{i}"),
        }
    }
}

impl FromStr for DeviceSpec {
    type Err = DeviceError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.contains(',') {
            return Err(DeviceError::List {
                name: s.to_string(),
            });
        }
        let name = s.trim().to_ascii_lowercase();
        let (base, index) = match name.split_once(':') {
            Some((base, idx)) => (base, Some(idx)),
            None => (name.as_str(), None),
        };
        let number = |idx: &str| {
            idx.parse::<usize>().map_err(|_| DeviceError::BadIndex {
                name: s.to_string(),
                index: idx.to_string(),
            })
        };
        let wgpu = match base {
            "wgpu" => Some(WgpuApi::Auto),
            "wgpu-gl" => Some(WgpuApi::Gl),
            "wgpu-vulkan" => Some(WgpuApi::Vulkan),
            _ => None,
        };
        let spec = match (base, index, wgpu) {
            ("flex", None, _) => DeviceSpec::Flex,
            (_, None, Some(api)) => DeviceSpec::Wgpu(api),
            (_, Some("cpu"), Some(api)) => DeviceSpec::WgpuAt(api, WgpuAdapter::Cpu),
            (_, Some(i), Some(api)) => DeviceSpec::WgpuAt(api, WgpuAdapter::Gpu(number(i)?)),
            ("cuda", i, _) => DeviceSpec::Cuda(i.map(number).transpose()?.unwrap_or(0)),
            ("tch", None, _) => DeviceSpec::Tch,
            ("tch-cuda", i, _) => DeviceSpec::TchCuda(i.map(number).transpose()?.unwrap_or(0)),
            _ => {
                return Err(DeviceError::Unknown {
                    name: s.to_string(),
                });
            }
        };
        Ok(spec)
    }
}

/// Parses a comma-separated list of devices of one backend (`cuda:0,cuda:1`, `wgpu:0,wgpu:1`;
/// one device alone is a list of one), for training on several devices. Refused, naming the
/// entry: an entry that is not a device or is empty, a device listed twice, devices of two
/// backends. Devices are not initialised here ([`DeviceSpec::init`]).
///
/// ```
/// use memzoo_backend::{DeviceSpec, parse_device_list};
/// assert_eq!(parse_device_list("cuda:0, cuda:1").unwrap(), [DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)]);
/// assert!(parse_device_list("flex,tch").unwrap_err().to_string().contains("mixes backends"));
/// ```
pub fn parse_device_list(list: &str) -> Result<Vec<DeviceSpec>, DeviceError> {
    if !list.contains(',') {
        // One device: its own error, without the list around it.
        return Ok(vec![list.parse()?]);
    }
    let mut specs: Vec<DeviceSpec> = Vec::new();
    for (i, entry) in list.split(',').enumerate() {
        let spec: DeviceSpec = entry.parse().map_err(|e| DeviceError::ListEntry {
            list: list.to_string(),
            position: i + 1,
            entry: entry.trim().to_string(),
            source: Box::new(e),
        })?;
        if let Some(first) = specs.first()
            && first.feature() != spec.feature()
        {
            return Err(DeviceError::MixedBackends {
                list: list.to_string(),
                first: first.to_string(),
                first_backend: first.feature(),
                other: spec.to_string(),
                other_backend: spec.feature(),
            });
        }
        let gl = |s: &DeviceSpec| {
            matches!(
                s,
                DeviceSpec::Wgpu(WgpuApi::Gl) | DeviceSpec::WgpuAt(WgpuApi::Gl, _)
            )
        };
        if let Some(first) = specs.iter().find(|s| gl(s))
            && gl(&spec)
            && *first != spec
        {
            return Err(DeviceError::SharedGlContext {
                list: list.to_string(),
                first: first.to_string(),
                other: spec.to_string(),
            });
        }
        if specs.contains(&spec) {
            return Err(DeviceError::Duplicate {
                list: list.to_string(),
                entry: spec.to_string(),
            });
        }
        specs.push(spec);
    }
    Ok(specs)
}

/// Backend features compiled into this binary.
pub fn compiled_features() -> Vec<&'static str> {
    let mut features = Vec::new();
    if cfg!(feature = "flex") {
        features.push("flex");
    }
    if cfg!(feature = "wgpu-plain") {
        features.push("wgpu");
    }
    if cfg!(feature = "tch") {
        features.push("tch");
    }
    if cfg!(feature = "cuda") {
        features.push("cuda");
    }
    features
}

/// Whether `device` (or the device an autodiff device wraps) is the `flex` CPU backend, whose
/// element-wise kernels run on the calling thread: the trainer splits a batch over data-parallel
/// replicas there (see `memzoo_train::parallel`).
pub fn is_flex(device: &Device) -> bool {
    #[cfg(feature = "flex")]
    {
        // Device equality is hardware identity, autodiff ignored.
        *device == Device::flex()
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = device;
        false
    }
}

/// Whether `device` (or the device an autodiff device wraps) computes on the host CPU in host
/// memory: `flex`, and LibTorch on the CPU (`tch`). Code that can work on plain host vectors
/// instead of device tensors (e.g. the kNN memory's exact search) asks this; wgpu is never host,
/// even on a software rasteriser, since its buffers must be copied back to be read.
#[allow(deprecated)] // burn-tch is deprecated upstream; memzoo keeps it as a backend
pub fn is_host_cpu(device: &Device) -> bool {
    let host: &[Device] = &[
        #[cfg(feature = "flex")]
        Device::flex(),
        #[cfg(feature = "tch")]
        Device::libtorch(),
    ];
    // Device equality is hardware identity, autodiff ignored.
    host.contains(device)
}

/// Whether Burn sorts on the host for `device` (or the device an autodiff device wraps):
/// CubeCL (wgpu, CUDA) has no sort kernel, so Burn's `sort`, `argsort` and `sort_with_indices`
/// there copy the tensor to the CPU, sort it and copy the result back, a round trip that stalls
/// the device's queue. Code on a hot path that needs an order there computes it with device ops
/// instead (the Reformer's bucket sort, the kNN memory's top-k).
pub fn sorts_on_host(device: &Device) -> bool {
    #[cfg(any(feature = "wgpu-plain", feature = "cuda"))]
    {
        // Only CubeCL's devices report who they are (the part, what kernels are built for).
        device.identity().is_some()
    }
    #[cfg(not(any(feature = "wgpu-plain", feature = "cuda")))]
    {
        let _ = device;
        false
    }
}

/// `[0, 1, ..., n - 1]` on `device`, made on the host and copied there: Burn's `arange` on
/// fused backends (the GPU build: CubeCL with `fusion`) is a cumulative sum of ones, which
/// CubeCL computes with a quadratic kernel and which in Burn 0.22.1 returns 65,534 for every
/// index from 65,535 on (on Vulkan and on GL; `memzoo devices --verify` checks this
/// function and shows the difference).
pub fn index_range(n: usize, device: &Device) -> burn::tensor::Tensor<1, burn::tensor::Int> {
    let values: Vec<i64> = (0..n as i64).collect();
    burn::tensor::Tensor::from_data(burn::tensor::TensorData::new(values, [n]), device)
}

/// Parses a device string (see the crate docs) and initialises the device.
pub fn parse_device(name: &str) -> Result<Device, DeviceError> {
    name.parse::<DeviceSpec>()?.init()
}

/// Every compiled-in device a parity test can reasonably try on this machine, `flex` first.
///
/// Reads two environment variables (see [`test_devices_from`]):
/// - `MEMZOO_WGPU_API`: which wgpu graphics APIs to list, a comma-separated list of `gl`,
///   `vulkan`, `auto`, or `none`. Default: `gl`, the API a CPU-only machine has with Mesa's
///   llvmpipe alone. On a GPU machine use `vulkan`; on a CPU-only one with Mesa's lavapipe
///   (`mesa-vulkan-drivers`) `vulkan` runs the `wgpu` build (autotune and fusion) there too.
/// - `MEMZOO_TEST_CUDA=1`: also list `cuda:0` and `tch-cuda:0` (when compiled in).
///
/// An unknown `MEMZOO_WGPU_API` value is an error that names it.
pub fn test_devices() -> Result<Vec<DeviceSpec>, DeviceError> {
    let wgpu = std::env::var("MEMZOO_WGPU_API").ok();
    let cuda = std::env::var("MEMZOO_TEST_CUDA").is_ok_and(|v| v.trim() == "1");
    test_devices_from(wgpu.as_deref(), cuda)
}

/// [`test_devices`] with explicit settings: `wgpu_apis` as in `MEMZOO_WGPU_API` (`None`: `gl`),
/// `cuda`: list the CUDA devices. Only backends compiled into this binary are listed.
pub fn test_devices_from(
    wgpu_apis: Option<&str>,
    cuda: bool,
) -> Result<Vec<DeviceSpec>, DeviceError> {
    let mut apis = Vec::new();
    for name in wgpu_apis.unwrap_or("gl").split(',').map(str::trim) {
        let api = match name.to_ascii_lowercase().as_str() {
            "none" => continue,
            "gl" => WgpuApi::Gl,
            "vulkan" => WgpuApi::Vulkan,
            "auto" => WgpuApi::Auto,
            _ => {
                return Err(DeviceError::Unknown {
                    name: format!("MEMZOO_WGPU_API={name} (expected gl, vulkan, auto or none)"),
                });
            }
        };
        if !apis.contains(&api) {
            apis.push(api);
        }
    }
    let candidates = std::iter::once(DeviceSpec::Flex)
        .chain(apis.into_iter().map(DeviceSpec::Wgpu))
        .chain([DeviceSpec::Tch])
        .chain(
            cuda.then_some([DeviceSpec::Cuda(0), DeviceSpec::TchCuda(0)])
                .into_iter()
                .flatten(),
        );
    Ok(candidates.filter(DeviceSpec::is_compiled).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocator_tuning_applies_on_glibc_unless_the_user_chose() {
        let user_set = [
            "MALLOC_MMAP_THRESHOLD_",
            "MALLOC_TRIM_THRESHOLD_",
            "MALLOC_TOP_PAD_",
        ]
        .iter()
        .chain(&["GLIBC_TUNABLES", "MEMZOO_MALLOC"])
        .any(|v| std::env::var_os(v).is_some());
        let glibc = cfg!(all(target_os = "linux", target_env = "gnu"));
        assert_eq!(tune_allocator(), glibc && !user_set);
    }

    #[test]
    fn flex_is_recognised_with_and_without_autodiff() {
        let flex = parse_device("flex").unwrap();
        assert!(is_flex(&flex));
        assert!(is_flex(&flex.autodiff()));
        for spec in test_devices_from(Some("gl"), false).unwrap() {
            if spec != DeviceSpec::Flex {
                assert!(!is_flex(&spec.init().unwrap()), "{spec}");
            }
        }
    }

    #[test]
    #[allow(deprecated)]
    fn host_cpu_devices_are_flex_and_libtorch_cpu() {
        let flex = parse_device("flex").unwrap();
        assert!(is_host_cpu(&flex));
        assert!(is_host_cpu(&flex.autodiff()));
        // Every other compiled-in backend this machine can start (wgpu on GL, LibTorch on CPU).
        for spec in test_devices_from(Some("gl"), false).unwrap() {
            let host = matches!(spec, DeviceSpec::Flex | DeviceSpec::Tch);
            let device = spec.init().unwrap();
            assert_eq!(is_host_cpu(&device), host, "{spec}");
            assert_eq!(is_host_cpu(&device.autodiff()), host, "{spec} (autodiff)");
        }
        #[cfg(feature = "tch")]
        assert!(!is_host_cpu(&Device::libtorch_cuda(0)));
    }

    #[test]
    fn only_cubecl_devices_sort_on_the_host() {
        for spec in test_devices_from(Some("gl"), false).unwrap() {
            let cubecl = matches!(
                spec,
                DeviceSpec::Wgpu(_) | DeviceSpec::WgpuAt(..) | DeviceSpec::Cuda(_)
            );
            let device = spec.init().unwrap();
            assert_eq!(sorts_on_host(&device), cubecl, "{spec}");
            assert_eq!(
                sorts_on_host(&device.autodiff()),
                cubecl,
                "{spec} (autodiff)"
            );
        }
    }

    #[test]
    fn parses_every_documented_name() {
        for (name, feature) in DEVICE_NAMES {
            let spec: DeviceSpec = name.parse().unwrap();
            assert_eq!(spec.feature(), *feature, "{name}");
        }
        assert_eq!("cuda:3".parse::<DeviceSpec>().unwrap(), DeviceSpec::Cuda(3));
        assert_eq!(
            "tch-cuda:1".parse::<DeviceSpec>().unwrap(),
            DeviceSpec::TchCuda(1)
        );
        assert_eq!(" FLEX ".parse::<DeviceSpec>().unwrap(), DeviceSpec::Flex);
    }

    #[test]
    fn errors_name_the_problem() {
        let err = "tpu".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(err.contains("`tpu`"), "{err}");
        let err = "cuda:x".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(err.contains("`x`"), "{err}");
        let err = "flex:1".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(err.contains("flex:1"), "{err}");
    }

    #[test]
    fn wgpu_adapters_parse_and_print() {
        for (name, spec) in [
            (
                "wgpu:1",
                DeviceSpec::WgpuAt(WgpuApi::Auto, WgpuAdapter::Gpu(1)),
            ),
            (
                "wgpu-vulkan:0",
                DeviceSpec::WgpuAt(WgpuApi::Vulkan, WgpuAdapter::Gpu(0)),
            ),
            (
                "wgpu-gl:cpu",
                DeviceSpec::WgpuAt(WgpuApi::Gl, WgpuAdapter::Cpu),
            ),
        ] {
            assert_eq!(name.parse::<DeviceSpec>().unwrap(), spec, "{name}");
            assert_eq!(spec.to_string(), name);
            assert_eq!(spec.feature(), "wgpu");
        }
        let err = "wgpu-gl:gpu".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(err.contains("`gpu` is not"), "{err}");
    }

    #[test]
    fn device_lists_name_the_bad_entry() {
        assert_eq!(
            parse_device_list("cuda:0,cuda:1").unwrap(),
            [DeviceSpec::Cuda(0), DeviceSpec::Cuda(1)]
        );
        assert_eq!(parse_device_list("flex").unwrap(), [DeviceSpec::Flex]);
        assert_eq!(
            parse_device_list("wgpu-vulkan:0, wgpu-vulkan:cpu").unwrap(),
            [
                DeviceSpec::WgpuAt(WgpuApi::Vulkan, WgpuAdapter::Gpu(0)),
                DeviceSpec::WgpuAt(WgpuApi::Vulkan, WgpuAdapter::Cpu)
            ]
        );
        // (list, what the message must hold)
        for (list, want) in [
            (
                "cuda:0,cuda:x",
                "entry 2 (`cuda:x`): bad device index in `cuda:x`",
            ),
            ("cuda:0,,cuda:1", "entry 2 (``): unknown device ``"),
            ("tpu,flex", "entry 1 (`tpu`)"),
            ("flex,tch", "mixes backends: `flex` is flex, `tch` is tch"),
            ("cuda:1,tch-cuda:0", "`cuda:1` is cuda, `tch-cuda:0` is tch"),
            ("flex,flex", "names `flex` twice"),
            (
                "wgpu-gl,wgpu-gl:cpu",
                "two wgpu OpenGL devices (`wgpu-gl`, `wgpu-gl:cpu`)",
            ),
            ("cuda,cuda:0", "names `cuda:0` twice"),
        ] {
            let err = parse_device_list(list).unwrap_err().to_string();
            assert!(err.contains(want), "{list}: {err}");
            assert!(err.contains(&format!("`{list}`")), "{list}: {err}");
        }
        let err = "flex,flex".parse::<DeviceSpec>().unwrap_err().to_string();
        assert!(err.contains("`flex,flex` is a list of devices"), "{err}");
    }

    #[test]
    fn missing_feature_is_named() {
        for spec in [
            DeviceSpec::Cuda(0),
            DeviceSpec::Tch,
            DeviceSpec::Wgpu(WgpuApi::Gl),
        ] {
            if spec.is_compiled() {
                continue;
            }
            let err = spec.init().unwrap_err().to_string();
            assert!(
                err.contains(&format!("--features {}", spec.feature())),
                "{err}"
            );
        }
    }

    #[test]
    fn test_devices_follow_the_features_and_settings() {
        let compiled = compiled_features();
        let listed = test_devices_from(None, false).unwrap();
        assert_eq!(listed.first(), Some(&DeviceSpec::Flex));
        let expect_gl = compiled.contains(&"wgpu");
        assert_eq!(listed.contains(&DeviceSpec::Wgpu(WgpuApi::Gl)), expect_gl);
        assert_eq!(listed.contains(&DeviceSpec::Tch), compiled.contains(&"tch"));
        assert!(
            !listed
                .iter()
                .any(|s| matches!(s, DeviceSpec::Cuda(_) | DeviceSpec::TchCuda(_)))
        );
        let both = test_devices_from(Some("vulkan, gl,vulkan"), false).unwrap();
        let wgpu: Vec<_> = both
            .iter()
            .filter(|s| matches!(s, DeviceSpec::Wgpu(_)))
            .collect();
        if expect_gl {
            assert_eq!(
                wgpu,
                [
                    &DeviceSpec::Wgpu(WgpuApi::Vulkan),
                    &DeviceSpec::Wgpu(WgpuApi::Gl)
                ]
            );
        } else {
            assert!(wgpu.is_empty());
        }
        let none = test_devices_from(Some("none"), false).unwrap();
        assert!(!none.iter().any(|s| matches!(s, DeviceSpec::Wgpu(_))));
        let with_cuda = test_devices_from(None, true).unwrap();
        assert_eq!(
            with_cuda.contains(&DeviceSpec::TchCuda(0)),
            compiled.contains(&"tch")
        );
        assert_eq!(
            with_cuda.contains(&DeviceSpec::Cuda(0)),
            compiled.contains(&"cuda")
        );
        let err = test_devices_from(Some("gl,metal"), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("MEMZOO_WGPU_API=metal"), "{err}");
    }

    #[test]
    fn flex_device_works_and_is_reused() {
        let a = parse_device("flex").unwrap();
        let b = parse_device("flex").unwrap();
        assert_eq!(a, b);
        let t = burn::tensor::Tensor::<1>::from_floats([1.0, 2.0], &a);
        assert_eq!(t.sum().into_scalar::<f32>(), 3.0);
    }
}
