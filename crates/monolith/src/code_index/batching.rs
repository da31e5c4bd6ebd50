//! Cuts the chunks waiting for vectors into embedding calls sized by work:
//! a budget of (estimated) word pieces per call, and a most chunks per call.
//!
//! Chunks wait until a window of a few calls' worth has gathered, then go
//! out shortest first, so a model server that pads the inputs of one call
//! to the longest pads little. What waits is bounded by the window plus one
//! file's chunks, so indexing a large repository never holds it all.

/// One chunk of a file waiting for its vector.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRef {
    /// The waiting file's number, as the caller gave it.
    pub file: usize,
    /// The chunk's position in that file.
    pub chunk: usize,
    pub tokens: usize,
}

/// Chunks gathered for the next embedding calls.
#[derive(Debug)]
pub struct Batcher {
    budget_tokens: usize,
    max_chunks: usize,
    window_tokens: usize,
    window_chunks: usize,
    queue: Vec<ChunkRef>,
    queued_tokens: usize,
}

impl Batcher {
    /// Calls of at most `budget_tokens` (a single longer chunk goes alone)
    /// and `max_chunks`; chunks are sorted within windows of `window_calls`
    /// calls' budget.
    pub fn new(budget_tokens: usize, max_chunks: usize, window_calls: usize) -> Self {
        let budget_tokens = budget_tokens.max(1);
        let max_chunks = max_chunks.max(1);
        Self {
            budget_tokens,
            max_chunks,
            window_tokens: budget_tokens.saturating_mul(window_calls.max(1)),
            window_chunks: max_chunks.saturating_mul(window_calls.max(1)),
            queue: Vec::new(),
            queued_tokens: 0,
        }
    }

    /// Queues the chunks of file `file`, given their estimated sizes.
    pub fn push(&mut self, file: usize, tokens: impl IntoIterator<Item = usize>) {
        for (chunk, tokens) in tokens.into_iter().enumerate() {
            self.queued_tokens += tokens;
            self.queue.push(ChunkRef {
                file,
                chunk,
                tokens,
            });
        }
    }

    /// Whether nothing waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The calls to make now: none until a window has gathered, unless
    /// `finishing` (no more files come), when everything goes. A last call
    /// short of both limits waits for more chunks while more may come.
    pub fn take_batches(&mut self, finishing: bool) -> Vec<Vec<ChunkRef>> {
        let gathered =
            self.queued_tokens >= self.window_tokens || self.queue.len() >= self.window_chunks;
        if self.queue.is_empty() || !(finishing || gathered) {
            return Vec::new();
        }
        let mut queue = std::mem::take(&mut self.queue);
        queue.sort_by_key(|c| c.tokens);
        let mut batches = Vec::new();
        let mut current: Vec<ChunkRef> = Vec::new();
        let mut current_tokens = 0;
        for chunk in queue {
            let full = current.len() >= self.max_chunks
                || current_tokens + chunk.tokens > self.budget_tokens;
            if !current.is_empty() && full {
                batches.push(std::mem::take(&mut current));
                current_tokens = 0;
            }
            current_tokens += chunk.tokens;
            current.push(chunk);
        }
        let current_full = current.len() >= self.max_chunks || current_tokens >= self.budget_tokens;
        if finishing || batches.is_empty() || current_full {
            batches.push(current);
            self.queued_tokens = 0;
        } else {
            self.queued_tokens = current_tokens;
            self.queue = current;
        }
        batches
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sizes(batches: &[Vec<ChunkRef>]) -> Vec<Vec<usize>> {
        batches
            .iter()
            .map(|b| b.iter().map(|c| c.tokens).collect())
            .collect()
    }

    #[test]
    fn nothing_goes_before_a_window_has_gathered_unless_finishing() {
        let mut batcher = Batcher::new(100, 10, 2);
        batcher.push(0, [60, 50]);
        assert!(batcher.take_batches(false).is_empty());
        let batches = batcher.take_batches(true);
        assert_eq!(sizes(&batches), vec![vec![50], vec![60]]);
        assert!(batcher.is_empty());
        assert!(batcher.take_batches(true).is_empty());
    }

    #[test]
    fn a_window_is_also_gathered_by_count() {
        let mut batcher = Batcher::new(1000, 2, 2);
        batcher.push(0, [5, 4, 3]);
        assert!(batcher.take_batches(false).is_empty());
        batcher.push(1, [2]);
        assert_eq!(
            sizes(&batcher.take_batches(false)),
            vec![vec![2, 3], vec![4, 5]]
        );
    }

    #[test]
    fn calls_are_cut_by_budget_and_count_shortest_first() {
        let mut batcher = Batcher::new(100, 3, 2);
        batcher.push(0, [90, 10, 10]);
        batcher.push(1, [10, 40, 30, 70]);
        let batches = batcher.take_batches(false);
        // Sorted: 10 10 10 30 40 70 90; three at most, 100 tokens at most;
        // the last call (90) is short of both limits and waits for more.
        assert_eq!(
            sizes(&batches),
            vec![vec![10, 10, 10], vec![30, 40], vec![70]]
        );
        assert!(!batcher.is_empty());
        assert_eq!(sizes(&batcher.take_batches(true)), vec![vec![90]]);
    }

    #[test]
    fn a_chunk_over_the_budget_goes_alone() {
        let mut batcher = Batcher::new(100, 3, 1);
        batcher.push(0, [250, 20]);
        assert_eq!(
            sizes(&batcher.take_batches(false)),
            vec![vec![20], vec![250]]
        );
        assert!(batcher.is_empty());
    }

    #[test]
    fn every_chunk_goes_exactly_once() {
        let mut batcher = Batcher::new(64, 4, 2);
        let mut sent = Vec::new();
        for file in 0..20 {
            batcher.push(file, (0..file % 5).map(|i| 5 + (file * 7 + i * 13) % 60));
            sent.extend(batcher.take_batches(false).into_iter().flatten());
        }
        sent.extend(batcher.take_batches(true).into_iter().flatten());
        let mut got: Vec<(usize, usize)> = sent.iter().map(|c| (c.file, c.chunk)).collect();
        got.sort_unstable();
        let want: Vec<(usize, usize)> = (0..20)
            .flat_map(|file| (0..file % 5).map(move |i| (file, i)))
            .collect();
        assert_eq!(got, want);
    }
}
