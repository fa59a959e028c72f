//! `ncclean inspect`'s pass over the rows: which are unusable and why, and
//! whether the keys repeat (labels are joined back by key).

use std::collections::BTreeMap;

use crate::data::{DuplicateKeys, InputSet, READ_BATCH_ROWS};
use crate::error::Result;
use crate::runtime::progress::Reporter;

/// What one pass over the rows found.
#[derive(Debug, Clone)]
pub struct Survey {
    /// Rows that cannot be used.
    pub unusable: usize,
    /// Unusable rows per reason (its first clause).
    pub reasons: BTreeMap<String, usize>,
    /// The first few unusable rows: key and reason.
    pub examples: Vec<(String, String)>,
    /// Repeated keys.
    pub dups: DuplicateKeys,
}

/// Read every row of `input`, decoding its images the way `fit` would
/// (`decode`), or only reading them.
pub fn survey(input: &InputSet, decode: bool, rep: &Reporter) -> Result<Survey> {
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut unusable = 0usize;
    let mut examples: Vec<(String, String)> = Vec::new();
    // Every key, to find duplicates: labels are joined back by key.
    let mut keys: Vec<String> = Vec::with_capacity(input.num_rows());
    let mut note = |key: &str, why: &str| {
        unusable += 1;
        // Group reasons by their first clause so counts stay readable (a
        // damaged row group's reason also loses its parenthesised error).
        let clause = why.split(':').next().unwrap_or(why);
        let group = clause
            .split(" (")
            .next()
            .unwrap_or(clause)
            .trim()
            .to_string();
        *reasons.entry(group).or_default() += 1;
        if examples.len() < 5 {
            examples.push((key.to_string(), why.to_string()));
        }
    };
    if !decode {
        for batch in input.pairs(READ_BATCH_ROWS) {
            for r in batch? {
                if let Some(p) = &r.problem {
                    note(&r.key, p);
                }
                keys.push(r.key);
            }
        }
    } else {
        for r in super::scan(input, rep)? {
            if let Some(e) = &r.error {
                note(&r.key, e);
            }
            keys.push(r.key);
        }
    }
    let dups = DuplicateKeys::of(keys.iter().map(String::as_str));
    Ok(Survey {
        unusable,
        reasons,
        examples,
        dups,
    })
}
