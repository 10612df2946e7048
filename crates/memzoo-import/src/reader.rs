//! Reading a checkpoint file into a name → tensor map with Burn's own readers: safetensors, and
//! PyTorch's `torch.save` files (`.bin`, `.pt`, `.pth`) parsed by burn-store's pickle *reader*,
//! which interprets the pickle opcodes as data and never runs code from the file.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

use burn::tensor::{DType, Device, Int, Tensor, TensorData};
use burn_store::{ModuleStore, PytorchStore, SafetensorsStore};

use crate::error::ImportError;

/// The tensors of one checkpoint by name, taken out one at a time by the importer: what is
/// left at the end is an error ([`TensorMap::finish`]), so no tensor is silently dropped.
#[derive(Debug, Default)]
pub struct TensorMap {
    tensors: BTreeMap<String, TensorData>,
    source: PathBuf,
}

impl TensorMap {
    /// Reads `path`: `*.safetensors` with burn-store's `SafetensorsStore`, anything else as a
    /// PyTorch file with its `PytorchStore` (no pickle code is executed).
    pub fn read(path: &Path) -> Result<Self, ImportError> {
        let read_err = |message: String| ImportError::Read {
            path: path.to_path_buf(),
            message,
        };
        if !path.is_file() {
            return Err(read_err("no such file".into()));
        }
        // By its name, or by its content (a safetensors file saved as `state_dict.pt`): an
        // 8-byte little-endian header length, then the JSON header.
        let is_safetensors =
            path.extension().is_some_and(|e| e == "safetensors") || looks_like_safetensors(path);
        let packed = if is_safetensors {
            SafetensorsStore::from_file(path)
                .get_all_tensors()
                .map_err(|e| read_err(e.to_string()))?
                .clone()
        } else {
            // Names as the file has them: no renumbering of `Sequential` indices
            // (`pos_ff.CoreNet.3` stays 3).
            PytorchStore::from_file(path)
                .map_indices_contiguous(false)
                .get_all_tensors()
                .map_err(|e| read_err(e.to_string()))?
                .clone()
        };
        let mut tensors = BTreeMap::new();
        for (name, t) in packed {
            let data = burn_store::bridge::to_data(&t)
                .map_err(|e| read_err(format!("tensor {name}: {e}")))?;
            tensors.insert(name, data);
        }
        Ok(Self {
            tensors,
            source: path.to_path_buf(),
        })
    }

    /// A map from tensors in hand (tests, other sources).
    pub fn from_tensors(tensors: BTreeMap<String, TensorData>, source: PathBuf) -> Self {
        Self { tensors, source }
    }

    /// The file the tensors came from.
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Takes `name` out of the map as it is (no shape check): for renaming.
    pub(crate) fn remove(&mut self, name: &str) -> Option<TensorData> {
        self.tensors.remove(name)
    }

    /// Puts `data` in the map under `name` (a renamed tensor).
    pub(crate) fn insert(&mut self, name: String, data: TensorData) {
        self.tensors.insert(name, data);
    }

    /// Whether `name` is (still) in the map.
    pub fn contains(&self, name: &str) -> bool {
        self.tensors.contains_key(name)
    }

    /// The tensor `name`, left in the map.
    pub fn get(&self, name: &str) -> Option<&TensorData> {
        self.tensors.get(name)
    }

    /// The names still in the map.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Takes `name` out of the map, checking its shape; an error names a missing or misshaped
    /// tensor.
    pub fn take(&mut self, name: &str, shape: &[usize]) -> Result<TensorData, ImportError> {
        let data = self
            .tensors
            .remove(name)
            .ok_or_else(|| ImportError::Missing {
                name: name.to_string(),
                expected: shape.to_vec(),
            })?;
        if data.shape().as_slice() != shape {
            return Err(ImportError::Shape {
                name: name.to_string(),
                found: data.shape().to_vec(),
                expected: shape.to_vec(),
            });
        }
        Ok(data)
    }

    /// Takes `name` if present (a tensor some checkpoints hold and others do not, e.g. a tied
    /// copy), checking its shape.
    pub fn take_optional(
        &mut self,
        name: &str,
        shape: &[usize],
    ) -> Result<Option<TensorData>, ImportError> {
        if self.contains(name) {
            self.take(name, shape).map(Some)
        } else {
            Ok(None)
        }
    }

    /// Takes a float tensor as `f32` on `device`.
    pub fn float<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        device: &Device,
    ) -> Result<Tensor<D>, ImportError> {
        let data = self.take(name, &shape)?;
        Ok(Tensor::from_data(float_data(name, data)?, device))
    }

    /// Takes an integer tensor on `device`.
    pub fn int<const D: usize>(
        &mut self,
        name: &str,
        shape: [usize; D],
        device: &Device,
    ) -> Result<Tensor<D, Int>, ImportError> {
        let data = self.take(name, &shape)?;
        match data.dtype() {
            DType::I64 | DType::I32 | DType::I16 | DType::I8 | DType::U8 => {
                Ok(Tensor::from_data(data.convert::<i64>(), device))
            }
            other => Err(ImportError::Value {
                name: name.to_string(),
                message: format!("expected an integer tensor, found {other:?}"),
            }),
        }
    }

    /// Succeeds when every tensor has been taken; else names the ones left.
    pub fn finish(self) -> Result<(), ImportError> {
        if self.tensors.is_empty() {
            Ok(())
        } else {
            Err(ImportError::Unknown {
                names: self.tensors.into_keys().collect(),
            })
        }
    }
}

/// Whether the file starts as a safetensors file does: a little-endian `u64` header length
/// that fits in the file, then `{`.
fn looks_like_safetensors(path: &Path) -> bool {
    let mut head = [0u8; 9];
    let Ok(mut file) = std::fs::File::open(path) else {
        return false;
    };
    if file.read_exact(&mut head).is_err() {
        return false;
    }
    let len = u64::from_le_bytes(head[..8].try_into().expect("8 bytes"));
    let size = file.metadata().map_or(0, |m| m.len());
    head[8] == b'{' && len.saturating_add(8) <= size
}

/// The largest `config.json` read.
const CONFIG_LIMIT: u64 = 16 << 20;

/// Whether `path` can be a checkpoint's small JSON file: a regular file (not a FIFO or a device
/// such as `/dev/zero`) of at most 16 MiB; the error names the file and what it is instead.
pub fn check_config_file(path: &Path) -> Result<(), ImportError> {
    let err = |message: String| ImportError::Read {
        path: path.to_path_buf(),
        message,
    };
    let meta = std::fs::metadata(path).map_err(|e| err(e.to_string()))?;
    if !meta.is_file() {
        return Err(err(
            "not a regular file (a FIFO, a device or a directory): give a file".into(),
        ));
    }
    if meta.len() > CONFIG_LIMIT {
        return Err(err(format!(
            "holds more than {CONFIG_LIMIT} bytes: not a config"
        )));
    }
    Ok(())
}

/// The text of a checkpoint's small JSON file (`config.json`): a regular file (not a FIFO or
/// a device such as `/dev/zero`) of at most 16 MiB, read with that bound.
pub fn read_config_text(path: &Path) -> Result<String, ImportError> {
    let err = |message: String| ImportError::Read {
        path: path.to_path_buf(),
        message,
    };
    check_config_file(path)?;
    let too_large = || {
        err(format!(
            "holds more than {CONFIG_LIMIT} bytes: not a config"
        ))
    };
    let mut bytes = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(CONFIG_LIMIT + 1).read_to_end(&mut bytes))
        .map_err(|e| err(e.to_string()))?;
    if bytes.len() as u64 > CONFIG_LIMIT {
        return Err(too_large());
    }
    String::from_utf8(bytes).map_err(|e| err(format!("not UTF-8 text: {e}")))
}

/// `data` as `f32`, if it is a float tensor whose every value is finite (a NaN or an infinity
/// is an error naming the tensor, the first such value and its index, and how many there are;
/// as is a value beyond `f32`'s range in an `f64` tensor).
pub fn float_data(name: &str, data: TensorData) -> Result<TensorData, ImportError> {
    let data = match data.dtype() {
        DType::F32 => data,
        DType::F64 | DType::F16 | DType::BF16 => data.convert::<f32>(),
        other => {
            return Err(ImportError::Value {
                name: name.to_string(),
                message: format!("expected a float tensor, found {other:?}"),
            });
        }
    };
    let values = data.as_slice::<f32>().map_err(|e| ImportError::Value {
        name: name.to_string(),
        message: format!("cannot read its values: {e:?}"),
    })?;
    if let Some((at, bad)) = values.iter().enumerate().find(|(_, v)| !v.is_finite()) {
        let count = values.iter().filter(|v| !v.is_finite()).count();
        return Err(ImportError::Value {
            name: name.to_string(),
            message: format!(
                "holds {bad} at index {at} ({count} of its {} values are not finite): the \
                 checkpoint's weights are damaged or diverged",
                values.len()
            ),
        });
    }
    Ok(data)
}

/// Writes `tensors` as an f32 safetensors file with PyTorch's metadata (`format = pt`), as
/// `save_pretrained` and `safetensors.torch.save_file` write them.
pub fn write_safetensors(
    path: &Path,
    tensors: BTreeMap<String, TensorData>,
) -> Result<(), ImportError> {
    let write_err = |message: String| ImportError::Read {
        path: path.to_path_buf(),
        message: format!("cannot write: {message}"),
    };
    let data: Vec<(String, Vec<usize>, Vec<u8>)> = tensors
        .into_iter()
        .map(|(name, t)| {
            let shape = t.shape().to_vec();
            let values =
                t.convert::<f32>()
                    .try_to_vec::<f32>()
                    .map_err(|e| ImportError::Value {
                        name: name.clone(),
                        message: format!("not readable as f32: {e:?}"),
                    })?;
            let bytes = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            Ok((name, shape, bytes))
        })
        .collect::<Result<_, ImportError>>()?;
    let views = data
        .iter()
        .map(|(name, shape, bytes)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| write_err(e.to_string()))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let metadata = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
    safetensors::serialize_to_file(views, Some(metadata), path)
        .map_err(|e| write_err(e.to_string()))
}
