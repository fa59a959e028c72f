//! Tar shards are written with the `tar` crate, an independent writer, so the
//! reader is not tested against its own idea of the format only.

use std::io::Read;
use std::path::{Path, PathBuf};

use super::tar::{Entry, TarReader};
use super::*;
use crate::data::{InputSet, OutputFormat};

/// A member: its name and bytes.
type M = (String, Vec<u8>);

fn m(name: &str, data: &[u8]) -> M {
    (name.to_string(), data.to_vec())
}

/// Write `members` in order to `dir/name` with the `tar` crate (GNU headers,
/// long names as GNU extensions).
fn write_tar(dir: &Path, name: &str, members: &[M]) -> PathBuf {
    let path = dir.join(name);
    let mut b = ::tar::Builder::new(std::fs::File::create(&path).unwrap());
    for (n, data) in members {
        let mut h = ::tar::Header::new_gnu();
        h.set_size(data.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        b.append_data(&mut h, n, data.as_slice()).unwrap();
    }
    b.into_inner().unwrap();
    path
}

/// A ustar header for a regular file `name` (under 100 bytes) of `size`
/// bytes, with its checksum.
fn raw_header(name: &str, size: u64) -> [u8; 512] {
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    h[100..107].copy_from_slice(b"0000644");
    h[124..135].copy_from_slice(format!("{size:011o}").as_bytes());
    h[156] = b'0';
    h[257..263].copy_from_slice(b"ustar\0");
    h[148..156].fill(b' ');
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    h[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    h
}

/// A sample as img2dataset writes it: image, caption, metadata.
fn sample(key: &str, caption: &str) -> Vec<M> {
    vec![
        m(&format!("{key}.jpg"), format!("img-{key}").as_bytes()),
        m(&format!("{key}.txt"), caption.as_bytes()),
        m(
            &format!("{key}.json"),
            format!("{{\"key\": \"k{key}\", \"caption\": \"json {caption}\"}}").as_bytes(),
        ),
    ]
}

fn samples(keys: &[&str]) -> Vec<M> {
    keys.iter()
        .flat_map(|k| sample(k, &format!("caption {k}")))
        .collect()
}

fn read_all(path: &Path, layout: &TarLayout, max_image_bytes: u64) -> Vec<TarSample> {
    let mut s = SampleStream::open(path, layout, max_image_bytes).unwrap();
    let mut out = Vec::new();
    while let Some(x) = s.next_sample().unwrap() {
        out.push(x);
    }
    out
}

/// `(name, data)` of every regular member, read with the `tar` crate.
fn members_of(path: &Path) -> Vec<M> {
    let mut a = ::tar::Archive::new(std::fs::File::open(path).unwrap());
    a.entries()
        .unwrap()
        .map(|e| {
            let mut e = e.unwrap();
            let name = e.path().unwrap().to_string_lossy().into_owned();
            let mut data = Vec::new();
            e.read_to_end(&mut data).unwrap();
            (name, data)
        })
        .collect()
}

#[test]
fn the_reader_sees_what_the_tar_crate_wrote_long_names_and_pax_paths_included() {
    let dir = tempfile::tempdir().unwrap();
    let long = format!("{}/0001.jpg", "d".repeat(150));
    let mut members = vec![m("a/0000.jpg", b"x"), m(&long, &[7u8; 1000])];
    members.push(m("0002.txt", b""));
    let path = write_tar(dir.path(), "s.tar", &members);
    // Append a member whose name only a pax header holds.
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.truncate(bytes.len() - 1024);
    let mut b = ::tar::Builder::new(Vec::new());
    b.append_pax_extensions([("path", b"pax/0003.png".as_slice())])
        .unwrap();
    let mut h = ::tar::Header::new_ustar();
    h.set_size(3);
    h.set_mode(0o644);
    b.append_data(&mut h, "short", b"abc".as_slice()).unwrap();
    bytes.extend(b.into_inner().unwrap());
    std::fs::write(&path, &bytes).unwrap();

    let mut r = TarReader::open(&path).unwrap();
    let mut got = Vec::new();
    let mut last_end = 0;
    while let Some(e) = r.next_entry().unwrap() {
        let Entry::File(f) = e else {
            panic!("unexpected {e:?}");
        };
        // Spans tile the file: each member starts where the last ended.
        assert_eq!(f.start, last_end);
        last_end = f.end;
        assert_eq!(f.truncated, None);
        got.push((f.name.clone(), r.read_data(&f).unwrap()));
    }
    members.push(m("pax/0003.png", b"abc"));
    assert_eq!(got, members);
    assert_eq!(members_of(&path), members);
}

#[test]
fn names_split_at_the_first_dot_of_the_file_name() {
    assert_eq!(
        group::split_name("a.b/000123.Caption.TXT"),
        Some(("a.b/000123", "caption.txt".to_string()))
    );
    assert_eq!(group::split_name("x.jpg"), Some(("x", "jpg".to_string())));
    assert_eq!(group::split_name("dir/.hidden"), None);
    assert_eq!(group::split_name("README"), None);
    assert_eq!(group::split_name("x."), None);
}

#[test]
fn every_sample_is_a_row_with_the_layouts_caption_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_tar(dir.path(), "s.tar", &samples(&["000", "001", "002"]));
    assert_eq!(count_samples(&path).unwrap(), 3);

    let got = read_all(&path, &TarLayout::default(), 1 << 20);
    let keys: Vec<&str> = got.iter().map(|s| s.key.as_str()).collect();
    assert_eq!(keys, ["000", "001", "002"]);
    assert_eq!(got[1].index, 1);
    assert_eq!(got[1].image.as_deref(), Some(b"img-001".as_slice()));
    assert_eq!(got[1].caption.as_deref(), Some("caption 001"));
    assert!(got[1].json.as_deref().unwrap().contains("\"k001\""));
    assert!(got.iter().all(|s| s.problem.is_none()));

    let layout = TarLayout {
        caption: "json:caption".parse().unwrap(),
        key: "json:key".parse().unwrap(),
    };
    let got = read_all(&path, &layout, 1 << 20);
    assert_eq!(got[2].key, "k002");
    assert_eq!(got[2].caption.as_deref(), Some("json caption 002"));
}

#[test]
fn flags_parse_and_refuse_in_words() {
    assert_eq!("txt".parse::<CaptionFrom>(), Ok(CaptionFrom::Txt));
    assert_eq!(
        "json:text".parse::<CaptionFrom>(),
        Ok(CaptionFrom::Json("text".into()))
    );
    assert!("json:"
        .parse::<CaptionFrom>()
        .unwrap_err()
        .contains("txt or json:FIELD"));
    assert_eq!("name".parse::<KeyFrom>(), Ok(KeyFrom::Name));
    assert!("uid"
        .parse::<KeyFrom>()
        .unwrap_err()
        .contains("name or json:FIELD"));
}

#[test]
fn unusable_samples_are_rows_with_their_reason() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = samples(&["000"]);
    // 001: no caption; 002: image over the limit; 003: no image;
    // 004: caption not UTF-8; 005: blank caption.
    members.push(m("001.jpg", b"img"));
    members.push(m("002.jpg", &[1u8; 64]));
    members.push(m("002.txt", b"big"));
    members.push(m("003.txt", b"no image"));
    members.push(m("004.png", b"img"));
    members.push(m("004.txt", b"\xFF\xFE"));
    members.push(m("005.webp", b"img"));
    members.push(m("005.txt", b"  \n"));
    let path = write_tar(dir.path(), "s.tar", &members);
    let got = read_all(&path, &TarLayout::default(), 32);
    let problems: Vec<Option<&str>> = got.iter().map(|s| s.problem.as_deref()).collect();
    assert_eq!(
        problems,
        [
            None,
            Some("no caption member (001.txt)"),
            Some("member 002.jpg is 64 bytes, over --max-image-bytes (32 bytes)"),
            Some("no image member (003.jpg, .jpeg, .png or .webp)"),
            Some("caption member 004.txt is not valid UTF-8"),
            Some("caption is empty"),
        ]
    );
    assert_eq!(got[2].image, None);

    let layout = TarLayout {
        caption: CaptionFrom::Json("title".into()),
        key: KeyFrom::Name,
    };
    let got = read_all(&path, &layout, 1 << 20);
    assert_eq!(
        got[0].problem.as_deref(),
        Some("metadata member 000.json has no string field \"title\"")
    );
    assert_eq!(
        got[1].problem.as_deref(),
        Some("no metadata member (001.json) to take the caption from")
    );
}

#[test]
fn a_truncated_tar_keeps_every_sample_before_the_cut() {
    let dir = tempfile::tempdir().unwrap();
    let mut members = samples(&["000", "001"]);
    members.push(m("002.jpg", &[5u8; 3000]));
    members.push(m("002.txt", b"cut off"));
    let path = write_tar(dir.path(), "s.tar", &members);
    let whole = std::fs::read(&path).unwrap();
    // Cut inside 002.jpg's data: its header is whole, 1000 of its bytes are.
    let at = whole.windows(7).position(|w| w == b"002.jpg").unwrap();
    std::fs::write(&path, &whole[..at + 512 + 1000]).unwrap();

    assert_eq!(count_samples(&path).unwrap(), 3);
    let got = read_all(&path, &TarLayout::default(), 1 << 20);
    assert_eq!(got.len(), 3);
    assert!(got[0].problem.is_none() && got[1].problem.is_none());
    assert_eq!(got[1].caption.as_deref(), Some("caption 001"));
    let p = got[2].problem.as_deref().unwrap();
    assert!(
        p.starts_with("member 002.jpg is cut short: the file ends after 1000 of its 3000 bytes"),
        "{p}"
    );
    assert!(p.contains("no caption member (002.txt)"), "{p}");

    // Cut inside a header: the samples before it are whole, and the cut
    // header is a row of its own saying what was lost.
    std::fs::write(&path, &whole[..at + 100]).unwrap();
    assert_eq!(count_samples(&path).unwrap(), 3);
    let got = read_all(&path, &TarLayout::default(), 1 << 20);
    assert!(got[..2].iter().all(|s| s.problem.is_none()), "{got:?}");
    assert_eq!(got[2].key, format!("s.tar@{at}"));
    assert_eq!(
        got[2].problem.as_deref(),
        Some(format!(
            "bytes {at}..{} of the shard could not be read: the file ends inside a member header at byte {at} \
             (a truncated tar); the members there are lost",
            at + 100
        ))
        .as_deref()
    );
}

#[test]
fn a_file_that_is_not_a_tar_is_invalid_input_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.tar");
    std::fs::write(&path, vec![b'P'; 2048]).unwrap();
    let e = count_samples(&path).unwrap_err();
    assert_eq!(e.exit_code(), 3);
    let msg = e.to_string();
    assert!(msg.contains("x.tar: not a readable tar shard"), "{msg}");
    assert!(msg.contains("checksum"), "{msg}");
}

#[test]
fn members_that_arrive_late_join_their_sample_within_the_window() {
    let dir = tempfile::tempdir().unwrap();
    // 000.txt comes after two other samples: inside the window.
    let mut members = vec![m("000.jpg", b"i0")];
    members.extend(samples(&["001", "002"]));
    members.push(m("000.txt", b"late"));
    // 003.txt comes after more samples than the window holds.
    members.push(m("003.jpg", b"i3"));
    let later: Vec<String> = (10..10 + WINDOW + 1).map(|i| format!("{i:03}")).collect();
    let later: Vec<&str> = later.iter().map(String::as_str).collect();
    members.extend(samples(&later));
    members.push(m("003.txt", b"too late"));
    let path = write_tar(dir.path(), "s.tar", &members);
    let got = read_all(&path, &TarLayout::default(), 1 << 20);
    assert_eq!(count_samples(&path).unwrap(), got.len());
    assert_eq!(got[0].caption.as_deref(), Some("late"));
    assert!(got[0].problem.is_none());
    assert_eq!(
        got[3].problem.as_deref(),
        Some("no caption member (003.txt)")
    );
    let last = got.last().unwrap();
    assert_eq!((last.key.as_str(), last.index), ("003", got.len() - 1));
    let p = last.problem.as_deref().unwrap();
    assert!(
        p.starts_with("no image member (003.jpg") && p.contains("appear again more than 8 samples"),
        "{p}"
    );
}

#[test]
fn filtered_shards_hold_exactly_the_kept_members_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let members = samples(&["000", "001", "002", "003"]);
    let path = write_tar(dir.path(), "s.tar", &members);
    let out = dir.path().join("out/kept.tar");
    let s = write_filtered_tar_shard(&path, &[true, false, false, true], &out).unwrap();
    assert_eq!((s.rows_in, s.rows_out, s.dropped), (4, 2, 0));
    let want: Vec<M> = members
        .iter()
        .filter(|(n, _)| n.starts_with("000") || n.starts_with("003"))
        .cloned()
        .collect();
    assert_eq!(members_of(&out), want);
    // Headers are copied too, not rewritten.
    let input = std::fs::read(&path).unwrap();
    let output = std::fs::read(&out).unwrap();
    assert_eq!(&output[..3 * 512 * 2], &input[..3 * 512 * 2]);
    // No temporary is left beside it.
    assert_eq!(
        std::fs::read_dir(dir.path().join("out")).unwrap().count(),
        1
    );

    let e = write_filtered_tar_shard(&path, &[true], &out).unwrap_err();
    assert!(
        e.to_string()
            .contains("keep mask covers 1 samples but the shard has at least 2"),
        "{e}"
    );
}

#[test]
fn an_input_set_of_tars_streams_pairs_and_filters_to_tar_or_parquet() {
    let dir = tempfile::tempdir().unwrap();
    write_tar(dir.path(), "a.tar", &samples(&["a0", "a1", "a2"]));
    let b = write_tar(dir.path(), "b.tar", &samples(&["b0", "b1"]));
    let set = InputSet::open(&[dir.path().join("*.tar")], &ColumnOptions::default()).unwrap();
    assert_eq!(set.num_rows(), 5);
    assert_eq!(set.display_name(1), b.display().to_string());
    let rows: Vec<PairRow> = set.pairs(2).flat_map(|b| b.unwrap()).collect();
    let got: Vec<(usize, usize, &str)> = rows
        .iter()
        .map(|r| (r.source_file, r.source_row, r.key.as_str()))
        .collect();
    assert_eq!(
        got,
        [
            (0, 0, "a0"),
            (0, 1, "a1"),
            (0, 2, "a2"),
            (1, 0, "b0"),
            (1, 1, "b1")
        ]
    );
    assert_eq!(rows[4].image, Some(ImageValue::Bytes(b"img-b1".to_vec())));

    let keep = vec![vec![false, true, false], vec![true, false]];
    let out = dir.path().join("f.tar");
    let format = OutputFormat::choose(&set, &dir.path().join("f"), None);
    assert_eq!(format, OutputFormat::Tar);
    crate::data::write_filtered_as(&set, &keep, &out, &Default::default(), format, None).unwrap();
    let names: Vec<String> = members_of(&out).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        ["a1.jpg", "a1.txt", "a1.json", "b0.jpg", "b0.txt", "b0.json"]
    );

    let pq = dir.path().join("f.parquet");
    let s = crate::data::write_filtered(&set, &keep, &pq, &Default::default()).unwrap();
    assert_eq!((s.rows_in, s.rows_out), (5, 2));
    let back = InputSet::open(&[pq], &ColumnOptions::default()).unwrap();
    let rows: Vec<PairRow> = back.pairs(10).flat_map(|b| b.unwrap()).collect();
    assert_eq!(rows[0].key, "a1");
    assert_eq!(rows[1].caption, "caption b0");
    assert_eq!(rows[1].image, Some(ImageValue::Bytes(b"img-b0".to_vec())));
}

#[test]
fn mixed_formats_and_the_other_formats_flags_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let t = write_tar(dir.path(), "a.tar", &samples(&["a0"]));
    let p = crate::data::testutil::write_parquet(
        dir.path(),
        "b.parquet",
        vec![
            ("jpg", crate::data::testutil::binaries(&[Some(b"x")])),
            ("caption", crate::data::testutil::strings(&[Some("c")])),
        ],
    );
    let e = InputSet::open(&[t.clone(), p.clone()], &ColumnOptions::default()).unwrap_err();
    assert_eq!(e.exit_code(), 2);
    assert!(
        e.to_string().contains("b.parquet is not a tar shard"),
        "{e}"
    );

    let opts = ColumnOptions {
        caption_col: Some("caption".into()),
        ..Default::default()
    };
    let e = InputSet::open(std::slice::from_ref(&t), &opts).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("--caption-col applies to parquet"),
        "{e}"
    );
    let opts = ColumnOptions {
        caption_from: Some(CaptionFrom::Txt),
        ..Default::default()
    };
    let e = InputSet::open(&[p], &opts).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("--caption-from applies to webdataset"),
        "{e}"
    );

    // A directory with tars is read as tars (img2dataset puts a metadata
    // parquet beside each).
    let set = InputSet::open(&[dir.path().to_path_buf()], &ColumnOptions::default()).unwrap();
    assert_eq!(set.files.len(), 1);
    assert_eq!(set.files[0].path, t);
}

#[test]
fn damage_is_passed_over_to_the_next_valid_header_as_a_row_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let members = samples(&["000", "001", "002", "003"]);
    let path = write_tar(dir.path(), "s.tar", &members);
    let whole = std::fs::read(&path).unwrap();
    let header = |name: &str| {
        whole
            .windows(name.len())
            .position(|w| w == name.as_bytes())
            .unwrap()
    };
    // 001.txt's header fails its checksum; 002.jpg's header is zeroed (a
    // lone zero block inside the archive).
    let mut bytes = whole.clone();
    bytes[header("001.txt") + 1] ^= 1;
    let zero = header("002.jpg");
    bytes[zero..zero + 512].fill(0);
    std::fs::write(&path, &bytes).unwrap();

    assert_eq!(count_samples(&path).unwrap(), 6);
    let got = read_all(&path, &TarLayout::default(), 1 << 20);
    let keys: Vec<&str> = got.iter().map(|s| s.key.as_str()).collect();
    let bad = header("001.txt");
    let (a, b) = (format!("s.tar@{bad}"), format!("s.tar@{zero}"));
    assert_eq!(keys, ["000", "001", a.as_str(), b.as_str(), "002", "003"]);
    assert!(got[0].problem.is_none() && got[5].problem.is_none());
    assert_eq!(
        got[1].problem.as_deref(),
        Some("no caption member (001.txt)")
    );
    let p = got[2].problem.as_deref().unwrap();
    assert!(
        p.starts_with(&format!(
            "bytes {bad}..{} of the shard could not be read: ",
            bad + 1024
        )) && p.contains("checksum mismatch"),
        "{p}"
    );
    assert!(got[3]
        .problem
        .as_deref()
        .unwrap()
        .contains("a lone zero block"));
    // The writer groups the same way: the kept samples' members only.
    let out = dir.path().join("kept.tar");
    let keep = [true, false, true, true, true, true];
    let s = write_filtered_tar_shard(&path, &keep, &out).unwrap();
    assert_eq!((s.rows_in, s.rows_out, s.dropped), (6, 3, 0));
    let names: Vec<String> = members_of(&out).into_iter().map(|(n, _)| n).collect();
    assert_eq!(
        names,
        [
            "000.jpg", "000.txt", "000.json", "002.txt", "002.json", "003.jpg", "003.txt",
            "003.json"
        ]
    );

    // No valid header after the damage: the rest of the file is one row.
    let mut cut = bytes[..bad + 2048].to_vec();
    cut.extend(vec![b'Z'; 4096]);
    std::fs::write(&path, &cut).unwrap();
    let got = read_all(&path, &TarLayout::default(), 1 << 20);
    let last = got.last().unwrap();
    let junk = bad + 2048;
    assert_eq!(last.key, format!("s.tar@{junk}"));
    assert!(last
        .problem
        .as_deref()
        .unwrap()
        .starts_with(&format!("bytes {junk}..{} ", cut.len())));
}

#[test]
fn a_repeated_key_starts_a_new_sample_and_unsafe_names_are_never_copied() {
    let dir = tempfile::tempdir().unwrap();
    // Written raw: the tar crate refuses such names.
    let path = dir.path().join("s.tar");
    let mut bytes = Vec::new();
    for (name, data) in samples(&["000", "001", "000", "../up", "/abs/x"]) {
        bytes.extend_from_slice(&raw_header(&name, data.len() as u64));
        bytes.extend_from_slice(&data);
        bytes.resize(bytes.len().div_ceil(512) * 512, 0);
    }
    bytes.extend_from_slice(&[0u8; 1024]);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(count_samples(&path).unwrap(), 5);
    let got = read_all(&path, &TarLayout::default(), 1 << 20);
    assert_eq!(got[2].key, "000");
    assert_eq!(got[2].caption.as_deref(), Some("caption 000"));
    let p = got[2].problem.as_deref().unwrap();
    assert!(
        p.starts_with("the key 000 repeats: sample 0 of this shard"),
        "{p}"
    );
    assert!(got[0].problem.is_none());
    for s in &got[3..] {
        let p = s.problem.as_deref().unwrap();
        assert!(p.contains("'..' or a leading '/'"), "{p}");
        assert!(s.image.is_none() && s.caption.is_none());
    }
    // Kept or not, the unsafe members are not written, and say so.
    let out = dir.path().join("kept.tar");
    let s = write_filtered_tar_shard(&path, &[true, false, false, true, true], &out).unwrap();
    assert_eq!((s.rows_out, s.dropped), (1, 2));
    let names: Vec<String> = members_of(&out).into_iter().map(|(n, _)| n).collect();
    assert_eq!(names, ["000.jpg", "000.txt", "000.json"]);
}

#[test]
fn an_empty_tar_has_no_samples_and_is_passed_over_beside_others() {
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("a.tar");
    std::fs::write(&empty, vec![0u8; 10240]).unwrap();
    assert_eq!(count_samples(&empty).unwrap(), 0);
    let zero = dir.path().join("b.tar");
    std::fs::write(&zero, b"").unwrap();
    assert_eq!(count_samples(&zero).unwrap(), 0);
    let good = write_tar(dir.path(), "c.tar", &samples(&["000"]));
    let set = InputSet::open(
        &[empty.clone(), zero, good.clone()],
        &ColumnOptions::default(),
    )
    .unwrap();
    assert_eq!(set.files.len(), 1);
    assert_eq!(set.files[0].path, good);
    let e = InputSet::open(&[empty], &ColumnOptions::default()).unwrap_err();
    assert_eq!(e.exit_code(), 3);
    assert!(
        e.to_string()
            .contains("a.tar: holds no samples (an empty tar)"),
        "{e}"
    );
}

proptest::proptest! {
    #![proptest_config(proptest::test_runner::Config { cases: 96, ..Default::default() })]

    /// Whatever a shard's bytes (truncated, bits flipped, runs zeroed), it is
    /// invalid input or it gives exactly the rows its header scan counted,
    /// in order, and a filtered copy of every sample can be written.
    #[test]
    fn damaged_shards_give_exactly_the_counted_rows_or_invalid_input(
        cut in 0usize..12_000,
        flips in proptest::collection::vec((0usize..12_000, 0u8..=255), 0..6),
        zero_run in proptest::option::of((0usize..12_000, 1usize..700)),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let mut members = samples(&["000", "001", "002"]);
        members.push(m(&format!("{}/003.jpg", "d".repeat(120)), &[9u8; 900]));
        members.push(m("003.txt", b"late member"));
        let path = write_tar(dir.path(), "s.tar", &members);
        let mut bytes = std::fs::read(&path).unwrap();
        for (at, v) in flips {
            if let Some(b) = bytes.get_mut(at) {
                *b ^= v;
            }
        }
        if let Some((at, n)) = zero_run {
            let end = (at + n).min(bytes.len());
            if at < end {
                bytes[at..end].fill(0);
            }
        }
        bytes.truncate(cut.min(bytes.len()));
        std::fs::write(&path, &bytes).unwrap();

        let set = match InputSet::open(std::slice::from_ref(&path), &ColumnOptions::default()) {
            Ok(s) => s,
            Err(e) => {
                proptest::prop_assert_eq!(e.exit_code(), 3, "{}", e);
                return Ok(());
            }
        };
        let rows: Vec<PairRow> = set.pairs(2).flat_map(|b| b.unwrap()).collect();
        let order: Vec<usize> = rows.iter().map(|r| r.source_row).collect();
        proptest::prop_assert_eq!(order, (0..set.num_rows()).collect::<Vec<_>>());
        let keep = vec![true; set.num_rows()];
        let s = write_filtered_tar_shard(&path, &keep, &dir.path().join("out.tar")).unwrap();
        proptest::prop_assert_eq!(s.rows_in, set.num_rows());
    }
}
