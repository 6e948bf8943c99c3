//! [`PackedEvents`]: how a [`StreamLog`](super::StreamLog) holds its events, so that a live
//! stream costs about the bytes it relayed and little more.
//!
//! A chat stream is tens of thousands of events of a couple of hundred bytes each, so what
//! each event costs beyond its bytes decides what the stream costs. Held one allocation per
//! event, as the relay makes them, an event carried its allocator rounding and growth slack
//! (a `format!` buffer grows by doubling) and a reference-count header; the usage-free view
//! every chat event has (its `"usage": null` removed) was a second copy of nearly the same
//! bytes; and the entry list grew by doubling. Measured, a live stream's RSS was about 3.9 times
//! its bytes (BENCHMARKS.md, "Memory that follows the bytes held"). Here:
//!
//! - events are copied into shared blocks (2 KiB, doubling to 64 KiB: a short stream takes
//!   little, a long one wastes at most the tail of its last block); each event is a `Bytes`
//!   slice of its block, so a reader's clone is a reference count, never an allocation;
//! - the usage-free view of an event is kept as the one byte range it leaves out ([`View::Cut`]),
//!   so a reader who did not ask for usage gets the two slices around it (still no copy); a
//!   rewrite that is not such a cut (none of corral's own framing) is kept whole;
//! - entries live in fixed chunks of [`CHUNK`] (the first one grows like a `Vec`), so the list
//!   never holds more than one chunk of slack and never copies itself to grow.
//!
//! A replayed log (a cached stream served to a streaming caller) keeps its events as given: they
//! are already shared handles, and copying them into blocks would cost per caller.

use bytes::{Bytes, BytesMut};

use super::usage::{CallerUsage, UsageFree};

/// The first block of a log; each next one is twice the last, up to [`MAX_BLOCK`].
const FIRST_BLOCK: usize = 2 * 1024;
/// The largest block (an event larger than this gets a block of its own size).
const MAX_BLOCK: usize = 64 * 1024;
/// Entries per chunk of the entry list.
const CHUNK: usize = 256;

/// The events of one log, in order.
#[derive(Debug)]
pub(super) struct PackedEvents {
    /// Copy appended events into blocks (a live log), or keep the handles given (a replay).
    pack: bool,
    /// The free part of the block being filled.
    block: BytesMut,
    /// The size of the next block.
    next_block: usize,
    /// Every chunk holds exactly [`CHUNK`] entries except the last.
    chunks: Vec<Vec<PackedEvent>>,
    len: usize,
}

/// One event, as a caller who asked for usage receives it, and how it looks to the others.
#[derive(Debug)]
pub(super) struct PackedEvent {
    event: Bytes,
    view: View,
}

/// What a caller who did not ask for usage receives of an event.
#[derive(Debug)]
enum View {
    /// The event itself.
    Same,
    /// Nothing (the usage-only chunk).
    Skip,
    /// The event without `len` bytes from `at` (its `usage` member).
    Cut { at: u32, len: u32 },
    /// A rewrite that is not a cut of the event, held whole.
    Rewritten(Box<Bytes>),
}

/// What a reader hands on: an event, or the two slices around what its view leaves out (to be
/// sent one after the other, never apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Piece {
    Whole(Bytes),
    Cut(Bytes, Bytes),
}

impl Piece {
    /// The event as one `Bytes`; a cut view is joined into a copy.
    pub(super) fn joined(self) -> Bytes {
        match self {
            Self::Whole(event) => event,
            Self::Cut(head, tail) => {
                let mut joined = BytesMut::with_capacity(head.len() + tail.len());
                joined.extend_from_slice(&head);
                joined.extend_from_slice(&tail);
                joined.freeze()
            }
        }
    }
}

impl PackedEvent {
    /// `event` with its usage-free view, as the format decided it. The view is stored as a
    /// cut when it is one.
    pub(super) fn new(event: Bytes, usage_free: UsageFree) -> Self {
        let view = match usage_free {
            UsageFree::Same => View::Same,
            UsageFree::Skip => View::Skip,
            UsageFree::Rewritten(rewritten) => match cut(&event, &rewritten) {
                Some((at, len)) => View::Cut { at, len },
                None => View::Rewritten(Box::new(rewritten)),
            },
        };
        Self { event, view }
    }

    /// A terminal event (`[DONE]` or an error) reads the same in both views.
    pub(super) fn terminal(event: Bytes) -> Self {
        Self {
            event,
            view: View::Same,
        }
    }

    /// Bytes this entry holds, counted against the log's bound.
    pub(super) fn bytes(&self) -> usize {
        let extra = match &self.view {
            View::Rewritten(rewritten) => rewritten.len(),
            View::Same | View::Skip | View::Cut { .. } => 0,
        };
        self.event.len() + extra
    }

    /// What a caller who asked (or not) for usage receives of this event.
    pub(super) fn view(&self, usage: CallerUsage) -> Option<Piece> {
        let event = &self.event;
        match (usage, &self.view) {
            (CallerUsage::Asked, _) | (CallerUsage::NotAsked, View::Same) => {
                Some(Piece::Whole(event.clone()))
            }
            (CallerUsage::NotAsked, View::Skip) => None,
            (CallerUsage::NotAsked, View::Cut { at, len }) => {
                let (at, end) = (*at as usize, *at as usize + *len as usize);
                Some(match (at, end) {
                    (0, _) => Piece::Whole(event.slice(end..)),
                    (_, end) if end == event.len() => Piece::Whole(event.slice(..at)),
                    _ => Piece::Cut(event.slice(..at), event.slice(end..)),
                })
            }
            (CallerUsage::NotAsked, View::Rewritten(rewritten)) => {
                Some(Piece::Whole(Bytes::clone(rewritten)))
            }
        }
    }

    /// The event as a caller who asked for usage receives it.
    pub(super) fn event(&self) -> &Bytes {
        &self.event
    }
}

/// Where `rewritten` is `event` with one byte range left out: `(start, length)`.
fn cut(event: &[u8], rewritten: &[u8]) -> Option<(u32, u32)> {
    let len = event
        .len()
        .checked_sub(rewritten.len())
        .filter(|&n| n > 0)?;
    let at = event
        .iter()
        .zip(rewritten)
        .take_while(|(a, b)| a == b)
        .count();
    // `rewritten` agrees with `event` up to `at`; past it, it must be `event` after the gap.
    (event[at + len..] == rewritten[at..])
        .then(|| Some((u32::try_from(at).ok()?, u32::try_from(len).ok()?)))
        .flatten()
}

impl PackedEvents {
    /// An empty list; `pack` copies appended events into blocks.
    pub(super) fn new(pack: bool) -> Self {
        Self {
            pack,
            block: BytesMut::new(),
            next_block: FIRST_BLOCK,
            chunks: Vec::new(),
            len: 0,
        }
    }

    /// Appends `entry`, its event copied into the log's blocks when this list packs.
    pub(super) fn push(&mut self, mut entry: PackedEvent) {
        if self.pack {
            entry.event = self.packed(&entry.event);
        }
        match self.chunks.last_mut() {
            Some(chunk) if chunk.len() < CHUNK => chunk.push(entry),
            last => {
                let mut chunk = if last.is_none() {
                    Vec::new()
                } else {
                    Vec::with_capacity(CHUNK)
                };
                chunk.push(entry);
                self.chunks.push(chunk);
            }
        }
        self.len += 1;
    }

    /// `event` copied into the block being filled (a new one when it does not fit).
    fn packed(&mut self, event: &[u8]) -> Bytes {
        if self.block.capacity() < event.len() {
            self.block = BytesMut::with_capacity(self.next_block.max(event.len()));
            self.next_block = (self.next_block * 2).min(MAX_BLOCK);
        }
        self.block.extend_from_slice(event);
        self.block.split().freeze()
    }

    pub(super) fn get(&self, index: usize) -> Option<&PackedEvent> {
        self.chunks.get(index / CHUNK)?.get(index % CHUNK)
    }

    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &PackedEvent> {
        self.chunks.iter().flatten()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewrite_that_leaves_out_one_range_is_a_cut() {
        let event = br#"data: {"a":1,"usage":null,"z":2}"#;
        assert_eq!(
            cut(event, br#"data: {"a":1,"z":2}"#),
            Some((14, 13)),
            "the member and a comma"
        );
        assert_eq!(cut(b"xAAy", b"xAy"), Some((2, 1)));
        assert_eq!(cut(b"abc", b"abc"), None, "nothing left out");
        assert_eq!(cut(b"abc", b"abcd"), None);
        assert_eq!(cut(b"abcdef", b"abXf"), None, "not a cut");
    }

    #[test]
    fn a_cut_view_is_the_slices_around_the_gap_and_joins_to_the_rewrite() {
        let event = Bytes::from_static(br#"data: {"a":1,"usage":null,"z":2}"#);
        let rewritten = Bytes::from_static(br#"data: {"a":1,"z":2}"#);
        let entry = PackedEvent::new(event.clone(), UsageFree::Rewritten(rewritten.clone()));
        assert_eq!(
            entry.bytes(),
            event.len(),
            "the view holds no bytes of its own"
        );
        let piece = entry.view(CallerUsage::NotAsked).unwrap();
        assert!(matches!(piece, Piece::Cut(..)));
        assert_eq!(piece.joined(), rewritten);
        assert_eq!(
            entry.view(CallerUsage::Asked),
            Some(Piece::Whole(event.clone()))
        );
        // A cut at either end is one slice.
        let at_end = PackedEvent::new(
            Bytes::from_static(b"keep,drop"),
            UsageFree::Rewritten(Bytes::from_static(b"keep")),
        );
        assert_eq!(
            at_end.view(CallerUsage::NotAsked),
            Some(Piece::Whole(Bytes::from_static(b"keep")))
        );
        // A rewrite that is no cut is kept, and counted.
        let other = PackedEvent::new(
            Bytes::from_static(b"abcdef"),
            UsageFree::Rewritten(Bytes::from_static(b"abXf")),
        );
        assert_eq!(other.bytes(), 10);
        assert_eq!(
            other.view(CallerUsage::NotAsked),
            Some(Piece::Whole(Bytes::from_static(b"abXf")))
        );
    }

    #[test]
    fn packed_events_share_blocks_and_read_back_in_order() {
        let mut events = PackedEvents::new(true);
        let count = 3 * CHUNK + 7;
        for n in 0..count {
            let event = Bytes::from(format!("data: {{\"n\":{n}}}\n\n"));
            events.push(PackedEvent::new(event, UsageFree::Same));
        }
        assert_eq!(events.len(), count);
        for n in [0, 1, CHUNK - 1, CHUNK, 2 * CHUNK + 3, count - 1] {
            let entry = events.get(n).unwrap();
            assert_eq!(entry.event(), &format!("data: {{\"n\":{n}}}\n\n"));
        }
        assert!(events.get(count).is_none());
        assert_eq!(events.iter().count(), count);
        // Consecutive events are adjacent in one block (no allocation of their own).
        let (a, b) = (
            events.get(10).unwrap().event(),
            events.get(11).unwrap().event(),
        );
        assert_eq!(a.as_ptr().wrapping_add(a.len()), b.as_ptr());
        // Every chunk but the last is full, and no chunk grew past its size.
        assert!(events.chunks.iter().all(|chunk| chunk.capacity() <= CHUNK));
        // An event larger than any block gets one of its own.
        let big = Bytes::from(vec![b'x'; 2 * MAX_BLOCK]);
        events.push(PackedEvent::new(big.clone(), UsageFree::Same));
        assert_eq!(events.get(count).unwrap().event(), &big);
    }

    #[test]
    fn a_replay_keeps_the_handles_it_was_given() {
        let mut events = PackedEvents::new(false);
        let event = Bytes::from_static(b"data: {}\n\n");
        events.push(PackedEvent::new(event.clone(), UsageFree::Same));
        assert_eq!(events.get(0).unwrap().event().as_ptr(), event.as_ptr());
    }
}
