#![allow(clippy::unwrap_used)]
use super::*;

#[test]
fn the_word_at_a_time_string_skip_finds_every_special_byte() {
    // plain_prefix must never skip a quote, backslash or control byte,
    // wherever it sits in a word and whatever surrounds it.
    let special = |b: u8| b == b'"' || b == b'\\' || b < 0x20;
    for filler in [b'a', 0xff, 0x80, b'!', b'#', b'[', b']', 0x21] {
        for len in 0..=20 {
            for pos in 0..len {
                for b in 0..=255u8 {
                    let mut bytes = vec![filler; len];
                    bytes[pos] = b;
                    let want = if special(b) { pos } else { len };
                    assert_eq!(plain_prefix(&bytes), want, "{filler:#x} {len} {pos} {b:#x}");
                }
            }
        }
    }
}

/// Writes every event down, `depth:event`, keeping strings up to 8 bytes.
#[derive(Debug, Default)]
struct Record(Vec<String>);

impl Sink for Record {
    fn event(&mut self, depth: usize, event: Event<'_>) -> ShapeResult {
        let text = |s: JsonStr<'_>| s.as_str().map_or("<long>".to_owned(), str::to_owned);
        let e = match event {
            Event::BeginObject => "{".to_owned(),
            Event::BeginArray => "[".to_owned(),
            Event::End => "end".to_owned(),
            Event::Key(k) => format!("key {}", text(k)),
            Event::String(s) => format!("str {}", text(s)),
            Event::Number => "num".to_owned(),
            Event::Bool(b) => format!("{b}"),
            Event::Null => "null".to_owned(),
        };
        self.0.push(format!("{depth}:{e}"));
        Ok(Flow::Continue)
    }
}

/// Feeds `data` in chunks of `size` and gives the events, or the error.
fn events(data: &[u8], size: usize) -> Result<Vec<String>, ScanError> {
    let mut driver = Driver::new(8, Record::default());
    for chunk in data.chunks(size.max(1)) {
        driver.feed(chunk)?;
    }
    driver.finish()?;
    Ok(driver.sink.0)
}

#[test]
fn a_document_gives_its_events_at_their_depths_at_every_chunk_size() {
    let doc = br#" {"a": [1, -2.5e3, "x\u00e9\n"], "b": {"c": null, "d": true}, "long": "0123456789abc", "f": false, "n": NaN} "#;
    let want = [
        "0:{",
        "1:key a",
        "1:[",
        "2:num",
        "2:num",
        "2:str x\u{e9}\n",
        "1:end",
        "1:key b",
        "1:{",
        "2:key c",
        "2:null",
        "2:key d",
        "2:true",
        "1:end",
        "1:key long",
        "1:str <long>",
        "1:key f",
        "1:false",
        "1:key n",
        "1:num",
        "0:end",
    ];
    for size in 1..=doc.len() {
        assert_eq!(events(doc, size).unwrap(), want, "chunks of {size}");
    }
}

#[test]
fn broken_json_is_an_error_never_a_shorter_document() {
    for bad in [
        &br#"{"a": 1"#[..],
        br#"{"a" 1}"#,
        br#"{"a": 1,}"#,
        br#"["unterminated]"#,
        b"{\"a\": \"ctl\x01\"}",
        br#"{"a": "\q"}"#,
        br#"[1] [2]"#,
        br#"[tru]"#,
    ] {
        for size in [1, 3, bad.len()] {
            assert!(
                events(bad, size).is_err(),
                "{} in chunks of {size}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}

#[test]
fn nesting_is_bounded_by_max_depth() {
    let ok = "[".repeat(MAX_DEPTH) + &"]".repeat(MAX_DEPTH);
    assert!(events(ok.as_bytes(), 7).is_ok());
    let deep = "[".repeat(MAX_DEPTH + 1) + &"]".repeat(MAX_DEPTH + 1);
    assert!(matches!(
        events(deep.as_bytes(), 7),
        Err(ScanError::TooDeep { .. })
    ));
}

#[test]
fn a_failed_scan_takes_no_more_bytes() {
    let mut driver = Driver::new(8, Record::default());
    assert!(driver.feed(b"{]").is_err());
    assert_eq!(driver.feed(b"{}"), Err(ScanError::Ended));
    assert_eq!(driver.finish(), Err(ScanError::Ended));
}
