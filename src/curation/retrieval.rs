//! Cross-modal retrieval metrics (METHODS.md section 6): R@1/5/10 in both
//! directions and rSum, with several captions per image.

use serde::Serialize;

/// Recall at 1, 5 and 10 in both directions, in percent, and their sum.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Retrieval {
    /// Image → text R@1 (an image counts when the best-ranked of its captions is within K).
    pub i2t_r1: f64,
    /// Image → text R@5.
    pub i2t_r5: f64,
    /// Image → text R@10.
    pub i2t_r10: f64,
    /// Text → image R@1.
    pub t2i_r1: f64,
    /// Text → image R@5.
    pub t2i_r5: f64,
    /// Text → image R@10.
    pub t2i_r10: f64,
    /// Sum of the six recalls.
    pub rsum: f64,
    /// Images evaluated.
    pub images: usize,
    /// Captions evaluated.
    pub captions: usize,
}

/// Retrieval metrics from a similarity matrix `sim[i][c]` (row-major,
/// `images × captions`) and the image of each caption, `owner[c]`.
/// Ties count against the query (a tie with a wrong item ranks it first).
pub fn retrieval(sim: &[f32], images: usize, owner: &[usize]) -> Retrieval {
    let captions = owner.len();
    assert_eq!(sim.len(), images * captions, "similarity matrix shape");
    let mut caps_of: Vec<Vec<usize>> = vec![Vec::new(); images];
    for (c, &i) in owner.iter().enumerate() {
        caps_of[i].push(c);
    }
    // Image → text: rank of the best of the image's captions.
    let mut i2t = [0usize; 3];
    let mut evaluated_images = 0;
    for (i, caps) in caps_of.iter().enumerate() {
        if caps.is_empty() {
            continue;
        }
        evaluated_images += 1;
        let row = &sim[i * captions..(i + 1) * captions];
        let best = caps
            .iter()
            .map(|&c| row[c])
            .fold(f32::NEG_INFINITY, f32::max);
        let rank = row
            .iter()
            .enumerate()
            .filter(|&(c, &s)| s >= best && owner[c] != i)
            .count();
        count(&mut i2t, rank);
    }
    // Text → image: rank of the caption's own image.
    let mut t2i = [0usize; 3];
    for (c, &own) in owner.iter().enumerate() {
        let mine = sim[own * captions + c];
        let rank = (0..images)
            .filter(|&i| i != own && sim[i * captions + c] >= mine)
            .count();
        count(&mut t2i, rank);
    }
    let pct = |n: usize, d: usize| 100.0 * n as f64 / d.max(1) as f64;
    let r = [
        pct(i2t[0], evaluated_images),
        pct(i2t[1], evaluated_images),
        pct(i2t[2], evaluated_images),
        pct(t2i[0], captions),
        pct(t2i[1], captions),
        pct(t2i[2], captions),
    ];
    Retrieval {
        i2t_r1: r[0],
        i2t_r5: r[1],
        i2t_r10: r[2],
        t2i_r1: r[3],
        t2i_r5: r[4],
        t2i_r10: r[5],
        rsum: r.iter().sum(),
        images: evaluated_images,
        captions,
    }
}

fn count(hits: &mut [usize; 3], rank: usize) {
    for (h, k) in hits.iter_mut().zip([1, 5, 10]) {
        if rank < k {
            *h += 1;
        }
    }
}

/// `eval --retrieval`: the recalls of the checkpoint at `checkpoint` on
/// the held-out `data` (captions of one image grouped by identical image
/// bytes), and the rows skipped. `device` is said on stderr as
/// `device_line` once the checkpoint is loaded.
pub fn of_checkpoint(
    checkpoint: &std::path::Path,
    data: &[std::path::PathBuf],
    device: (&candle_core::Device, &str),
    images: crate::data::images::ImageLimits,
    cache: &crate::towers::features::CacheRequest,
    rep: &crate::runtime::progress::Reporter,
) -> crate::Result<(Retrieval, usize)> {
    let engine = crate::engine::Engine::load(checkpoint, device.0)?;
    rep.info(device.1);
    let opts = engine.input_options(crate::data::ColumnOptions {
        image_limits: images,
        ..Default::default()
    });
    let input = crate::data::InputSet::open(data, &opts)?;
    let prepared = engine.prepare(&input, &cache.resolve()?, rep)?;
    let r = engine.retrieval(&prepared)?;
    Ok((r, prepared.skipped()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_computed_two_images_three_captions() {
        // images 0, 1; captions 0, 1 belong to image 0, caption 2 to image 1.
        // sim = [[0.9, 0.1, 0.5],
        //        [0.2, 0.8, 0.7]]
        // i2t: image 0's best caption (c0, 0.9) beats c2 (0.5): rank 0 → hit@1.
        //      image 1's caption c2 (0.7) is beaten by c1 (0.8, image 0's): rank 1 → miss@1, hit@5.
        // t2i: c0: image 0 (0.9) vs image 1 (0.2) → rank 0; c1: image 0 (0.1) vs 0.8 → rank 1;
        //      c2: image 1 (0.7) vs image 0 (0.5) → rank 0.
        let sim = [0.9, 0.1, 0.5, 0.2, 0.8, 0.7];
        let r = retrieval(&sim, 2, &[0, 0, 1]);
        assert_eq!(r.i2t_r1, 50.0);
        assert_eq!(r.i2t_r5, 100.0);
        assert!((r.t2i_r1 - 200.0 / 3.0).abs() < 1e-9);
        assert_eq!(r.t2i_r5, 100.0);
        assert!((r.rsum - (50.0 + 100.0 + 100.0 + 200.0 / 3.0 + 100.0 + 100.0)).abs() < 1e-9);
    }

    #[test]
    fn ties_count_against_the_query() {
        let sim = [0.5, 0.5];
        let r = retrieval(&sim, 1, &[0, 0]);
        assert_eq!(
            r.i2t_r1, 100.0,
            "ties among the image's own captions are fine"
        );
        let sim = [0.5, 0.5];
        let r = retrieval(&sim, 2, &[0]);
        assert_eq!(r.t2i_r1, 0.0);
        assert_eq!(r.t2i_r5, 100.0);
    }
}
