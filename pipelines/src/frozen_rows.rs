//! A frozen tower's cached vectors as unit rows on the host, for methods
//! that compare pairs by their pooled tower features inside each batch
//! (ESC's BiCro labels): one length per row, measured once per pass, instead
//! of a gather and an `l2_normalize` of the batch in every shuffle.

use candle_core::Tensor;

/// A frozen tower's vectors (row-major, `dim` wide) with the inverse of
/// every row's length as [`ncclean_models::layers::l2_normalize`] takes it
/// (`1 / √(|x|² + 1e-12)`), found once per pass: a pair's rows are then
/// scaled, not measured, in each of the shuffles that gathers it.
pub struct FrozenRows<'a> {
    values: &'a [f32],
    dim: usize,
    inv_norm: Vec<f32>,
}

impl<'a> FrozenRows<'a> {
    pub fn new(values: &'a [f32], dim: usize) -> FrozenRows<'a> {
        let inv_norm = values
            .chunks_exact(dim.max(1))
            .map(|row| 1.0 / (sum_of_squares(row) + 1e-12).sqrt())
            .collect();
        FrozenRows {
            values,
            dim,
            inv_norm,
        }
    }

    /// Rows `idx` at unit length: the tower's pooled features
    /// ([`ncclean_models::MatchingModel::pooled_images`]), gathered and
    /// scaled in one pass instead of a gather and four tensor ops.
    pub fn unit_rows(
        &self,
        idx: &[usize],
        dev: &candle_core::Device,
    ) -> candle_core::Result<Tensor> {
        let d = self.dim;
        let mut out = Vec::with_capacity(idx.len() * d);
        for &i in idx {
            let (Some(row), Some(&inv)) =
                (self.values.get(i * d..(i + 1) * d), self.inv_norm.get(i))
            else {
                candle_core::bail!("pair {i} has no feature vector of width {d}");
            };
            out.extend(row.iter().map(|x| x * inv));
        }
        Tensor::from_vec(out, (idx.len(), d), dev)
    }
}

/// `Σ x²` in eight independent lanes, which the compiler turns into vector
/// instructions (a single running sum is one long dependency chain).
fn sum_of_squares(x: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail: f32 = chunks.remainder().iter().map(|v| v * v).sum();
    for c in chunks {
        for (l, v) in lanes.iter_mut().zip(c) {
            *l += v * v;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

/// Cosines `x[i] · x[a]` of every row of the unit features `x` with the rows
/// `anchors`: `[B][A]`.
pub fn to_anchors(x: &Tensor, anchors: &[usize]) -> candle_core::Result<Vec<Vec<f32>>> {
    let ids: Vec<u32> = anchors.iter().map(|&a| a as u32).collect();
    let ids = Tensor::from_vec(ids, anchors.len(), x.device())?;
    x.matmul(&x.index_select(&ids, 0)?.t()?)?.to_vec2()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::close;
    use candle_core::Device;
    use ncclean_models::{ImageInputs, TextInputs};

    #[test]
    fn unit_rows_are_the_towers_pooled_features() -> candle_core::Result<()> {
        let mut r = ncclean_models::rng::Rng::new(5);
        let mut v = |n: usize| (0..n).map(|_| r.normal() as f32).collect::<Vec<_>>();
        let data = crate::test_support::embedding_pairs(v(300 * 6), v(300 * 6), 6);
        let mcfg = crate::test_support::precomputed_model(6, 4, 8);
        let net = crate::net::Net::new(&mcfg, 0, &Device::Cpu, 1e-3, 2.0)?;
        let idx = [3, 0, 299, 7];
        let (pi, pt) = net.batch_pooled(&data, &idx)?;
        let (ImageInputs::Embeddings { data: img, .. }, TextInputs::Embeddings { data: txt, .. }) =
            (&data.images, &data.texts)
        else {
            unreachable!("embedding pairs")
        };
        let flat = |t: Tensor| t.flatten_all()?.to_vec1::<f32>();
        let (img, txt) = (FrozenRows::new(img, 6), FrozenRows::new(txt, 6));
        close(
            &flat(img.unit_rows(&idx, &Device::Cpu)?)?,
            &flat(pi.clone())?,
        );
        close(&flat(txt.unit_rows(&idx, &Device::Cpu)?)?, &flat(pt)?);
        assert!(txt.unit_rows(&[300], &Device::Cpu).is_err());
        // Cosines with anchors 1 and 3 of the batch are columns of the Gram matrix.
        let gram = pi.matmul(&pi.t()?)?.to_vec2::<f32>()?;
        let cols = to_anchors(&pi, &[1, 3])?;
        for (row, g) in cols.iter().zip(&gram) {
            close(row, &[g[1], g[3]]);
        }
        // Eight lanes and a tail: 1 + 4 + … + 100 = 385.
        let x: Vec<f32> = (1..=10).map(|v| v as f32).collect();
        assert_eq!(sum_of_squares(&x), 385.0);
        Ok(())
    }
}
