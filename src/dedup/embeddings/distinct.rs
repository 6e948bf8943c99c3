//! A request's embedding entries without repeats: each distinct item once,
//! in the order first seen (their relative order upstream), with its
//! canonical bytes (what its key is computed from), and for each of the
//! caller's entries the item it is. OpenAI's inputs (`wire.rs`) and Gemini's
//! embed requests (`gemini.rs`) are both taken apart this way.

use std::collections::HashMap;

#[derive(Debug)]
pub(super) struct Distinct<T> {
    /// The distinct items, in the order first seen.
    pub(super) items: Vec<T>,
    /// Each item's canonical bytes.
    pub(super) canonical: Vec<Vec<u8>>,
    /// For each of the caller's entries, in its order, the item it is.
    pub(super) slots: Vec<usize>,
    /// Each item by its canonical bytes, while entries are added.
    seen: HashMap<Vec<u8>, usize>,
}

impl<T> Distinct<T> {
    pub(super) fn with_capacity(entries: usize) -> Self {
        Self {
            items: Vec::new(),
            canonical: Vec::new(),
            slots: Vec::with_capacity(entries),
            seen: HashMap::new(),
        }
    }

    /// The caller's next entry, by its canonical bytes: the item equal to it
    /// that came before, else a new one (`item`, made only then).
    pub(super) fn push(&mut self, canonical: Vec<u8>, item: impl FnOnce() -> T) {
        let slot = match self.seen.get(&canonical) {
            Some(&slot) => slot,
            None => {
                let slot = self.items.len();
                self.items.push(item());
                self.seen.insert(canonical.clone(), slot);
                self.canonical.push(canonical);
                slot
            }
        };
        self.slots.push(slot);
    }
}

/// What an item's key is computed from: its API's `domain` (keeping one
/// API's items apart from another's and from whole requests), the request's
/// other fields as keyed, and the item's canonical bytes.
pub(super) fn item_key_body(domain: &[u8], keyed_rest: &[u8], canonical: &[u8]) -> Vec<u8> {
    [domain, keyed_rest, canonical].concat()
}
