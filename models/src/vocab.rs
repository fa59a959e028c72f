//! Word vocabulary for the from-scratch text encoder.
//!
//! Built from the training captions and stored in the checkpoint, so that
//! `score` tokenises new captions exactly as `fit` did.

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

/// Id of the padding token.
pub const PAD: u32 = 0;
/// Id of the unknown-word token.
pub const UNK: u32 = 1;

/// Lower-cased alphanumeric words → ids; 0 is padding, 1 is unknown.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Vocab {
    /// Words in id order, starting at id 2.
    pub words: Vec<String>,
    /// Captions are cut to this many tokens.
    pub max_len: usize,
    #[serde(skip)]
    index: HashMap<String, u32>,
}

/// Longest word (in characters) that may enter a vocabulary: longer runs of
/// letters and digits (a URL-safe blob, a caption with no spaces) are not
/// words anyone searches by, and one 20 MB "word" would make the stored
/// vocabulary, and so the checkpoint's state, 20 MB. Such words encode as
/// unknown.
pub const MAX_WORD_CHARS: usize = 64;

/// Split a caption into lower-case alphanumeric words.
pub fn words(caption: &str) -> impl Iterator<Item = String> + '_ {
    caption
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase())
}

impl Vocab {
    /// Words seen at least `min_count` times, most frequent first (ties by
    /// word, so the result does not depend on hash order), at most `max_size`.
    pub fn build<'a>(
        captions: impl IntoIterator<Item = &'a str>,
        min_count: usize,
        max_size: usize,
        max_len: usize,
    ) -> Vocab {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for c in captions {
            // Only the words `encode` keeps: words past `max_len` are never
            // seen by the model, and counting them let one long caption of
            // distinct words fill the table (and `max_size`) with them.
            for w in words(c).take(max_len) {
                if w.chars().count() <= MAX_WORD_CHARS {
                    *counts.entry(w).or_default() += 1;
                }
            }
        }
        let mut list: Vec<(String, usize)> = counts
            .into_iter()
            .filter(|(_, n)| *n >= min_count)
            .collect();
        list.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        list.truncate(max_size.saturating_sub(2));
        Vocab::from_words(list.into_iter().map(|(w, _)| w).collect(), max_len)
    }

    /// A vocabulary from a stored word list.
    pub fn from_words(words: Vec<String>, max_len: usize) -> Vocab {
        let mut v = Vocab {
            words,
            max_len,
            index: HashMap::new(),
        };
        v.reindex();
        v
    }

    /// Rebuild the lookup table (after deserialising).
    pub fn reindex(&mut self) {
        self.index = self
            .words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.clone(), i as u32 + 2))
            .collect();
    }

    /// Number of ids including padding and unknown.
    pub fn size(&self) -> usize {
        self.words.len() + 2
    }

    /// Token ids of a caption, cut to `max_len`; an empty caption gives `[UNK]`
    /// so that every caption has at least one token to pool.
    pub fn encode(&self, caption: &str) -> Vec<u32> {
        let mut ids: Vec<u32> = words(caption)
            .take(self.max_len)
            .map(|w| self.index.get(&w).copied().unwrap_or(UNK))
            .collect();
        if ids.is_empty() {
            ids.push(UNK);
        }
        ids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builds_by_frequency_and_encodes_with_unknowns() {
        let caps = ["A red circle.", "a RED square", "a blue circle"];
        let v = Vocab::build(caps.iter().copied(), 2, 100, 8);
        // counts: a=3, circle=2, red=2, blue=1, square=1 → min_count 2 keeps a, circle, red
        assert_eq!(v.words, vec!["a", "circle", "red"]);
        assert_eq!(v.encode("a red triangle"), vec![2, 4, UNK]);
        assert_eq!(v.encode("!!!"), vec![UNK]);
        assert_eq!(v.size(), 5);
    }

    #[test]
    fn max_len_and_serde_round_trip() {
        // A word longer than MAX_WORD_CHARS is no vocabulary word: it
        // encodes as unknown and takes no room in the stored vocabulary.
        let blob = "q".repeat(MAX_WORD_CHARS + 1);
        let v = Vocab::build([blob.as_str(), "b"], 1, 100, 8);
        assert_eq!(v.words, ["b"]);
        assert_eq!(v.encode(&blob), [UNK]);
        let v = Vocab::build(["x y z w"].iter().copied(), 1, 100, 2);
        assert_eq!(v.encode("x y z w").len(), 2);
        // Words past the cut are not counted: z and w never reach the model.
        assert_eq!(v.words, ["x", "y"]);
        // So a caption padded past the cut cannot crowd out the words that
        // are seen: with room for two words, b (seen twice) is kept.
        let long = format!(
            "a {}",
            (0..100)
                .map(|i| format!("w{i} w{i}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        let v = Vocab::build([long.as_str(), "b", "b"], 1, 4, 2);
        assert_eq!(v.words, ["b", "a"]);
        let s = serde_json::to_string(&v).unwrap();
        let mut back: Vocab = serde_json::from_str(&s).unwrap();
        back.reindex();
        assert_eq!(back.encode("x y"), v.encode("x y"));
    }
}
