//! Similar images for hard noise, judged by their captions' content words.
//!
//! Each distinct image becomes one document: the words of all its captions.
//! Two images are similar when their documents share rare content words
//! (TF-IDF cosine). This needs no features and no model, and it is
//! independent of the frozen towers a method is then trained on: neighbours
//! picked in those towers' own feature space would single out exactly the
//! pairs those towers cannot tell apart, and the benchmark would measure the
//! towers rather than the method.

use std::collections::HashMap;

/// Words that carry no content in captions; dropped with every word shorter
/// than three letters.
const STOPWORDS: &[&str] = &[
    "the", "and", "are", "for", "from", "has", "have", "his", "her", "its", "into", "one", "onto",
    "that", "their", "them", "there", "they", "this", "two", "three", "while", "with", "who",
    "which", "what", "some", "out", "off", "over", "near", "next", "front", "top", "being",
    "other", "very", "each", "was", "were", "been", "but", "not", "all", "any", "can", "also",
    "than", "then", "these", "those", "our", "your", "you", "she", "him", "about", "through",
    "down", "image", "picture", "photo", "shows", "showing",
];

/// Lower-cased alphanumeric words of `text` with at least three characters,
/// stop words removed.
pub fn content_words(text: &str) -> Vec<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .filter(|w| w.chars().count() >= 3)
        .map(|w| w.to_lowercase())
        .filter(|w| !STOPWORDS.contains(&w.as_str()))
        .collect()
}

/// TF-IDF documents of the images and an inverted index over them.
pub struct WordIndex {
    /// Per document: (word id, weight), weights of unit length.
    docs: Vec<Vec<(usize, f64)>>,
    /// Per word id: (document, weight).
    postings: Vec<Vec<(usize, f64)>>,
}

impl WordIndex {
    /// One document per image: `texts[g]` are the captions of image `g`.
    /// Weight of a word: its count in the document times
    /// `ln(documents / documents containing it)`.
    pub fn new(texts: &[Vec<&str>]) -> WordIndex {
        let mut vocab: HashMap<String, usize> = HashMap::new();
        let counts: Vec<HashMap<usize, f64>> = texts
            .iter()
            .map(|caps| {
                let mut c = HashMap::new();
                for cap in caps {
                    for w in content_words(cap) {
                        let next = vocab.len();
                        let id = *vocab.entry(w).or_insert(next);
                        *c.entry(id).or_insert(0.0) += 1.0;
                    }
                }
                c
            })
            .collect();
        let mut df = vec![0usize; vocab.len()];
        for c in &counts {
            for &w in c.keys() {
                df[w] += 1;
            }
        }
        let n = texts.len() as f64;
        let mut postings = vec![Vec::new(); vocab.len()];
        let docs = counts
            .into_iter()
            .enumerate()
            .map(|(d, c)| {
                let mut v: Vec<(usize, f64)> = c
                    .into_iter()
                    .map(|(w, tf)| (w, tf * (n / df[w] as f64).ln()))
                    .filter(|&(_, x)| x > 0.0)
                    .collect();
                // Word ids in order: summation order, hence scores, are
                // the same on every run (HashMap iteration is not).
                v.sort_unstable_by_key(|&(w, _)| w);
                let norm = v.iter().map(|(_, x)| x * x).sum::<f64>().sqrt();
                for (w, x) in &mut v {
                    *x /= norm;
                    postings[*w].push((d, *x));
                }
                v
            })
            .collect();
        WordIndex { docs, postings }
    }

    /// Up to `k` other documents most similar to document `d`, best first
    /// (ties: lower index first); only documents sharing a weighted word.
    /// Cost: the postings of `d`'s words (their document frequencies).
    pub fn nearest(&self, d: usize, k: usize) -> Vec<usize> {
        let mut acc: HashMap<usize, f64> = HashMap::new();
        for &(w, x) in &self.docs[d] {
            for &(e, y) in &self.postings[w] {
                if e != d {
                    *acc.entry(e).or_insert(0.0) += x * y;
                }
            }
        }
        let mut scored: Vec<(usize, f64)> = acc.into_iter().collect();
        scored.sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        scored.into_iter().take(k).map(|(e, _)| e).collect()
    }

    /// TF-IDF cosine of documents `a` and `b` (for tests and reports).
    pub fn cosine(&self, a: usize, b: usize) -> f64 {
        let ib: HashMap<usize, f64> = self.docs[b].iter().copied().collect();
        self.docs[a]
            .iter()
            .map(|(w, x)| x * ib.get(w).copied().unwrap_or(0.0))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_words_drop_short_and_stop_words() {
        assert_eq!(
            content_words("A dog, and THE Dog's ball in a park."),
            ["dog", "dog", "ball", "park"]
        );
    }

    #[test]
    fn tf_idf_weights_and_cosine_by_hand() {
        // Words: dog (docs 0, 1), ball (0), cat (2), grass (1, 2); N = 3.
        // idf: dog ln 1.5, ball ln 3, cat ln 3, grass ln 1.5.
        let texts = vec![
            vec!["dog ball"],
            vec!["dog grass", "dog"],
            vec!["cat grass"],
        ];
        let ix = WordIndex::new(&texts);
        let (l15, l3) = (1.5f64.ln(), 3f64.ln());
        // doc 0 = (dog l15, ball l3), doc 1 = (dog 2·l15, grass l15).
        let c01 = (l15 * 2.0 * l15) / ((l15 * l15 + l3 * l3).sqrt() * (5.0 * l15 * l15).sqrt());
        assert!((ix.cosine(0, 1) - c01).abs() < 1e-12);
        // doc 2 = (cat l3, grass l15) shares only grass with doc 1.
        let c12 = (l15 * l15) / ((5.0 * l15 * l15).sqrt() * (l3 * l3 + l15 * l15).sqrt());
        assert!((ix.cosine(1, 2) - c12).abs() < 1e-12);
        assert!(c01 > c12);
        assert_eq!(ix.nearest(1, 3), [0, 2]);
        assert_eq!(ix.nearest(0, 3), [1], "doc 2 shares no word with doc 0");
        assert_eq!(ix.nearest(1, 1), [0]);
    }

    #[test]
    fn a_word_in_every_document_weighs_nothing() {
        let texts = vec![vec!["man dog"], vec!["man cat"], vec!["man cat"]];
        let ix = WordIndex::new(&texts);
        assert!(ix.nearest(0, 2).is_empty(), "only 'man' is shared");
        assert_eq!(ix.nearest(1, 2), [2]);
    }
}
