//! `when_full = "reset"`: a memory that empties a row instead of evicting its oldest pairs
//! (memorizing-transformers-pytorch 0.4.1's faiss wrapper, `KNN(cap_num_entries = True)`).
//!
//! An add that would take a row above `max_memories` pairs first empties the row, which then
//! holds only the new pairs (their last `max_memories`). As in the package, those pairs are
//! not found by the *next* search of the row: its `reset` marks the faiss index untrained and
//! its `search` returns nothing for an untrained index; the next add trains it again. The
//! wrapped index never evicts (a row never exceeds its capacity here).

use std::path::Path;

use burn::tensor::{Bool, Tensor, TensorData};

use crate::error::MemoryError;
use crate::persist::Snapshot;
use crate::{IndexKind, KnnIndex, KnnMemoryConfig, Retrieved, RowState};

/// A [`KnnIndex`] that resets full rows (see the module docs).
#[derive(Debug)]
pub struct ResetWhenFull {
    inner: Box<dyn KnnIndex>,
    /// Per row: its last add reset it, so the next search sees nothing.
    hidden: Vec<bool>,
}

impl ResetWhenFull {
    /// Wraps `inner` (any backend).
    pub fn new(inner: Box<dyn KnnIndex>) -> Self {
        let hidden = vec![false; inner.batch()];
        Self { inner, hidden }
    }
}

impl KnnIndex for ResetWhenFull {
    fn kind(&self) -> IndexKind {
        self.inner.kind()
    }

    fn config(&self) -> &KnnMemoryConfig {
        self.inner.config()
    }

    fn batch(&self) -> usize {
        self.inner.batch()
    }

    fn add(&mut self, keys: Tensor<4>, values: Tensor<4>) -> Result<(), MemoryError> {
        let n = keys.dims()[1];
        let cap = self.capacity();
        let full: Vec<usize> = (0..self.batch())
            .filter(|&b| self.inner.len(b) + n > cap)
            .collect();
        if !full.is_empty() {
            self.inner.clear(&full)?;
        }
        for (b, h) in self.hidden.iter_mut().enumerate() {
            *h = full.contains(&b);
        }
        self.inner.add(keys, values)
    }

    fn search(&self, queries: Tensor<4>, k: usize) -> Result<Retrieved, MemoryError> {
        let found = self.inner.search(queries, k)?;
        if !self.hidden.iter().any(|&h| h) {
            return Ok(found);
        }
        // Rows reset by their last add find nothing: every slot hidden, keys and values zero.
        let [b, t, h, kk] = found.mask.dims();
        let device = found.mask.device();
        let rows: Tensor<4, Bool> =
            Tensor::from_data(TensorData::new(self.hidden.clone(), [b, 1, 1, 1]), &device);
        let mask = found.mask.bool_or(rows.clone().expand([b, t, h, kk]));
        let zero5 = rows.unsqueeze_dim::<5>(4);
        let shape = found.keys.dims();
        Ok(Retrieved {
            keys: found.keys.mask_fill(zero5.clone().expand(shape), 0.0),
            values: found.values.mask_fill(zero5.expand(shape), 0.0),
            mask,
        })
    }

    fn clear(&mut self, rows: &[usize]) -> Result<(), MemoryError> {
        self.inner.clear(rows)?;
        for &r in rows {
            if let Some(h) = self.hidden.get_mut(r) {
                *h = false;
            }
        }
        Ok(())
    }

    fn rows(&self) -> &[RowState] {
        self.inner.rows()
    }

    fn snapshot(&self) -> Result<Snapshot, MemoryError> {
        self.inner.snapshot()
    }

    fn save_extra(&self, dir: &Path) -> Result<Vec<u32>, MemoryError> {
        self.inner.save_extra(dir)
    }
}
