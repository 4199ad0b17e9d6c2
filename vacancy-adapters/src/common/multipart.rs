//! A small, bounded reader of `multipart/form-data` bodies: just enough to find
//! the `model` field of an OpenAI audio or image-edit upload.

use vacancy::traits::InspectError;

/// The longest boundary RFC 2046 allows.
const MAX_BOUNDARY: usize = 70;

/// The `boundary` of a `multipart/form-data` content type; `None` for any
/// other content type.
///
/// Case-insensitive media type and parameter name; the value may be quoted.
fn form_boundary(content_type: &str) -> Option<Result<String, InspectError>> {
    let mut parts = split_params(content_type).into_iter();
    let media = parts.next()?;
    if !media.trim().eq_ignore_ascii_case("multipart/form-data") {
        return None;
    }
    let boundary = parts.find_map(|p| {
        let (name, value) = p.split_once('=')?;
        name.trim()
            .eq_ignore_ascii_case("boundary")
            .then(|| unquote(value.trim()))
    });
    Some(match boundary {
        Some(b) if (1..=MAX_BOUNDARY).contains(&b.len()) => Ok(b),
        Some(_) => Err(InspectError::invalid(
            "the multipart/form-data boundary must be 1 to 70 characters",
        )),
        None => Err(InspectError::invalid(
            "the multipart/form-data content type names no boundary",
        )),
    })
}

/// Whether a request's `Content-Type` is `multipart/form-data`.
///
/// Reads the first `Content-Type` header; a value that is not text is not multipart.
pub fn is_multipart_form(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|ct| {
            first_param(ct)
                .trim()
                .eq_ignore_ascii_case("multipart/form-data")
        })
}

/// The first of [`split_params`]' parts (the media type), found without
/// collecting the rest: asked of every JSON request's `Content-Type` (issue
/// 31). A `;` inside a quoted string splits nothing.
fn first_param(s: &str) -> &str {
    let (mut quoted, mut escaped) = (false, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            ';' if !quoted => return &s[..i],
            _ => {}
        }
    }
    s
}

/// The `model` field of a `multipart/form-data` body.
///
/// # Behavior
///
/// - `content_type` must be `multipart/form-data` with a boundary; anything
///   else is 400 `invalid_request`.
/// - The body is read once, front to back, over the bytes the daemon already
///   bounded; nothing is copied but the `model` value.
/// - A body whose structure cannot be read (no opening boundary, a part
///   without its header end or closing boundary) is 400 `invalid_request`,
///   never a guess: inspection never charges a model it could not read.
/// - No `model` part is `Ok(None)`; its value, which must be UTF-8, is kept
///   exactly (MEM-06); two `model` parts are 400 `invalid_request`, since the
///   upstream might read either.
pub fn multipart_model(content_type: &str, body: &[u8]) -> Result<Option<String>, InspectError> {
    let boundary = match form_boundary(content_type) {
        Some(b) => b?,
        None => {
            return Err(InspectError::invalid("the body is not multipart/form-data"));
        }
    };
    let broken = |what: &str| {
        InspectError::invalid(format!(
            "the multipart/form-data body cannot be read: {what}"
        ))
    };
    let delimiter = [b"--", boundary.as_bytes()].concat();
    let next_delimiter = [b"\r\n", delimiter.as_slice()].concat();
    // The first delimiter opens the body, or follows a preamble and a CRLF.
    let mut at = if body.starts_with(&delimiter) {
        0
    } else {
        find(body, &next_delimiter, 0)
            .map(|i| i + 2)
            .ok_or_else(|| broken("it does not start with the boundary"))?
    };
    let mut model: Option<String> = None;
    loop {
        let mut rest = at + delimiter.len();
        if body[rest..].starts_with(b"--") {
            return Ok(model);
        }
        // Transport padding, then the end of the delimiter line.
        while matches!(body.get(rest), Some(b' ' | b'\t')) {
            rest += 1;
        }
        if !body[rest..].starts_with(b"\r\n") {
            return Err(broken("a boundary line does not end with CRLF"));
        }
        rest += 2;
        let (headers, content_start) = if body[rest..].starts_with(b"\r\n") {
            (&body[rest..rest], rest + 2)
        } else {
            let end = find(body, b"\r\n\r\n", rest)
                .ok_or_else(|| broken("a part's headers do not end"))?;
            (&body[rest..end], end + 4)
        };
        let content_end = find(body, &next_delimiter, content_start)
            .ok_or_else(|| broken("a part has no closing boundary"))?;
        if part_name(headers).as_deref() == Some("model") {
            if model.is_some() {
                return Err(InspectError::invalid(
                    "the multipart/form-data body has more than one \"model\" field; name the model once",
                ));
            }
            let value = std::str::from_utf8(&body[content_start..content_end]).map_err(|_| {
                InspectError::invalid("the multipart/form-data \"model\" field is not UTF-8 text")
            })?;
            model = Some(value.to_owned());
        }
        at = content_end + 2;
    }
}

/// The `name` of a part from its `Content-Disposition: form-data; name=...`.
fn part_name(headers: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(headers);
    text.split("\r\n").find_map(|line| {
        let (name, value) = line.split_once(':')?;
        if !name.trim().eq_ignore_ascii_case("content-disposition") {
            return None;
        }
        let mut params = split_params(value).into_iter();
        if !params.next()?.trim().eq_ignore_ascii_case("form-data") {
            return None;
        }
        params.find_map(|p| {
            let (k, v) = p.split_once('=')?;
            k.trim()
                .eq_ignore_ascii_case("name")
                .then(|| unquote(v.trim()))
        })
    })
}

/// Split `a; b="x;y"; c` at the semicolons outside quotes.
fn split_params(s: &str) -> Vec<&str> {
    // Each part starts outside any quoted string, so each is the first
    // part of what is left.
    let mut out = Vec::new();
    let mut rest = s;
    loop {
        let part = first_param(rest);
        out.push(part);
        match rest.get(part.len() + 1..) {
            Some(after) if part.len() < rest.len() => rest = after,
            _ => return out,
        }
    }
}

/// A parameter value without its quotes and backslash escapes.
fn unquote(v: &str) -> String {
    match v.strip_prefix('"').and_then(|v| v.strip_suffix('"')) {
        Some(inner) => {
            let mut out = String::with_capacity(inner.len());
            let mut escaped = false;
            for c in inner.chars() {
                if !escaped && c == '\\' {
                    escaped = true;
                } else {
                    out.push(c);
                    escaped = false;
                }
            }
            out
        }
        None => v.to_owned(),
    }
}

/// The first `needle` in `hay` at or after `from`.
fn find(hay: &[u8], needle: &[u8], from: usize) -> Option<usize> {
    let first = *needle.first()?;
    let mut i = from;
    while i + needle.len() <= hay.len() {
        let step = hay[i..=hay.len() - needle.len()]
            .iter()
            .position(|&b| b == first)?;
        i += step;
        if hay[i..].starts_with(needle) {
            return Some(i);
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use vacancy::RefusalCode;

    const CT: &str = "multipart/form-data; boundary=----vacancy7MA4YWxk";

    fn form(parts: &[(&str, &[u8])]) -> Vec<u8> {
        let mut b = Vec::new();
        for (headers, content) in parts {
            b.extend_from_slice(b"------vacancy7MA4YWxk\r\n");
            b.extend_from_slice(headers.as_bytes());
            b.extend_from_slice(b"\r\n\r\n");
            b.extend_from_slice(content);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(b"------vacancy7MA4YWxk--\r\n");
        b
    }

    fn transcription(model: &[u8]) -> Vec<u8> {
        form(&[
            (
                "Content-Disposition: form-data; name=\"file\"; filename=\"a;model.wav\"\r\nContent-Type: audio/wav",
                b"RIFF\x00\x01\r\n--not-the-boundary\r\nname=\"model\"",
            ),
            ("Content-Disposition: form-data; name=\"model\"", model),
            ("Content-Disposition: form-data; name=\"language\"", b"en"),
        ])
    }

    #[test]
    fn the_model_field_is_read_exactly() {
        // MEM-06
        assert_eq!(
            multipart_model(CT, &transcription(b"whisper-1"))
                .unwrap()
                .as_deref(),
            Some("whisper-1")
        );
        assert_eq!(
            multipart_model(CT, &transcription(b" Whisper Large "))
                .unwrap()
                .as_deref(),
            Some(" Whisper Large ")
        );
        assert_eq!(
            multipart_model(CT, &transcription(b"")).unwrap().as_deref(),
            Some("")
        );
    }

    #[test]
    fn curl_and_python_shapes_are_read() {
        // curl -F: quoted boundary-free type, preamble-free body; requests/httpx: lowercase header.
        let ct = "Multipart/Form-Data; charset=utf-8; boundary=\"abc'()+_,-./:=?\"";
        let body = b"--abc'()+_,-./:=?\r\ncontent-disposition: form-data; name=model\r\n\r\ngpt-image-1\r\n--abc'()+_,-./:=?--";
        assert_eq!(
            multipart_model(ct, body).unwrap().as_deref(),
            Some("gpt-image-1")
        );
        // A preamble and transport padding are allowed (RFC 2046).
        let body = b"preamble\r\n--b  \r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nm\r\n--b--";
        assert_eq!(
            multipart_model("multipart/form-data; boundary=b", body)
                .unwrap()
                .as_deref(),
            Some("m")
        );
    }

    #[test]
    fn no_model_part_is_none() {
        let body = form(&[(
            "Content-Disposition: form-data; name=\"file\"; filename=\"x\"",
            b"..",
        )]);
        assert_eq!(multipart_model(CT, &body).unwrap(), None);
        let body = form(&[("", b"headerless part")]);
        assert_eq!(multipart_model(CT, &body).unwrap(), None);
    }

    #[test]
    fn unreadable_forms_are_invalid_request_never_a_guess() {
        let bad = |ct: &str, body: &[u8]| {
            let e = multipart_model(ct, body).unwrap_err();
            assert_eq!(e.code, RefusalCode::InvalidRequest);
            e.message
        };
        assert!(bad(CT, b"model=whisper-1").contains("does not start with the boundary"));
        let mut cut = transcription(b"whisper-1");
        cut.truncate(cut.len() - 27);
        let m = bad(CT, &cut);
        assert!(m.contains("no closing boundary"), "{m}");
        assert!(
            bad(
                CT,
                b"------vacancy7MA4YWxkX\r\n\r\nx\r\n------vacancy7MA4YWxk--"
            )
            .contains("does not end with CRLF")
        );
        assert!(
            bad(
                CT,
                b"------vacancy7MA4YWxk\r\nContent-Disposition: form-data"
            )
            .contains("headers do not end")
        );
        assert!(bad(CT, &transcription(b"\xff\xfe")).contains("not UTF-8"));
        let twice = form(&[
            ("Content-Disposition: form-data; name=\"model\"", b"a"),
            ("Content-Disposition: form-data; name=\"model\"", b"b"),
        ]);
        assert!(bad(CT, &twice).contains("more than one"));
        assert!(bad("multipart/form-data", b"").contains("names no boundary"));
        assert!(
            bad(
                &format!("multipart/form-data; boundary={}", "x".repeat(71)),
                b""
            )
            .contains("1 to 70")
        );
        assert!(bad("application/json", b"{}").contains("not multipart"));
    }

    #[test]
    fn multipart_is_recognised_from_the_header() {
        let mut h = http::HeaderMap::new();
        assert!(!is_multipart_form(&h));
        h.insert(http::header::CONTENT_TYPE, CT.parse().unwrap());
        assert!(is_multipart_form(&h));
        h.insert(
            http::header::CONTENT_TYPE,
            "application/json".parse().unwrap(),
        );
        assert!(!is_multipart_form(&h));
    }

    /// The one-pass splitter `split_params` was before it was built on
    /// `first_param`.
    fn split_params_plain(s: &str) -> Vec<&str> {
        let mut out = Vec::new();
        let (mut start, mut quoted, mut escaped) = (0, false, false);
        for (i, c) in s.char_indices() {
            match c {
                _ if escaped => escaped = false,
                '\\' if quoted => escaped = true,
                '"' => quoted = !quoted,
                ';' if !quoted => {
                    out.push(&s[start..i]);
                    start = i + 1;
                }
                _ => {}
            }
        }
        out.push(&s[start..]);
        out
    }

    #[test]
    fn params_split_as_the_plain_splitter_splits_them() {
        for ct in [
            "",
            ";",
            ";;",
            "a;",
            "multipart/form-data; boundary=b",
            "multipart/form-data;boundary=\"x;y\"; charset=utf-8",
            "multipart/form-data; boundary=\"a\\\";b\"; c",
            "\"multipart/form-data;\"; boundary=b",
            "x; y=\"unterminated;",
            "é; ü=\"ß;\"",
        ] {
            assert_eq!(split_params(ct), split_params_plain(ct), "{ct:?}");
            assert_eq!(first_param(ct), split_params_plain(ct)[0], "{ct:?}");
        }
    }

    #[test]
    fn find_finds_every_position() {
        assert_eq!(find(b"abcabc", b"ca", 0), Some(2));
        assert_eq!(find(b"abcabc", b"abc", 1), Some(3));
        assert_eq!(find(b"abc", b"abcd", 0), None);
        assert_eq!(find(b"aaab", b"aab", 0), Some(1));
        assert_eq!(find(b"", b"a", 0), None);
        assert_eq!(find(b"abc", b"c", 3), None);
    }
}
