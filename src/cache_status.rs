//! How a caller was served: the vocabulary the coalescer decides, the
//! response headers show (`x-corral-cache`, `Cache-Status`) and the metrics
//! count. A leaf, so the metrics sink need not know the coalescer.

/// How a caller was served; becomes `x-corral-cache` and `Cache-Status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheStatus {
    Hit,
    Stale,
    Miss,
    Coalesced,
    Bypass,
    /// A client's retry answered from the retry window (`retry_window.rs`):
    /// a hit, whose `Cache-Status` says `detail=retry`.
    Retry,
}

impl CacheStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hit | Self::Retry => "HIT",
            Self::Stale => "STALE",
            Self::Miss => "MISS",
            Self::Coalesced => "COALESCED",
            Self::Bypass => "BYPASS",
        }
    }
}
