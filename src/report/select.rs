//! Which pairs the report shows: the most suspicious (lowest clean
//! probability), the borderline (closest to the run's threshold) and the
//! most confident (highest), each pair in one group at most.

/// Row indices (into the labels) of the pairs shown in each group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Picks {
    /// Lowest `clean_prob` first.
    pub suspicious: Vec<usize>,
    /// Closest to the threshold, shown in ascending `clean_prob`.
    pub borderline: Vec<usize>,
    /// Highest `clean_prob` first.
    pub confident: Vec<usize>,
}

/// Pick up to `per_group` scored pairs for each group from the rows'
/// clean probabilities (`None`: not scored). Ties go to the earlier row, so
/// the same labels always give the same pages. The extremes are taken
/// first; the borderline group comes from the pairs left.
pub fn pick(probs: &[Option<f32>], per_group: usize, threshold: f64) -> Picks {
    let mut scored: Vec<(usize, f32)> = probs
        .iter()
        .enumerate()
        .filter_map(|(i, p)| p.filter(|p| p.is_finite()).map(|p| (i, p)))
        .collect();
    scored.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    let low = per_group.min(scored.len());
    let high = per_group.min(scored.len() - low);
    let suspicious: Vec<usize> = scored[..low].iter().map(|s| s.0).collect();
    // Highest first; among equal probabilities the earlier row first.
    let mut top: Vec<(usize, f32)> = scored[scored.len() - high..].to_vec();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    let confident: Vec<usize> = top.iter().map(|s| s.0).collect();
    let mut middle: Vec<(usize, f32)> = scored[low..scored.len() - high].to_vec();
    let distance = |p: f32| (f64::from(p) - threshold).abs();
    middle.sort_by(|a, b| distance(a.1).total_cmp(&distance(b.1)).then(a.0.cmp(&b.0)));
    middle.truncate(per_group);
    middle.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    Picks {
        suspicious,
        borderline: middle.iter().map(|s| s.0).collect(),
        confident,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_take_the_extremes_and_the_pairs_nearest_the_threshold() {
        let probs = [
            Some(0.9),
            Some(0.2),
            None,
            Some(0.6),
            Some(0.55),
            Some(1.0),
            Some(0.1),
            Some(0.45),
            Some(f32::NAN),
        ];
        let p = pick(&probs, 2, 0.5);
        assert_eq!(p.suspicious, [6, 1]);
        assert_eq!(p.confident, [5, 0]);
        // Left: 0.6 (row 3), 0.55 (4), 0.45 (7): 4 and 7 are 0.05 away,
        // shown ascending.
        assert_eq!(p.borderline, [7, 4]);
    }

    #[test]
    fn few_pairs_are_shown_once() {
        let p = pick(&[Some(0.3), Some(0.7), Some(0.5)], 2, 0.5);
        assert_eq!(p.suspicious, [0, 2]);
        assert_eq!(p.confident, [1]);
        assert!(p.borderline.is_empty());
        assert_eq!(pick(&[], 3, 0.5), Picks::default());
    }

    #[test]
    fn equal_probabilities_give_a_stable_choice() {
        let p = pick(&[Some(0.5); 5], 1, 0.5);
        assert_eq!(
            (p.suspicious, p.confident, p.borderline),
            (vec![0], vec![4], vec![1])
        );
    }
}
