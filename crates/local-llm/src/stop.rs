//! Turns the model's byte pieces into text deltas, holding back anything that
//! might be the start of a stop string so a stop string is never emitted, even
//! when it arrives split over several tokens (or mid UTF-8 character).

#[derive(Debug, Default)]
pub struct StopScanner {
    stops: Vec<String>,
    /// Bytes of an unfinished UTF-8 character.
    partial_utf8: Vec<u8>,
    /// Decoded text not yet released because it may begin a stop string.
    held: String,
    stopped: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub struct ScanStep {
    /// Text safe to send to the client now.
    pub emit: String,
    /// A stop string was found; generation must end.
    pub stopped: bool,
}

impl StopScanner {
    pub fn new(stops: Vec<String>) -> Self {
        Self {
            stops: stops.into_iter().filter(|s| !s.is_empty()).collect(),
            ..Self::default()
        }
    }

    pub fn push(&mut self, piece: &[u8]) -> ScanStep {
        if self.stopped {
            return ScanStep {
                emit: String::new(),
                stopped: true,
            };
        }
        self.partial_utf8.extend_from_slice(piece);
        let decoded = take_complete_utf8(&mut self.partial_utf8);
        self.held.push_str(&decoded);

        if let Some(at) = self.earliest_stop() {
            self.held.truncate(at);
            self.stopped = true;
            return ScanStep {
                emit: std::mem::take(&mut self.held),
                stopped: true,
            };
        }
        let keep = self.longest_stop_prefix_suffix();
        let release = self.held.len() - keep;
        let emit: String = self.held.drain(..release).collect();
        ScanStep {
            emit,
            stopped: false,
        }
    }

    /// Everything still held back, once the model has finished on its own.
    pub fn finish(&mut self) -> String {
        if self.stopped {
            return String::new();
        }
        let mut rest = std::mem::take(&mut self.held);
        rest.push_str(&String::from_utf8_lossy(&std::mem::take(
            &mut self.partial_utf8,
        )));
        rest
    }

    fn earliest_stop(&self) -> Option<usize> {
        self.stops
            .iter()
            .filter_map(|s| self.held.find(s.as_str()))
            .min()
    }

    /// Length of the longest tail of `held` that is a proper prefix of a stop string.
    fn longest_stop_prefix_suffix(&self) -> usize {
        let mut best = 0;
        for stop in &self.stops {
            for len in (1..stop.len()).rev() {
                if len <= best || len > self.held.len() {
                    continue;
                }
                if !stop.is_char_boundary(len) || !self.held.is_char_boundary(self.held.len() - len)
                {
                    continue;
                }
                if self.held.ends_with(&stop[..len]) {
                    best = len;
                    break;
                }
            }
        }
        best
    }
}

/// Decodes the longest valid UTF-8 prefix and leaves an unfinished trailing
/// character in `bytes`; invalid bytes become U+FFFD.
fn take_complete_utf8(bytes: &mut Vec<u8>) -> String {
    let mut out = String::new();
    loop {
        match std::str::from_utf8(bytes) {
            Ok(text) => {
                out.push_str(text);
                bytes.clear();
                return out;
            }
            Err(err) => {
                let valid = err.valid_up_to();
                out.push_str(&String::from_utf8_lossy(&bytes[..valid]));
                match err.error_len() {
                    None => {
                        bytes.drain(..valid);
                        return out;
                    }
                    Some(bad) => {
                        out.push('\u{FFFD}');
                        bytes.drain(..valid + bad);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(stops: &[&str], pieces: &[&[u8]]) -> (String, bool) {
        let mut scanner = StopScanner::new(stops.iter().map(|s| (*s).to_owned()).collect());
        let mut out = String::new();
        for piece in pieces {
            let step = scanner.push(piece);
            out.push_str(&step.emit);
            if step.stopped {
                return (out, true);
            }
        }
        out.push_str(&scanner.finish());
        (out, false)
    }

    #[test]
    fn passes_text_through_without_stops() {
        assert_eq!(
            run(&[], &[b"Hello", b" world"]),
            ("Hello world".to_owned(), false)
        );
    }

    #[test]
    fn stops_before_a_stop_string_split_over_tokens() {
        let (text, stopped) = run(
            &["Observation:"],
            &[b"Thought: x\nObs", b"erv", b"ation", b": 42"],
        );
        assert_eq!(text, "Thought: x\n");
        assert!(stopped);
    }

    #[test]
    fn releases_held_text_that_turned_out_not_to_be_a_stop() {
        let (text, stopped) = run(&["Observation:"], &[b"Obs", b"tacle"]);
        assert_eq!(text, "Obstacle");
        assert!(!stopped);
    }

    #[test]
    fn holds_back_only_a_possible_stop_prefix() {
        let mut scanner = StopScanner::new(vec!["END".to_owned()]);
        assert_eq!(scanner.push(b"abcE").emit, "abc");
        assert_eq!(scanner.push(b"N").emit, "");
        let step = scanner.push(b"D tail");
        assert_eq!(
            step,
            ScanStep {
                emit: String::new(),
                stopped: true
            }
        );
    }

    #[test]
    fn joins_utf8_split_across_pieces() {
        let snowman = "☃".as_bytes();
        assert_eq!(run(&[], &[&snowman[..1], &snowman[1..]]).0, "☃");
    }

    #[test]
    fn earliest_of_several_stops_wins() {
        assert_eq!(run(&["B", "A"], &[b"xxAyyB"]).0, "xx");
    }
}
