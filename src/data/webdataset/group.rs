//! Which members form one sample, decided from member names alone.
//!
//! Webdataset's rule: a member `dir/000123.caption.txt` belongs to the
//! sample keyed `dir/000123` (the path up to the first dot of the file
//! name) with extension `caption.txt`. img2dataset and webdataset's writers
//! put a sample's members next to each other, so samples are read as they
//! come: up to [`WINDOW`] samples stay open for members that arrive a little
//! out of order, and the oldest is closed when a new key would exceed that.
//! Memory is then bounded by the window, not by the shard. A key that shows
//! up again after its sample was closed starts a new sample marked
//! scattered, so that its row says why its members are missing. A member
//! whose open sample already holds one of its extension (`a.jpg a.txt
//! b.jpg a.jpg`) starts a new sample marked as repeating the key: two
//! samples are never merged into one row.
//!
//! A stretch of a damaged tar that could not be read is a sample of its own
//! ([`Grouper::push_lost`]), without members, so that its row says what was
//! lost.
//!
//! The header scan that counts a shard's samples, the stream that reads
//! them and the writer of filtered shards all group through [`Grouper`], so
//! sample `i` is the same sample in all three.

use std::collections::{HashSet, VecDeque};

/// Samples kept open for late members.
pub(crate) const WINDOW: usize = 8;
/// Keys of closed samples remembered to recognise a scattered sample.
const REMEMBERED: usize = 4096;

/// `(key, extension)` of a member name, extension lower-cased; `None` for
/// names webdataset does not read as sample members (no dot in the file
/// name, or a hidden file).
pub(crate) fn split_name(name: &str) -> Option<(&str, String)> {
    let (dir, file) = match name.rfind('/') {
        Some(i) => (&name[..=i], &name[i + 1..]),
        None => ("", name),
    };
    let dot = file.find('.')?;
    if dot == 0 || dot + 1 == file.len() {
        return None;
    }
    Some((
        &name[..dir.len() + dot],
        file[dot + 1..].to_ascii_lowercase(),
    ))
}

/// Whether a member name (or its key: the same path up to the file name's
/// first dot) would be extracted outside the directory a tar is unpacked
/// in: a leading `/` or a `..` component.
pub(crate) fn climbs_out(name: &str) -> bool {
    name.starts_with('/') || name.split('/').any(|c| c == "..")
}

/// A sample being collected, or handed out once closed.
#[derive(Debug)]
pub(crate) struct Sample<T> {
    /// Index of the sample in its shard (order of its first member).
    pub index: usize,
    pub key: String,
    /// `(extension, member name, payload)` in tar order.
    pub members: Vec<(String, String, T)>,
    /// The key appeared again after its sample was closed, so this sample
    /// may lack members that lie elsewhere in the tar.
    pub scattered: bool,
    /// Index of the open sample with the same key that already held a
    /// member of this one's extension.
    pub repeats: Option<usize>,
    /// A stretch of the tar that could not be read: why, and the span.
    pub lost: Option<Lost>,
}

/// Bytes of a tar passed over as damaged.
#[derive(Debug, Clone)]
pub(crate) struct Lost {
    pub start: u64,
    pub end: u64,
    pub why: String,
}

/// Groups members into samples; `T` is what a member carries (its data, or
/// nothing for a header scan).
pub(crate) struct Grouper<T> {
    open: VecDeque<Sample<T>>,
    next_index: usize,
    closed: VecDeque<String>,
    closed_set: HashSet<String>,
}

impl<T> Default for Grouper<T> {
    fn default() -> Self {
        Grouper {
            open: VecDeque::new(),
            next_index: 0,
            closed: VecDeque::new(),
            closed_set: HashSet::new(),
        }
    }
}

impl<T> Grouper<T> {
    /// The open sample a member keyed `key` with extension `ext` would
    /// join (see [`Grouper::push`]), if any.
    pub fn open_sample(&self, key: &str, ext: &str) -> Option<&Sample<T>> {
        self.open
            .iter()
            .rev()
            .find(|s| s.key == key)
            .filter(|s| !s.members.iter().any(|(e, _, _)| e == ext))
    }

    /// Add member `name` (already split into `key` and `ext`); returns the
    /// index of its sample and the sample the window closed to make room,
    /// if any.
    pub fn push(
        &mut self,
        key: &str,
        ext: String,
        name: &str,
        payload: T,
    ) -> (usize, Option<Sample<T>>) {
        // The newest open sample of this key takes the member, unless it
        // already has one of this extension: then the key repeats.
        let mut repeats = None;
        if let Some(s) = self.open.iter_mut().rev().find(|s| s.key == key) {
            if !s.members.iter().any(|(e, _, _)| *e == ext) {
                s.members.push((ext, name.to_string(), payload));
                return (s.index, None);
            }
            repeats = Some(s.index);
        }
        let scattered = self.closed_set.contains(key);
        let index = self.next_index;
        self.next_index += 1;
        self.open.push_back(Sample {
            index,
            key: key.to_string(),
            members: vec![(ext, name.to_string(), payload)],
            scattered,
            repeats,
            lost: None,
        });
        (index, self.make_room())
    }

    /// Add a stretch of the tar that could not be read, as a sample of its
    /// own keyed `key`; returns its index and the sample the window closed
    /// to make room, if any.
    pub fn push_lost(&mut self, key: String, lost: Lost) -> (usize, Option<Sample<T>>) {
        let index = self.next_index;
        self.next_index += 1;
        self.open.push_back(Sample {
            index,
            key,
            members: Vec::new(),
            scattered: false,
            repeats: None,
            lost: Some(lost),
        });
        (index, self.make_room())
    }

    fn make_room(&mut self) -> Option<Sample<T>> {
        if self.open.len() > WINDOW {
            self.close_oldest()
        } else {
            None
        }
    }

    fn close_oldest(&mut self) -> Option<Sample<T>> {
        let s = self.open.pop_front()?;
        if self.closed_set.insert(s.key.clone()) {
            self.closed.push_back(s.key.clone());
            if self.closed.len() > REMEMBERED {
                if let Some(old) = self.closed.pop_front() {
                    self.closed_set.remove(&old);
                }
            }
        }
        Some(s)
    }

    /// Close every open sample, oldest first (at the end of a shard).
    pub fn drain(&mut self) -> Vec<Sample<T>> {
        let mut out = Vec::with_capacity(self.open.len());
        while let Some(s) = self.close_oldest() {
            out.push(s);
        }
        out
    }

    /// Samples opened so far.
    pub fn samples(&self) -> usize {
        self.next_index
    }
}
