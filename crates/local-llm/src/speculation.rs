//! Prompt-lookup drafting for speculative greedy decoding.
//!
//! A grounded answer copies runs of tokens from its prompt (titles, file
//! names, error lines). When the last few tokens of the context appeared
//! earlier in it, the tokens that followed them there are a cheap guess at
//! what comes next. The engine checks such a guess in one batched decode and
//! keeps only the part the model itself would have chosen, so the guess
//! changes the speed, never the text.
//!
//! The drafter adapts to how its guesses fare: the draft grows while whole
//! drafts are accepted, shrinks to what was accepted otherwise, and pauses
//! for longer and longer after drafts that did not pay, so free text (where
//! guesses rarely hold) pays little for the attempts.
//!
//! What pays follows from what a batch costs on the CPU: this model's decode
//! is bound by row-by-row dot products, so checking a draft of `d` tokens
//! costs nearly what decoding `d + 1` tokens one by one does (measured: one
//! token 6.8 ms, a batch of 2 14.3 ms, 3 16.7 ms, 5 23.6 ms, 11 43.4 ms).
//! A one-token draft therefore never pays, accepted or not, and a draft
//! pays only from two accepted tokens on. Drafts are at least two tokens,
//! and a round that accepted fewer than two counts as refused.

/// Longest and shortest context suffix looked up, tried longest first: a
/// longer match predicts better. One or two tokens recur everywhere in free
/// text (" of the") and predict little; a quote of the prompt is caught
/// from its third token on.
const NGRAM_MAX: usize = 6;
const NGRAM_MIN: usize = 3;
/// The shortest match in the answer's own text to draft from. Short
/// phrases recur in free text without going on alike; a six-token repeat
/// is a list or a loop, where the next tokens do follow. (Replayed on
/// recorded answers of the bundled model: drafting from three-token matches
/// in the answer cost free text 3-5% for no gain on quoting answers.)
const ANSWER_NGRAM_MIN: usize = 6;
/// The most tokens drafted at once (the batch checks them and one more).
pub const DRAFT_MAX: usize = 10;
/// The first draft of a request.
const DRAFT_START: usize = 2;
/// The shortest draft worth checking, and the fewest accepted tokens that
/// make a checked draft pay (see the module's notes on what a batch costs).
const DRAFT_MIN: usize = 2;
/// The longest pause (in tokens) after drafts that were refused outright.
const PAUSE_MAX: usize = 32;

/// Tokens drafted and accepted in one generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DraftStats {
    /// Draft tokens checked by the model.
    pub drafted: usize,
    /// Draft tokens the model agreed with (each saved one decode).
    pub accepted: usize,
    /// Batched decodes that checked a draft.
    pub rounds: usize,
}

/// One generation's drafting state.
#[derive(Debug)]
pub struct Drafter {
    enabled: bool,
    /// The longest draft the next lookup may return.
    cap: usize,
    /// Tokens of the context that are the prompt; the rest is the answer.
    prompt_len: usize,
    /// Drafts in a row of which nothing was accepted.
    refused_in_a_row: u32,
    /// Tokens still to decode without drafting.
    pause: usize,
    stats: DraftStats,
}

impl Drafter {
    /// A drafter for an answer to a prompt of `prompt_len` tokens (the first
    /// tokens of every context it is given).
    pub fn new(enabled: bool, prompt_len: usize) -> Self {
        Self {
            enabled,
            cap: DRAFT_START,
            prompt_len,
            refused_in_a_row: 0,
            pause: 0,
            stats: DraftStats::default(),
        }
    }

    pub fn stats(&self) -> DraftStats {
        self.stats
    }

    /// The draft to check after `context` (prompt and answer so far, its last
    /// token included), at most `room` tokens; empty when there is none or
    /// drafting pauses.
    pub fn draft<'a>(&mut self, context: &'a [i32], room: usize) -> &'a [i32] {
        if !self.enabled || room == 0 {
            return &[];
        }
        if self.pause > 0 {
            self.pause -= 1;
            return &[];
        }
        let draft = lookup(context, self.cap.min(room), self.prompt_len);
        if draft.len() < DRAFT_MIN {
            return &[];
        }
        draft
    }

    /// Records how a checked draft fared and adapts the next ones.
    pub fn record(&mut self, drafted: usize, accepted: usize) {
        if drafted == 0 {
            return;
        }
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        self.stats.rounds += 1;
        if accepted == drafted {
            self.cap = (self.cap * 2).min(DRAFT_MAX);
        } else {
            self.cap = (accepted + 1).clamp(DRAFT_MIN, DRAFT_MAX);
        }
        if accepted < DRAFT_MIN {
            self.refused_in_a_row += 1;
            // 2, 4, 8, ... tokens without drafting: a quote that begins
            // later is still caught soon, a long free text is left alone.
            let exponent = self.refused_in_a_row.min(8);
            self.pause = (1usize << exponent).min(PAUSE_MAX);
        } else {
            // One lucky draft in free text does not end the backing off at
            // once; a quote, accepted draft after draft, soon does.
            self.refused_in_a_row = self.refused_in_a_row.saturating_sub(1);
        }
    }
}

/// The tokens that followed the latest earlier occurrence of the context's
/// last `n` tokens (`n` from `NGRAM_MAX` down to `NGRAM_MIN`), at most `max`.
/// An occurrence that ends in the answer (past the first `prompt_len`
/// tokens) counts only from `ANSWER_NGRAM_MIN` tokens on.
fn lookup(context: &[i32], max: usize, prompt_len: usize) -> &[i32] {
    if max == 0 {
        return &[];
    }
    for n in (NGRAM_MIN..=NGRAM_MAX).rev() {
        if context.len() <= n {
            continue;
        }
        let suffix = &context[context.len() - n..];
        // Latest first: the nearest occurrence is the likeliest to go on the
        // same way (the answer quoting the line it just started).
        for start in (0..context.len() - n).rev() {
            if start + n > prompt_len && n < ANSWER_NGRAM_MIN {
                continue;
            }
            if &context[start..start + n] == suffix {
                let from = start + n;
                let to = (from + max).min(context.len());
                if from < to {
                    return &context[from..to];
                }
            }
        }
    }
    &[]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_longest_matching_suffix_drafts_what_followed_it_last() {
        // "7 8 9" appeared at the start followed by 10 11; "8 9" later by 5.
        let context = [7, 8, 9, 10, 11, 1, 8, 9, 5, 2, 7, 8, 9];
        assert_eq!(lookup(&context, 4, context.len()), &[10, 11, 1, 8]);
        // Of two occurrences of "8 9 4", the latest wins.
        let context = [8, 9, 4, 10, 1, 8, 9, 4, 5, 2, 3, 8, 9, 4];
        assert_eq!(lookup(&context, 2, context.len()), &[5, 2]);
    }

    #[test]
    fn no_recurring_suffix_no_draft() {
        assert!(lookup(&[1, 2, 3, 4, 5, 6], 8, 6).is_empty());
        // One or two recurring tokens are not enough to guess from.
        assert!(lookup(&[1, 2, 3, 4, 5, 3], 8, 6).is_empty());
        assert!(lookup(&[1, 2, 3, 4, 5, 2, 3], 8, 7).is_empty());
        assert!(lookup(&[1, 2], 8, 2).is_empty());
        assert!(lookup(&[1, 2, 3, 1, 2, 3], 0, 6).is_empty());
    }

    #[test]
    fn a_match_in_the_answer_needs_six_tokens_one_in_the_prompt_three() {
        // Prompt: 1 2 3 4 5; answer: 9 1 2 3 — "1 2 3" is in the prompt.
        let context = [1, 2, 3, 4, 5, 9, 1, 2, 3];
        assert_eq!(lookup(&context, 4, 5), &[4, 5, 9, 1]);
        // The same tokens all in the answer: three are not enough.
        assert!(lookup(&context, 4, 0).is_empty());
        // Six repeated tokens of the answer are.
        let looped = [8, 1, 2, 3, 4, 5, 6, 7, 1, 2, 3, 4, 5, 6];
        assert_eq!(lookup(&looped, 3, 1), &[7, 1, 2]);
        // A prompt occurrence of a shorter suffix is still found behind a
        // later one in the answer.
        let context = [1, 2, 3, 4, 6, 1, 2, 3, 5, 1, 2, 3];
        assert_eq!(lookup(&context, 2, 5), &[4, 6]);
    }

    #[test]
    fn a_draft_stops_at_the_end_of_the_context() {
        // "1 2 3" recurs just before the end: only what follows it is there.
        assert_eq!(lookup(&[4, 1, 2, 3, 9, 1, 2, 3], 8, 8), &[9, 1, 2, 3]);
    }

    #[test]
    fn the_draft_grows_while_accepted_and_shrinks_to_what_was_accepted() {
        let context: Vec<i32> = (0..30).chain(0..30).collect();
        let mut drafter = Drafter::new(true, 0);
        let tail = &context[..40];
        assert_eq!(drafter.draft(tail, 100).len(), DRAFT_START);
        drafter.record(DRAFT_START, DRAFT_START);
        assert_eq!(drafter.draft(tail, 100).len(), 4);
        drafter.record(4, 4);
        assert_eq!(drafter.draft(tail, 100).len(), 8);
        drafter.record(8, 8);
        assert_eq!(drafter.draft(tail, 100).len(), DRAFT_MAX);
        // Room left in the answer bounds the draft.
        assert_eq!(drafter.draft(tail, 3).len(), 3);
        drafter.record(DRAFT_MAX, 2);
        assert_eq!(drafter.draft(tail, 100).len(), 3);
        assert_eq!(
            drafter.stats(),
            DraftStats {
                drafted: DRAFT_START + 4 + 8 + DRAFT_MAX,
                accepted: DRAFT_START + 4 + 8 + 2,
                rounds: 4
            }
        );
    }

    /// Tokens `drafter` declines to draft for before it drafts again.
    fn pause_of(drafter: &mut Drafter, context: &[i32]) -> usize {
        let mut skipped = 0;
        while drafter.draft(context, 100).is_empty() {
            skipped += 1;
        }
        skipped
    }

    #[test]
    fn drafts_that_do_not_pay_pause_drafting_for_longer_each_time() {
        let context: Vec<i32> = (0..30).chain(0..30).collect();
        let context = &context[..40];
        let mut drafter = Drafter::new(true, 0);
        let mut pauses = Vec::new();
        for round in 0..7 {
            assert!(drafter.draft(context, 100).len() >= DRAFT_MIN);
            // Refused outright, or one token accepted: neither pays.
            drafter.record(DRAFT_MIN, round % 2);
            pauses.push(pause_of(&mut drafter, context));
        }
        assert_eq!(pauses, [2, 4, 8, 16, 32, 32, 32]);
        // Drafts that pay wind the pauses down one step each.
        drafter.record(DRAFT_MIN, DRAFT_MIN);
        drafter.record(DRAFT_MIN, 0);
        assert_eq!(pause_of(&mut drafter, context), 32);
        for _ in 0..8 {
            drafter.record(DRAFT_MIN, DRAFT_MIN);
        }
        drafter.record(DRAFT_MIN, 0);
        assert_eq!(pause_of(&mut drafter, context), 2);
    }

    #[test]
    fn no_draft_is_shorter_than_two_tokens() {
        let context: Vec<i32> = (0..30).chain(0..30).collect();
        let context = &context[..40];
        let mut drafter = Drafter::new(true, 0);
        // One token of room: no draft.
        assert!(drafter.draft(context, 1).is_empty());
        // The match leaves one token to guess: no draft either.
        assert_eq!(lookup(&[7, 7, 7, 7], 8, 4), &[7]);
        assert!(drafter.draft(&[7, 7, 7, 7], 100).is_empty());
        // A refused draft shrinks the next one to two tokens, not one.
        assert_eq!(drafter.draft(context, 100).len(), DRAFT_START);
        drafter.record(DRAFT_START, 0);
        assert_eq!(pause_of(&mut drafter, context), 2);
        drafter.record(DRAFT_START, 0);
        pause_of(&mut drafter, context);
        assert_eq!(drafter.draft(context, 100).len(), DRAFT_MIN);
    }

    /// What one batched decode of `n` tokens cost (ms), by `n` (index 0
    /// unused): measured on the 2-core development machine, 2026-11-27,
    /// each `llama_decode` timed; 4, 6-8 and 10 interpolated.
    const BATCH_MS: [f64; 12] = [
        0.0, 6.8, 14.35, 16.7, 20.2, 23.6, 26.2, 28.7, 31.3, 33.9, 38.6, 43.4,
    ];

    #[derive(serde::Deserialize)]
    struct Recorded {
        answers: Vec<RecordedAnswer>,
    }

    #[derive(serde::Deserialize)]
    struct RecordedAnswer {
        name: String,
        kind: String,
        prompt: Vec<i32>,
        answer: Vec<i32>,
    }

    /// The decode time of `answer` after `prompt` as the engine runs it:
    /// after each sampled token, the drafter's draft is checked in one batch
    /// and the answer goes on by what it accepted plus the model's own token.
    fn replay(prompt: &[i32], answer: &[i32], speculation: bool) -> (f64, DraftStats) {
        let mut drafter = Drafter::new(speculation, prompt.len());
        let mut ms = 0.0;
        let mut last = 0;
        while last + 1 < answer.len() {
            let context = [prompt, &answer[..=last]].concat();
            let room = answer.len() - last - 2;
            let draft = drafter.draft(&context, room).to_vec();
            ms += BATCH_MS[1 + draft.len()];
            let accepted = draft
                .iter()
                .zip(&answer[last + 1..])
                .take_while(|(drafted, sampled)| drafted == sampled)
                .count();
            drafter.record(draft.len(), accepted);
            last += accepted + 1;
        }
        (ms, drafter.stats())
    }

    fn geometric_mean(values: &[f64]) -> f64 {
        (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
    }

    /// Speed against plain decoding, replayed on recorded answers of the
    /// bundled model: the greedy answer is the same with or without drafts,
    /// so this is what a drafting rule gains or costs, free of timing noise.
    /// (The rule before this one: free texts 0.98x on average and 0.92x at
    /// worst, grounded answers 1.08x and 0.90x.)
    #[test]
    fn replayed_on_recorded_answers_drafting_pays_on_quotes_and_costs_free_text_little() {
        let recorded: Recorded =
            serde_json::from_str(include_str!("../tests/data/recorded_answers.json")).unwrap();
        let mut speedups: std::collections::HashMap<&str, Vec<f64>> = Default::default();
        for answer in &recorded.answers {
            let (plain, none) = replay(&answer.prompt, &answer.answer, false);
            assert_eq!(none, DraftStats::default());
            let (drafted, stats) = replay(&answer.prompt, &answer.answer, true);
            let speedup = plain / drafted;
            println!("{}: {speedup:.3}x {stats:?}", answer.name);
            speedups.entry(&answer.kind).or_default().push(speedup);
            match answer.name.as_str() {
                // The bench's story: no draft at all, so nothing to pay.
                "bench_free_text" => assert_eq!(stats.rounds, 0),
                "bench_quoting_answer" => {
                    assert!(speedup >= 1.45, "{speedup}");
                    assert_eq!(
                        (stats.rounds, stats.drafted, stats.accepted),
                        (14, 108, 100)
                    );
                }
                _ => {}
            }
        }
        let free = &speedups["free"];
        let grounded = &speedups["grounded"];
        assert!(geometric_mean(free) >= 1.03, "{free:?}");
        assert!(free.iter().all(|s| *s >= 0.96), "{free:?}");
        assert!(geometric_mean(grounded) >= 1.15, "{grounded:?}");
        assert!(grounded.iter().all(|s| *s >= 0.98), "{grounded:?}");
    }

    #[test]
    fn a_disabled_drafter_never_drafts() {
        let context: Vec<i32> = (0..10).chain(0..10).collect();
        assert!(Drafter::new(false, 0).draft(&context, 8).is_empty());
    }
}
