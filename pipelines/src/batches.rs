//! Batch orders.

use ncclean_models::rng::Rng;

/// Split `items` into batches of at most `batch` with sizes as equal as
/// possible, so no batch is left with one or two pairs (whose in-batch
/// losses would be meaningless).
pub fn balanced_chunks(items: &[usize], batch: usize) -> Vec<Vec<usize>> {
    let n = items.len();
    if n == 0 {
        return Vec::new();
    }
    let k = n.div_ceil(batch.max(1));
    let base = n / k;
    let extra = n % k;
    let mut out = Vec::with_capacity(k);
    let mut start = 0;
    for b in 0..k {
        let len = base + usize::from(b < extra);
        out.push(items[start..start + len].to_vec());
        start += len;
    }
    out
}

/// `items` shuffled by `rng` and cut into balanced batches.
pub fn shuffled_batches(items: &[usize], batch: usize, rng: &mut Rng) -> Vec<Vec<usize>> {
    let mut v = items.to_vec();
    rng.shuffle(&mut v);
    balanced_chunks(&v, batch)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_balanced_and_cover_everything() {
        let items: Vec<usize> = (0..10).collect();
        let c = balanced_chunks(&items, 4);
        assert_eq!(c.iter().map(Vec::len).collect::<Vec<_>>(), vec![4, 3, 3]);
        assert_eq!(c.concat(), items);
        assert!(balanced_chunks(&[], 4).is_empty());
        let mut r = Rng::new(1);
        let mut all = shuffled_batches(&items, 3, &mut r).concat();
        all.sort_unstable();
        assert_eq!(all, items);
    }
}
