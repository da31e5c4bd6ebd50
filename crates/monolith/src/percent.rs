//! Percent-decoding of URL text, shared by the REST path ids and the web
//! pages' redirect checks.

/// `%XX` decoding; `None` for malformed escapes or non-UTF-8 results.
pub fn decode(text: &str) -> Option<String> {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = text.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::decode;

    #[test]
    fn escapes_are_decoded_and_malformed_ones_refused() {
        assert_eq!(
            decode("acme%2Fplatform%2fapi").unwrap(),
            "acme/platform/api"
        );
        assert_eq!(decode("plain").unwrap(), "plain");
        assert_eq!(decode("bad%2"), None);
        assert_eq!(decode("bad%zz"), None);
        assert_eq!(decode("%ff"), None);
    }
}
