//! Detection metrics: how well a per-pair score finds the mismatched pairs
//! (METHODS.md section 6).
//!
//! The definitions follow scikit-learn (`roc_auc_score`,
//! `average_precision_score`, `precision_recall_fscore_support` with
//! `zero_division=0`) so that numbers reported by ncclean can be compared with
//! the papers' own evaluation scripts.
//!
//! Scores are ranked in O(n log n). A NaN score is a bug in the caller, but
//! rather than panic in the middle of a report it is ranked as −∞: lowest of
//! all, tied with −∞ and with other NaNs.

/// AUROC of `scores` for the positive class (`labels[i] == true`), ties
/// counted half (Mann–Whitney). None if one class is absent.
///
/// # Panics
/// If `scores` and `labels` differ in length (a caller bug, never data).
pub fn auroc(scores: &[f64], labels: &[bool]) -> Option<f64> {
    assert_eq!(scores.len(), labels.len(), "auroc: scores vs labels");
    let positives = labels.iter().filter(|&&l| l).count();
    let negatives = labels.len() - positives;
    if positives == 0 || negatives == 0 {
        return None;
    }
    // Mann–Whitney U from the rank sum of the positives; tied scores share
    // their mean rank, which is what counts a tied pair as half.
    let mut positive_rank_sum = 0.0;
    for group in tie_groups(scores, labels, Direction::Ascending) {
        // Ranks are 1-based: the group covers ranks start+1 ..= start+len.
        let mean_rank = group.start as f64 + (group.len as f64 + 1.0) / 2.0;
        positive_rank_sum += mean_rank * group.positives as f64;
    }
    let p = positives as f64;
    let u = positive_rank_sum - p * (p + 1.0) / 2.0;
    Some(u / (p * negatives as f64))
}

/// Average precision as scikit-learn's average_precision_score defines it
/// (step-wise sum over thresholds of (R_n − R_{n−1}) P_n, ties grouped). None
/// if no positives.
///
/// # Panics
/// If `scores` and `labels` differ in length (a caller bug, never data).
pub fn average_precision(scores: &[f64], labels: &[bool]) -> Option<f64> {
    assert_eq!(
        scores.len(),
        labels.len(),
        "average_precision: scores vs labels"
    );
    let positives = labels.iter().filter(|&&l| l).count();
    if positives == 0 {
        return None;
    }
    // Lower the threshold one distinct score at a time; each step admits a
    // whole tie group and adds its recall gain times the precision after it.
    let mut tp = 0usize;
    let mut seen = 0usize;
    let mut ap = 0.0;
    for group in tie_groups(scores, labels, Direction::Descending) {
        tp += group.positives;
        seen += group.len;
        let recall_gain = group.positives as f64 / positives as f64;
        ap += recall_gain * (tp as f64 / seen as f64);
    }
    Some(ap)
}

/// Precision, recall and F1 of one class, with the confusion counts behind them.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Prf {
    /// tp / (tp + fp); 0 when nothing was predicted positive.
    pub precision: f64,
    /// tp / (tp + fn); 0 when there are no true positives to find.
    pub recall: f64,
    /// Harmonic mean of precision and recall; 0 when both are 0.
    pub f1: f64,
    /// Predicted positive and truly positive.
    pub tp: usize,
    /// Predicted positive but truly negative.
    pub fp: usize,
    /// Truly positive but not predicted (`fn` is a keyword).
    pub fn_: usize,
}

/// Precision, recall and F1 of predicted positives against true positives (0
/// where undefined, like sklearn's zero_division=0).
///
/// # Panics
/// If `predicted` and `truth` differ in length (a caller bug, never data).
pub fn precision_recall_f1(predicted: &[bool], truth: &[bool]) -> Prf {
    assert_eq!(predicted.len(), truth.len(), "precision_recall_f1: lengths");
    let mut tp = 0;
    let mut fp = 0;
    let mut fn_ = 0;
    for (&p, &t) in predicted.iter().zip(truth) {
        match (p, t) {
            (true, true) => tp += 1,
            (true, false) => fp += 1,
            (false, true) => fn_ += 1,
            (false, false) => {}
        }
    }
    Prf {
        precision: ratio(tp, tp + fp),
        recall: ratio(tp, tp + fn_),
        // 2PR/(P+R) simplifies to this, which is also 0 exactly when tp is.
        f1: ratio(2 * tp, 2 * tp + fp + fn_),
        tp,
        fp,
        fn_,
    }
}

/// Bins of [`calibration_error`]: equal-width tenths of [0, 1].
pub const CALIBRATION_BINS: usize = 10;

/// Expected calibration error of probabilities `probs` that an item is
/// positive: the items fall into [`CALIBRATION_BINS`] equal-width bins of
/// their probability (1 in the last), and each bin's |mean probability −
/// positive share| counts by its share of the items. 0 for probabilities
/// that say exactly how often they are right; None without items.
/// Probabilities outside [0, 1] (or NaN) go to the nearest bin.
///
/// # Panics
/// If `probs` and `positive` differ in length (a caller bug, never data).
pub fn calibration_error(probs: &[f64], positive: &[bool]) -> Option<f64> {
    assert_eq!(probs.len(), positive.len(), "calibration_error: lengths");
    if probs.is_empty() {
        return None;
    }
    let mut count = [0usize; CALIBRATION_BINS];
    let mut sum = [0.0f64; CALIBRATION_BINS];
    let mut hits = [0usize; CALIBRATION_BINS];
    for (&p, &t) in probs.iter().zip(positive) {
        // `as usize` saturates: NaN and negatives land in bin 0.
        let b = ((p * CALIBRATION_BINS as f64) as usize).min(CALIBRATION_BINS - 1);
        count[b] += 1;
        sum[b] += p;
        hits[b] += usize::from(t);
    }
    let n = probs.len() as f64;
    Some(
        (0..CALIBRATION_BINS)
            .filter(|&b| count[b] > 0)
            .map(|b| (sum[b] - hits[b] as f64).abs() / n)
            .sum(),
    )
}

/// Kendall's τb of `x` and `y` (the tie-corrected form scipy's
/// `kendalltau` computes by default), in O(n log n) (Knight 1966): sort by
/// `(x, y)`, then count the exchanges a merge sort by `y` makes. None with
/// fewer than two items or when either side is constant.
///
/// # Panics
/// If `x` and `y` differ in length (a caller bug, never data).
pub fn kendall_tau_b(x: &[f64], y: &[f64]) -> Option<f64> {
    assert_eq!(x.len(), y.len(), "kendall_tau_b: lengths");
    let n = x.len();
    if n < 2 {
        return None;
    }
    let mut items: Vec<(f64, f64)> = x
        .iter()
        .zip(y)
        // + 0.0 turns -0.0 into 0.0: total_cmp would part the tie.
        .map(|(&a, &b)| (rank_key(a) + 0.0, rank_key(b) + 0.0))
        .collect();
    items.sort_unstable_by(|a, b| a.0.total_cmp(&b.0).then(a.1.total_cmp(&b.1)));
    let pairs = |t: u64| t * t.saturating_sub(1) / 2;
    // Ties in x, and joint ties in (x, y), over the (x, y)-sorted items.
    let (mut tied_x, mut tied_xy) = (0u64, 0u64);
    let (mut run_x, mut run_xy) = (1u64, 1u64);
    for i in 1..n {
        if items[i].0 == items[i - 1].0 {
            run_x += 1;
            if items[i].1 == items[i - 1].1 {
                run_xy += 1;
            } else {
                tied_xy += pairs(run_xy);
                run_xy = 1;
            }
        } else {
            tied_x += pairs(run_x);
            tied_xy += pairs(run_xy);
            run_x = 1;
            run_xy = 1;
        }
    }
    tied_x += pairs(run_x);
    tied_xy += pairs(run_xy);
    let mut ys: Vec<f64> = items.iter().map(|p| p.1).collect();
    let swaps = merge_count(&mut ys);
    let mut tied_y = 0u64;
    let mut run_y = 1u64;
    for i in 1..n {
        if ys[i] == ys[i - 1] {
            run_y += 1;
        } else {
            tied_y += pairs(run_y);
            run_y = 1;
        }
    }
    tied_y += pairs(run_y);
    let total = pairs(n as u64);
    let (dx, dy) = (total - tied_x, total - tied_y);
    if dx == 0 || dy == 0 {
        return None;
    }
    // Concordant minus discordant: of the pairs untied in both, those a
    // sort by y had to exchange are the discordant ones.
    let s = total as f64 - tied_x as f64 - tied_y as f64 + tied_xy as f64 - 2.0 * swaps as f64;
    Some(s / ((dx as f64) * (dy as f64)).sqrt())
}

/// Sort `v` ascending (a stable merge sort) and return how many pairs it
/// found out of order: the exchanges of a bubble sort.
fn merge_count(v: &mut [f64]) -> u64 {
    let n = v.len();
    let mut buf = vec![0.0; n];
    let mut swaps = 0u64;
    let mut width = 1;
    while width < n {
        let mut lo = 0;
        while lo < n {
            let mid = (lo + width).min(n);
            let hi = (lo + 2 * width).min(n);
            let (mut i, mut j, mut k) = (lo, mid, lo);
            while i < mid && j < hi {
                // Equal values are not out of order: take the left one.
                if v[j] < v[i] {
                    swaps += (mid - i) as u64;
                    buf[k] = v[j];
                    j += 1;
                } else {
                    buf[k] = v[i];
                    i += 1;
                }
                k += 1;
            }
            buf[k..k + (mid - i)].copy_from_slice(&v[i..mid]);
            k += mid - i;
            buf[k..k + (hi - j)].copy_from_slice(&v[j..hi]);
            lo = hi;
        }
        v.copy_from_slice(&buf);
        width *= 2;
    }
    swaps
}

/// Spearman's rank correlation: Pearson's correlation of the average ranks
/// (ties share their mean rank), as scipy's `spearmanr`. None with fewer
/// than two items or when either side is constant.
///
/// # Panics
/// If `x` and `y` differ in length (a caller bug, never data).
pub fn spearman(x: &[f64], y: &[f64]) -> Option<f64> {
    assert_eq!(x.len(), y.len(), "spearman: lengths");
    if x.len() < 2 {
        return None;
    }
    pearson(&average_ranks(x), &average_ranks(y))
}

/// 1-based ranks, ties sharing their mean rank; NaN ranks lowest.
pub fn average_ranks(v: &[f64]) -> Vec<f64> {
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_unstable_by(|&a, &b| rank_key(v[a]).total_cmp(&rank_key(v[b])));
    let mut ranks = vec![0.0; v.len()];
    let mut start = 0;
    while start < idx.len() {
        let mut end = start + 1;
        while end < idx.len() && rank_key(v[idx[end]]) == rank_key(v[idx[start]]) {
            end += 1;
        }
        let mean = (start + end + 1) as f64 / 2.0;
        for &i in &idx[start..end] {
            ranks[i] = mean;
        }
        start = end;
    }
    ranks
}

/// Pearson's correlation; None when either side is constant.
fn pearson(x: &[f64], y: &[f64]) -> Option<f64> {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        let (da, db) = (a - mx, b - my);
        sxy += da * db;
        sxx += da * da;
        syy += db * db;
    }
    if sxx == 0.0 || syy == 0.0 {
        return None;
    }
    Some(sxy / (sxx * syy).sqrt())
}

/// num/den, or 0 for 0/0 (sklearn's `zero_division=0`).
fn ratio(num: usize, den: usize) -> f64 {
    if den == 0 {
        0.0
    } else {
        num as f64 / den as f64
    }
}

/// A run of equal scores in sorted order.
#[derive(Debug, PartialEq)]
struct TieGroup {
    /// Items before this group in the sorted order.
    start: usize,
    /// Items in the group.
    len: usize,
    /// Positive items in the group.
    positives: usize,
}

#[derive(Clone, Copy)]
enum Direction {
    Ascending,
    Descending,
}

/// NaN ranks as −∞ (see the module docs).
fn rank_key(score: f64) -> f64 {
    if score.is_nan() {
        f64::NEG_INFINITY
    } else {
        score
    }
}

/// Sort by score and cut into runs of equal scores.
fn tie_groups(scores: &[f64], labels: &[bool], direction: Direction) -> Vec<TieGroup> {
    let mut items: Vec<(f64, bool)> = scores
        .iter()
        .map(|&s| rank_key(s))
        .zip(labels.iter().copied())
        .collect();
    // Keys hold no NaN, so total order is numeric order, except that it puts
    // −0.0 just before 0.0; they stay adjacent and are grouped below.
    match direction {
        Direction::Ascending => items.sort_unstable_by(|a, b| a.0.total_cmp(&b.0)),
        Direction::Descending => items.sort_unstable_by(|a, b| b.0.total_cmp(&a.0)),
    }
    let mut groups: Vec<TieGroup> = Vec::new();
    let mut previous: Option<f64> = None;
    for (i, &(score, positive)) in items.iter().enumerate() {
        // -0.0 == 0.0 and -inf == -inf, so they tie as they should.
        if previous != Some(score) {
            groups.push(TieGroup {
                start: i,
                len: 0,
                positives: 0,
            });
            previous = Some(score);
        }
        if let Some(group) = groups.last_mut() {
            group.len += 1;
            group.positives += usize::from(positive);
        }
    }
    groups
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    const REF_TOL: f64 = 1e-9;

    #[test]
    fn auroc_hand_computed_with_ties() {
        // scores 0.1 0.4 0.4 0.8 0.8 0.9, labels F T F T F T.
        // Positive/negative pairs (3 × 3 = 9), counting ties as ½:
        //   pos 0.4 vs neg {0.1, 0.4, 0.8}: 1 + ½ + 0 = 1.5
        //   pos 0.8 vs neg {0.1, 0.4, 0.8}: 1 + 1 + ½ = 2.5
        //   pos 0.9 vs all negatives:                   3
        // AUROC = 7/9.
        let scores = [0.1, 0.4, 0.4, 0.8, 0.8, 0.9];
        let labels = [false, true, false, true, false, true];
        let got = auroc(&scores, &labels).expect("both classes");
        assert!((got - 7.0 / 9.0).abs() < 1e-15, "{got}");
    }

    #[test]
    fn auroc_extremes_and_missing_class() {
        let scores = [0.1, 0.2, 0.3, 0.4];
        assert_eq!(auroc(&scores, &[false, false, true, true]), Some(1.0));
        assert_eq!(auroc(&scores, &[true, true, false, false]), Some(0.0));
        // All tied: every pair is a tie, so exactly ½.
        assert_eq!(auroc(&[0.5; 4], &[true, false, true, false]), Some(0.5));
        assert_eq!(auroc(&scores, &[true; 4]), None);
        assert_eq!(auroc(&scores, &[false; 4]), None);
        assert_eq!(auroc(&[], &[]), None);
    }

    #[test]
    fn nan_scores_rank_lowest() {
        // NaN acts as −∞: the NaN positive loses to every negative.
        let got = auroc(&[f64::NAN, 0.2, 0.3], &[true, false, false]);
        assert_eq!(got, Some(0.0));
        // And ties with −∞.
        let got = auroc(&[f64::NAN, f64::NEG_INFINITY], &[true, false]);
        assert_eq!(got, Some(0.5));
        let ap = average_precision(&[f64::NAN, 0.2, 0.3], &[true, false, false]);
        // Found last, at precision 1/3.
        assert_eq!(ap, Some(1.0 / 3.0));
    }

    #[test]
    fn average_precision_hand_computed_with_ties() {
        // Same data as the AUROC case, 3 positives. Thresholds high to low:
        //   0.9        -> tp 1, seen 1: ΔR = 1/3, P = 1
        //   0.8 (×2)   -> tp 2, seen 3: ΔR = 1/3, P = 2/3
        //   0.4 (×2)   -> tp 3, seen 5: ΔR = 1/3, P = 3/5
        //   0.1        -> tp 3, seen 6: ΔR = 0
        // AP = (1 + 2/3 + 3/5)/3 = (15 + 10 + 9)/45 = 34/45.
        let scores = [0.1, 0.4, 0.4, 0.8, 0.8, 0.9];
        let labels = [false, true, false, true, false, true];
        let got = average_precision(&scores, &labels).expect("has positives");
        assert!((got - 34.0 / 45.0).abs() < 1e-15, "{got}");
    }

    #[test]
    fn average_precision_edge_cases() {
        assert_eq!(average_precision(&[0.3, 0.1], &[false, false]), None);
        assert_eq!(average_precision(&[], &[]), None);
        // Only positives: precision is 1 at every threshold.
        assert_eq!(average_precision(&[0.3, 0.1], &[true, true]), Some(1.0));
        // One tie group holding everything: P = 2/4 at the only threshold.
        let all_tied = average_precision(&[0.7; 4], &[true, false, true, false]);
        assert_eq!(all_tied, Some(0.5));
    }

    #[test]
    fn prf_hand_computed() {
        // predicted T T T F F, truth T F T T F: tp 2, fp 1, fn 1.
        // P = 2/3, R = 2/3, F1 = 2·2/(2·2 + 1 + 1) = 2/3.
        let prf = precision_recall_f1(
            &[true, true, true, false, false],
            &[true, false, true, true, false],
        );
        assert_eq!((prf.tp, prf.fp, prf.fn_), (2, 1, 1));
        assert!((prf.precision - 2.0 / 3.0).abs() < 1e-15);
        assert!((prf.recall - 2.0 / 3.0).abs() < 1e-15);
        assert!((prf.f1 - 2.0 / 3.0).abs() < 1e-15);

        // predicted T F F F, truth T T T F: P = 1, R = 1/3, F1 = 2/(2+0+2) = ½.
        let prf = precision_recall_f1(&[true, false, false, false], &[true, true, true, false]);
        assert_eq!((prf.precision, prf.f1), (1.0, 0.5));
        assert!((prf.recall - 1.0 / 3.0).abs() < 1e-15);
    }

    #[test]
    fn prf_zero_division_is_zero() {
        // Nothing predicted: precision 0/0 -> 0.
        let prf = precision_recall_f1(&[false, false], &[true, false]);
        assert_eq!((prf.precision, prf.recall, prf.f1), (0.0, 0.0, 0.0));
        // Nothing to find: recall 0/0 -> 0.
        let prf = precision_recall_f1(&[true, false], &[false, false]);
        assert_eq!((prf.precision, prf.recall, prf.f1), (0.0, 0.0, 0.0));
        let prf = precision_recall_f1(&[], &[]);
        assert_eq!(
            (prf.precision, prf.recall, prf.f1, prf.tp),
            (0.0, 0.0, 0.0, 0)
        );
    }

    #[test]
    fn tie_groups_cut_equal_runs() {
        let groups = tie_groups(
            &[0.2, 0.1, 0.2, -0.0, 0.0],
            &[true, false, true, true, false],
            Direction::Descending,
        );
        let want = [
            TieGroup {
                start: 0,
                len: 2,
                positives: 2,
            },
            TieGroup {
                start: 2,
                len: 1,
                positives: 0,
            },
            TieGroup {
                start: 3,
                len: 2,
                positives: 1,
            },
        ];
        assert_eq!(groups, want);
    }

    #[derive(Deserialize)]
    struct Case {
        name: String,
        scores: Vec<f64>,
        labels: Vec<bool>,
        predicted: Vec<bool>,
        roc_auc: f64,
        average_precision: f64,
        precision: f64,
        recall: f64,
        f1: f64,
    }

    #[test]
    fn matches_scikit_learn() {
        // Written by scripts/reference/metrics_vectors.py.
        let text = include_str!("testdata/metrics_vectors.json");
        let cases: Vec<Case> = serde_json::from_str(text).expect("reference vectors parse");
        assert!(cases.len() >= 4);
        for c in cases {
            let name = &c.name;
            let roc = auroc(&c.scores, &c.labels).expect("both classes present");
            assert!(
                (roc - c.roc_auc).abs() < REF_TOL,
                "{name}: auroc {roc} vs {}",
                c.roc_auc
            );
            let ap = average_precision(&c.scores, &c.labels).expect("has positives");
            let want = c.average_precision;
            assert!((ap - want).abs() < REF_TOL, "{name}: ap {ap} vs {want}");
            let prf = precision_recall_f1(&c.predicted, &c.labels);
            for (got, want, what) in [
                (prf.precision, c.precision, "precision"),
                (prf.recall, c.recall, "recall"),
                (prf.f1, c.f1, "f1"),
            ] {
                assert!(
                    (got - want).abs() < REF_TOL,
                    "{name}: {what} {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn calibration_error_weighs_each_bins_gap_by_its_share() {
        // Bin [0.9, 1]: 0.95, 1.0 (both positive): mean 0.975, share 1,
        // gap 0.025. Bin [0.1, 0.2): 0.1, 0.1 (one positive): mean 0.1,
        // share 0.5, gap 0.4. Each holds half: (0.025 + 0.4) / 2.
        let e = calibration_error(&[0.95, 1.0, 0.1, 0.1], &[true, true, true, false]).unwrap();
        assert!((e - 0.2125).abs() < 1e-12, "{e}");
        // Right as often as they say: 0.5 with one of two positive.
        assert_eq!(calibration_error(&[0.5, 0.5], &[true, false]), Some(0.0));
        // Sure and wrong: the whole gap.
        assert_eq!(calibration_error(&[0.0, 1.0], &[true, false]), Some(1.0));
        assert_eq!(calibration_error(&[], &[]), None);
    }

    #[test]
    fn kendall_and_spearman_hand_computed() {
        // x = (1, 2, 3, 4), y = (1, 3, 2, 4): of the 6 pairs only (2, 3)
        // is discordant: tau = (5 - 1) / 6. Rank differences (0, 1, 1, 0):
        // rho = 1 - 6 * 2 / (4 * 15) = 0.8.
        let x = [1.0, 2.0, 3.0, 4.0];
        let y = [1.0, 3.0, 2.0, 4.0];
        let tau = kendall_tau_b(&x, &y).expect("tau");
        assert!((tau - 4.0 / 6.0).abs() < 1e-12, "{tau}");
        let rho = spearman(&x, &y).expect("rho");
        assert!((rho - 0.8).abs() < 1e-12, "{rho}");
        // Ties: x = (1, 1, 2), y = (1, 2, 3). Pairs: (0,1) tied in x only,
        // (0,2) and (1,2) concordant: S = 2, n0 = 3, n1 = 1, n2 = 0:
        // tau_b = 2 / sqrt(2 * 3).
        let tau = kendall_tau_b(&[1.0, 1.0, 2.0], &[1.0, 2.0, 3.0]).expect("tau");
        assert!((tau - 2.0 / 6f64.sqrt()).abs() < 1e-12, "{tau}");
        // -0.0 and 0.0 are one value, not two.
        let tau = kendall_tau_b(&[0.0, -0.0, 1.0], &[2.0, 1.0, 3.0]).expect("tau");
        assert!((tau - 2.0 / 6f64.sqrt()).abs() < 1e-12, "{tau}");
        // Reversed order: -1; a constant side: undefined.
        let rev: Vec<f64> = x.iter().rev().copied().collect();
        assert_eq!(kendall_tau_b(&x, &rev), Some(-1.0));
        assert_eq!(kendall_tau_b(&x, &[2.0; 4]), None);
        assert_eq!(spearman(&x, &[2.0; 4]), None);
        assert_eq!(kendall_tau_b(&[1.0], &[1.0]), None);
    }

    #[test]
    fn rank_correlations_match_scipy() {
        // Written by scripts/reference/rank_vectors.py (scipy's kendalltau
        // and spearmanr on tie-heavy data).
        #[derive(Deserialize)]
        struct Case {
            name: String,
            x: Vec<f64>,
            y: Vec<f64>,
            kendall_tau_b: f64,
            spearman: f64,
        }
        let text = include_str!("testdata/rank_vectors.json");
        let cases: Vec<Case> = serde_json::from_str(text).expect("reference vectors");
        assert!(cases.len() >= 3);
        for c in cases {
            let tau = kendall_tau_b(&c.x, &c.y).expect("tau");
            assert!(
                (tau - c.kendall_tau_b).abs() < REF_TOL,
                "{}: {tau} vs {}",
                c.name,
                c.kendall_tau_b
            );
            let rho = spearman(&c.x, &c.y).expect("rho");
            assert!(
                (rho - c.spearman).abs() < REF_TOL,
                "{}: {rho} vs {}",
                c.name,
                c.spearman
            );
        }
    }

    #[test]
    fn kendall_agrees_with_the_quadratic_definition() {
        // Pseudo-random data with ties against the O(n^2) count.
        let mut state = 12345u64;
        let mut next = || {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((state >> 33) % 7) as f64
        };
        let x: Vec<f64> = (0..300).map(|_| next()).collect();
        let y: Vec<f64> = (0..300).map(|_| next()).collect();
        let (mut s, mut tx, mut ty) = (0i64, 0i64, 0i64);
        let n = x.len();
        for i in 0..n {
            for j in i + 1..n {
                let a = (x[i] - x[j]).signum() as i64 * i64::from(x[i] != x[j]);
                let b = (y[i] - y[j]).signum() as i64 * i64::from(y[i] != y[j]);
                s += a * b;
                tx += i64::from(a == 0);
                ty += i64::from(b == 0);
            }
        }
        let n0 = (n * (n - 1) / 2) as f64;
        let want = s as f64 / ((n0 - tx as f64) * (n0 - ty as f64)).sqrt();
        let got = kendall_tau_b(&x, &y).expect("tau");
        assert!((got - want).abs() < 1e-12, "{got} vs {want}");
    }
}
